"""molt attach end to end: a plainly built multi-threaded server
(server.c: gcc -O2, no molt, nothing preloaded) patched while it serves a
checking load, rolled back, refused, and molt killed half way.

Environment: MOLT_BUILD_DIR (bin/molt, bin/moltcc); ATTACH_CYCLES (attach
+ rollback cycles under load on a 100-thread server, default 50; the plain
build's ctest sets 1,000); ATTACH_CALL_CYCLES (the same for the recursive
and the stored-pointer function, default 10).  Runs as root (ptrace).
"""
import functools
import os
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

from harness.tree import bin_path, skip

HERE = os.path.dirname(os.path.abspath(__file__))
MOLT = bin_path("molt")
MOLTCC = bin_path("moltcc")
CYCLES = int(os.environ.get("ATTACH_CYCLES", "50"))


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def molt(*args, env=None):
    return sh([MOLT] + [str(a) for a in args], env=env)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if os.geteuid() != 0:
        scope = open("/proc/sys/kernel/yama/ptrace_scope").read().strip() \
            if os.path.exists("/proc/sys/kernel/yama/ptrace_scope") else "absent"
        if scope not in ("0", "absent"):
            skip("molt attach needs ptrace: run as root (yama ptrace_scope=%s)" % scope)
    d = tmp_path_factory.mktemp("attach")
    out = {}
    for variant in (1, 2):
        exe = str(d / ("server%d" % variant))
        r = sh(["gcc", "-O2", "-pthread", "-DVARIANT=%d" % variant, "-o", exe,
                os.path.join(HERE, "server.c"), os.path.join(HERE, "server_statics.c")])
        assert r.returncode == 0, r.stderr
        out["server%d" % variant] = exe
    sources = {
        "fix": open(os.path.join(HERE, "fix_answer.c")).read(),
        "stack": open(os.path.join(HERE, "fix_stack.c")).read(),
        "helper": open(os.path.join(HERE, "fix_helper.c")).read(),
        "atol": open(os.path.join(HERE, "fix_atol.c")).read(),
        "park": open(os.path.join(HERE, "fix_park.c")).read(),
        "calls": open(os.path.join(HERE, "fix_calls.c")).read(),
        "hook": open(os.path.join(HERE, "fix_hook.c")).read(),
        "branchy": "long branchy(long n) { return n; }\n",
        "tiny": "long tiny(void) { return 1; }\n",
        "nosuch": "long no_such_function(long n) { return n; }\n",
    }
    for name, text in sources.items():
        src = d / (name + ".c")
        src.write_text(text)
        so = str(d / (name + ".so"))
        r = sh([MOLTCC, "--molt-attach", "--molt-target", out["server1"], "-O2", "-o", so,
                str(src)])
        assert r.returncode == 0, r.stderr
        out[name] = so
    # fix_answer.c with callbacks (moltcc --molt-callbacks, as for a hot patch)
    for name, text in CALLBACKS.items():
        cb = d / (name + "_callbacks.c")
        cb.write_text(CALLBACKS_HEAD + text)
        so = str(d / (name + ".so"))
        r = sh([MOLTCC, "--molt-attach", "--molt-target", out["server1"], "--molt-callbacks",
                str(cb), "-O2", "-o", so, os.path.join(HERE, "fix_answer.c")])
        assert r.returncode == 0, r.stderr
        out[name] = so
    return out


# Callback files: each counts its runs in the server's cb_pre / cb_post and
# records what answer(10) was when it ran (ask() enters the program's
# answer(), so it sees whatever that entry jumps to: 20 before the jumps,
# 30 after).
CALLBACKS_HEAD = """#include <molt.h>
extern long cb_pre, cb_post, cb_pre_saw, cb_post_saw;
long ask(long n);
"""
CALLBACKS = {
    "cb_ok": """
static int before(void) { cb_pre++; cb_pre_saw = ask(10); return 0; }
MOLT_PATCH_PRE(before);
static int after(void) { cb_post++; cb_post_saw = ask(10); return 0; }
MOLT_PATCH_POST(after);
""",
    "cb_refuse": """
static int refuse(void) { cb_pre++; return 3; }
MOLT_PATCH_PRE(refuse);
static int after(void) { cb_post++; return 0; }
MOLT_PATCH_POST(after);
""",
    "cb_loop": """
static int forever(void) { cb_pre++; for (;;) __asm__ volatile(""); return 0; }
MOLT_PATCH_PRE(forever);
""",
    "cb_crash": """
static int crash(void) { cb_pre++; return *(volatile int *)16; }
MOLT_PATCH_PRE(crash);
""",
    "cb_post_fails": """
static int after(void) { cb_post++; cb_post_saw = ask(10); return 7; }
MOLT_PATCH_POST(after);
""",
}


class Server:
    """server.c running; q() sends request lines on a fresh connection."""

    def __init__(self, exe, workers=8, spinners=0, churners=0, env=None, preexec=None):
        self.p = subprocess.Popen([exe, str(workers), str(spinners), str(churners)],
                                  stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, **(env or {})), preexec_fn=preexec)
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
        for l in lines:
            f.write(l + "\n")
            f.flush()
            out.append(f.readline().strip())
        s.close()
        return out

    def answer(self, n):
        return int(self.q(str(n))[0])

    def hello(self):
        return self.q("hello")[0]

    def stats(self):
        words = self.q("stats")[0].split()
        return {words[i]: int(words[i + 1]) for i in range(0, len(words), 2)}

    def close(self):
        # the forked workers die with their master (PR_SET_PDEATHSIG), but
        # only after it: wait for them too, so the next test's `attach --all`
        # of the same program does not meet one on its way out
        workers = []
        for d in os.listdir("/proc"):
            try:
                if d.isdigit() and open("/proc/%s/stat" % d).read().rsplit(")", 1)[1].split()[1] \
                        == str(self.pid):
                    workers.append(int(d))
            except (OSError, IndexError):
                pass
        self.p.kill()
        self.p.wait()
        deadline = time.time() + 10
        for w in workers:
            while time.time() < deadline:
                try:
                    state = open("/proc/%d/stat" % w).read().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    break
                if state in ("Z", "X"):
                    break
                time.sleep(0.01)


@pytest.fixture
def server(built):
    servers = []

    def start(exe=None, **kw):
        s = Server(exe or built["server1"], **kw)
        servers.append(s)
        return s

    yield start
    for s in servers:
        if os.path.exists("/run/molt/attach/%d" % s.pid):
            molt("rollback", s.pid)
        s.close()


def threads_free(pid):
    """No thread of pid is traced or stopped."""
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            st = open("/proc/%d/task/%s/status" % (pid, tid)).read()
        except (FileNotFoundError, ProcessLookupError):  # a thread ending
            continue
        tracer = re.search(r"TracerPid:\s*(\d+)", st).group(1)
        state = re.search(r"State:\s*(\S)", st).group(1)
        assert tracer == "0", "thread %s traced by %s" % (tid, tracer)
        assert state not in ("t", "T"), "thread %s left stopped (%s)" % (tid, state)


def policies(pid):
    """Each thread's scheduling policy, priority and nice: molt raises the
    thread it runs the staging calls on for that window only."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            out[int(tid)] = (os.sched_getscheduler(int(tid)),
                             os.sched_getparam(int(tid)).sched_priority,
                             os.getpriority(os.PRIO_PROCESS, int(tid)))
        except (ProcessLookupError, FileNotFoundError):  # a thread ending
            pass
    return out


def named_maps(pid):
    """The mappings of pid that have a name (files, memfds, [stack]...): the
    anonymous ones change with the program's own mallocs (a thread's first
    one maps an arena)."""
    return [l for l in open("/proc/%d/maps" % pid) if len(l.split()) >= 6]


def attach_fds(pid):
    """The descriptors of pid open on a staged memfd."""
    out = []
    for f in os.listdir("/proc/%d/fd" % pid):
        try:
            if "molt-attach" in os.readlink("/proc/%d/fd/%s" % (pid, f)):
                out.append(int(f))
        except FileNotFoundError:  # closed meanwhile (a connection)
            pass
    return out


def attach_maps(pid):
    return [l for l in open("/proc/%d/maps" % pid) if "molt-attach" in l]


@functools.lru_cache(maxsize=None)
def nm_of(exe):
    """nm's listing of exe (once per file: the cycle tests read the bytes of
    a function twice per cycle, and an nm run per read made up much of a
    cycle's time on a loaded machine)."""
    return sh(["nm", exe]).stdout


def load_base(exe, pid):
    """Where exe (a PIE) is loaded in process pid."""
    real = os.path.realpath(exe)
    for l in open("/proc/%d/maps" % pid):
        f = l.split()
        if len(f) >= 6 and f[5] == real and int(f[2], 16) == 0:
            return int(f[0].split("-")[0], 16)
    return None


def symbol_bytes(exe, pid, name, n=32):
    """The first n bytes of function `name` of exe in process pid."""
    nm = nm_of(exe)
    value = int(re.search(r"^([0-9a-f]+) T %s$" % name, nm, re.M).group(1), 16)
    base = load_base(exe, pid)
    with open("/proc/%d/mem" % pid, "rb") as m:
        m.seek(base + value)
        return m.read(n)


DEEP = 1 << 20  # what the patch's deep() adds per level besides 1


def deep_ok(levels, got):
    """deep(levels - 1) ran `levels` levels, each the server's (1) or the
    patch's (1 + 2^20): every level counted once, no frame damaged."""
    return got % DEEP == levels and 0 <= got // DEEP <= levels


class Load:
    """Client threads that send requests over kept connections and check
    each answer: 2n (original), 3n (fix_answer.c) or 4n (fix_stack.c on top
    of it), nothing else, no error.  `deep` more clients ask for deep(63),
    the recursive function (64 levels, each the server's or fix_calls.c's);
    `ops` more ask for op 0 and op 1, functions called through a stored
    pointer (n + 1000; 5n or fix_calls.c's 7n)."""

    def __init__(self, srv, nclients=4, deep=0, ops=0):
        self.srv, self.stop, self.errors, self.count = srv, False, [], 0
        self.lock = threading.Lock()
        kinds = [self.answers] * nclients + [self.deeps] * deep + [self.ops] * ops
        self.threads = [threading.Thread(target=self.client, args=(i, k))
                        for i, k in enumerate(kinds)]
        for t in self.threads:
            t.start()

    @staticmethod
    def answers(n):
        return "%d" % n, lambda got: got in (2 * n, 3 * n, 4 * n)

    @staticmethod
    def deeps(n):
        return "deep 63", lambda got: deep_ok(64, got)

    @staticmethod
    def ops(n):
        if n % 2:
            return "op 0 %d" % n, lambda got: got == n + 1000
        return "op 1 %d" % n, lambda got: got in (5 * n, 7 * n)

    def client(self, i, kind):
        try:
            s, f = self.srv.connect()
            n = i * 1000
            while not self.stop:
                n += 1
                request, check = kind(n)
                f.write(request + "\n")
                f.flush()
                got = f.readline()
                if not got or not check(int(got)):
                    with self.lock:
                        self.errors.append("request %r: answer %r" % (request, got))
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


# server.c's threads besides its workers: main, 6 watchers, 2 aio waiters
SERVER_OWN_THREADS = 9


def test_attach_rollback_cycles_under_load(built, server):
    """A 100-thread server (91 workers, 8 of them serving the load's kept
    connections, the others in accept; 8 watchers in blocking calls; main)
    patched and rolled back ATTACH_CYCLES times under a checking load."""
    srv = server(workers=100 - SERVER_OWN_THREADS)
    wait_for(lambda: len(os.listdir("/proc/%d/task" % srv.pid)) == 100, "100 threads")
    before = symbol_bytes(built["server1"], srv.pid, "answer")
    assert srv.answer(7) == 14
    load = Load(srv, deep=2, ops=2)
    stops = []
    try:
        for cycle in range(CYCLES):
            r = molt("attach", srv.pid, built["fix"])
            assert r.returncode == 0, r.stderr
            m = re.search(r"stopped for ([0-9.]+) ms", r.stdout)
            assert m, r.stdout
            stops.append(float(m.group(1)))
            threads_free(srv.pid)
            assert srv.answer(7) == 21, "the patch is not live"
            assert symbol_bytes(built["server1"], srv.pid, "answer") != before
            r = molt("rollback", srv.pid)
            assert r.returncode == 0, r.stderr
            threads_free(srv.pid)
            assert srv.answer(7) == 14, "the rollback is not live"
            assert symbol_bytes(built["server1"], srv.pid, "answer") == before
    finally:
        errors = load.finish()
    assert errors == []
    assert load.count > CYCLES
    st = srv.stats()
    assert st["eintr"] == 0 and st["early"] == 0, st
    assert len(os.listdir("/proc/%d/task" % srv.pid)) == 100
    # the staged code is gone once nothing runs it
    assert attach_maps(srv.pid) == []
    assert not os.path.exists("/run/molt/attach/%d" % srv.pid)
    print("stops (ms): median %.3f max %.3f" % (sorted(stops)[len(stops) // 2], max(stops)))


CALL_CYCLES = int(os.environ.get("ATTACH_CALL_CYCLES", "10"))
NAP_MS = 2500  # the nap of a recursion half way down: an attach ends well within it


def deep_half_way(srv, top, at):
    """Sends "deep TOP AT NAP_MS" on a connection of its own and returns it
    once level AT has begun its nap (levels TOP..AT are on the stack)."""
    naps = srv.stats()["deepnap"]
    s, f = srv.connect()
    f.write("deep %d %d %d\n" % (top, at, NAP_MS))
    f.flush()
    wait_for(lambda: srv.stats()["deepnap"] > naps, "the recursion to nap")
    return s, f, time.time()


def test_recursive_and_stored_pointer_functions(built, server):
    """fix_calls.c replaces deep(), a recursive function, and scale(), which
    the server reaches only through a pointer it stored in a table at
    start, while a load calls both (and shift(), the table's other entry)
    and checks every answer.  A recursion half way down during the attach
    finishes its old frames in the old code and runs every level it enters
    after in the new: exactly 201 old levels and 200 new.  Rollback gives
    back the entries byte for byte."""
    srv = server(workers=12)
    exe = built["server1"]
    names = ("deep", "scale", "shift")  # 8 bytes each: scale() and shift() are short
    before = {f: symbol_bytes(exe, srv.pid, f, 8) for f in names}
    old, new = ["10", "30", "1006"], [str(10 + 10 * DEEP), "42", "1006"]
    assert srv.q("deep 9", "op 1 6", "op 0 6") == old
    load = Load(srv, nclients=2, deep=3, ops=3)
    try:
        for cycle in range(CALL_CYCLES):
            r = molt("attach", srv.pid, built["calls"])
            assert r.returncode == 0, r
            threads_free(srv.pid)
            assert srv.q("deep 9", "op 1 6", "op 0 6") == new, "the patch is not live"
            now = {f: symbol_bytes(exe, srv.pid, f, 8) for f in names}
            assert now["deep"] != before["deep"] and now["scale"] != before["scale"]
            assert now["shift"] == before["shift"]
            r = molt("rollback", srv.pid)
            assert r.returncode == 0, r
            threads_free(srv.pid)
            assert srv.q("deep 9", "op 1 6", "op 0 6") == old, "the rollback is not live"
            assert {f: symbol_bytes(exe, srv.pid, f, 8) for f in names} == before

        # attach while a recursion naps at level 200 of 400: levels 400..200
        # are the server's, 199..0 (entered through deep's entry) the patch's
        s, f, t0 = deep_half_way(srv, 400, 200)
        r = molt("attach", srv.pid, built["calls"])
        assert r.returncode == 0, r
        assert time.time() - t0 < NAP_MS / 1000, "the attach outlasted the nap"
        got = int(f.readline())
        s.close()
        assert got == 401 + 200 * DEEP, (got % DEEP, got // DEEP)
        threads_free(srv.pid)

        # rollback while a recursion in the patch's code naps: the patch's
        # deep() calls its own (the patch binds its own symbols), so it ends
        # in the patch's code; the rollback restores the entries at once and
        # unmaps the code only once the recursion has left it
        s, f, t0 = deep_half_way(srv, 400, 200)
        r = molt("rollback", srv.pid)
        assert r.returncode == 0, r
        assert srv.q("deep 9", "op 1 6") == old[:2]
        got = int(f.readline())
        s.close()
        assert got == 401 * (1 + DEEP), (got % DEEP, got // DEEP)
        threads_free(srv.pid)
        assert {f: symbol_bytes(exe, srv.pid, f, 8) for f in names} == before
    finally:
        errors = load.finish()
    assert errors == []
    assert load.count > CALL_CYCLES
    st = srv.stats()
    assert st["eintr"] == 0 and st["early"] == 0, st
    assert attach_maps(srv.pid) == []
    assert not os.path.exists("/run/molt/attach/%d" % srv.pid)


def test_status_of_an_attached_process(built, server):
    srv = server()
    assert molt("attach", srv.pid, built["fix"]).returncode == 0
    r = molt("status", srv.pid)
    assert r.returncode == 0, r.stderr
    assert "patched by molt attach" in r.stdout and built["fix"] in r.stdout
    assert re.search(r"answer\s+0x[0-9a-f]+\s+0x[0-9a-f]+\s+patched", r.stdout), r.stdout
    import json
    j = json.loads(molt("status", "--json", srv.pid).stdout)
    assert j["mode"] == "attach" and j["phase"] == "applied" and j["stop_ms"] > 0
    assert sorted(f["name"] for f in j["functions"]) == ["answer", "spin_copy"]
    assert all(f["state"] == "patched" for f in j["functions"])
    # the state page in the target holds the same record: without the
    # file under /run, a second molt still finds the attach
    rec = "/run/molt/attach/%d" % srv.pid
    saved = open(rec).read()
    os.unlink(rec)
    r = molt("status", srv.pid)
    assert "patched by molt attach" in r.stdout, r
    open(rec, "w").write(saved)
    assert molt("rollback", srv.pid).returncode == 0
    assert srv.answer(5) == 10


STACK_CYCLES = int(os.environ.get("ATTACH_STACK_CYCLES", "4"))


def test_stacked_patches_under_load(built, server):
    """fix_answer.c, then fix_stack.c on top of it (replacing answer() again
    and banner(), which the first does not): the live replies follow the
    top of the stack; each rollback pops one patch and gives back exactly
    the bytes the entries had before it."""
    import json
    srv = server(workers=8)
    exe = built["server1"]
    original = {f: symbol_bytes(exe, srv.pid, f) for f in ("answer", "banner")}
    load = Load(srv)
    try:
        for cycle in range(STACK_CYCLES):
            r = molt("attach", srv.pid, built["fix"])
            assert r.returncode == 0 and "as patch 1 of its stack" in r.stdout, r
            after_a = {f: symbol_bytes(exe, srv.pid, f) for f in original}
            assert after_a["answer"] != original["answer"]
            assert after_a["banner"] == original["banner"]
            assert srv.answer(7) == 21 and srv.hello() == "hello original"

            r = molt("attach", srv.pid, built["stack"])
            assert r.returncode == 0 and "as patch 2 of its stack" in r.stdout, r
            threads_free(srv.pid)
            assert srv.answer(7) == 28, "the stacked patch is not live"
            assert srv.hello() == "hello patched-b"
            # one level of indirection: answer's entry jumps straight to B
            # (the same site as A's jump, rewritten), not through A
            b_bytes = symbol_bytes(exe, srv.pid, "answer")
            assert b_bytes != after_a["answer"]
            assert b_bytes[8:] == after_a["answer"][8:]

            j = json.loads(molt("status", "--json", srv.pid).stdout)
            assert [l["level"] for l in j["stack"]] == [1, 2]
            assert j["level"] == 2 and j["patch"] == built["stack"]
            states = {(l["level"], f["name"]): f["state"] for l in j["stack"]
                      for f in l["functions"]}
            assert states == {(1, "answer"): "replaced by 2", (1, "spin_copy"): "patched",
                              (2, "answer"): "patched", (2, "banner"): "patched"}, states
            text = molt("status", srv.pid).stdout
            assert re.search(r"^\s+2\s+applied\s.*%s$" % re.escape(built["stack"]), text,
                             re.M), text
            assert re.search(r"^\s+1\s+applied\s.*%s$" % re.escape(built["fix"]), text,
                             re.M), text

            r = molt("rollback", srv.pid)
            assert r.returncode == 0 and "patch 2 (" in r.stdout, r
            threads_free(srv.pid)
            assert srv.answer(7) == 21, "the rollback of B did not give back A"
            assert srv.hello() == "hello original"
            assert {f: symbol_bytes(exe, srv.pid, f) for f in original} == after_a

            r = molt("rollback", srv.pid)
            assert r.returncode == 0 and "patch 1 (" in r.stdout, r
            threads_free(srv.pid)
            assert srv.answer(7) == 14
            assert {f: symbol_bytes(exe, srv.pid, f) for f in original} == original
            assert attach_maps(srv.pid) == []
    finally:
        errors = load.finish()
    assert errors == []
    assert load.count > STACK_CYCLES
    assert not os.path.exists("/run/molt/attach/%d" % srv.pid)
    assert not os.path.exists("/run/molt/attach/%d.2" % srv.pid)
    r = molt("rollback", srv.pid)
    assert r.returncode != 0 and "not a molt process" in r.stderr, r


def test_stack_refuses_on_an_unfinished_attach(built, server):
    """molt killed after staging leaves an unfinished level: the next
    attach is refused until rollback cleans it up."""
    srv = server(workers=2)
    env = dict(os.environ, MOLT_ATTACH_TEST_PAUSE="staged")
    p = subprocess.Popen([MOLT, "attach", str(srv.pid), built["fix"]], env=env,
                         stderr=subprocess.PIPE, text=True)
    assert p.stderr.readline().strip() == "molt-attach-paused staged"
    p.kill()
    p.wait()
    r = molt("attach", srv.pid, built["stack"])
    assert r.returncode == 1 and "unfinished attach" in r.stderr, r
    assert srv.answer(3) == 6
    assert molt("rollback", srv.pid).returncode == 0
    r = molt("attach", srv.pid, built["stack"])
    assert r.returncode == 0 and "as patch 1 of its stack" in r.stdout, r
    assert srv.answer(3) == 12 and srv.hello() == "hello patched-b"
    assert molt("rollback", srv.pid).returncode == 0
    assert srv.answer(3) == 6 and srv.hello() == "hello original"
    assert attach_maps(srv.pid) == []


def test_callbacks_run_in_the_target(built, server):
    """pre runs before the jumps (it sees the old answer()), post after (the
    new one), both inside the target on a borrowed thread, under load; the
    thread's interrupted call shows no EINTR."""
    srv = server(workers=8)  # 4 held by the load's kept connections
    load = Load(srv)
    try:
        for cycle in range(1, 4):
            r = molt("attach", srv.pid, built["cb_ok"])
            assert r.returncode == 0, r
            assert re.search(r"^callbacks: pre before: 0 in [0-9.]+ ms; post after: 0 in",
                             r.stdout, re.M), r.stdout
            threads_free(srv.pid)
            st = srv.stats()
            assert (st["pre"], st["post"]) == (cycle, cycle), st
            assert (st["presaw"], st["postsaw"]) == (20, 30), st
            assert srv.answer(7) == 21
            assert "pre before: 0" in molt("status", srv.pid).stdout
            assert molt("rollback", srv.pid).returncode == 0
            assert srv.answer(7) == 14
    finally:
        errors = load.finish()
    assert errors == []
    time.sleep(0.1)
    st = srv.stats()
    assert st["eintr"] == 0 and st["early"] == 0, st
    assert attach_maps(srv.pid) == []


def thread_states(pid):
    """Per thread: its signal mask and the system call it waits in."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            st = open("/proc/%d/task/%s/status" % (pid, tid)).read()
            sc = open("/proc/%d/task/%s/syscall" % (pid, tid)).read().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[int(tid)] = (re.search(r"SigBlk:\s*(\S+)", st).group(1), sc[0] if sc else "")
    return out


def test_callbacks_leave_the_borrowed_thread_as_it_was(built, server):
    """The main thread gone, the callbacks borrow a watcher thread (blocked
    in epoll_wait, read, accept...), whose calls count every EINTR and every
    early wake-up: none; every thread's signal mask and call are as before."""
    srv = server(workers=2, env={"SERVER_MAIN_EXITS": "1"})
    time.sleep(0.3)
    before = thread_states(srv.pid)
    for cycle in range(1, 6):
        for name in ("cb_ok", "cb_loop", "cb_crash"):
            r = molt("attach", "--callback-timeout", "0.2", srv.pid, built[name])
            assert r.returncode == (0 if name == "cb_ok" else 1), r
            if name == "cb_ok":
                assert molt("rollback", srv.pid).returncode == 0
            threads_free(srv.pid)
    time.sleep(0.2)
    st = srv.stats()
    assert st["pre"] == 15 and st["post"] == 5 and st["presaw"] == 20, st
    assert st["eintr"] == 0 and st["early"] == 0, st
    after = thread_states(srv.pid)
    masks = {t: before[t][0] for t in before if t in after}
    assert masks == {t: after[t][0] for t in masks}
    assert attach_maps(srv.pid) == []


def test_failing_pre_changes_nothing(built, server):
    srv = server(workers=2)
    exe = built["server1"]
    before = symbol_bytes(exe, srv.pid, "answer")
    maps = named_maps(srv.pid)
    r = molt("attach", srv.pid, built["cb_refuse"])
    assert r.returncode == 1, r
    assert "pre-update callback refuse of %s returned 3" % built["cb_refuse"] in r.stderr, r
    assert len(r.stderr.strip().splitlines()) == 1
    st = srv.stats()
    assert (st["pre"], st["post"]) == (1, 0), st  # it ran; post never did
    assert symbol_bytes(exe, srv.pid, "answer") == before
    assert named_maps(srv.pid) == maps
    assert not os.path.exists("/run/molt/attach/%d" % srv.pid)
    threads_free(srv.pid)
    assert srv.answer(7) == 14


def test_looping_pre_times_out(built, server):
    srv = server(workers=2)
    exe = built["server1"]
    before = symbol_bytes(exe, srv.pid, "answer")
    maps = named_maps(srv.pid)
    t0 = time.time()
    r = molt("attach", "--callback-timeout", "0.5", srv.pid, built["cb_loop"])
    took = time.time() - t0
    assert r.returncode == 1, r
    assert "pre-update callback forever" in r.stderr
    assert "did not return within 0.5 s" in r.stderr, r.stderr
    assert took < 30, took  # bounded (the message gives the timeout used)
    threads_free(srv.pid)
    assert srv.answer(7) == 14  # still serving, unpatched
    st = srv.stats()
    assert st["pre"] == 1 and st["eintr"] == 0, st
    assert symbol_bytes(exe, srv.pid, "answer") == before
    assert named_maps(srv.pid) == maps
    # the borrowed thread is back: an attach after works
    r = molt("attach", srv.pid, built["fix"])
    assert r.returncode == 0, r
    assert srv.answer(7) == 21
    assert molt("rollback", srv.pid).returncode == 0


def test_crashing_pre_changes_nothing(built, server):
    """A callback that faults: the fault is molt's to see, never delivered
    to the server (which would die of it), and the attach fails cleanly."""
    srv = server(workers=2)
    maps = named_maps(srv.pid)
    r = molt("attach", srv.pid, built["cb_crash"])
    assert r.returncode == 1, r
    assert re.search(r"pre-update callback crash of .* crashed \(signal 11 at 0x", r.stderr), r
    assert srv.p.poll() is None
    assert srv.stats()["pre"] == 1
    assert srv.answer(7) == 14
    assert named_maps(srv.pid) == maps
    threads_free(srv.pid)


def test_sigterm_during_a_callback_waits_for_the_thread(built, server):
    """SIGTERM of molt while its looping pre runs takes effect only once the
    borrowed thread is given back: the server lives on, unpatched, and a
    attach undoes its staging before it ends with the signal."""
    srv = server(workers=2)
    p = subprocess.Popen([MOLT, "attach", "--callback-timeout", "1", str(srv.pid),
                          built["cb_loop"]], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 10
    while srv.stats()["pre"] == 0 and time.time() < deadline:
        time.sleep(0.02)
    t0 = time.time()
    p.send_signal(signal.SIGTERM)
    p.wait(30)
    assert p.returncode == -signal.SIGTERM
    assert time.time() - t0 > 0.1, "molt ended before the callback's timeout"
    time.sleep(0.1)
    assert srv.p.poll() is None
    # the borrowed (main) thread is back in its pause(), not left looping
    assert open("/proc/%d/task/%d/syscall" % (srv.pid, srv.pid)).read().split()[0] == "34"
    threads_free(srv.pid)
    assert srv.answer(7) == 14
    # the attach undid its staging before ending with the signal
    assert attach_maps(srv.pid) == []
    assert "interrupted by SIGTERM" in p.stderr.read()
    assert molt("rollback", srv.pid).returncode != 0  # nothing left to roll back


def test_moltcc_refuses_bad_attach_callbacks(built, tmp_path):
    cases = {
        "two": ("static int a(void) { return 0; }\nMOLT_PATCH_PRE(a);\n"
                "static int b(void) { return 0; }\nMOLT_PATCH_PRE(b);\n",
                "declares two pre-update callbacks (a and b)"),
        "missing": (None, "--molt-callbacks"),
    }
    for name, (text, why) in cases.items():
        cb = tmp_path / (name + ".c")
        if text is not None:
            cb.write_text(CALLBACKS_HEAD + text)
        r = sh([MOLTCC, "--molt-attach", "--molt-target", built["server1"],
                "--molt-callbacks", str(cb), "-O2", "-o", str(tmp_path / "x.so"),
                os.path.join(HERE, "fix_answer.c")])
        assert r.returncode != 0 and why in r.stderr, (name, r.stderr)
        assert not (tmp_path / "x.so").exists()


def test_failing_post_is_a_warning(built, server):
    srv = server(workers=2)
    r = molt("attach", srv.pid, built["cb_post_fails"])
    assert r.returncode == 0, r
    assert re.search(r"^warning: post-update callback after of .* returned 7 \(the patch "
                     r"stays applied\)$", r.stdout, re.M), r.stdout
    assert srv.answer(7) == 21
    st = srv.stats()
    assert st["post"] == 1 and st["postsaw"] == 30, st
    assert molt("rollback", srv.pid).returncode == 0
    assert srv.answer(7) == 14


@pytest.mark.parametrize("point", ["stopped", "applied"])
def test_stacked_attach_killed_midway(built, server, point):
    """molt killed in the stop of the second patch: the target runs either
    patch 1 or patch 2, whole; rollback pops what is left of patch 2 and
    gives back patch 1's bytes exactly."""
    srv = server(workers=4)
    exe = built["server1"]
    assert molt("attach", srv.pid, built["fix"]).returncode == 0
    after_a = {f: symbol_bytes(exe, srv.pid, f) for f in ("answer", "banner")}
    env = dict(os.environ, MOLT_ATTACH_TEST_PAUSE=point)
    p = subprocess.Popen([MOLT, "attach", str(srv.pid), built["stack"]], env=env,
                         stderr=subprocess.PIPE, text=True)
    assert p.stderr.readline().strip() == "molt-attach-paused " + point
    p.kill()
    p.wait()
    time.sleep(0.1)
    threads_free(srv.pid)
    patched = point == "applied"
    assert srv.answer(7) == (28 if patched else 21)
    assert srv.hello() == ("hello patched-b" if patched else "hello original")
    r = molt("rollback", srv.pid)
    assert r.returncode == 0 and "patch 2 (" in r.stdout, r
    assert {f: symbol_bytes(exe, srv.pid, f) for f in after_a} == after_a
    assert srv.answer(7) == 21 and srv.hello() == "hello original"
    assert molt("rollback", srv.pid).returncode == 0
    assert srv.answer(7) == 14
    assert attach_maps(srv.pid) == []


def test_spinning_thread_retried_never_corrupted(built, server):
    # spin_copy's first instruction (rep movsb) runs long: a stop often
    # finds a spinner inside the bytes the jump replaces
    srv = server(workers=2, spinners=2)
    attempts = []
    for _ in range(6):
        r = molt("attach", "--timeout", "30", srv.pid, built["fix"])
        assert r.returncode == 0, r.stderr
        attempts.append(int(re.search(r"\((\d+) attempts?[;)]", r.stdout).group(1)))
        threads_free(srv.pid)
        n = srv.stats()["new"]
        time.sleep(0.2)
        assert srv.stats()["new"] > n, "the spinners do not run the new spin_copy"
        for _ in range(20):
            r = molt("rollback", srv.pid)
            assert r.returncode == 0, r.stderr
            if not os.path.exists("/run/molt/attach/%d" % srv.pid):
                break
            time.sleep(0.05)
        threads_free(srv.pid)
    st = srv.stats()
    assert st["bad"] == 0, st
    assert st["spin"] > 0
    assert max(attempts) > 1, "no attach had to retry: %s" % attempts


# Busy threads calling one short function back to back: at almost every
# stop one of them is inside its first bytes.  Each checks every result is
# the old version's or the new one's; a line on stdin prints the counts.
HAMMER = r"""
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) long hot(long x) {
  long r = x;
  for (int i = 0; i < 3; i++)
    r = r * 3 + i;
  return r;
}
static long (*volatile call)(long) = hot;
static atomic_long bad, fresh;
static void *hammer(void *arg) {
  for (long i = (long)arg;; i++) {
    long want_old = ((i * 3) * 3 + 1) * 3 + 2, want_new = ((i * 5) * 5 + 1) * 5 + 2;
    long got = call(i);
    if (got == want_new)
      atomic_fetch_add_explicit(&fresh, 1, memory_order_relaxed);
    else if (got != want_old)
      atomic_fetch_add_explicit(&bad, 1, memory_order_relaxed);
  }
  return NULL;
}
int main(int argc, char **argv) {
  pthread_t t;
  for (long i = 0; i < atol(argv[1]); i++)
    pthread_create(&t, NULL, hammer, (void *)(i << 20));
  char line[64];
  printf("ready\n");
  fflush(stdout);
  while (fgets(line, sizeof line, stdin)) {
    printf("bad %ld new %ld\n", atomic_load(&bad), atomic_load(&fresh));
    fflush(stdout);
  }
  return 0;
}
"""
HAMMER_FIX = """long hot(long x) {
  long r = x;
  for (int i = 0; i < 3; i++)
    r = r * 5 + i;
  return r;
}
"""


def test_busy_threads_stepped_out_in_one_stop(built, tmp_path):
    """24 threads calling hot() back to back: a stop finds some inside its
    first bytes nearly every time.  They are single-stepped out of them
    while the others stay stopped, and the jump is written in that same
    stop (before, the stop was retried until, by luck, no thread was
    there); no call returns a wrong value."""
    exe, src, fix, so = (str(tmp_path / n) for n in ("hammer", "hammer.c", "fix.c", "fix.so"))
    open(src, "w").write(HAMMER)
    open(fix, "w").write(HAMMER_FIX)
    r = sh(["gcc", "-O2", "-g", "-pthread", "-Wl,--build-id", "-o", exe, src])
    assert r.returncode == 0, r.stderr
    r = sh([MOLTCC, "--molt-attach", "--molt-target", exe, "-O2", "-o", so, fix])
    assert r.returncode == 0, r.stderr
    p = subprocess.Popen([exe, "24"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def counts():
        p.stdin.write("\n")
        p.stdin.flush()
        m = re.match(r"bad (\d+) new (\d+)", p.stdout.readline())
        return int(m.group(1)), int(m.group(2))
    try:
        assert p.stdout.readline() == "ready\n"
        time.sleep(0.2)
        before = policies(p.pid)
        stepped = 0
        for _ in range(5):
            r = molt("attach", "--timeout", "20", p.pid, so)
            assert r.returncode == 0, r.stderr
            m = re.search(r"\((\d+) attempts?(?:; (\d+) threads? stepped)?", r.stdout)
            assert m and m.group(1) == "1", r.stdout
            stepped += int(m.group(2) or 0)
            fresh = counts()[1]
            time.sleep(0.05)
            assert counts()[1] > fresh, "the threads do not run the new hot()"
            r = molt("rollback", p.pid)
            assert r.returncode == 0, r.stderr
            threads_free(p.pid)
        assert stepped > 0, "no stop found a thread inside the first bytes"
        assert counts()[0] == 0
        # a stepped thread runs at SCHED_FIFO 1 while stepped only
        assert policies(p.pid) == before
    finally:
        if os.path.exists("/run/molt/attach/%d" % p.pid):
            molt("rollback", p.pid)
        p.kill()
        p.wait()


def test_killed_while_a_thread_is_stepped(built, tmp_path):
    """molt killed (SIGKILL) while a thread it single-steps out of the first
    bytes runs at SCHED_FIFO 1: the guardian puts that thread's policy back,
    no thread is left traced or stopped, no call returned a wrong value, and
    a rollback cleans up (no jump was written)."""
    exe, src, fix, so = (str(tmp_path / n) for n in ("hammer", "hammer.c", "fix.c", "fix.so"))
    open(src, "w").write(HAMMER)
    open(fix, "w").write(HAMMER_FIX)
    r = sh(["gcc", "-O2", "-g", "-pthread", "-Wl,--build-id", "-o", exe, src])
    assert r.returncode == 0, r.stderr
    r = sh([MOLTCC, "--molt-attach", "--molt-target", exe, "-O2", "-o", so, fix])
    assert r.returncode == 0, r.stderr
    p = subprocess.Popen([exe, "24"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    env = dict(os.environ, MOLT_ATTACH_TEST_PAUSE="stepping")
    try:
        assert p.stdout.readline() == "ready\n"
        time.sleep(0.2)
        before = policies(p.pid)
        killed = False
        for _ in range(20):  # a stop finds a thread in the first bytes nearly every time
            m = subprocess.Popen([MOLT, "attach", str(p.pid), so], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = m.stderr.readline()
            if line.strip() == "molt-attach-paused stepping":
                raised = [t for t, pol in policies(p.pid).items() if pol != before.get(t)]
                assert len(raised) == 1, raised  # the stepped thread, and only it
                m.send_signal(signal.SIGKILL)
                m.wait()
                killed = True
                break
            m.communicate()
            assert m.returncode == 0
            assert molt("rollback", p.pid).returncode == 0
        assert killed, "no attach stepped a thread in 20 tries"
        wait_for(lambda: policies(p.pid) == before, "the stepped thread's policy back")
        threads_free(p.pid)
        p.stdin.write("\n")
        p.stdin.flush()
        assert re.match(r"bad 0 new \d+", p.stdout.readline())
        r = molt("rollback", p.pid)
        assert r.returncode == 0, r.stderr
        assert attach_maps(p.pid) == []
    finally:
        if os.path.exists("/run/molt/attach/%d" % p.pid):
            molt("rollback", p.pid)
        p.kill()
        p.wait()


def wait_for(pred, what, seconds=10):
    deadline = time.time() + seconds
    while not pred():
        assert time.time() < deadline, "timed out waiting for " + what
        time.sleep(0.02)


def test_signal_handler_over_the_first_bytes(built, server):
    """A thread interrupted on spin_copy's first instruction whose handler
    has not returned: its ip is in the handler, the ip it goes back to is
    in the signal frame.  No jump may be written there until the handler
    returns."""
    srv = server(workers=2, env={"SERVER_SIGPARK": "1"})
    wait_for(lambda: srv.q("parked")[0] == "1", "the handler to park")
    maps = open("/proc/%d/maps" % srv.pid).read()
    r = molt("attach", "--timeout", "0.3", srv.pid, built["fix"])
    assert r.returncode == 1, r
    assert "is running a signal handler that returns into the first bytes of " \
        "'spin_copy'" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    threads_free(srv.pid)
    assert attach_maps(srv.pid) == [] and not os.path.exists("/run/molt/attach/%d" % srv.pid)
    assert open("/proc/%d/maps" % srv.pid).read() == maps
    assert srv.q("release") == ["ok"]
    wait_for(lambda: srv.q("parked")[0] == "0", "the handler to return")
    r = molt("attach", srv.pid, built["fix"])
    assert r.returncode == 0, r.stderr
    assert srv.answer(3) == 9
    assert molt("rollback", srv.pid).returncode == 0
    assert srv.stats()["bad"] == 0


def test_thread_that_does_not_stop(built, server):
    """A thread in an uninterruptible sleep (waiting in vfork for its
    child) holds every stopped thread with it: the stop gives up, releases
    them all and names it; once it wakes, the attach goes through."""
    srv = server(workers=3)
    s, f = srv.connect()
    f.write("vfork 1500\n")
    f.flush()

    def sleeper():
        for tid in os.listdir("/proc/%d/task" % srv.pid):
            try:
                if open("/proc/%d/task/%s/stat" % (srv.pid, tid)).read() \
                        .split(")")[1].split()[0] == "D":
                    return tid
            except (FileNotFoundError, ProcessLookupError):
                pass
        return None

    wait_for(lambda: sleeper() is not None, "a thread in vfork")
    tid = sleeper()
    t0 = time.time()
    r = molt("attach", "--timeout", "0.3", srv.pid, built["fix"])
    took = time.time() - t0
    assert r.returncode == 1, r
    assert "thread %s (" % tid in r.stderr and "did not stop within" in r.stderr, r.stderr
    assert "uninterruptible" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert took < 1.2, "molt waited for the sleeping thread (%.2f s)" % took
    assert srv.answer(4) == 8  # the others run
    assert f.readline().strip() == "0"  # the vfork ended
    s.close()
    threads_free(srv.pid)
    assert attach_maps(srv.pid) == []
    r = molt("attach", srv.pid, built["fix"])
    assert r.returncode == 0, r.stderr
    assert srv.answer(4) == 12
    assert molt("rollback", srv.pid).returncode == 0


def test_check_active(built, server):
    """--check-active: a thread waiting inside park_here (its return
    address on the stack) blocks the attach until the timeout, which names
    the thread and the function and suggests a full update; once it has
    left, the attach goes through."""
    srv = server(workers=3)
    s, f = srv.connect()
    f.write("park\n")
    f.flush()
    wait_for(lambda: srv.q("inside")[0] == "1", "a worker inside park_here")
    tids = set(os.listdir("/proc/%d/task" % srv.pid))
    r = molt("attach", "--check-active", "--timeout", "0.3", srv.pid, built["park"])
    assert r.returncode == 1, r
    m = re.search(r"thread (\d+) \(.*\) had a return address into 'park_here'", r.stderr)
    assert m and m.group(1) in tids, r.stderr
    assert "full update" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    threads_free(srv.pid)
    assert attach_maps(srv.pid) == []
    assert srv.q("unpark") == ["ok"]
    assert f.readline().strip() == "2"
    r = molt("attach", "--check-active", srv.pid, built["park"])
    assert r.returncode == 0, r.stderr
    f.write("park\n")
    f.flush()
    assert f.readline().strip() == "3"  # the new park_here
    s.close()
    assert molt("rollback", srv.pid).returncode == 0
    r = molt("status", "--check-active", srv.pid)
    assert r.returncode == 2 and "applies only to attach" in r.stderr


def test_threads_created_during_the_stop(built, server):
    # two threads create and join short-lived threads without pause: every
    # attach meets threads that appear or end while it seizes the others
    srv = server(workers=2, churners=2)
    for _ in range(20):
        r = molt("attach", srv.pid, built["fix"])
        assert r.returncode == 0, r.stderr
        threads_free(srv.pid)
        assert srv.answer(3) == 9
        r = molt("rollback", srv.pid)
        assert r.returncode == 0, r.stderr
        threads_free(srv.pid)
        assert srv.answer(3) == 6
    assert srv.stats()["churnbad"] == 0
    assert srv.p.poll() is None


def test_main_thread_gone(built, server):
    # main() called pthread_exit: the staging runs on another thread
    srv = server(workers=2, env={"SERVER_MAIN_EXITS": "1"})
    time.sleep(0.2)
    assert "Z" in open("/proc/%d/stat" % srv.pid).read().split(")")[1].split()[0]
    r = molt("attach", srv.pid, built["fix"])
    assert r.returncode == 0, r.stderr
    assert srv.answer(3) == 9
    assert molt("rollback", srv.pid).returncode == 0
    assert srv.answer(3) == 6
    threads_free(srv.pid)


def test_refused_before_anything_stops(built, server):
    srv = server()
    other = server(built["server2"])
    cases = [
        (other, built["fix"], "build-id"),
        (srv, built["branchy"], "branches into the first bytes"),
        (srv, built["tiny"], "too short for a jump"),
        (srv, built["nosuch"], "not a function of the target"),
        (srv, "/etc/hostname", "not an ELF file"),
    ]
    for s, patch, why in cases:
        maps = open("/proc/%d/maps" % s.pid).read()
        r = molt("attach", s.pid, patch)
        assert r.returncode == 1, (patch, r)
        assert why in r.stderr, (patch, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert open("/proc/%d/maps" % s.pid).read() == maps
        assert not os.path.exists("/run/molt/attach/%d" % s.pid)
        threads_free(s.pid)
    assert srv.answer(4) == 8 and other.answer(4) == 9


def test_corrupt_patch_refused(built, server, tmp_path):
    srv = server()
    data = open(built["fix"], "rb").read()
    cut = tmp_path / "cut.so"
    cut.write_bytes(data[:len(data) // 2])
    maps = open("/proc/%d/maps" % srv.pid).read()
    r = molt("attach", srv.pid, str(cut))
    assert r.returncode == 1 and "corrupt attach patch" in r.stderr, r
    assert open("/proc/%d/maps" % srv.pid).read() == maps
    threads_free(srv.pid)


def test_ptrace_refused_to_another_user(built, server, tmp_path):
    # a root-owned server, molt run as nobody: one clear line, exit 3,
    # the server untouched
    srv = server()
    import pathlib
    import tempfile
    d = pathlib.Path(tempfile.mkdtemp(prefix="molt-attach-pub-"))
    os.chmod(str(d), 0o755)
    patch = d / "fix.so"
    patch.write_bytes(open(built["fix"], "rb").read())
    os.chmod(str(patch), 0o644)
    maps = open("/proc/%d/maps" % srv.pid).read()

    def as_nobody():
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    r = subprocess.run([MOLT, "attach", str(srv.pid), str(patch)], capture_output=True,
                       text=True, timeout=60, preexec_fn=as_nobody)
    assert r.returncode == 3, r
    assert "ptrace of process %d refused" % srv.pid in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert open("/proc/%d/maps" % srv.pid).read() == maps
    assert srv.answer(2) == 4
    patch.unlink()
    d.rmdir()


def test_priority_named_in_the_output(built, server):
    """molt attach and molt rollback raise molt to SCHED_FIFO 1 first thing
    (root may) and say so, with where the run's time went from molt's
    start; a molt started real-time (chrt) is left at its priority and
    says that instead."""
    srv = server(workers=4)
    before = policies(srv.pid)
    r = molt("attach", srv.pid, built["fix"])
    assert r.returncode == 0, r.stderr
    assert re.search(r"^took [\d.]+ ms \(start [\d.]+, prepare [\d.]+, staging ", r.stdout,
                     re.M), r.stdout
    assert re.search(r"^priority SCHED_FIFO 1; before its first step molt waited [\d.]+ ms "
                     r"for a CPU$", r.stdout, re.M), r.stdout
    assert srv.answer(5) == 15
    r = molt("rollback", srv.pid)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^took [\d.]+ ms \(start [\d.]+, prepare ", r.stdout, re.M), r.stdout
    assert re.search(r"^priority SCHED_FIFO 1;", r.stdout, re.M), r.stdout
    r = sh(["chrt", "-f", "3", MOLT, "attach", str(srv.pid), built["fix"]])
    assert r.returncode == 0, r.stderr
    assert re.search(r"^priority SCHED_FIFO 3, as molt was started;", r.stdout, re.M), r.stdout
    assert molt("rollback", srv.pid).returncode == 0
    assert srv.answer(5) == 10
    # the target's threads keep their own policies
    assert policies(srv.pid) == before
    threads_free(srv.pid)


def test_attach_as_a_user_without_privileges(built, server):
    """An unprivileged owner of the process attaches and rolls back: with
    RLIMIT_RTPRIO 0 and RLIMIT_NICE 0 molt may not raise its priority, and
    carries on at the normal one and says so.  (RLIMIT_RTPRIO 1, with which
    such a user gets SCHED_FIFO 1, needs CAP_SYS_RESOURCE to grant, which
    root of a container may lack.)"""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="molt-unprivileged-")
    try:
        os.chmod(d, 0o755)
        exe, patch = os.path.join(d, "server"), os.path.join(d, "fix.so")
        shutil.copy(built["server1"], exe)
        shutil.copy(built["fix"], patch)
        records = os.path.join(d, "records")
        os.mkdir(records)
        os.chown(records, 65534, 65534)

        def as_nobody():
            import resource
            resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
            resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)

        srv = server(exe, workers=4, preexec=as_nobody)
        before = policies(srv.pid)
        env = dict(os.environ, MOLT_ATTACH_DIR=records)

        def run(*args):
            return subprocess.run([MOLT] + [str(a) for a in args], capture_output=True,
                                  text=True, timeout=120, preexec_fn=as_nobody, env=env)

        r = run("attach", srv.pid, patch)
        assert r.returncode == 0, r.stderr
        assert re.search(r"^priority normal: molt may not raise it \(root, CAP_SYS_NICE "
                         r"or RLIMIT_RTPRIO >= 1 needed\)", r.stdout, re.M), r.stdout
        assert srv.answer(7) == 21
        r = run("rollback", srv.pid)
        assert r.returncode == 0, r.stderr
        assert "priority normal:" in r.stdout, r.stdout
        assert srv.answer(7) == 14
        assert attach_maps(srv.pid) == []
        assert policies(srv.pid) == before
        threads_free(srv.pid)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_decoder_loaded_on_first_use(built, server):
    """capstone is not a library molt needs at its start (its relocations
    cost ~1 ms of CPU at every exec, before molt can raise its priority):
    molt loads it when an attach first decodes a function."""
    needed = sh(["readelf", "-d", MOLT]).stdout
    assert "libc.so" in needed and "capstone" not in needed, needed
    env = dict(os.environ, LD_DEBUG="files")
    r = sh([MOLT, "--version"], env=env)
    assert r.returncode == 0 and "capstone" not in r.stderr
    srv = server(workers=2)
    r = sh([MOLT, "attach", str(srv.pid), built["fix"]], env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(r"file=libcapstone\S*\s+\[0\];\s+dynamically loaded by", r.stderr), \
        r.stderr[-2000:]
    assert srv.answer(4) == 12
    assert molt("rollback", srv.pid).returncode == 0


def test_no_process_and_no_attach(built, server):
    r = molt("attach", "999999", built["fix"])
    assert r.returncode == 3 and "no process" in r.stderr
    srv = server()
    r = molt("rollback", srv.pid)
    assert r.returncode != 0


def test_blocked_calls_see_no_eintr(built, server):
    srv = server(workers=2)
    # x86-64 numbers; glibc's nanosleep is clock_nanosleep, its epoll_wait
    # may be epoll_pwait
    names = {0: "read", 35: "nanosleep", 230: "nanosleep", 43: "accept", 202: "futex",
             232: "epoll_wait", 281: "epoll_wait", 208: "io_getevents",
             333: "io_pgetevents"}
    seen = set()
    deadline = time.time() + 5
    while seen != set(names.values()) and time.time() < deadline:
        for tid in os.listdir("/proc/%d/task" % srv.pid):
            try:
                nr = int(open("/proc/%d/task/%s/syscall" % (srv.pid, tid)).read().split()[0])
            except (ValueError, FileNotFoundError):
                continue
            if nr in names:
                seen.add(names[nr])
        time.sleep(0.05)
    assert seen == set(names.values()), "threads not blocked in every call: %s" % seen
    for _ in range(15):
        assert molt("attach", srv.pid, built["fix"]).returncode == 0
        assert molt("rollback", srv.pid).returncode == 0
    time.sleep(0.2)
    st = srv.stats()
    assert st["eintr"] == 0, st
    assert st["early"] == 0, st


def guardians(of):
    """molt's guardian processes (molt-guard) whose parent is `of`."""
    out = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and open("/proc/%s/comm" % d).read().strip() == "molt-guard" \
                    and int(open("/proc/%s/stat" % d).read().rsplit(")", 1)[1].split()[1]) == of:
                out.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return out


@pytest.mark.parametrize("point", ["prepared", "staging", "staged", "stopped", "applied"])
def test_killed_midway(built, server, point):
    """molt killed (SIGKILL) at each point of an attach: the target is
    patched or untouched, never left stopped or traced; killed during the
    staging calls (between two of them), the thread they run on, raised to
    SCHED_FIFO for that window, gets its own policy back from molt's
    guardian process."""
    srv = server(workers=4)
    before = policies(srv.pid)
    env = dict(os.environ, MOLT_ATTACH_TEST_PAUSE=point)
    p = subprocess.Popen([MOLT, "attach", str(srv.pid), built["fix"]], env=env,
                         stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    assert line.strip() == "molt-attach-paused " + point, line
    if point == "staging":
        # the window is open: one thread raised, a guardian watching molt
        raised = {t: v for t, v in policies(srv.pid).items() if v != before.get(t)}
        assert len(raised) == 1, raised
        policy, priority, _ = list(raised.values())[0]
        assert policy & ~os.SCHED_RESET_ON_FORK == os.SCHED_FIFO and priority == 1, raised
        assert len(guardians(p.pid)) == 1
    p.send_signal(signal.SIGKILL)
    p.wait()
    time.sleep(0.1)
    threads_free(srv.pid)
    # the thread raised for the staging calls has its policy back (molt's
    # guardian put it back when molt died)
    assert policies(srv.pid) == before
    a = srv.answer(6)
    # patched or untouched, never in between
    assert a == (18 if point == "applied" else 12)
    assert srv.stats()["bad"] == 0
    # what is left is known to the next molt, and rollback cleans it up
    # (killed between memfd_create and close: the descriptor too)
    r = molt("rollback", srv.pid)
    assert r.returncode == 0, r.stderr
    assert srv.answer(6) == 12
    assert attach_maps(srv.pid) == []
    assert attach_fds(srv.pid) == []
    assert not os.path.exists("/run/molt/attach/%d" % srv.pid)
    threads_free(srv.pid)


def test_rollback_sees_stacks_mapped_since(built, server):
    """Rollback looks for users of the staged code again and again until
    none is left, reading the target's maps each time: a thread created
    meanwhile, running the patch's code on a stack mapped after the first
    look, keeps the code mapped until it is done (was: its stack was not
    seen, the code unmapped under it, the server crashed)."""
    srv = server(workers=4)
    assert molt("attach", srv.pid, built["helper"]).returncode == 0
    s, f = srv.connect()
    t0 = time.time()
    f.write("4242\n")
    f.flush()
    time.sleep(0.1)
    r = molt("rollback", srv.pid)
    assert r.returncode == 0, r.stderr
    assert f.readline().strip() == "1"
    s.close()
    time.sleep(max(0, t0 + 1.6 - time.time()))  # past the helper thread's end
    assert srv.p.poll() is None, "the server died"
    assert srv.answer(5) == 10
    # the helper's stack, which the program has not freed yet, still holds
    # words pointing into the patch (its start routine among them): kept
    assert "kept mapped" in r.stdout, r.stdout
    assert attach_maps(srv.pid) != []
    assert srv.q("reap") == ["1"]  # the program joins it, unmaps its stack
    r = molt("rollback", srv.pid)
    assert r.returncode == 0 and "kept mapped" not in r.stdout, r
    assert attach_maps(srv.pid) == []
    assert not os.path.exists("/run/molt/attach/%d" % srv.pid)
    threads_free(srv.pid)


def soft_dirty():
    """Whether this kernel tracks soft-dirty pages (CONFIG_MEM_SOFT_DIRTY):
    a page written after clear_refs "4" has bit 55 of its pagemap entry."""
    import mmap
    import struct
    page = mmap.mmap(-1, 4096)
    page[0] = 1
    addr = ctypes_address(page)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("4")
    page[0] = 2
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // 4096 * 8)
        entry = struct.unpack("<Q", f.read(8))[0]
    page.close()
    return bool(entry & (1 << 55))


def ctypes_address(buf):
    import ctypes
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


KEPT = re.compile(r"^note: kept mapped: a word at (0x[0-9a-f]+) in (.+) points into the "
                  r"patch \((0x[0-9a-f]+) ([^)]+)\); molt rollback \d+ unmaps it once unused$",
                  re.M)


@pytest.mark.parametrize("scan,pagemap", [("", ""), ("both", ""), ("", "read")])
def test_pointers_into_the_patch_keep_it_mapped(built, server, monkeypatch, scan, pagemap):
    """fix_hook.c's setup() stores pointers into the patch in the program's
    tables of handlers: its thrice() and its label "patched" in a global
    table (slot 1) or in one on the heap (slot 5), its label
    "patched-label" alone in slot 3.  A rollback restores setup() at once
    but keeps the patch's code and data mapped while the program keeps any
    of them, and says where; the program goes on calling and reading them.
    Once it drops them, the next rollback, or the next attach, unmaps the
    code.  (Was: unmapped as soon as no thread ran it, and the next call
    through the table crashed the server.)  molt reads the memory once
    while the threads run and again, in the stop, the pages written since
    (soft-dirty); on a kernel without soft-dirty tracking everything in the
    stop.  With MOLT_ATTACH_TEST_SCAN=both the first pass runs on any
    kernel, and the stop reads everything again; MOLT_ATTACH_TEST_PAGEMAP=
    read finds the pages to read from /proc/PID/pagemap's entries, as on a
    kernel without the PAGEMAP_SCAN ioctl."""
    import json
    monkeypatch.setenv("MOLT_ATTACH_TEST_SCAN", scan)
    monkeypatch.setenv("MOLT_ATTACH_TEST_PAGEMAP", pagemap)
    srv = server(workers=2)
    exe = built["server1"]
    table = load_base(exe, srv.pid) + int(
        re.search(r"^([0-9a-f]+) b handler_table$", nm_of(exe), re.M).group(1), 16)
    assert molt("attach", srv.pid, built["hook"]).returncode == 0
    assert srv.q("reg 1", "call 1 5", "reg 3", "call 3 5") == \
        ["1", "patched 15", "1", "patched-label 10"]
    r = molt("rollback", srv.pid)
    assert r.returncode == 0, r
    # setup() is the program's again; the stored pointers still work
    try:
        assert srv.q("reg 2", "call 2 5", "call 1 5", "call 3 5") == \
            ["0", "plain 10", "patched 15", "patched-label 10"]
    finally:
        time.sleep(0.05)
        assert srv.p.poll() is None, "the server died (%s)" % srv.p.returncode
    m = KEPT.search(r.stdout)
    assert m, r.stdout
    # the first word found: slot 1's function, in the program's .bss
    assert int(m.group(1), 16) == table + 16 and m.group(4) == "thrice+0", r.stdout
    assert attach_maps(srv.pid) != []
    assert "kept mapped: a word at %s" % m.group(1) in molt("status", srv.pid).stdout
    log = json.loads(molt("log", "--json", srv.pid).stdout)
    assert log[-1]["event"] == "rollback" and \
        "kept mapped: a word at %s" % m.group(1) in log[-1]["message"], log[-1]
    # slot 1 dropped: slot 3's label (a string literal of the patch) is left
    assert srv.q("drop 1") == ["ok"]
    r = molt("rollback", srv.pid)
    m = KEPT.search(r.stdout)
    assert r.returncode == 0 and m, r
    assert int(m.group(1), 16) == table + 3 * 16 + 8, r.stdout
    assert m.group(4).startswith("patch offset 0x"), r.stdout  # no symbol there
    assert srv.q("call 3 5") == ["patched-label 10"]
    assert srv.q("drop 3") == ["ok"]
    r = molt("rollback", srv.pid)
    assert r.returncode == 0 and "kept mapped" not in r.stdout, r
    assert attach_maps(srv.pid) == []
    log = json.loads(molt("log", "--json", srv.pid).stdout)
    assert log[-1]["event"] == "reclaim", log[-1]
    m = re.search(r"memory scanned for pointers into it: ([0-9.]+) MiB in [0-9.]+ ms while "
                  r"running, ([0-9.]+) MiB in [0-9.]+ ms stopped", log[-1]["message"])
    assert m and float(m.group(2)) > 0, log[-1]
    assert (float(m.group(1)) > 0) == (scan == "both" or soft_dirty()), log[-1]

    # on the heap; the next attach reclaims it once the program dropped it
    assert molt("attach", srv.pid, built["hook"]).returncode == 0
    assert srv.q("reg 5", "call 5 4") == ["1", "patched 12"]
    r = molt("rollback", srv.pid)
    m = KEPT.search(r.stdout)
    assert r.returncode == 0 and m, r
    assert m.group(2) == "[heap]" and m.group(4) == "thrice+0", r.stdout
    assert srv.q("call 5 4") == ["patched 12"]
    kept = attach_maps(srv.pid)
    assert srv.q("drop 5") == ["ok"]
    r = molt("attach", srv.pid, built["fix"])
    assert r.returncode == 0, r
    assert [e["event"] for e in json.loads(molt("log", "--json", srv.pid).stdout)][-2:] == \
        ["reclaim", "attach"]
    assert not set(kept) & set(attach_maps(srv.pid))
    assert srv.answer(7) == 21
    assert molt("rollback", srv.pid).returncode == 0
    assert attach_maps(srv.pid) == []
    assert srv.q("call 5 4", "reg 6", "call 6 4") == ["none", "0", "plain 8"]
    assert srv.p.poll() is None
    threads_free(srv.pid)


def test_scan_limit_keeps_the_code_mapped(built, server, monkeypatch):
    """The scan for pointers into the patch reads at most --scan-limit MiB
    (64 by default) with every thread stopped; past it the rollback
    restores the functions, keeps the code mapped and says how to unmap it
    (MOLT_ATTACH_TEST_SCAN=stopped: the stop reads all the memory, as on a
    kernel without soft-dirty tracking).  A rollback with the default
    limit then reclaims it.  A bad or misplaced --scan-limit is refused."""
    import json
    monkeypatch.setenv("MOLT_ATTACH_TEST_SCAN", "stopped")
    srv = server(workers=2, env={"SERVER_HEAP_MB": "24"})
    plain = srv.answer(7)
    assert molt("attach", srv.pid, built["fix"]).returncode == 0
    assert srv.answer(7) == 21 != plain
    for bad in ("0", "x", "-3", "9" * 30):
        r = molt("rollback", srv.pid, "--scan-limit", bad)
        assert r.returncode == 2 and "invalid scan limit" in r.stderr, r
    r = molt("status", srv.pid, "--scan-limit", "8")
    assert r.returncode == 2 and "--scan-limit applies only to rollback" in r.stderr, r
    assert srv.answer(7) == 21  # nothing touched by the refused commands
    r = molt("rollback", srv.pid, "--scan-limit", "4")
    assert r.returncode == 0, r
    assert srv.answer(7) == plain
    note = ("kept mapped: the check for pointers into it would read over 4 MiB with every "
            "thread stopped (no soft-dirty tracking); molt rollback %d --scan-limit MIB "
            "unmaps it" % srv.pid)
    assert note in r.stdout, r.stdout
    assert attach_maps(srv.pid) != []
    assert note in molt("status", srv.pid).stdout
    log = json.loads(molt("log", "--json", srv.pid).stdout)
    assert log[-1]["event"] == "rollback" and note in log[-1]["message"], log[-1]
    r = molt("rollback", srv.pid)  # 64 MiB: more than the server's 24 and the rest
    assert r.returncode == 0 and "kept mapped" not in r.stdout, r
    assert attach_maps(srv.pid) == []
    assert json.loads(molt("log", "--json", srv.pid).stdout)[-1]["event"] == "reclaim"
    assert srv.answer(7) == plain and srv.p.poll() is None
    threads_free(srv.pid)


@pytest.mark.parametrize("point,sig", [("staging", signal.SIGTERM),
                                       ("staged", signal.SIGINT),
                                       ("stopped", signal.SIGTERM)])
def test_interrupted_midway(built, server, point, sig):
    """SIGTERM or SIGINT (Ctrl-C) of molt at a point of an attach before
    the jumps: molt goes on to its next safe point, undoes the staging,
    says so, and ends with the signal; the target is untouched (was, in
    the staging step: the hijacked thread resumed with the registers of a
    system call)."""
    srv = server(workers=4)
    maps = open("/proc/%d/maps" % srv.pid).read()
    before = policies(srv.pid)
    env = dict(os.environ, MOLT_ATTACH_TEST_PAUSE=point)
    p = subprocess.Popen([MOLT, "attach", str(srv.pid), built["fix"]], env=env,
                         stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    assert line.strip() == "molt-attach-paused " + point, line
    p.send_signal(sig)
    rest = p.stderr.read()
    assert p.wait() == -sig, (p.returncode, rest)
    assert "interrupted by %s; " % sig.name in rest, rest
    assert "the program is unchanged" in rest, rest
    time.sleep(0.1)
    threads_free(srv.pid)
    assert srv.p.poll() is None
    assert open("/proc/%d/maps" % srv.pid).read() == maps
    assert policies(srv.pid) == before
    assert not os.path.exists("/run/molt/attach/%d" % srv.pid)
    assert srv.answer(6) == 12
    st = srv.stats()
    assert st["eintr"] == 0 and st["bad"] == 0, st


def test_static_does_not_shadow_a_library_function(built, server):
    """server_statics.c has a static atol (answers 7777); the patch calls
    the C library's atol: bound to the library, as the loader would."""
    srv = server()
    r = molt("attach", srv.pid, built["atol"])
    assert r.returncode == 0, r.stderr
    assert srv.answer(7) == 21
    assert molt("rollback", srv.pid).returncode == 0
    assert srv.answer(7) == 14


def test_libraries_in_the_loaders_order(built, server, tmp_path):
    """A preloaded library defines atol: the loader binds the program's
    calls to it, ahead of libc's (which its mapping comes before), and
    the patch's must be bound alike.  Its file is replaced on disk after
    it was loaded: molt reads the mapped one (/proc/PID/map_files), not
    whatever the path names now."""
    lib = str(tmp_path / "interpose.so")
    src = os.path.join(HERE, "interpose.c")
    r = sh(["gcc", "-O2", "-shared", "-fPIC", "-o", lib, src])
    assert r.returncode == 0, r.stderr
    srv = server(env={"LD_PRELOAD": lib})
    assert srv.answer(7) == 14  # the program's answer calls strtol
    other = str(tmp_path / "other.so")
    r = sh(["gcc", "-O2", "-shared", "-fPIC", "-DINTERPOSE_OTHER", "-o", other, src])
    assert r.returncode == 0, r.stderr
    os.rename(other, lib)
    r = molt("attach", srv.pid, built["atol"])
    assert r.returncode == 0, r.stderr
    assert srv.answer(7) == 1021
    assert molt("rollback", srv.pid).returncode == 0
    assert srv.answer(7) == 14


def test_long_record_in_the_state_pages(built, server, tmp_path):
    """A patch of 40 functions with long names: its record (about 7 KiB)
    is whole in the state pages in the target, so a second molt finds the
    attach without the file under /run and rolls it back from them (was:
    a record past 4 KiB was silently left out of the state page)."""
    names = ["replaceable_function_with_a_rather_long_name_number_%02d_%s" % (i, "x" * 50)
             for i in range(40)]
    prog = tmp_path / "many.c"
    prog.write_text(
        "#include <stdio.h>\n#include <unistd.h>\n" +
        "".join("__attribute__((noinline)) long %s(long n) { volatile long k = n; "
                "return k * %d + 7; }\n" % (n, i + 2) for i, n in enumerate(names)) +
        "long (*volatile table[])(long) = {%s};\n" % ", ".join(names) +
        "int main(void) { printf(\"port 0\\n\"); fflush(stdout); "
        "for (;;) pause(); }\n")
    exe = str(tmp_path / "many")
    r = sh(["gcc", "-O2", "-o", exe, str(prog)])
    assert r.returncode == 0, r.stderr
    fix = tmp_path / "many_fix.c"
    fix.write_text("".join("long %s(long n) { return n + %d; }\n" % (n, i)
                           for i, n in enumerate(names)))
    so = str(tmp_path / "many_fix.so")
    r = sh([MOLTCC, "--molt-attach", "--molt-target", exe, "-O2", "-o", so, str(fix)])
    assert r.returncode == 0, r.stderr
    srv = server(exe)
    r = molt("attach", srv.pid, so)
    assert r.returncode == 0, r.stderr
    rec = "/run/molt/attach/%d" % srv.pid
    assert os.path.getsize(rec) > 4096 + 2048
    os.unlink(rec)
    import json
    r = molt("status", "--json", srv.pid)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert sorted(f["name"] for f in j["functions"]) == sorted(names)
    assert all(f["state"] == "patched" for f in j["functions"])
    r = molt("rollback", srv.pid)
    assert r.returncode == 0, r.stderr
    assert "40 functions restored" in r.stdout
    assert attach_maps(srv.pid) == []
    threads_free(srv.pid)


def test_patch_of_256_functions(built, tmp_path):
    """bench/attach's generated target with 256 functions, 8 threads
    calling them all in a loop: the patch replacing every one attaches
    (was: refused past 64 functions), its record is whole in the state
    pages (found there without the file under /run), and the rollback puts
    every function's bytes back."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "attach_bench", os.path.join(HERE, "..", "..", "bench", "attach", "bench.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    exe, so = bench.build_target(str(tmp_path), 256, os.path.dirname(os.path.dirname(MOLTCC)))
    nm = sh(["nm", exe]).stdout
    addrs = {m.group(2): int(m.group(1), 16)
             for m in re.finditer(r"^([0-9a-f]+) T (f\d+)$", nm, re.M)}
    assert len(addrs) == 256
    p = subprocess.Popen([exe, "8", "busy"], stdout=subprocess.PIPE, text=True)

    def entries():
        base = None
        for l in open("/proc/%d/maps" % p.pid):
            f = l.split()
            if len(f) >= 6 and f[5] == os.path.realpath(exe) and int(f[2], 16) == 0:
                base = int(f[0].split("-")[0], 16)
                break
        with open("/proc/%d/mem" % p.pid, "rb") as m:
            out = {}
            for name, a in addrs.items():
                m.seek(base + a)
                out[name] = m.read(16)
            return out
    try:
        assert p.stdout.readline() == "ready\n"
        before = entries()
        r = molt("attach", "--timeout", "20", p.pid, so)
        assert r.returncode == 0, r.stderr
        assert "256 functions" in r.stdout, r.stdout
        after = entries()
        assert all(after[n] != before[n] for n in addrs), "a function was not rewritten"
        os.unlink("/run/molt/attach/%d" % p.pid)
        import json
        r = molt("status", "--json", p.pid)
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        assert sorted(f["name"] for f in j["functions"]) == sorted(addrs)
        assert all(f["state"] == "patched" for f in j["functions"])
        r = molt("rollback", p.pid)
        assert r.returncode == 0, r.stderr
        assert "256 functions restored" in r.stdout, r.stdout
        assert entries() == before
        threads_free(p.pid)
    finally:
        if os.path.exists("/run/molt/attach/%d" % p.pid):
            molt("rollback", p.pid)
        p.kill()
        p.wait()


@pytest.mark.parametrize("kind,why", [
    ("memfd", "refuses memfd_create (EPERM)"),
    ("killexec", "kills the process on mmap of a shared file mapping with "
                 "PROT_READ|PROT_EXEC"),
])
def test_seccomp_filter_refuses(built, server, kind, why):
    """A target under a seccomp filter that refuses a system call molt
    would run in it: molt reads the filter, runs it on each planned call
    and refuses before running any -- one line naming the call and what
    the filter does, the target unchanged and alive (a KILL verdict would
    have ended it)."""
    srv = server(workers=2, env={"SERVER_SECCOMP": kind})
    assert "Seccomp:\t2" in open("/proc/%d/status" % srv.pid).read()
    maps = open("/proc/%d/maps" % srv.pid).read()
    r = molt("attach", srv.pid, built["fix"])
    assert r.returncode == 1, r
    assert "runs under a seccomp filter that " + why in r.stderr, r.stderr
    assert "nothing was changed" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert srv.p.poll() is None
    threads_free(srv.pid)
    assert open("/proc/%d/maps" % srv.pid).read() == maps
    assert not os.path.exists("/run/molt/attach/%d" % srv.pid)
    assert srv.answer(4) == 8


def test_memory_deny_write_execute(built, server):
    """systemd's MemoryDenyWriteExecute= filter and the kernel's
    PR_SET_MDWE refuse memory both writable and executable, and making
    memory executable later; the staged code is neither (mapped read+exec
    from a memfd that only molt writes), so the attach goes through and
    the restriction stays in force."""
    srv = server(workers=2, env={"SERVER_SECCOMP": "mdwe"})
    assert srv.q("mprotect-exec") == ["0"]
    r = molt("attach", srv.pid, built["fix"])
    assert r.returncode == 0, r.stderr
    assert srv.answer(4) == 12
    assert srv.q("mprotect-exec") == ["0"]
    assert molt("rollback", srv.pid).returncode == 0
    assert srv.answer(4) == 8
    assert attach_maps(srv.pid) == []


def test_log_of_an_attached_process(built, server):
    """molt log PID: every attach, rollback, refusal and reclamation, with
    the patch, the functions, the stop, read by later molt runs from the
    log kept beside the record (it outlives the record)."""
    import json
    srv = server(workers=2)
    assert molt("attach", srv.pid, built["fix"]).returncode == 0
    assert molt("attach", srv.pid, built["fix"]).returncode == 0  # stacked on it
    assert molt("rollback", srv.pid).returncode == 0
    assert molt("rollback", srv.pid).returncode == 0
    assert molt("attach", srv.pid, built["tiny"]).returncode == 1  # too short
    # a rollback that has to keep the code mapped, and its reclamation
    assert molt("attach", srv.pid, built["helper"]).returncode == 0
    s, f = srv.connect()
    f.write("4242\n")
    f.flush()
    time.sleep(0.1)
    r = molt("rollback", "--timeout", "0.1", srv.pid)
    assert r.returncode == 0 and "kept mapped" in r.stdout, r
    assert f.readline().strip() == "1"
    s.close()
    time.sleep(1.2)  # the patch's helper thread is done
    # its stack, not yet freed, still points into the patch: kept (no entry)
    r = molt("rollback", srv.pid)
    assert r.returncode == 0 and "kept mapped: a word at" in r.stdout, r
    assert srv.q("reap") == ["1"]
    assert molt("rollback", srv.pid).returncode == 0
    assert attach_maps(srv.pid) == []
    assert not os.path.exists("/run/molt/attach/%d" % srv.pid)
    r = molt("log", "--json", srv.pid)
    assert r.returncode == 0, r.stderr
    log = json.loads(r.stdout)
    assert [e["event"] for e in log] == ["attach", "attach", "rollback", "rollback",
                                         "refused", "attach", "rollback", "reclaim"], log
    assert [e["seq"] for e in log] == list(range(1, 9))
    assert all(abs(e["time"] - time.time()) < 120 for e in log)
    for a in log[0:2]:
        assert a["patch"] == built["fix"] and sorted(a["functions"]) == ["answer", "spin_copy"]
        assert a["stop_ms"] > 0 and a["threads"] > 2
    for r in log[2:4]:
        assert r["stop_ms"] > 0 and "staged code unmapped" in r["message"]
    assert log[4]["patch"] == built["tiny"] and "too short" in log[4]["message"]
    assert "kept mapped" in log[6]["message"] and log[6]["functions"] == ["answer"]
    assert log[7]["patch"] == built["helper"]
    text = molt("log", srv.pid).stdout
    assert text.splitlines()[0].split()[:3] == ["SEQ", "TIME", "EVENT"]
    assert len(text.splitlines()) == 9
    other = server(workers=1)
    r = molt("log", other.pid)
    assert r.returncode != 0


def test_rollback_under_a_filter_installed_since(built, server):
    """A filter installed after the attach kills the process on a munmap
    of the staged code: the rollback restores the functions, finds out
    before it runs the munmap, and keeps the code mapped saying why."""
    srv = server(workers=2)
    assert molt("attach", srv.pid, built["fix"]).returncode == 0
    assert srv.q("guard-unmap") == ["1"]
    r = molt("rollback", srv.pid)
    assert r.returncode == 0, r.stderr
    assert "kills the process on munmap" in r.stdout, r.stdout
    assert srv.p.poll() is None
    assert srv.answer(5) == 10
    assert len(attach_maps(srv.pid)) > 0
    threads_free(srv.pid)


def test_one_molt_at_a_time(built, server):
    """A second molt on the same process while the first is under way is
    refused, and touches nothing of the first's (its record included)."""
    srv = server(workers=4)
    env = dict(os.environ, MOLT_ATTACH_TEST_PAUSE="staged")
    p = subprocess.Popen([MOLT, "attach", str(srv.pid), built["fix"]], env=env,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()
        assert line.strip() == "molt-attach-paused staged", line
        record = "/run/molt/attach/%d" % srv.pid
        with open(record) as f:
            before = f.read()
        for args in (("attach", srv.pid, built["fix"]), ("rollback", srv.pid)):
            r = molt(*args)
            assert r.returncode != 0
            assert "another molt is attaching to or rolling back process %d" % srv.pid \
                in r.stderr, r.stderr
        with open(record) as f:
            assert f.read() == before
    finally:
        p.kill()
        p.wait()
    threads_free(srv.pid)
    # the lock went with the killed molt: the next one proceeds
    r = molt("rollback", srv.pid)
    assert r.returncode == 0, r.stderr
    assert srv.answer(6) == 12
    assert attach_maps(srv.pid) == []
    threads_free(srv.pid)


# ---- molt attach --all ----------------------------------------------------------


@pytest.fixture(scope="module")
def built_all(built, tmp_path_factory):
    """server.c built with a tag of its own (a build-id no other copy has:
    attach --all must find this run's processes only) and fix_all.c for it."""
    import uuid
    d = tmp_path_factory.mktemp("attach_all")
    exe = str(d / "server_all")
    r = sh(["gcc", "-O2", "-pthread", '-DSERVER_TAG="%s"' % uuid.uuid4().hex, "-o", exe,
            os.path.join(HERE, "server.c")])
    assert r.returncode == 0, r.stderr
    so = str(d / "fix_all.so")
    r = sh([MOLTCC, "--molt-attach", "--molt-target", exe, "-O2", "-o", so,
            os.path.join(HERE, "fix_all.c")])
    assert r.returncode == 0, r.stderr
    return {"exe": exe, "patch": so}


def forked(srv, n):
    """The master's pid and its n workers', each once its threads run."""
    deadline = time.time() + 10
    while time.time() < deadline:
        kids = open("/proc/%d/task/%d/children" % (srv.pid, srv.pid)).read().split()
        pids = [srv.pid] + [int(k) for k in kids]
        if len(pids) == n + 1 and all(len(os.listdir("/proc/%d/task" % p)) >= 8
                                      for p in pids):
            return sorted(pids)
        time.sleep(0.05)
    raise AssertionError("the workers did not start")


def answers_by_process(srv, pids, n=7, tries=300):
    """answer(n) as each process gives it, over fresh connections (the
    kernel hands each to a thread of any process)."""
    seen = {}
    for _ in range(tries):
        stats, got = srv.q("stats", str(n))
        seen[int(stats.split()[-1])] = int(got)
        if set(seen) == set(pids):
            break
    return seen


def test_attach_all_master_and_workers(built_all, server):
    exe, patch = built_all["exe"], built_all["patch"]
    srv = server(exe, workers=8, env={"SERVER_FORKS": "3"})  # 4 held by the load
    pids = forked(srv, 3)
    before = {p: symbol_bytes(exe, p, "answer") for p in pids}
    load = Load(srv)
    try:
        r = molt("attach", "--all", exe, patch)
        assert r.returncode == 0, r
        assert "attached %s to all 4 processes of %s" % (patch, exe) in r.stdout, r.stdout
        for p in pids:
            assert re.search(r"^  process %d: attached \(patch 1 of its stack" % p,
                             r.stdout, re.M), r.stdout
            threads_free(p)
            assert symbol_bytes(exe, p, "answer") != before[p]
        assert answers_by_process(srv, pids) == {p: 21 for p in pids}
        for p in pids:
            r = molt("rollback", p)
            assert r.returncode == 0, r
            assert symbol_bytes(exe, p, "answer") == before[p]
        assert answers_by_process(srv, pids) == {p: 14 for p in pids}
    finally:
        errors = load.finish()
    assert errors == []


def test_attach_all_rolls_back_on_failure(built_all, server):
    """One worker has a thread parked inside park()'s first bytes: its
    attach times out, the processes patched before it are rolled back, the
    ones after are never touched, and the load sees no wrong reply."""
    exe, patch = built_all["exe"], built_all["patch"]
    srv = server(exe, workers=8, env={"SERVER_FORKS": "3", "SERVER_PARK_WORKER": "2"})
    pids = forked(srv, 3)

    def parks(p):
        for tid in os.listdir("/proc/%d/task" % p):
            sc = open("/proc/%d/task/%s/syscall" % (p, tid)).read().split()
            if int(tid) != p and sc and sc[0] == "34":  # pause()
                return True
        return False

    deadline = time.time() + 5
    while not any(parks(p) for p in pids) and time.time() < deadline:
        time.sleep(0.05)
    parked = [p for p in pids if parks(p)]
    assert len(parked) == 1 and parked[0] != srv.pid, parked
    parked = parked[0]
    before = {p: symbol_bytes(exe, p, "answer") for p in pids}
    maps = {p: named_maps(p) for p in pids}
    load = Load(srv)
    try:
        r = molt("attach", "--all", "--timeout", "0.5", exe, patch)
    finally:
        errors = load.finish()
    assert errors == []
    assert r.returncode == 1, r
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "process %d: thread" % parked in r.stderr and "'park'" in r.stderr, r.stderr
    assert "no process is left patched by it" in r.stderr
    for p in pids:
        word = "rolled back" if p < parked else "failed" if p == parked else "not touched"
        assert re.search(r"^  process %d: %s" % (p, word), r.stdout, re.M), r.stdout
        threads_free(p)
        assert symbol_bytes(exe, p, "answer") == before[p]
        assert named_maps(p) == maps[p]
        assert not os.path.exists("/run/molt/attach/%d" % p)
    assert "rolled back" in r.stdout  # the master, at least, came before
    assert answers_by_process(srv, pids) == {p: 14 for p in pids}


def test_attach_all_refusals(built_all, built, server):
    exe, patch = built_all["exe"], built_all["patch"]
    r = molt("attach", "--all", exe, patch)
    assert r.returncode == 3 and "no running process of %s" % exe in r.stderr, r
    srv = server(exe, workers=2)
    r = molt("attach", "--all", exe, built["fix"])  # built for server1
    assert r.returncode == 1 and "the patch was built for build-id" in r.stderr, r
    r = molt("status", "--all", srv.pid)
    assert r.returncode == 2 and "--all applies only to attach" in r.stderr, r
    assert srv.answer(2) == 4 and attach_maps(srv.pid) == []


def as_nobody():
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def test_attach_all_with_another_users_process(built_all, server):
    """molt run as nobody: nobody's server and root's of the same program.
    Root's executable is hidden from nobody, but its name is the program's:
    it is counted in, cannot be traced, and nobody's is rolled back."""
    import shutil
    import tempfile
    pub = tempfile.mkdtemp(prefix="moltall-pub-")
    try:
        os.chmod(pub, 0o755)
        # a name of its own: another user's process is matched by its name
        exe = os.path.join(pub, "srv%d" % os.getpid())
        patch = os.path.join(pub, "fix_all.so")
        shutil.copy(built_all["exe"], exe)
        shutil.copy(built_all["patch"], patch)
        os.chmod(exe, 0o755)
        os.chmod(patch, 0o644)
        state = os.path.join(pub, "state")
        os.mkdir(state)
        os.chown(state, 65534, 65534)
        mine = server(exe, workers=2, env={"SERVER_PTRACER_ANY": "1"}, preexec=as_nobody)
        roots = server(exe, workers=2)
        before = {s.pid: symbol_bytes(exe, s.pid, "answer") for s in (mine, roots)}
        r = subprocess.run([MOLT, "attach", "--all", exe, patch], capture_output=True,
                           text=True, timeout=60, preexec_fn=as_nobody,
                           env=dict(os.environ, MOLT_ATTACH_DIR=state))
        assert r.returncode == 3, r
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "no process is left patched by it" in r.stderr
        scope = open("/proc/sys/kernel/yama/ptrace_scope").read().strip() \
            if os.path.exists("/proc/sys/kernel/yama/ptrace_scope") else "0"
        if scope in ("0", "1") and mine.pid < roots.pid:
            # nobody's was patched, then root's refused: nobody's rolled back
            assert re.search(r"^  process %d: rolled back" % mine.pid, r.stdout, re.M), r
        if scope in ("0", "1"):
            assert "process %d: ptrace of process %d refused" % (roots.pid, roots.pid) \
                in r.stderr, r.stderr
            assert re.search(r"^  process %d: failed" % roots.pid, r.stdout, re.M), r
        for s in (mine, roots):
            assert symbol_bytes(exe, s.pid, "answer") == before[s.pid]
            assert attach_maps(s.pid) == []
            assert s.answer(3) == 6
            threads_free(s.pid)
        # no record is left (the lock and the log, which outlives records, may be)
        assert [f for f in os.listdir(state)
                if f not in ("%d.lock" % mine.pid, "%d.log" % mine.pid)] == []
    finally:
        shutil.rmtree(pub, ignore_errors=True)
