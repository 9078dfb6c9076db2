"""Fixtures for the patch-builder unit tests: real compiles of small C
sources, woven the way a program build weaves them, compared with
moltcc.patch.objdiff / moltcc.patch.typecheck.

Woven objects are made as the patch builder will make them: moltcc
(--molt-updatable=all --molt-keep) weaves the source, the kept generated
source is compiled with gcc or clang-14 and `-ffunction-sections
-fdata-sections -g -c`.  All versions a test needs are woven by one moltcc
run (the slow part is loading libclang) and woven sources are cached for the
session, so the gcc/clang and -O0/-O2 variants reuse them.

moltcc is <build>/bin/moltcc ($MOLT_BUILD_DIR, default <repo>/build) or
tools/moltcc/moltcc.py on /usr/bin/python3.  Missing prerequisites skip,
except under MOLT_REQUIRE_ALL=1 (CI): then they fail.
"""
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.path.abspath(os.environ.get("MOLT_BUILD_DIR") or os.path.join(ROOT, "build"))
TOOLS = os.path.join(ROOT, "tools")
INCLUDE = os.path.join(ROOT, "include")
sys.path.insert(0, TOOLS)

REQUIRE_ALL = os.environ.get("MOLT_REQUIRE_ALL", "") not in ("", "0")
COMPILERS = {"gcc": "gcc", "clang": "clang-14"}
BASE_FLAGS = ["-ffunction-sections", "-fdata-sections", "-g", "-c"]


def skip(reason):
    if REQUIRE_ALL:
        pytest.fail("%s (MOLT_REQUIRE_ALL=1: a missing prerequisite is a failure)" % reason,
                    pytrace=False)
    pytest.skip(reason)


def moltcc_cmd():
    launcher = os.path.join(BUILD, "bin", "moltcc")
    if os.path.exists(launcher):
        return [launcher]
    return ["/usr/bin/python3", os.path.join(TOOLS, "moltcc"),
            "--molt-internal-include=" + INCLUDE, "--molt-internal-libdir=" + BUILD]


class Builder:
    """Builds objects of small source trees (dict file name -> text)."""

    def __init__(self, root):
        self.root = root
        self.n = 0
        self.woven = {}           # key of (files, main) -> woven text of main
        self.objs = {}

    @staticmethod
    def _key(files, main):
        h = hashlib.sha256()
        for n in sorted(files):
            h.update(n.encode() + b"\0" + files[n].encode() + b"\0")
        h.update(main.encode())
        return h.hexdigest()[:20]

    def _dir(self, prefix):
        self.n += 1
        d = os.path.join(self.root, "%s%d" % (prefix, self.n))
        os.makedirs(d)
        return d

    @staticmethod
    def _write(d, files):
        for n, text in files.items():
            p = os.path.join(d, n)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)

    def weave(self, versions, main):
        """Weaves main of every version (list of file dicts) in one moltcc run."""
        todo = []
        for files in versions:
            k = self._key(files, main)
            if k not in self.woven and k not in [t[0] for t in todo]:
                todo.append((k, files))
        if not todo:
            return
        if not shutil.which(COMPILERS["gcc"]):
            skip("gcc is not installed")
        top = self._dir("weave")
        rels = []
        for i, (k, files) in enumerate(todo):
            d = os.path.join(top, "v%d" % i)
            os.makedirs(d)
            self._write(d, files)
            rels.append("v%d/%s" % (i, main))
        tmp = os.path.join(top, "tmp")
        os.makedirs(tmp)
        env = dict(os.environ, TMPDIR=tmp, MOLT_CC="gcc")
        p = subprocess.run(moltcc_cmd() + ["--molt-keep", "--molt-updatable=all", "-c"] + rels,
                           cwd=top, env=env, capture_output=True, text=True)
        if p.returncode != 0 and ("No module named 'clang'" in p.stderr or "libclang" in p.stderr):
            skip("moltcc needs Debian's python3-clang-14: " + p.stderr.strip().splitlines()[-1])
        assert p.returncode == 0, "moltcc failed:\n" + p.stderr
        m = re.search(r"generated sources kept in (\S+)", p.stderr)
        assert m, p.stderr
        kept = m.group(1)
        for i, (k, files) in enumerate(todo):
            with open(os.path.join(kept, str(i + 1), os.path.basename(main))) as f:
                text = f.read()
            # moltcc ran from `top`: the user's file was named v<i>/<main>
            text = text.replace('"%s"' % rels[i], '"%s"' % main)
            assert rels[i] not in text
            self.woven[k] = text

    def compile(self, files, main, cc, opt, woven, extra=()):
        k = (self._key(files, main), cc, opt, woven, tuple(extra))
        got = self.objs.get(k)
        if got is not None:
            return got
        compiler = COMPILERS[cc]
        if not shutil.which(compiler):
            skip("%s is not installed" % compiler)
        d = self._dir("obj")
        self._write(d, files)
        if woven:
            with open(os.path.join(d, main), "w") as f:
                f.write(self.woven[self._key(files, main)])
        out = os.path.join(d, os.path.splitext(os.path.basename(main))[0] + ".o")
        cmd = [compiler, opt] + BASE_FLAGS + list(extra) + ["-I" + INCLUDE, main, "-o", out]
        p = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
        assert p.returncode == 0, "%s failed:\n%s" % (" ".join(cmd), p.stderr)
        self.objs[k] = out
        return out

    def objects(self, versions, cc="gcc", opt="-O2", woven=True, main="t.c", extra=()):
        """versions: {label: text of main or {file: text}} -> {label: object path}."""
        vs = {lab: (v if isinstance(v, dict) else {main: v}) for lab, v in versions.items()}
        if woven:
            self.weave(list(vs.values()), main)
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as ex:
            futs = {lab: ex.submit(self.compile, files, main, cc, opt, woven, extra)
                    for lab, files in vs.items()}
            return {lab: f.result() for lab, f in futs.items()}


@pytest.fixture(scope="session")
def builder(tmp_path_factory):
    try:
        import elftools  # noqa: F401
    except ImportError:
        skip("pyelftools is not installed (python3-pyelftools)")
    return Builder(str(tmp_path_factory.mktemp("pb")))
