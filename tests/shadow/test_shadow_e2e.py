"""A field added to a structure, carried as shadow data by a hot patch.

The server (e2e/main.c, e2e/session.c) is built with moltcc; its worker
threads open, use and close sessions in a shared table and check every
reply.  The fix (e2e/fix/session.c) locks a session after three wrong
passwords: upstream added a field to struct session, the hot patch keeps it
as shadow data (attached when a session opens, read and updated at login,
freed at close).  Under load:

  generation 1  the fix is applied: sessions opened from now on are locked
                after three failures; sessions opened before behave as before
  generation 2  rolled back: every session behaves as before again
  generation 3  once the fix is unloaded, the clean-up patch
                (e2e/sweep/session.c: version 1 + molt_shadow_free_all)
                frees what the rolled-back fix left behind: no shadow left
  generation 4  the fix again, on a clean slate
  quit          every session closed by the fix: no shadow left

No reply may be wrong at any time (a session locked before its third
failure would have inherited another session's field), and no sanitizer
may report anything (the TSan build runs this test: label concurrency).

Environment: MOLT_BUILD_DIR (set by tests/shadow/tests.cmake).
"""
import os
import re
import shutil
import time

from harness import proc
from harness.moltcc import Tool
from harness.proc import Program, poll, sanitizer_reports, status

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "e2e")

PATCHED = {1, 4}          # generations that run the fix


def molt(*args):
    return proc.molt(*args, check=0, timeout=120).out


def build(tmp):
    work = str(tmp)
    for name in ("main.c", "session.c", "session.h"):
        shutil.copy(os.path.join(SRC, name), work)
    for d in ("fix", "sweep"):
        os.makedirs(os.path.join(work, d))
        shutil.copy(os.path.join(SRC, d, "session.c"), os.path.join(work, d))
    t = Tool(work)
    t.moltcc("-O2", "-g", "-Wall", "-Werror", "main.c", "session.c", "-o", "server").ok()
    for d, desc in (("fix", "lock a session after 3 wrong passwords"),
                    ("sweep", "free the rolled-back fix's shadow data")):
        t.moltcc("--molt-patch", "--molt-target", "./server", "-o", d + ".so",
                 os.path.join(d, "session.c"), "-O2", "-g", "-Wall", "-Werror", "-I.",
                 "--molt-description", desc).ok()
        os.chmod(os.path.join(work, d + ".so"), 0o755)
    return work


class Server(Program):
    def __init__(self, work):
        Program.__init__(self, [os.path.join(work, "server")], cwd=work)
        m = re.match(r"ready pid=(\d+)", self.out.next(60) or "")
        assert m, "the server did not start"
        self.pid = int(m.group(1))

    def stats(self, what="stats"):
        self.send("stats" if what == "stats" else "quit")
        head = self.out.next(60) or ""
        m = re.match(r"%s opened=(\d+) closed=(\d+) requests=(\d+) wrong=(\d+) shadows=(\d+) "
                     r"generation=(\d+)$" % what, head.strip())
        assert m, head
        s = dict(zip(("opened", "closed", "requests", "wrong", "shadows", "generation"),
                     map(int, m.groups())))
        s["pairs"] = {}
        for line in iter(lambda: self.out.next(60), None):
            if line.strip() == "end":
                break
            a, b, v1, v2, mixed = map(int, re.match(
                r"pair (\d+) (\d+) v1=(\d+) v2=(\d+) mixed=(\d+)", line).groups())
            s["pairs"][(a, b)] = (v1, v2, mixed)
        return s

    def wait_sessions(self, gen, n=200, timeout=60):
        """Until at least n sessions opened and closed within generation gen."""
        return poll(self.stats, lambda s: sum(s["pairs"].get((gen, gen), (0, 0, 0))) >= n,
                    timeout, "%d sessions in generation %d" % (n, gen), interval=0.1)


def check(s):
    """No wrong reply; sessions entirely in one generation behave exactly as
    that generation's code; nothing else but mixes across generations."""
    assert s["wrong"] == 0, s
    for (a, b), (v1, v2, mixed) in s["pairs"].items():
        if a == b:
            if a in PATCHED:
                assert v1 == 0 and mixed == 0, ("generation %d runs the fix" % a, s)
            else:
                assert v2 == 0 and mixed == 0, ("generation %d runs version 1" % a, s)
        elif a not in PATCHED and all(g not in PATCHED for g in range(a, b + 1)):
            assert v2 == 0 and mixed == 0, s


def wait_unloaded(pid, timeout=30):
    poll(lambda: status(pid), lambda st: not st["objects"], timeout,
         "the rolled-back fix to be unloaded", interval=0.05)


def test_added_field_as_shadow_data(tmp_path):
    work = build(tmp_path)
    srv = Server(work)
    try:
        s = srv.wait_sessions(0)
        check(s)
        assert s["shadows"] == 0, s

        # generation 1: the fix, under load
        out = molt("apply", srv.pid, os.path.join(work, "fix.so"))
        assert "now at generation 1" in out, out
        s = srv.wait_sessions(1)
        check(s)
        v1, v2, mixed = s["pairs"][(1, 1)]
        assert v2 > 0, s
        # only open sessions have the field (the fix frees it at close)
        assert 0 < s["shadows"] <= 256, s

        # generation 2: rolled back under load
        out = molt("rollback", srv.pid)
        assert "now at generation 2" in out, out
        wait_unloaded(srv.pid)
        s = srv.wait_sessions(2)
        check(s)
        # what the fix's sessions left behind: bounded, and version 1 makes
        # no more
        left = s["shadows"]
        assert left <= 256, s
        time.sleep(0.3)
        assert srv.stats()["shadows"] <= left

        # generation 3: the clean-up
        out = molt("apply", srv.pid, os.path.join(work, "sweep.so"))
        assert "now at generation 3" in out, out
        s = srv.wait_sessions(3)
        check(s)
        assert s["shadows"] == 0, s

        # generation 4: the fix again
        out = molt("apply", srv.pid, os.path.join(work, "fix.so"))
        assert "now at generation 4" in out, out
        s = srv.wait_sessions(4)
        check(s)
        assert s["pairs"][(4, 4)][1] > 0, s

        final = srv.stats("final")
        check(final)
        srv.finish(rc=0, timeout=60)
        err = srv.err.text()
        # every session was closed by the fix, which frees the field
        assert final["shadows"] == 0, final
        assert final["opened"] == final["closed"], final
        assert not sanitizer_reports(err), err
        print("sessions per (generation at open, at close): v1, v2, mixed")
        for k in sorted(final["pairs"]):
            print("  %s: %s" % (k, final["pairs"][k]))
        print("requests: %d" % final["requests"])
    finally:
        srv.kill()
