#!/usr/bin/env python3
"""p10_latency.py -- P10's third number: the longest a client waits for a
reply around the start of a shadowed update of a big store, against the
longest wait with no update (target: at most 2x).

kvfull v1 (examples/kvfull) is filled with ENTRIES keys (pipelined SETs),
then busy clients (examples/kvfull/loadgen.py, every reply checked) run
for SECONDS with no update, and for SECONDS around `molt update --shadow`
to v1 rebuilt from itself (the fork at the update points copies the
store's page tables; the follower migrates the store).  Prints both
maxima, their ratio and the time `molt update --shadow` took, and the
memory of both processes while the shadow runs (Rss and Pss, from
/proc/PID/smaps_rollup, and what the shared rings hold: the Rss of their
mapping), then again once `molt rollback` ended the shadow and the
leader's threads ran on alone (they give their rings' pages back).  The
rings' size is the target's MOLT_SHADOW_RING_BYTES, passed on from this
script's environment (64 MiB per thread by default).

  bench/shadowupd/p10_latency.py [--entries 1000000] [--seconds 3]
      [--molt-build DIR] [--obj DIR]
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KVFULL = os.path.join(ROOT, "examples", "kvfull")
sys.path.insert(0, KVFULL)
from loadgen import Load  # noqa: E402


def fill(port, n, batch=2000):
    s = socket.create_connection(("127.0.0.1", port))
    f = s.makefile("rb")
    done = 0
    while done < n:
        k = min(batch, n - done)
        s.sendall(b"".join(b"SET fill:%d x%d\n" % (done + i, done + i) for i in range(k)))
        for _ in range(k):
            if not f.readline().startswith(b"STORED"):
                raise SystemExit("p10: a SET of the fill failed")
        done += k
    s.close()


def rollup(pid):
    """Rss and Pss of a process, in MiB (0, 0 if it is gone)."""
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            kv = dict((ln.split()[0].rstrip(":"), ln.split()[1]) for ln in f
                      if ln.split() and ln.split()[0] in ("Rss:", "Pss:"))
        return int(kv["Rss"]) / 1024, int(kv["Pss"]) / 1024
    except (OSError, KeyError):
        return 0, 0


def rings_rss(pid):
    """Rss (MiB) of the largest shared anonymous mapping of pid: the rings."""
    best, cur, size = 0, None, 0
    try:
        with open("/proc/%d/smaps" % pid) as f:
            for ln in f:
                w = ln.split()
                if "-" in w[0] and len(w) >= 5:
                    cur = "/dev/zero" in ln or "SYSV" in ln or "shmem" in ln
                    lo, hi = (int(x, 16) for x in w[0].split("-"))
                    size = hi - lo
                elif w[0] == "Rss:" and cur and size >= 64 << 20:
                    best = max(best, int(w[1]) / 1024)
    except OSError:
        pass
    return best


def mem(name, pid):
    rss, pss = rollup(pid)
    return "%s %d: Rss %.0f MiB, Pss %.0f MiB, rings %.1f MiB" % (
        name, pid, rss, pss, rings_rss(pid))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=1000000)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--molt-build", default=os.environ.get(
        "MOLT_BUILD", os.path.join(ROOT, "build")))
    ap.add_argument("--obj", default="/tmp/molt-bench-p10")
    args = ap.parse_args()
    build = os.path.abspath(args.molt_build)
    molt = os.path.join(build, "bin", "molt")
    moltcc = os.path.join(build, "bin", "moltcc")
    obj = os.path.abspath(args.obj)
    os.makedirs(obj, exist_ok=True)
    subprocess.run(["make", "-s", "-C", KVFULL, "MOLT_BUILD=" + build, "O=" + obj,
                    os.path.join(obj, "v1.so")], check=True)
    v1, same = os.path.join(obj, "v1.so"), os.path.join(obj, "v1-same.so")
    srcs = sorted(os.path.join(KVFULL, "v1", f) for f in os.listdir(os.path.join(KVFULL, "v1"))
                  if f.endswith(".c"))
    subprocess.run([moltcc, "--molt-program", "-O2", "-g", "-I" + os.path.join(KVFULL, "v1"),
                    "-o", same] + srcs + ["--molt-from", v1], check=True)
    server = subprocess.Popen([molt, "run", v1, "--port", "0", "--workers", "4"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        m = re.search(r"127\.0\.0\.1:(\d+) pid (\d+)", server.stdout.readline())
        port, pid = int(m.group(1)), int(m.group(2))
        t = time.monotonic()
        fill(port, args.entries)
        print("filled %d entries in %.1f s" % (args.entries, time.monotonic() - t), flush=True)
        load = Load(port, busy=3, idle=0)
        load.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        time.sleep(args.seconds)
        t1 = time.monotonic()
        base = load.max_gap(t0, t1)
        u0 = time.monotonic()
        r = subprocess.run([molt, "update", "--shadow", str(pid), same, "--timeout", "60"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        u1 = time.monotonic()
        time.sleep(args.seconds)
        shadow = load.max_gap(u0, time.monotonic())
        st = subprocess.run([molt, "status", str(pid)], stdout=subprocess.PIPE, text=True).stdout
        line = [x for x in st.splitlines() if x.startswith("shadowed update")]
        fm = re.search(r"follower (\d+)", line[0] if line else "")
        during = [mem("leader", pid)] + ([mem("follower", int(fm.group(1)))] if fm else [])
        subprocess.run([molt, "rollback", str(pid)], stdout=subprocess.DEVNULL)
        time.sleep(1)  # the clients run on: each thread's next call gives its ring back
        after = mem("leader", pid)
        load.stop()
        errors = load.errors()
        print("no update: longest wait %.1f ms over %.0f s" % (base * 1000, args.seconds))
        print("around molt update --shadow (%.0f ms, %s): longest wait %.1f ms: %.2fx" %
              ((u1 - u0) * 1000, "ok" if r.returncode == 0 else r.stdout.strip(),
               shadow * 1000, shadow / base if base else float("inf")))
        print(line[0] if line else st)
        print("memory while shadowing: " + "; ".join(during))
        print("memory 1 s after molt rollback: " + after)
        print("%d requests, %d errors (load average %s)" %
              (load.requests(), len(errors), " ".join(open("/proc/loadavg").read().split()[:3])))
        return 1 if errors or r.returncode else 0
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
