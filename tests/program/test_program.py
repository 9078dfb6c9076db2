"""Full updates end to end: `molt run` a program image (tests/program/
server.c), then `molt update` it, with real processes and threads.

Environment (set by tests/program/tests.cmake):
  MOLT_BUILD_DIR  the build tree: bin/molt and bin/molt-run (harness.tree)
  PROG_DIR      the images: prog_v1.so, prog_v2.so (from v1), prog_v3.so
                (from v2), broken variants of v2, prog_plain.so
  TEST_RUNTIME  tests/runtime's program (a molt process without an image)
  PATCH_DIR     its hot patches
"""
import os
import re
import shutil
import time

import pytest

from harness.proc import Program, killed_midway, log, maps, molt, run, status, wait_until
from harness.tree import bin_path, molt_cli

CLI = molt_cli()
PROG_DIR = os.environ["PROG_DIR"]
TEST_RUNTIME = os.environ.get("TEST_RUNTIME")
PATCH_DIR = os.environ.get("PATCH_DIR")

EXIT_USAGE = 2


def image(name):
    return os.path.join(PROG_DIR, name)


def one_line_error(r):
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


class Server(Program):
    """`molt run IMAGE`: the test server, driven through its stdin."""

    def __init__(self, name="prog_v1.so"):
        Program.__init__(self, [CLI, "run", image(name)])
        self.main = self.expect(r"^v1 main pid=(\d+) tid=(\d+)$")
        self.workers = {}
        for _ in range(2):
            m = self.expect(r"^v1 worker id=(\d) tid=(\d+) updating=0 ")
            self.workers[int(m.group(1))] = int(m.group(2))

    @property
    def seen(self):
        """The lines of its stdout read so far."""
        return self.out.all[:self.out.pos]

    def state(self):
        self.send("state")
        m = self.expect(r"^state (.*)$")
        # values may contain blanks (the greeting): split before "key="
        return dict(re.findall(r"(\w+)=(.*?)(?= \w+=|$)", m.group(1)))

    def close(self):
        if self.alive():
            try:
                self.send("quit")
            except BrokenPipeError:
                pass
        self.finish(rc=0, timeout=10, quiet=True)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def restarted(s, version):
    """The lines each thread prints when the update restarts it (in any
    order): (main's tid, from_main_loop), {worker id: fields}."""
    workers, main = {}, None
    pat = re.compile(r"^v%d (?:main tid=(\d+) updating=1 from_main_loop=(\d)|worker id=(\d) "
                     r"tid=(\d+) updating=(\d) from_worker_loop=(\d) restored=(\d) "
                     r"count=(\d+))$" % version)
    while main is None or len(workers) < 2:
        m = s.expect(pat.pattern)
        if m.group(1):
            main = (int(m.group(1)), int(m.group(2)))
        else:
            workers[int(m.group(3))] = dict(tid=int(m.group(4)), updating=int(m.group(5)),
                                            from_point=int(m.group(6)),
                                            restored=int(m.group(7)), count=int(m.group(8)))
    return main, workers


def test_update_streak_keeps_pid_tids_and_state(server):
    s = server
    assert int(s.main.group(1)) == s.pid == int(s.main.group(2))  # molt run execs
    s.send("add 7")
    s.expect("^ok$")
    before = s.state()
    assert before["v"] == "1" and before["total"] == "7" and before["requests"] == "2"
    assert before["greeting"] == "hello from version 1"
    st = status(s.pid)
    assert st["image"]["path"] == image("prog_v1.so") and st["image"]["full_updates"] == 0
    v1_build_id = st["image"]["build_id"]
    assert re.fullmatch(r"[0-9a-f]{40}", v1_build_id)
    threads = {t["tid"]: t for t in st["program_threads"]}
    assert threads[s.pid]["entry"] == "main"
    for tid in s.workers.values():
        assert threads[tid]["entry"] == "worker_main" and threads[tid]["tu"] == "server.c"
    assert "memfd:prog_v1.so" in maps(s.pid)

    r = molt("update", s.pid, image("prog_v2.so"), check=0)
    assert "generation 1" in r.stdout and "3 threads restarted" in r.stdout, r.stdout
    main, w = restarted(s, 2)
    assert main == (s.pid, 1)
    for i in (0, 1):
        # Same OS thread, relaunched with its own argument (its id), with
        # its migrated counter (int in v1, long in v2) carried over.
        assert w[i]["tid"] == s.workers[i]
        assert w[i]["updating"] == 1 and w[i]["from_point"] == 1 and w[i]["restored"] == 1
        # (a worker parks only after counting at least one loop, so the
        # migrated count is >= 1 even if `before` caught it at 0)
        assert w[i]["count"] >= max(int(before["c%d" % i]), 1)
    after = s.state()
    assert after["v"] == "2"
    assert after["total"] == "7" and after["requests"] == "3"  # int -> long, migrated
    assert after["hits"] == "1"                                # new field: INIT 0, then +1
    assert after["greeting"] == "hello from version 1"         # old literal, kept
    assert after["gen"] == "1"
    assert int(after["c0"]) >= w[0]["count"] and int(after["c1"]) >= w[1]["count"]

    # F7: the old image goes once every restarted thread reached a point.
    wait_until(lambda: "memfd:prog_v1.so" not in maps(s.pid), what="prog_v1.so unmapped")
    assert "memfd:prog_v2.so" in maps(s.pid)
    st = status(s.pid)
    assert st["generation"] == 1
    assert st["image"]["path"] == image("prog_v2.so") and st["image"]["full_updates"] == 1
    assert st["image"]["unloading"] is None and st["image"]["build_id"] != v1_build_id
    assert sorted(t["tid"] for t in st["program_threads"]) == sorted(
        [s.pid, *s.workers.values()])
    assert not any(t["updating"] for t in st["program_threads"])
    entries = log(s.pid)
    events = [e["event"] for e in entries]
    assert "update" in events and "unload" in events
    upd = [e for e in entries if e["event"] == "update"][0]
    assert "objects migrated" in upd["message"] and "pause" in upd["message"]
    # The pause in wall time and the part of it the migrating thread ran.
    m = re.search(r"pause ([0-9.]+) ms \(on a CPU ([0-9.]+) ms, preempted (\d+) times\)",
                  upd["message"])
    assert m, upd["message"]
    assert 0 < float(m.group(2)) <= float(m.group(1)) + 0.001, upd["message"]

    # The greeting still reads after v1's literal was unmapped.
    assert s.state()["greeting"] == "hello from version 1"

    # A streak: v2 -> v3 (built from v2), with the interior-pointer check.
    r = molt("update", s.pid, image("prog_v3.so"), "--check-interior", check=0)
    assert "generation 2" in r.stdout
    main, w3 = restarted(s, 3)
    assert main == (s.pid, 1)
    for i in (0, 1):
        assert w3[i]["tid"] == s.workers[i] and w3[i]["restored"] == 1
        assert w3[i]["count"] >= w[i]["count"]
    v3 = s.state()
    assert v3["v"] == "3" and v3["total"] == "7" and v3["hits"] == "3" and v3["gen"] == "2"
    wait_until(lambda: "memfd:prog_v2.so" not in maps(s.pid), what="prog_v2.so unmapped")
    assert status(s.pid)["image"]["full_updates"] == 2

    # v3 was built from v2, not from v3: a second time is refused.
    r = molt("update", s.pid, image("prog_v3.so"), check=1)
    assert "build-id" in one_line_error(r)


def assert_unchanged(s, total, gen="0"):
    """The old version still serves, with its state, and its threads run."""
    a = s.state()
    time.sleep(0.05)
    b = s.state()
    assert b["v"] == "1" and b["total"] == total and b["gen"] == gen, b
    assert int(b["requests"]) == int(a["requests"]) + 1
    # Both counting threads run on: each has counted on within 10 s (on a
    # loaded machine one may not get a CPU within the 50 ms above).
    wait_until(lambda: int(s.state()["c0"]) > int(a["c0"]), what="thread c0 to count on", timeout=10)
    wait_until(lambda: int(s.state()["c1"]) > int(a["c1"]), what="thread c1 to count on", timeout=10)
    assert "memfd:prog_v2" not in maps(s.pid)
    st = status(s.pid)
    assert st["image"]["path"] == image("prog_v1.so") and st["image"]["full_updates"] == 0
    assert not any(t["updating"] for t in st["program_threads"])


def test_failed_updates_leave_the_old_version_serving(server, tmp_path):
    s = server
    s.send("add 5")
    s.expect("^ok$")
    v1_build_id = status(s.pid)["image"]["build_id"]

    # An unresolved external: refused by the loader, before any thread stops.
    r = molt("update", s.pid, image("prog_v2_missing.so"), check=1)
    err = one_line_error(r)
    assert "molt_test_no_such_function" in err and "dynamic loader" in err, err
    assert_unchanged(s, "5")

    # Built from some other image.
    r = molt("update", s.pid, image("prog_v2_wrongfrom.so"), check=1)
    err = one_line_error(r)
    assert "00112233445566778899aabbccddeeff00112233" in err and v1_build_id in err, err
    assert_unchanged(s, "5")

    # A first version carries no migration.
    r = molt("update", s.pid, image("prog_v1.so"), check=1)
    assert "first version" in one_line_error(r)
    assert_unchanged(s, "5")

    # Not a program image at all.
    r = molt("update", s.pid, image("prog_plain.so"), check=1)
    assert "not a molt program image" in one_line_error(r)
    assert_unchanged(s, "5")

    # A world-writable image is refused (R7).
    bad = tmp_path / "prog_v2_open.so"
    shutil.copy(image("prog_v2.so"), bad)
    os.chmod(bad, 0o666)
    r = molt("update", s.pid, bad, check=1)
    assert "writable by group or others" in one_line_error(r)
    assert_unchanged(s, "5")

    # The new version lacks the entry function of the worker threads.
    r = molt("update", s.pid, image("prog_v2_noentry.so"), check=1)
    err = one_line_error(r)
    assert "'worker_main'" in err and (str(s.workers[0]) in err or str(s.workers[1]) in err), err
    assert_unchanged(s, "5")

    # The migration faults after it allocated and wrote: everything undone.
    r = molt("update", s.pid, image("prog_v2_fault.so"), check=1)
    err = one_line_error(r)
    assert "faulted" in err and "old version continues" in err, err
    assert_unchanged(s, "5")
    assert any(e["event"] == "abort" for e in log(s.pid))

    # After all that, a good update still works and finds the state intact.
    molt("update", s.pid, image("prog_v2.so"), check=0)
    _, w = restarted(s, 2)
    assert w[0]["restored"] == 1 and w[1]["restored"] == 1
    st = s.state()
    assert st["v"] == "2" and st["total"] == "5" and st["gen"] == "1"


def test_timeout_names_the_thread_that_never_reaches_a_point(server):
    s = server
    s.send("spawn-sleeper")
    s.expect("^sleeper started$")
    known = {s.pid, *s.workers.values()}
    sleepers = [t["tid"] for t in status(s.pid)["program_threads"] if t["tid"] not in known]
    assert len(sleepers) == 1
    sleeper = sleepers[0]

    t0 = time.time()
    r = molt("update", s.pid, image("prog_v2.so"), "--timeout", "0.5", check=1)
    assert time.time() - t0 < 5
    err = one_line_error(r)
    assert "timed out" in err and " %d (" % sleeper in err, err
    assert "last point (none)" in err, err
    for tid in known:  # the others were waiting at their points
        assert " %d (" % tid not in err, err
    assert_unchanged(s, "0")

    s.send("wake-sleeper")
    s.expect("^sleeper done$")
    molt("update", s.pid, image("prog_v2.so"), check=0)
    restarted(s, 2)
    assert s.state()["v"] == "2"


def test_run_errors(tmp_path):
    r = molt("run", "nope.so", cwd=tmp_path, timeout=30)
    assert r.returncode == EXIT_USAGE
    assert "nope.so" in one_line_error(r)
    r = molt("run", timeout=30)
    assert r.returncode == EXIT_USAGE
    # Exists but is not a program image: the driver says so in one line.
    r = molt("run", image("prog_plain.so"), timeout=30)
    assert r.returncode == 127
    err = one_line_error(r)
    assert err.startswith("molt-run: cannot run ") and "molt__program" in err, err
    r = run([bin_path("molt-run")], timeout=30)
    assert r.returncode == 2 and "usage" in r.stderr


def test_run_passes_arguments_and_exit_status():
    p = Program([CLI, "run", image("prog_v1.so"), "--not-for-molt", "x"])
    p.send("quit")
    p.finish(rc=0, timeout=30)
    out = p.out.join()
    assert out.startswith("v1 main pid=%d " % p.pid)


@pytest.mark.parametrize("args", [
    ["update", "1"],
    ["update", "1", "x.so", "--policy", "global"],
    ["update", "1", "nope.so"],
    ["apply", "1", "x.so", "--check-interior"],
    ["update", "1", "x.so", "--timeout", "0"],
])
def test_update_usage_errors(args, tmp_path):
    r = molt(*args, cwd=tmp_path, timeout=30)
    assert r.returncode == EXIT_USAGE, r
    one_line_error(r)


@pytest.mark.skipif(not TEST_RUNTIME, reason="needs tests/runtime's program")
def test_update_needs_a_program_image():
    p = Program([TEST_RUNTIME, "serve", PATCH_DIR])
    try:
        line = p.line()
        assert line.startswith("ready "), line
        r = molt("update", p.pid, image("prog_v2.so"), check=1)
        assert "does not run a program image" in one_line_error(r)
    finally:
        p.finish(rc=None)


@pytest.mark.skipif(not PATCH_DIR, reason="needs tests/runtime's patches")
def test_hot_patches_refused_in_a_program_image(server):
    r = molt("apply", server.pid, os.path.join(PATCH_DIR, "patch_a.so"), check=1)
    assert "hot patches are not supported" in one_line_error(r)
    r = molt("rollback", server.pid, check=1)
    assert "hot patches are not supported" in one_line_error(r)
    assert_unchanged(server, "0")


def test_back_to_back_updates(server):
    """v1 -> v2 -> v3 without a pause: the second update starts while the
    first one's threads are just restarting and its old image may still be
    loaded."""
    s = server
    s.send("add 3")
    s.expect("^ok$")
    molt("update", s.pid, image("prog_v2.so"), check=0)
    molt("update", s.pid, image("prog_v3.so"), check=0)
    st = s.state()
    assert st["v"] == "3" and st["total"] == "3" and st["gen"] == "2"
    wait_until(lambda: "memfd:prog_v1.so" not in maps(s.pid)
               and "memfd:prog_v2.so" not in maps(s.pid), what="old images unmapped")
    st = status(s.pid)
    assert sorted(t["tid"] for t in st["program_threads"]) == sorted(
        [s.pid, *s.workers.values()])
    assert st["image"]["full_updates"] == 2


def test_pending_callback_of_an_unloaded_image_is_not_called(server):
    """v1 registers a molt_on_update_pending callback, v2 does not.  Once
    v1 is unloaded, the next update must not call v1's function (it used
    to: the runtime thread jumped into the unmapped image and the process
    died)."""
    s = server
    molt("update", s.pid, image("prog_v2.so"), check=0)
    restarted(s, 2)
    wait_until(lambda: "memfd:prog_v1.so" not in maps(s.pid), what="prog_v1.so unmapped")
    r = molt("update", s.pid, image("prog_v3.so"), check=0)
    assert "generation 2" in r.stdout, r.stdout
    restarted(s, 3)
    assert s.state()["v"] == "3"


def test_thread_exiting_in_an_image_destructor_is_waited_for(server):
    """A program thread that called pthread_exit() still runs image code in
    its key destructors after libmolt's own thread destructor ran.  It is
    still a participant: an update waits for it (and times out naming it)
    instead of completing without it, committing, and touching a record
    that the exiting thread frees."""
    s = server
    s.send("spawn-exiter")
    exiter = int(s.expect(r"^exiter tid=(\d+) exiting$").group(1))
    time.sleep(0.1)  # now blocked in the image's key destructor
    r = molt("update", s.pid, image("prog_v2.so"), "--timeout", "0.5", check=1)
    err = one_line_error(r)
    assert "timed out" in err and " %d (" % exiter in err, err
    assert_unchanged(s, "0")
    s.send("release-exiter")
    s.expect("^exiter done$")
    r = molt("update", s.pid, image("prog_v2.so"), check=0)
    assert "3 threads restarted" in r.stdout, r.stdout
    restarted(s, 2)
    assert s.state()["v"] == "2"


def test_locals_of_returned_calls_are_not_migrated(server):
    """probe() registers a migrated local and returns; the worker's next
    call, molt_update_point(), gets a frame at the same address.  That
    registration is stale: the restarted worker's probe() must not be
    handed its value (it used to be, as garbage from the stack)."""
    s = server
    time.sleep(0.05)
    molt("update", s.pid, image("prog_v2.so"), check=0)
    restarted(s, 2)
    s.state()  # every line the restart printed has been read by now
    time.sleep(0.05)
    s.state()
    assert not any("probe restored" in line for line in s.seen), s.seen


def test_killing_the_cli_mid_update_leaves_all_or_nothing(server):
    """R6 for full updates: `molt update` killed at a spread of moments
    leaves the process on the old image with its state, or on the new one
    with the state migrated -- never in between -- and serving."""
    import random
    rnd = random.Random(66)
    s = server
    s.send("add 5")
    s.expect("^ok$")
    t0 = time.monotonic()
    molt("update", s.pid, image("prog_v2.so"), check=0)  # measure a whole update
    span = time.monotonic() - t0
    restarted(s, 2)
    v, moved, stayed = 2, 0, 0
    for i in range(24):
        if v == 3:
            break
        argv = [CLI, "update", str(s.pid), image("prog_v%d.so" % (v + 1))]
        # every third CLI is killed as soon as it runs (the first one
        # before it even starts: it stops itself)
        killed_midway(argv, first=i == 0, delay=rnd.uniform(0.0, 1.2 * span) if i % 3 else 0)
        st = status(s.pid)  # answered after whatever the killed CLI sent
        assert st["state"] == "ok"
        now = int(re.search(r"prog_v(\d)\.so$", st["image"]["path"]).group(1))
        assert now in (v, v + 1), st["image"]
        if now == v + 1:
            moved += 1
            restarted(s, now)
            v = now
        else:
            stayed += 1
        state = s.state()
        assert state["v"] == str(v) and state["total"] == "5", state
    print("R6 update: %d moved, %d stayed (update takes %.1f ms)" % (moved, stayed, span * 1e3))
    assert stayed > 0 and moved > 0, (moved, stayed, span)
