"""Full updates that abort after the rules ran (progs/abort): a rule that
loops is stopped at the update's --timeout (the migration's deadline), and
an abort -- deadline, fault, failure, missing symbol -- leaves the old
version serving with its state as it was and frees what the rules
allocated (checked by LeakSanitizer at the program's exit in the ASan
build: assert_clean_stderr)."""

import subprocess
import time

import pytest

from fuprogs import Prog, assert_clean_stderr, build
from harness.proc import log, molt, status
from harness.tree import build_sanitize, molt_cli

# Rules that never end: spinning in their own code, in libc, in the engine.
# ThreadSanitizer holds an asynchronous signal back until the thread enters
# its runtime, which a loop that calls nothing never does: there the
# deadline cannot stop the first kind (docs/full-updates.md, "The time
# limit"), so the TSan build runs the other two.
LOOPS = ["loop_libc.xf", "loop_engine.xf"]
if build_sanitize() != "thread":
    LOOPS.insert(0, "loop.xf")


def images(xf):
    v1 = build("abort", "v1")
    return v1, build("abort", "v2", frm=v1, xf=xf, out_name="abort-v2-%s.so" % xf[:-3])


def status_ok(p):
    t0 = time.monotonic()
    r = molt("status", p.pid, merge=True, timeout=60)
    return r, time.monotonic() - t0


@pytest.mark.parametrize("xf", LOOPS)
def test_looping_transformer_is_stopped_at_the_timeout(xf):
    v1, bad = images(xf)
    good = build("abort", "v2", frm=v1, xf="good.xf", out_name="abort-v2-good.so")
    with Prog(v1) as p:
        assert p.cmd("inc") == "ok"
        before = p.cmd("dump")
        assert before == "version=1 counter=2 label=v1-2", before
        t0 = time.monotonic()
        upd = subprocess.Popen([molt_cli(), "update", str(p.pid), str(bad), "--timeout", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            # while the rule spins: the control channel answers once the
            # deadline has ended the migration (the runtime thread runs it)
            time.sleep(0.3)
            r, took_status = status_ok(p)
            assert r.rc == 0, r
            assert took_status < 8, "molt status took %.1f s during the update" % took_status
            out, _ = upd.communicate(timeout=30)
        finally:
            if upd.poll() is None:
                upd.kill()
                upd.wait()
        took = time.monotonic() - t0
        assert upd.returncode != 0, "an update whose rule never ends succeeded: " + out
        assert "migration timed out after 1000 ms" in out, out
        assert "the old version continues" in out, out
        assert took < 8, "molt update --timeout 1 took %.1f s" % took
        assert p.alive(), p.stderr()
        # the old version serves, unchanged, and allocates again (no lock
        # of malloc or stdio was left held by the escape)
        assert p.cmd("dump") == before
        assert p.cmd("inc") == "ok"
        assert p.cmd("dump") == "version=1 counter=3 label=v1-3"
        assert not p.mapped("abort-v2-%s" % xf[:-3]), "the aborted image is still mapped"
        assert any("migration timed out after 1000 ms" in str(e) for e in log(p.pid)), log(p.pid)
        r, _ = status_ok(p)
        assert r.rc == 0, r
        assert "last abort" in r.out and "migration timed out after 1000 ms" in r.out, r.out
        assert "migration timed out after 1000 ms" in status(p.pid)["image"]["last_abort"]
        # a correct update goes through afterwards, and status forgets the abort
        p.update_ok(good)
        assert status(p.pid)["image"]["last_abort"] is None
        assert p.cmd("dump") == "version=2 counter=30 label=v1-3+"
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_aborted_updates_free_what_the_rules_allocated():
    # three aborts of each kind; every rule allocated 3 blocks (24 KiB)
    # first.  LeakSanitizer (ASan build) reports any of them at exit.
    v1 = build("abort", "v1")
    bad = [images(xf)[1] for xf in ("fault.xf", "fail.xf", "nosym.xf", "loop_engine.xf")]
    good = build("abort", "v2", frm=v1, xf="good.xf", out_name="abort-v2-good.so")
    with Prog(v1) as p:
        assert p.cmd("inc") == "ok"
        before = p.cmd("dump")
        for _ in range(3):
            for image in bad:
                r = p.update(image, timeout=1)
                assert r.rc != 0, r
                assert "the old version continues" in r.out, r.out
                assert p.cmd("dump") == before
        assert "label v1-2 cannot be migrated" in p.updates[1].out
        assert "no_such_variable" in p.updates[2].out
        p.update_ok(good)
        assert p.cmd("dump") == "version=2 counter=20 label=v1-2+"
        # refused before any rule runs: the running image is v2 now
        r = p.update(good)
        assert r.rc != 0 and "build-id" in r.out, r.out
        assert p.cmd("inc") == "ok"
        assert p.cmd("dump") == "version=2 counter=21 label=v2-21"
        assert p.quit() == 0
        assert_clean_stderr(p)
