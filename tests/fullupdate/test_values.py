"""Full updates: transformers of values (globals, fields, literals).

Each test builds v1 and v2 of one program in progs/ with the real moltcc,
starts v1 with `molt run`, changes its state through commands, runs
`molt update` and checks the state the new version sees."""

import re
import struct

from fuprogs import Prog, assert_clean_stderr, pair


def test_init_new_variable():
    v1, v2 = pair("init_var")
    with Prog(v1) as p:
        for _ in range(3):
            assert p.cmd("inc") == "ok"
        assert p.dump() == {"version": "1", "counter": "8"}
        p.update_ok(v2)
        assert p.dump() == {"version": "2", "counter": "8", "counter_x10": "80",
                            "big": str(1 << 40), "fresh": "42"}
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_init_new_struct_field():
    v1, v2 = pair("init_field")
    with Prog(v1) as p:
        assert p.dump() == {"version": "1", "i0": "1/10", "i2": "3/33", "single": "9/4"}
        p.update_ok(v2)
        # price = qty * 100 + id, from the OLD object ($base); in a global
        # array and in a heap object
        assert p.dump() == {"version": "2", "i0": "1/10/1001", "i2": "3/33/3303",
                            "single": "9/4/409"}
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_variable_rename():
    v1, v2 = pair("rename")
    with Prog(v1) as p:
        for c in ("hit", "hit", "miss"):
            assert p.cmd(c) == "ok"
        assert p.dump() == {"version": "1", "hits": "2", "misses": "1", "via_hp": "2"}
        p.update_ok(v2)
        # the renamed global and static keep their values (not the new
        # initializers, -1), and a pointer to the old variable now points
        # to the renamed one
        assert p.dump() == {"version": "2", "nhits": "2", "nmisses": "1",
                            "via_hp": "2", "hp_is_nhits": "1"}
        assert p.cmd("hit") == "ok"
        assert p.dump()["via_hp"] == "3"
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_field_int_to_long():
    v1, v2 = pair("int_long")
    with Prog(v1) as p:
        before = "123456/4 -2147483648/3 2147483647/2 -5/1"
        assert p.cmd("dump") == "version=1 " + before
        p.update_ok(v2)
        assert p.cmd("dump") == "version=2 " + before   # sign-extended, order kept
        assert p.cmd("bump") == "ok"                     # no int overflow any more
        assert p.cmd("dump") == ("version=2 1000000123456/4 997852516352/3 "
                                 "1002147483647/2 999999999995/1")
        assert p.quit() == 0
        assert_clean_stderr(p)


def f32(x):
    return "%.17g" % struct.unpack("f", struct.pack("f", x))[0]


def test_float_to_double_is_converted():
    v1, v2 = pair("float_double")
    with Prog(v1) as p:
        want = {"gm": f32(3.14159) + "/1", "hm": f32(-1234.5678) + "/2"}
        assert p.dump() == dict(version="1", **want)
        p.update_ok(v2)
        # the value, not the bits: a float copied bitwise into a double
        # would read as a tiny denormal or garbage
        assert p.dump() == dict(version="2", **want)
        assert p.quit() == 0
        assert_clean_stderr(p)


STRLIT = re.compile(r"^version=(\d) greeting=(.*) note=(.*)$")


def test_string_literal_survives_unload():
    v1, v2 = pair("strlit")
    with Prog(v1) as p:
        assert p.cmd("pick") == "ok"
        assert STRLIT.match(p.cmd("dump")).groups() == (
            "1", "picked at run time in v1", "a literal of v1 held by a heap object")
        assert p.mapped("strlit-v1.so"), "the running image is not in /proc/PID/maps"
        p.update_ok(v2)
        assert p.wait_unmapped("strlit-v1.so"), (
            "the old image is still mapped after the update:\n%s"
            % "\n".join(p.mapped("strlit-v1.so")))
        assert p.mapped("strlit-v2.so")
        # v1's literals, although v1's image is gone
        assert STRLIT.match(p.cmd("dump")).groups() == (
            "2", "picked at run time in v1", "a literal of v1 held by a heap object")
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_specials_oldsym_newsym_oldtype_newtype_base():
    v1, v2 = pair("specials")
    with Prog(v1) as p:
        assert p.dump() == {"version": "1", "scale": "7", "origin": "4,5", "p1": "30,40"}
        p.update_ok(v2)
        assert p.dump() == {
            "version": "2", "scale": "7",
            "origin": "4,5,-7",       # the variable rule, not the field INIT
            "p1": "30,40,70",         # INIT struct pt.sum via $base
            "scaled": "28",           # $oldsym(scale) * $oldsym(origin).x
            "sizes": "1208",          # sizeof $newtype * 100 + sizeof $oldtype
            "side": "1009",           # written by origin's rule via $newsym
        }
        assert p.quit() == 0
        assert_clean_stderr(p)


def test_every_global_migrates():
    v1, v2 = pair("manyvars")
    with Prog(v1) as p:
        assert p.cmd("set") == "ok"
        want = {"sum": str(sum(1000 + i for i in range(96))), "first_wrong": "-1"}
        assert p.dump() == dict(version="1", **want)
        p.update_ok(v2)
        # all 96 values, wherever the linker put them
        assert p.dump() == dict(version="2", **want)
        assert p.quit() == 0
        assert_clean_stderr(p)
