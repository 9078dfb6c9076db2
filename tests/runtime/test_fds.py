"""Hosts that close molt's descriptors (tests/runtime/fdhost.c), driven
through the real CLI: after the host has closed every descriptor >= 3 (as
dnsmasq does) or only the control socket or the log file, and opened its own
sockets, pipes and files on the freed numbers, `molt status` and `molt
apply` work again at once, the log tells what was recovered, and none of the
host's files ever saw a byte from the runtime.

Environment (set by tests/runtime/tests.cmake; the CLI is the build tree's,
harness.tree):
  FDHOST     the host program
  PATCH_DIR  its patches fdhost_a.so (tag 1) and fdhost_b.so (tag 2)
"""
import os

import pytest

from harness import proc

FDHOST = os.environ["FDHOST"]
PATCHES = os.environ["PATCH_DIR"]

# The runtime notices a bulk close at once (its wake-up write end trips);
# this bound is generous, and far below the CLI's own 15 s wait.
BOUND_S = 3.0


def patch(name):
    return os.path.join(PATCHES, name)


class Host(proc.Program):
    """fdhost serve HOW, driven by commands on its stdin."""

    def __init__(self, how, log_file=None):
        env = dict(os.environ)
        if log_file:
            env["MOLT_LOG_FILE"] = log_file
        proc.Program.__init__(self, [FDHOST, "serve", how, PATCHES], env=env)
        line = self.line(10.0)
        assert line.startswith("ready "), (line, self.describe())
        words = line.split()
        self.traps = [int(w) for w in words[2:]]

    def ask(self, cmd, timeout=10.0):
        self.send(cmd)
        return self.line(timeout)

    def tag(self):
        return int(self.ask("tag").split()[1])

    def close(self):
        self.send("quit")
        self.finish(rc=0)


def molt(*args):
    """Runs the CLI; it must succeed and answer within BOUND_S seconds."""
    return proc.molt(*args, check=0, timeout=BOUND_S)


def infos(pid):
    return [e["message"] for e in proc.log(pid, timeout=BOUND_S) if e["event"] == "info"]


def works_again(h):
    """status, apply, rollback by the CLI; apply by the program itself."""
    st = proc.status(h.pid, timeout=BOUND_S)
    assert st["pid"] == h.pid and st["state"] == "ok", st
    assert "applied patch patch-a" in molt("apply", h.pid, patch("fdhost_a.so")).out
    assert h.tag() == 1
    # An application thread hands its request to the runtime thread (wake-up).
    assert h.ask("apply fdhost_b.so").startswith("apply 0"), h.describe()
    assert h.tag() == 2
    molt("rollback", h.pid)
    assert h.tag() == 1


@pytest.mark.parametrize("how", ["loop", "close_range", "closefrom"])
def test_every_descriptor_closed(tmp_path, how):
    log_file = str(tmp_path / "molt.log")
    h = Host(how, log_file)
    try:
        # The host took the numbers of the runtime's listener, wake-up pair and
        # log file, and a few small ones.
        assert len(h.traps) >= 6 + 4, h.traps
        works_again(h)
        msgs = infos(h.pid)
        assert any("wake-up descriptors" in m and "made new ones" in m for m in msgs), msgs
        assert any("control socket" in m and "listening on @molt.%d again" % h.pid in m
                   for m in msgs), msgs
        assert any("log file descriptor" in m and "reopened " + log_file in m
                   for m in msgs), msgs
        # One entry per loss, none per later use.  (How many losses depends on
        # timing: taking the old numbers may hit descriptors the runtime had
        # just made anew on them.)
        assert len(msgs) == len(set(msgs)), msgs
        works_again(h)
        assert infos(h.pid) == msgs
        text = open(log_file).read()
        assert "reopened" in text and "applied" in text and " rollback " in text, text
        # A child of the host starts its own runtime; the fork handler closes
        # only what is still molt's.
        assert h.ask("fork") == "fork ok", h.describe()
        assert h.ask("check") == "traps ok"
    finally:
        h.close()


def test_control_socket_alone(tmp_path):
    """Only the listener closed and its number taken by a listening socket of
    the host: the runtime's poll still holds the old socket, so its name is
    still bound.  The first client's connection reaches that old socket; the
    runtime does not accept it (the number is the host's), listens again under
    the same name, and the CLI, whose request was never read, tries again."""
    h = Host("listener")
    try:
        assert len(h.traps) == 1
        # Before the runtime has noticed: a child's fork handler must not close
        # the number the parent's runtime still thinks is its own.
        assert h.ask("fork") == "fork ok", h.describe()
        works_again(h)
        msgs = infos(h.pid)
        assert any("control socket (fd %d)" % h.traps[0] in m and "again" in m
                   for m in msgs), msgs
        assert h.ask("check") == "traps ok"
    finally:
        h.close()


def test_log_file_alone(tmp_path):
    """Only the log file's descriptor closed and its number reused by a stream
    socket of the host: the next entry reopens the file, no line lands in the
    socket."""
    log_file = str(tmp_path / "molt.log")
    h = Host("log", log_file)
    try:
        assert h.ask("apply fdhost_a.so").startswith("apply 0"), h.describe()
        assert h.tag() == 1
        assert h.ask("check") == "traps ok"
        text = open(log_file).read()
        assert "log file descriptor (fd %d): reopened %s" % (h.traps[0], log_file) in text
        assert "applied" in text.split("reopened", 1)[1], text
        # (Two losses if the runtime logged between the host's close and its
        # taking the number: the file was reopened on that very number first.)
        msgs = infos(h.pid)
        assert msgs and all("log file descriptor" in m and "reopened" in m
                            for m in msgs) and len(set(msgs)) == len(msgs), msgs
    finally:
        h.close()


def test_nothing_closed_nothing_logged():
    """The checks cost nothing visible when the host leaves molt alone."""
    h = Host("none")
    try:
        works_again(h)
        assert infos(h.pid) == []
    finally:
        h.close()
