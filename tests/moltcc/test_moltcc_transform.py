"""What moltcc makes updatable, and that the result is right: markers,
static / variadic / recursive / address-taken / macro-defined functions, GNU
extensions, function-local statics, refusals."""
import os
import re

import pytest

from harness.elf import Elf
from harness.tree import build_sanitize, skip

DESC_MAGIC = 0x6D6F6C74


def own_warnings(err, fname):
    """Warnings about the user's file or from moltcc (molt.h's own are not
    this tool's business)."""
    return [l for l in err.splitlines()
            if (l.startswith(fname + ":") and "warning" in l) or l.startswith("moltcc: warning")]


def descs(tool, obj):
    return {d["name"]: d for d in Elf(tool.path(obj)).descriptors()}


def check_desc(elf, d, tu, variadic=False):
    """A descriptor is exactly molt__fn_desc: magic, index UINT32_MAX, the
    stable entry f, version 0 f__molt_v0, the dispatch path f__molt_dispatch
    and the direct target (version 0; NULL for a variadic f).  The entry is
    8-byte aligned and is a `jmp rel32` (e9) to the direct target, or to the
    dispatch path when there is none.  elf must be linked (in an object the
    displacement may still be a relocation)."""
    assert d["magic"] == DESC_MAGIC
    assert d["index"] == 0xFFFFFFFF
    assert d["tu"] == tu
    entry = elf.symbol(d["name"])
    body = elf.symbol(d["name"] + "__molt_v0")
    dispatch = elf.symbol(d["name"] + "__molt_dispatch")
    assert entry is not None and body is not None and dispatch is not None
    assert d["entry"] == entry.value
    assert d["body"] == body.value
    assert d["dispatch"] == dispatch.value
    assert body.bind == "LOCAL"                        # version 0 is static
    assert dispatch.bind == "LOCAL"                    # so is the dispatch path
    assert d["is_static"] == (1 if entry.bind == "LOCAL" else 0)
    assert entry.value % 8 == 0, d["name"]
    assert elf.read(entry.value, 1) == b"\xe9", (d["name"], elf.read(entry.value, 8).hex())
    if variadic:
        # version 0 takes a va_list: the entry always dispatches
        assert d["direct"] is None
        assert elf.entry_jump(entry.value) == dispatch.value, d["name"]
    else:
        assert d["direct"] == body.value
        assert elf.entry_jump(entry.value) == body.value, d["name"]


CLANG = "/usr/bin/clang-14"
# A program compiled by clang cannot run against a libmolt built with gcc's
# sanitizers (two incompatible sanitizer runtimes in one process), so the
# clang variants run in the plain build tree only; the sanitized trees run
# the gcc ones.
COMPILERS = ["cc"] + ([] if build_sanitize() else ["clang-14"])


def compiler_env(compiler):
    """moltcc's environment for `cc` (gcc here) or clang-14."""
    if compiler == "cc":
        return None
    if not os.path.exists(CLANG):
        skip("%s is not installed" % CLANG)
    return {"MOLT_CC": CLANG}


# -- markers ---------------------------------------------------------------------

def test_each_marker_kind(tool):
    tool.write("funcs.h", "int from_header_list(int);\n")
    tool.write("names.txt", "# one name per line\nfrom_name_list\n")
    tool.write("m.c", """#include <molt.h>
MOLT_UPDATABLE int by_macro(int x) { return x; }
/** DSU_FUNC */
int by_doc_block(int x) { return x; }
/// DSU_FUNC
int by_doc_line(int x) { return x; }
/* DSU_FUNC */
int by_plain_comment(int x) { return x; }
int from_header_list(int x) { return x; }
int from_name_list(int x) { return x; }
int not_marked(int x) { return x; }
""")
    tool.moltcc("-c", "m.c", "-o", "a.o").ok()
    assert set(descs(tool, "a.o")) == {"by_macro", "by_doc_block", "by_doc_line", "by_plain_comment"}
    tool.moltcc("-c", "m.c", "-o", "b.o", "--molt-funcs=funcs.h").ok()
    assert "from_header_list" in descs(tool, "b.o")
    tool.moltcc("-c", "m.c", "-o", "c.o", "--molt-funcs", "names.txt").ok()
    d = descs(tool, "c.o")
    assert "from_name_list" in d and "from_header_list" not in d and "not_marked" not in d


def test_marker_on_a_prototype_in_a_header(tool):
    tool.write("inc/api.h", "#include <molt.h>\nMOLT_UPDATABLE int api_call(int);\n/** DSU_FUNC */ int api_other(int);\n")
    tool.write("api.c", '#include "api.h"\nint api_call(int x) { return x + 1; }\nint api_other(int x) { return x; }\nint plain(int x) { return x; }\n')
    tool.moltcc("-Iinc", "-c", "api.c").ok()
    assert set(descs(tool, "api.o")) == {"api_call", "api_other"}


def test_updatable_all(tool):
    tool.write("hdr.h", "static inline int in_header(int x) { return x; }\n")
    tool.write("all.c", """#include "hdr.h"
static int s(int x) { return x + in_header(x); }
int g(int x) { return s(x); }
static inline int inl(int x) { return x; }
__attribute__((always_inline)) static inline int ainl(int x) { return x; }
int uses(int x) { return inl(x) + ainl(x); }
int main(void) { return g(0) + uses(0); }
""")
    r = tool.moltcc("--molt-updatable=all", "-c", "all.c").ok()
    assert set(descs(tool, "all.o")) == {"s", "g", "uses"}
    assert "warning" not in r.err


def test_descriptor_fields(tool, needs_lib):
    tool.write("src/d.c", """#include <molt.h>
MOLT_UPDATABLE static int st(int x) { return x; }
MOLT_UPDATABLE int gl(int x) { return st(x); }
int main(void) { return gl(0); }
""")
    tool.moltcc("-O2", "src/d.c", "-o", "prog").ok()
    e = Elf(tool.path("prog"))
    ds = {d["name"]: d for d in e.descriptors()}
    assert set(ds) == {"st", "gl"}
    for d in ds.values():
        check_desc(e, d, "d.c")
    assert ds["st"]["is_static"] == 1 and ds["gl"]["is_static"] == 0
    tool.run(["./prog"]).ok()


# -- behaviour ------------------------------------------------------------------------------

PROGRAM = r"""
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <molt.h>

extern char molt_fns_start[] __asm__("__start_molt_fns");
extern char molt_fns_stop[] __asm__("__stop_molt_fns");

static int counter;                 /* a static set at run time */

/** DSU_FUNC */
static int fib(int n)               /* static + recursive */
{
    static int calls;               /* function-local static: hoisted */
    calls++;
    counter = calls;
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

MOLT_UPDATABLE int join(char *buf, size_t n, const char *fmt, ...)   /* variadic */
{
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return r;
}

MOLT_UPDATABLE void vnote(int *out, int k, ...)                    /* variadic void */
{
    va_list ap, ap2;
    va_start(ap, k);
    va_copy(ap2, ap);
    int s = 0;
    for (int i = 0; i < k; i++) s += va_arg(ap2, int);
    va_end(ap2);
    va_end(ap);
    *out = s;
}

#define GETTER(field) MOLT_UPDATABLE int get_##field(const struct pt *p) { return p->field; }
struct pt { int x, y; };
/// DSU_FUNC
GETTER(x)
/// DSU_FUNC
GETTER(y)

#define NAME(n) pfx_##n
MOLT_UPDATABLE int NAME(named)(int a) { return a * 3; }

MOLT_UPDATABLE int gnu(int a)                     /* GNU extensions in the body */
{
    __typeof__(a) b = ({ int t = a * 2; t + 1; });
    __auto_type c = b;
#ifndef NO_NESTED
    int inner(int z) { return z + a; }           /* nested function (not in clang) */
#else
#define inner(z) ((z) + a)
#endif
    __attribute__((unused)) int unused_local = 0;
    return inner(c) + (a ?: 7);
}

typedef int (*op_t)(int);
MOLT_UPDATABLE static int (*pick(int which))(int)  /* returns a function pointer */
{
    return which ? fib : pfx_named;
}

MOLT_UPDATABLE static struct pt mkpt(int x) { struct pt p = {x, -x}; return p; }

static op_t table[] = { fib, pfx_named };           /* addresses taken at load time */

MOLT_UPDATABLE int count_up(void)
{
    static int n = 100, m;
    m++;
    return ++n + m;
}

int main(void)
{
    char buf[64];
    int s = 0;
    printf("fib %d\n", fib(10));
    printf("counter %d\n", counter);
    join(buf, sizeof buf, "%s-%d-%c", "a", 42, 'z');
    printf("join %s\n", buf);
    vnote(&s, 3, 1, 2, 3);
    printf("vnote %d\n", s);
    struct pt p = { 4, 5 };
    printf("get %d %d\n", get_x(&p), get_y(&p));
    printf("named %d\n", pfx_named(5));
    printf("gnu %d %d\n", gnu(3), gnu(0));
    printf("pick %d %d\n", pick(1)(7), pick(0)(7));
    printf("mkpt %d\n", mkpt(9).y);
    printf("table %d\n", table[0](6) + table[1](1));
    int a = count_up(), b = count_up();
    printf("count %d %d\n", a, b);
    /* &f is the stable entry: the descriptor's entry of every function */
    int stable = 1;
    for (char *d = molt_fns_start; d < molt_fns_stop; d += sizeof(molt__fn_desc)) {
        molt__fn_desc *fd = (molt__fn_desc *)d;
        if (!strcmp(fd->name, "fib")) stable &= fd->entry == (void *)&fib && fd->entry == (void *)table[0];
        if (!strcmp(fd->name, "pfx_named")) stable &= fd->entry == (void *)&pfx_named;
        if (!strcmp(fd->name, "pick")) stable &= fd->entry == (void *)&pick;
    }
    printf("stable %d\n", stable);
    /* every entry: 8-byte aligned `jmp rel32` to version 0, or to the
     * dispatch path for the variadic ones (no direct target) */
    int entries = 1;
    for (char *d = molt_fns_start; d < molt_fns_stop; d += sizeof(molt__fn_desc)) {
        molt__fn_desc *fd = (molt__fn_desc *)d;
        const unsigned char *at = fd->entry;
        int32_t rel;
        memcpy(&rel, at + 1, 4);
        int variadic = !strcmp(fd->name, "join") || !strcmp(fd->name, "vnote");
        entries &= (uintptr_t)at % 8 == 0 && at[0] == 0xe9;
        entries &= variadic ? fd->direct == NULL : fd->direct == fd->body;
        entries &= (const void *)(at + 5 + rel) == (variadic ? fd->dispatch : fd->direct);
        entries &= fd->dispatch != NULL && fd->dispatch != fd->body;
    }
    printf("entries %d\n", entries);
    return 0;
}
"""

EXPECTED = """fib 55
counter 177
join a-42-z
vnote 6
get 4 5
named 15
gnu 13 8
pick 13 21
mkpt -9
table 11
count 102 104
stable 1
entries 1
"""


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_program_behaves_the_same(tool, needs_lib, opt, compiler):
    env = compiler_env(compiler)
    tool.write("prog.c", PROGRAM)
    extra = ["-DNO_NESTED"] if env else []
    r = tool.moltcc(opt, "-g", "-Wall", "-Wextra", *extra, "prog.c", "-o", "prog", env=env).ok()
    assert not own_warnings(r.err, "prog.c"), r.err
    out = tool.run(["./prog"]).ok().out
    assert out == EXPECTED
    e = Elf(tool.path("prog"))
    ds = {d["name"]: d for d in e.descriptors()}
    assert set(ds) == {"fib", "join", "vnote", "get_x", "get_y", "pfx_named", "gnu", "pick",
                       "mkpt", "count_up"}
    for d in ds.values():
        check_desc(e, d, "prog.c", variadic=d["name"] in ("join", "vnote"))
    # hoisted statics have stable names in the right file group
    assert e.symbol("molt__fib__calls", file="prog.c") is not None
    assert e.symbol("molt__count_up__m", file="prog.c") is not None
    assert e.symbol("molt__count_up__n", file="prog.c") is not None


def kept_source(tool, r, name):
    kept = re.search(r"kept in (\S+)", r.err).group(1)
    with open(os.path.join(kept, "1", name)) as f:
        return f.read()


def test_generated_shape(tool):
    """The text moltcc generates for a plain, a variadic and a
    macro-defined function: prototypes of version 0 and of the dispatch
    path, the descriptor with its dispatch and direct targets, the naked
    entry (one MOLT__ENTRY_STUB) between MOLT__DIAG_PUSH/POP, the dispatch
    path, then version 0 with the user's body."""
    tool.write("s.c", """#include <molt.h>
#include <stdarg.h>
MOLT_UPDATABLE static int plain(int n) { return n + 1; }
MOLT_UPDATABLE int vari(int n, ...) { va_list ap; va_start(ap, n); int r = va_arg(ap, int); va_end(ap); return r + n; }
#define DEF(name) MOLT_UPDATABLE long name(long x) { return x * 2; }
DEF(made)
""")
    r = tool.moltcc("--molt-keep", "-c", "s.c").ok()
    text = kept_source(tool, r, "s.c")
    flat = re.sub(r"\s+", " ", text)

    def in_order(*parts):
        at = 0
        for p in parts:
            i = flat.find(p, at)
            assert i >= 0, (p, flat[at:at + 2000])
            at = i + len(p)

    in_order("static MOLT_UPDATABLE int plain__molt_v0(int n) ;",
             "static MOLT_UPDATABLE int plain__molt_dispatch(int n) ;",
             '(void *)&plain, (void *)&plain__molt_v0, (void *)&plain__molt_dispatch, '
             '(void *)&plain__molt_v0, 1, 0};',
             "MOLT__DIAG_PUSH",
             "MOLT__ENTRY_ATTRS MOLT_UPDATABLE static int plain(int n) "
             "{ MOLT__ENTRY_STUB(plain__molt_v0); }",
             "MOLT__DIAG_POP",
             "static __attribute__((used)) MOLT_UPDATABLE int plain__molt_dispatch(int n) { "
             "molt__gen *molt__g = molt__enter();",
             "molt__leave(molt__g); return molt__r; }",
             # __func__ in the renamed body still names the function
             "int plain__molt_v0(int n) {", '#define __func__ "plain"', "return n + 1;",
             '#pragma pop_macro("__func__")', "}")
    # variadic: version 0 takes a va_list; the dispatch path keeps the `...`
    # and is where the entry jumps; no direct target
    # (its va_list is marked unused: a body without va_start must not warn)
    in_order("static MOLT_UPDATABLE int vari__molt_v0(int n, __builtin_va_list molt__ap "
             "__attribute__((__unused__))) ;",
             "static MOLT_UPDATABLE int vari__molt_dispatch(int n, ...) ;",
             '(void *)&vari, (void *)&vari__molt_v0, (void *)&vari__molt_dispatch, '
             '(void *)0, 0, 0};',
             "MOLT__DIAG_PUSH",
             "MOLT__ENTRY_ATTRS",
             "MOLT_UPDATABLE int vari(int n, ...) { MOLT__ENTRY_STUB(vari__molt_dispatch); }",
             "MOLT__DIAG_POP",
             "static __attribute__((used)) MOLT_UPDATABLE int vari__molt_dispatch(int n, ...) {",
             "__builtin_va_start(molt__ap, n)",
             "int vari__molt_v0(int n, __builtin_va_list molt__ap __attribute__((__unused__))) {",
             '#define __func__ "vari"')
    # defined through a macro
    in_order("static __typeof__(long) made__molt_v0(__typeof__(long));",
             "static __typeof__(long) made__molt_dispatch(__typeof__(long));",
             "#define made made__molt_v0",
             "DEF(made)",
             "#undef made",
             '(void *)&made, (void *)&made__molt_v0, (void *)&made__molt_dispatch, '
             '(void *)&made__molt_v0, 0, 0};',
             "MOLT__DIAG_PUSH",
             "MOLT__ENTRY_ATTRS __typeof__(long) made(__typeof__(long) molt__a0) "
             "{ MOLT__ENTRY_STUB(made__molt_v0); }",
             "MOLT__DIAG_POP",
             "static __attribute__((used)) __typeof__(long) made__molt_dispatch("
             "__typeof__(long) molt__a0) {")
    # the object: descriptors carry all four pointers, the entries are
    # 8-byte aligned jumps
    e = Elf(tool.path("s.o"))
    ds = {d["name"]: d for d in e.descriptors()}
    assert set(ds) == {"plain", "vari", "made"}
    for name, d in ds.items():
        entry = e.symbol(name)
        assert d["entry"] == entry.value and entry.value % 8 == 0
        assert d["body"] == e.symbol(name + "__molt_v0").value
        assert d["dispatch"] == e.symbol(name + "__molt_dispatch").value
        assert d["direct"] == (None if name == "vari" else d["body"])
        assert e.read(entry.value, 1) == b"\xe9"


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("opt", ["-O0", "-Og", "-O2"])
def test_entry_bytes(tool, needs_lib, opt, compiler):
    """The first bytes of every entry in the linked program are e9 + rel32
    to version 0 (variadic: to the dispatch path), with the functions in
    sections of their own and unused sections collected (the displacement
    is then a link-time relocation)."""
    env = compiler_env(compiler)
    tool.write("b.c", r"""#include <stdarg.h>
#include <stdio.h>
#include <molt.h>
MOLT_UPDATABLE static int twice(int x) { return 2 * x; }
MOLT_UPDATABLE int sum(int n, ...)
{
    va_list ap;
    va_start(ap, n);
    int s = 0;
    for (int i = 0; i < n; i++) s += va_arg(ap, int);
    va_end(ap);
    return s;
}
MOLT_UPDATABLE void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
MOLT_UPDATABLE void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}
MOLT_UPDATABLE double mix(double a, float b, long c) { return a + b + (double)c; }
int main(void)
{
    say("%d %d %g\n", twice(21), sum(4, 1, 2, 3, 4), mix(0.5, 0.25f, 3));
    return 0;
}
""")
    r = tool.moltcc(opt, "-Wall", "-Wextra", "-ffunction-sections", "-Wl,--gc-sections",
                    "b.c", "-o", "b", env=env).ok()
    assert not own_warnings(r.err, "b.c"), r.err
    assert tool.run(["./b"]).ok().out == "42 10 3.75\n"
    e = Elf(tool.path("b"))
    ds = {d["name"]: d for d in e.descriptors()}
    assert set(ds) == {"twice", "sum", "say", "mix"}
    for d in ds.values():
        check_desc(e, d, "b.c", variadic=d["name"] in ("sum", "say"))


def test_recursion_and_pointers_go_through_the_stable_entry(tool):
    tool.write("r.c", "#include <molt.h>\n/** DSU_FUNC */\nint f(int n) { return n ? f(n - 1) : 0; }\n"
                      "int (*fp)(int) = f;\n")
    r = tool.moltcc("--molt-keep", "-c", "r.c").ok()
    kept = re.search(r"kept in (\S+)", r.err).group(1)
    with open(os.path.join(kept, "1", "r.c")) as f:
        text = f.read()
    # the body calls f (the stable entry), not f__molt_v0
    body = text[text.rindex("f__molt_v0(int n)"):]
    assert "f(n - 1)" in body
    # relocations: the pointer initializer refers to f
    rel = tool.run(["readelf", "-rW", "r.o"]).ok().out
    assert re.search(r"R_X86_64_64\s+\S+\s+f \+ 0", rel), rel


def test_refusals_are_warnings_not_miscompiles(tool):
    tool.write("bad.c", """#include <molt.h>
#include <stdlib.h>
#define REC(n) int n(int x) { return x ? n(x - 1) : 0; }
MOLT_UPDATABLE int knr(a, b) int a; int b; { return a + b; }
MOLT_UPDATABLE static inline int inl(int x) { return x; }
MOLT_UPDATABLE __attribute__((noreturn)) void die(int c) { exit(c); }
MOLT_UPDATABLE int unnamed(int, int b) { return b; }
/** DSU_FUNC */
REC(rec)
MOLT_UPDATABLE int localtype(int x) { struct p { int a; }; static struct p s; return s.a + x; }
MOLT_UPDATABLE __attribute__((weak)) int weakf(void) { return 1; }
MOLT_UPDATABLE int good(int x) { return inl(x); }
void fatal(int code) __attribute__((noreturn));
/** DSU_FUNC */
void fatal(int code) { exit(code); }
/** DSU_FUNC */
int params_named_like_attributes(int weak, int constructor) { return weak + constructor; }
""")
    r = tool.moltcc("-c", "bad.c").ok()
    for name, why in [("knr", "K&R"), ("inl", "inline"), ("die", "noreturn"),
                      ("unnamed", "no name"), ("rec", "refers to itself"),
                      ("localtype", "local to the function"), ("weakf", "weak"),
                      ("fatal", "noreturn")]:
        assert re.search(r"moltcc: warning: bad\.c:\d+: '%s' is not made updatable: .*%s" % (name, why),
                         r.err), (name, r.err)
    assert set(descs(tool, "bad.o")) == {"good", "params_named_like_attributes"}


def test_user_macros_named_like_entry_attributes(tool, needs_lib):
    # MOLT__ENTRY_ATTRS spells naked, aligned, noinline; the dispatch path
    # `used`: a user's `noinline` macro that the header itself uses stays
    # defined for the header only
    tool.write("n.c", """#include <stdio.h>
#include <molt.h>
#define noinline __attribute__((noinline))
#define naked 0
#define used 1
#define aligned(n) n
MOLT_UPDATABLE static noinline int f(int x) { return x + naked + used + aligned(2); }
MOLT_UPDATABLE noinline int g(int x, ...) { return x + used; }
int main(void) { printf("%d %d\\n", f(1), g(2)); return 0; }
""")
    tool.moltcc("-Wall", "-Wextra", "n.c", "-o", "n").ok()
    assert tool.run(["./n"]).ok().out == "4 3\n"
    e = Elf(tool.path("n"))
    for d in e.descriptors():
        check_desc(e, d, "n.c", variadic=d["name"] == "g")


def test_attributes_a_naked_entry_cannot_carry(tool):
    tool.write("a.c", """#include <molt.h>
MOLT_UPDATABLE __attribute__((target_clones("avx2", "default"))) int clones(int x) { return x; }
MOLT_UPDATABLE __attribute__((patchable_function_entry(4, 0))) int padded(int x) { return x; }
#define PATCHABLE __attribute__((__patchable_function_entry__(2)))
MOLT_UPDATABLE PATCHABLE int padded2(int x) { return x; }
MOLT_UPDATABLE __attribute__((cold, noinline)) int fine(int x) { return x; }
""")
    r = tool.moltcc("-c", "a.c").ok()
    # (libclang 14 does not know target_clones in C: refused either way)
    for name, why in [("clones", "(target_clones|libclang cannot parse it)"),
                      ("padded", "patchable_function_entry"),
                      ("padded2", "patchable_function_entry")]:
        assert re.search(r"moltcc: warning: a\.c:\d+: '%s' is not made updatable: %s" % (name, why),
                         r.err), (name, r.err)
    assert set(descs(tool, "a.o")) == {"fine"}


def test_user_macro_named_like_molt_h_fields(tool, needs_lib):
    # molt.h and the generated wrapper use `table`, `index`, `size`...
    tool.write("u.c", """#include <stdio.h>
#include <molt.h>
#define table 12
#define index 3
#define size sizeof
MOLT_UPDATABLE int f(int x) { return x + table + index + (int)size(int); }
int main(void) { printf("%d\\n", f(1)); return 0; }
""")
    tool.moltcc("u.c", "-o", "u").ok()
    assert tool.run(["./u"]).ok().out == "20\n"


def test_feature_macros_still_work(tool, needs_lib):
    # molt.h is not put before the user's first lines: _GNU_SOURCE keeps working
    tool.write("g.c", """#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
/// DSU_FUNC
int f(void) { char *s; int n = asprintf(&s, "%d", 7); free(s); return n; }
int main(void) { return f() == 1 ? 0 : 1; }
""")
    r = tool.moltcc("-std=c11", "-Werror=implicit-function-declaration", "g.c", "-o", "g").ok()
    tool.run(["./g"]).ok()


def test_pedantic_clean(tool):
    tool.write("p.c", """#include <molt.h>
#include <stdarg.h>
MOLT_UPDATABLE int f(int x) { return x; }
MOLT_UPDATABLE void g(int n, ...) { va_list ap; va_start(ap, n); va_end(ap); }
""")
    for std in ("-std=c11", "-std=gnu17"):
        r = tool.moltcc(std, "-pedantic", "-Wall", "-Wextra", "-Wmissing-prototypes",
                        "-Wstrict-prototypes", "-c", "p.c").ok()
        own = [l for l in r.err.splitlines() if l.startswith("p.c:") and "warning" in l]
        assert not own, r.err


def test_user_line_directives_are_continued(tool):
    # files generated by bison/flex carry their own #line directives
    tool.write("gen.c", """#include <molt.h>
#line 100 "parser.y"
static int
rule (int a)
{
  int unused_in_rule;
  return a;
}
#line 11 "gen.c"
MOLT_UPDATABLE int after(int x)
{
  int unused_after;
  return rule(x);
}
""")
    r = tool.moltcc("-Wall", "--molt-updatable=all", "-c", "gen.c").ok()
    assert re.search(r"^parser\.y:103:7: warning: unused variable .unused_in_rule.", r.err, re.M), r.err
    assert re.search(r"^gen\.c:13:7: warning: unused variable .unused_after.", r.err, re.M), r.err


def test_export_macros_asm_labels_and_shared_libraries(tool, needs_lib):
    tool.write("lib.c", """#include <molt.h>
#define API __attribute__((visibility("default")))
/** DSU_FUNC */
API int exported(int x) { return x + 1; }
/** DSU_FUNC */
__attribute__((visibility("default"), noinline)) int exported2(int x) { return x + 2; }
int g(void) __asm__("real_g");
/** DSU_FUNC */
int g(void) { return 1; }
""")
    r = tool.moltcc("-Wall", "-Werror=attributes", "-fPIC", "-shared", "-fvisibility=hidden",
                    "lib.c", "-o", "libx.so").ok()
    assert "'g' is not made updatable: it has an asm label (symbol real_g)" in r.err
    e = Elf(tool.path("libx.so"))
    assert {d["name"] for d in e.descriptors()} == {"exported", "exported2"}
    dyn = {s.name for s in e.symbols(".dynsym") if s.shndx}
    assert {"exported", "exported2"} <= dyn and not any("molt_v0" in n for n in dyn)
    tool.write("use.c", '#include <stdio.h>\nint exported(int);\nint exported2(int);\n'
                        'int main(void) { printf("%d\\n", exported(1) + exported2(1)); return 0; }\n')
    tool.moltcc("use.c", "-L.", "-lx", "-Wl,-rpath,$ORIGIN", "-o", "use").ok()
    assert tool.run(["./use"]).ok().out == "5\n"


def test_static_used_through_a_macro(tool, needs_lib):
    tool.write("s.c", """#include <stdio.h>
#include <molt.h>
#define BUMP() (hits += step)
MOLT_UPDATABLE int f(int step)
{
    static int hits;
#define PEEK hits
    BUMP();
    return PEEK;
}
int main(void) { f(2); f(3); printf("%d\\n", f(4)); return 0; }
""")
    tool.moltcc("-Wall", "s.c", "-o", "s").ok()
    assert tool.run(["./s"]).ok().out == "9\n"
    assert Elf(tool.path("s")).symbol("molt__f__hits", file="s.c") is not None


def test_tag_before_a_macro_does_not_mark_the_next_function(tool):
    tool.write("t.c", """#include <molt.h>
#define GETTER(f) int get_##f(int v) { return v; }
/// DSU_FUNC
GETTER(a)
int next_one(int x) { return x; }
""")
    tool.moltcc("-c", "t.c").ok()
    assert set(descs(tool, "t.o")) == {"get_a"}


def test_cf_protection_entry_is_refused_with_its_reason(tool, needs_lib):
    """-fcf-protection puts endbr64 before the entry's jump, which the
    runtime cannot rewrite atomically: the program runs (every function at
    version 0), and the runtime refuses updates, naming the option."""
    tool.write("c.c", r"""#include <stdio.h>
#include <molt.h>
MOLT_UPDATABLE int add(int a, int b) { return a + b; }
int main(void)
{
    char err[512];
    int rc = molt_apply("/nonexistent.so", MOLT_POLICY_IMMEDIATE, -1, err, sizeof err);
    printf("%d %d %s\n", add(40, 2), rc == MOLT_EREFUSING, err);
    return 0;
}
""")
    tool.moltcc("-O2", "-fcf-protection", "c.c", "-o", "c").ok()
    out = tool.run(["./c"]).ok().out
    assert out.startswith("42 1 "), out
    assert "starts with endbr64" in out and "-fcf-protection=none" in out, out
