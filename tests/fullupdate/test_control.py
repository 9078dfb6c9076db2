"""Full updates: control migration -- relaunched threads, the
molt_is_updating* queries and MOLT_MIGRATE_LOCAL."""

from fuprogs import Prog, assert_clean_stderr, build


def test_relaunched_threads():
    v1 = build("threads", "v1")
    v2 = build("threads", "v2", frm=v1)
    with Prog(v1) as p:
        d1 = p.wait_for(lambda d: int(d["t0_loops"]) > 0 and int(d["t1_loops"]) > 0)
        assert d1["main_tid"] == str(p.pid)
        assert (d1["main_updating"], d1["main_from"], d1["main_starts"]) == ("0", "0", "1")
        for t, arg in (("t0", "7"), ("t1", "4242")):
            assert d1[t + "_arg"] == arg
            assert (d1[t + "_version"], d1[t + "_starts"], d1[t + "_updating"],
                    d1[t + "_from"], d1[t + "_after"]) == ("1", "1", "0", "0", "0")
        tids = p.tids()
        p.update_ok(v2)
        d2 = p.wait_for(lambda d: d["t0_after"] != "-1" and d["t1_after"] != "-1")
        # main: same thread, restarted in the new main, knows where from
        assert d2["version"] == "2"
        assert d2["main_tid"] == str(p.pid)
        assert (d2["main_updating"], d2["main_from"], d2["main_starts"]) == ("1", "1", "2")
        for t, arg in (("t0", "7"), ("t1", "4242")):
            assert d2[t + "_tid"] == d1[t + "_tid"], "%s runs on another OS thread" % t
            # t0: the int argument as it was; t1: a pointer to the global
            # cfg, redirected to the new version's cfg (else -1)
            assert d2[t + "_arg"] == arg
            assert d2[t + "_version"] == "2"      # the new entry function runs
            assert d2[t + "_starts"] == "2"       # tinfo migrated, one restart
            assert d2[t + "_updating"] == "1"     # molt_is_updating() at restart
            assert d2[t + "_from"] == "1"         # molt_is_updating_from(its point)
            assert d2[t + "_from_other"] == "0"   # ... and not from another point
            assert d2[t + "_after"] == "0"        # false after its first point
        assert p.tids() == tids                   # no thread created or lost
        l0 = int(d2["t0_loops"])
        p.wait_for(lambda d: int(d["t0_loops"]) > l0 + 5)
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_migrated_locals():
    v1 = build("locals", "v1")
    v2 = build("locals", "v2", frm=v1)
    with Prog(v1) as p:
        assert p.cmd("add 5") == "ok"
        assert p.cmd("add 7") == "ok"
        d1 = p.wait_for(lambda d: int(d["worker_seen"]) > 10)
        assert (d1["n"], d1["sum"], d1["cnt"]) == ("2", "12", "2")
        assert (d1["main_restored"], d1["worker_restored"]) == ("0", "0")
        p.update_ok(v2)
        d2 = p.dump()
        assert d2["version"] == "2"
        # main's locals: n (int) copied, acc transformed (gen = cnt + 100)
        assert (d2["n"], d2["sum"], d2["cnt"], d2["gen"]) == ("2", "12", "2", "102")
        assert d2["main_restored"] == "2"
        # the worker's local went on counting from where it stopped
        d2 = p.wait_for(lambda d: d["worker_restored"] == "1"
                      and int(d["worker_first"]) >= int(d1["worker_seen"]))
        first = int(d2["worker_first"])
        p.wait_for(lambda d: int(d["worker_seen"]) > first + 3)
        assert p.cmd("add 1") == "ok"
        assert (p.dump()["n"], p.dump()["sum"]) == ("3", "13")
        assert p.quit() == 0
        assert_clean_stderr(p)
