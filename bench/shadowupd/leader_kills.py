#!/usr/bin/env python3
"""bench/shadowupd/leader_kills.py [KILLS] [--server kvs|eps] -- a shadowed
update's leader SIGKILLed KILLS times (default 40) amid continuous
requests, at moments spread over the first 2 s after the fork: how often
the follower takes over and how often a client's request is lost or
answered twice.  --server eps: the epoll server of tests/shadowupd
(progs/eps.c: an acceptor hands each connection to one of 3 workers'
epoll instances, one-shot registrations armed again after each request)
shadowed by its variant 2 (other heap addresses, so a registration left
with the dead leader's data would hand the follower a wrong pointer),
with new connections made all the time by the clients.

The clients never pause, so a kill can land in "the window"
(docs/design.md §17, "The leader dies"): a read or write the leader was
inside of, its record not yet published.  The follower completes such a
call from the kernel's TCP byte totals; were it not completed, a request
the leader had read would never be answered (the client times out:
"lost") and a reply it had sent would be sent again (the client reads it
in place of the next one: "answered twice").  Each kill runs kvs
(tests/shadowupd/progs) under 2 checking clients; the follower's status
says how many calls the leader died inside of and what became of them
("inside": completed / had moved nothing / could not be told).

Environment: MOLT_BUILD_DIR (default build/ of this tree, a plain build),
SHADOW_WORK (default /tmp/molt-bench-leader-kills)."""
import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("MOLT_BUILD_DIR", str(ROOT / "build"))
os.environ.setdefault("SHADOW_WORK", "/tmp/molt-bench-leader-kills")
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "shadowupd")]

import test_shadowupd as t  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description="a shadowed update's leader SIGKILLed "
                                 "amid continuous requests")
    ap.add_argument("kills", nargs="?", type=int, default=40)
    ap.add_argument("--server", choices=("kvs", "eps"), default="kvs")
    o = ap.parse_args()
    kills, server = o.kills, o.server
    if server == "eps":
        import test_shadow_epoll as te
        v1 = te.eps("eps-v1")
        same = te.eps("eps-v2", 2, frm=v1)
    else:
        v1, same, _, _ = t.images()
    took, lost, repeated, requests = 0, 0, 0, 0
    inside = [0, 0, 0]
    for k in range(kills):
        delay = 2.0 * k / kills
        srv = t.Server(v1, "bk%d" % k)
        try:
            cl = t.Clients(srv, tag="b%d-" % k)
            follower = t.shadow(srv, same)["follower"]
            time.sleep(delay)
            os.kill(srv.pid, 9)
            srv.p.p.wait()
            ok = True
            try:
                t.took_over(follower, srv.pid)
                took += 1
                time.sleep(0.5)   # each thread's first call after the drain
                sh = t.status(follower)["shadow"]
                for j, n in enumerate(t.intents_of(sh["outcome"])):
                    inside[j] += n
            except AssertionError as e:
                ok = False
                print("kill %d at %.2f s: no takeover: %s" % (k, delay, e))
            time.sleep(0.5)
            requests += cl.stop()
            for want, got in cl.wrong:
                if want == "connection":
                    lost += 1
                else:
                    repeated += 1
            if cl.wrong or not ok:
                print("kill %d at %.2f s: %s" % (k, delay, cl.wrong[:2]))
        finally:
            srv.close()
    print("%s, %d kills: %d taken over; %d requests answered, %d lost, %d answered twice "
          "(each client stops at its first wrong reply); calls the leader died inside of: "
          "%d completed, %d had moved nothing, %d could not be told (load average %s)"
          % (server, kills, took, requests, lost, repeated, inside[0], inside[1], inside[2],
             " ".join(open("/proc/loadavg").read().split()[:3])))


if __name__ == "__main__":
    main()
