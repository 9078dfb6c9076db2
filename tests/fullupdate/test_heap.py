"""Full updates: the heap traversal ($xform, generics, annotations,
sharing and cycles, function pointers)."""

from fuprogs import Prog, assert_clean_stderr, build, pair


def test_xform_composition():
    v1, v2 = pair("xform")
    with Prog(v1) as p:
        for c in ("set 1 5", "set 3 -2", "set 6 9"):
            assert p.cmd(c) == "ok"
        assert p.cmd("dump") == "version=1 1:5 3:-2 6:9"
        p.update_ok(v2)
        # array -> list by the variable rule; every value through the
        # `typedef data` transformer, invoked with MOLT_XF_INVOKE($xform(...))
        assert p.cmd("dump") == "version=2 1:5000 3:-2000 6:9000"
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_generic_list_instantiations():
    v1, v2 = pair("generic")
    with Prog(v1) as p:
        assert p.dump() == {"version": "1", "users": "12:cy,11:bob,10:ann,",
                            "tags": "102,101,100,"}
        p.update_ok(v2)
        # list<struct user>: every user transformed (level = id * 2);
        # list<struct tag>: unchanged, still reachable
        assert p.dump() == {"version": "2", "users": "12:cy:24,11:bob:22,10:ann:20,",
                            "tags": "102,101,100,"}
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_ptrarray_every_element():
    v1, v2 = pair("ptrarray")
    with Prog(v1) as p:
        assert p.dump() == {"version": "1", "n": "5", "cells": "1,2,5,10,17,"}
        p.update_ok(v2)
        assert p.dump() == {"version": "2", "n": "5",
                            "cells": "1/1001,2/1002,5/1005,10/1010,17/1017,"}
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_opaque_pointer_not_followed():
    v1, v2 = pair("opaque")
    with Prog(v1) as p:
        d1 = p.dump()
        assert (d1["hidden_a"], d1["shown_a"]) == ("11", "22")
        p.update_ok(v2)
        d2 = p.dump()
        assert d2["version"] == "2"
        assert d2["hidden"] == d1["hidden"], "the opaque pointer was changed"
        assert d2["hidden_a"] == "11"
        assert (d2["shown_a"], d2["shown_b"]) == ("22", "77")  # followed, transformed
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_no_migrate_keeps_new_initializer():
    v1, v2 = pair("nomigrate")   # v2 changes `ops`' type without any rule
    with Prog(v1) as p:
        assert p.cmd("fill") == "ok"
        assert p.dump() == {"version": "1", "cache": "1,2,3,4", "normal": "55", "f3": "4"}
        p.update_ok(v2)
        assert p.dump() == {"version": "2", "cache": "9,9,9,9", "normal": "55",
                            "f3": "103", "g3": "6"}
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_cycles_and_sharing():
    v1, v2 = pair("cycles")
    with Prog(v1) as p:
        assert p.dump() == {"version": "1", "ring_len": "4", "links_ok": "1",
                            "shared": "1", "a_v": "2", "pairs": "1"}
        p.update_ok(v2)
        assert p.dump() == {"version": "2", "ring_len": "4", "links_ok": "1",
                            "shared": "1", "a_v": "2", "a_in_ring": "1",
                            "tags": "64", "pairs": "1"}
        assert p.cmd("poke") == "b_v=42"   # still one object behind a and b
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_function_pointers_reach_new_version():
    v1 = build("fnptr", "v1")
    v2 = build("fnptr", "v2", frm=v1)
    with Prog(v1) as p:
        assert p.dump() == {"version": "1", "h": "21", "cur": "-5"}
        p.update_ok(v2)
        # h->fn (heap) and cur_op (global, a static function) now call v2's
        # functions of the same names
        assert p.dump() == {"version": "2", "h": "1021", "cur": "-1005",
                            "h_is_new": "1", "cur_is_new": "1"}
        assert p.wait_unmapped("fnptr-v1.so")
        assert p.dump()["h"] == "1021"
        assert p.quit() == 0
        assert_clean_stderr(p)
