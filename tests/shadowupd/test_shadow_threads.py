"""Shadowed updates of a thread-per-connection server (docs/design.md §17,
"Threads started after the fork").

progs/tps.c: the main thread accepts, each connection gets a thread of its
own (pthread_create, detached) that ends when the client hangs up.  While a
shadow runs, each thread the leader starts is recorded in its creator's
ring and gets a ring of its own; the follower's creator, replaying that
record, starts its thread paired with that ring; a thread that ends frees
its ring for the next one.  Clients check every reply (test_shadowupd's
Clients and Server)."""

import os
import threading
import time

from harness.proc import log, molt, poll, status
from test_shadowupd import (HERE, image, Clients, Server, ask, caught_up, sud_armed,
                            ended, rings_rss_kib, rules_file, served_on, shadow,
                            took_over)

SRC = HERE / "progs" / "tps.c"
# Connections made one after another in the self-shadow (each a thread in
# the leader and one in the follower).
CONNECTIONS = 300


def tps(name, variant=None, frm=None):
    """tps.c as image <name>.so (-DTPS_VARIANT=variant, --molt-from frm)."""
    return image(name, variant, frm, src=SRC, macro="TPS_VARIANT")


def ask_on(f, line):
    f.write(line.encode() + b"\n")
    f.flush()
    return f.readline().decode()


def threads_of(pid):
    return len(os.listdir("/proc/%d/task" % pid))


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


class Churn:
    """n client threads, each opening a connection after another (a thread
    in the server each), with a SET and a GET of its own key on it, every
    reply checked, until stop().  A connection that fails (reset, closed,
    no reply within 5 s) is counted in `lost` and the client goes on; a
    wrong reply stops it (`wrong`)."""

    def __init__(self, srv, n=2, tag="ch"):
        self.srv, self.go, self.wrong, self.conns = srv, True, [], [0] * n
        self.lost = []
        self.threads = [threading.Thread(target=self.run, args=(i, tag)) for i in range(n)]
        for t in self.threads:
            t.start()

    def run(self, i, tag):
        k = 0
        while self.go:
            try:
                with self.srv.connect() as c, c.makefile("rwb") as f:
                    c.settimeout(5)
                    key = "%s%d-%d" % (tag, i, k % 16)
                    for req, want in (("SET %s %d" % (key, k), "OK\n"),
                                      ("GET %s" % key, "VALUE %d\n" % k)):
                        got = ask_on(f, req)
                        if got == "":
                            raise ConnectionResetError("closed without a reply")
                        if got != want:
                            self.wrong.append((req, want, got))
                            return
            except OSError as e:
                self.lost.append(repr(e))
                k += 1   # its SET may have been applied: the next key
                continue
            self.conns[i] += 1
            k += 1

    def stop(self):
        self.go = False
        for t in self.threads:
            t.join(30)
        return sum(self.conns)


def test_thread_per_connection_self_shadow():
    """tps shadowed by itself while clients connect again and again: each
    connection is a thread started (and ended) after the fork in the leader
    and in the follower.  0 divergences, every reply right, the follower
    caught up with every call (thread starts and ends counted among them);
    the follower's threads, descriptors and rings stay bounded (a ring and
    a channel per live thread, freed when it ends), and after rollback the
    leader's descriptors, threads and rings are back to their baseline."""
    v1 = tps("tps-v1")
    same = tps("tps-same", frm=v1)
    srv = Server(v1, "tp-same")
    try:
        fds = srv.settled_fds()
        nthreads = threads_of(srv.pid)
        cl = Clients(srv, n=2, tag="s")   # two threads started before the fork
        sh = shadow(srv, same)
        follower = sh["follower"]
        assert sh["stage"] == "shadowing", sh
        ch = Churn(srv, n=2, tag="c")
        for n in range(CONNECTIONS):
            with srv.connect() as c, c.makefile("rwb") as f:
                assert ask_on(f, "SET t%d %d" % (n % 8, n)) == "OK\n"
                assert ask_on(f, "GET t%d" % (n % 8)) == "VALUE %d\n" % n
            if n % 50 == 0:
                s = status(srv.pid)["shadow"]
                assert s["stage"] == "shadowing", s["outcome"]
                # a thread and a channel per connection being served, not per
                # connection served so far
                assert threads_of(follower) < nthreads + 40, threads_of(follower)
                assert fd_count(follower) < len(fds) + 80, fd_count(follower)
        churned = ch.stop()
        s = caught_up(srv)
        assert s["stage"] == "shadowing" and s["divergences"] == 0, s["outcome"]
        assert s["outcome"] is None, s
        replies = cl.stop()
        assert cl.wrong == [] and ch.wrong == [] and ch.lost == [], \
            (cl.wrong[:3], ch.wrong[:3], ch.lost[:3])
        assert replies > 50 and churned > 20, (replies, churned)
        # every connection thread ended on both sides: the follower holds
        # what it held at its start (its threads, no channel left over)
        poll(lambda: threads_of(follower), lambda n: n <= nthreads + 1, timeout=20,
             what="the follower's connection threads to end")
        s = caught_up(srv)
        assert s["stage"] == "shadowing" and s["divergences"] == 0, s["outcome"]
        r = molt("rollback", srv.pid, check=0)
        assert "follower %d" % follower in r.out, r
        sh = status(srv.pid)["shadow"]
        assert sh["stage"] == "ended" and "dropped by molt rollback" in sh["outcome"], sh
        assert ask(srv, "PING") == "PONG\n"
        poll(srv.fds, lambda f: f == fds, timeout=10,
             what="descriptors back to baseline %s" % fds)
        poll(lambda: threads_of(srv.pid), lambda n: n == nthreads, timeout=10,
             what="the leader's threads back to %d" % nthreads)
        # every ring given back: those of the connection threads when their
        # ends were replayed, the main thread's at its next calls
        poll(lambda: rings_rss_kib(srv.pid), lambda k: k == 0, timeout=10,
             what="the leader's rings given back")
        srv.assert_clean()
    finally:
        srv.close()


def test_changed_reply_on_a_new_thread_caught():
    """A new version that answers one request differently, on a connection
    accepted after the fork and served by a thread started after it: the
    follower is ended with both replies named, the leader's clients see
    every reply right, none lost, and the descriptors return to their
    baseline."""
    v1 = tps("tps-v1")
    diff = tps("tps-diff", 1, frm=v1)
    srv = Server(v1, "tp-diff")
    try:
        fds = srv.settled_fds()
        cl = Clients(srv, n=2, tag="d")
        ch = Churn(srv, n=1, tag="dc")
        shadow(srv, diff)
        for n in range(30):
            assert ask(srv, "SET k%d %d" % (n, n)) == "OK\n"
        assert status(srv.pid)["shadow"]["stage"] == "shadowing"
        with srv.connect() as s, s.makefile("rwb") as f:
            assert ask_on(f, "SET magic 42") == "OK\n"
            assert ask_on(f, "GET magic") == "VALUE 42\n"
        sh = ended(srv)
        assert sh["divergences"] == 1, sh
        assert '"VALUE 42\\n"' in sh["outcome"] and "changed-by-v2" in sh["outcome"], sh
        time.sleep(0.5)
        churned = ch.stop()
        replies = cl.stop()
        assert cl.wrong == [] and ch.wrong == [] and ch.lost == [], \
            (cl.wrong[:3], ch.wrong[:3], ch.lost[:3])
        assert replies > 20 and churned > 5, (replies, churned)
        assert ask(srv, "GET magic") == "VALUE 42\n"
        poll(srv.fds, lambda f: f == fds, timeout=10,
             what="descriptors back to baseline %s" % fds)
        assert not os.path.exists("/proc/%d" % sh["follower"])
        srv.assert_clean()
    finally:
        srv.close()


def test_version_that_starts_no_thread_caught():
    """A new version that serves a connection in its accepting thread
    instead of starting a thread for it: where the leader's thread started
    one, the follower's makes a call -- a divergence naming the leader's
    pthread_create and the entry function; the leader serves on."""
    v1 = tps("tps-v1")
    inline = tps("tps-inline", 2, frm=v1)
    srv = Server(v1, "tp-inline")
    try:
        cl = Clients(srv, n=1, tag="i")
        shadow(srv, inline)
        assert ask(srv, "PING") == "PONG\n"
        sh = ended(srv)
        assert sh["divergences"] == 1, sh
        assert "pthread_create(conn_main)" in sh["outcome"], sh
        assert ask(srv, "PING") == "PONG\n"
        replies = cl.stop()
        assert cl.wrong == [] and replies > 0, cl.wrong[:3]
        srv.assert_clean()
    finally:
        srv.close()


RULES_VERSION = r"""# v3 answers VERSION 3, v1 VERSION 1
forward send socket "VERSION 3\n" rewrite "VERSION 1\n"
reverse send socket "VERSION 1\n" rewrite "VERSION 3\n"
"""


def test_promote_rollback_commit_with_connection_threads():
    """promote while connection threads come and go: threads started by the
    new version once it leads are followed by the old one (the rings'
    roles swapped, thread by thread); rollback: the old version leads
    again and serves on; a second shadow, promoted, then commit: this
    process runs the new version.  Every reply right throughout, VERSION
    answered by the version that leads."""
    v1 = tps("tps-v1")
    v3 = tps("tps-v3", 3, frm=v1)
    rules = rules_file("tps-version.rules", RULES_VERSION)
    srv = Server(v1, "tp-promote")
    try:
        cl = Clients(srv, n=2, tag="p")
        churned = 0
        for end in ("rollback", "commit"):
            ch = Churn(srv, n=2, tag="pc-%s-" % end)
            follower = shadow(srv, v3, "--rules", rules)["follower"]
            assert ask(srv, "VERSION") == "VERSION 1\n"
            time.sleep(0.5)
            r = molt("promote", srv.pid, "--timeout", "20", check=0)
            assert "the new version (follower %d) leads" % follower in r.out, r
            for _ in range(20):
                assert ask(srv, "VERSION") == "VERSION 3\n"
            s = poll(lambda: status(srv.pid)["shadow"], lambda s: s["rule_decided"] >= 20,
                     timeout=20, what="v1 to follow v3's threads")
            assert s["stage"] == "promoted" and s["divergences"] == 0, s["outcome"]
            # the old version follows under the backstop, threads it starts
            # while promoted too (armed in their start hook): one serving a
            # connection made now, a thread that did not exist before
            before = set(int(t) for t in os.listdir("/proc/%d/task" % srv.pid))
            with srv.connect() as held, held.makefile("rwb") as f:
                f.write(b"VERSION\n")
                f.flush()
                assert f.readline() == b"VERSION 3\n"
                poll(lambda: sud_armed(srv.pid),
                     lambda a: a is not None and
                     any(on for t, on in a.items() if t not in before),
                     timeout=20, what="a thread the old version started, armed")
            # the lead comes back only once no connection the new version
            # accepted after the promotion is open (design §17): the churn
            # stops
            churned += ch.stop()
            assert ch.wrong == [] and ch.lost == [], (ch.wrong[:3], ch.lost[:3])
            r = molt(end, srv.pid, "--timeout", "20")
            assert r.rc == 0, (r, status(srv.pid)["shadow"],
                               [(e["event"], e["message"]) for e in log(srv.pid)][-5:])
            sh = status(srv.pid)["shadow"]
            assert not os.path.exists("/proc/%d" % follower)
            if end == "rollback":
                assert sh["stage"] == "ended" and "after the promotion" in sh["outcome"], sh
                armed = sud_armed(srv.pid)
                assert armed is not None and not any(armed.values()), armed
                for _ in range(5):
                    assert ask(srv, "VERSION") == "VERSION 1\n"
        assert sh["stage"] == "committed" and "updated in place" in sh["outcome"], sh
        assert status(srv.pid)["image"]["full_updates"] == 1
        for _ in range(5):
            assert ask(srv, "VERSION") == "VERSION 3\n"
        time.sleep(0.3)
        replies = cl.stop()
        assert cl.wrong == [], cl.wrong[:3]
        assert replies > 20 and churned > 40, (replies, churned)
        events = [e["message"] for e in log(srv.pid) if e["event"] == "shadow"]
        assert any("committed: the process runs" in m for m in events), events
        srv.assert_clean()
    finally:
        srv.close()


def test_leader_killed_while_connection_threads_serve():
    """The leader SIGKILLed while connection threads it started after the
    fork serve (clients connected before and after the fork keep sending
    through the kill, new connections come all the time): the follower
    replays each started thread's calls, then its threads serve on alone --
    every request answered right -- and it starts threads for new
    connections itself.  (A connection the leader was accepting at the
    very moment it died may die with it: design §17, "The leader dies".)"""
    v1 = tps("tps-v1")
    same = tps("tps-same", frm=v1)
    for i, delay in enumerate((0.3, 1.0)):
        srv = Server(v1, "tp-kill%d" % i)
        try:
            cl = Clients(srv, n=1, tag="k%d-" % i)
            follower = shadow(srv, same)["follower"]
            late = Clients(srv, n=2, tag="l%d-" % i)   # threads started after the fork
            ch = Churn(srv, n=2, tag="kc%d-" % i)
            time.sleep(delay)
            os.kill(srv.pid, 9)
            srv.p.p.wait()
            served_on(srv, late, "follower %d after the leader's death" % follower)
            took_over(follower, srv.pid)
            assert ask(srv, "SET after %d" % i) == "OK\n"
            assert ask(srv, "GET after") == "VALUE %d\n" % i
            time.sleep(0.3)
            churned = ch.stop()
            replies = cl.stop() + late.stop()
            assert cl.wrong == [] and late.wrong == [] and ch.wrong == [], \
                (cl.wrong[:3], late.wrong[:3], ch.wrong[:3])
            # a connection the leader was accepting when it died may be lost
            # with it (design §17, "The leader dies"): one per churning
            # client at most, never a wrong reply
            assert len(ch.lost) <= 2, ch.lost
            assert replies > 40 and churned > 10, (replies, churned)
            assert open("/proc/%d/stat" % follower).read().split()[2] != "Z"
        finally:
            srv.close()
        srv.assert_clean()


def test_thread_started_past_the_wrapper_ends_the_follower():
    """A thread started past the program's pthread_create wrapper (as a
    library starts one of its own; glibc blocks every signal around its
    clone) is not followed: the follower's backstop ends it with the clone
    named -- SIGSYS is kept unblocked for that -- and the leader serves
    on, its thread started and joined."""
    v1 = tps("tps-v1")
    same = tps("tps-same", frm=v1)
    srv = Server(v1, "tp-lib")
    try:
        cl = Clients(srv, n=1, tag="b")
        shadow(srv, same)
        # connection threads, started through the wrapper, are followed
        for n in range(20):
            assert ask(srv, "SET b%d %d" % (n, n)) == "OK\n"
        s = caught_up(srv)
        assert s["stage"] == "shadowing" and s["divergences"] == 0, s["outcome"]
        assert ask(srv, "LIB") == "LIB 0\n"
        sh = ended(srv)
        assert "made a system call molt does not follow: clone" in sh["outcome"], sh
        assert "started outside the program image's pthread_create" in sh["outcome"], sh
        assert sh["divergences"] == 0, sh
        assert ask(srv, "LIB") == "LIB 0\n" and ask(srv, "PING") == "PONG\n"
        replies = cl.stop()
        assert cl.wrong == [] and replies > 0, cl.wrong[:3]
        srv.assert_clean()
    finally:
        srv.close()
