"""Threads that block (molt.h: molt_cond_wait, molt_usleep,
molt_update_fd): an update reaches a thread waiting on a condition nobody
signals, one sleeping for a minute and one in poll() without a timeout,
restarts them in the new version with their MOLT_MIGRATE_LOCAL locals, and
leaves the descriptor drained; an
update that aborts leaves them waiting again with the mutex free.  Signal
handlers become the new version's functions at the commit."""

from fuprogs import Prog, assert_clean_stderr, build


def test_blocked_threads_are_woken_and_restart_in_the_new_version():
    v1 = build("blocking", "v1")
    v2 = build("blocking", "v2", frm=v1)
    with Prog(v1) as p:
        state = p.wait_for(lambda s: all(s["starts%d" % i] == "1" for i in range(3)))
        assert state["cond_eintr"] == "0"
        assert (state["token0"], state["token1"]) == ("1001", "2001")
        assert p.cmd("signal") == "handled_by=1"
        assert p.cmd("fd") == "readable=0"
        # Each thread waits for a minute or for ever: the update's 10 s
        # timeout is met only if the update wakes them.
        p.update_ok(v2)
        s = p.wait_for(lambda s: all(s["version%d" % i] == "2" for i in range(3)))
        assert s["version"] == "2"
        assert [s["starts%d" % i] for i in range(3)] == ["2", "2", "2"]
        # their locals came across from frames below molt_cond_wait and
        # molt_usleep (a fresh v2 start would make 1002 and 2002)
        assert (s["token0"], s["token1"]) == ("1001", "2001"), s
        assert p.cmd("signal") == "handled_by=2"  # the handler was redirected
        assert p.cmd("fd") == "readable=0"  # drained once the update ended
        # v2's waiter took the (migrated, unlocked) mutex and waits with it
        p.wait_for(lambda s: p.cmd("mutex") == "trylock=0")
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_aborted_update_leaves_blocked_threads_waiting_in_the_old_version():
    v1 = build("blocking", "v1")
    v2r = build("blocking", "v2r", frm=v1)
    with Prog(v1) as p:
        p.wait_for(lambda s: all(s["starts%d" % i] == "1" for i in range(3)))
        r = p.update(v2r)
        assert r.returncode != 0 and "refused by the test" in r.stdout, r.stdout
        s = p.wait_for(lambda s: s["cond_eintr"] == "1")
        assert [s["starts%d" % i] for i in range(3)] == ["1", "1", "1"]
        assert [s["version%d" % i] for i in range(3)] == ["1", "1", "1"]
        assert p.cmd("signal") == "handled_by=1"
        assert p.cmd("fd") == "readable=0"
        # Back in its wait: the mutex is free again (it was released while
        # the thread stood at its update point and taken back after).
        p.wait_for(lambda s: p.cmd("mutex") == "trylock=0")
        # and the threads still answer the next update
        v2 = build("blocking", "v2", frm=v1)
        p.update_ok(v2)
        p.wait_for(lambda s: all(s["version%d" % i] == "2" for i in range(3)))
        assert p.quit() == 0
        assert_clean_stderr(p)
