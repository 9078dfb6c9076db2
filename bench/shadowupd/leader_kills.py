#!/usr/bin/env python3
"""bench/shadowupd/leader_kills.py [KILLS] -- a shadowed update's leader
SIGKILLed KILLS times (default 40) amid continuous requests, at moments
spread over the first 2 s after the fork: how often the follower takes over
and how often a client's request is lost or answered twice.

The CI test (tests/shadowupd, test_leader_killed_follower_takes_over)
pauses its clients for each kill; here they do not, so a kill can land in
"the window" (docs/design.md §17): a call the leader made but had not yet
recorded.  A request it had read is then never answered (the client times
out: "lost"), a reply it had sent is sent again (the client reads it in
place of the next one: "repeated").  Each kill runs kvs (tests/shadowupd/
progs) under 2 checking clients.

Environment: MOLT_BUILD_DIR (default build/ of this tree, a plain build),
SHADOW_WORK (default /tmp/molt-bench-leader-kills)."""
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
    kills = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    v1, same, _, _ = t.images()
    took, lost, repeated, requests = 0, 0, 0, 0
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
    print("%d kills: %d taken over; %d requests answered, %d lost, %d answered twice "
          "(each client stops at its first wrong reply)" % (kills, took, requests, lost, repeated))


if __name__ == "__main__":
    main()
