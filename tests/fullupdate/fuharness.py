"""Helpers of the full-update tests: build test programs with the real
moltcc, run them with `molt run`, update them with `molt update`, and read
their state through their stdin/stdout command loop (progs/fu.h).

Environment (set by tests.cmake):
  MOLTCC     the build tree's moltcc launcher
  MOLT_CLI   the molt CLI
  FU_WORK    a directory for the images (default: a temporary one)
"""

import os
import re
import select
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGS = HERE / "progs"
MOLTCC = os.environ.get("MOLTCC", "moltcc")
MOLT = os.environ.get("MOLT_CLI", "molt")
WORK = Path(os.environ.get("FU_WORK") or tempfile.mkdtemp(prefix="molt-fu-"))

CFLAGS = ["-O1", "-g", "-Wall", "-Wno-unused-function", "-Wno-unused-parameter"]

_built = {}


def moltcc(args, cwd=None):
    return subprocess.run([MOLTCC] + [str(a) for a in args], cwd=cwd,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300)


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
    """Runs moltcc without judging the result: (CompletedProcess, output)."""
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
    return moltcc(args), out


def parse_kv(line):
    """'version=1 a=2 b=x' -> {'version': '1', 'a': '2', 'b': 'x'}"""
    return dict(tok.split("=", 1) for tok in line.split() if "=" in tok)


class Prog:
    """A test program started with `molt run`, driven over stdin/stdout."""

    def __init__(self, image, args=()):
        self.image = Path(image)
        self.errpath = WORK / ("%s.%d.stderr" % (self.image.stem, time.monotonic_ns()))
        self.err = open(self.errpath, "w")
        self.p = subprocess.Popen([MOLT, "run", str(self.image)] + list(args),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err)
        self.pid = self.p.pid
        self.buf = b""
        self.updates = []
        # the program is up when it answers
        assert self.cmd("ping", timeout=30) == "pong", self.stderr()

    def stderr(self):
        self.err.flush()
        return "stderr of %s:\n%s" % (self.image.name, self.errpath.read_text()[-4000:])

    def readline(self, timeout=10.0):
        end = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError("no answer within %.0f s; %s" % (timeout, self.stderr()))
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError("the program closed its stdout (exit %s); %s"
                                         % (self.p.poll(), self.stderr()))
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def cmd(self, line, timeout=10.0):
        self.p.stdin.write((line + "\n").encode())
        self.p.stdin.flush()
        return self.readline(timeout)

    def dump(self):
        return parse_kv(self.cmd("dump"))

    def update(self, image, timeout=10, extra=()):
        """`molt update PID image --timeout S`; returns the CompletedProcess
        (stdout and stderr together in .stdout)."""
        r = subprocess.run([MOLT, "update", str(self.pid), str(image),
                            "--timeout", str(timeout)] + list(extra),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout + 60)
        self.updates.append(r)
        return r

    def update_ok(self, image, timeout=10):
        r = self.update(image, timeout)
        assert r.returncode == 0, "molt update failed (exit %d): %s\n%s" % (
            r.returncode, r.stdout, self.stderr())
        return r

    def maps(self):
        return Path("/proc/%d/maps" % self.pid).read_text()

    def mapped(self, name):
        """Mappings whose path (or memfd name) contains name."""
        return [l for l in self.maps().splitlines() if name in l]

    def wait_unmapped(self, name, timeout=10.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.mapped(name):
                return True
            time.sleep(0.02)
        return False

    def tids(self):
        return sorted(int(t) for t in os.listdir("/proc/%d/task" % self.pid))

    def alive(self):
        return self.p.poll() is None

    def quit(self):
        """Ends the program through its own 'quit' command; returns its exit
        status (the program must exit by itself within 20 s)."""
        assert self.cmd("quit") == "bye"
        self.p.stdin.close()
        try:
            return self.p.wait(20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise AssertionError("the program did not exit after quit; " + self.stderr())

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.err.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        return False


def assert_clean_stderr(prog):
    """No sanitizer report or runtime complaint on the program's stderr."""
    text = prog.errpath.read_text()
    for bad in ("AddressSanitizer", "UndefinedBehaviorSanitizer", "LeakSanitizer",
                "runtime error:", "Segmentation fault"):
        assert bad not in text, prog.stderr()
