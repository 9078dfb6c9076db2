"""molt attach end to end: a plainly built multi-threaded server
(server.c: gcc -O2, no molt, nothing preloaded) patched while it serves a
checking load, rolled back, refused, and molt killed half way.

Environment: MOLT_BUILD_DIR (bin/molt, bin/moltcc); ATTACH_CYCLES (attach
+ rollback cycles under load, default 50).  Runs as root (ptrace).
"""
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
        "helper": open(os.path.join(HERE, "fix_helper.c")).read(),
        "atol": open(os.path.join(HERE, "fix_atol.c")).read(),
        "park": open(os.path.join(HERE, "fix_park.c")).read(),
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
    return out


class Server:
    """server.c running; q() sends request lines on a fresh connection."""

    def __init__(self, exe, workers=8, spinners=0, churners=0, env=None):
        self.p = subprocess.Popen([exe, str(workers), str(spinners), str(churners)],
                                  stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, **(env or {})))
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

    def stats(self):
        words = self.q("stats")[0].split()
        return {words[i]: int(words[i + 1]) for i in range(0, len(words), 2)}

    def close(self):
        self.p.kill()
        self.p.wait()


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


def attach_maps(pid):
    return [l for l in open("/proc/%d/maps" % pid) if "molt-attach" in l]


def symbol_bytes(exe, pid, name, n=32):
    """The first n bytes of function `name` of exe in process pid."""
    nm = sh(["nm", exe]).stdout
    value = int(re.search(r"^([0-9a-f]+) T %s$" % name, nm, re.M).group(1), 16)
    base = None
    real = os.path.realpath(exe)
    for l in open("/proc/%d/maps" % pid):
        f = l.split()
        if len(f) >= 6 and f[5] == real and int(f[2], 16) == 0:
            base = int(f[0].split("-")[0], 16)
            break
    with open("/proc/%d/mem" % pid, "rb") as m:
        m.seek(base + value)
        return m.read(n)


class Load:
    """Client threads that send requests over kept connections and check
    each answer: 2n (original) or 3n (patched), nothing else, no error."""

    def __init__(self, srv, nclients=4):
        self.srv, self.stop, self.errors, self.count = srv, False, [], 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.client, args=(i,)) for i in range(nclients)]
        for t in self.threads:
            t.start()

    def client(self, i):
        try:
            s, f = self.srv.connect()
            n = i * 1000
            while not self.stop:
                n += 1
                f.write("%d\n" % n)
                f.flush()
                got = f.readline()
                if not got or int(got) not in (2 * n, 3 * n):
                    with self.lock:
                        self.errors.append("request %d: answer %r" % (n, got))
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


def test_attach_rollback_cycles_under_load(built, server):
    srv = server(workers=8)
    before = symbol_bytes(built["server1"], srv.pid, "answer")
    assert srv.answer(7) == 14
    load = Load(srv)
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
    # the staged code is gone once nothing runs it
    assert attach_maps(srv.pid) == []
    assert not os.path.exists("/run/molt/attach/%d" % srv.pid)
    print("stops (ms): median %.3f max %.3f" % (sorted(stops)[len(stops) // 2], max(stops)))


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
    r = molt("attach", srv.pid, built["fix"])
    assert r.returncode == 1 and "already has a patch attached" in r.stderr
    assert molt("rollback", srv.pid).returncode == 0
    assert srv.answer(5) == 10


def test_spinning_thread_retried_never_corrupted(built, server):
    # spin_copy's first instruction (rep movsb) runs long: a stop often
    # finds a spinner inside the bytes the jump replaces
    srv = server(workers=2, spinners=2)
    attempts = []
    for _ in range(6):
        r = molt("attach", "--timeout", "30", srv.pid, built["fix"])
        assert r.returncode == 0, r.stderr
        attempts.append(int(re.search(r"\((\d+) attempts?\)", r.stdout).group(1)))
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


@pytest.mark.parametrize("point", ["prepared", "staged", "stopped", "applied"])
def test_killed_midway(built, server, point):
    srv = server(workers=4)
    env = dict(os.environ, MOLT_ATTACH_TEST_PAUSE=point)
    p = subprocess.Popen([MOLT, "attach", str(srv.pid), built["fix"]], env=env,
                         stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    assert line.strip() == "molt-attach-paused " + point, line
    p.send_signal(signal.SIGKILL)
    p.wait()
    time.sleep(0.1)
    threads_free(srv.pid)
    a = srv.answer(6)
    # patched or untouched, never in between
    assert a == (18 if point == "applied" else 12)
    assert srv.stats()["bad"] == 0
    # what is left is known to the next molt, and rollback cleans it up
    r = molt("rollback", srv.pid)
    assert r.returncode == 0, r.stderr
    assert srv.answer(6) == 12
    assert attach_maps(srv.pid) == []
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
    assert attach_maps(srv.pid) == []
    assert not os.path.exists("/run/molt/attach/%d" % srv.pid)
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
    assert molt("attach", srv.pid, built["fix"]).returncode == 1  # attached already
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
    assert molt("rollback", srv.pid).returncode == 0
    assert attach_maps(srv.pid) == []
    assert not os.path.exists("/run/molt/attach/%d" % srv.pid)
    r = molt("log", "--json", srv.pid)
    assert r.returncode == 0, r.stderr
    log = json.loads(r.stdout)
    assert [e["event"] for e in log] == ["attach", "refused", "rollback", "refused",
                                         "attach", "rollback", "reclaim"], log
    assert [e["seq"] for e in log] == list(range(1, 8))
    assert all(abs(e["time"] - time.time()) < 120 for e in log)
    a = log[0]
    assert a["patch"] == built["fix"] and sorted(a["functions"]) == ["answer", "spin_copy"]
    assert a["stop_ms"] > 0 and a["threads"] > 2
    assert "already has a patch attached" in log[1]["message"]
    assert log[2]["stop_ms"] > 0 and "staged code unmapped" in log[2]["message"]
    assert log[3]["patch"] == built["tiny"] and "too short" in log[3]["message"]
    assert "kept mapped" in log[5]["message"] and log[5]["functions"] == ["answer"]
    assert log[6]["patch"] == built["helper"]
    text = molt("log", srv.pid).stdout
    assert text.splitlines()[0].split()[:3] == ["SEQ", "TIME", "EVENT"]
    assert len(text.splitlines()) == 8
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
