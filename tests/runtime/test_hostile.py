"""Another local user against a molt process's control channel
(docs/security.md), driven through the real CLI against fdhost
(tests/runtime/fdhost.c, `serve none`): the other user is a forked child
of the test that drops to uid/gid 65534 (nobody) with setresuid, since CI
runs as root.

  - 100 connections of the other uid, each holding half a request header,
    do not keep the owner's `molt status` from answering;
  - 100,000 refused connections leave the apply history in `molt log`,
    add at most two `denied` entries, and grow $MOLT_LOG_FILE by less than
    LOG_GROWTH_BOUND bytes;
  - a name squatted before the process starts: the process listens on a
    fallback name, and `molt status` / `molt apply` find it.

Environment (set by tests/runtime/tests.cmake):
  FDHOST     the host program
  PATCH_DIR  its patches fdhost_a.so (tag 1) and fdhost_b.so (tag 2)
"""
import os
import socket
import struct
import time

from harness import proc

FDHOST = os.environ["FDHOST"]
PATCHES = os.environ["PATCH_DIR"]
NOBODY = 65534
# Generous: the point is that it answers at all (with the control channel
# held by the other user's connections it would not answer in minutes).
BOUND_S = 5.0
# The refusals of one uid are logged once and then summed up at most once a
# minute: a flood of a few seconds adds at most two lines (~300 bytes each).
LOG_GROWTH_BOUND = 4096
MAGIC = 0x544C4F4D


def header(op=1, length=0):
    return struct.pack("<IHHiI", MAGIC, 1, op, 0, length)


def address(name):
    return b"\0" + name.encode()


class Host(proc.Program):
    """fdhost serve none, optionally started only when go() is called (to
    know its pid before it runs)."""

    def __init__(self, log_file=None, wait=False):
        env = dict(os.environ)
        if log_file:
            env["MOLT_LOG_FILE"] = log_file
        argv = [FDHOST, "serve", "none", PATCHES]
        if wait:
            argv = ["sh", "-c", 'read go; exec "$0" "$@"'] + argv
        proc.Program.__init__(self, argv, env=env, name="fdhost")
        if not wait:
            self.ready()

    def go(self):
        self.send("go")
        self.ready()

    def ready(self):
        line = self.line(10.0)
        assert line.startswith("ready %d" % self.pid), (line, self.describe())

    def close(self):
        self.send("quit")
        self.finish(rc=0)


def as_nobody(work):
    """Runs work(ready) in a child as uid 65534; ready() tells the parent it
    has done its part.  Returns (pid, fd to read ready from, fd whose close
    ends the child)."""
    r_ready, w_ready = os.pipe()
    r_hold, w_hold = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r_ready)
            os.close(w_hold)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            work(lambda msg="ready": os.write(w_ready, (msg + "\n").encode()))
            os.read(r_hold, 1)  # held until the parent closes w_hold
        except BaseException as e:  # the parent sees the message
            os.write(w_ready, ("error %r\n" % e).encode())
            code = 1
        os._exit(code)
    os.close(w_ready)
    os.close(r_hold)
    return pid, r_ready, w_hold


def read_line(fd, timeout):
    end = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        import select
        left = end - time.monotonic()
        assert left > 0, "no word from the other user's process: %r" % data
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 256)
            assert chunk, "the other user's process ended: %r" % data
            data += chunk
    return data.decode().strip()


def end_child(pid, r_ready, w_hold):
    os.close(w_hold)
    os.close(r_ready)
    _, st = os.waitpid(pid, 0)
    return st


def denied_count(st):
    return sum(r["count"] for r in st["refused_connections"] if r["uid"] == str(NOBODY))


def test_slow_connections_of_another_uid_do_not_hold_the_channel():
    with Host() as h:
        def hold_half_frames(ready):
            socks = []
            for _ in range(100):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                # connect() waits while the listener's queue is full (a
                # server that held each connection would keep it full):
                # SO_SNDTIMEO bounds that wait.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                             struct.pack("ll", 2, 0))
                try:
                    s.connect(address("molt.%d" % h.pid))
                    s.send(header()[:8])  # half a header, then nothing
                except OSError:
                    pass
                socks.append(s)
            ready()
        child = as_nobody(hold_half_frames)
        try:
            assert read_line(child[1], 120.0) == "ready"
            t0 = time.monotonic()
            st = proc.status(h.pid, timeout=BOUND_S)
            took = time.monotonic() - t0
            assert st["pid"] == h.pid and st["state"] == "ok", st
            assert took < BOUND_S, took
            # Every one of them was refused at accept (and counted).
            assert denied_count(st) == 100, st["refused_connections"]
            # The owner's changes get through too.
            assert "applied patch" in proc.molt("apply", h.pid,
                                                os.path.join(PATCHES, "fdhost_a.so"),
                                                check=0, timeout=BOUND_S).out
        finally:
            end_child(*child)
        h.close()


def test_refused_flood_keeps_the_history_and_bounds_the_log(tmp_path):
    log_file = str(tmp_path / "molt.log")
    with Host(log_file=log_file) as h:
        proc.molt("apply", h.pid, os.path.join(PATCHES, "fdhost_a.so"), check=0,
                  timeout=BOUND_S)
        before = os.path.getsize(log_file)
        n = 100000

        def flood(ready):
            for _ in range(n):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(address("molt.%d" % h.pid))
                    s.send(header(op=4))  # a whole `log` request
                except OSError:
                    pass
                s.close()
            ready()
        child = as_nobody(flood)
        try:
            assert read_line(child[1], 600.0) == "ready"
        finally:
            end_child(*child)
        entries = proc.log(h.pid, timeout=BOUND_S)
        # The apply's history is still there.
        assert any(e["event"] == "load" and e["patch"] == "patch-a" for e in entries), entries
        assert any(e["event"] == "switch" for e in entries), entries
        grown = os.path.getsize(log_file) - before
        assert grown < LOG_GROWTH_BOUND, grown
        denied = [e for e in entries if e["event"] == "denied"]
        assert 1 <= len(denied) <= 2, denied
        assert "uid %d" % NOBODY in denied[0]["message"], denied
        st = proc.status(h.pid, timeout=BOUND_S)
        assert denied_count(st) == n, st["refused_connections"]
        h.close()


def test_squatted_name_is_recovered():
    with Host(wait=True) as h:
        def squat(ready):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(address("molt.%d" % h.pid))
            s.listen(4)
            squat.sock = s
            ready()
        child = as_nobody(squat)
        try:
            assert read_line(child[1], 10.0) == "ready"
            h.go()  # starts with its name taken
            st = proc.status(h.pid, timeout=BOUND_S)
            assert st["pid"] == h.pid and st["state"] == "ok", st
            infos = [e["message"] for e in proc.log(h.pid, timeout=BOUND_S)
                     if e["event"] == "info"]
            assert any("another socket holds the name @molt.%d" % h.pid in m for m in infos), infos
            assert "applied patch" in proc.molt("apply", h.pid,
                                                os.path.join(PATCHES, "fdhost_a.so"),
                                                check=0, timeout=BOUND_S).out
            assert h.ask_tag() == 1
        finally:
            end_child(*child)
        # The squatter is gone: still reachable (on the fallback name).
        st = proc.status(h.pid, timeout=BOUND_S)
        assert st["pid"] == h.pid, st
        proc.molt("rollback", h.pid, check=0, timeout=BOUND_S)
        assert h.ask_tag() == 0
        h.close()


def _ask_tag(self):
    self.send("tag")
    return int(self.line(10.0).split()[1])


Host.ask_tag = _ask_tag
