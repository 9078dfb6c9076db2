"""Retries of a shadowed update (docs/design.md §17, "Retries"):
`molt update --shadow --retries N [--retry-delay SEC]` replaces a follower
that diverged, crashed or failed its update by a new one, forked from a
fresh barrier after the delay, up to N times.

progs/kvs.c under checking clients (test_shadowupd's Server and Clients):
every reply the clients get is checked, and after the last attempt the
leader's descriptors and the shadow's rings are back to their baseline."""

import os
import time

from harness.proc import log, molt, poll, status
from harness.tree import build_sanitize
from test_shadowupd import (WORK, Clients, Server, _followers, ask, caught_up, ended,
                            image, images, rings_rss_kib)


def shadow_events(pid):
    return [e["message"] for e in log(pid) if e["event"] == "shadow"]


def note_follower(srv, sh):
    """Server.close() kills every follower it knows of (one may outlive a
    failed test)."""
    _followers.setdefault(srv.pid, []).append(sh["follower"])


def attempt_running(srv, k):
    """The shadow once attempt k's follower runs (its fork logged)."""
    sh = poll(lambda: status(srv.pid)["shadow"],
              lambda s: s["stage"] == "shadowing" and s["attempt"] == k,
              timeout=30, what="attempt %d to fork" % k)
    note_follower(srv, sh)
    return sh


def attempt_over(srv, k):
    """The shadow once attempt k has ended (the next one waits or runs, or
    the shadow ended)."""
    return poll(lambda: status(srv.pid)["shadow"],
                lambda s: s["attempt"] > k or s["stage"] in ("retrying", "ended"),
                timeout=30, what="attempt %d to end" % k)


def magic(srv):
    """SET magic 42, GET magic on one connection: the leader (v1) answers
    VALUE 42 whatever its follower does."""
    with srv.connect() as s:
        s.sendall(b"SET magic 42\nGET magic\n")
        with s.makefile("rb") as f:
            assert f.readline() == b"OK\n"
            assert f.readline() == b"VALUE 42\n"


def gone(pid):
    return not os.path.exists("/proc/%d" % pid) or \
        open("/proc/%d/stat" % pid).read().split()[2] == "Z"


def test_retry_after_a_divergence_that_does_not_repeat():
    """v7 answers GET magic differently while a flag file exists (a race
    that may not repeat): with --retries 2 the first attempt's follower
    diverges on it and is dropped; the test removes the file; the second
    attempt, a fresh fork at the next update points, replays GET magic
    alike and is committed.  The clients got v1's replies throughout."""
    v1 = image("kvs-v1")
    flaky = image("kvs-flaky", 7, frm=v1)
    flag = WORK / "flaky-flag"
    flag.write_text("on\n")
    srv = Server(v1, "retry-once", extra_env={"KVS_FLAKY": str(flag)})
    try:
        cl = Clients(srv)
        r = molt("update", "--shadow", srv.pid, flaky, "--timeout", "20",
                 "--retries", "2", "--retry-delay", "0.5", check=0)
        assert "started" in r.out, r
        sh = attempt_running(srv, 1)
        assert sh["attempts"] == 3, sh
        first = sh["follower"]
        magic(srv)
        sh = attempt_over(srv, 1)
        assert sh["divergences"] == 1, sh  # (the outcome may be attempt 2's already)
        flag.unlink()  # the "race" does not happen again
        sh = attempt_running(srv, 2)
        assert sh["follower"] != first and gone(first), sh
        magic(srv)
        for _ in range(3):
            assert ask(srv, "GET magic") == "VALUE 42\n"
        sh = caught_up(srv)
        assert sh["stage"] == "shadowing" and sh["attempt"] == 2, (sh, sh["outcome"])
        assert sh["divergences"] == 1 and sh["outcome"] is None, sh
        events = shadow_events(srv.pid)
        assert len(events) == 3, events
        assert "attempt 1 of 3: follower %d forked" % first in events[0], events
        assert "up to 2 retries, each 0.500 s after a follower ends" in events[0], events
        assert "attempt 1 of 3: diverged" in events[1] and "changed-by-v7" in events[1], events
        assert "attempt 2 of 3 forks at the next update points in 0.500 s" in events[1], events
        assert "attempt 2 of 3: follower %d forked" % sh["follower"] in events[2], events
        cl.stop_all_right(50)
        # the rehearsal that passed is applied in place
        r = molt("commit", srv.pid, "--timeout", "20", check=0)
        sh = status(srv.pid)["shadow"]
        assert sh["stage"] == "committed", sh
        assert status(srv.pid)["image"]["full_updates"] == 1
        assert ask(srv, "GET magic") == "VALUE 42\n"  # v7, the flag gone
        srv.assert_clean()
    finally:
        srv.close()


def test_always_diverging_ends_after_n_plus_one_attempts():
    """kvs-diff diverges on every GET magic: with --retries 2 there are
    exactly 3 attempts, each forked and ended with its reason in the log
    (6 shadow events), no 4th; the leader is unharmed: every reply right,
    its descriptors and the shadow's rings back to their baseline."""
    v1, _, diff, _ = images()
    srv = Server(v1, "retry-all")
    try:
        fds = srv.settled_fds()
        cl = Clients(srv)
        r = molt("update", "--shadow", srv.pid, diff, "--timeout", "20",
                 "--retries", "2", "--retry-delay", "0.2", check=0)
        assert "started" in r.out, r
        followers = []
        for k in (1, 2, 3):
            sh = attempt_running(srv, k)
            assert sh["attempts"] == 3 and sh["follower"] not in followers, sh
            followers.append(sh["follower"])
            magic(srv)
            sh = attempt_over(srv, k)
            assert sh["divergences"] == k, sh
        sh = ended(srv)
        assert sh["attempt"] == 3 and sh["divergences"] == 3, sh
        assert sh["outcome"].startswith("attempt 3 of 3: diverged"), sh
        assert "no attempt left (3 made)" in sh["outcome"], sh
        time.sleep(1.5)  # longer than the delay: nothing more forks
        sh = status(srv.pid)["shadow"]
        assert sh["stage"] == "ended" and sh["attempt"] == 3, sh
        events = shadow_events(srv.pid)
        ends = [m for m in events if "diverged" in m]
        forks = [m for m in events if "forked at the update points" in m]
        assert len(events) == 6 and len(ends) == 3 and len(forks) == 3, events
        for k, m in enumerate(ends, 1):
            assert "attempt %d of 3: diverged" % k in m and "changed-by-v2" in m, m
            assert '"VALUE 42\\n"' in m, m  # both sides
        assert "attempt 2 of 3 forks" in ends[0] and "attempt 3 of 3 forks" in ends[1]
        assert "no attempt left (3 made)" in ends[2], ends[2]
        for f in followers:
            assert gone(f), f
        cl.stop_all_right(50)
        assert ask(srv, "GET magic") == "VALUE 42\n"
        assert status(srv.pid)["image"]["full_updates"] == 0
        poll(srv.fds, lambda f: f == fds, timeout=10,
             what="descriptors back to baseline %s" % fds)
        poll(lambda: rings_rss_kib(srv.pid), lambda k: k == 0, timeout=10,
             what="the rings given back")
        # each attempt loaded the new image in the leader (its sealed copy)
        # and closed it after the fork: none is left mapped
        maps = open("/proc/%d/maps" % srv.pid).read()
        assert "memfd:kvs-v1.so" in maps and "memfd:kvs-diff.so" not in maps, maps
        srv.assert_clean()
    finally:
        srv.close()


def test_crashed_follower_retried():
    """A follower that crashes (v2 on GET crash) is retried like one that
    diverged: with --retries 1, two attempts, each crash logged with the
    signal (a sanitizer's handler exits instead), the leader serving on."""
    v1, _, _, crash = images()
    srv = Server(v1, "retry-crash")
    try:
        cl = Clients(srv)
        molt("update", "--shadow", srv.pid, crash, "--retries", "1", "--retry-delay", "0.2",
             check=0)
        for k in (1, 2):
            attempt_running(srv, k)
            assert ask(srv, "GET crash") == "NONE\n"   # the leader runs v1
            attempt_over(srv, k)
        sh = ended(srv)
        assert sh["attempt"] == 2 and sh["divergences"] == 0, sh
        want = "crashed (signal 11" if not build_sanitize() else "exited with status"
        ends = [m for m in shadow_events(srv.pid) if want in m]
        assert len(ends) == 2, shadow_events(srv.pid)
        assert "attempt 1 of 2" in ends[0] and "attempt 2 of 2 forks" in ends[0], ends
        assert "attempt 2 of 2" in ends[1] and "no attempt left (2 made)" in ends[1], ends
        cl.stop_all_right(20)
        assert ask(srv, "PING") == "PONG\n"
    finally:
        srv.close()


def test_failed_transformer_retried_then_rollback_cancels():
    """A transformer that faults in every follower: with --retries 1 there
    are exactly 2 attempts, each logged as failed in the follower.  Then
    with --retries 3 and a long delay, the shadow waits for its second
    attempt: promote, commit, a second shadow and a plain update are
    refused with the way out; molt rollback cancels the retries and no
    follower forks after it."""
    v1 = image("kvs-v1")
    bad = image("kvs-fail", 4, frm=v1, xf="kvs-fail.xf")
    srv = Server(v1, "retry-xf")
    try:
        fds = srv.settled_fds()
        cl = Clients(srv)
        molt("update", "--shadow", srv.pid, bad, "--retries", "1", "--retry-delay", "0",
             check=0)
        sh = poll(lambda: status(srv.pid)["shadow"],
                  lambda s: s["stage"] == "ended", timeout=30, what="both attempts to fail")
        assert sh["attempt"] == 2 and sh["attempts"] == 2, sh
        assert sh["outcome"].startswith("attempt 2 of 2: the update failed in the follower"), sh
        events = shadow_events(srv.pid)
        failed = [m for m in events if "failed in the follower" in m]
        assert len(failed) == 2 and len(events) == 4, events
        assert "attempt 1 of 2" in failed[0] and "attempt 2 of 2 forks" in failed[0], failed
        assert "attempt 2 of 2" in failed[1] and "no attempt left (2 made)" in failed[1], failed

        molt("update", "--shadow", srv.pid, bad, "--retries", "3", "--retry-delay", "60",
             check=0)
        sh = poll(lambda: status(srv.pid)["shadow"],
                  lambda s: s["stage"] == "retrying", timeout=30,
                  what="the first attempt to fail")
        assert sh["attempt"] == 1 and sh["attempts"] == 4, sh
        assert "attempt 2 of 4 forks at the next update points in 60.000 s" in sh["outcome"], sh
        for cmd in (("promote", srv.pid), ("commit", srv.pid),
                    ("update", "--shadow", srv.pid, bad), ("update", srv.pid, bad)):
            r = molt(*cmd, check=1)
            assert "attempt 1 of 4 of the shadowed update ended" in r.err, (cmd, r)
            assert "'molt rollback' cancels it" in r.err, (cmd, r)
        r = molt("rollback", srv.pid, check=0)
        assert "retries were cancelled after attempt 1 of 4" in r.out, r
        sh = status(srv.pid)["shadow"]
        assert sh["stage"] == "ended" and sh["attempt"] == 1, sh
        assert sh["outcome"].startswith("retries cancelled by molt rollback after attempt 1 of 4"), sh
        before = shadow_events(srv.pid)
        assert "retries cancelled by molt rollback" in before[-1], before
        r = molt("rollback", srv.pid, check=1)   # nothing left to cancel
        assert "hot patches are not supported" in r.err, r
        time.sleep(1)
        assert shadow_events(srv.pid) == before
        cl.stop_all_right(20)
        assert status(srv.pid)["image"]["full_updates"] == 0
        poll(srv.fds, lambda f: f == fds, timeout=10,
             what="descriptors back to baseline %s" % fds)
        srv.assert_clean()
    finally:
        srv.close()


def test_retry_barrier_obeys_the_timeout():
    """A retry's barrier waits --timeout, as the first one does: with a
    worker of the leader held in a request (kvs's HOLD, until a file is
    gone: it passes no update point), attempt 2 does not start ("update
    timed out after 1000 ms", logged, its attempt used up) and the next one
    waits its delay; once the worker is free a later attempt forks.  The
    held client gets its reply; the others saw every reply right."""
    v1, _, diff, _ = images()
    hold = WORK / "hold-flag"
    if hold.exists():
        hold.unlink()
    srv = Server(v1, "retry-timeout", extra_env={"KVS_HOLD": str(hold)})
    try:
        cl = Clients(srv, n=1)  # one worker; HOLD takes another, magic() the third
        r = molt("update", "--shadow", srv.pid, diff, "--timeout", "1",
                 "--retries", "4", "--retry-delay", "1", check=0)
        assert "started" in r.out, r
        attempt_running(srv, 1)
        hold.write_text("held\n")
        held = srv.connect()
        held.sendall(b"HOLD\n")
        time.sleep(0.3)  # the worker holds
        magic(srv)
        sh = poll(lambda: status(srv.pid)["shadow"],
                  lambda s: s["attempt"] >= 2 and "did not start" in (s["outcome"] or ""),
                  timeout=30, what="attempt 2's barrier to time out")
        # (a loaded machine may show a later attempt that timed out too)
        assert sh["stage"] == "retrying", sh
        assert "did not start: update timed out after 1000 ms" in sh["outcome"], sh
        hold.unlink()
        with held.makefile("rb") as f:
            assert f.readline() == b"HELD\n"
        held.close()
        sh = poll(lambda: status(srv.pid)["shadow"],
                  lambda s: s["stage"] == "shadowing" and s["attempt"] >= 3,
                  timeout=30, what="a later attempt to fork")
        note_follower(srv, sh)
        events = shadow_events(srv.pid)
        missed = [m for m in events if "did not start" in m]
        assert missed and ": attempt 2 of 5 did not start: update timed out after 1000 ms; " \
            "threads that did not reach an update point:" in missed[0], events
        assert "attempt 3 of 5 forks at the next update points in 1.000 s" in missed[0], missed
        assert len(missed) == sh["attempt"] - 2, events  # each attempt between: logged once
        assert any("attempt %d of 5: follower" % sh["attempt"] in m for m in events), events
        r = molt("rollback", srv.pid, check=0)
        assert "follower %d" % sh["follower"] in r.out, r
        sh = status(srv.pid)["shadow"]
        assert sh["stage"] == "ended" and "dropped by molt rollback" in sh["outcome"], sh
        cl.stop_all_right(20)
        assert ask(srv, "GET magic") == "VALUE 42\n"
        srv.assert_clean()
    finally:
        if hold.exists():
            hold.unlink()
        srv.close()


def test_refusal_at_a_retry_ends_the_retries():
    """A retry's barrier that refuses for a reason that would refuse every
    later attempt too -- an io_uring the program opened while the retry
    waited -- ends the retries at once (attempt 2 of 4, logged with the
    reason), the process serving on unchanged."""
    v1 = image("kvs-v1")
    bad = image("kvs-fail", 4, frm=v1, xf="kvs-fail.xf")
    srv = Server(v1, "retry-uring")
    try:
        molt("update", "--shadow", srv.pid, bad, "--retries", "3", "--retry-delay", "3",
             check=0)
        poll(lambda: status(srv.pid)["shadow"], lambda s: s["stage"] == "retrying",
             timeout=30, what="the first attempt to fail")
        got = ask(srv, "URING")
        assert got.startswith("URING ") and int(got.split()[1]) >= 0, got
        sh = poll(lambda: status(srv.pid)["shadow"], lambda s: s["stage"] == "ended",
                  timeout=30, what="the retries to end")
        assert sh["attempt"] == 2 and sh["attempts"] == 4, sh
        assert sh["outcome"].startswith("attempt 2 of 4 did not start: ") and \
            "the program holds an io_uring (fd %s)" % got.split()[1] in sh["outcome"], sh
        assert sh["outcome"].endswith(
            "no more attempts: the next would be refused the same way"), sh
        events = shadow_events(srv.pid)
        assert len(events) == 3 and "io_uring" in events[2], events
        time.sleep(3.5)  # past another delay: nothing forks
        assert shadow_events(srv.pid) == events
        assert ask(srv, "PING") == "PONG\n" and ask(srv, "GET nothing") == "NONE\n"
        assert status(srv.pid)["image"]["full_updates"] == 0
        srv.assert_clean()
    finally:
        srv.close()


def test_bad_retry_values_refused():
    """Bad --retries and --retry-delay values, and the options where they
    do not apply, are refused by the CLI with the reason (exit 2); an
    io_uring refusal before the fork is not retried.  The process stays
    unchanged."""
    v1, same, _, _ = images()
    srv = Server(v1, "retry-bad")
    try:
        pid = str(srv.pid)
        bad = [
            (["--retries", "-1"], "invalid number of retries '-1'; give a whole number from 0 to 100"),
            (["--retries", "two"], "invalid number of retries 'two'"),
            (["--retries", "101"], "invalid number of retries '101'"),
            (["--retries", ""], "invalid number of retries ''"),
            (["--retries", "1", "--retry-delay", "-1"],
             "invalid retry delay '-1'; give a number of seconds from 0 to 3600"),
            (["--retries", "1", "--retry-delay", "soon"], "invalid retry delay 'soon'"),
            (["--retries", "1", "--retry-delay", "3601"], "invalid retry delay '3601'"),
            (["--retries", "1", "--retry-delay", "nan"], "invalid retry delay 'nan'"),
            (["--retry-delay", "1"], "--retry-delay needs --retries N"),
        ]
        for opts, want in bad:
            r = molt("update", "--shadow", pid, same, *opts, check=2)
            assert want in r.err, (opts, r)
        r = molt("update", pid, same, "--retries", "1", check=2)
        assert "--retries applies only to a shadowed update" in r.err, r
        r = molt("apply", pid, same, "--retries", "1", check=2)
        assert "--retries applies only to a shadowed update" in r.err, r
        r = molt("update", "--shadow", pid, same, "--retries", check=2)
        assert "option --retries needs a value" in r.err, r
        assert status(srv.pid)["shadow"] is None
        # a refusal before the fork is the request's answer, never retried
        assert ask(srv, "URING").startswith("URING ")
        r = molt("update", "--shadow", pid, same, "--retries", "3", "--retry-delay", "0",
                 check=1)
        assert "the program holds an io_uring" in r.err, r
        time.sleep(0.5)
        assert status(srv.pid)["shadow"] is None
        assert [e for e in log(srv.pid) if e["event"] == "shadow"] == []
        assert ask(srv, "PING") == "PONG\n"
        srv.assert_clean()
    finally:
        srv.close()
