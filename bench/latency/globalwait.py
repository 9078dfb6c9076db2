#!/usr/bin/env python3
"""globalwait.py — how long a `global` apply waits at the kvstore's barrier.

    globalwait.py [--server PATH] [--patches DIR] [--applies 300] [--interval 0.2]
                  [--timeout S]

Diagnostic for RESULTS.md.  Starts one kvstore (default: the one build.sh
made in $LAT_WORK) under the benchmark's steady load (latclient, 16 000
requests/s), sends `molt apply --policy global` every --interval seconds
(alternating the two patches) and prints the distribution of the time from
the request to the switch (from `molt log`).  With the server's wake-up
callback every thread should reach its update point within a millisecond
or two; an apply that takes tens of milliseconds means some thread slept
on until its 100 ms wait timeout.  Run with SCHED_FIFO like latbench.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

WORK = os.environ.get("LAT_WORK", "/tmp/molt-latency")
MOLT = os.path.join(os.environ.get("MOLT_BUILD", "/tmp/lat-build"), "bin", "molt")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=os.path.join(WORK, "kvstore"))
    ap.add_argument("--patches", default=os.path.join(WORK, "patches"),
                    help="directory with fix-del.so and value-length.so built for --server")
    ap.add_argument("--applies", type=int, default=300)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--policy", default="global")
    ap.add_argument("--timeout", default="1",
                    help="molt apply --timeout (s); a short one (0.02) makes a thread that "
                         "sleeps through the wake-up fail the apply, and molt names it")
    a = ap.parse_args()
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except OSError:
        pass
    srv = subprocess.Popen([a.server, "--port", "0"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    port = int(srv.stdout.readline().rsplit(":", 1)[1])
    duration = a.applies * a.interval + 2
    client = subprocess.Popen(
        [os.path.join(WORK, "latclient"), "--port", str(port), "--conns", "16",
         "--rate", "16000", "--duration", str(duration), "--out", "/dev/null"],
        stdout=subprocess.DEVNULL)
    time.sleep(1.0)
    clock_off = time.time_ns() - time.monotonic_ns()
    reqs = []
    try:
        for i in range(a.applies):
            patch = os.path.join(a.patches, ["fix-del.so", "value-length.so"][i % 2])
            t0 = time.monotonic_ns()
            r = subprocess.run([MOLT, "apply", str(srv.pid), patch, "--policy", a.policy,
                                "--timeout", a.timeout], capture_output=True, text=True)
            reqs.append((t0, time.monotonic_ns(), r.returncode))
            if r.returncode != 0:
                print(f"  apply {i} failed: {(r.stdout + r.stderr).strip()[:300]}")
            time.sleep(max(0.0, a.interval - (time.monotonic_ns() - t0) / 1e9))
        log = json.loads(subprocess.run([MOLT, "log", str(srv.pid), "--json"],
                                        capture_output=True, text=True).stdout)
    finally:
        client.kill()
        srv.send_signal(signal.SIGTERM)
        srv.wait()
    # The process keeps only its latest log entries, so the switch time is
    # known for the latest applies only; the CLI's wall time for all.
    switches = sorted(int(e["time"] * 1e9) - clock_off for e in log if e["event"] == "switch")
    waits, walls = [], sorted((t1 - t0) / 1e6 for t0, t1, rc in reqs if rc == 0)
    for t0, t1, rc in reqs:
        s = [x for x in switches if t0 <= x <= t1]
        if rc == 0 and s:
            waits.append((s[0] - t0) / 1e6)
    waits.sort()

    def show(name, xs):
        n = len(xs)
        if not n:
            return
        q = lambda p: xs[min(n - 1, int(p * n))]
        print(f"  {name} ({n}): p50 {q(0.5):.1f} ms, p90 {q(0.9):.1f}, p99 {q(0.99):.1f}, "
              f"max {xs[-1]:.1f}; {sum(w > 10 for w in xs)} over 10 ms; slowest: "
              + " ".join(f"{w:.1f}" for w in xs[-6:]))

    print(f"{a.server}: {len(reqs)} {a.policy} applies under load, "
          f"{sum(rc != 0 for _, _, rc in reqs)} failed")
    show("molt apply wall time", walls)
    show("request -> switch", waits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
