#!/usr/bin/env python3
"""bench/shadowupd/faults.py [--timing-runs N] [--retries R] [--retry-delay S]
-- MVEDSUA's three fault classes (its section 6.2) rebuilt on kvs
(tests/shadowupd/progs/kvs.c), each injected into a shadowed update under
2 checking clients: what molt made of it and what the clients saw.

1. An error in the new code: kvs variant 2 crashes on "GET crash" (MVEDSUA:
   a Redis revision that crashes on a bad HMGET).  The follower crashes,
   the leader answers the request and serves on.
2. An error in the state transformation: kvs variant 8's migration hook
   forgets the values of every odd slot (MVEDSUA: a transformer that freed
   memory libevent still used; both show only later, on some requests).
   Keys set before the update are read after it: the first read of a lost
   value is a divergence, the follower is ended, the leader's reply stands.
3. A timing error: kvs variant 9 answers "GET magic" wrongly in a follower
   whose migration hook drew "unlucky" from its pid, about one follower in
   two -- a stand-in for an update timed badly (MVEDSUA: libevent's state
   not reset after an aborted update), which a later attempt may escape.
   `molt update --shadow --retries R --retry-delay S` (MVEDSUA retried
   after 500 ms), a "GET magic" probe every 50 ms; an attempt that answers
   6 probes alike has escaped, and the shadow is then rolled back.  Reports
   how many attempts each run needed (MVEDSUA: median 2 retries, at most 8).

"Nothing lost" is checked by the clients: every reply is compared with the
one due, and a lost connection or a wrong reply is counted.

Environment: MOLT_BUILD_DIR (default build/ of this tree, a plain build),
SHADOW_WORK (default /tmp/molt-bench-faults)."""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("MOLT_BUILD_DIR", str(ROOT / "build"))
os.environ.setdefault("SHADOW_WORK", "/tmp/molt-bench-faults")
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "shadowupd")]

import test_shadowupd as t  # noqa: E402
from harness.proc import log, molt, poll, status  # noqa: E402


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def outcome_line(name, sh, replies, wrong, extra=""):
    print("%-26s %-60.60s clients: %d replies, %d wrong or lost%s" % (
        name, sh["outcome"], replies, len(wrong), extra))
    return not wrong


def new_code_error(v1):
    crash = t.image("kvs-crash", 2, frm=v1)
    srv = t.Server(v1, "fault-code")
    try:
        cl = t.Clients(srv, tag="n")
        t.shadow(srv, crash)
        time.sleep(0.5)
        leader = t.ask(srv, "GET crash")
        sh = t.ended(srv)
        time.sleep(1.0)
        replies = cl.stop()
        wrong = list(cl.wrong) + ([("GET crash", leader)] if leader != "NONE\n" else [])
        return outcome_line("1. error in the new code", sh, replies, wrong)
    finally:
        srv.close()


def state_transformation_error(v1):
    forgets = t.image("kvs-forgets", 8, frm=v1)
    srv = t.Server(v1, "fault-xform")
    try:
        keys = ["old%d" % i for i in range(64)]
        with srv.connect() as s, s.makefile("rwb") as f:
            for k in keys:
                f.write(b"SET %s v-%s\n" % (k.encode(), k.encode()))
                f.flush()
                assert f.readline() == b"OK\n"
        cl = t.Clients(srv, tag="x")
        t.shadow(srv, forgets)
        time.sleep(0.5)
        wrong = []
        with srv.connect() as s, s.makefile("rwb") as f:
            for k in keys:   # read back after the update: the leader's values
                f.write(b"GET %s\n" % k.encode())
                f.flush()
                got = f.readline()
                if got != b"VALUE v-%s\n" % k.encode():
                    wrong.append((k, got))
        sh = t.ended(srv)
        time.sleep(1.0)
        replies = cl.stop()
        divergences = [e["message"] for e in log(srv.pid) if e["event"] == "shadow"
                       and "diverg" in e["message"]]
        extra = "; %d keys read back, all with their values" % len(keys) if not wrong else ""
        ok = outcome_line("2. state transformation", sh, replies + len(keys),
                          wrong + list(cl.wrong), extra)
        if divergences:
            print("   first divergence logged: %.200s" % divergences[0])
        return ok
    finally:
        srv.close()


def timing_error(v1, runs, retries, delay):
    flaky = t.image("kvs-unlucky", 9, frm=v1)
    needed, failed, replies, wrong = [], 0, 0, []
    for run in range(runs):
        srv = t.Server(v1, "fault-timing%d" % run)
        try:
            cl = t.Clients(srv, tag="t%d-" % run)
            r = molt("update", "--shadow", srv.pid, flaky, "--timeout", "20", "--retries",
                     str(retries), "--retry-delay", str(delay), check=0)
            assert "started" in r.out, r
            alike, attempt, result = 0, 1, None
            end = time.monotonic() + 60
            while time.monotonic() < end:
                sh = status(srv.pid)["shadow"]
                t._followers.setdefault(srv.pid, []).append(sh["follower"])
                if sh["stage"] == "ended":
                    result = "gave up after %d attempts" % sh["attempt"]
                    break
                if sh["stage"] != "shadowing":
                    alike = 0
                    time.sleep(0.05)
                    continue
                if sh["attempt"] != attempt:
                    attempt, alike = sh["attempt"], 0
                got = t.ask(srv, "SET magic 42") + t.ask(srv, "GET magic")
                if got != "OK\nVALUE 42\n":
                    wrong.append(("magic", got))
                after = status(srv.pid)["shadow"]
                if after["stage"] == "shadowing" and after["attempt"] == attempt:
                    alike += 1
                if alike >= 6 and t.caught_up(srv)["stage"] == "shadowing":
                    result = attempt
                    break
                time.sleep(0.05)
            if isinstance(result, int):
                needed.append(result)
                molt("rollback", srv.pid, "--timeout", "20", check=0)
            else:
                failed += 1
                print("   run %d: %s" % (run, result or "no answer within 60 s"))
            time.sleep(0.3)
            replies += cl.stop()
            wrong += cl.wrong
        finally:
            srv.close()
    retried = [n - 1 for n in needed]
    print("%-26s %d runs: %d escaped (retries needed: median %s, max %s, distribution %s), "
          "%d gave up; clients: %d replies, %d wrong or lost" % (
              "3. timing error", runs, len(needed),
              statistics.median(retried) if retried else "-", max(retried) if retried else "-",
              {k: retried.count(k) for k in sorted(set(retried))}, failed, replies, len(wrong)))
    return not wrong and failed == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timing-runs", type=int, default=10)
    ap.add_argument("--retries", type=int, default=10)
    ap.add_argument("--retry-delay", type=float, default=0.5)
    a = ap.parse_args()
    v1 = t.image("kvs-v1")
    print("MVEDSUA's fault classes on kvs, load average %s" % loadavg())
    ok = new_code_error(v1)
    ok &= state_transformation_error(v1)
    ok &= timing_error(v1, a.timing_runs, a.retries, a.retry_delay)
    print("load average at the end %s; %s" % (
        loadavg(), "every class recovered, nothing lost" if ok else "NOT all recovered"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
