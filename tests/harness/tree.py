"""The source tree, the build tree the tests use and what it has.

The build tree is $MOLT_BUILD_DIR (ctest sets it for every Python test),
else build/ in the repository.  Its programs are in <build>/bin: the CLI
(molt, with molt-run next to it), moltcc's launcher and moltstamp;
libmolt.so is at its top.

A missing prerequisite skips a test, except under MOLT_REQUIRE_ALL=1
(scripts/test.sh sets it): then every skip is a failure, so nothing is
skipped silently.
"""
import functools
import os
import subprocess

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.abspath(os.environ.get("MOLT_BUILD_DIR") or os.path.join(ROOT, "build"))
INCLUDE = os.path.join(ROOT, "include")
TOOLS = os.path.join(ROOT, "tools")
SYS_PYTHON = "/usr/bin/python3"        # the Python with Debian's libclang bindings

REQUIRE_ALL = os.environ.get("MOLT_REQUIRE_ALL", "") not in ("", "0")


def bin_path(name):
    """A program of the build tree: molt, molt-run, moltcc, moltstamp."""
    return os.path.join(BUILD, "bin", name)


def molt_cli():
    return bin_path("molt")


def write_file(root, name, text):
    """Writes text (str or bytes) to root/name (making its folders);
    returns the path."""
    path = os.path.join(str(root), name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text)
    return path


def built(rel):
    """Whether the build tree has rel (e.g. "libmolt.so", "bin/molt")."""
    return os.path.exists(os.path.join(BUILD, rel))


def skip(reason):
    """Skips the test, or fails it under MOLT_REQUIRE_ALL=1."""
    if REQUIRE_ALL:
        pytest.fail("%s (MOLT_REQUIRE_ALL=1: a missing prerequisite is a failure)" % reason,
                    pytrace=False)
    pytest.skip(reason)


def need_built(*rels):
    """Skips (see skip()) unless the build tree has every one of rels."""
    for rel in rels:
        if not built(rel):
            skip("%s not built in %s" % (rel, BUILD))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under MOLT_REQUIRE_ALL=1 any skip that did not go through skip()
    (skipif marks, pytest.skip in a test, importorskip) fails too.  A
    conftest.py that wants this for its folder imports the hook."""
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


def _sys_python_imports(code):
    try:
        return subprocess.run([SYS_PYTHON, "-c", code], capture_output=True).returncode == 0
    except OSError:
        return False


@functools.lru_cache(maxsize=None)
def have_bindings():
    """Whether /usr/bin/python3 has libclang's bindings (moltcc needs them)."""
    return _sys_python_imports("import clang.cindex as c; c.Index.create()")


@functools.lru_cache(maxsize=None)
def have_pyelftools():
    return _sys_python_imports("import elftools.elf.elffile")


def molt_abi():
    """MOLT__ABI of the molt.h (molt/abi.h) this tree builds with."""
    import re
    with open(os.path.join(INCLUDE, "molt", "abi.h")) as f:
        return int(re.search(r"^#define MOLT__ABI (\d+)u", f.read(), re.M).group(1))
