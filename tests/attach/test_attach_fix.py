"""Attach patches built from a fix by the two-version builder: `moltcc
--molt-patch --molt-target PROG --molt-diff FIX.patch -o fix.so FLAGS` for
a program built without moltcc (plain/: server.c + store.c, gcc -O2 -g).

The fix (plain/fix_bounds.patch) is a real unified diff of store.c: an
off-by-one bound in a static function the compiler inlines into lookup()
(record 8, "secret", is served before it and "none" after), and the step
of a static local counter (next_id).  store.c and server.c both have a
static `served`: the patch must count in store.c's.  Checked: the patch
builds, `molt attach` applies it under a checking load with no failed or
wrong reply, the fix is live, the static local keeps its value, rollback
restores the original bytes; a fix that changes a struct layout is refused
with the change listed; missing flags, missing sources, wrong flags and a
static local without -g give clear errors.  Runs as root (ptrace).
"""
import os
import re
import shutil
import socket
import subprocess
import threading

import pytest

from harness.tree import bin_path, skip

HERE = os.path.dirname(os.path.abspath(__file__))
PLAIN = os.path.join(HERE, "plain")
MOLT = bin_path("molt")
MOLTCC = bin_path("moltcc")
FLAGS = ["-O2", "-g", "-pthread"]


def sh(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300,
                          **kw)


def make_tree(d, flags=FLAGS, name="plainsrv"):
    """A copy of plain/ built as its own build would (gcc, no molt)."""
    os.makedirs(d, exist_ok=True)
    for f in ("server.c", "store.c", "store.h"):
        shutil.copy(os.path.join(PLAIN, f), os.path.join(d, f))
    r = sh(["gcc"] + flags + ["-o", name, "server.c", "store.c"], cwd=d)
    assert r.returncode == 0, r.stderr
    return os.path.join(d, name)


def moltcc(tree, target, diff, out, *flags, extra=()):
    return sh([MOLTCC, "--molt-patch", "--molt-target", target, "--molt-diff",
               os.path.join(PLAIN, diff), "-o", out] + list(extra) + list(flags), cwd=tree)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    if os.geteuid() != 0:
        scope = open("/proc/sys/kernel/yama/ptrace_scope").read().strip() \
            if os.path.exists("/proc/sys/kernel/yama/ptrace_scope") else "absent"
        if scope not in ("0", "absent"):
            skip("molt attach needs ptrace: run as root (yama ptrace_scope=%s)" % scope)
    d = str(tmp_path_factory.mktemp("plain") / "src")
    exe = make_tree(d)
    return d, exe


class Server:
    def __init__(self, exe, workers=8):
        self.p = subprocess.Popen([exe, str(workers)], stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        assert line.startswith("port "), line
        self.port = int(line.split()[1])
        self.pid = self.p.pid

    def connect(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return s, s.makefile("rw")

    def q(self, *lines):
        s, f = self.connect()
        out = []
        for line in lines:
            f.write(line + "\n")
            f.flush()
            out.append(f.readline().strip())
        s.close()
        return out

    def close(self):
        if os.path.exists("/run/molt/attach/%d" % self.pid):
            sh([MOLT, "rollback", self.pid])
        self.p.kill()
        self.p.wait()


class Load:
    """Clients on kept connections asking for valid records: every answer
    must be that record's name, before, during and after the attach."""

    def __init__(self, srv, nclients=4):
        self.srv, self.stop, self.errors, self.count = srv, False, [], 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.client, args=(i,)) for i in range(nclients)]
        for t in self.threads:
            t.start()

    def client(self, i):
        try:
            s, f = self.srv.connect()
            n = 0
            while not self.stop:
                k = (n + i) % 8
                n += 1
                f.write("get %d\n" % k)
                f.flush()
                got = f.readline().strip()
                if got != "name%d" % k:
                    with self.lock:
                        self.errors.append("get %d: %r" % (k, got))
                    return
                with self.lock:
                    self.count += 1
            s.close()
        except Exception as e:  # a refused or broken connection is a failure
            with self.lock:
                self.errors.append("client %d: %r" % (i, e))

    def finish(self):
        self.stop = True
        for t in self.threads:
            t.join(30)
        return self.errors


def text_bytes(exe, pid, name, n=32):
    nm = sh(["nm", exe]).stdout
    value = int(re.search(r"^([0-9a-f]+) T %s$" % name, nm, re.M).group(1), 16)
    real = os.path.realpath(exe)
    for line in open("/proc/%d/maps" % pid):
        f = line.split()
        if len(f) >= 6 and f[5] == real and int(f[2], 16) == 0:
            base = int(f[0].split("-")[0], 16)
            break
    with open("/proc/%d/mem" % pid, "rb") as m:
        m.seek(base + value)
        return m.read(n)


def test_fix_built_attached_live_and_rolled_back(tree, tmp_path):
    d, exe = tree
    so = str(tmp_path / "fix.so")
    r = moltcc(d, exe, "fix_bounds.patch", so, *FLAGS)
    assert r.returncode == 0, r.stderr
    assert re.search(r"replaced \(2\): lookup \(store.c\), next_id \(store.c\)", r.stderr), r.stderr
    marks = sh(["readelf", "-p", ".molt_attach", so]).stdout
    assert "replace lookup" in marks and "replace next_id" in marks, marks
    srv = Server(exe)
    try:
        before = text_bytes(exe, srv.pid, "lookup")
        assert srv.q("get 8", "get 3", "first") == ["secret", "name3", "name0"]
        assert srv.q("id", "id") == ["1", "2"]
        load = Load(srv)
        a = sh([MOLT, "attach", srv.pid, so])
        assert a.returncode == 0, a.stderr
        assert "2 functions (lookup, next_id)" in a.stdout, a.stdout
        assert srv.q("get 8", "get 9", "get 3", "first") == ["none", "none", "name3", "name0"]
        # the live counter (a static local found through DWARF) goes on
        assert srv.q("id", "id") == ["12", "22"]
        # store.c's `served`, not server.c's namesake: lookups only
        lookups, requests = map(int, srv.q("stats")[0].split())
        st = sh([MOLT, "status", srv.pid])
        assert "applied" in st.stdout and "lookup" in st.stdout, st.stdout
        errors = load.finish()
        assert not errors, errors[:5]
        assert load.count > 0
        assert lookups < requests, (lookups, requests)
        rb = sh([MOLT, "rollback", srv.pid])
        assert rb.returncode == 0, rb.stderr
        assert text_bytes(exe, srv.pid, "lookup") == before
        assert srv.q("get 8", "id") == ["secret", "23"]
    finally:
        srv.close()


def test_served_counts_in_store_c(tree, tmp_path):
    """After the attach, lookups count in store.c's `served` only: both
    counters are read back and compared with the requests sent."""
    d, exe = tree
    so = str(tmp_path / "fix.so")
    assert moltcc(d, exe, "fix_bounds.patch", so, *FLAGS).returncode == 0
    srv = Server(exe, workers=2)
    try:
        assert sh([MOLT, "attach", srv.pid, so]).returncode == 0
        s0 = list(map(int, srv.q("stats")[0].split()))
        srv.q(*["get 1"] * 10)
        s1 = list(map(int, srv.q("stats")[0].split()))
        # 10 lookups (store.c's counter) and 11 requests (server.c's: the
        # 10 gets and the second stats)
        assert s1[0] - s0[0] == 10, (s0, s1)
        assert s1[1] - s0[1] == 11, (s0, s1)
    finally:
        srv.close()


def test_attach_alias(tree, tmp_path):
    """--molt-attach with a fix is the same build."""
    d, exe = tree
    so = str(tmp_path / "alias.so")
    r = sh([MOLTCC, "--molt-attach", "--molt-target", exe, "--molt-diff",
            os.path.join(PLAIN, "fix_bounds.patch"), "-o", so] + FLAGS, cwd=d)
    assert r.returncode == 0, r.stderr
    assert "replace lookup" in sh(["readelf", "-p", ".molt_attach", so]).stdout


def test_layout_change_refused(tree, tmp_path):
    d, exe = tree
    so = str(tmp_path / "layout.so")
    r = moltcc(d, exe, "fix_layout.patch", so, *FLAGS)
    assert r.returncode != 0
    assert "cannot be carried by a hot patch" in r.stderr, r.stderr
    assert "struct record" in r.stderr, r.stderr
    assert not os.path.exists(so)


def test_missing_flags(tmp_path):
    """A program without DWARF and no flags on the command line."""
    d = str(tmp_path / "src")
    exe = make_tree(d, ["-O2", "-pthread"])
    r = moltcc(d, exe, "fix_bounds.patch", str(tmp_path / "x.so"))
    assert r.returncode != 0
    assert "no compile record" in r.stderr and "give the flags" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_wrong_optimization_level(tree, tmp_path):
    d, exe = tree
    r = moltcc(d, exe, "fix_bounds.patch", str(tmp_path / "x.so"), "-O0", "-g", "-pthread")
    assert r.returncode != 0
    assert "store.c was compiled with -O2" in r.stderr and "-O0" in r.stderr, r.stderr


def test_inlining_not_reproduced(tree, tmp_path):
    """Flags under which the rebuild does not inline lookup() into
    lookup_first() as PROG did (its DWARF says so): the comparison would
    leave PROG's inlined copy unpatched, so the fix is refused."""
    d, exe = tree
    r = moltcc(d, exe, "fix_bounds.patch", str(tmp_path / "x.so"), *FLAGS + ["-fno-inline"])
    assert r.returncode != 0
    assert "'lookup' changed" in r.stderr and "inlined into 'lookup_first'" in r.stderr, r.stderr
    assert "started in its place" in r.stderr, r.stderr


def test_missing_source(tree, tmp_path):
    d, exe = tree
    empty = tmp_path / "empty"
    empty.mkdir()
    r = moltcc(str(empty), exe, "fix_bounds.patch", str(tmp_path / "x.so"), *FLAGS)
    assert r.returncode != 0
    assert "none of the source files" in r.stderr and "--molt-source" in r.stderr, r.stderr
    # --molt-source names the tree from anywhere
    r = moltcc(str(empty), exe, "fix_bounds.patch", str(tmp_path / "y.so"), *FLAGS,
               extra=["--molt-source", d])
    assert r.returncode == 0, r.stderr


def test_static_local_needs_debug_info(tmp_path):
    """Built without -g, the static local of next_id has no name to find."""
    d = str(tmp_path / "src")
    exe = make_tree(d, ["-O2", "-pthread"])
    r = moltcc(d, exe, "fix_bounds.patch", str(tmp_path / "x.so"), "-O2", "-pthread")
    assert r.returncode != 0
    assert "no debug information" in r.stderr and "-g" in r.stderr, r.stderr
    assert "'counter' of 'next_id'" in r.stderr, r.stderr


def test_damaged_marks_refused(tree, tmp_path):
    """A .molt_attach section whose lines are damaged is refused by molt
    attach before anything is stopped; the server keeps serving unchanged."""
    d, exe = tree
    so = str(tmp_path / "fix.so")
    assert moltcc(d, exe, "fix_bounds.patch", so, *FLAGS).returncode == 0
    marks = sh(["objcopy", "--dump-section", ".molt_attach=%s" % (tmp_path / "marks.txt"), so,
                str(tmp_path / "copy.so")])
    assert marks.returncode == 0, marks.stderr
    text = open(str(tmp_path / "marks.txt")).read()
    m = re.search(r"^replace lookup ([0-9a-f]+) ([0-9a-f]+)$", text, re.M)
    assert m, text
    damages = {
        "unknown": text + "frobnicate 1 2\n",
        "zero": text.replace(m.group(0), "replace lookup 0 %s" % m.group(2)),
        "outside": text.replace(m.group(0), "replace lookup %s fffffff" % m.group(1)),
        "import": re.sub(r"^import (\S+) [0-9a-f]+$", r"import \1 zz", text, count=1, flags=re.M),
    }
    srv = Server(exe, workers=2)
    try:
        before = text_bytes(exe, srv.pid, "lookup")
        for name, bad in damages.items():
            f = tmp_path / ("marks-%s.txt" % name)
            f.write_text(bad)
            out = str(tmp_path / ("bad-%s.so" % name))
            r = sh(["objcopy", "--update-section", ".molt_attach=%s" % f, so, out])
            assert r.returncode == 0, r.stderr
            a = sh([MOLT, "attach", srv.pid, out])
            assert a.returncode != 0, name
            assert "corrupt attach patch" in a.stderr, (name, a.stderr)
            assert len(a.stderr.strip().splitlines()) == 1, a.stderr
            assert not os.path.exists("/run/molt/attach/%d" % srv.pid), name
        assert text_bytes(exe, srv.pid, "lookup") == before
        assert srv.q("get 8") == ["secret"]
    finally:
        srv.close()


def test_tree_with_the_fix_and_orig_form(tmp_path):
    """A tree that already has the fix: undone in memory (said in a note);
    --molt-orig OLD NEW gives the same patch."""
    d = str(tmp_path / "src")
    exe = make_tree(d)
    r = sh(["patch", "-p1", "-s", "-i", os.path.join(PLAIN, "fix_bounds.patch")], cwd=d)
    assert r.returncode == 0, r.stderr
    so = str(tmp_path / "a.so")
    r = moltcc(d, exe, "fix_bounds.patch", so, *FLAGS)
    assert r.returncode == 0, r.stderr
    assert "store.c already has the fix" in r.stderr, r.stderr
    old = str(tmp_path / "old")
    make_tree(old)
    r = sh([MOLTCC, "--molt-patch", "--molt-target", os.path.join(old, "plainsrv"), "--molt-orig",
            old, os.path.join(d, "store.c"), "-o", str(tmp_path / "b.so")] + FLAGS, cwd=old)
    assert r.returncode == 0, r.stderr
    for p in (so, str(tmp_path / "b.so")):
        marks = sh(["readelf", "-p", ".molt_attach", p]).stdout
        assert "replace lookup" in marks and "replace next_id" in marks, marks


CALLBACKS = """#include <molt.h>
long next_id(void);                 /* the server's */
static int pre(void) { return %d; }
MOLT_PATCH_PRE(pre);
static int post(void) { next_id(); return 0; }   /* runs the new version: +10 */
MOLT_PATCH_POST(post);
"""


def test_callbacks(tree, tmp_path):
    """--molt-callbacks with a fix: the post-update callback runs in the
    server after the jumps (it calls the new next_id once); a pre-update
    callback that refuses leaves the server unchanged."""
    d, exe = tree
    ok, refuse = tmp_path / "cb_ok.c", tmp_path / "cb_refuse.c"
    ok.write_text(CALLBACKS % 0)
    refuse.write_text(CALLBACKS % 3)
    so_ok, so_refuse = str(tmp_path / "ok.so"), str(tmp_path / "refuse.so")
    for cb, so in ((ok, so_ok), (refuse, so_refuse)):
        r = moltcc(d, exe, "fix_bounds.patch", so, *FLAGS, extra=["--molt-callbacks", str(cb)])
        assert r.returncode == 0, r.stderr
        assert "callbacks: pre-update pre, post-update post" in r.stderr, r.stderr
    srv = Server(exe, workers=2)
    try:
        before = text_bytes(exe, srv.pid, "lookup")
        assert srv.q("id") == ["1"]
        a = sh([MOLT, "attach", srv.pid, so_refuse])
        assert a.returncode != 0 and "returned 3" in a.stderr, (a.stdout, a.stderr)
        assert text_bytes(exe, srv.pid, "lookup") == before
        assert srv.q("get 8", "id") == ["secret", "2"]
        a = sh([MOLT, "attach", srv.pid, so_ok])
        assert a.returncode == 0, a.stderr
        # 2, then the post callback's call (12), then ours
        assert srv.q("get 8", "id") == ["none", "22"]
    finally:
        srv.close()


def test_stacked_series(tree, tmp_path):
    """A second fix on top of the first: the patch built from the series
    (fix_bounds.patch then fix_message.patch) is attached over the first
    one and takes its functions' sites by their addresses; each rollback
    gives back the level below."""
    d, exe = tree
    first, both = str(tmp_path / "first.so"), str(tmp_path / "both.so")
    assert moltcc(d, exe, "fix_bounds.patch", first, *FLAGS).returncode == 0
    r = moltcc(d, exe, "fix_bounds.patch", both, *FLAGS,
               extra=["--molt-diff", os.path.join(PLAIN, "fix_message.patch")])
    assert r.returncode == 0, r.stderr
    srv = Server(exe, workers=8)
    try:
        before = text_bytes(exe, srv.pid, "lookup")
        load = Load(srv, nclients=2)
        assert sh([MOLT, "attach", srv.pid, first]).returncode == 0
        assert srv.q("get 8") == ["none"]
        a = sh([MOLT, "attach", srv.pid, both])
        assert a.returncode == 0, a.stderr
        assert srv.q("get 8", "get 2") == ["no such record", "name2"]
        assert sh([MOLT, "rollback", srv.pid]).returncode == 0
        assert srv.q("get 8") == ["none"]
        assert sh([MOLT, "rollback", srv.pid]).returncode == 0
        assert srv.q("get 8") == ["secret"]
        errors = load.finish()
        assert not errors, errors[:5]
        assert text_bytes(exe, srv.pid, "lookup") == before
    finally:
        srv.close()
