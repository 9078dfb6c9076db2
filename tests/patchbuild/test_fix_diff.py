"""The unified-diff reader and in-memory applier (tools/moltcc/patch/diff.py)
on diffs made by the real tools: `diff -u`, `diff -ruN`, `git diff`,
`git format-patch`, a quilt/DEP-3 patch; offsets, failures, reversal,
series.  Every expected result is the file the tools themselves had."""
import os
import shutil
import subprocess

import pytest

from fixtools import git, write
from harness.tree import skip

from moltcc.patch import diff as D


def lines(n, tag="line"):
    return "".join("%s %d\n" % (tag, i) for i in range(1, n + 1))


def diff_u(tmp_path, old, new, name="x.c", args=("-u",)):
    """`diff -u a/name b/name` of two texts (bytes)."""
    if not shutil.which("diff"):
        skip("diff is not installed")
    for side, text in (("a", old), ("b", new)):
        write(tmp_path / side, {name: text})
    p = subprocess.run(["diff"] + list(args) + ["a/" + name, "b/" + name], cwd=str(tmp_path),
                       capture_output=True)
    assert p.returncode == 1, p.stderr
    return p.stdout


def apply_all(data, files, name="fix.patch", strip=1, reverse=False):
    """files: {path: bytes or None}; returns the new {path: bytes or None}."""
    d = D.parse(data, name)
    out = dict(files)
    for fd in d.files:
        rel = D.strip_path(fd.names()[0], strip)
        out[rel] = D.apply(out.get(rel), fd, rel, name, reverse=reverse)
    return out


def test_diff_u_several_hunks(tmp_path):
    old = lines(200).encode()
    L = old.decode().splitlines(True)
    L[9] = "changed 10\n"
    del L[99:102]
    L.insert(150, "inserted\n")
    L[-1] = "last changed\n"
    new = "".join(L).encode()
    data = diff_u(tmp_path, old, new)
    d = D.parse(data, "fix.patch")
    assert len(d.files) == 1 and len(d.files[0].hunks) == 4
    fd = d.files[0]
    assert fd.old_name == "a/x.c" and fd.new_name == "b/x.c"   # timestamps after the tab
    assert not fd.creates and not fd.deletes
    assert D.apply(old, fd, "x.c", "fix.patch") == new
    assert D.apply(new, fd, "x.c", "fix.patch", reverse=True) == old


def test_diff_U0_and_unified_context_variants(tmp_path):
    old = lines(40).encode()
    new = old.replace(b"line 20\n", b"line 20\nnew 20a\n").replace(b"line 3\n", b"")
    for args in (("-U0",), ("-U1",), ("-U5",)):
        data = diff_u(tmp_path, old, new, args=args)
        assert apply_all(data, {"x.c": old})["x.c"] == new, args


def test_diff_ruN_creates_and_removes_files(tmp_path):
    if not shutil.which("diff"):
        skip("diff is not installed")
    write(tmp_path / "a", {"keep.c": lines(5), "gone.h": "#define GONE 1\n"})
    write(tmp_path / "b", {"keep.c": lines(5).replace("line 3", "line three"),
                           "sub/new.h": "#define NEW 1\n"})
    p = subprocess.run(["diff", "-ruN", "a", "b"], cwd=str(tmp_path), capture_output=True)
    assert p.returncode == 1
    d = D.parse(p.stdout, "fix.patch")
    by = {D.strip_path(fd.names()[0], 1): fd for fd in d.files}
    assert set(by) == {"keep.c", "gone.h", "sub/new.h"}
    # diff -N writes the missing side with the epoch as its time
    assert by["sub/new.h"].creates and not by["sub/new.h"].deletes
    assert by["gone.h"].deletes and not by["gone.h"].creates
    out = apply_all(p.stdout, {"keep.c": lines(5).encode(), "gone.h": b"#define GONE 1\n"})
    assert out == {"keep.c": lines(5).replace("line 3", "line three").encode(),
                   "gone.h": None, "sub/new.h": b"#define NEW 1\n"}


@pytest.fixture
def repo(tmp_path):
    if not shutil.which("git"):
        skip("git is not installed")
    r = tmp_path / "repo"
    r.mkdir()
    git(["init", "-q"], r)
    return r


def commit_all(r, msg="c"):
    git(["add", "-A"], r)
    git(["commit", "-q", "-m", msg], r)


def test_git_diff_new_deleted_quoted_no_newline_crlf(repo):
    files = {
        "src/a.c": lines(30),
        "src/old.h": "#define OLD 1\n",
        "src/noeol.c": "int x;\nint y;",                         # no newline at the end
        "src/dos.c": "int a;\r\nint b;\r\nint c;\r\n",          # CRLF kept as is
        "src/caf\u00e9 file.c": "int q;\n",                      # quoted by git
        "src/empty.h": "/* removed, so it becomes empty */\n",
    }
    write(repo, files)
    commit_all(repo)
    write(repo, {"src/a.c": lines(30).replace("line 7\n", "line seven\n"),
                 "src/noeol.c": "int x;\nint y = 2;",
                 "src/dos.c": "int a;\r\nint b = 2;\r\nint c;\r\n",
                 "src/caf\u00e9 file.c": "int q = 1;\n",
                 "src/new.h": "#define NEW 2\n",
                 "src/new-empty.h": "",                          # created empty: no hunk
                 "src/empty.h": ""})
    os.unlink(repo / "src/old.h")
    git(["add", "-A"], repo)
    data = subprocess.run(["git", "diff", "--cached"], cwd=str(repo), capture_output=True).stdout
    assert b'"a/src/caf\\303\\251 file.c"' in data            # git's C quoting
    assert b"\\ No newline at end of file" in data
    d = D.parse(data, "git.patch")
    got = {D.strip_path(fd.names()[0], 1): fd for fd in d.files}
    assert set(got) == {"src/a.c", "src/old.h", "src/noeol.c", "src/dos.c",
                        "src/caf\u00e9 file.c", "src/new.h", "src/new-empty.h", "src/empty.h"}
    assert got["src/new.h"].creates and got["src/new-empty.h"].creates
    assert got["src/old.h"].deletes and not got["src/empty.h"].deletes
    before = {k: v.encode() for k, v in files.items()}
    out = apply_all(data, before, "git.patch")
    for k in ("src/a.c", "src/noeol.c", "src/dos.c", "src/caf\u00e9 file.c", "src/new.h",
              "src/new-empty.h", "src/empty.h"):
        with open(repo / k, "rb") as f:
            assert out[k] == f.read(), k
    assert out["src/old.h"] is None and out["src/empty.h"] == b""
    assert out["src/dos.c"].count(b"\r\n") == 3
    # and back
    back = apply_all(data, out, "git.patch", reverse=True)
    assert {k: v for k, v in back.items() if v is not None} == before
    assert back["src/new.h"] is None and back["src/new-empty.h"] is None


def test_git_binary_rename_and_copy_are_refused(repo):
    write(repo, {"logo.bin": b"\x00\x01\x02binary\x00", "src/a.c": lines(20)})
    commit_all(repo)
    write(repo, {"logo.bin": b"\x00\x01\x03binary\x00"})
    data = subprocess.run(["git", "diff"], cwd=str(repo), capture_output=True).stdout
    assert b"Binary files" in data
    with pytest.raises(D.DiffError, match=r"logo\.bin: a binary change cannot be built"):
        D.parse(data, "bin.patch")
    data = subprocess.run(["git", "diff", "--binary"], cwd=str(repo), capture_output=True).stdout
    assert b"GIT binary patch" in data
    with pytest.raises(D.DiffError, match="binary change"):
        D.parse(data, "bin.patch")
    git(["checkout", "-q", "."], repo)
    git(["mv", "src/a.c", "src/b.c"], repo)
    data = subprocess.run(["git", "diff", "--cached", "-M"], cwd=str(repo),
                          capture_output=True).stdout
    assert b"rename from" in data
    with pytest.raises(D.DiffError, match=r"renamed or copied files cannot be built into a hot "
                                          r"patch"):
        D.parse(data, "mv.patch")


def test_format_patch_mail_with_signature(repo):
    write(repo, {"x.c": lines(12)})
    commit_all(repo)
    write(repo, {"x.c": lines(12).replace("line 6", "line six")})
    commit_all(repo, "fix: six\n\nA body line.\n--- not a file header\n")
    mail = subprocess.run(["git", "format-patch", "-1", "--stdout"], cwd=str(repo),
                          capture_output=True).stdout
    assert mail.startswith(b"From ") and b"\n--- not a file header\n" in mail
    assert b"\n-- \n" in mail                   # the signature after the last hunk
    d = D.parse(mail, "0001-fix.patch")
    assert len(d.files) == 1 and b"Subject:" in d.preamble
    out = apply_all(mail, {"x.c": lines(12).encode()})
    assert out["x.c"] == lines(12).replace("line 6", "line six").encode()


QUILT = b"""Description: fix an off-by-one in the parser
 The length check did not count the terminator.
Author: A Maintainer <am@example.org>
Origin: upstream, https://example.org/commit/123
Bug-Debian: https://bugs.debian.org/1
Last-Update: 2024-01-01
---
 src/parse.c |    2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

Index: pkg-1.0/src/parse.c
===================================================================
--- pkg-1.0.orig/src/parse.c
+++ pkg-1.0/src/parse.c
@@ -2,7 +2,7 @@
 int parse(const char *s, int n)
 {
     char buf[16];
-    if (n > 16)
+    if (n >= 16)
         return -1;
     memcpy(buf, s, n);
     buf[n] = 0;
"""

PARSE_C = b"""#include <string.h>
int parse(const char *s, int n)
{
    char buf[16];
    if (n > 16)
        return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    return buf[0];
}
"""


def test_quilt_dep3_header():
    d = D.parse(QUILT, "debian/patches/fix.patch")
    assert len(d.files) == 1
    fd = d.files[0]
    assert fd.names() == ["pkg-1.0.orig/src/parse.c", "pkg-1.0/src/parse.c"]
    assert D.strip_path(fd.names()[0], 1) == "src/parse.c"
    assert b"Description:" in d.preamble and b"Index:" in d.preamble
    new = D.apply(PARSE_C, fd, "src/parse.c", "fix.patch")
    assert new == PARSE_C.replace(b"n > 16", b"n >= 16")


def test_offsets_both_ways_and_lost_space_of_empty_context(tmp_path):
    old = (lines(10) + "\n" + lines(10, "tail")).encode()     # an empty line as context
    new = old.replace(b"line 9\n", b"line nine\n").replace(b"tail 2\n", b"tail two\n")
    data = diff_u(tmp_path, old, new)
    d = D.parse(data, "fix.patch")
    assert len(d.files[0].hunks) == 1
    # mailers drop the space of an empty context line
    mangled = data.replace(b"\n \n", b"\n\n")
    assert mangled != data
    fd = D.parse(mangled, "fix.patch").files[0]
    assert D.apply(old, fd, "x.c", "fix.patch") == new
    # the file grew / shrank above the hunk: found by the outward search
    grown = lines(7, "extra").encode() + old
    assert D.apply(grown, fd, "x.c", "f") == lines(7, "extra").encode() + new
    shrunk = old.replace(b"line 1\nline 2\nline 3\n", b"")
    assert D.apply(shrunk, fd, "x.c", "f") == new.replace(b"line 1\nline 2\nline 3\n", b"")


def test_later_hunks_follow_the_offset_of_earlier_ones(tmp_path):
    # two identical contexts; the first hunk is found 50 lines down, so the
    # second is looked for 50 lines down too, and lands on the second
    # block, not on the first one (which is nearer to its stated line)
    block = "a\nb\nc\nd\ne\nf\ng\n"
    old = (lines(20, "u") + block + lines(20) + block + lines(20, "z")).encode()
    new = old.decode().replace("u 10\n", "u ten\n")
    k = new.index("d\n", new.index("line 20\n"))
    new = (new[:k] + "D\n" + new[k + 2:]).encode()
    data = diff_u(tmp_path, old, new)
    fd = D.parse(data, "f").files[0]
    assert len(fd.hunks) == 2
    grown = b"x\n" * 50 + old
    assert D.apply(grown, fd, "x.c", "f") == b"x\n" * 50 + new


def test_a_hunk_that_does_not_apply_is_named_precisely(tmp_path):
    old = lines(60).encode()
    new = old.replace(b"line 10\n", b"line ten\n").replace(b"line 40\n", b"line forty\n")
    data = diff_u(tmp_path, old, new)
    fd = D.parse(data, "fix.patch").files[0]
    other = old.replace(b"line 41\n", b"line 41 (local change)\n")
    with pytest.raises(D.ApplyError) as e:
        D.apply(other, fd, "src/x.c", "fix.patch")
    msg = str(e.value)
    assert msg.startswith("fix.patch: hunk 2 of src/x.c does not apply at line 37")
    assert "line 41 is 'line 41 (local change)', the fix expects 'line 41'" in msg
    assert "the tree differs from the one the fix was made for" in msg
    # exact context, no fuzz: one differing context line is enough
    with pytest.raises(D.ApplyError):
        D.apply(old.replace(b"line 8\n", b"line 8 \n"), fd, "src/x.c", "fix.patch")
    # changing a file the fix creates, creating one that exists
    with pytest.raises(D.ApplyError, match="does not exist, and the fix changes it"):
        D.apply(None, fd, "src/x.c", "fix.patch")


def test_series_in_order(tmp_path):
    v0 = lines(30).encode()
    v1 = v0.replace(b"line 5\n", b"line five\n")
    v2 = v1.replace(b"line five\n", b"line 5 again\n").replace(b"line 25\n", b"")
    p1 = diff_u(tmp_path / "1", v0, v1)
    p2 = diff_u(tmp_path / "2", v1, v2)
    f1 = D.parse(p1, "01.patch").files[0]
    f2 = D.parse(p2, "02.patch").files[0]
    assert D.apply(D.apply(v0, f1, "x.c", "01"), f2, "x.c", "02") == v2
    with pytest.raises(D.ApplyError, match="02.patch: hunk 1 of x.c"):
        D.apply(v0, f2, "x.c", "02.patch")     # out of order


def test_malformed_diffs(tmp_path):
    old = lines(30).encode()
    data = diff_u(tmp_path, old, old.replace(b"line 5\n", b"line V\n")
                  .replace(b"line 25\n", b"line XXV\n"))
    with pytest.raises(D.DiffError, match="truncated"):
        D.parse(data[:-20], "cut.patch")
    with pytest.raises(D.DiffError, match="not a unified diff"):
        D.parse(b"just text\n", "t.patch")
    bad = data.replace(b"@@ -2,7 +2,7 @@", b"@@ -2,9 +2,7 @@")
    assert bad != data
    with pytest.raises(D.DiffError, match="hunk 1 of b/x.c has 2 old and 0 new lines fewer than "
                                          "its header says"):
        D.parse(bad, "bad.patch")
    with pytest.raises(D.DiffError, match="Only in"):
        D.parse(data + b"Only in b: extra.c\n", "r.patch")


def test_strip_path():
    assert D.strip_path("a/src/x.c", 0) == "a/src/x.c"
    assert D.strip_path("a/src/x.c", 1) == "src/x.c"
    assert D.strip_path("a//src/x.c", 1) == "src/x.c"
    assert D.strip_path("./src/x.c", 1) == "src/x.c"
    assert D.strip_path("a/src/x.c", 2) == "x.c"
    assert D.strip_path("a/src/x.c", 3) is None
    assert D.strip_path("/abs/x.c", 0) is None            # outside the tree
    assert D.strip_path("/abs/x.c", 1) == "abs/x.c"
    assert D.strip_path("a/../../etc/passwd", 1) is None
