"""The full-update test programs (progs/): built with this tree's moltcc
(harness.moltcc), run with `molt run` and driven through their stdin/stdout
command loop (progs/fu.h) as a harness.proc.Program, updated with `molt
update`.

Environment: MOLT_BUILD_DIR (harness.tree); FU_WORK, a directory for the
images (default: a temporary one); both set by tests.cmake.
"""

import os
import tempfile
import time
from pathlib import Path

from harness.moltcc import moltcc
from harness.proc import Program, mapped, maps, molt, poll
from harness.tree import molt_cli

HERE = Path(__file__).resolve().parent
PROGS = HERE / "progs"
WORK = Path(os.environ.get("FU_WORK") or tempfile.mkdtemp(prefix="molt-fu-"))

CFLAGS = ["-O1", "-g", "-Wall", "-Wno-unused-function", "-Wno-unused-parameter"]

_built = {}


def build(prog, version, frm=None, xf=None, out_name=None):
    """progs/<prog>/<version>/*.c -> <WORK>/<prog>/<prog>-<version>.so.
    frm: the image this version updates (--molt-from); xf: a file name in
    progs/<prog>/ (default <version>.xf when it exists).  Asserts that the
    build succeeds and returns the image's path."""
    key = (prog, version, str(frm), xf, out_name)
    if key in _built:
        return _built[key]
    r, out = build_raw(prog, version, frm, xf, out_name)
    assert r.returncode == 0, "moltcc failed for %s/%s (exit %d):\n%s%s" % (
        prog, version, r.returncode, r.stdout, r.stderr)
    assert out.is_file()
    _built[key] = out
    return out


def build_raw(prog, version, frm=None, xf=None, out_name=None):
    """Runs moltcc without judging the result: (Result, output)."""
    src = PROGS / prog / version
    odir = WORK / prog
    odir.mkdir(parents=True, exist_ok=True)
    out = odir / (out_name or "%s-%s.so" % (prog, version))
    if out.exists():
        out.unlink()
    args = ["--molt-program"] + CFLAGS + ["-I", PROGS, "-o", out]
    args += sorted(src.glob("*.c"))
    if frm is not None:
        args += ["--molt-from", frm]
        xfp = PROGS / prog / (xf or version + ".xf")
        if xf is not None or xfp.exists():
            args += ["--molt-xf", xfp]
    return moltcc(args, cwd=None), out


def pair(prog):
    """v1 and v2 (from v1) of progs/<prog>."""
    v1 = build(prog, "v1")
    return v1, build(prog, "v2", frm=v1)


def parse_kv(line):
    """'version=1 a=2 b=x' -> {'version': '1', 'a': '2', 'b': 'x'}"""
    return dict(tok.split("=", 1) for tok in line.split() if "=" in tok)


class Prog(Program):
    """A test program started with `molt run`, driven over stdin/stdout."""

    def __init__(self, image, args=()):
        self.image = Path(image)
        Program.__init__(self, [molt_cli(), "run", self.image, *args], name=self.image.name)
        self.updates = []
        # the program is up when it answers
        assert self.cmd("ping", timeout=30) == "pong", self.stderr()

    def cmd(self, line, timeout=10.0):
        self.send(line)
        return self.line(timeout)

    def dump(self):
        return parse_kv(self.cmd("dump"))

    def wait_for(self, pred, timeout=10.0):
        """Dumps until pred(state) holds; returns that state."""
        return poll(self.dump, pred, timeout, "a state in which the condition holds")

    def update(self, image, timeout=10, extra=()):
        """`molt update PID image --timeout S`; returns the Result (stdout
        and stderr together in .stdout)."""
        r = molt("update", self.pid, image, "--timeout", timeout, *extra, merge=True,
                 timeout=timeout + 60)
        self.updates.append(r)
        return r

    def update_ok(self, image, timeout=10):
        r = self.update(image, timeout)
        assert r.returncode == 0, "molt update failed (exit %d): %s\n%s" % (
            r.returncode, r.stdout, self.stderr())
        return r

    def maps(self):
        return maps(self.pid)

    def mapped(self, name):
        """Mappings whose path (or memfd name) contains name."""
        return mapped(self.pid, name)

    def wait_unmapped(self, name, timeout=10.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.mapped(name):
                return True
            time.sleep(0.02)
        return False

    def tids(self):
        return sorted(int(t) for t in os.listdir("/proc/%d/task" % self.pid))

    def quit(self):
        """Ends the program through its own 'quit' command; returns its exit
        status (the program must exit by itself within 20 s)."""
        assert self.cmd("quit") == "bye"
        return self.finish(rc=None, timeout=20)


def assert_clean_stderr(prog):
    """No sanitizer report or runtime complaint on the program's stderr."""
    text = prog.err.text()
    for bad in ("AddressSanitizer", "UndefinedBehaviorSanitizer", "LeakSanitizer",
                "runtime error:", "Segmentation fault"):
        assert bad not in text, prog.stderr()
