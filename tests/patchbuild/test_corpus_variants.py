"""Patches from a fix, corpus 2: one loop program that reports through a
file, built from a plain command line with moltcc --molt-updatable=all by
gcc and clang at -O0 and -O2.  The same fix -- a changed global function
(body only), a changed static function, the cold path of a function (gcc
-O2 splits it into a `.cold` piece) -- is built from `diff -u` in another
directory and applied to the running program: the new code runs, the
function-local static keeps counting, and `molt status` shows exactly the
replaced functions."""
import os
import re

import pytest

from corpus import FileReporter, Project, need, ok_patch, run
from harness.moltcc import moltcc_cmd

PROG_C = r"""#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int version(void);
int compute(int i);
int check(int v);

int version(void) { return 1; }

static int weight(int i) { return i % 7; }

int compute(int i)
{
    static int total;
    total += weight(i);
    return total;
}

__attribute__((cold, noinline)) static void complain(const char *what, int v)
{
    fprintf(stderr, "%s: %d\n", what, v);
}

int check(int v)
{
    if (__builtin_expect(v < 0, 0)) {
        complain("negative", v);
        return -1000;
    }
    return v;
}

int main(int argc, char **argv)
{
    char tmp[4096];
    struct timespec ts = {0, 5000000};
    if (argc != 2)
        return 2;
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    for (int i = 1;; i++) {
        int total = compute(i);
        int c = check(i % 4 == 0 ? -1 : i);
        FILE *f = fopen(tmp, "w");
        if (f == NULL)
            return 3;
        fprintf(f, "version=%d total=%d check=%d i=%d\n", version(), total,
                i % 4 == 0 ? c : check(-1), i);
        fclose(f);
        rename(tmp, argv[1]);
        nanosleep(&ts, NULL);
    }
}
"""

FIX = {"prog.c": [("int version(void) { return 1; }", "int version(void) { return 2; }"),
                  ("return i % 7; }", "return i % 7 + 1000; }"),
                  ("return -1000;", "return -2000;")]}


def fields(text):
    return {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", text)}


@pytest.mark.parametrize("cc,opt", [("gcc", "-O2"), ("gcc", "-O0"), ("clang-14", "-O2"),
                                    ("clang-14", "-O0")])
def test_loop_program(tmp_path, cc, opt):
    need(("git", "diff", cc))
    p = Project(tmp_path / "proj", {"prog.c": PROG_C, ".gitignore": "*.o\nprog\n"}, cc=cc)
    flags = [opt, "-g", "-Wall", "-Wextra", "-Werror"]
    for cmd in (["--molt-updatable=all"] + flags + ["-c", "prog.c", "-o", "prog.o"],
                ["prog.o", "-o", "prog"]):
        r = run(moltcc_cmd() + cmd, p.root, {"MOLT_CC": cc})
        assert r.rc == 0, r
    syms = run(["readelf", "-sW", "prog"], p.root).out
    if (cc, opt) == ("gcc", "-O2"):
        # the case this variant is for: check's unlikely path is a .cold piece
        assert re.search(r"\bcheck__molt_v0\.cold\b", syms), syms
    prog = FileReporter([p.path("prog")], p.root, str(tmp_path / "report"))
    try:
        before = fields(prog.wait(lambda t: fields(t).get("total", 0) > 20))
        assert before["version"] == 1 and before["check"] == -1000
        d = p.diff_u(FIX)
        r, data, out = p.patch([d])
        ok_patch(r, out)
        assert prog.apply(out).rc == 0
        after = fields(prog.wait(lambda t: fields(t).get("version") == 2))
        later = fields(prog.wait(lambda t: fields(t)["i"] > after["i"] + 2))
        # the static local continued: no restart from 0, and the new weight
        assert after["total"] > before["total"]
        assert later["total"] - after["total"] >= 2 * 1000
        assert later["check"] == -2000
        pid = os.path.basename(out)[:-3]
        want = {("version", None), ("weight", "prog.c"), ("check", None)}
        assert prog.replaced_by(pid) == want, r.err
        assert {(f["name"], f["tu"] if f["static"] else None) for f in data["replaced"]} == want
        if (cc, opt) == ("gcc", "-O2"):
            why = {f["name"]: f["reason"] for f in data["replaced"]}
            assert why["check"] == "code changed in its .cold part", why
    finally:
        prog.stop()
