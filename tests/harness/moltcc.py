"""Building with this tree's moltcc.

moltcc is run through <build>/bin/moltcc (the CMake-generated launcher)
when it exists, else as the package in tools/moltcc on /usr/bin/python3 (the
Python with Debian's libclang bindings), told where molt.h and libmolt are;
both find libmolt and moltstamp in the same build tree (harness.tree).

  moltcc_cmd()      the command that runs moltcc
  make_env(extra)   the environment of a build: the build tree named, the
                    variables that would change moltcc's behaviour removed,
                    LC_ALL=C (messages checked in English)
  Tool(cwd)         a work directory: run(), moltcc(), cc(), write(), path();
                    results whose ok() fails showing the compiler's output
  require_moltcc()  skips (harness.tree.skip) when moltcc cannot run here
"""
import os

from harness.proc import run as _run
from harness.tree import BUILD, INCLUDE, ROOT, SYS_PYTHON, TOOLS, have_bindings, skip, write_file

MOLTCC_PY = os.path.join(TOOLS, "moltcc")   # the package, run as a folder
# variables of the caller's environment that a test's build must not see
_UNSET = ("MOLT_PREFIX", "MOLT_VERBOSE", "MOLT_CC", "CPATH", "C_INCLUDE_PATH")


def moltcc_cmd():
    launcher = os.path.join(BUILD, "bin", "moltcc")
    if os.path.isfile(launcher) and os.access(launcher, os.X_OK):
        return [launcher]
    return [SYS_PYTHON, MOLTCC_PY, "--molt-internal-include=" + INCLUDE,
            "--molt-internal-libdir=" + BUILD]


def make_env(extra=None):
    env = dict(os.environ)
    for k in _UNSET:
        env.pop(k, None)
    env["MOLT_BUILD_DIR"] = BUILD
    env["LC_ALL"] = "C"
    if extra:
        env.update(extra)
    return env


def require_moltcc():
    if not have_bindings():
        skip("%s has no libclang bindings (apt-get install python3-clang-14)" % SYS_PYTHON)
    if not os.path.isfile(os.path.join(ROOT, "include", "molt.h")):
        skip("include/molt.h missing")


def moltcc(args, cwd, env=None, timeout=300):
    """One moltcc run in cwd -> harness.proc.Result (call .ok() to require
    success: the failure shows the command and the compiler's output)."""
    return _run(moltcc_cmd() + [str(a) for a in args], cwd=cwd, env=make_env(env),
                timeout=timeout)


class Tool:
    """Runs moltcc (or anything) in a working directory; moltcc's private
    directories (and anything --molt-keep leaves) go under it, in .tmp."""

    def __init__(self, cwd):
        self.cwd = str(cwd)

    def run(self, cmd, env=None, input=None, timeout=300):
        tmp = os.path.join(self.cwd, ".tmp")
        os.makedirs(tmp, exist_ok=True)
        return _run(cmd, cwd=self.cwd, env=make_env(dict({"TMPDIR": tmp}, **(env or {}))),
                    input=input, timeout=timeout)

    def moltcc(self, *args, env=None, input=None):
        return self.run(moltcc_cmd() + list(args), env=env, input=input)

    def cc(self, *args, env=None):
        return self.run(["cc"] + list(args), env=env)

    def write(self, name, text):
        return write_file(self.cwd, name, text)

    def path(self, name):
        return os.path.join(self.cwd, name)
