"""Patches from a fix, corpus 3: files whose shape the old patch weaver
could not build (issue 10 item 6), built with
-Wall -Wextra -Werror -Wredundant-decls -Wmissing-prototypes -pedantic by
gcc and clang, patched while the program runs.

- a static used through a macro and also a field name (`level`);
- `sizeof` of a static array declared `[]` (its bound comes from the
  initializer the patch drops);
- a global initialised to a program function (`int (*stored)(int) =
  compute;`) and a new table in the patch that points at one;
- a `static const` table used by shipped code: the program's own object
  (its address is the one the program's unchanged code returns);
- a `#define` inside a dropped initializer, used by shipped code;
- two files with statics of the same name (`count`), both changed;
- a function head written with #if/#else;
- a function with a directive inside its parameter list (nginx's
  ngx_ssl_get_cached_session), in the program build and the patch;
- a global whose name is written as a macro (`#define base_value
  prog_base_value`, as dnsmasq writes `daemon`);
- `__func__` in a woven body and in a new version names the function.

And a C89 program (-ansi -pedantic) patched the same way."""
import re

import pytest

from corpus import FileReporter, Project, need, ok_patch, run
from harness.moltcc import moltcc_cmd

STRICT = ["-O2", "-g", "-Wall", "-Wextra", "-Werror", "-Wredundant-decls",
          "-Wmissing-prototypes", "-pedantic", "-std=c99", "-D_POSIX_C_SOURCE=200809L"]

PROG_H = r"""#ifndef PROG_H
#define PROG_H
struct item { int level; int weight; };
extern int (*stored)(int);
#define base_value prog_base_value
extern int base_value;
int compute(int x);
int table_sum(void);
const int *weights_at(void);
int macro_level(const struct item *it);
const char *first(void);
const char *fname(void);
const char *fname0(void);
int a_tick(void);
int b_tick(void);
int use_stored(int x);
#if defined(WIDE)
long b_scale(long x);
#else
int b_scale(int x);
#endif
#endif
"""

A_C = r"""#include <stddef.h>
#include "prog.h"

static int count;
static int level = 3;
#define LEVEL_OF(it) ((it)->level + level)
static const int weights[] = {1, 2, 3, 4};
#define NWEIGHTS (sizeof weights / sizeof weights[0])
static const char *const names[] = {
#define FIRST_NAME "alpha"
    FIRST_NAME, "beta"
};
int (*stored)(int) = compute;
int base_value = 7;

static int zero_of(int v,
#if 1
    const
#endif
    int *unused)
{
    (void)unused;
    return v - v;
}

int compute(int x) { return x + 1 + base_value - 7 + zero_of(x, NULL); }

const int *weights_at(void) { return weights; }

int table_sum(void)
{
    int s = 0;
    size_t i;
    for (i = 0; i < NWEIGHTS; i++)
        s += weights[i];
    return s;
}

int macro_level(const struct item *it) { return LEVEL_OF(it); }

const char *first(void) { return names[0]; }

const char *fname(void) { return "none"; }

const char *fname0(void) { return __func__; }

int a_tick(void) { return ++count; }

int use_stored(int x) { return stored(x); }
"""

B_C = r"""#include "prog.h"

static int count = 1000;

int b_tick(void) { return ++count; }

#if defined(WIDE)
long
b_scale(long x)
#else
int
b_scale(int x)
#endif
{
    return x * 2;
}
"""

MAIN_C = r"""#include <stdio.h>
#include <time.h>
#include "prog.h"

int main(int argc, char **argv)
{
    char tmp[4096];
    struct timespec ts = {0, 5000000};
    struct item it = {10, 0};
    int i;
    if (argc != 2)
        return 2;
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    for (i = 1;; i++) {
        int a = a_tick(), b = b_tick();
        FILE *f = fopen(tmp, "w");
        if (f == NULL)
            return 3;
        fprintf(f, "i=%d a=%d b=%d sum=%d lvl=%d first=%s fn=%s fn0=%s stored=%d scale=%d\n",
                i, a, b, table_sum(), macro_level(&it), first(), fname(), fname0(), use_stored(1),
                (int)b_scale(5));
        fclose(f);
        rename(tmp, argv[1]);
        nanosleep(&ts, NULL);
    }
}
"""

MAKEFILE = """CFLAGS = %s
OBJS = main.o a.o b.o
prog: $(OBJS)
\t$(CC) $(CFLAGS) -o $@ $(OBJS)
%%.o: %%.c prog.h
\t$(CC) $(CFLAGS) -c -o $@ $<
"""

FIX = {
    "a.c": [
        # a macro use of the static `level`, also a field name
        ("{ return LEVEL_OF(it); }", "{ return LEVEL_OF(it) * 100; }"),
        # sizeof of the static array, and the live table
        ("        s += weights[i];\n    return s;",
         "        s += weights[i] * 10;\n    if (weights != weights_at())\n        return -1;\n"
         "    return s;"),
        # a #define inside the dropped initializer of names
        ("{ return names[0]; }", "{ return names[1][0] == 'b' ? FIRST_NAME \"!\" : names[0]; }"),
        ("{ return \"none\"; }", "{ return __func__; }"),
        ("{ return ++count; }", "{ count += 10; return count; }"),
        # a new table in the patch that points at a program function
        ("int use_stored(int x) { return stored(x); }",
         "static int (*const ops[])(int) = {compute};\n\n"
         "int use_stored(int x) { return stored(x) + ops[0](x) * 100; }"),
        ("int compute(int x) { return x + 1 + base_value - 7 + zero_of(x, NULL); }",
         "int compute(int x) { return x + 2 + base_value - 7 + zero_of(x, NULL); }"),
    ],
    "b.c": [("{ return ++count; }", "{ count += 10; return count; }"),
            ("    return x * 2;", "    return x * 3;")],
}


def fields(text):
    return dict(re.findall(r"(\w+)=(\S+)", text))


@pytest.mark.parametrize("cc", ["gcc", "clang-14"])
def test_declarations_of_real_files(tmp_path, cc):
    need(("make", "git", cc))
    files = {"prog.h": PROG_H, "a.c": A_C, "b.c": B_C, "main.c": MAIN_C,
             "Makefile": MAKEFILE % " ".join(STRICT), ".gitignore": "*.o\nprog\n"}
    p = Project(tmp_path / "proj", files, cc=cc)
    p.make("prog")
    prog = FileReporter([p.path("prog")], p.root, str(tmp_path / "report"))
    try:
        before = fields(prog.wait(lambda t: int(fields(t).get("a", 0)) > 5))
        assert before["sum"] == "10" and before["lvl"] == "13" and before["first"] == "alpha"
        assert before["fn"] == "none" and before["stored"] == "2" and before["scale"] == "10"
        # __func__ in a woven body is the function's own name
        assert before["fn0"] == "fname0", before
        d = p.git_diff(FIX)
        r, data, out = p.patch([d])
        ok_patch(r, out)
        assert "refers to" not in r.err
        want = {("macro_level", None), ("table_sum", None), ("first", None), ("fname", None),
                ("a_tick", None), ("compute", None), ("use_stored", None), ("b_tick", None),
                ("b_scale", None)}
        assert {(f["name"], None) for f in data["replaced"]} == want
        assert prog.apply(out).rc == 0
        after = fields(prog.wait(lambda t: fields(t).get("fn") == "fname"))
        # the live table (its address is the program's), all four entries
        assert after["sum"] == "100", after
        # `level` is the program's static (3), `it->level` the field (10)
        assert after["lvl"] == "1300", after
        assert after["first"] == "alpha!", after
        # stored still points at compute's stable entry: the new compute;
        # the patch's own table {compute} too
        assert after["stored"] == str(3 + 3 * 100), after
        assert after["scale"] == "15", after
        # both `count`s continued, each its own file's
        later = fields(prog.wait(lambda t: int(fields(t)["i"]) > int(after["i"]) + 2))
        assert int(later["a"]) - int(after["a"]) >= 20 and int(after["a"]) > int(before["a"])
        assert int(later["b"]) > 1000 + int(before["i"]) and \
            int(later["b"]) - int(after["b"]) >= 20
        assert prog.alive()
    finally:
        out_, err = prog.stop()
    assert "runtime error" not in err, err


C89_C = r"""#include <stdio.h>
#include <time.h>

static int hits;
static const char *const words[] = {"one", "two", "three"};

static int pick(int i)
{
    /* C89: declarations first, no // comments */
    int n = (int)(sizeof words / sizeof words[0]);
    hits++;
    return i % n;
}

int main(int argc, char **argv)
{
    char tmp[4096];
    struct timespec ts;
    int i;
    ts.tv_sec = 0;
    ts.tv_nsec = 5000000;
    if (argc != 2)
        return 2;
    sprintf(tmp, "%.4000s.tmp", argv[1]);
    for (i = 1;; i++) {
        FILE *f = fopen(tmp, "w");
        if (f == NULL)
            return 3;
        fprintf(f, "i=%d word=%s hits=%d\n", i, words[pick(i)], hits);
        fclose(f);
        rename(tmp, argv[1]);
        nanosleep(&ts, NULL);
    }
}
"""


def test_c89_program(tmp_path):
    need(("git", "diff", "gcc"))
    p = Project(tmp_path / "proj", {"prog.c": C89_C, ".gitignore": "*.o\nprog\n"}, cc="gcc")
    flags = ["-ansi", "-pedantic", "-D_POSIX_C_SOURCE=200809L", "-O2", "-g", "-Wall",
             "-Wextra", "-Werror"]
    for cmd in (["--molt-updatable=all"] + flags + ["-c", "prog.c", "-o", "prog.o"],
                ["prog.o", "-o", "prog"]):
        r = run(moltcc_cmd() + cmd, p.root, {"MOLT_CC": "gcc"})
        assert r.rc == 0, r
    prog = FileReporter([p.path("prog")], p.root, str(tmp_path / "report"))
    try:
        before = fields(prog.wait(lambda t: int(fields(t).get("hits", 0)) > 5))
        d = p.diff_u({"prog.c": [("    hits++;\n", "    hits += 100;\n"),
                                 ("return i % n;", "return (i % 1) * n;")]})
        r, data, out = p.patch([d])
        ok_patch(r, out)
        assert {f["name"] for f in data["replaced"]} == {"pick"}
        assert prog.apply(out).rc == 0
        after = fields(prog.wait(lambda t: fields(t).get("word") == "one"
                                 and int(fields(t)["i"]) % 3 != 1))
        later = fields(prog.wait(lambda t: int(fields(t)["i"]) > int(after["i"]) + 2))
        # the live `hits` went on counting, now by 100
        assert int(later["hits"]) - int(after["hits"]) >= 200
        assert int(after["hits"]) > int(before["hits"])
    finally:
        prog.stop()
