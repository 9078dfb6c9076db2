"""Helpers of the corpus tests (test_corpus_*.py): a small real program is
built with CC="moltcc --molt-updatable=all" (make or a plain command line),
started, changed one way, and the change is turned into a diff (git diff or
diff -u); the patch is built from the diff with `moltcc --molt-patch
--molt-target PROG --molt-diff FIX.patch` run from another directory, and
applied with `molt apply`; `molt status` must then show exactly the
replaced functions.  Not a conftest: the folder's other tests have theirs.

moltcc, molt and the build tree are harness.moltcc's, harness.proc's and
harness.tree's.  A missing prerequisite skips, except under
MOLT_REQUIRE_ALL=1 (CI): then it fails.
"""
import json
import os
import shutil
import socket

from fixtools import git, write
from harness import proc
from harness.moltcc import make_env, moltcc_cmd
from harness.tree import have_bindings, need_built, skip


def need(tools=("make", "git", "gcc")):
    if not have_bindings():
        skip("/usr/bin/python3 has no libclang bindings (apt-get install python3-clang-14)")
    need_built("libmolt.so", "bin/molt", "bin/moltstamp")
    for tool in tools:
        if not shutil.which(tool):
            skip("%s is not installed" % tool)


def run(cmd, cwd, extra_env=None, timeout=300):
    """cmd in cwd with a build's environment -> harness.proc.Result"""
    return proc.run(cmd, cwd=cwd, env=make_env(extra_env), timeout=timeout)


class Project:
    """A git project in `root` built by moltcc; `files` are its sources."""

    def __init__(self, root, files, cc="gcc"):
        self.root = str(root)
        self.files = dict(files)
        self.cc = cc
        os.makedirs(self.root, exist_ok=True)
        write(self.root, self.files)
        git(["init", "-q"], self.root)
        git(["add", "-A"], self.root)
        git(["commit", "-qm", "original"], self.root)
        self.elsewhere = os.path.join(os.path.dirname(self.root), "elsewhere")
        os.makedirs(self.elsewhere, exist_ok=True)
        self.n = 0

    def path(self, name):
        return os.path.join(self.root, name)

    def make(self, target="all"):
        cc = " ".join(moltcc_cmd() + ["--molt-updatable=all"])
        r = run(["make", "-s", "CC=" + cc, target], self.root, {"MOLT_CC": self.cc})
        assert r.rc == 0, r
        return r

    # -- fixes --------------------------------------------------------------------
    def edit(self, changes):
        """changes: {file: [(old, new), ...]} applied to the working tree
        (each `old` must be there exactly once); a file given as a string is
        written whole."""
        for name, subs in changes.items():
            p = self.path(name)
            if isinstance(subs, str):
                text = subs
            else:
                with open(p) as f:
                    text = f.read()
                for old, new in subs:
                    assert text.count(old) == 1, (name, old)
                    text = text.replace(old, new)
            with open(p, "w") as f:
                f.write(text)

    def git_diff(self, changes, name=None, header=""):
        """The fix as `git diff` writes it; the tree is restored."""
        self.edit(changes)
        d = git(["diff"], self.root).stdout
        git(["checkout", "-q", "--", "."], self.root)
        return self.save(header + d, name)

    def series(self, steps):
        """A series of fixes, each made on top of the ones before it (git
        diff against the index); the tree is restored."""
        out = []
        try:
            for changes in steps:
                self.edit(changes)
                out.append(self.save(git(["diff"], self.root).stdout))
                git(["add", "-A"], self.root)
        finally:
            git(["reset", "-q", "--hard"], self.root)
        return out

    def diff_u(self, changes, name=None):
        """The fix as `diff -u a/FILE b/FILE` writes it (one per file)."""
        old = {n: open(self.path(n)).read() for n in changes}
        self.edit(changes)
        out = []
        top = os.path.join(self.elsewhere, "du%d" % self.n)
        for n in sorted(changes):
            for side, text in (("a", old[n]), ("b", open(self.path(n)).read())):
                write(os.path.join(top, side), {n: text})
            r = run(["diff", "-u", "a/" + n, "b/" + n], top)
            assert r.rc == 1, r
            out.append(r.out)
        git(["checkout", "-q", "--", "."], self.root)
        return self.save("".join(out), name)

    def save(self, text, name=None):
        self.n += 1
        p = os.path.join(self.elsewhere, name or "fix%d.patch" % self.n)
        with open(p, "w") as f:
            f.write(text)
        return p

    def patch(self, diffs, out=None, extra=()):
        """moltcc --molt-patch from the diffs, run from another directory.
        Returns (Result, report dict or None, patch path)."""
        self.n += 1
        out = out or os.path.join(self.elsewhere, "p%d.so" % self.n)
        rep = out[:-3] + ".json"
        args = ["--molt-patch", "--molt-target", self.path(self.binary), "-o", out,
                "--molt-report", rep]
        for d in diffs:
            args += ["--molt-diff", d]
        r = run(moltcc_cmd() + args + list(extra), self.elsewhere, {"MOLT_CC": self.cc})
        data = None
        if os.path.exists(rep):
            with open(rep) as f:
                data = json.load(f)
        return r, data, out

    binary = "prog"


def ok_patch(r, out):
    assert r.rc == 0, r
    assert os.path.exists(out), r
    return r


def refused(r, out, *needles):
    """The patch build was refused naming every needle, nothing at -o."""
    assert r.rc == 1, r
    assert not os.path.exists(out), r
    for n in needles:
        assert n in r.err, "%r not in:\n%s" % (n, r.err)
    assert "shadow data" in r.err and "molt update" in r.err, r.err


# ---------------------------------------------------------------------------
# The running program
# ---------------------------------------------------------------------------

class Running(proc.Program):
    """A program of the corpus, started with a build's environment."""

    def __init__(self, argv, cwd):
        proc.Program.__init__(self, argv, cwd=cwd, env=make_env())

    def molt(self, *args, check=0):
        return proc.molt(*args, check=check, env=make_env())

    def apply(self, patch):
        return self.molt("apply", self.pid, patch)

    def status(self):
        return proc.status(self.pid, env=make_env())

    def replaced_by(self, patch_id):
        """{(name, tu or None)} of the functions whose version is patch_id."""
        out = set()
        for f in self.status()["functions"]:
            if f["version"] == patch_id:
                out.add((f["name"], f["tu"] if f["static"] else None))
        return out

    def stop(self):
        """SIGTERM (SIGKILL after 10 s); returns (stdout, stderr)."""
        proc.Program.stop(self)
        return self.out.join(), self.err.join()


class SocketServer(Running):
    """A server answering one line per request on a unix socket."""

    def __init__(self, argv, cwd, sock):
        self.sock = sock
        Running.__init__(self, argv + [sock], cwd)
        proc.wait_until(lambda: os.path.exists(sock) or not self.alive(), timeout=20,
                        what="the server to start")
        assert os.path.exists(sock), self.stop()

    def request(self, line, timeout=10):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(self.sock)
            s.sendall(line.encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
        finally:
            s.close()
        return buf.decode().strip()


class FileReporter(Running):
    """A program whose loop writes its latest result to a file."""

    def __init__(self, argv, cwd, path):
        self.path = path
        Running.__init__(self, argv + [path], cwd)
        self.wait(lambda t: t != "")

    def read(self):
        try:
            with open(self.path) as f:
                return f.read().strip()
        except FileNotFoundError:
            return ""

    def wait(self, pred, timeout=20):
        t = proc.poll(self.read, lambda r: pred(r) or not self.alive(), timeout,
                      what="the report")
        assert pred(t), self.stop()
        return t
