"""A fix as the sources PROG was built from (tools/moltcc/patch/source.py):
the source root and strip level found from PROG's compile record, the
affected translation units, the original verified against the record (and
a tree that already has the fix), the refusals, --molt-orig, and the build
trees: a recorded compile rerun in a mirror makes the same bytes as in the
real tree (__FILE__ and debug info keep the original paths).

The program is a small git project built by make with CC=moltcc
--molt-updatable=all: sources compiled by relative path, by absolute path,
and from a build subdirectory; -I relative and absolute; one file with the
user's own -ffile-prefix-map."""
import os
import shutil
import subprocess

import pytest

from fixtools import git, moltcc, needs_moltcc, run, write
from harness.moltcc import moltcc_cmd
from harness import tree
from harness.tree import BUILD, have_bindings, skip

from moltcc.errors import Fatal
from moltcc.patch import source as S
from moltcc.patch.diff import ApplyError

PROJECT = {
    ".gitignore": "*.o\n*.a\nprog\nbuild/\ntools/tool\n",
    "include/util.h": """#ifndef UTIL_H
#define UTIL_H
#define SCALE 3
int scale(int x);
int offset(int x);
const char *where(void);
static inline const char *header_file(void) { return __FILE__; }
#endif
""",
    "lib/util.c": """#include <stdio.h>
#include "util.h"
int scale(int x) { return x * SCALE; }
const char *where(void) { return __FILE__; }
const char *where_header(void) { return header_file(); }
""",
    "lib/more.c": """#include "util.h"
#include "more.h"
int offset(int x) { return x + MORE; }
const char *more_file(void) { return __FILE__; }
""",
    "lib/more.h": "#define MORE 5 /* the margin */\n",
    "src/main.c": """#include <stdio.h>
#include "util.h"
#include "local.h"
int compute(int v) { return offset(scale(v)) + LOCAL; }
const char *main_file(void) { return __FILE__; }
int main(void) { printf("%d %s\\n", compute(2), where()); return 0; }
""",
    "src/local.h": "#define LOCAL 1\n",
    "README": "A test project.\n",
    "tools/tool.c": "int main(void) { return 0; }\n",
    "Makefile": """CFLAGS = -O2 -g
all: prog tools/tool
# by absolute path, absolute -I
lib/util.o: lib/util.c
\t$(CC) $(CFLAGS) -I$(CURDIR)/include -c -o $@ $(CURDIR)/lib/util.c
# from a build directory, relative -I, relative source
build/more.o: lib/more.c
\tmkdir -p build && cd build && $(CC) $(CFLAGS) -I../include -I../lib -c ../lib/more.c
# relative, with the user's own prefix map
src/main.o: src/main.c
\t$(CC) $(CFLAGS) -Iinclude -ffile-prefix-map=$(CURDIR)=/proj -c -o $@ src/main.c
lib/libutil.a: lib/util.o build/more.o
\tar rcs $@ $^
prog: src/main.o lib/libutil.a
\t$(CC) -o $@ src/main.o lib/libutil.a
tools/tool: tools/tool.c
\t$(CC) -o $@ tools/tool.c
""",
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    if not have_bindings() or not tree.built("libmolt.so"):
        skip("moltcc needs libclang bindings and libmolt.so in %s" % BUILD)
    for tool in ("make", "git", "diff", "objcopy"):
        if not shutil.which(tool):
            skip("%s is not installed" % tool)
    d = tmp_path_factory.mktemp("fixsrc") / "proj"
    write(d, PROJECT)
    git(["init", "-q"], d)
    git(["add", "-A"], d)
    git(["commit", "-q", "-m", "v1"], d)
    run(["make", "CC=" + " ".join(moltcc_cmd() + ["--molt-updatable=all"])], d)
    return d


@pytest.fixture
def proj(project):
    """The built project, its sources back as committed after the test."""
    yield project
    git(["checkout", "-q", "."], project)
    git(["clean", "-q", "-fd"], project)       # not the ignored build outputs


@pytest.fixture
def prog(project):
    return S.Program(str(project / "prog"))


def edit(root, rel, old, new):
    p = os.path.join(str(root), rel)
    with open(p) as f:
        text = f.read()
    assert old in text, (rel, old)
    with open(p, "w") as f:
        f.write(text.replace(old, new, 1))


def git_diff(root, *args):
    """The working tree's changes as git writes them; the tree is then put
    back (the diff is for the committed sources)."""
    git(["add", "-A"], root)
    data = subprocess.run(["git", "diff", "--cached"] + list(args), cwd=str(root),
                          capture_output=True).stdout
    git(["reset", "-q"], root)
    git(["checkout", "-q", "."], root)
    git(["clean", "-q", "-fd"], root)
    assert data
    return data


def fix_of(prog, *diffs, **kw):
    return S.fix_from_diffs(prog, [("%d.patch" % i, d) for i, d in enumerate(diffs, 1)], **kw)


# -- root and strip level ------------------------------------------------------

def test_root_and_strip_of_git_diff_diff_u_and_no_prefix(proj, prog):
    edit(proj, "include/util.h", "#define SCALE 3", "#define SCALE 4")
    d = git_diff(proj)
    fix = fix_of(prog, d)
    assert fix.root == str(proj) and fix.source == str(proj) and fix.strips == {"1.patch": 1}
    assert list(fix.changed()) == ["include/util.h"]
    f = fix.files["include/util.h"]
    assert f.new == f.orig.replace(b"SCALE 3", b"SCALE 4") and f.already == 0
    # --no-prefix: p0, the same root
    edit(proj, "include/util.h", "#define SCALE 3", "#define SCALE 4")
    fix0 = fix_of(prog, git_diff(proj, "--no-prefix"))
    assert fix0.root == str(proj) and fix0.strips == {"1.patch": 0}
    # diff -u of a copy of the project against it, from their parent:
    # proj.orig/lib/more.h vs proj/lib/more.h.  At p0 the new name is a
    # file PROG was built from: the root is the parent (as patch -p0 would
    # patch proj/lib/more.h from there)
    parent = proj.parent
    shutil.rmtree(parent / "proj.orig", ignore_errors=True)
    os.makedirs(parent / "proj.orig/lib")
    shutil.copy(proj / "lib/more.h", parent / "proj.orig/lib/more.h")
    edit(proj, "lib/more.h", "MORE 5", "MORE 6")
    p = subprocess.run(["diff", "-u", "proj.orig/lib/more.h", "proj/lib/more.h"], cwd=str(parent),
                       capture_output=True)
    fix1 = fix_of(prog, p.stdout)
    assert fix1.root == str(parent) and fix1.strips == {"1.patch": 0}
    assert list(fix1.changed()) == ["proj/lib/more.h"]
    assert [a.rel for a in S.affected_units(prog, fix1)] == ["proj/lib/more.c"]
    # the same diff with the old name first inside the tree: p1
    fix2 = fix_of(prog, p.stdout.replace(b"+++ proj/", b"+++ proj.new/"))
    assert fix2.root == str(proj) and fix2.strips == {"1.patch": 1}
    assert list(fix2.changed()) == ["lib/more.h"]


def test_given_strip_level_is_checked(proj, prog):
    edit(proj, "src/main.c", "+ LOCAL;", "+ LOCAL + 1;")
    d = git_diff(proj)
    assert fix_of(prog, d, strip=1).strips == {"1.patch": 1}
    with pytest.raises(Fatal, match=r"none of the files of 1.patch is a source or header .*"
                                    r"tried -p0"):
        fix_of(prog, d, strip=0)
    # -p2 makes it main.c of the directory src (as patch -p2 run there)
    fix = fix_of(prog, d, strip=2)
    assert fix.root == str(proj / "src") and list(fix.changed()) == ["main.c"]
    # ... but the files of a diff must all be under one root
    edit(proj, "src/main.c", "+ LOCAL;", "+ LOCAL + 1;")
    edit(proj, "include/util.h", "#define SCALE 3", "#define SCALE 4")
    with pytest.raises(Fatal, match=r"^1.patch: with -p2, a/src/main.c is not a file of "
                                    r".*/proj/include$"):
        fix_of(prog, git_diff(proj), strip=2)


# -- affected translation units -------------------------------------------------

def units_of(prog, fix):
    return {a.rel: sorted(a.because) for a in S.affected_units(prog, fix)}


def test_affected_units_of_header_and_source_changes(proj, prog):
    edit(proj, "include/util.h", "#define SCALE 3", "#define SCALE 4")
    assert units_of(prog, fix_of(prog, git_diff(proj))) == {
        "src/main.c": ["include/util.h"], "lib/util.c": ["include/util.h"],
        "lib/more.c": ["include/util.h"]}
    edit(proj, "lib/more.h", "MORE 5", "MORE 7")
    edit(proj, "src/main.c", "+ LOCAL;", "+ LOCAL + 1;")
    units = S.affected_units(prog, fix_of(prog, git_diff(proj)))
    assert [(a.rel, a.because, a.source_changed) for a in units] == [
        ("src/main.c", ["src/main.c"], True), ("lib/more.c", ["lib/more.h"], False)]
    assert all(a.record.woven for a in units)


def test_refusals_come_all_at_once(proj, prog):
    edit(proj, "tools/tool.c", "return 0;", "return 1;")             # not part of prog
    write(proj, {"src/extra.c": "int extra(void) { return 1; }\n",   # a new TU
                 "src/new.h": "#define NEW 1\n"})                     # a new header: fine
    edit(proj, "README", "A test", "The test")                       # documentation: a note
    edit(proj, "src/main.c", "+ LOCAL;", "+ LOCAL + 1;")
    fix = fix_of(prog, git_diff(proj))
    with pytest.raises(S.Refusal) as e:
        S.affected_units(prog, fix)
    assert e.value.items == [
        "src/extra.c: new source files cannot be added by a hot patch yet",
        "tools/tool.c: changed by the fix, but no compile of %s reads it (a file of another "
        "program or a build input moltcc cannot follow)" % (proj / "prog")]
    assert str(e.value).count("\nmoltcc: error: ") == 1
    assert any(n.startswith("README is not read by any compile of prog") for n in fix.notes)
    # documentation the tree does not have (a release tarball without
    # NEWS): left out with a note; the rest goes on
    edit(proj, "src/main.c", "+ LOCAL;", "+ LOCAL + 1;")
    write(proj, {"NEWS": "1.1: fixed\n"})
    d = git_diff(proj)
    fix = fix_of(prog, d.replace(b"new file mode 100644\n", b"")
                 .replace(b"--- /dev/null\n+++ b/NEWS", b"--- a/NEWS\n+++ b/NEWS")
                 .replace(b"@@ -0,0 +1 @@\n", b"@@ -1 +1 @@\n-1.0\n"))
    assert list(fix.changed()) == ["src/main.c"]
    assert fix.notes[0].startswith("NEWS is left out: the fix does not apply to it (1.patch: NEWS "
                                   "does not exist, and the fix changes it)")


def test_a_changed_tu_without_updatable_functions_is_refused(tmp_path, needs_moltcc):
    write(tmp_path, {"a.c": "int a(int x) { return x + 1; }\n",
                     "m.c": "int a(int);\nint main(void) { return a(-1); }\n"})
    moltcc(["-O2", "-o", "prog", "a.c", "m.c"], tmp_path)       # no markers: nothing woven
    old = (tmp_path / "a.c").read_bytes()
    write(tmp_path, {"a.c.new": old.replace(b"+ 1", b"+ 2")})
    p = subprocess.run(["diff", "-u", "a.c", "a.c.new"], cwd=str(tmp_path), capture_output=True)
    prog = S.Program(str(tmp_path / "prog"))
    fix = fix_of(prog, p.stdout)
    with pytest.raises(S.Refusal, match=r"a.c: changed by the fix, but it was compiled without "
                                        r"updatable functions \(nothing in it can be replaced"):
        S.affected_units(prog, fix)


# -- verification ----------------------------------------------------------------

def test_tree_that_already_has_the_fix(proj, prog, tmp_path):
    edit(proj, "include/util.h", "#define SCALE 3", "#define SCALE 4")
    edit(proj, "src/main.c", "+ LOCAL;", "+ LOCAL + 1;")
    d = git_diff(proj)
    (tmp_path / "fix.patch").write_bytes(d)
    git(["apply", str(tmp_path / "fix.patch")], proj)
    fix = fix_of(prog, d)
    committed = git(["show", "HEAD:src/main.c"], proj).stdout.encode()
    f = fix.files["src/main.c"]
    assert f.already == 1 and f.orig == committed and f.new == (proj / "src/main.c").read_bytes()
    assert sorted(n.split(" ")[0] for n in fix.notes) == ["include/util.h", "src/main.c"]
    assert "already has the fix (1.patch)" in fix.notes[0]
    units = S.affected_units(prog, fix)
    builds = S.prepare_builds(prog, fix, units, str(tmp_path / "work"))
    # the tree holds the new version: new builds there, orig in a mirror
    assert {(b.orig.tree, b.new.tree) for b in builds} == {("mirror", "real")}
    for b in builds:
        assert b.orig.run(b.orig_object)[0] == 0 and b.new.run(b.new_object)[0] == 0


def test_series_with_the_first_diff_already_applied(proj, prog, tmp_path):
    edit(proj, "include/util.h", "#define SCALE 3", "#define SCALE 4")
    first = git_diff(proj)
    (tmp_path / "01.patch").write_bytes(first)
    git(["apply", str(tmp_path / "01.patch")], proj)
    git(["commit", "-q", "-a", "-m", "01"], proj)
    edit(proj, "include/util.h", "#define SCALE 4", "#define SCALE 5")
    edit(proj, "src/main.c", "+ LOCAL;", "+ LOCAL + 1;")
    second = git_diff(proj)
    git(["reset", "-q", "--hard", "HEAD~1"], proj)
    # the tree has 01 applied, not 02
    git(["apply", str(tmp_path / "01.patch")], proj)
    fix = fix_of(prog, first, second)
    h = fix.files["include/util.h"]
    assert h.already == 1 and b"SCALE 3" in h.orig and b"SCALE 5" in h.new
    m = fix.files["src/main.c"]
    assert m.already == 0 and b"LOCAL + 1" in m.new
    # the second alone does not apply to what PROG was built from
    git(["checkout", "-q", "."], proj)
    with pytest.raises(ApplyError, match=r"1.patch: hunk 1 of include/util.h does not apply at "
                                         r"line 1: line 3 is '#define SCALE 3', the fix expects "
                                         r"'#define SCALE 4'"):
        fix_of(prog, second)


def test_sources_changed_since_the_build_are_refused(proj, prog, tmp_path):
    edit(proj, "src/main.c", "+ LOCAL;", "+ LOCAL + 1;")
    d = git_diff(proj)
    edit(proj, "src/main.c", "int main(void)", "int main (void)")   # not the fix
    with pytest.raises(Fatal, match=r"^src/main.c changed since .*/prog was built \(its sha256 "
                                    r"differs from prog's compile record, with or without the "
                                    r"fix\); moltcc needs the sources .* \(--molt-source DIR\)$"):
        fix_of(prog, d)
    git(["checkout", "-q", "."], proj)
    # a header the affected TU read, not changed by the fix, changed anyway
    edit(proj, "src/local.h", "LOCAL 1", "LOCAL 2")
    fix = fix_of(prog, d)
    units = S.affected_units(prog, fix)
    with pytest.raises(S.Refusal, match=r"src/local.h changed since .* \(its sha256 differs from "
                                        r"the compile record of src/main.c\)"):
        S.prepare_builds(prog, fix, units, str(tmp_path / "w"))


def test_molt_orig_trees_and_files(proj, prog, tmp_path):
    new = tmp_path / "new"
    shutil.copytree(proj, new, ignore=shutil.ignore_patterns(".git", "*.o", "*.a", "prog"))
    edit(new, "lib/more.h", "MORE 5", "MORE 8")
    edit(new, "lib/util.c", "x * SCALE", "x * SCALE + 0")
    fix = S.fix_from_trees(prog, str(proj), [str(new)])
    assert fix.root == str(proj) and sorted(fix.changed()) == ["lib/more.h", "lib/util.c"]
    assert fix.files["lib/more.h"].orig == (proj / "lib/more.h").read_bytes()
    assert {a.rel for a in S.affected_units(prog, fix)} == {"lib/util.c", "lib/more.c"}
    # single files, paired by the longest tail of their path found in OLD
    fix = S.fix_from_trees(prog, str(proj), [str(new / "lib/more.h")])
    assert list(fix.changed()) == ["lib/more.h"]
    other = tmp_path / "elsewhere.c"
    other.write_text("int x;\n")
    with pytest.raises(Fatal, match="has no counterpart in"):
        S.fix_from_trees(prog, str(proj), [str(other)])
    # OLD must be what PROG was built from
    edit(proj, "lib/more.h", "MORE 5", "MORE 9")
    with pytest.raises(Fatal, match=r"lib/more.h changed since .*prog was built"):
        S.fix_from_trees(prog, str(proj), [str(new)])


def test_old_form_new_files_paired_by_path(proj, prog, tmp_path):
    new = tmp_path / "v2"
    write(new, {"lib/more.c": (proj / "lib/more.c").read_text().replace("x + MORE", "x - MORE"),
                "local.h": "#define LOCAL 2\n"})
    fix = S.fix_from_new_files(prog, [str(new / "lib/more.c"), str(new / "local.h")])
    assert fix.root == str(proj)
    assert sorted(fix.changed()) == ["lib/more.c", "src/local.h"]
    assert [a.rel for a in S.affected_units(prog, fix)] == ["src/main.c", "lib/more.c"]
    write(new, {"util.c": "int x;\n"})                  # by its name alone
    one = S.fix_from_new_files(prog, [str(new / "util.c")])
    assert one.root == str(proj / "lib") and list(one.changed()) == ["util.c"]
    with pytest.raises(Fatal, match="is not the new version of a file"):
        S.fix_from_new_files(prog, [str(new / "nothing.c")])
    with pytest.raises(Fatal, match="is the file .* was built from, not a new version"):
        S.fix_from_new_files(prog, [str(proj / "lib/more.c")])


# -- build trees -------------------------------------------------------------------

def objects(builds, variant):
    out = {}
    for b in builds:
        c = getattr(b, variant)
        obj = getattr(b, variant + "_object")
        rc, err = c.run(obj)
        assert rc == 0, (c.argv(output=obj), c.cwd, err)
        with open(obj, "rb") as f:
            out[b.rel] = f.read()
    return out


def test_mirror_compiles_the_same_bytes_as_the_real_tree(proj, prog, tmp_path):
    """Every TU of PROG (absolute source and -I, a build directory,
    relative paths, a user prefix map; __FILE__ in sources and in a header):
    compiled in a mirror, it is byte for byte the object of the real tree,
    debug info included."""
    # a comment-only change of a header all TUs read, same line count:
    # the new version compiles to the same bytes too
    edit(proj, "include/util.h", "int scale(int x);", "int scale(int x); /* x times */")
    fix = fix_of(prog, git_diff(proj))
    units = S.affected_units(prog, fix)
    assert {a.rel for a in units} == {"src/main.c", "lib/util.c", "lib/more.c"}
    real = S.prepare_builds(prog, fix, units, str(tmp_path / "real"))
    mirror = S.prepare_builds(prog, fix, units, str(tmp_path / "mirror"), force_mirror=True)
    assert {b.orig.tree for b in real} == {"real"} and {b.new.tree for b in real} == {"mirror"}
    assert {b.orig.tree for b in mirror} == {"mirror"}
    by = {b.rel: b for b in mirror}
    # the command lines: absolute paths under the root point into the mirror
    util = by["lib/util.c"].orig
    top = str(tmp_path / "mirror" / "orig")
    assert util.cwd == top + str(proj)
    assert util.input == top + str(proj / "lib/util.c")
    assert "-I" + top + str(proj / "include") in util.flags
    assert util.flags[-1] == "-ffile-prefix-map=%s=" % top
    more = by["lib/more.c"].orig
    assert more.cwd == top + str(proj / "build") and more.input == "../lib/more.c"
    main = by["src/main.c"].orig
    assert main.flags[-2:] == ["-ffile-prefix-map=%s=" % top,
                               "-ffile-prefix-map=%s=/proj" % (top + str(proj))]
    a, b, c = objects(real, "orig"), objects(mirror, "orig"), objects(mirror, "new")
    assert a == b
    assert a == c
    # and __FILE__ really is in there, as the build had it
    assert (str(proj / "lib/util.c")).encode() in a["lib/util.c"]
    assert (str(proj / "include/util.h")).encode() in a["lib/util.c"]
    assert b"../lib/more.c" in a["lib/more.c"]
    assert b"/proj/include/util.h" not in a["src/main.c"] and b"src/main.c" in a["src/main.c"]


def test_new_builds_see_the_fix_and_new_headers(proj, prog, tmp_path):
    write(proj, {"src/new.h": "#define EXTRA 40\n"})
    edit(proj, "src/main.c", '#include "local.h"', '#include "local.h"\n#include "new.h"')
    edit(proj, "src/main.c", "+ LOCAL;", "+ LOCAL + EXTRA;")
    fix = fix_of(prog, git_diff(proj))
    (b,) = S.prepare_builds(prog, fix, S.affected_units(prog, fix), str(tmp_path / "w"))
    assert b.rel == "src/main.c" and b.source_changed and b.woven
    assert b.orig.tree == "real" and b.new.tree == "mirror"
    assert b.orig_text == (proj / "src/main.c").read_bytes() and b"EXTRA" in b.new_text
    with open(b.new.source, "rb") as f:
        assert f.read() == b.new_text
    assert b.orig.run(b.orig_object)[0] == 0
    rc, err = b.new.run(b.new_object)
    assert rc == 0, err
    def compute(obj):
        out = run(["objdump", "-d", obj], tmp_path).stdout
        return out.split("<compute>:")[1].split("\n\n")[0]
    # compute(v) = offset(scale(v)) + LOCAL + EXTRA: 1 + 40
    assert "$0x29," in compute(b.new_object) and "$0x29," not in compute(b.orig_object)


def test_molt_source_moves_the_tree(proj, prog, tmp_path):
    edit(proj, "lib/more.h", "MORE 5", "MORE 6")
    d = git_diff(proj)
    moved = tmp_path / "moved"
    shutil.copytree(proj, moved, ignore=shutil.ignore_patterns(".git"))
    edit(proj, "lib/more.c", "x + MORE", "x - MORE")      # the old place is no longer it
    fix = fix_of(prog, d, source=str(moved))
    assert fix.root == str(proj) and fix.source == str(moved)
    units = S.affected_units(prog, fix)
    (b,) = S.prepare_builds(prog, fix, units, str(tmp_path / "w"))
    assert (b.orig.tree, b.new.tree) == ("mirror", "mirror")
    git(["checkout", "-q", "."], proj)
    # paths stay those of the build: the same object as in the real tree
    real = S.prepare_builds(prog, fix_of(prog, d), units, str(tmp_path / "real"))
    assert objects([b], "orig") == objects(real, "orig")


# -- the command line -----------------------------------------------------------

def test_command_line_errors(proj, tmp_path):
    edit(proj, "src/main.c", "+ LOCAL;", "+ LOCAL + 1;")
    (tmp_path / "fix.patch").write_bytes(git_diff(proj))
    base = ["--molt-patch", "--molt-target", str(proj / "prog"), "-o", "fix.so"]
    r = moltcc(base + ["--molt-diff", "fix.patch", "-p", "3"], tmp_path, check=False)
    assert r.returncode == 1 and r.stderr.startswith(
        "moltcc: error: none of the files of fix.patch is a source or header "), r.stderr
    assert "tried -p3" in r.stderr
    r = moltcc(base + ["--molt-diff", "fix.patch", "-p0"], tmp_path, check=False)
    assert "tried -p0" in r.stderr
    r = moltcc(base + ["--molt-strip", "1"], tmp_path, check=False)
    assert r.stderr == "moltcc: error: --molt-strip is only meaningful with --molt-diff\n"
    edit(proj, "src/main.c", "int main(void)", "int main (void)")
    r = moltcc(base + ["--molt-diff", "fix.patch"], tmp_path, check=False)
    assert r.returncode == 1 and r.stderr.startswith("moltcc: error: src/main.c changed since ")
    assert len(r.stderr.splitlines()) == 1
    assert not os.path.exists(tmp_path / "fix.so")
    # without --molt-diff, -p stays gcc's option (profiling): a program build
    write(tmp_path, {"p.c": "int main(void) { return 0; }\n"})
    r = moltcc(["-p", "-c", "p.c", "-o", "p.o"], tmp_path)
    assert os.path.exists(tmp_path / "p.o")
    assert "mcount" in run(["nm", "p.o"], tmp_path).stdout
