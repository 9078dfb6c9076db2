"""Fixtures for the moltcc tests: real compiles with the real compiler.

The build tree comes from $MOLT_BUILD_DIR (default: build/ in the repository).  moltcc
is run through <build>/bin/moltcc (the CMake-generated launcher) when it
exists, else directly from the source tree with /usr/bin/python3 (the
Python that has Debian's libclang bindings); both find molt.h, libmolt and
moltstamp in the same build tree (the CLI is <build>/bin/molt, moltstamp
<build>/bin/moltstamp).

Missing prerequisites (libclang bindings, libmolt, moltstamp, the CLI, cmake)
skip the tests that need them, except under MOLT_REQUIRE_ALL=1 (CI sets it):
then every skip is a failure, so nothing is skipped silently.
"""
import os
import shlex
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.path.abspath(os.environ.get("MOLT_BUILD_DIR") or os.path.join(ROOT, "build"))
MOLTCC_PY = os.path.join(ROOT, "tools", "moltcc")   # the package, run as a folder
SYS_PYTHON = "/usr/bin/python3"

sys.path.insert(0, HERE)

REQUIRE_ALL = os.environ.get("MOLT_REQUIRE_ALL", "") not in ("", "0")


def skip(reason):
    """Skips the test, or fails it under MOLT_REQUIRE_ALL=1."""
    if REQUIRE_ALL:
        pytest.fail("%s (MOLT_REQUIRE_ALL=1: a missing prerequisite is a failure)" % reason,
                    pytrace=False)
    pytest.skip(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under MOLT_REQUIRE_ALL=1 any skip that did not go through skip()
    (skipif marks, pytest.skip in a test, importorskip) fails too."""
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE_ALL and rep.skipped and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = "skipped under MOLT_REQUIRE_ALL=1: %s" % reason


def build_sanitize():
    """MOLT_SANITIZE of the build tree ("", "address" or "thread")."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("MOLT_SANITIZE:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""


def san_flags():
    """The flags moltcc adds to every compile and link for this build tree
    (what the top-level CMakeLists.txt gives libmolt)."""
    s = build_sanitize()
    if s == "address":
        return ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                "-fno-sanitize-recover=undefined"]
    if s == "thread":
        return ["-fsanitize=thread", "-fno-omit-frame-pointer"]
    return []


SANITIZER_REPORT = ("ERROR: AddressSanitizer", "WARNING: ThreadSanitizer", "ERROR: LeakSanitizer",
                    "runtime error:", "ERROR: ThreadSanitizer")


def sanitizer_reports(stderr):
    """Lines of a sanitizer report in a program's stderr."""
    return [l for l in (stderr or "").splitlines() if any(m in l for m in SANITIZER_REPORT)]


def _has_bindings():
    try:
        p = subprocess.run([SYS_PYTHON, "-c", "import clang.cindex as c; c.Index.create()"],
                           capture_output=True)
        return p.returncode == 0
    except OSError:
        return False


HAS_BINDINGS = _has_bindings()


def moltcc_cmd():
    launcher = os.path.join(BUILD, "bin", "moltcc")
    if os.path.isfile(launcher) and os.access(launcher, os.X_OK):
        return [launcher]
    return [SYS_PYTHON, MOLTCC_PY]


def make_env(extra=None):
    env = dict(os.environ)
    env["MOLT_BUILD_DIR"] = BUILD
    env.pop("MOLT_PREFIX", None)
    env.pop("MOLT_VERBOSE", None)
    env.pop("MOLT_CC", None)
    env["LC_ALL"] = "C"
    if extra:
        env.update(extra)
    return env


class Result:
    def __init__(self, p, cmd):
        self.rc = p.returncode
        self.out = p.stdout
        self.err = p.stderr
        self.cmd = cmd

    def __repr__(self):
        return "<rc=%d cmd=%s\nstdout:\n%s\nstderr:\n%s>" % (
            self.rc, " ".join(shlex.quote(c) for c in self.cmd), self.out, self.err)

    def ok(self):
        assert self.rc == 0, repr(self)
        return self


class Tool:
    """Runs moltcc (or anything) in a working directory."""

    def __init__(self, cwd):
        self.cwd = str(cwd)

    def run(self, cmd, env=None, input=None, timeout=300):
        # moltcc's private directories (and anything --molt-keep leaves) go
        # under the test's own tmp_path
        tmp = os.path.join(self.cwd, ".tmp")
        os.makedirs(tmp, exist_ok=True)
        full_env = make_env(dict({"TMPDIR": tmp}, **(env or {})))
        p = subprocess.run(cmd, cwd=self.cwd, capture_output=True, text=True,
                           env=full_env, input=input, timeout=timeout)
        return Result(p, cmd)

    def moltcc(self, *args, env=None, input=None):
        return self.run(moltcc_cmd() + list(args), env=env, input=input)

    def cc(self, *args, env=None):
        return self.run(["cc"] + list(args), env=env)

    def write(self, name, text):
        path = os.path.join(self.cwd, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def path(self, name):
        return os.path.join(self.cwd, name)


@pytest.fixture
def tool(tmp_path):
    if not HAS_BINDINGS:
        skip("%s has no libclang bindings (apt-get install python3-clang-14)" % SYS_PYTHON)
    if not os.path.isfile(os.path.join(ROOT, "include", "molt.h")):
        skip("include/molt.h missing")
    return Tool(tmp_path)


def have_lib():
    return os.path.exists(os.path.join(BUILD, "libmolt.so"))


def have_stamp():
    return os.path.exists(os.path.join(BUILD, "bin", "moltstamp"))


def have_cli():
    return os.path.exists(os.path.join(BUILD, "bin", "molt"))


@pytest.fixture
def needs_lib():
    if not have_lib():
        skip("libmolt.so not built in %s" % BUILD)


@pytest.fixture
def needs_stamp(needs_lib):
    if not have_stamp():
        skip("moltstamp not built in %s/bin" % BUILD)


@pytest.fixture
def needs_cli(needs_stamp):
    if not have_cli():
        skip("molt CLI not built in %s/bin" % BUILD)


def cli_path():
    return os.path.join(BUILD, "bin", "molt")
