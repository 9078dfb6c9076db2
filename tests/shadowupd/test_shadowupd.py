"""Shadowed updates (docs/design.md §17): `molt update --shadow` forks a
follower at the update points; the follower performs the full update and
replays the leader's calls, compared call by call, while the leader serves.

Each test runs progs/kvs.c (3 workers, each serving its own connections)
under checking clients that keep their connections from before the shadow
starts, and asserts on the replies the clients got (every one checked),
on `molt status` / `molt log`, and on the leader's descriptors."""

import ctypes
import errno
import os
import resource
import re
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

from harness.moltcc import moltcc
from harness.proc import Program, log, molt, poll, sanitizer_reports, status
from harness.tree import build_sanitize, molt_cli

HERE = Path(__file__).resolve().parent
WORK = Path(os.environ.get("SHADOW_WORK") or tempfile.mkdtemp(prefix="molt-shadowupd-"))
SRC = HERE / "progs" / "kvs.c"
CFLAGS = ["-O1", "-g", "-Wall"]
_built = {}


def image(name, variant=None, frm=None, xf=None, src=SRC, macro="KVS_VARIANT"):
    """src (kvs.c) as image <name>.so: -D<macro>=variant, --molt-from frm,
    --molt-xf progs/<xf>."""
    if name in _built:
        return _built[name]
    WORK.mkdir(parents=True, exist_ok=True)
    out = WORK / (name + ".so")
    args = ["--molt-program"] + CFLAGS + ["-o", out, src]
    if variant is not None:
        args.append("-D%s=%d" % (macro, variant))
    if frm is not None:
        args += ["--molt-from", frm]
    if xf is not None:
        args += ["--molt-xf", HERE / "progs" / xf]
    r = moltcc(args, cwd=None)
    assert r.returncode == 0, r
    _built[name] = out
    return out


def images():
    v1 = image("kvs-v1")
    return v1, image("kvs-same", frm=v1), image("kvs-diff", 1, frm=v1), \
        image("kvs-crash", 2, frm=v1)


class Server:
    """kvs.so run with `molt run`, its port read from a file."""

    def __init__(self, so, tag, io=None, extra_env=None):
        self.portfile = WORK / ("port-" + tag)
        if self.portfile.exists():
            self.portfile.unlink()
        env = dict(os.environ)
        # the follower is the child of a multi-threaded fork() that starts
        # threads, which ThreadSanitizer refuses unless told
        env["TSAN_OPTIONS"] = (env.get("TSAN_OPTIONS", "") + " die_after_fork=0").strip()
        if io:
            env["KVS_IO"] = io  # "vec": recvmsg/readv/recvfrom, writev/sendmsg/sendto
        env.update(extra_env or {})
        self.p = Program([molt_cli(), "run", so, self.portfile, "3"], env=env, name=tag)
        self.pid = self.p.pid
        poll(lambda: self.portfile.exists(), timeout=30, what="kvs listening")
        self.port = int(self.portfile.read_text())
        self.p.wait_control()

    def fds(self):
        return sorted(os.listdir("/proc/%d/fd" % self.pid))

    def settled_fds(self):
        """Its descriptors once they stay the same for 300 ms (the control
        connection of the last `molt status` may still be closing)."""
        last = None
        while True:
            now = self.fds()
            if now == last:
                return now
            last = now
            time.sleep(0.3)

    def connect(self):
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def assert_clean(self):
        """No sanitizer report on the shared stderr (leader and follower)."""
        reports = sanitizer_reports(self.p.stderr(100000))
        assert reports == [], self.p.stderr()

    def close(self):
        if self.p.alive():
            self.p.kill()
        # a follower whose leader is killed takes over: end it too
        for pid in followers_of(self.pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


_followers = {}


def followers_of(pid):
    return _followers.get(pid, [])


class Clients:
    """n connections made now (fewer than the 3 workers, which serve one
    connection each at a time), each a thread that sets and reads back its
    own keys and checks every reply until stop()."""

    def __init__(self, srv, n=2, tag="c"):
        self.socks = [srv.connect() for _ in range(n)]
        self.go = True
        self.hold = threading.Event()     # set: pause between requests
        self.held = [threading.Event() for _ in range(n)]
        self.replies = [0] * n
        self.wrong = []
        self.threads = [threading.Thread(target=self.run, args=(i, tag)) for i in range(n)]
        for t in self.threads:
            t.start()

    def run(self, i, tag):
        f = self.socks[i].makefile("rwb")
        n = 0
        try:
            while self.go:
                k = b"%s%d-%d" % (tag.encode(), i, n % 64)
                # one request at a time (two replies in flight would wait
                # for each other's ACK: Nagle)
                for req, want in ((b"SET %s v%d\n" % (k, n), b"OK\n"),
                                  (b"GET %s\n" % k, b"VALUE v%d\n" % n)):
                    f.write(req)
                    f.flush()
                    got = f.readline()
                    if got != want:
                        self.wrong.append((want, got))
                        return
                    self.replies[i] += 1
                n += 1
                time.sleep(0.001)
                while self.hold.is_set() and self.go:
                    self.held[i].set()
                    time.sleep(0.001)
                self.held[i].clear()
        except OSError as e:
            self.wrong.append(("connection", repr(e)))

    def pause(self):
        """Returns once every client waits between two requests (each has
        its reply), 20 ms after the last one got it."""
        self.hold.set()
        for e in self.held:
            assert e.wait(20)
        time.sleep(0.02)

    def resume(self):
        self.hold.clear()

    def stop(self):
        self.go = False
        for t in self.threads:
            t.join(20)
        for s in self.socks:
            s.close()
        return sum(self.replies)

    def stop_all_right(self, more_than):
        """stop(), asserting that every reply was right and that there were
        more than `more_than` of them; their number."""
        replies = self.stop()
        assert self.wrong == [], self.wrong[:3]
        assert replies > more_than, replies
        return replies


def ask(srv, line):
    """One request on a new connection: its reply line."""
    with srv.connect() as s:
        s.sendall(line.encode() + b"\n")
        return s.makefile("rb").readline().decode()


def shadow(srv, so, *rules):
    r = molt("update", "--shadow", srv.pid, so, "--timeout", "20", *rules, check=0)
    assert "started" in r.out, r
    sh = status(srv.pid)["shadow"]
    _followers.setdefault(srv.pid, []).append(sh["follower"])
    return sh


def ended(srv):
    return poll(lambda: status(srv.pid)["shadow"], lambda s: s["stage"] == "ended",
                timeout=20, what="the shadow to end")


def test_same_version_no_false_divergence():
    v1, same, _, _ = images()
    srv = Server(v1, "same")
    try:
        fds = srv.settled_fds()
        cl = Clients(srv)
        sh = shadow(srv, same)
        assert sh["stage"] == "shadowing" and sh["follower"] > 0
        follower = sh["follower"]
        # a while under load: the follower replays every call, no divergence
        end = time.time() + 8
        while time.time() < end:
            s = status(srv.pid)["shadow"]
            assert s["stage"] == "shadowing", (s, s["outcome"])
            time.sleep(0.5)
        s = poll(lambda: status(srv.pid)["shadow"],
                 lambda s: s["compared"] > 200 and s["compared"] >= s["recorded"] - 50,
                 timeout=20, what="the follower to keep up")
        assert s["divergences"] == 0 and s["outcome"] is None, s
        cl.stop_all_right(200)
        # the follower is a live process of its own, a child of the leader
        assert open("/proc/%d/stat" % follower).read().split()[3] == str(srv.pid)
        events = [e for e in log(srv.pid) if e["event"] == "shadow"]
        assert len(events) == 1 and "forked" in events[0]["message"], events
        # a second shadow while one runs is refused, nothing changed
        r = molt("update", "--shadow", srv.pid, same, check=1)
        assert "already running" in r.err, r
        assert ask(srv, "PING") == "PONG\n"
        # molt rollback ends the follower; the leader never switched
        r = molt("rollback", srv.pid, check=0)
        assert "follower %d" % follower in r.out, r
        sh = status(srv.pid)["shadow"]
        assert sh["stage"] == "ended" and "dropped by molt rollback" in sh["outcome"], sh
        assert not os.path.exists("/proc/%d" % follower)
        assert status(srv.pid)["image"]["full_updates"] == 0
        assert ask(srv, "PING") == "PONG\n"
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back to baseline %s" % fds)
        # without a follower, rollback is refused as before
        r = molt("rollback", srv.pid, check=1)
        assert "hot patches are not supported" in r.err, r
        srv.assert_clean()
    finally:
        srv.close()


def fd_links(pid):
    """{number: link} of pid's descriptors (those still open when read)."""
    out = {}
    for n in os.listdir("/proc/%d/fd" % pid):
        try:
            out[int(n)] = os.readlink("/proc/%d/fd/%s" % (pid, n))
        except OSError:
            pass
    return out


def tcp_inodes():
    """Socket inodes of TCP connections (to tell them from the shadow's own
    unix channels)."""
    out = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        out.add("socket:[%s]" % line.split()[9])
    return out


def test_connection_accepted_after_fork_reaches_follower():
    """Connections the leader accepts after the fork exist only in the
    leader; each reaches the follower, at the same number, when it replays
    the accept (fds.c), and the follower's copy is closed when it replays
    the leader's close, even after the number was reused."""
    v1, same, _, _ = images()
    srv = Server(v1, "latefd")
    try:
        before = fd_links(srv.pid)
        follower = shadow(srv, same)["follower"]
        cl = Clients(srv, n=2, tag="late")  # accepted by the leader after the fork
        # short connections: numbers closed and reused while the follower lags
        for _ in range(20):
            assert ask(srv, "PING") == "PONG\n"
        time.sleep(1)
        caught_up(srv)
        lead = fd_links(srv.pid)
        tcp = tcp_inodes()
        new = {n: l for n, l in lead.items() if l in tcp and before.get(n) != l}
        assert len(new) >= 2, (before, lead)  # the two clients' connections
        fol = fd_links(follower)
        for n, link in new.items():
            assert fol.get(n) == link, (n, link, fol)
        cl.stop_all_right(10)
        # the leader closed them: so did the follower, once it replayed that
        s = caught_up(srv)
        assert s["stage"] == "shadowing" and s["divergences"] == 0, s
        gone = set(new.values())
        poll(lambda: fd_links(follower),
             lambda f: not gone & set(f.values()),
             timeout=10, what="the follower to close the connections the leader closed")
        # no descriptor of the leader's made after the fork stays in the follower
        srv.assert_clean()
    finally:
        srv.close()


def test_time_and_randomness_from_the_leader():
    """NOW replies with clock_gettime, gettimeofday, time and getrandom:
    values the follower would get differently, so each reply would be a
    divergence if it read them itself; it gets the leader's (calls.c)."""
    v1, same, _, _ = images()
    srv = Server(v1, "now")
    try:
        cl = Clients(srv, n=2)
        shadow(srv, same)
        got = set()
        with srv.connect() as s, s.makefile("rwb") as f:
            for _ in range(100):
                f.write(b"NOW\n")
                f.flush()
                line = f.readline().split()
                assert line[0] == b"NOW" and line[4] == b"8", line
                got.add(line[5])
        assert len(got) == 100  # the random bytes are random in the leader
        s = caught_up(srv)
        assert s["stage"] == "shadowing" and s["divergences"] == 0, s
        assert cl.stop() > 0 and cl.wrong == [], cl.wrong[:3]
        srv.assert_clean()
    finally:
        srv.close()


def test_unfollowed_io_ends_the_follower():
    """MMSG replies with sendmmsg, which the wrappers do not follow: the
    follower's copy of the call would send the reply a second time on the
    shared connection.  The backstop (trap.c, Syscall User Dispatch) traps
    it in the follower, which ends with the call named; the client gets
    the reply once and the leader serves on."""
    v1, same, _, _ = images()
    srv = Server(v1, "mmsg")
    try:
        fds = srv.settled_fds()
        cl = Clients(srv, n=2)
        follower = shadow(srv, same)["follower"]
        # the follower replays calls (its thread's futex, a received
        # descriptor) with the trap armed, and lets memory calls through
        assert ask(srv, "NOW").startswith("NOW ")
        time.sleep(0.5)
        assert status(srv.pid)["shadow"]["stage"] == "shadowing"
        with srv.connect() as s, s.makefile("rwb") as f:
            f.write(b"MMSG\n")
            f.flush()
            assert f.readline() == b"MM\n"
            s.settimeout(0.5)
            # the next reply is PONG: no second MM from the follower
            f.write(b"PING\n")
            f.flush()
            assert f.readline() == b"PONG\n"
        sh = ended(srv)
        assert "molt does not follow: sendmmsg(" in sh["outcome"], sh
        assert "repeat output the leader makes" in sh["outcome"], sh
        assert not os.path.exists("/proc/%d" % follower) or \
            open("/proc/%d/stat" % follower).read().split()[2] == "Z"
        events = [e for e in log(srv.pid) if e["event"] == "shadow"]
        assert any("sendmmsg(" in e["message"] for e in events), events
        assert ask(srv, "PING") == "PONG\n"
        assert cl.stop() > 0 and cl.wrong == [], cl.wrong[:3]
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back to baseline")
        srv.assert_clean()
    finally:
        srv.close()


def test_log_written_inside_libc_needs_a_drop_rule():
    """KVS_LOG: kvs logs each connection with fprintf, whose write libc
    makes itself (no wrapper sees it, in either process).  Without a rule
    the follower's backstop ends it at the first such write, named; with
    `forward write file drop` the follower's writes to files that the
    wrappers do not see are not made and succeed: the shadow goes on, the
    log has each line once (the leader's), and status counts the calls
    the rule decided.  (kvs's main also reads the clock before it skips
    its start-up: the follower's restarting main makes that call itself,
    else every shadow of kvs diverged at its first call.)"""
    v1, same, _, _ = images()
    logf = WORK / "kvs-log.txt"
    rules = WORK / "log.rules"
    rules.write_text("forward write file drop  # the log, written inside libc\n")
    for with_rule in (False, True):
        if logf.exists():
            logf.unlink()
        srv = Server(v1, "log", extra_env={"KVS_LOG": str(logf)})
        try:
            cl = Clients(srv, n=2)
            shadow(srv, same, *(["--rules", str(rules)] if with_rule else []))
            for _ in range(5):
                assert ask(srv, "PING") == "PONG\n"
            if not with_rule:
                sh = ended(srv)
                assert "molt does not follow: write(" in sh["outcome"], sh
                assert "repeat output the leader makes" in sh["outcome"], sh
            else:
                sh = poll(lambda: status(srv.pid)["shadow"],
                          lambda s: s["compared"] >= s["recorded"] and s["rule_decided"] >= 5,
                          timeout=20, what="the follower to replay the 5 connections")
                assert sh["stage"] == "shadowing" and sh["divergences"] == 0, sh
                molt("rollback", srv.pid, check=0)
            lines = logf.read_text().splitlines()
            # the 2 clients' and 5 PINGs' connections, each logged once
            assert len(lines) == 7 and len(set(lines)) == 7, lines
            assert cl.stop() > 0 and cl.wrong == [], cl.wrong[:3]
            srv.assert_clean()
        finally:
            srv.close()


def test_signal_mask_calls_made_by_the_follower():
    """KVS_SIGMASK: each worker blocks every signal around its poll and
    yields meanwhile (sched_yield, which the backstop traps).  sigprocmask
    and pthread_sigmask are wrapped (moltcc): the follower makes them
    itself, untrapped and with SIGSYS kept deliverable -- trapped and let
    through as they were, they blocked SIGSYS, and the next trapped call
    killed the follower (its SIGSYS forced to the default action)."""
    v1, same, _, _ = images()
    srv = Server(v1, "sigmask", extra_env={"KVS_SIGMASK": "1"})
    try:
        cl = Clients(srv, n=2)
        shadow(srv, same)
        time.sleep(2)
        for _ in range(5):
            assert ask(srv, "PING") == "PONG\n"
        sh = poll(lambda: status(srv.pid)["shadow"],
                  lambda s: s["stage"] != "shadowing" or s["compared"] >= s["recorded"],
                  timeout=20, what="the follower to catch up")
        assert sh["stage"] == "shadowing" and sh["divergences"] == 0, sh
        assert cl.stop() > 0 and cl.wrong == [], cl.wrong[:3]
        molt("rollback", srv.pid, check=0)
        srv.assert_clean()
    finally:
        srv.close()


def test_vectored_and_addressed_calls_followed():
    """KVS_IO=vec: requests read with recvmsg, readv and recvfrom in turn,
    replies sent with writev (GET), sendmsg (SET) and sendto (the rest),
    each in two pieces.  A shadow of the same version follows them all
    with 0 divergences under checking clients (before the wrappers, the
    first of them ended the follower through the backstop)."""
    v1, same, _, _ = images()
    srv = Server(v1, "vec", io="vec")
    try:
        fds = srv.settled_fds()
        cl = Clients(srv, n=1, tag="vec")  # one worker left for ask()
        sh = shadow(srv, same)
        follower = sh["follower"]
        late = Clients(srv, n=1, tag="late")  # accepted after the fork
        for _ in range(10):
            assert ask(srv, "PING") == "PONG\n"   # sendto
            assert ask(srv, "WRITEV") == "WV\n"   # writev of the program's own
            assert ask(srv, "NOW").startswith("NOW ")
        time.sleep(2)
        s = caught_up(srv)
        assert s["stage"] == "shadowing" and s["divergences"] == 0, (s, s["outcome"])
        assert s["compared"] > 100, s
        replies = cl.stop() + late.stop()
        assert cl.wrong == [] and late.wrong == [], (cl.wrong[:3], late.wrong[:3])
        assert replies > 50
        s = caught_up(srv)
        assert s["stage"] == "shadowing" and s["divergences"] == 0, (s, s["outcome"])
        assert os.path.exists("/proc/%d" % follower)
        r = molt("rollback", srv.pid, check=0)
        assert "follower %d" % follower in r.out, r
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back to baseline")
        srv.assert_clean()
    finally:
        srv.close()


def test_descriptor_received_ends_the_follower():
    """FDPASS sends a descriptor through a unix socketpair (made before the
    fork) with sendmsg and receives it with recvmsg: the leader gets a new
    descriptor the follower cannot be given, so the follower ends with
    that reason when it replays the recvmsg; the leader answers and serves
    on, its descriptors back to their baseline."""
    v1, same, _, _ = images()
    srv = Server(v1, "fdpass")
    try:
        fds = srv.settled_fds()
        cl = Clients(srv, n=2, tag="fp")
        shadow(srv, same)
        assert ask(srv, "PING") == "PONG\n"
        time.sleep(0.5)
        assert status(srv.pid)["shadow"]["stage"] == "shadowing"
        assert ask(srv, "FDPASS") == "FDPASS ok\n"
        sh = ended(srv)
        assert "recvmsg in the leader received descriptors (SCM_RIGHTS)" in sh["outcome"], sh
        assert ask(srv, "FDPASS") == "FDPASS ok\n"   # the leader, alone again
        assert cl.stop() > 0 and cl.wrong == [], cl.wrong[:3]
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back to baseline")
        srv.assert_clean()
    finally:
        srv.close()


def test_divergence_through_writev_caught():
    """KVS_IO=vec with v2, which answers GET magic differently: the reply,
    gathered from writev's two pieces, differs from the leader's and the
    follower is ended with both sides; the clients see v1's replies.  A
    rule names writev to match it: one naming write does not (the shadow
    runs under it and still catches the reply), one naming writev
    tolerates it."""
    v1, _, diff, _ = images()
    srv = Server(v1, "vecdiff", io="vec")
    as_write = rules_file("vec-write.rules",
                          'forward write "VALUE changed-by-v2\\n" tolerate\n')
    as_writev = rules_file("vec-writev.rules",
                           'forward writev socket "VALUE changed-by-v2\\n" tolerate\n')
    try:
        fds = srv.settled_fds()
        cl = Clients(srv, n=2, tag="vd")
        shadow(srv, diff, "--rules", as_write)
        time.sleep(1)
        assert status(srv.pid)["shadow"]["stage"] == "shadowing"
        with srv.connect() as s:
            s.sendall(b"SET magic 42\nGET magic\n")
            with s.makefile("rb") as f:
                assert f.readline() == b"OK\n"
                assert f.readline() == b"VALUE 42\n"
        sh = ended(srv)
        assert sh["divergences"] == 1, sh
        assert "the leader made writev(" in sh["outcome"], sh
        assert '"VALUE 42\\n"' in sh["outcome"] and "changed-by-v2" in sh["outcome"], sh
        # the rule naming writev: the same reply tolerated
        shadow(srv, diff, "--rules", as_writev)
        for _ in range(3):
            assert ask(srv, "GET magic") == "VALUE 42\n"
        sh = caught_up(srv)
        # (divergences counts the process's sessions: still the one above)
        assert sh["stage"] == "shadowing" and sh["divergences"] == 1, sh["outcome"]
        assert sh["outcome"] is None and sh["rule_decided"] == 3, sh
        molt("rollback", srv.pid, check=0)
        cl.stop_all_right(20)
        assert ask(srv, "GET magic") == "VALUE 42\n"
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back to baseline")
        srv.assert_clean()
    finally:
        srv.close()


def test_divergence_caught_leader_unharmed():
    v1, _, diff, _ = images()
    srv = Server(v1, "diff")
    try:
        fds = srv.settled_fds()
        cl = Clients(srv)
        shadow(srv, diff)
        time.sleep(1)
        sh = status(srv.pid)["shadow"]
        assert sh["stage"] == "shadowing", sh
        # the one request v2 answers differently: the leader answers it as v1
        with srv.connect() as s:
            s.sendall(b"SET magic 42\nGET magic\n")
            with s.makefile("rb") as f:   # the socket closes with its last file
                assert f.readline() == b"OK\n"
                assert f.readline() == b"VALUE 42\n"
        sh = ended(srv)
        assert sh["divergences"] == 1, sh
        assert "divergence in thread" in sh["outcome"], sh
        # both sides, in the status and in the log
        assert '"VALUE 42\\n"' in sh["outcome"] and "changed-by-v2" in sh["outcome"], sh
        msgs = [e["message"] for e in log(srv.pid) if e["event"] == "shadow"]
        assert any("changed-by-v2" in m and "VALUE 42" in m for m in msgs), msgs
        # the leader serves on: the clients saw every reply right, none lost
        time.sleep(1)
        replies = cl.stop()
        assert cl.wrong == [], cl.wrong[:3]
        assert replies > 50  # served throughout (the count depends on the machine)
        assert ask(srv, "GET magic") == "VALUE 42\n"
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back to baseline %s" % fds)
        assert not os.path.exists("/proc/%d" % sh["follower"])
        srv.assert_clean()
    finally:
        srv.close()


def test_follower_crash_leader_serves_on():
    v1, _, _, crash = images()
    srv = Server(v1, "crash")
    try:
        fds = srv.settled_fds()
        cl = Clients(srv)
        shadow(srv, crash)
        time.sleep(0.5)
        assert ask(srv, "GET crash") == "NONE\n"   # the leader runs v1
        sh = ended(srv)
        # a sanitizer's handler reports the fault and exits instead
        want = "crashed (signal 11" if not build_sanitize() else "exited with status"
        assert want in sh["outcome"], sh
        assert sh["divergences"] == 0
        msgs = [e["message"] for e in log(srv.pid) if e["event"] == "shadow"]
        assert any(want in m and "the leader goes on" in m for m in msgs), msgs
        time.sleep(0.5)
        cl.stop_all_right(100)
        assert ask(srv, "PING") == "PONG\n"
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back to baseline %s" % fds)
        # a new shadow can start once the last one ended
        sh = shadow(srv, crash)
        assert sh["stage"] == "shadowing"
    finally:
        srv.close()


def test_full_ring_drops_the_shadow():
    """A follower that falls behind (v3 sleeps on one request): the
    leader's ring for that thread fills, the leader waits at most 1 s for
    room, then drops the shadow; its clients see every reply right.  The
    rings made small (256 KiB, MOLT_SHADOW_RING_BYTES) so that this
    connection fills one in a few seconds."""
    v1 = image("kvs-v1")
    slow = image("kvs-slow", 3, frm=v1)
    srv = Server(v1, "slow", extra_env={"MOLT_SHADOW_RING_BYTES": "256K"})
    try:
        fds = srv.settled_fds()
        shadow(srv, slow)
        with srv.connect() as s, s.makefile("rwb") as f:
            f.write(b"GET slow\n")
            f.flush()
            assert f.readline() == b"NONE\n"
            # the same thread serves this connection on: its ring fills
            n = 0
            while status(srv.pid)["shadow"]["stage"] == "shadowing":
                for _ in range(200):
                    f.write(b"SET s%d x%d\n" % (n % 10, n))
                    f.flush()
                    assert f.readline() == b"OK\n"
                    n += 1
                assert n < 200000, "the shadow was never dropped"
        sh = ended(srv)
        assert "stayed full for 1000 ms" in sh["outcome"], sh
        assert sh["ring_use_pct"] >= 90, sh
        assert sh["divergences"] == 0
        assert ask(srv, "GET s1").startswith("VALUE x")
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back to baseline %s" % fds)
        assert not os.path.exists("/proc/%d" % sh["follower"])
        srv.assert_clean()
    finally:
        srv.close()


def test_transformer_fails_in_follower():
    """The follower's migration faults in a transformer: the follower ends
    with the migration's message, the leader serves on untouched."""
    v1 = image("kvs-v1")
    bad = image("kvs-fail", 4, frm=v1, xf="kvs-fail.xf")
    srv = Server(v1, "fail")
    try:
        fds = srv.settled_fds()
        cl = Clients(srv)
        shadow(srv, bad)
        sh = ended(srv)
        assert "the update failed in the follower" in sh["outcome"], sh
        assert "struct slot" in sh["outcome"] or "fault" in sh["outcome"], sh
        msgs = [e["message"] for e in log(srv.pid) if e["event"] == "shadow"]
        assert any("failed in the follower" in m for m in msgs), msgs
        time.sleep(0.5)
        cl.stop_all_right(50)
        assert status(srv.pid)["image"]["full_updates"] == 0
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back to baseline %s" % fds)
        srv.assert_clean()
    finally:
        srv.close()


def test_refused_before_fork():
    """An image built from another version is refused before the barrier:
    no follower, the leader untouched."""
    v1, same, _, _ = images()
    other = image("kvs-other", frm=same)   # built from `same`, not from v1
    srv = Server(v1, "other")
    try:
        r = molt("update", "--shadow", srv.pid, other, check=1)
        assert "build-id" in r.err, r
        assert status(srv.pid)["shadow"] is None
        assert ask(srv, "PING") == "PONG\n"
        srv.assert_clean()
    finally:
        srv.close()


def test_io_uring_refused_at_the_barrier():
    """A program that holds an io_uring (a kernel object a fork shares, whose
    rings the kernel may read with no system call) is refused at the
    barrier with the reason and the way forward, before the fork: no
    follower, the process serving on unchanged."""
    v1, same, _, _ = images()
    srv = Server(v1, "uring")
    try:
        got = ask(srv, "URING")
        assert re.fullmatch(r"URING \d+\n", got), got  # this kernel has io_uring
        fds = srv.settled_fds()
        r = molt("update", "--shadow", srv.pid, same, check=1)
        assert "the program holds an io_uring (fd %s)" % got.split()[1] in r.err and \
            "use a plain full update (molt update)" in r.err, r
        assert status(srv.pid)["shadow"] is None
        assert ask(srv, "PING") == "PONG\n" and ask(srv, "GET nothing") == "NONE\n"
        assert srv.settled_fds() == fds
    finally:
        srv.close()


def rings_rss_kib(pid):
    """Resident KiB of the shadow's rings in pid: its largest shared
    anonymous mapping (64 rings, MOLT_SHADOW_RING_BYTES each)."""
    best, size, shared_anon = 0, 0, False
    with open("/proc/%d/smaps" % pid) as f:
        for ln in f:
            w = ln.split()
            if "-" in w[0] and len(w) >= 5:
                lo, hi = (int(x, 16) for x in w[0].split("-"))
                size, shared_anon = hi - lo, "/dev/zero" in ln
            elif w[0] == "Rss:" and shared_anon and size >= 64 << 20:
                best = max(best, int(w[1]))
    return best


def minor_faults(pid):
    """The process's minor page faults so far (/proc/PID/stat, field 10)."""
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def test_ring_size_and_memory():
    """MOLT_SHADOW_RING_BYTES: a bad value refuses the shadow with its
    reason (the process unchanged).  The default 64 MiB rings cost what
    they hold: ~7 MB through one thread's ring leaves at most 3 MiB of
    rings resident (the consumer gives back each 1 MiB chunk it passed,
    but the first, which the leader reuses while the follower keeps up:
    few page faults), and nothing once the shadow ended (each thread
    gives its ring back)."""
    v1, same, _, _ = images()
    srv = Server(v1, "ringbad", extra_env={"MOLT_SHADOW_RING_BYTES": "3000"})
    try:
        r = molt("update", "--shadow", srv.pid, same, check=1)
        assert "MOLT_SHADOW_RING_BYTES='3000'" in r.err and "256 K" in r.err, r
        assert status(srv.pid)["shadow"] is None
        assert ask(srv, "PING") == "PONG\n"
        srv.assert_clean()
    finally:
        srv.close()
    srv = Server(v1, "ringmem")
    try:
        # 1 GiB of address space left: the 4 GiB of rings cannot be mapped,
        # the shadow is refused with the way out named, the process unchanged
        with open("/proc/%d/status" % srv.pid) as f:
            vm = [int(ln.split()[1]) for ln in f if ln.startswith("VmSize:")][0] * 1024
        old = resource.prlimit(srv.pid, resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
        try:
            r = molt("update", "--shadow", srv.pid, same, check=1)
        finally:
            resource.prlimit(srv.pid, resource.RLIMIT_AS, old)
        assert "cannot map the shadow's rings" in r.err and "MOLT_SHADOW_RING_BYTES" in r.err, r
        assert status(srv.pid)["shadow"] is None
        assert ask(srv, "PING") == "PONG\n"

        def sets():
            """48,000 SETs on one connection: their minor faults."""
            faults0 = minor_faults(srv.pid)
            with srv.connect() as s, s.makefile("rwb") as f:
                for i in range(0, 48000, 200):
                    f.write(b"".join(b"SET m%d %s\n" % (j % 10, b"v" * 40) for j in range(200)))
                    f.flush()
                    for _ in range(200):
                        assert f.readline() == b"OK\n"
            return minor_faults(srv.pid) - faults0

        # the same load without a shadow: the faults a sanitizer's runtime
        # takes anyway (TSan ~2,600 of them), which the ring's are added to
        alone = sets()
        shadow(srv, same)
        faults = sets() - alone
        sh = caught_up(srv)
        assert sh["stage"] == "shadowing" and sh["divergences"] == 0, sh
        kib = rings_rss_kib(srv.pid)
        assert 0 < kib <= 3 * 1024, "rings resident while shadowing: %d KiB" % kib
        # the ring's first MiB kept warm while the follower keeps up: the
        # ~7 MB went through it, not through ~1,700 fresh pages, each a
        # fault (1,700+ before; 1 MiB is 256 pages)
        # (not under ThreadSanitizer: its runtime takes ~2,600 more faults
        # for the synchronisation objects of the records' atomics)
        assert faults < 900 or build_sanitize() == "thread", \
            "the leader's minor faults during ~7 MB of records, more than " \
            "without a shadow: %d" % faults
        # the largest backlog, not the early wrap's filler (~63 MiB of
        # nothing it skips, which read as 99-101% of the ring)
        assert sh["ring_use_pct"] <= 5, sh
        molt("rollback", srv.pid)
        ended(srv)
        poll(lambda: rings_rss_kib(srv.pid), lambda k: k == 0, timeout=10,
             what="the rings given back")
        assert ask(srv, "GET m7") == "VALUE " + "v" * 40 + "\n"
        srv.assert_clean()
    finally:
        srv.close()


# ---- the rule language (expected divergences) ----------------------------------

RULES_INCR = r"""# v5 adds INCR, which v1 answers ERROR.  Give the follower a command it
# rejects too, so that both versions stay in related states.
forward recv socket "INCR *" rewrite "NOSUCH\n"
# after a promotion v5 leads; v1 cannot follow an INCR (reverse rules are
# parsed and kept for then)
reverse recv socket "INCR *" tolerate
"""


def rules_file(name, text):
    WORK.mkdir(parents=True, exist_ok=True)
    p = WORK / name
    p.write_text(text)
    return p


def caught_up(srv):
    """The shadow once the follower has compared every call the leader had
    recorded when asked (or once it ended)."""
    want = status(srv.pid)["shadow"]["recorded"]
    return poll(lambda: status(srv.pid)["shadow"],
                lambda s: s["stage"] != "shadowing" or s["compared"] >= want,
                timeout=20, what="the follower to catch up")


def incr(srv, n=1):
    """INCR on a connection of its own, one request at a time (each one
    recv in the server): the leader, v1, answers ERROR every time."""
    with srv.connect() as s, s.makefile("rwb") as f:
        for _ in range(n):
            f.write(b"INCR counter\n")
            f.flush()
            assert f.readline() == b"ERROR\n"


def test_new_command_needs_its_rule():
    """v5 accepts a command v1 rejects: without a rule its first use is a
    divergence; with the rule that rewrites the command for the follower
    into one it rejects too, the follower runs on and compares every call."""
    v1 = image("kvs-v1")
    v5 = image("kvs-incr", 5, frm=v1)
    srv = Server(v1, "incr")
    try:
        fds = srv.settled_fds()
        cl = Clients(srv)
        # without a rule
        shadow(srv, v5)
        incr(srv)
        sh = ended(srv)
        assert sh["divergences"] == 1, sh
        assert '"ERROR\\n"' in sh["outcome"] and '"VALUE 1\\n"' in sh["outcome"], sh
        # with its rule
        rules = rules_file("incr.rules", RULES_INCR)
        sh = shadow(srv, v5, "--rules", rules)
        assert sh["stage"] == "shadowing", sh
        follower = sh["follower"]
        for _ in range(4):
            incr(srv, 5)
        assert ask(srv, "GET counter") == "NONE\n"
        s = caught_up(srv)
        assert s["stage"] == "shadowing" and s["follower"] == follower, s
        assert s["compared"] > 100, s
        # the 20 INCRs, each rewritten (the reverse rule is kept, not used)
        assert s["rules"] == 2 and s["rule_decided"] == 20, s
        assert s["divergences"] == 1, s   # the session before, no new one
        msgs = [e["message"] for e in log(srv.pid) if e["event"] == "shadow"]
        assert any("under 2 rules from %s" % rules in m for m in msgs), msgs
        # a new command the rule does not cover still diverges: v5 answers
        # INCR on a line that does not start a recv ("PING\nINCR ...")
        with srv.connect() as c, c.makefile("rwb") as f:
            f.write(b"PING\nINCR counter\n")
            f.flush()
            assert f.readline() == b"PONG\n" and f.readline() == b"ERROR\n"
        sh = ended(srv)
        assert sh["divergences"] == 2 and '"VALUE 1\\n"' in sh["outcome"], sh
        replies = cl.stop()
        assert cl.wrong == [], cl.wrong[:3]
        assert replies > 20  # served throughout (a short window: the count depends on the machine)
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back to baseline %s" % fds)
        srv.assert_clean()
    finally:
        srv.close()


SHADOW_OP = 6   # MOLT__OP_SHADOW (common/protocol.h)


def raw_shadow(pid, image_path, rules, name="hostile.rules"):
    """A shadow request sent by hand (no CLI check of the rules), the image
    attached as the CLI attaches it.  (status, response text)."""
    import struct

    def esc(s):
        return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
    body = ("path\t%s\ntimeout_ms\t20000\nrules_name\t%s\nrules\t%s\n"
            % (image_path, name, esc(rules))).encode()
    hdr = struct.pack("<IHHiI", 0x544c4f4d, 1, SHADOW_OP, 0, len(body))
    fd = os.open(image_path, os.O_RDONLY)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.settimeout(30)
            c.connect("\0molt.%d" % pid)
            socket.send_fds(c, [hdr], [fd])
            c.sendall(body)
            h = b""
            while len(h) < 16:
                h += c.recv(16 - len(h))
            _, _, _, st, n = struct.unpack("<IHHiI", h)
            data = b""
            while len(data) < n:
                data += c.recv(n - len(data))
    finally:
        os.close(fd)
    return st, data.decode(errors="replace")


def test_bad_rules_refused():
    """A bad rule file is refused with file:line:col before anything starts,
    by the CLI and, for a client that skips the CLI, by the process."""
    v1, same, _, _ = images()
    srv = Server(v1, "badrules")
    try:
        fds = srv.settled_fds()
        bad = rules_file("bad.rules",
                         'forward recv socket "INCR *" rewrite "NOSUCH\\n"\n'
                         "\n"
                         "  forward recv sokket tolerate\n")
        r = molt("update", "--shadow", srv.pid, same, "--rules", bad, check=2)
        assert r.err.count("\n") == 1, r
        assert "%s:3:16: unknown descriptor kind or action 'sokket'" % bad in r.err, r
        r = molt("shadow", srv.pid, same, "--rules", rules_file("bad2.rules",
                 'forward send "abc\n'), check=2)
        assert "bad2.rules:1:14: string not closed before the end of the line" in r.err, r
        r = molt("update", "--shadow", srv.pid, same, "--rules", WORK / "missing.rules",
                 check=2)
        assert "missing.rules: No such file" in r.err, r
        r = molt("update", srv.pid, same, "--rules", bad, check=2)
        assert "--rules applies only to a shadowed update" in r.err, r
        assert status(srv.pid)["shadow"] is None
        assert [e for e in log(srv.pid) if e["event"] == "shadow"] == []
        # the process parses the text again: hostile texts are refused there
        for text, want in (
                ("forward recv \x01\xff tolerate", "hostile.rules:1:14: unexpected byte 0x01"),
                ('forward send "' + "a" * 5000 + '" tolerate',
                 "hostile.rules:1:14: string longer than 256 bytes"),
                ("forward close drop\n" * 65, "hostile.rules:65:1: more than 64 rules"),
                ("#" * 9000, "the rules have 9000 bytes; at most 8192")):
            st, resp = raw_shadow(srv.pid, str(same), text)
            assert st != 0 and want in resp, (st, resp)
        assert status(srv.pid)["shadow"] is None
        assert ask(srv, "PING") == "PONG\n"
        msgs = [e["message"] for e in log(srv.pid) if e["event"] == "refuse"]
        assert any("more than 64 rules" in m for m in msgs), msgs
        # no child was forked: the process's only children are none
        kids = open("/proc/%d/task/%d/children" % (srv.pid, srv.pid)).read().split()
        assert kids == [], kids
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back to baseline %s" % fds)
        srv.assert_clean()
    finally:
        srv.close()


RULES_ACTIONS = r"""# kvs-diff (v1 variant 1) words one reply differently: accept it
forward send socket "VALUE changed-by-v2\n" tolerate
# variant 6 sends PONG in two pieces: the first is not made, the second
# is compared as the whole reply
forward send socket "PO" drop
forward send socket "NG\n" rewrite "PONG\n"
# variant 6 answers nothing to QUIET; v1's "ERROR" is taken as its own
forward send socket "ERROR\n" insert
"""


def test_rule_actions_on_a_live_shadow():
    """tolerate, drop, rewrite of a reply and insert, each on the call it
    is for, in a live shadow: no divergence; and the same requests without
    the rules diverge."""
    v1 = image("kvs-v1")
    diff = image("kvs-diff", 1, frm=v1)
    v6 = image("kvs-split", 6, frm=v1)
    rules = rules_file("actions.rules", RULES_ACTIONS)
    srv = Server(v1, "actions")
    try:
        fds = srv.settled_fds()
        cl = Clients(srv)
        # tolerate: the changed reply to GET magic
        shadow(srv, diff, "--rules", rules)
        assert ask(srv, "SET magic 42") == "OK\n"
        for _ in range(3):
            assert ask(srv, "GET magic") == "VALUE 42\n"
        sh = caught_up(srv)
        assert sh["stage"] == "shadowing" and sh["divergences"] == 0, sh["outcome"]
        assert sh["rules"] == 4 and sh["rule_decided"] == 3, sh   # the 3 GET magic
        molt("rollback", srv.pid, check=0)
        # drop + rewrite of a reply, insert
        shadow(srv, v6, "--rules", rules)
        with srv.connect() as s, s.makefile("rwb") as f:
            for _ in range(5):
                for req, want in ((b"PING\n", b"PONG\n"), (b"QUIET\n", b"ERROR\n")):
                    f.write(req)
                    f.flush()
                    assert f.readline() == want
        sh = caught_up(srv)
        assert sh["stage"] == "shadowing" and sh["divergences"] == 0, sh["outcome"]
        # 5 PINGs: a piece dropped, a piece rewritten; 5 QUIETs: a reply inserted
        assert sh["rule_decided"] == 15, sh
        molt("rollback", srv.pid, check=0)
        # without the rules, the same split reply diverges
        shadow(srv, v6)
        assert ask(srv, "PING") == "PONG\n"
        sh = ended(srv)
        assert sh["divergences"] == 1 and '"PO"' in sh["outcome"], sh
        cl.stop_all_right(100)
        poll(srv.fds, lambda f: f == fds, timeout=10, what="descriptors back to baseline %s" % fds)
        srv.assert_clean()
    finally:
        srv.close()


# ---- promote, rollback, commit; a leader that dies ------------------------------

RULES_PROMOTE = r"""# v5 adds INCR.  While v1 leads, the follower (v5) gets a command it
# rejects too, so that both stay in related states.
forward recv socket "INCR *" rewrite "NOSUCH\n"
# While v5 leads (promoted), v1 follows: it answers INCR with ERROR where
# v5 answers VALUE n; that reply is expected.
reverse send socket "ERROR\n" tolerate
"""


def incr_reply(srv):
    """One INCR on a connection of its own: the reply line."""
    return ask(srv, "INCR counter")


def test_promote_rollback_commit_under_load():
    """promote: the new version leads (INCR answered), the old one follows
    under the reverse rules; rollback: the old one leads again (INCR
    refused), the follower ends; a second shadow, promote and commit: the
    process itself runs the new version, same pid.  Under load from
    clients connected before the shadow: 0 wrong or lost replies.  Each
    command in a stage where it does not apply is refused with a clear
    message and changes nothing."""
    v1 = image("kvs-v1")
    v5 = image("kvs-incr", 5, frm=v1)
    rules = rules_file("promote.rules", RULES_PROMOTE)
    srv = Server(v1, "promote")
    try:
        # no shadow: promote and commit are refused, the process unchanged
        r = molt("promote", srv.pid, check=1)
        assert "nothing to promote: no shadowed update is running" in r.err, r
        assert r.err.count("\n") == 1, r
        r = molt("commit", srv.pid, check=1)
        assert "nothing to commit: no shadowed update is running" in r.err, r
        assert status(srv.pid)["shadow"] is None
        cl = Clients(srv)
        sh = shadow(srv, v5, "--rules", rules)
        follower = sh["follower"]
        assert incr_reply(srv) == "ERROR\n"   # v1 leads
        # a plain update while the follower runs: refused, nothing changed
        r = molt("update", srv.pid, v5, check=1)
        assert "a shadowed update is running (follower %d, shadowing)" % follower in r.err, r
        assert "'molt commit'" in r.err and "'molt rollback'" in r.err, r
        assert status(srv.pid)["image"]["full_updates"] == 0
        # promote: v5 leads
        r = molt("promote", srv.pid, "--timeout", "20", check=0)
        assert "the new version (follower %d) leads" % follower in r.out, r
        sh = status(srv.pid)["shadow"]
        assert sh["stage"] == "promoted" and sh["follower"] == follower, sh
        for n in range(1, 6):
            assert incr_reply(srv) == "VALUE %d\n" % n
        r = molt("promote", srv.pid, check=1)
        assert "already promoted" in r.err, r
        r = molt("update", srv.pid, v5, check=1)
        assert "(follower %d, promoted)" % follower in r.err, r
        # the 5 ERRORs v1 sent, tolerated (v5 records a reply after the
        # client has it: polled)
        s = poll(lambda: status(srv.pid)["shadow"], lambda s: s["rule_decided"] >= 5,
                 timeout=20, what="v1 to follow the 5 INCRs")
        assert s["stage"] == "promoted" and s["divergences"] == 0, s
        # rollback: v1 leads again, the follower ends
        r = molt("rollback", srv.pid, "--timeout", "20", check=0)
        assert "the old version leads again" in r.out, r
        sh = status(srv.pid)["shadow"]
        assert sh["stage"] == "ended" and "after the promotion" in sh["outcome"], \
            (sh, [(e["time"], e["event"], e["message"]) for e in log(srv.pid)][-6:])
        assert not os.path.exists("/proc/%d" % follower)
        assert incr_reply(srv) == "ERROR\n"
        r = molt("rollback", srv.pid, check=1)
        assert "hot patches are not supported" in r.err, r
        # a second shadow, promoted, then committed: this process runs v5
        follower = shadow(srv, v5, "--rules", rules)["follower"]
        molt("promote", srv.pid, "--timeout", "20", check=0)
        assert incr_reply(srv) == "VALUE 1\n"
        r = molt("commit", srv.pid, "--timeout", "20", check=0)
        sh = status(srv.pid)["shadow"]
        assert sh["stage"] == "committed" and "updated in place" in sh["outcome"], sh
        assert not os.path.exists("/proc/%d" % follower)
        st = status(srv.pid)
        assert st["image"]["full_updates"] == 1, st["image"]
        # v5 in this very process, its state migrated from v1 (which never
        # counted): the count starts again
        assert incr_reply(srv) == "VALUE 1\n"
        r = molt("commit", srv.pid, check=1)
        assert "nothing to commit" in r.err, r
        time.sleep(0.5)
        cl.stop_all_right(50)
        events = [e["message"] for e in log(srv.pid) if e["event"] == "shadow"]
        assert sum("promoted: the new version" in m for m in events) == 2, events
        assert any("committed: the process runs" in m for m in events), events
        refused = [e["message"] for e in log(srv.pid) if e["event"] == "refuse"]
        assert any(m.startswith("promote refused: already promoted") for m in refused), refused
        srv.assert_clean()
    finally:
        srv.close()


def test_promote_keeps_passed_connections_rollback_waits_for_new_ones():
    """A connection the leader accepted after the fork reached the follower
    (fds.c), so promote goes through while it is open and the new version
    serves it.  One the new version accepts after the promotion is passed
    back to the old version, at the same number (so that a server that
    touches it outside the followed calls, as mosquitto's fcntl, keeps
    following), and closed there when the new version closes it; but it
    is numbered by the new version: while it is open, rollback is refused
    naming it, and nothing changes (both connections still served); once
    it is closed, rollback succeeds and the old version serves the first
    one again."""
    v1, same, _, _ = images()
    srv = Server(v1, "absent")
    try:
        shadow(srv, same)
        follower = status(srv.pid)["shadow"]["follower"]
        with srv.connect() as c1, c1.makefile("rwb") as f1:
            f1.write(b"PING\n")
            f1.flush()
            assert f1.readline() == b"PONG\n"
            r = molt("promote", srv.pid, "--timeout", "20", check=0)
            assert "leads" in r.out, r
            f1.write(b"PING\n")
            f1.flush()
            assert f1.readline() == b"PONG\n"
            before = fd_links(follower)
            with srv.connect() as c2, c2.makefile("rwb") as f2:
                f2.write(b"PING\n")
                f2.flush()
                assert f2.readline() == b"PONG\n"
                # the new version's connection (a TCP socket at a number
                # it did not hold before) reached the original process at
                # that number, once it replayed the accept
                tcp = tcp_inodes()
                fresh = {fd: link for fd, link in fd_links(follower).items()
                         if link in tcp and before.get(fd) != link}
                assert len(fresh) == 1, (fresh, before)
                (num, link), = fresh.items()
                poll(lambda: fd_links(srv.pid).get(num), lambda l: l == link, timeout=20,
                     what="descriptor %d (%s) to reach the original process" % (num, link))
                # 4 s: half of it waits for the connection to close, the
                # rest is the handover's (slow under TSan)
                r = molt("rollback", srv.pid, "--timeout", "4", check=1)
                assert "which the new version opened after the promotion, are still open" \
                    in r.err, r
                assert "nothing changed" in r.err, r
                assert status(srv.pid)["shadow"]["stage"] == "promoted"
                for f in (f1, f2):
                    f.write(b"PING\n")
                    f.flush()
                    assert f.readline() == b"PONG\n"
            # closed by the new version, then by the old one as it replays it
            poll(lambda: fd_links(srv.pid).get(num), lambda l: l != link, timeout=20,
                 what="descriptor %d to be closed in the original process" % num)
            r = molt("rollback", srv.pid, "--timeout", "20", check=0)
            assert "the old version leads again" in r.out, r
            f1.write(b"PING\n")
            f1.flush()
            assert f1.readline() == b"PONG\n"
        assert ask(srv, "PING") == "PONG\n"
        sh = status(srv.pid)["shadow"]
        assert sh["stage"] == "ended" and sh["divergences"] == 0, sh
        srv.assert_clean()
    finally:
        srv.close()


def served_on(srv, cl, what):
    """The clients' replies keep growing (the process serving them now)."""
    base = sum(cl.replies)
    poll(lambda: sum(cl.replies), lambda n: n >= base + 20, timeout=20,
         what="the clients to be served by %s" % what)


def took_over(follower, leader):
    """The follower's own control socket: its shadow record after it took
    over from the dead leader."""
    sh = poll(lambda: molt("status", follower, "--json").rc == 0 and status(follower)["shadow"],
              lambda s: s and s["stage"] == "took-over", timeout=20,
              what="follower %d to take over with a control socket" % follower)
    assert "the leader %d ended" % leader in sh["outcome"], sh
    return sh


KILL_MOMENTS = (0.0, 0.15, 0.4, 0.8, 1.5)   # seconds after the fork


# ---- killing a process inside "the window" (design §17, "The leader dies") ----
_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_SYSCALL, PTRACE_GETREGS, PTRACE_SEIZE, PTRACE_INTERRUPT = 24, 12, 0x4206, 0x4207
PTRACE_O_TRACESYSGOOD = 1
SYS_SENDTO, SYS_RECVFROM = 44, 45
WALL = 0x40000000   # __WALL: threads too


def _ptrace(req, tid, addr=None, data=None):
    r = _libc.ptrace(req, tid, addr, data)
    if r < 0:
        raise OSError(ctypes.get_errno(), "ptrace(%d, %d)" % (req, tid))
    return r


def kill_inside(pid, syscall, timeout=20, want=None, stops=(), then=(), traced=None):
    """SIGKILLs process pid at the moment one of its threads returns from
    `syscall` (sendto or recvfrom: send() and recv()) on one of its TCP
    connections having moved bytes: the kernel made the call, the program
    has not seen its result yet -- the window between a call and its
    record.  Every thread is traced (ptrace syscall stops); at that thread's
    syscall-exit stop the process is killed.  Returns the first matching
    call's result (for send and recv, the bytes it moved).

    want(ret, args, conns): another test of the call at its exit (args: its
    first three arguments; conns: the TCP connections pid held when this
    began).  stops: (reached, go) pairs of threading.Events (this then runs
    in a thread of its own): at the match the thread is kept at its stop,
    `reached` set, the other threads run on (the process serves) until `go`
    is set; then, for each next pair, the thread runs on to the exit of its
    next system call numbered then[i] and is kept there likewise; after
    the last `go`, the kill.  traced (an Event): set once every thread is
    traced."""
    ours = _is_our_child(pid)
    tcp = tcp_inodes()
    conns = {fd for fd, link in fd_links(pid).items() if link in tcp}
    if want is None:
        want = lambda ret, args, conns: ret > 0 and args[0] in conns
    tids = [int(t) for t in os.listdir("/proc/%d/task" % pid)]
    for t in tids:
        _ptrace(PTRACE_SEIZE, t, None, PTRACE_O_TRACESYSGOOD)
        _ptrace(PTRACE_INTERRUPT, t)
    regs = (ctypes.c_ulonglong * 27)()
    end = time.time() + timeout
    first = None     # the first match's result
    kept = None      # the thread kept at a stop
    stage = 0        # stops[stage] is the one reached or awaited
    try:
        for t in tids:
            os.waitpid(t, WALL)
            _ptrace(PTRACE_SYSCALL, t)
        if traced is not None:
            traced.set()
        while time.time() < end:
            if kept is not None and stops[stage][1].is_set():
                stage += 1
                if stage == len(stops):
                    os.kill(pid, 9)
                    return first
                _ptrace(PTRACE_SYSCALL, kept)   # on to its next stage
                kept = (kept,)                  # (the thread, not kept now)
            # WNOHANG while a thread is kept: `go` is looked at between stops
            t, st = os.waitpid(-1, WALL | (os.WNOHANG if isinstance(kept, int) else 0))
            if t == 0:
                time.sleep(0.001)
                continue
            if t not in tids or not os.WIFSTOPPED(st):
                continue
            sig = os.WSTOPSIG(st)
            if sig != (signal.SIGTRAP | 0x80):
                # a signal for the program (passed on) or an event stop
                _ptrace(PTRACE_SYSCALL, t, None, sig if st >> 16 == 0 else 0)
                continue
            _ptrace(PTRACE_GETREGS, t, None, ctypes.addressof(regs))
            nr, ret = regs[15], ctypes.c_longlong(regs[10]).value
            args = (regs[14], regs[13], regs[12])   # rdi, rsi, rdx
            # a syscall-exit stop: the result is in rax (-ENOSYS at entry)
            exit_stop = ret != -38
            if kept is None and nr == syscall and exit_stop and want(ret, args, conns):
                if not stops:
                    os.kill(pid, 9)
                    return ret
                first, kept = ret, t
                stops[0][0].set()
                continue
            if isinstance(kept, tuple) and t == kept[0] and exit_stop and \
                    nr == then[stage - 1]:
                kept = t
                stops[stage][0].set()
                continue
            _ptrace(PTRACE_SYSCALL, t)
        raise AssertionError("no %d call on a connection within %d s" % (syscall, timeout))
    finally:
        os.kill(pid, 9)
        # Dead tracees wait for their tracer: each thread is reaped here,
        # the process itself by its parent (this test for the leader, the
        # leader's monitor for the follower, once released here).
        for t in sorted(tids, key=lambda t: t == pid):   # the group leader last
            if t != pid or not ours:
                try:
                    os.waitpid(t, WALL)
                except ChildProcessError:
                    pass


def _is_our_child(pid):
    return int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1]) == os.getpid()


def test_leader_killed_follower_takes_over():
    """The leader SIGKILLed at a spread of moments while its follower
    replays under load (one kill right after the fork, while the follower
    may still migrate; the last one after a promotion, while the follower
    leads): the follower replays what the leader did, then serves the same
    connections (they were inherited at the fork) and new ones.  Every
    client request is answered, every reply right, with the clients going
    on through each kill (no pause): a read or write the leader was inside
    of is completed by the follower (design §17, "The leader dies";
    test_leader_killed_inside_a_read_or_write aims at that window, and
    bench/shadowupd/leader_kills.py kills 40 times)."""
    v1, same, _, _ = images()
    for i, delay in enumerate(KILL_MOMENTS + ("promoted",)):
        srv = Server(v1, "kill%d" % i)
        try:
            cl = Clients(srv, tag="k%d-" % i)
            follower = shadow(srv, same)["follower"]
            if delay == "promoted":
                molt("promote", srv.pid, "--timeout", "20", check=0)
                served_on(srv, cl, "the promoted follower")
            else:
                time.sleep(delay)
            os.kill(srv.pid, 9)
            srv.p.p.wait()
            served_on(srv, cl, "follower %d after the leader's death" % follower)
            took_over(follower, srv.pid)
            # new connections too: the listening socket is shared
            assert ask(srv, "SET after %d" % i) == "OK\n"
            assert ask(srv, "GET after") == "VALUE %d\n" % i
            replies = cl.stop()
            assert cl.wrong == [], (delay, cl.wrong[:3])
            assert replies > 40, (delay, replies)
            assert open("/proc/%d/stat" % follower).read().split()[2] != "Z"
        finally:
            srv.close()
        srv.assert_clean()


def intents_of(outcome):
    """The calls the dead side was inside of, as the survivor's outcome
    counts them: (completed, moved nothing, could not be told)."""
    m = re.search(r"died inside of: (\d+) completed .*?, (\d+) had moved nothing, "
                  r"(\d+) could not be told", outcome)
    return tuple(int(g) for g in m.groups()) if m else (0, 0, 0)


def test_leader_killed_inside_a_read_or_write():
    """The side that leads SIGKILLed at the worst moment: one of its
    threads has just returned from recv() or send() on a client's
    connection -- the kernel consumed the request's bytes or sent the
    reply -- and the record of that call is not published (ptrace stops
    the thread at the system call's exit; the kill lands there).  The
    survivor completes the call from the kernel's TCP byte totals: the
    request read by the dead process is served (not lost), the reply it
    sent is not sent again (not doubled).  The clients run on throughout
    and check every reply.  Both directions of the lead: the original
    process dying (the follower takes over) and, after a promotion, the
    new version dying (the original leads again)."""
    v1, same, _, _ = images()
    for i, (who, call) in enumerate((("leader", SYS_RECVFROM), ("leader", SYS_SENDTO),
                                     ("promoted", SYS_RECVFROM), ("promoted", SYS_SENDTO))):
        srv = Server(v1, "window%d" % i)
        try:
            cl = Clients(srv, tag="w%d-" % i)
            follower = shadow(srv, same)["follower"]
            if who == "promoted":
                molt("promote", srv.pid, "--timeout", "20", check=0)
                served_on(srv, cl, "the promoted follower")
                victim = follower
            else:
                served_on(srv, cl, "the leader while shadowing")
                victim = srv.pid
            moved = kill_inside(victim, call)
            if who == "leader":
                srv.p.p.wait()
                sh = took_over(follower, srv.pid)
                survivor = follower
            else:
                sh = ended(srv)
                survivor = srv.pid
            served_on(srv, cl, "the survivor")
            time.sleep(0.5)   # a request lost would time out, a reply doubled mismatch
            replies = cl.stop()
            assert cl.wrong == [], (who, call, moved, cl.wrong[:3])
            assert replies > 40, (who, call, replies)
            # the survivor says it completed the call (of `moved` bytes)
            sh = status(survivor)["shadow"]
            completed, nothing, unknown = intents_of(sh["outcome"])
            assert completed >= 1 and unknown == 0, (who, call, moved, sh["outcome"])
            assert ask(srv, "PING") == "PONG\n"
        finally:
            srv.close()
        srv.assert_clean()


def test_new_version_killed_while_it_leads():
    """After a promotion the new version (the follower) is SIGKILLed: the
    old version replays the calls the new one made and leads again, its
    backstop off; the clients see every reply right."""
    v1, same, _, _ = images()
    srv = Server(v1, "newdies")
    try:
        cl = Clients(srv)
        follower = shadow(srv, same)["follower"]
        molt("promote", srv.pid, "--timeout", "20", check=0)
        served_on(srv, cl, "the promoted follower")
        os.kill(follower, 9)   # amid requests, as in test_leader_killed_follower_takes_over
        sh = ended(srv)
        assert "crashed (signal 9" in sh["outcome"], sh
        msgs = [e["message"] for e in log(srv.pid) if e["event"] == "shadow"]
        assert any("the old version replays its calls and leads again" in m for m in msgs), msgs
        served_on(srv, cl, "the old version again")
        assert ask(srv, "PING") == "PONG\n"
        # it followed under the backstop, which each of its threads turned
        # off as it went on alone: an unfollowed sendmmsg is made, once
        poll(lambda: sud_armed(srv.pid), lambda a: a is not None and not any(a.values()),
             timeout=20, what="the old version's threads disarmed")
        with srv.connect() as c, c.makefile("rwb") as f:
            for req, want in ((b"MMSG\n", b"MM\n"), (b"PING\n", b"PONG\n")):
                f.write(req)
                f.flush()
                assert f.readline() == want
        replies = cl.stop()
        assert cl.wrong == [], cl.wrong[:3]
        assert status(srv.pid)["image"]["full_updates"] == 0
        # a new shadow can start
        assert shadow(srv, same)["stage"] == "shadowing"
        srv.assert_clean()
    finally:
        srv.close()


# ---- after molt promote: the old version follows under the backstop too ----------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long
PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4206, 0x4207
PTRACE_GET_SYSCALL_USER_DISPATCH_CONFIG = 0x4211   # Linux 6.4+
WALL = 0x40000000


class SudConfig(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_uint64), ("selector", ctypes.c_uint64),
                ("offset", ctypes.c_uint64), ("len", ctypes.c_uint64)]


def sud_armed(pid):
    """{tid: whether Syscall User Dispatch is on} for each thread of pid, as
    the kernel says (each thread stopped a moment with PTRACE_INTERRUPT);
    None when the kernel cannot tell (before 6.4)."""
    out = {}
    for t in sorted(os.listdir("/proc/%d/task" % pid)):
        tid = int(t)
        if _libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
            continue   # it ended meanwhile
        try:
            if _libc.ptrace(PTRACE_INTERRUPT, tid, None, None) != 0:
                continue
            _, st = os.waitpid(tid, WALL)
            if not os.WIFSTOPPED(st):
                continue   # it ended meanwhile (a connection's thread)
            cfg = SudConfig()
            if _libc.ptrace(PTRACE_GET_SYSCALL_USER_DISPATCH_CONFIG, tid,
                            ctypes.c_void_p(ctypes.sizeof(cfg)), ctypes.byref(cfg)) != 0:
                if ctypes.get_errno() in (errno.EIO, errno.EINVAL):
                    return None   # a kernel without the request
                continue   # ESRCH: it is ending
            out[tid] = cfg.mode == 1
        finally:
            _libc.ptrace(PTRACE_DETACH, tid, None, None)
    return out


def test_promoted_old_version_ends_at_an_unfollowed_call():
    """After molt promote the new version leads and the old one follows --
    under the backstop too (each of its threads arms it at its switch):
    MMSG, answered with sendmmsg (not followed), is sent once, by the new
    version; the old version's copy is trapped before it runs and the old
    version stops following, the call named in status; the new version
    serves on alone, every reply right, and rollback is refused.  (Before,
    the old version followed with the wrappers alone: its sendmmsg ran,
    the client got MM twice.)"""
    v1, same, _, _ = images()
    srv = Server(v1, "promote-mmsg")
    try:
        cl = Clients(srv, n=2)
        shadow(srv, same)
        molt("promote", srv.pid, "--timeout", "20", check=0)
        assert status(srv.pid)["shadow"]["stage"] == "promoted"
        with srv.connect() as s, s.makefile("rwb") as f:
            f.write(b"MMSG\n")
            f.flush()
            assert f.readline() == b"MM\n"
            f.write(b"PING\n")
            f.flush()
            assert f.readline() == b"PONG\n"
            # nothing more: no second MM from the old version
            s.settimeout(1.0)
            try:
                extra = s.recv(100)
            except socket.timeout:
                extra = None
            assert extra is None, extra
        sh = poll(lambda: status(srv.pid)["shadow"],
                  lambda s: "stopped following" in (s["outcome"] or ""), timeout=20,
                  what="the old version to stop following")
        assert sh["stage"] == "promoted", sh
        assert "the old version's thread" in sh["outcome"] and \
            "molt does not follow: sendmmsg(" in sh["outcome"] and \
            "repeat output the leader makes" in sh["outcome"] and \
            "the new version serves alone" in sh["outcome"], sh
        served_on(srv, cl, "the new version alone")
        assert ask(srv, "PING") == "PONG\n"
        r = molt("rollback", srv.pid, check=1)
        assert "stopped following the new one and cannot lead again" in r.err and \
            "sendmmsg(" in r.err, r
        assert cl.stop() > 0 and cl.wrong == [], cl.wrong[:3]
        srv.assert_clean()
    finally:
        srv.close()


def test_promoted_old_version_log_needs_a_reverse_drop_rule():
    """KVS_LOG after molt promote: the new version leads and logs each
    connection (libc's write, unseen), and the old version's libc makes the
    same write.  Its backstop traps it: without a reverse rule the old
    version stops following at the first one, named; with `reverse write
    file drop` it is not made and the old version follows on.  Either way
    the log has each line once.  After rollback the old version leads and
    its writes are real again (the backstop off): each new line once.
    (Before, the old version wrote every line a second time.)"""
    v1, same, _, _ = images()
    logf = WORK / "kvs-promote-log.txt"
    for reverse in (False, True):
        rules = rules_file("promote-log-%d.rules" % reverse,
                           "forward write file drop\n" +
                           ("reverse write file drop  # the old version's log\n"
                            if reverse else ""))
        if logf.exists():
            logf.unlink()
        srv = Server(v1, "promote-log", extra_env={"KVS_LOG": str(logf)})
        try:
            cl = Clients(srv, n=2)
            shadow(srv, same, "--rules", rules)
            molt("promote", srv.pid, "--timeout", "20", check=0)
            base = status(srv.pid)["shadow"]["rule_decided"]
            for _ in range(5):
                assert ask(srv, "PING") == "PONG\n"
            if not reverse:
                sh = poll(lambda: status(srv.pid)["shadow"],
                          lambda s: "stopped following" in (s["outcome"] or ""), timeout=20,
                          what="the old version to stop following")
                assert "molt does not follow: write(" in sh["outcome"] and \
                    "reverse `drop` rule" in sh["outcome"], sh
                # the old version's threads stopped: nothing more of theirs
                time.sleep(0.5)
            else:
                sh = poll(lambda: status(srv.pid)["shadow"],
                          lambda s: s["compared"] >= s["recorded"] and
                          s["rule_decided"] >= base + 5,
                          timeout=20, what="the old version to follow the 5 connections")
                assert sh["stage"] == "promoted" and sh["divergences"] == 0 and \
                    "stopped following" not in (sh["outcome"] or ""), sh
            lines = logf.read_text().splitlines()
            # the 2 clients' and 5 PINGs' connections, each logged once
            assert len(lines) == 7 and len(set(lines)) == 7, lines
            if reverse:
                r = molt("rollback", srv.pid, "--timeout", "20", check=0)
                assert "the old version leads again" in r.out, r
                for _ in range(2):
                    assert ask(srv, "PING") == "PONG\n"
                lines = logf.read_text().splitlines()
                assert len(lines) == 9 and len(set(lines)) == 9, lines
            assert cl.stop() > 0 and cl.wrong == [], cl.wrong[:3]
            srv.assert_clean()
        finally:
            srv.close()


def test_promote_rollback_arms_and_disarms_the_old_versions_backstop():
    """Promote then rollback, twice, under load, the workers blocking every
    signal around their poll (KVS_SIGMASK: sched_yield, trapped and let
    through meanwhile): while promoted every program thread of the old
    version has Syscall User Dispatch on (the kernel says so: ptrace), and
    none once the lead came back; then the old version makes its calls
    for real, an unfollowed sendmmsg among them (MMSG answered once), and
    leads with every reply right."""
    v1 = image("kvs-v1")
    v5 = image("kvs-incr", 5, frm=v1)
    rules = rules_file("promote.rules", RULES_PROMOTE)
    srv = Server(v1, "promote-sud", extra_env={"KVS_SIGMASK": "1"})
    try:
        cl = Clients(srv)
        before = sud_armed(srv.pid)
        assert before is not None and not any(before.values()), before
        for n in range(2):
            shadow(srv, v5, "--rules", rules)
            r = molt("promote", srv.pid, "--timeout", "20", check=0)
            assert "leads" in r.out, r
            assert incr_reply(srv) == "VALUE 1\n"
            s = poll(lambda: status(srv.pid)["shadow"], lambda s: s["rule_decided"] >= 1,
                     timeout=20, what="v1 to follow the INCR")
            assert s["stage"] == "promoted" and s["divergences"] == 0, s
            # the main thread and the 3 workers (each armed at its switch,
            # its next followed call: each calls poll every 50 ms)
            armed = poll(lambda: sud_armed(srv.pid), lambda a: sum(a.values()) >= 4,
                         timeout=20, what="the old version's 4 program threads armed")
            assert sum(armed.values()) == 4, armed
            served_on(srv, cl, "the new version")
            r = molt("rollback", srv.pid, "--timeout", "20", check=0)
            assert "the old version leads again" in r.out, r
            sh = status(srv.pid)["shadow"]
            assert sh["stage"] == "ended" and sh["divergences"] == 0 and \
                "after the promotion" in sh["outcome"], sh
            # every thread took the lead back at a followed call: disarmed
            after = sud_armed(srv.pid)
            assert not any(after.values()), (n, after)
            assert incr_reply(srv) == "ERROR\n"
            with srv.connect() as c, c.makefile("rwb") as f:
                for req, want in ((b"MMSG\n", b"MM\n"), (b"PING\n", b"PONG\n")):
                    f.write(req)
                    f.flush()
                    assert f.readline() == want
            served_on(srv, cl, "the old version again")
        cl.stop_all_right(50)
        srv.assert_clean()
    finally:
        srv.close()
