#!/usr/bin/env python3
"""decompose.py — which part of a patch request disturbs the kvstore.

    decompose.py [--reps 100] [--interval 0.25]

Diagnostic for RESULTS.md.  One kvstore under the benchmark's steady load
(latclient, 16 000 requests/s, SCHED_FIFO like latbench) and, every
--interval seconds, one of these actions, interleaved in random order:

  nothing           the baseline
  spawn /bin/true   what starting any process costs the machine
  molt status       the CLI plus a control-channel round trip, no update
  molt apply        a real update (--policy immediate; local does the same work)

For each action: the share of requests due in the 3 ms after it that took
more than 100 us, and their p90, against the same for the 20 ms before.
On a 2-CPU machine every process start takes CPU from the server and the
client for a moment; this tells how much of the disturbance after a patch
request is the CLI process, and how much the update itself.
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np

WORK = os.environ.get("LAT_WORK", "/tmp/molt-latency")
MOLT = os.path.join(os.environ.get("MOLT_BUILD", "/tmp/lat-build"), "bin", "molt")
REC = np.dtype([("sched", "<i8"), ("send", "<i8"), ("recv", "<i8"),
                ("conn", "<u4"), ("flags", "<u4")])
SLOW_US = 100
AFTER_MS, BEFORE_MS = 3, 20


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=100, help="repetitions of each action")
    ap.add_argument("--interval", type=float, default=0.25)
    a = ap.parse_args()
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except OSError:
        pass
    srv = subprocess.Popen([os.path.join(WORK, "kvstore"), "--port", "0"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = int(srv.stdout.readline().rsplit(":", 1)[1])
    pid = str(srv.pid)
    actions = {
        "nothing": None,
        "spawn /bin/true": ["/bin/true"],
        "molt status": [MOLT, "status", pid],
        "molt apply": None,  # filled per call (alternating patches)
    }
    plan = [k for k in actions for _ in range(a.reps)]
    random.Random(7).shuffle(plan)
    out = os.path.join(WORK, "decompose.bin")
    t_start = time.monotonic_ns() + 1_000_000_000
    duration = len(plan) * a.interval + 1.0
    client = subprocess.Popen(
        [os.path.join(WORK, "latclient"), "--port", str(port), "--conns", "16",
         "--rate", "16000", "--duration", str(duration), "--start-ns", str(t_start),
         "--out", out], stdout=subprocess.DEVNULL)
    marks, n_apply = [], 0
    try:
        for i, k in enumerate(plan):
            due = t_start + int((0.5 + i * a.interval) * 1e9)
            while time.monotonic_ns() < due:
                time.sleep(max(0.0, (due - time.monotonic_ns()) / 1e9))
            t0 = time.monotonic_ns()
            if k == "molt apply":
                patch = os.path.join(WORK, "patches", ["fix-del.so", "value-length.so"][n_apply % 2])
                n_apply += 1
                subprocess.run([MOLT, "apply", pid, patch, "--policy", "immediate"],
                               capture_output=True)
            elif actions[k]:
                subprocess.run(actions[k], capture_output=True)
            marks.append((k, t0))
        client.wait()
    finally:
        if client.poll() is None:
            client.kill()
        srv.send_signal(signal.SIGTERM)
        srv.wait()
    with open(out, "rb") as f:
        f.read(8)
        n = int(np.frombuffer(f.read(8), "<u8")[0])
        r = np.frombuffer(f.read(n * REC.itemsize), REC)
    r = r[r["recv"] > 0]
    lat = (r["recv"] - r["sched"]) / 1e3
    order = np.argsort(r["sched"])
    sched, lat = r["sched"][order], lat[order]
    res = {}
    for k in actions:
        after, before = [], []
        for kk, t0 in marks:
            if kk != k:
                continue
            i0, i1, i2 = np.searchsorted(sched, [t0 - BEFORE_MS * 1_000_000, t0,
                                                 t0 + AFTER_MS * 1_000_000])
            before.append(lat[i0:i1])
            after.append(lat[i1:i2])
        af, bf = np.concatenate(after), np.concatenate(before)
        res[k] = {"after_slow_pct": 100 * float((af > SLOW_US).mean()),
                  "before_slow_pct": 100 * float((bf > SLOW_US).mean()),
                  "after_p90_us": float(np.percentile(af, 90)),
                  "before_p90_us": float(np.percentile(bf, 90)),
                  "after_max_us": float(af.max()), "reps": len(after)}
        print(f"{k:<16} {len(after)} x: requests due in the {AFTER_MS} ms after: "
              f"{res[k]['after_slow_pct']:.1f}% > {SLOW_US} us, p90 {res[k]['after_p90_us']:.0f} us, "
              f"max {res[k]['after_max_us']:.0f} us   (20 ms before: "
              f"{res[k]['before_slow_pct']:.1f}%, p90 {res[k]['before_p90_us']:.0f} us)")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
