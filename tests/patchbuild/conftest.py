"""Fixtures for the patch-builder unit tests: real compiles of small C
sources, woven the way a program build weaves them, compared with
moltcc.patch.objdiff / moltcc.patch.typecheck.

Woven objects are made as the patch builder will make them: moltcc
(--molt-updatable=all --molt-keep) weaves the source, the kept generated
source is compiled with gcc or clang-14 and `-ffunction-sections
-fdata-sections -g -c`.  All versions a test needs are woven by one moltcc
run (the slow part is loading libclang) and woven sources are cached for the
session, so the gcc/clang and -O0/-O2 variants reuse them.

moltcc, the build tree and skipping are harness.moltcc's and harness.tree's
(tests/README.md): missing prerequisites skip, except under
MOLT_REQUIRE_ALL=1 (CI): then they fail.
"""
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess

import pytest

from harness import moltcc as _moltcc
from harness.tree import INCLUDE, skip, write_file
from harness.tree import pytest_runtest_makereport  # noqa: F401 (the hook)

COMPILERS = {"gcc": "gcc", "clang": "clang-14"}
BASE_FLAGS = ["-ffunction-sections", "-fdata-sections", "-g", "-c"]


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
            write_file(d, n, text)

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
        p = _moltcc.moltcc(["--molt-keep", "--molt-updatable=all", "-c"] + rels, top,
                           env={"TMPDIR": tmp, "MOLT_CC": "gcc"})
        if p.rc != 0 and ("No module named 'clang'" in p.err or "libclang" in p.err):
            skip("moltcc needs Debian's python3-clang-14: " + p.err.strip().splitlines()[-1])
        assert p.rc == 0, "moltcc failed:\n" + p.err
        m = re.search(r"generated sources kept in (\S+)", p.err)
        assert m, p.err
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
