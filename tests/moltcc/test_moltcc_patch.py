"""Patch builds: moltcc --molt-patch --molt-target PROG -o fix.so SOURCES.
The records are decoded from the ELF file (relocations applied), so these
tests check exactly what the runtime will read."""
import os
import re
import shutil
import struct

import pytest

from harness.elf import Elf
from harness.tree import molt_abi

PROG_MAIN = r"""
#include <stdarg.h>
#include <stdio.h>
#include <molt.h>

extern int shared_total;
int other_fn(int);
int other_helper(int);

static int hits;                         /* static, set at run time */
int counter = 0;                         /* global */
static const char *names[] = { "a", "b" };

static int helper(int x) { return x + 1; }          /* not updatable */

/** DSU_FUNC */
static int step(int n)                   /* static, recursive */
{
    static int calls;                    /* hoisted: molt__step__calls */
    calls++;
    hits++;
    return n ? step(n - 1) + helper(n) : 0;
}

MOLT_UPDATABLE int report(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = vprintf(fmt, ap);
    va_end(ap);
    return r;
}

MOLT_UPDATABLE int handle(int x)
{
    counter++;
    shared_total += x;
    return step(x) + other_fn(x) + other_helper(x) + (int)sizeof(names);
}

int main(int argc, char **argv)
{
    return handle(argc) > 0 ? 0 : 1;
}
"""

PROG_OTHER = r"""
#include <molt.h>
int shared_total;
MOLT_UPDATABLE int other_fn(int x) { return x * 2; }
int other_helper(int x) { return x - 1; }
"""

PATCH_MAIN = r"""
#include <stdarg.h>
#include <stdio.h>
#include <molt.h>

extern int shared_total;
int other_fn(int);
int other_helper(int);

static int hits;
int counter = 0;
static const char *names[] = { "a", "b" };
static int new_state = 5;                /* new in this version */

__attribute__((noipa)) static int helper(int x) { return x + 2; }          /* private copy */
__attribute__((noipa)) static int new_helper(int x) { return x * new_state++; }

/** DSU_FUNC */
static int step(int n)
{
    static int calls;
    calls++;
    hits += 2;
    return n ? step(n - 1) + helper(n) + new_helper(1) : 0;
}

MOLT_UPDATABLE int report(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("v2: ");
    int r = vprintf(fmt, ap);
    va_end(ap);
    return r;
}

MOLT_UPDATABLE int handle(int x)
{
    int (*f)(int) = step;                /* &f is the program's stable entry */
    counter += 2;
    shared_total -= x;
    return f(x) + other_fn(x) + other_helper(x) + (int)sizeof(names);
}

MOLT_UPDATABLE int brand_new(int x) { return x; }    /* not in the target */

int main(int argc, char **argv)
{
    return handle(argc) > 0 ? 0 : 1;
}
"""


@pytest.fixture
def prog(tool, needs_stamp):
    tool.write("main.c", PROG_MAIN)
    tool.write("other.c", PROG_OTHER)
    tool.moltcc("-O2", "-g", "main.c", "other.c", "-o", "prog").ok()
    tool.write("v2/main.c", PATCH_MAIN)
    return tool


def header(e):
    sym = e.symbol("molt_patch_header")
    assert sym is not None and sym.bind == "GLOBAL"
    magic, abi = struct.unpack("<II", e.read(sym.value, 8))
    return dict(magic=magic, abi=abi, id=e.string(e.pointer(sym.value + 8)),
                description=e.string(e.pointer(sym.value + 16)))


def test_patch_records(prog):
    t = prog
    r = t.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "fix1.so", "v2/main.c",
                 "-O2", "-g", "--molt-description", "double hits").ok()
    # a function marked updatable that the target does not have
    assert re.search(r"moltcc: warning: v2/main\.c:\d+: 'brand_new' is marked updatable but "
                     r"\./prog has no updatable function 'brand_new'", r.err), r.err
    e = Elf(t.path("fix1.so"))
    assert e.section("molt_pfns") is not None and e.section("molt_imports") is not None
    pfns = {p["name"]: p for p in e.patch_fns()}
    assert set(pfns) == {"step", "report", "handle"}
    assert pfns["step"]["tu"] == "main.c"
    assert pfns["report"]["tu"] is None and pfns["handle"]["tu"] is None
    for name, p in pfns.items():
        # each new version is named as the source names it (issue 12: gdb,
        # addr2line, perf); an extern one also has a hidden-version dynamic
        # symbol of that name, for dladdr
        impl = [s for s in e.symbols() if s.name == name and s.shndx != 0 and s.bind == "LOCAL"]
        assert impl and p["impl"] == impl[0].value, (name, impl)
        assert e.symbol(name + "__molt_p") is None

    # the program's objects the compiled patch refers to: each an undefined
    # symbol (a static's molt.imp.<n>, a global's own name) that moltstamp
    # marked weak, bound by the runtime
    imps = {(i["name"], i["tu"]) for i in e.imports()}
    assert imps == {
        ("hits", "main.c"),                 # static variable of the program
        ("counter", None),                  # global variable
        ("shared_total", None),             # global of another file
        ("molt__step__calls", "main.c"),    # hoisted function-local static
        ("step", "main.c"),                 # updatable static: its stable entry
        ("other_fn", None),                 # updatable global of another file
        ("other_helper", None),             # non-updatable global, not in the patch
    }                                       # (names: sizeof only, no reference)
    dynsym = {s.name: s for s in e.symbols(".dynsym")}
    assert len({i["symbol"] for i in e.imports()}) == len(e.imports())
    for i in e.imports():
        assert i["symbol"] == (i["name"] if i["tu"] is None else i["symbol"])
        assert i["tu"] is None or i["symbol"].startswith("molt.imp."), i
        s = dynsym[i["symbol"]]
        assert s.shndx == 0 and s.bind == "WEAK", s

    # new objects and private copies live in the patch, unexported
    for name in ("new_state", "new_helper", "helper", "brand_new"):
        s = e.symbol(name)
        assert s is not None and s.bind == "LOCAL", name
    dyn = {s.name for s in e.symbols(".dynsym") if s.shndx}
    assert dyn & {"helper", "new_helper", "new_state", "hits", "counter", "step"} == set()
    # never re-run start-up code: main is not in the patch
    assert e.symbol("main") is None
    # library functions stay ordinary references
    und = {s.name for s in e.symbols(".dynsym") if s.shndx == 0}
    assert "printf" in und or "vprintf" in und
    assert "molt_patch_header" in dyn

    h = header(e)
    assert h == dict(magic=0x4D4F4C54, abi=molt_abi(), id="fix1", description="double hits")
    note = e.molt_note()
    assert note["type"] == 0x4D50 and note["abi"] == molt_abi()
    assert note["target_build_id"] == Elf(t.path("prog")).build_id()


def test_patch_id_option_and_no_molt_sections_in_program_style(prog):
    t = prog
    os.makedirs(t.path("out"))
    t.moltcc("--molt-patch", "--molt-target=./prog", "-o", "out/p.so", "v2/main.c",
             "--molt-patch-id", "fix-42").ok()
    e = Elf(t.path("out/p.so"))
    assert header(e)["id"] == "fix-42"
    assert e.section("molt_fns") is None          # patches carry no descriptors


def test_patch_from_two_sources(prog):
    t = prog
    # other_helper is not updatable and other files call it: a changed
    # other_helper cannot be carried (main.c's live code would keep calling
    # the old one), so the patch is refused
    t.write("v2/other.c", PROG_OTHER.replace("x * 2", "x * 3").replace("x - 1", "x - 7"))
    r = t.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "both.so",
                 "v2/main.c", "v2/other.c")
    assert r.rc == 1 and re.search(r"moltcc: error: v2/other\.c:\d+: other_helper: not updatable "
                                   r"and has external linkage", r.err), r
    assert not os.path.exists(t.path("both.so"))
    t.write("v3/other.c", PROG_OTHER.replace("x * 2", "x * 3"))
    t.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "both.so",
             "v2/main.c", "v3/other.c").ok()
    e = Elf(t.path("both.so"))
    pfns = {p["name"]: p["tu"] for p in e.patch_fns()}
    assert pfns == {"step": "main.c", "report": None, "handle": None, "other_fn": None}
    imps = {(i["name"], i["tu"]) for i in e.imports()}
    # the unchanged other_helper is the program's
    assert ("other_helper", None) in imps
    assert ("other_fn", None) in imps              # handle's call: the stable entry


def test_patch_errors(prog):
    t = prog
    r = t.moltcc("--molt-patch", "--molt-target", "./nope", "-o", "x.so", "v2/main.c")
    assert r.rc == 1 and r.err.strip() == "moltcc: error: target ./nope does not exist"
    r = t.moltcc("--molt-patch", "-o", "x.so", "v2/main.c")
    assert r.rc == 1 and r.err.startswith("moltcc: error: --molt-patch needs --molt-target")
    t.write("v2/none.c", "int unrelated(int x) { return x; }\n")
    r = t.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "x.so", "v2/none.c")
    assert r.rc == 1 and "moltcc: error: v2/none.c is not the new version of a file ./prog " \
        "was built from" in r.err
    assert not os.path.exists(t.path("x.so"))
    shutil.copy(t.path("prog"), t.path("stripped"))
    t.run(["strip", "stripped"]).ok()
    r = t.moltcc("--molt-patch", "--molt-target", "./stripped", "-o", "x.so", "v2/main.c")
    assert r.rc == 1 and "has no symbol table" in r.err
    t.write("plain.c", "int main(void) { return 0; }\n")
    t.cc("plain.c", "-o", "plainprog").ok()
    r = t.moltcc("--molt-patch", "--molt-target", "./plainprog", "-o", "x.so", "v2/main.c")
    # built without moltcc: an attach patch, which is built from a fix only
    assert r.rc == 1 and "plainprog has no compile record (it was built without moltcc)" in r.err \
        and "--molt-diff FIX.patch" in r.err
    t.write("v3/main.c", PATCH_MAIN)
    r = t.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "x.so", "v2/main.c", "v3/main.c")
    assert r.rc == 1 and "two patch sources are named main.c" in r.err


def test_static_matched_by_file_name(prog):
    # a new source is the new version of the program's file with its name
    # (statics are found by file name): another name is refused
    t = prog
    t.write("renamed/main2.c", PATCH_MAIN)
    r = t.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "r.so", "renamed/main2.c")
    assert r.rc == 1 and "renamed/main2.c is not the new version of a file ./prog was built " \
        "from" in r.err, r
    assert not os.path.exists(t.path("r.so"))


def test_updatable_in_target_without_markers(tool, needs_stamp):
    # built with --molt-updatable=all, patched from plain new source
    tool.write("a.c", "static int s(int x) { return x; }\nint g(int x) { return s(x) + 1; }\n"
                      "int main(void) { return g(0) - 1; }\n")
    tool.moltcc("--molt-updatable=all", "a.c", "-o", "prog").ok()
    tool.write("v2/a.c", "static int s(int x) { return x * 2; }\nint g(int x) { return s(x) + 1; }\n"
                         "int main(void) { return g(0) - 1; }\n")
    tool.moltcc("--molt-patch", "--molt-target", "prog", "-o", "p.so", "v2/a.c").ok()
    e = Elf(tool.path("p.so"))
    # only what changed: g calls s through its stable entry and stays as it is
    assert {(p["name"], p["tu"]) for p in e.patch_fns()} == {("s", "a.c")}
    assert {(i["name"], i["tu"]) for i in e.imports()} == set()


def test_macro_references_and_thread_locals(tool, needs_stamp):
    tool.write("m.c", """#include <molt.h>
static int level;
static __thread int tls_count;
#define BUMP() (level++)
MOLT_UPDATABLE int f(void) { return BUMP(); }
MOLT_UPDATABLE int t(void) { return tls_count++; }
int main(void) { return f() + t(); }
""")
    tool.moltcc("m.c", "-o", "prog").ok()
    tool.write("v2/m.c", """#include <molt.h>
static int level;
#define BUMP() (level += 2)
MOLT_UPDATABLE int f(void) { int r = BUMP(); return r; }
""")
    r = tool.moltcc("--molt-patch", "--molt-target", "prog", "-o", "p.so", "v2/m.c").ok()
    assert {(i["name"], i["tu"]) for i in Elf(tool.path("p.so")).imports()} == {("level", "m.c")}
    tool.write("v3/m.c", """#include <molt.h>
static __thread int tls_count;
MOLT_UPDATABLE int t(void) { return tls_count += 2; }
""")
    r = tool.moltcc("--molt-patch", "--molt-target", "prog", "-o", "q.so", "v3/m.c")
    # (the declaration the patch would have to import)
    assert r.rc == 1 and "thread-local" in r.err and r.err.startswith("moltcc: error: v3/m.c:2:")


def test_static_prototype_and_macro_calls_are_imports(tool, needs_stamp):
    tool.write("m.c", """#include <molt.h>
__attribute__((noipa)) static int sq(int x) { return x * x; }
MOLT_UPDATABLE int f(int x) { return sq(x); }
int main(void) { return f(0); }
""")
    tool.moltcc("m.c", "-o", "prog").ok()
    tool.write("v2/m.c", """#include <molt.h>
static int sq(int);
#define SQ(v) sq(v)
MOLT_UPDATABLE int f(int x) { return SQ(x) + f(0) * 0; }
""")
    r = tool.moltcc("--molt-patch", "--molt-target", "prog", "-o", "p.so", "v2/m.c",
                    "-Wall", "-Werror").ok()
    assert "never defined" not in r.err
    e = Elf(tool.path("p.so"))
    assert {(i["name"], i["tu"]) for i in e.imports()} == {("sq", "m.c"), ("f", "m.c")} - {("f", "m.c")} | {("f", None)}


def test_patch_runs_no_code_at_load(prog):
    """Issue 16: nothing of a patch runs inside dlopen or dlclose.  A
    constructor in an object of the link is an error naming the function
    and the object; a patch that builds has no DT_INIT*/DT_FINI* at all."""
    t = prog
    t.write("ctor.c", "#include <stdio.h>\n"
                      "__attribute__((constructor)) static void say_hello(void) "
                      "{ puts(\"hello from a patch\"); }\n"
                      "int unused_ctor_helper(int x) { return x; }\n")
    t.cc("-c", "-fPIC", "ctor.c", "-o", "ctor.o").ok()
    r = t.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "c.so", "v2/main.c", "ctor.o")
    assert r.rc == 1 and "moltcc: error: ctor.o: function say_hello is a constructor" in r.err, r
    assert not os.path.exists(t.path("c.so"))
    t.write("dtor.c", "__attribute__((destructor)) void bye(void) {}\n")
    t.cc("-c", "-fPIC", "dtor.c", "-o", "dtor.o").ok()
    r = t.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "c.so", "v2/main.c", "dtor.o")
    assert r.rc == 1 and "function bye is a destructor" in r.err, r
    t.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "ok.so", "v2/main.c").ok()
    dyn = t.run(["readelf", "-dW", "ok.so"]).ok().out
    for tag in ("(INIT)", "(FINI)", "(INIT_ARRAY)", "(FINI_ARRAY)", "(PREINIT_ARRAY)"):
        assert tag not in dyn, dyn
