"""Generated code is warning-free: a program and a patch of it, with
updatable functions of every shape moltcc generates (extern, static,
variadic with and without va_start, void, no parameters, defined through a
macro, with a function-local static), build with -Werror -Wall -Wextra
-Wpedantic under gcc and clang."""
import os

import pytest

from harness.tree import build_sanitize, skip

CLANG = "/usr/bin/clang-14"
# A clang program cannot run against a libmolt built with gcc's sanitizers:
# the clang variant runs in the plain build tree only (as in tests/moltcc).
COMPILERS = ["cc"] + ([] if build_sanitize() else ["clang-14"])

SOURCE = r"""
#include <stdarg.h>
#include <stdio.h>
struct pt { int x, y; };
#define DEFINE_GETTER(name, field) int name(const struct pt *p) { return p->field; }
DEFINE_GETTER(get_x, x)
DEFINE_GETTER(get_y, y)
static int counter(void) { static int n; return ++n; }
int vsum(int n, ...) {
    va_list ap;
    va_start(ap, n);
    int s = 0;
    for (int i = 0; i < n; i++) s += va_arg(ap, int);
    va_end(ap);
    return s;
}
void trace(const char *what, ...) { fputs(what, stdout); }  /* never va_start */
static void tick(void) { counter(); }
struct pt mk(int x, int y) { struct pt p = {x, y}; return p; }
int main(void) {
    struct pt p = mk(1, 2);
    tick();
    trace("t\n", 1);
    printf("%d %d %d %d\n", get_x(&p), get_y(&p), vsum(2, 3, 4), counter());
    return 0;
}
"""


@pytest.mark.parametrize("compiler", COMPILERS)
def test_no_warnings_from_generated_code(tool, compiler):
    env = None
    if compiler != "cc":
        if not os.path.exists(CLANG):
            skip("%s is not installed" % CLANG)
        env = {"MOLT_CC": CLANG}
    flags = ["-O2", "-g", "-std=gnu11", "-Werror", "-Wall", "-Wextra", "-Wpedantic"]
    tool.write("w.c", SOURCE)
    # the plain build is warning-free: anything moltcc adds is its own
    tool.run([CLANG if env else "cc"] + flags + ["-o", "plain", "w.c"]).ok()
    r = tool.moltcc("--molt-updatable=all", *flags, "-o", "w", "w.c", env=env).ok()
    assert "warning" not in r.err, r.err
    assert tool.run(["./w"]).ok().out == "t\n1 2 7 2\n"
    fixed = SOURCE.replace("return p->field;", "return p->field + 1;") \
                  .replace("return ++n;", "return n += 2;") \
                  .replace("fputs(what, stdout);", "fputs(what, stdout); fputs(what, stdout);")
    tool.write("v2/w.c", fixed)
    # the patch's files are compiled with the program's recorded flags:
    # -Werror -Wall -Wextra -Wpedantic again
    r = tool.moltcc("--molt-patch", "--molt-target", "./w", "-o", "p.so", "v2/w.c", env=env).ok()
    assert "warning" not in r.err, r.err
    assert "replaced (4)" in r.err and "trace" in r.err, r.err
