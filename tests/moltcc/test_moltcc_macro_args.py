"""References written inside macro arguments, and `T f()` definitions.

libclang gives a reference that comes from a macro argument the extent of
the macro's expansion point, so moltcc must find its literal token where the
argument is written (its file location) to tell it apart from another use
of the same name.  Patches leave every use as written (the declarations
make the names the program's objects), so a name used through a macro that
is also a field name elsewhere in the function is no problem any more.

Found building memcached: `ITEM_set_cas(it, (settings.use_cas) ? ...)` and a
function-local static in a `LOGGER_LOG(...)` argument; `void SSL_LOCK() {...}`
after `void SSL_LOCK(void);` under -Wmissing-prototypes -Werror."""

from harness.elf import Elf

STRICT = ["-Wall", "-Wextra", "-pedantic", "-Wstrict-prototypes", "-Wmissing-prototypes",
          "-Werror"]

# `settings` and `total` are globals, `calls` a function-local static (hoisted
# in the program build); all are used only inside macro arguments, and
# NAMED() also stringifies its argument.
ARGS_C = r"""
#include <stdio.h>
#include <molt.h>
struct cfg { int use_cas; int scale; };
struct cfg settings = {1, 1};
static long total;
#define SET(a, b) ((a) = (b))
#define NOTE(fmt, ...) snprintf(note, sizeof note, fmt, __VA_ARGS__)
#define NAMED(v) #v, (long)(v)
static char note[64];
int step(int *out, int x);
int step(int *out, int x)
{
    static int calls;
    SET(calls, calls + 1);
    SET(*out, (settings.use_cas) ? x * settings.scale : 0);
    SET(total, total + *out);
    NOTE("%s=%ld calls=%d", NAMED(total), calls);
    return calls;
}
int main(int argc, char **argv)
{
    int v;
    settings.scale = argc;              /* 2: set at run time */
    int c = step(&v, 3);
    printf("%d %d %s\n", c, v, note);
    char err[200] = "";
    int rc = molt_apply(argv[1], MOLT_POLICY_IMMEDIATE, 10000, err, sizeof err);
    printf("rc=%d %s\n", rc, err);
    c = step(&v, 3);
    printf("%d %d %s\n", c, v, note);
    return 0;
}
"""


def test_globals_in_macro_arguments_are_patched(tool, needs_stamp):
    tool.write("m.c", ARGS_C)
    r = tool.moltcc("--molt-updatable=all", "-O2", "m.c", "-o", "prog", *STRICT,
                    env={"MOLT_VERBOSE": "1"}).ok()
    assert "'step' is not made updatable" not in r.err, r.err
    assert "m.c:12: 'step' is updatable" in r.err
    assert {d["name"] for d in Elf(tool.path("prog")).descriptors()} == {"step"}

    tool.write("v2/m.c", ARGS_C.replace("x * settings.scale", "x * settings.scale * 100"))
    tool.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "p.so", "v2/m.c", *STRICT).ok()
    e = Elf(tool.path("p.so"))
    assert {p["name"] for p in e.patch_fns()} == {"step"}
    imports = {(i["name"], i["tu"]) for i in e.imports()}
    assert {("settings", None), ("total", "m.c"), ("molt__step__calls", "m.c")} <= imports

    out = tool.run(["./prog", tool.path("p.so")]).ok().out.splitlines()
    # the patch sees the live settings.scale (2), total (6) and calls (1);
    # the stringified argument is still the name the user wrote
    assert out == ["1 6 total=6 calls=1", "rc=0 ", "2 600 total=606 calls=2"]


def test_macro_argument_and_other_use_of_the_name(tool, needs_stamp):
    # the argument token is a reference, and the name is also a member in
    # the same function: uses are not rewritten, so this builds; `level`
    # is the program's static (an import), the member stays a member
    src = """#include <molt.h>
struct lv { int level; };
static int level;
#define ADD(a, b) ((a) + (b))
MOLT_UPDATABLE int g(struct lv *p) { return ADD(level, 1) + p->level; }
int main(void) { struct lv l = {0}; return g(&l); }
"""
    tool.write("m.c", src)
    tool.moltcc("m.c", "-o", "prog").ok()
    tool.write("v2/m.c", src.replace("ADD(level, 1)", "ADD(level, 2)"))
    tool.moltcc("--molt-patch", "--molt-target", "prog", "-o", "p.so", "v2/m.c").ok()
    assert {(i["name"], i["tu"]) for i in Elf(tool.path("p.so")).imports()} == {("level", "m.c")}


def test_macro_definitions_referencing_globals_stay_safe(tool, needs_stamp):
    src = """#include <molt.h>
struct lv { int level; };
static int level;
#define BUMP() (level++)
#define ADD(a, b) ((a) + (b))
MOLT_UPDATABLE int f(void) { int r = ADD(BUMP(), 1); return r + ADD(level, 0); }
MOLT_UPDATABLE int g(struct lv *p) { return BUMP() + p->level; }
MOLT_UPDATABLE int h(void)
{
    static int n;
#define INC() (n++)
    INC();
    return ADD(n, 0);
}
int main(void) { struct lv l = {0}; return f() + g(&l) + h(); }
"""
    tool.write("m.c", src)
    tool.moltcc("m.c", "-o", "prog", "-Wall", "-Werror").ok()
    assert {d["name"] for d in Elf(tool.path("prog")).descriptors()} == {"f", "g", "h"}
    # f: a reference from BUMP()'s definition and one from ADD's argument
    # both reach the program's `level`
    # (g, which such a patch cannot replace, is unchanged: the patch
    # refers to the program's g and does not compile its body)
    tool.write("v2/m.c", src.replace("ADD(level, 0)", "ADD(level, 1)")
               .replace("    INC();\n", "    INC(); INC();\n"))
    tool.moltcc("--molt-patch", "--molt-target", "prog", "-o", "p.so", "v2/m.c").ok()
    assert {(i["name"], i["tu"]) for i in Elf(tool.path("p.so")).imports()} >= {
        ("level", "m.c"), ("molt__h__n", "m.c")}
    # g: `level` comes only from BUMP()'s definition and is also a member
    # name there: the live `level` all the same
    tool.write("v3/m.c", src.replace("BUMP() + p->level", "BUMP() + p->level + 1"))
    tool.moltcc("--molt-patch", "--molt-target", "prog", "-o", "q.so", "v3/m.c").ok()
    assert {(i["name"], i["tu"]) for i in Elf(tool.path("q.so")).imports()} == {("level", "m.c")}


def test_arg_spelling_only_for_macro_arguments(tool):
    import clang.cindex as ci
    from moltcc import unit as moltcc_unit
    path = tool.write("a.c", """struct s { int use_cas; } settings;
#define SET(a, b) ((a) = (b))
#define USE() (settings.use_cas)
int f(int *p) { SET(*p, settings.use_cas); return USE(); }
""")
    u = moltcc_unit.Unit(path, "a.c", [])
    data = open(path, "rb").read()
    refs = [d for top in u.top for d in top.walk_preorder()
            if d.kind == ci.CursorKind.DECL_REF_EXPR and d.spelling == "settings"]
    assert len(refs) == 2
    got = sorted((u.arg_spelling(d, "settings") or -1) for d in refs)
    # the argument's token; none for the reference from USE()'s definition
    assert got == [-1, data.index(b"settings.use_cas); return")]


def test_empty_parens_after_prototype(tool, needs_stamp):
    src = """#include <stdio.h>
void f(void);
static int g(void);
int counter;
void f() { counter++; }
static int g() { return counter; }
int h(void);
#define DEFINE(n) int n() { return counter + 1; }
DEFINE(h)
int main(void) { f(); printf("%d %d\\n", g(), h()); return 0; }
"""
    tool.write("k.c", src)
    tool.moltcc("--molt-updatable=all", "k.c", "-o", "prog", *STRICT).ok()
    assert {d["name"] for d in Elf(tool.path("prog")).descriptors()} == {"f", "g", "h"}
    assert tool.run(["./prog"]).ok().out == "1 2\n"
    tool.write("v2/k.c", src.replace("counter++", "counter += 10").replace("counter + 1", "counter + 2")
               .replace("return counter; }", "return counter * 3; }"))
    tool.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "p.so", "v2/k.c", *STRICT).ok()
    assert {p["name"] for p in Elf(tool.path("p.so")).patch_fns()} == {"f", "g", "h"}
