"""Helpers of the tests of the compile record and of fixes (test_record_*,
test_fix_*): real compiles with this build tree's moltcc, real make, diff
and git.  Not a conftest: the folder's other tests have their own.

moltcc is <build>/bin/moltcc ($MOLT_BUILD_DIR, default <repo>/build), else
the package on /usr/bin/python3.  A missing prerequisite skips, except
under MOLT_REQUIRE_ALL=1 (CI): then it fails.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.path.abspath(os.environ.get("MOLT_BUILD_DIR") or os.path.join(ROOT, "build"))
TOOLS = os.path.join(ROOT, "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)        # import moltcc.record, moltcc.patch.source ...

REQUIRE_ALL = os.environ.get("MOLT_REQUIRE_ALL", "") not in ("", "0")


def skip(reason):
    if REQUIRE_ALL:
        pytest.fail("%s (MOLT_REQUIRE_ALL=1: a missing prerequisite is a failure)" % reason,
                    pytrace=False)
    pytest.skip(reason)


def moltcc_cmd():
    launcher = os.path.join(BUILD, "bin", "moltcc")
    if os.path.isfile(launcher):
        return [launcher]
    return ["/usr/bin/python3", os.path.join(TOOLS, "moltcc"),
            "--molt-internal-include=" + os.path.join(ROOT, "include"),
            "--molt-internal-libdir=" + BUILD]


def env(extra=None):
    e = dict(os.environ)
    for k in ("MOLT_PREFIX", "MOLT_VERBOSE", "MOLT_CC", "CPATH", "C_INCLUDE_PATH"):
        e.pop(k, None)
    e["MOLT_BUILD_DIR"] = BUILD
    e["LC_ALL"] = "C"
    e.update(extra or {})
    return e


def run(cmd, cwd, check=True, extra_env=None):
    p = subprocess.run(cmd, cwd=str(cwd), capture_output=True, text=True, env=env(extra_env))
    if check:
        assert p.returncode == 0, "%s\nstdout:\n%s\nstderr:\n%s" % (cmd, p.stdout, p.stderr)
    return p


def moltcc(args, cwd, check=True):
    return run(moltcc_cmd() + list(args), cwd, check)


def write(root, files):
    for name, text in files.items():
        p = os.path.join(str(root), name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w" if isinstance(text, str) else "wb") as f:
            f.write(text)


def show_build(prog, cwd):
    return json.loads(moltcc(["--molt-show-build", str(prog)], cwd).stdout)


def have_bindings():
    p = subprocess.run(["/usr/bin/python3", "-c", "import clang.cindex as c; c.Index.create()"],
                       capture_output=True)
    return p.returncode == 0


@pytest.fixture
def needs_moltcc():
    if not have_bindings():
        skip("/usr/bin/python3 has no libclang bindings (apt-get install python3-clang-14)")
    if not os.path.exists(os.path.join(BUILD, "libmolt.so")):
        skip("libmolt.so not built in %s" % BUILD)
    for tool in ("make", "git", "objcopy", "strip", "ar"):
        if not shutil.which(tool):
            skip("%s is not installed" % tool)


def git(args, cwd):
    return run(["git", "-c", "user.email=t@example.org", "-c", "user.name=t",
                "-c", "core.autocrlf=false", "-c", "init.defaultBranch=main"] + list(args), cwd)
