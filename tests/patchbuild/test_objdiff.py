"""moltcc.patch.objdiff on real compiles: what changed between two builds of one
translation unit, and no false "changed" when only other code moved.

Every test builds the objects the way the patch builder does (woven by
moltcc, or plain C) with -ffunction-sections -fdata-sections -g and
compares them; the combos run gcc 12 and clang 14 at -O0 and -O2 (some
also -Os and -fPIC)."""
import pytest

from moltcc.patch import objdiff as od

COMBOS = [("gcc", "-O0"), ("gcc", "-O2"), ("clang", "-O0"), ("clang", "-O2")]
COMBO_IDS = ["%s%s" % c for c in COMBOS]

BASE = r'''#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <assert.h>

struct conn { int fd; int len; char buf[16]; };

int counter = 5;
int other = 7;
static const int table[4] = {1, 2, 3, 4};
int (*stored)(int);

static inline int helper(int x) { return x * 3 + 1; }

int compute(int x)
{
    static int calls;
    calls++;
    return helper(x) + table[x & 3] + calls;
}

int twice(int x) { return helper(x) * 2 + x; }

const char *name(int k)
{
    switch (k) {
    case 0: return "zero";
    case 1: return "one";
    case 2: return "two";
    case 3: return "three";
    case 4: return "four";
    case 5: return "five";
    case 6: return "six";
    default: return "many";
    }
}

int dispatch(int k, int v)
{
    switch (k) {
    case 0: return v + 11;
    case 1: return v * 13;
    case 2: return v - 17;
    case 3: return v ^ 19;
    case 4: return v << 2;
    case 5: return v / 23;
    case 6: return v % 29;
    case 7: return -v;
    default: return 0;
    }
}

int conn_read(struct conn *c)
{
    printf("read %d %s\n", c->len, __func__);
    return c->fd + counter;
}

double scale(double d) { return d * 1.5 + 0.25; }

int classify(int v)
{
    if (v > 10)
        return 1;
    return 0;
}

int logit(const char *m) { return puts(m); }

int code_of(int k)
{
    switch (k) {
    case 0: return 10;
    case 1: return 20;
    case 2: return 35;
    case 3: return 47;
    case 4: return 51;
    case 5: return 66;
    default: return -1;
    }
}

int pick(int i)
{
    int arr[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    return arr[i & 7] + arr[(i + 3) & 7];
}

static const char *const greetings[] = {"hi", "hello", "hey"};
const char *greet(int i) { return greetings[i % 3]; }

static int sq(int v) { return v * v; }
int use_sq(int v) { return sq(v) + 1; }

int checked(int v)
{
    assert(v < 1000);
    return v + 1;
}

int main(int argc, char **argv)
{
    struct conn c = {1, 2, ""};
    (void)argv;
    stored = compute;
    printf("%d %s %d %f %d %d %d %d %s\n", compute(argc), name(argc), conn_read(&c), scale(argc),
           dispatch(argc, 3), classify(argc), twice(argc), use_sq(argc) + logit("x") + checked(argc)
           + code_of(argc) + pick(argc), greet(argc));
    return 0;
}
'''

ALL = {"compute", "twice", "name", "dispatch", "conn_read", "scale", "classify", "logit", "sq",
       "use_sq", "checked", "code_of", "pick", "greet"}


def edit(text, *pairs):
    for a, b in pairs:
        assert text.count(a) == 1, "edit %r: found %d times" % (a, text.count(a))
        text = text.replace(a, b)
    return text


def all_versions():
    """Every source this module builds (woven in one moltcc run)."""
    out = [BASE]
    news = [edit(BASE, ("int counter = 5;\n", "int counter = 5;\n" + TOP_ADDITIONS))]
    news += [edit(BASE, *b[1]) for b in BODY_CHANGES]
    news += [edit(BASE, *batch(i)[0]) for i in range(len(BATCHES))]
    news += [LINES_NEW, LINES_NEW_ONLY, NEW_GLOBAL,
             edit(BASE, ('{"hi", "hello", "hey"}', '{"hi", "hullo", "hey"}'))]
    pairs = [(BASE, n) for n in news]
    pairs += [(PRINTF_ORIG, PRINTF_NEW), (FNPTR_ORIG, FNPTR_NEW), (CTOR_ORIG, CTOR_NEW),
              (BANNER_ORIG, BANNER_NEW)] + [(COLD, n) for n in COLD_NEWS]
    for o, n in pairs:
        out += [o, n, od.remap_source(o, n)]
    return out


@pytest.fixture(scope="module", autouse=True)
def prefetch(builder):
    builder.weave([{"t.c": t} for t in all_versions()], "t.c")


def compare(builder, orig, new, cc, opt, woven=True, remap=True, extra=(), updatable=None):
    vers = {"orig": orig, "new": new}
    if remap:
        vers["rem"] = od.remap_source(orig, new)
    o = builder.objects(vers, cc=cc, opt=opt, woven=woven, extra=extra)
    if updatable is None and not woven:
        updatable = ALL
    return od.compare_objects(o["orig"], o["new"], o.get("rem"), updatable=updatable)


def names(items):
    return sorted(i.name for i in items)


def nothing_else(r, replaced=(), private=(), new_functions=(), changed_data=(), new_data=()):
    assert names(r.replaced) == sorted(replaced), r.summary()
    assert sorted(i.source for i in r.private_copies) == sorted(private), r.summary()
    assert names(r.new_functions) == sorted(new_functions), r.summary()
    assert names(r.changed_data) == sorted(changed_data), r.summary()
    assert names(r.new_data) == sorted(new_data), r.summary()
    assert not r.unshippable, r.summary()


# -- identical builds and unrelated edits: nothing reported -------------------

@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_same_source_same_result(builder, cc, opt):
    r = compare(builder, BASE, BASE, cc, opt)
    nothing_else(r)
    assert not r.line_only and not r.removed_functions


TOP_ADDITIONS = r'''
int added_first(int q) { return q + 42; }
const char *added_text(int q)
{
    static int seen;
    seen++;
    switch (q) {
    case 0: return "added zero";
    case 1: return "read %d %s\n";
    case 2: return "added two";
    case 3: return "added three";
    case 4: return "added four";
    default: return __func__;
    }
}
static const int added_table[3] = {9, 8, 7};
double added_float(double z) { return z * 2.75 + added_table[1]; }
'''


@pytest.mark.parametrize("cc,opt,extra", [c + ((),) for c in COMBOS]
                         + [("gcc", "-Os", ()), ("gcc", "-O2", ("-fPIC",)),
                            ("clang", "-O2", ("-fPIC",))],
                         ids=COMBO_IDS + ["gcc-Os", "gcc-O2-fPIC", "clang-O2-fPIC"])
def test_additions_elsewhere_report_nothing_else(builder, cc, opt, extra):
    """New functions, strings, a switch, a static local, a table and a float
    constant at the top of the file shift every string, constant pool,
    jump table, __func__, numbered symbol and line below: no other function
    or object may be reported."""
    new = edit(BASE, ("int counter = 5;\n", "int counter = 5;\n" + TOP_ADDITIONS))
    r = compare(builder, BASE, new, cc, opt, extra=extra, remap=True)
    # gcc folds the reads of added_table at -O1 and up and drops it
    table = {"added_table"} if {d.name for d in r.new_data} & {"added_table"} else set()
    nothing_else(r, new_functions={"added_first", "added_text", "added_float"},
                 new_data={"molt__added_text__seen"} | table)
    if opt == "-O0":
        assert table
    # checked() asserts: its __LINE__ moved with the added lines
    assert names(r.line_only) == ["checked"], r.summary()


@pytest.mark.parametrize("cc,opt", [("gcc", "-O0"), ("gcc", "-O2"), ("clang", "-O2")],
                         ids=["gcc-O0", "gcc-O2", "clang-O2"])
def test_additions_elsewhere_plain_c(builder, cc, opt):
    new = edit(BASE, ("int counter = 5;\n", "int counter = 5;\n" + TOP_ADDITIONS))
    r = compare(builder, BASE, new, cc, opt, woven=False, remap=True)
    seen = "added_text.seen" if cc == "clang" else "seen"
    assert names(r.changed) == [], r.summary()
    assert names(r.new_functions) == ["added_first", "added_float", "added_text"], r.summary()
    got = sorted(d.name.split(".")[0] if cc == "gcc" else d.name for d in r.new_data)
    assert got in (sorted(["added_table", seen]), [seen]), r.summary()
    assert not r.changed_data, r.summary()


# -- every kind of body change is seen ---------------------------------------

BODY_CHANGES = [
    ("constant", [("        return 1;\n", "        return 2;\n")], {"classify"}),
    ("condition", [("if (v > 10)", "if (v >= 10)")], {"classify"}),
    ("called function", [("return puts(m);", "return printf(\"%s\", m);")], {"logit"}),
    ("string literal text", [('"read %d %s\\n"', '"READ %d %s\\n"')], {"conn_read"}),
    ("referenced global", [("return c->fd + counter;", "return c->fd + other;")], {"conn_read"}),
    ("jump table entries", [("    case 5: return v / 23;\n    case 6: return v % 29;\n",
                             "    case 6: return v / 23;\n    case 5: return v % 29;\n")],
     {"dispatch"}),
    ("switch string table", [('case 4: return "four";', 'case 4: return "FOUR";')], {"name"}),
    ("float constant", [("d * 1.5 + 0.25", "d * 1.75 + 0.25")], {"scale"}),
    ("inlined callee body", [("return x * 3 + 1;", "return x * 3 + 2;")], {"compute", "twice"}),
    ("static callee (updatable)", [("return v * v;", "return v * v * v;")], {"sq"}),
    ("static local use", [("calls++;", "calls += 2;")], {"compute"}),
    ("switch value table", [("case 2: return 35;", "case 2: return 36;")], {"code_of"}),
    ("local array initializer", [("{3, 1, 4, 1, 5, 9, 2, 6}", "{3, 1, 4, 1, 5, 8, 2, 6}")], {"pick"}),
]


# Changes in different functions are detected independently (every
# function has its own fingerprint, and woven functions call each other
# through their entries, never inlined): the combos apply them in two
# batches, each function touched once per batch.
BATCHES = [
    ["constant", "called function", "string literal text", "jump table entries",
     "switch string table", "float constant", "inlined callee body", "static callee (updatable)",
     "switch value table"],
    ["condition", "referenced global", "static local use", "local array initializer"],
]
_BY_NAME = {b[0]: b for b in BODY_CHANGES}


def batch(i):
    pairs, expect = [], set()
    for what in BATCHES[i]:
        pairs += _BY_NAME[what][1]
        expect |= _BY_NAME[what][2]
    return pairs, expect


def test_batches_cover_every_change_once():
    seen = [w for b in BATCHES for w in b]
    assert sorted(seen) == sorted(_BY_NAME)
    for b in BATCHES:
        touched = [f for w in b for f in _BY_NAME[w][2]]
        assert len(touched) == len(set(touched))


@pytest.mark.parametrize("what,pairs,expect", BODY_CHANGES, ids=[b[0] for b in BODY_CHANGES])
def test_body_change_detected(builder, what, pairs, expect):
    """One change at a time, gcc -O2, woven."""
    new = edit(BASE, *pairs)
    r = compare(builder, BASE, new, "gcc", "-O2")
    assert set(names(r.replaced)) == expect, "%s: %s" % (what, r.summary())
    for f in r.replaced:
        assert f.updatable and f.tu == "t.c" and f.section.startswith(".text")
        assert f.where and f.where[0] == "t.c" and f.where[1] > 0, f
    assert not r.new_functions and not r.unshippable, r.summary()


@pytest.mark.parametrize("cc,opt,extra", [c + ((),) for c in COMBOS]
                         + [("gcc", "-Os", ()), ("gcc", "-O2", ("-fPIC",)),
                            ("clang", "-O2", ("-fPIC",)), ("clang", "-O0", ("-fPIC",))],
                         ids=COMBO_IDS + ["gcc-Os", "gcc-O2-fPIC", "clang-O2-fPIC", "clang-O0-fPIC"])
@pytest.mark.parametrize("b", [0, 1], ids=["batch0", "batch1"])
def test_body_changes_detected_everywhere(builder, cc, opt, extra, b):
    pairs, expect = batch(b)
    new = edit(BASE, *pairs)
    r = compare(builder, BASE, new, cc, opt, extra=extra)
    assert set(names(r.replaced)) == expect, r.summary()
    assert not r.new_functions and not r.unshippable and not r.changed_data, r.summary()


@pytest.mark.parametrize("cc,opt", [("gcc", "-O0"), ("gcc", "-O2"), ("clang", "-O2")],
                         ids=["gcc-O0", "gcc-O2", "clang-O2"])
@pytest.mark.parametrize("b", [0, 1], ids=["batch0", "batch1"])
def test_body_change_detected_plain_c(builder, cc, opt, b):
    pairs, expect = batch(b)
    new = edit(BASE, *pairs)
    r = compare(builder, BASE, new, cc, opt, woven=False)
    got = {f.source for f in r.changed}
    # plain C: the compiler may inline a changed function into its callers
    # in this file (main calls them all): those are changed too; a
    # non-updatable static helper that changed is a private copy
    callers = {"sq": {"use_sq", "main"}}
    allowed = set(expect) | {"main", "helper"}
    for f in expect:
        allowed |= callers.get(f, set())
    assert got and got <= allowed, r.summary()
    newsyms = {u.name for u in od.load_object(r.new_path).units}
    for f in expect:
        if f in newsyms:
            assert f in got, r.summary()
    if "main" in got:
        assert [u.name for u in r.unshippable] == ["main"]


# -- non-updatable callee: callers replaced, callee carried privately --------

@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_changed_inline_helper(builder, cc, opt):
    new = edit(BASE, ("return x * 3 + 1;", "return x * 3 + 2;"))
    r = compare(builder, BASE, new, cc, opt)
    assert names(r.replaced) == ["compute", "twice"], r.summary()
    helper_emitted = any(f.name == "helper" for f in r.changed + r.line_only) or \
        "helper" in r.references
    if helper_emitted:
        # not inlined: a private copy; both callers replaced because they refer to it
        assert names(r.private_copies) == ["helper"], r.summary()
        for f in r.replaced:
            assert "helper" in f.reason or f.reason == "code changed", f
    else:
        assert names(r.private_copies) == [], r.summary()
    if opt == "-O0":
        assert helper_emitted, "at -O0 the static inline helper is a function of its own"


LINES_NEW_ONLY = edit(BASE, ("int checked(int v)\n",
                             "/* a new comment\n   of two lines */\nint checked(int v)\n"))
LINES_NEW = edit(LINES_NEW_ONLY, ("return v + 1;", "return v + 2;"))
NEW_GLOBAL = edit(BASE, ("int other = 7;\n", "int other = 7;\nlong fresh_global = 99;\n"),
                  ("int logit(const char *m)", "int brand_new(int z) { return z * 77; }\n"
                   "int logit(const char *m)"))


# -- line numbers only ---------------------------------------------------------

@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_line_numbers_only(builder, cc, opt):
    """A comment above checked() moves its assert's __LINE__: with the
    remapped build it is reported as line-only and not replaced; the real
    change below it still is."""
    r = compare(builder, BASE, LINES_NEW, cc, opt, remap=True)
    assert names(r.replaced) == ["checked"], r.summary()
    new2 = LINES_NEW_ONLY
    r2 = compare(builder, BASE, new2, cc, opt, remap=True)
    nothing_else(r2)
    lines = names(r2.line_only)
    assert "checked" in lines, r2.summary()
    # main calls checked and prints: it moved too, but only its lines
    assert set(lines) <= {"checked", "main"}, r2.summary()
    # without the remapped build the assert's line is a change
    r3 = compare(builder, BASE, new2, cc, opt, remap=False)
    assert "checked" in names(r3.replaced), r3.summary()
    assert any("line-remapped" in n for n in r3.notes)


PRINTF_ORIG = BASE.replace("int logit(const char *m) { return puts(m); }",
                           'int logit(const char *m) { printf("%d\\n", __LINE__); return puts(m); }')
PRINTF_NEW = edit(PRINTF_ORIG, ("double scale(double d)", "\n\n\ndouble scale(double d)"))


def test_line_numbers_only_with_printf_line(builder):
    orig, new = PRINTF_ORIG, PRINTF_NEW
    r = compare(builder, orig, new, "gcc", "-O2", remap=True)
    nothing_else(r)
    assert names(r.line_only) == ["checked", "logit"], r.summary()


# -- data --------------------------------------------------------------------

@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_new_global_and_new_function(builder, cc, opt):
    r = compare(builder, BASE, NEW_GLOBAL, cc, opt)
    nothing_else(r, new_functions={"brand_new"}, new_data={"fresh_global"})
    nf = r.new_functions[0]
    assert nf.where and nf.where[0] == "t.c"


@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_changed_initializers(builder, cc, opt):
    new = edit(BASE, ("int counter = 5;", "int counter = 6;"),
               ("{1, 2, 3, 4}", "{1, 2, 3, 5}"))
    r = compare(builder, BASE, new, cc, opt)
    assert names(r.changed_data) == ["counter", "table"], r.summary()
    by = {d.name: d for d in r.changed_data}
    assert "conn_read" in by["counter"].users
    assert by["table"].static and not by["counter"].static
    assert by["counter"].where == ("t.c", 8)
    # the code of compute may or may not change (gcc folds table reads at
    # -O2); nothing else may
    assert set(names(r.replaced)) <= {"compute"}, r.summary()


@pytest.mark.parametrize("cc,opt", COMBOS, ids=COMBO_IDS)
def test_string_in_a_table_of_strings(builder, cc, opt):
    """The table's content is relocations into a string pool: a changed
    string is a changed initial value of the table."""
    new = edit(BASE, ('{"hi", "hello", "hey"}', '{"hi", "hullo", "hey"}'))
    r = compare(builder, BASE, new, cc, opt)
    if cc == "clang" and opt == "-O2":
        # clang turns the table into greet's own relative lookup table
        # (reltable.greet__molt_v0, compared as part of greet)
        assert not r.changed_data and names(r.replaced) == ["greet"], r.summary()
        return
    assert names(r.changed_data) == ["greetings"], r.summary()
    assert "greet" in r.changed_data[0].users
    assert set(names(r.replaced)) <= {"greet"}, r.summary()


FNPTR_ORIG = BASE.replace("int (*stored)(int);", "int (*stored)(int) = compute;") \
    .replace("int counter = 5;", "int compute(int x);\nint counter = 5;")
FNPTR_NEW = edit(FNPTR_ORIG, ("return v + 1;", "return v + 3;"))


def test_unchanged_function_pointer_initializer(builder):
    orig, new = FNPTR_ORIG, FNPTR_NEW
    r = compare(builder, orig, new, "gcc", "-O2")
    nothing_else(r, replaced={"checked"})


# -- main, constructors, external non-updatable -------------------------------

CTOR_ORIG = BASE + "\n__attribute__((constructor)) static void setup(void) { counter = 3; }\n"
CTOR_NEW = edit(CTOR_ORIG, ("stored = compute;", "stored = twice;"), ("counter = 3;", "counter = 4;"))
BANNER_ORIG = BASE.replace("int main(int argc, char **argv)\n{",
                           "static inline int banner(int a) { return a * 5; }\n"
                           "int main(int argc, char **argv)\n{\n    argc += banner(argc);")
BANNER_NEW = edit(BANNER_ORIG, ("return a * 5;", "return a * 6;"))


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_main_and_constructor_cannot_be_shipped(builder, cc):
    orig, new = CTOR_ORIG, CTOR_NEW
    r = compare(builder, orig, new, cc, "-O2")
    kinds = {u.name: u.kind for u in r.unshippable}
    assert kinds == {"main": "main", "setup": "constructor"}, r.summary()
    assert not r.replaced and not r.private_copies, r.summary()


def test_propagation_reaches_main(builder):
    """A non-updatable static helper used by main: main would have to change."""
    orig, new = BANNER_ORIG, BANNER_NEW
    r = compare(builder, orig, new, "gcc", "-O0")
    assert [u.name for u in r.unshippable] == ["main"], r.summary()
    u = r.unshippable[0]
    assert u.chain == ("main", "banner") and "banner" in u.reason


# -- gcc .cold split -------------------------------------------------------------

COLD = r'''#include <stdio.h>
#include <stdlib.h>

__attribute__((cold, noinline)) void report_bad(const char *what, int v)
{
    fprintf(stderr, "bad %s: %d\n", what, v);
}

int work(int *a, int n)
{
    int s = 0;
    for (int i = 0; i < n; i++) {
        if (__builtin_expect(a[i] < 0, 0)) {
            report_bad("negative value", a[i]);
            fprintf(stderr, "at index %d\n", i);
            abort();
        }
        s += a[i] * 3;
    }
    return s;
}

int other_work(int x) { return x + 1; }
'''


COLD_NEWS = [
    edit(COLD, ('"at index %d\\n"', '"at position %d\\n"')),             # the cold part only
    edit(COLD, ("s += a[i] * 3;", "s += a[i] * 5;")),                      # the hot part only
    edit(COLD, ("int work(int *a, int n)", "int first(int q) { if (__builtin_expect(q < 0, 0)) "
                "{ fprintf(stderr, \"q\\n\"); abort(); } return q; }\nint work(int *a, int n)")),
]


@pytest.mark.parametrize("woven", [True, False], ids=["woven", "plain"])
def test_cold_part_belongs_to_parent(builder, woven):
    o = builder.objects({"orig": COLD}, cc="gcc", opt="-O2", woven=woven)["orig"]
    m = od.load_object(o)
    colds = [u for u in m.units if u.kind == "func" and ".cold" in u.name]
    assert colds, "gcc -O2 did not split a .cold part; the test needs one"
    assert all(c.cold_of is not None and c.cold_of.name.startswith("work") for c in colds)
    upd = None if woven else {"work", "other_work", "report_bad"}
    # a change only in the cold part
    new = COLD_NEWS[0]
    r = compare(builder, COLD, new, "gcc", "-O2", woven=woven, updatable=upd)
    assert names(r.changed) == ["work"], r.summary()
    assert "cold" in r.changed[0].reason and r.changed[0].colds
    # a change in the hot part only
    new = COLD_NEWS[1]
    r = compare(builder, COLD, new, "gcc", "-O2", woven=woven, updatable=upd)
    assert names(r.changed) == ["work"], r.summary()
    # adding code before it moves nothing
    new = COLD_NEWS[2]
    r = compare(builder, COLD, new, "gcc", "-O2", woven=woven, updatable=upd)
    assert names(r.changed) == [] and names(r.new_functions) == ["first"], r.summary()


# -- identities are per translation unit ----------------------------------------

TWO_A = "static int pick(int x) { return x + 1; }\nint from_a(int x) { return pick(x); }\n"
TWO_B = "static int pick(int x) { return x * 2; }\nint from_b(int x) { return pick(x); }\n"


def test_static_functions_of_the_same_name_in_two_files(builder):
    a = builder.objects({"o": {"a.c": TWO_A}, "n": {"a.c": TWO_A}}, main="a.c")
    newb = TWO_B.replace("x * 2", "x * 3")
    b = builder.objects({"o": {"b.c": TWO_B}, "n": {"b.c": newb}}, main="b.c")
    ra = od.compare_objects(a["o"], a["n"])
    rb = od.compare_objects(b["o"], b["n"])
    assert ra.tu == "a.c" and rb.tu == "b.c"
    assert names(ra.changed) == [] and names(rb.replaced) == ["pick"]
    assert rb.replaced[0].key == ("pick", "b.c") and rb.replaced[0].static


# -- compiler clones of non-updatable functions ---------------------------------

CLONE = r'''static __attribute__((noinline)) int clampadd(int x, int lim)
{
    if (x > lim)
        return lim;
    return x + 7;
}
int use1(int v) { return clampadd(v, 100); }
int use2(int v) { return clampadd(v * 2, 100); }
int use3(int v) { return v - 1; }
'''


def test_changed_clone_propagates_to_its_callers(builder):
    """gcc makes clampadd.constprop.0: a change in it replaces its callers
    (their own bytes did not change) and ships the clone privately."""
    o = builder.objects({"orig": CLONE}, woven=False)["orig"]
    assert "clampadd.constprop.0" in {u.name for u in od.load_object(o).units}, \
        "gcc -O2 did not make the clone the test needs"
    new = edit(CLONE, ("return x + 7;", "return x + 8;"))
    r = compare(builder, CLONE, new, "gcc", "-O2", woven=False, updatable={"use1", "use2", "use3"})
    assert names(r.replaced) == ["use1", "use2"], r.summary()
    for f in r.replaced:
        assert "clampadd.constprop.0" in f.reason and f.via == ("clampadd.constprop.0",)
    assert names(r.private_copies) == ["clampadd.constprop.0"], r.summary()
    assert r.private_copies[0].source == "clampadd"


# -- numbered static locals in plain C ----------------------------------------

LOCALS = r'''int first(void) { static int hits; return ++hits; }
int second(void) { static int hits = 5; return hits += 2; }
'''


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_numbered_static_locals_correlate(builder, cc):
    new = "int zeroth(void) { static int hits = 9; return hits--; }\n" + LOCALS
    r = compare(builder, LOCALS, new, cc, "-O2", woven=False,
                updatable={"first", "second", "zeroth"})
    assert names(r.changed) == [] and names(r.new_functions) == ["zeroth"], r.summary()
    assert len(r.new_data) == 1 and not r.changed_data, r.summary()
    new2 = LOCALS.replace("hits = 5", "hits = 6")
    r = compare(builder, LOCALS, new2, cc, "-O2", woven=False, updatable={"first", "second"})
    assert len(r.changed_data) == 1 and "second" in r.changed_data[0].users, r.summary()


# -- remap_source --------------------------------------------------------------

def test_remap_keeps_unchanged_lines():
    a = "a\nb\nc\nd\ne\n"
    b = "a\nX\nY\nb\nc\nd\ne\n"
    out = od.remap_source(a, b)
    assert out == "a\nX\nY\n#line 2\nb\nc\nd\ne\n"
    assert od.remap_source(a, a) == a
    # a deletion
    assert od.remap_source(a, "a\nd\ne\n") == "a\n#line 4\nd\ne\n"
    # a replacement of the same size needs nothing
    assert od.remap_source(a, "a\nB\nc\nd\ne\n") == "a\nB\nc\nd\ne\n"


def test_remap_never_after_continuation_or_in_comment():
    a = "#define M(x) \\\n  (x) \\\n  + 1\nint y;\n"
    b = "#define M(x) \\\n  (x) \\\n  (x) \\\n  + 1\nint y;\n"
    out = od.remap_source(a, b)
    # "  + 1" keeps line 3 only if a directive could go before it: it cannot
    assert out == b.replace("int y;", "#line 4\nint y;"), out
    a = "/* start\nint q;\nend */\nint y;\n"
    b = "/* start\nint q2;\nint q3;\nend */\nint y;\n"
    out = od.remap_source(a, b)
    lines = out.splitlines()
    assert lines.index("#line 4") == lines.index("int y;") - 1, out


# -- more than 65,280 sections (SHN_XINDEX) -------------------------------------

def test_objects_with_extended_section_indices(tmp_path):
    """32,700 functions with -ffunction-sections-like sections and their
    relocation sections: 65,400 sections, symbol section indices in
    SHT_SYMTAB_SHNDX.  The assembler makes it in about a second."""
    import shutil
    import subprocess
    if not shutil.which("as"):
        pytest.skip("binutils' as is not installed")
    n = 32700

    def asm(changed):
        out = []
        for i in range(n):
            body = "  call f%d\n" % ((i + 1) % n)
            if i == n - 7 and changed:
                body += "  nop\n"
            out.append('.section .text.f%d,"ax",@progbits\n.globl f%d\n.type f%d,@function\nf%d:\n%s'
                       "  ret\n.size f%d,.-f%d" % (i, i, i, i, body, i, i))
        return "\n".join(out) + "\n"

    objs = []
    for lab, changed in (("o", False), ("n", True)):
        s = tmp_path / (lab + ".s")
        s.write_text(asm(changed))
        subprocess.run(["as", str(s), "-o", str(tmp_path / (lab + ".o"))], check=True)
        objs.append(str(tmp_path / (lab + ".o")))
    m = od.load_object(objs[0])
    assert len(m.elf.sections) > 0xff00
    last = m.by_name["f%d" % (n - 1)]
    assert last.sec.idx > 0xff00 and last.sec.name == ".text.f%d" % (n - 1)
    assert [t[2][1].name for t in last.targets] == ["f0"]
    r = od.compare_objects(objs[0], objs[1], updatable=lambda name: True, locate=False)
    assert names(r.replaced) == ["f%d" % (n - 7)], r.summary()
