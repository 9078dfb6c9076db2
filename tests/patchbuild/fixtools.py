"""Helpers of the tests of the compile record and of fixes (test_record_*,
test_fix_*): real compiles with this build tree's moltcc, real make, diff
and git.  Not a conftest: the folder's other tests have their own.

moltcc, the build tree and skipping are harness.moltcc's and harness.tree's
(tests/README.md): a missing prerequisite skips, except under
MOLT_REQUIRE_ALL=1 (CI): then it fails.
"""
import json
import shutil

import pytest

from harness import moltcc as _moltcc
from harness import proc
from harness.moltcc import make_env, require_moltcc
from harness.tree import need_built, skip, write_file


def run(cmd, cwd, check=True, extra_env=None):
    """cmd in cwd with a build's environment (harness.moltcc.make_env);
    check: it must succeed.  -> harness.proc.Result"""
    return proc.run(cmd, cwd=cwd, env=make_env(extra_env), check=0 if check else None)


def moltcc(args, cwd, check=True):
    r = _moltcc.moltcc(args, cwd)
    return r.ok() if check else r


def write(root, files):
    """files: {name: text or bytes} written under root."""
    for name, text in files.items():
        write_file(root, name, text)


def show_build(prog, cwd):
    return json.loads(moltcc(["--molt-show-build", str(prog)], cwd).stdout)


@pytest.fixture
def needs_moltcc():
    require_moltcc()
    need_built("libmolt.so")
    for tool in ("make", "git", "objcopy", "strip", "ar"):
        if not shutil.which(tool):
            skip("%s is not installed" % tool)


def git(args, cwd):
    return run(["git", "-c", "user.email=t@example.org", "-c", "user.name=t",
                "-c", "core.autocrlf=false", "-c", "init.defaultBranch=main"] + list(args), cwd)
