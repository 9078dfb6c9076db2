#!/usr/bin/env python3
"""bench/shadowupd/threads.py [SECONDS] [CHURNERS] -- a thread-per-connection
server (tests/shadowupd/progs/tps.c) shadowed by itself for SECONDS (default
30) while CHURNERS client threads (default 4) open one connection after
another (a SET and a GET of their own key on each, every reply checked) and
2 clients keep connections from before the fork: every connection is a
thread started and ended after the fork in the leader and in the follower
(docs/design.md §17, "Threads started after the fork").

Reports the connections served (threads started on each side), requests,
calls recorded and compared, divergences, the follower's most threads and
descriptors seen (sampled every 0.2 s: a thread and a channel per
connection being served, not per connection served), and after `molt
rollback` the leader's descriptors, threads and resident rings against
their baseline, with the load average.

Environment: MOLT_BUILD_DIR (default build/ of this tree, a plain build),
SHADOW_WORK (default /tmp/molt-bench-shadow-threads)."""
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("MOLT_BUILD_DIR", str(ROOT / "build"))
os.environ.setdefault("SHADOW_WORK", "/tmp/molt-bench-shadow-threads")
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "shadowupd")]

import test_shadow_threads as t  # noqa: E402
from harness.proc import molt, poll, status  # noqa: E402


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30
    churners = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    v1 = t.tps("tps-v1")
    same = t.tps("tps-same", frm=v1)
    srv = t.Server(v1, "bench-threads")
    try:
        fds = srv.settled_fds()
        nthreads = t.threads_of(srv.pid)
        cl = t.Clients(srv, n=2, tag="b")
        follower = t.shadow(srv, same)["follower"]
        ch = t.Churn(srv, n=churners, tag="bc")
        most_threads = most_fds = 0
        end = time.time() + seconds
        while time.time() < end:
            most_threads = max(most_threads, t.threads_of(follower))
            most_fds = max(most_fds, t.fd_count(follower))
            time.sleep(0.2)
        conns = ch.stop()
        requests = cl.stop() + 2 * conns
        s = t.caught_up(srv)
        load = os.getloadavg()
        print("%.0f s, %d churning clients: %d connections (a thread each, in the leader "
              "and in the follower), %d requests, wrong replies %d" %
              (seconds, churners, conns, requests, len(cl.wrong) + len(ch.wrong)))
        print("shadow: stage %s, %d calls recorded, %d compared, %d divergences, "
              "outcome %s" % (s["stage"], s["recorded"], s["compared"], s["divergences"],
                              s["outcome"]))
        print("follower: at most %d threads (%d at the start) and %d descriptors "
              "(the leader's baseline %d)" % (most_threads, nthreads, most_fds, len(fds)))
        molt("rollback", srv.pid, check=0)
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back")
        poll(lambda: t.threads_of(srv.pid), lambda n: n == nthreads, timeout=10,
             what="threads back")
        # each thread gives its ring back at its second call after the end
        # (the main thread polls every 50 ms)
        rss = poll(lambda: t.rings_rss_kib(srv.pid), lambda k: k == 0, timeout=5,
                   what="the rings given back")
        print("after rollback: descriptors %d (baseline %d), threads %d (baseline %d), "
              "rings resident %d KiB" % (len(srv.fds()), len(fds), t.threads_of(srv.pid),
                                          nthreads, rss))
        print("load average %.1f %.1f %.1f" % load)
    finally:
        srv.close()


if __name__ == "__main__":
    main()
