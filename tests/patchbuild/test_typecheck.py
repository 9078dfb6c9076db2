"""moltcc.patch.typecheck on real compiles: what a hot patch cannot carry is
refused with the type/field/function named, the file:line, and the live
code that uses it; what it can carry is not refused."""
import pytest

from moltcc.patch import objdiff as od
from moltcc.patch import typecheck as tc

HEADER = r'''#ifndef CONN_H
#define CONN_H
enum color { RED, GREEN, BLUE };
struct inner { short a; short b; };
struct conn {
    int fd;
    int len;
    char buf[16];
    struct inner in;
    unsigned flag : 3;
    unsigned mode : 2;
};
typedef struct { int x; int y; } pair_t;
typedef int len_t;
struct unused_here { int q; };
#endif
'''

MAIN = r'''#include <stdio.h>
#include "conn.h"

int counter = 5;
static const int table[4] = {1, 2, 3, 4};
int compute(int x);
int (*stored)(int) = compute;

int conn_read(struct conn *c) { return c->fd + c->len + counter; }
int conn_write(struct conn *c, int v) { c->len = v; return c->flag + c->in.b; }
int is_red(enum color c) { return c == RED; }
int pair_sum(pair_t *p) { return p->x + p->y; }
int scale(int v) { return v * 3; }
int compute(int x)
{
    static int calls;
    calls++;
    return x + table[x & 3] + calls;
}
len_t get_len(struct conn *c) { return c->len; }
int untouched(int q) { return q - 1; }

int main(void)
{
    struct conn c = {0};
    pair_t p = {1, 2};
    printf("%d %d %d %d %d %d %d\n", conn_read(&c), conn_write(&c, 3), is_red(GREEN),
           pair_sum(&p), scale(2), stored(1), (int)get_len(&c) + untouched(2));
    return 0;
}
static const struct { const char *name; int code; } codes[2] = {{"ok", 0}, {"bad", 1}};
int code_of(int i) { return codes[i & 1].code; }
'''

COMBOS = [("gcc", "-O0"), ("gcc", "-O2"), ("clang", "-O0"), ("clang", "-O2")]
COMBO_IDS = ["%s%s" % c for c in COMBOS]


def edit(text, *pairs):
    for a, b in pairs:
        assert text.count(a) == 1, "edit %r: found %d times" % (a, text.count(a))
        text = text.replace(a, b)
    return text


# Every new version the tests build, by name: woven in one moltcc run.
V = {
    "field_added": (edit(HEADER, ("    int len;\n", "    int len;\n    int flags;\n")), MAIN),
    "field_first": (edit(HEADER, ("    int fd;\n", "    int magic;\n    int fd;\n")), MAIN),
    "field_type": (edit(HEADER, ("    int len;\n", "    long len;\n")), MAIN),
    "enum_value": (edit(HEADER, ("{ RED, GREEN, BLUE }", "{ RED, BLUE, GREEN }")), MAIN),
    "enum_added": (edit(HEADER, ("{ RED, GREEN, BLUE }", "{ RED, GREEN, BLUE, PURPLE }")), MAIN),
    "anon": (edit(HEADER, ("typedef struct { int x; int y; }", "typedef struct { int x; long y; }")),
             MAIN),
    "bitfield": (edit(HEADER, ("unsigned flag : 3;", "unsigned flag : 4;")), MAIN),
    "typedef": (edit(HEADER, ("typedef int len_t;", "typedef long len_t;")), MAIN),
    "embedded": (edit(HEADER, ("struct inner { short a; short b; };",
                               "struct inner { int a; short b; };")), MAIN),
    "renamed": (edit(HEADER, ("    int len;\n", "    int length;\n"), ("GREEN,", "VERDANT,")),
                MAIN.replace("c->len", "c->length").replace("GREEN", "VERDANT")),
    "unused": (edit(HEADER, ("struct unused_here { int q; };", "struct unused_here { long q; };")),
               MAIN),
    "signature": (HEADER, edit(MAIN, ("int scale(int v) { return v * 3; }",
                                      "int scale(long v, int w) { return v * w; }"),
                               ("scale(2)", "scale(2, 3)"))),
    "return": (HEADER, edit(MAIN, ("int scale(int v) { return v * 3; }",
                                   "long scale(int v) { return v * 3L; }"))),
    "var_types": (HEADER, edit(MAIN, ("int counter = 5;", "long counter = 5;"),
                               ("    static int calls;", "    static long calls;"))),
    "local_type": (HEADER, edit(MAIN, ("    static int calls;", "    static long calls;"))),
    "initial": (HEADER, edit(MAIN, ("int counter = 5;", "int counter = 6;"),
                             ("{1, 2, 3, 4}", "{1, 2, 3, 5}"))),
    "bodies": (HEADER, edit(MAIN, ("return v * 3;", "return v * 4;"), ("return q - 1;", "return q - 2;"))),
    "main": (HEADER, edit(MAIN, ("pair_t p = {1, 2};", "pair_t p = {1, 3};"))),
    # a new static local before an anonymous struct moves its DIE
    "anon_moved": (HEADER, edit(MAIN, ("int scale(int v) { return v * 3; }",
                                       "int scale(int v) { static int n; n++; return v * 3 + n; }"))),
    "anon_var": (HEADER, edit(MAIN, ("struct { const char *name; int code; } codes",
                                     "struct { const char *name; long code; } codes"))),
    "all": (edit(HEADER, ("    int len;\n", "    long len;\n"), ("{ RED, GREEN, BLUE }", "{ GREEN, RED, BLUE }")),
            edit(MAIN, ("int counter = 5;", "int counter = 7;"),
                 ("int scale(int v) { return v * 3; }", "int scale(int v, int w) { return v * w; }"),
                 ("scale(2)", "scale(2, 3)"))),
}


@pytest.fixture(scope="module", autouse=True)
def prefetch(builder):
    vs = [{"t.c": MAIN, "conn.h": HEADER}] + [{"t.c": m, "conn.h": h} for h, m in V.values()]
    builder.weave(vs, "t.c")


def check(builder, variant, cc="gcc", opt="-O2", woven=True, extra=()):
    header_new, main_new = V[variant]
    orig = {"t.c": MAIN, "conn.h": HEADER}
    new = {"t.c": main_new, "conn.h": header_new}
    o = builder.objects({"orig": orig, "new": new}, cc=cc, opt=opt, woven=woven, extra=extra)
    upd = None
    if not woven:
        upd = {"conn_read", "conn_write", "is_red", "pair_sum", "scale", "compute", "get_len",
               "untouched", "code_of"}
    cmp = od.compare_objects(o["orig"], o["new"], updatable=upd)
    return cmp, tc.check_types(o["orig"], o["new"], comparison=cmp)


def only(res, kind, name):
    got = [r for r in res.refusals if r.name == name]
    assert len(got) == 1 and got[0].kind == kind, "\n".join(res.report()) or "no refusals"
    return got[0]


# -- types ------------------------------------------------------------------

@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_field_added(builder, cc, opt):
    cmp, res = check(builder, "field_added", cc=cc, opt=opt)
    r = only(res, "type", "struct conn")
    assert r.where == ("conn.h", 5)
    assert "field 'flags' (int) added at offset 8" in r.what
    assert "field 'buf' moved from offset 8 to 12" in r.what
    assert "size 32 -> 36" in r.what
    assert {"conn_read", "conn_write", "get_len"} <= set(r.users), r
    assert "untouched" not in r.users and "scale" not in r.users
    text = str(r)
    assert text.startswith("struct conn (conn.h:5): ") and "used by live code: " in text
    # main has a struct conn on its stack: its code changed with the size
    assert sorted(x.kind for x in res.refusals) == ["main", "type"], res.report()
    assert not res.ok and res.report()[-1].endswith(tc.WAY_FORWARD)


def test_field_added_first_moves_the_rest(builder):
    cmp, res = check(builder, "field_first")
    r = only(res, "type", "struct conn")
    assert r.what == ("field 'magic' (int) added at offset 0; fields 'fd' .. 'in' (4) moved by +4 bytes; "
                      "field 'flag' moved from bits 224..226 to bits 256..258; "
                      "field 'mode' moved from bits 227..228 to bits 259..260; size 32 -> 36"), r.what


@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_field_type_changed(builder, cc, opt):
    cmp, res = check(builder, "field_type", cc=cc, opt=opt)
    r = only(res, "type", "struct conn")
    assert "field 'len' changed type int -> long and moved from offset 4 to 8" in r.what, r
    assert "size 32 -> 40" in r.what
    assert str(r).startswith("struct conn (conn.h:5): field 'len' changed type int -> long")


@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_enum_value_changed(builder, cc, opt):
    cmp, res = check(builder, "enum_value", cc=cc, opt=opt)
    r = only(res, "type", "enum color")
    assert r.where == ("conn.h", 3)
    assert "enumerator GREEN changed value 1 -> 2" in r.what
    assert "enumerator BLUE changed value 2 -> 1" in r.what
    assert "is_red" in r.users


@pytest.mark.parametrize("cc,opt", [("gcc", "-O2"), ("clang", "-O0")], ids=["gcc-O2", "clang-O0"])
def test_enumerator_added_at_the_end_is_allowed(builder, cc, opt):
    cmp, res = check(builder, "enum_added", cc=cc, opt=opt)
    assert res.ok, res.report()
    assert any("enum color" in n and "PURPLE = 3" in n for n in res.notes), res.notes


def test_anonymous_struct_through_typedef(builder):
    cmp, res = check(builder, "anon")
    r = only(res, "type", "pair_t (anonymous struct)")
    assert "field 'y' changed type int -> long and moved from offset 4 to 8" in r.what
    assert "pair_sum" in r.users and r.where == ("conn.h", 13)


@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_anonymous_struct_of_a_variable_moved_is_the_same_type(builder, cc, opt):
    # only scale's body changed; codes' anonymous struct type sits at
    # another place in the new build's DWARF but is the same layout
    cmp, res = check(builder, "anon_moved", cc=cc, opt=opt)
    assert res.ok, res.report()


def test_anonymous_struct_of_a_variable_changed(builder):
    cmp, res = check(builder, "anon_var")
    r = only(res, "variable", "codes")
    assert "type changed" in r.what and "(size 32 -> 32)" not in r.what, r.what
    assert "code_of" in r.users, r


def test_bitfield_changed(builder):
    cmp, res = check(builder, "bitfield")
    r = only(res, "type", "struct conn")
    assert "field 'flag' changed width 3 -> 4 bits" in r.what
    assert "field 'mode' moved from bits 227..228 to bits 228..229" in r.what, r.what


def test_typedef_changed(builder):
    cmp, res = check(builder, "typedef")
    r = only(res, "type", "typedef len_t")
    assert "now names long instead of int (size 4 -> 8)" in r.what
    assert r.users == ("get_len",)
    # the signature of get_len changed with it (shipped: its code changed)
    s = only(res, "signature", "function get_len")
    assert "return type changed len_t (int) -> len_t (long)" in s.what


def test_embedded_struct_changed(builder):
    cmp, res = check(builder, "embedded")
    inner = only(res, "type", "struct inner")
    assert "field 'a' changed type short -> int" in inner.what
    assert "field 'b' moved from offset 2 to 4" in inner.what
    outer = only(res, "type", "struct conn")
    assert "size 32 -> 36" in outer.what
    # conn_write reads c->in.b through struct conn
    assert "conn_write" in inner.users


def test_renamed_field_and_enumerator_are_notes(builder):
    cmp, res = check(builder, "renamed")
    assert res.ok, res.report()
    assert any("field 'len' renamed to 'length'" in n for n in res.notes), res.notes
    assert any("enumerator GREEN renamed to VERDANT (= 1)" in n for n in res.notes), res.notes
    # the code is the same: nothing to replace
    assert not cmp.replaced and not cmp.unshippable, cmp.summary()


def test_unused_changed_type_is_a_note(builder):
    cmp, res = check(builder, "unused", extra=("-fno-eliminate-unused-debug-types",))
    assert res.ok, res.report()
    assert any(n.startswith("struct unused_here (conn.h:15) changed") for n in res.notes), res.notes


# -- functions --------------------------------------------------------------

@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_signature_changed(builder, cc, opt):
    cmp, res = check(builder, "signature", cc=cc, opt=opt)
    r = only(res, "signature", "function scale")
    assert r.where == ("t.c", 13)
    assert "parameters changed (int) -> (long, int)" in r.what
    assert "main" in r.users


def test_return_type_changed(builder):
    cmp, res = check(builder, "return")
    r = only(res, "signature", "function scale")
    assert "return type changed int -> long" in r.what and "parameters" not in r.what


# -- variables and initial values --------------------------------------------

@pytest.mark.parametrize("cc,opt", [("gcc", "-O0"), ("clang", "-O2")], ids=["gcc-O0", "clang-O2"])
def test_global_and_static_local_type_changed(builder, cc, opt):
    cmp, res = check(builder, "var_types", cc=cc, opt=opt)
    r = only(res, "variable", "counter")
    assert r.where == ("t.c", 4) and "type changed int -> long (size 4 -> 8)" in r.what
    assert "conn_read" in r.users
    r = only(res, "variable", "static local 'calls' of compute (molt__compute__calls)")
    assert r.where == ("t.c", 16)


def test_static_local_type_changed_plain_c(builder):
    cmp, res = check(builder, "local_type", opt="-O0", woven=False)
    r = only(res, "variable", "static local 'calls' of compute")
    assert "int -> long" in r.what


@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_changed_initial_values(builder, cc, opt):
    cmp, res = check(builder, "initial", cc=cc, opt=opt)
    r = only(res, "initializer", "counter")
    assert r.where == ("t.c", 4) and "conn_read" in r.users
    assert "initial value changed" in r.what
    r = only(res, "initializer", "table")
    assert r.where == ("t.c", 5)


@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_function_pointer_initializer_unchanged_is_fine(builder, cc, opt):
    cmp, res = check(builder, "bodies", cc=cc, opt=opt)
    assert res.ok, res.report()
    assert sorted(f.name for f in cmp.replaced) == ["scale", "untouched"]


def test_main_changed(builder):
    cmp, res = check(builder, "main")
    r = only(res, "main", "main")
    assert "never runs again" in r.what and r.where == ("t.c", 23)


def test_all_reasons_are_collected(builder):
    cmp, res = check(builder, "all")
    kinds = sorted((r.kind, r.name) for r in res.refusals)
    assert kinds == [("initializer", "counter"), ("main", "main"), ("signature", "function scale"),
                     ("type", "enum color"), ("type", "struct conn")], res.report()
    lines = res.report()
    assert len(lines) == 6 and all(line.startswith("moltcc: error: ") for line in lines)


def test_decl_locations(builder):
    o = builder.objects({"orig": {"t.c": MAIN, "conn.h": HEADER}})["orig"]
    loc = tc.decl_locations(o)
    assert loc["compute__molt_v0"] == ("t.c", 14)
    assert loc["counter"] == ("t.c", 4)
    assert loc["molt__compute__calls"] == ("t.c", 16)


# -- how messages spell types -------------------------------------------------

QUALIFIED = r'''
static const struct { int a; char b; } tab[3] = {{1, 2}};
const char *const names[2] = {"a", "b"};
volatile int counters[2];
char *const fixed = 0;
int use(int i) { return tab[i].a + names[i][0] + counters[i] + (fixed != 0); }
'''


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_qualified_arrays_and_pointers_are_spelled_as_c(builder, cc):
    """A qualified array is spelled with the qualifier once, on the element
    (DWARF may put it on the array and on the element), and a qualified
    pointer as C writes it; in C spelling (patch messages) and in the .xf
    spelling (full-update messages) alike."""
    from moltcc import dwarf
    o = builder.objects({"orig": {"t.c": QUALIFIED}}, cc=cc, opt="-O0", woven=False)["orig"]
    info = dwarf.load_debug(o)
    spelled = {name: (tc.display(info.vars[name].type), dwarf.describe(info.vars[name].type))
               for name in ("tab", "names", "counters", "fixed")}
    assert spelled["tab"][0] == "const struct {...} [3]"
    assert spelled["tab"][1].startswith("const struct {anon@") and spelled["tab"][1].endswith("} [3]")
    assert spelled["names"] == ("const char *const [2]", "const char *const [2]")
    assert spelled["counters"] == ("volatile int [2]", "volatile int [2]")
    assert spelled["fixed"] == ("char *const", "char *const")
