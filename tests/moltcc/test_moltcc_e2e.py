"""End to end: a multi-file program built with moltcc runs a load loop and is
patched while it runs, from inside (molt_apply) and with `molt apply <pid>`.
Checks that behaviour changes, that the static state the new code sees is
the live one, and that function pointers taken before the patch reach the
new code."""
import os
import re
import time

import pytest

from harness.moltcc import make_env
from harness.proc import Program, sanitizer_reports
from harness.tree import molt_cli

STORE_H = r"""
#include <stddef.h>
typedef int (*op_fn)(int);
void store_init(int b);
int score(int i);
int fib_n(int n);
int format_line(char *buf, size_t n, const char *fmt, ...);
int gnu_mix(int i);
const char *version(void);
int stats(void);
extern int total;
"""

MAIN_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <molt.h>
#include "store.h"

static op_fn ops[2];                    /* pointers taken before any patch */
static atomic_int running = 1;
static atomic_long load_calls;

static void *load(void *arg)            /* a second thread keeps calling */
{
    (void)arg;
    while (atomic_load(&running)) {
        ops[1](atomic_load(&load_calls) & 7);
        atomic_fetch_add(&load_calls, 1);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int rounds = atoi(argv[1]);
    store_init(atoi(argv[2]));
    const char *patch = argc > 3 ? argv[3] : NULL;
    ops[0] = score;
    ops[1] = gnu_mix;
    pthread_t th;
    pthread_create(&th, NULL, load, NULL);
    for (int i = 0; i < rounds; i++) {
        char line[160];
        int s = ops[0](i);
        format_line(line, sizeof line, "tick %d score=%d hits=%d fib=%d gnu=%d ver=%s",
                    i, s, stats(), fib_n(10), gnu_mix(4), version());
        puts(line);
        fflush(stdout);
        if (patch && i == 20) {
            char err[256] = "";
            int rc = molt_apply(patch, MOLT_POLICY_IMMEDIATE, 10000, err, sizeof err);
            printf("apply rc=%d gen=%llu %s\n", rc, (unsigned long long)molt_generation(), err);
            fflush(stdout);
        }
        usleep(2000);
    }
    atomic_store(&running, 0);
    pthread_join(th, NULL);
    printf("done load=%ld\n", (long)atomic_load(&load_calls));
    return 0;
}
"""

STORE_C = r"""
#include <stdarg.h>
#include <stdio.h>
#include <molt.h>
#include "store.h"

static int base;                        /* set at run time */
static int hits;                        /* live state */
int total;

void store_init(int b) { base = b; }

/** DSU_FUNC */
static int bump(void)
{
    static int calls;                   /* function-local static, hoisted */
    return ++calls;
}

MOLT_UPDATABLE int score(int i)
{
    hits++;
    total += i;
    return base + bump();
}

/// DSU_FUNC
static int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

int fib_n(int n) { return fib(n); }

MOLT_UPDATABLE int format_line(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return r;
}

MOLT_UPDATABLE int gnu_mix(int i)
{
    __typeof__(i) t = ({ int q = i % 3; q * 2; });
    return t ?: 1;
}

MOLT_UPDATABLE const char *version(void) { return "v1"; }

MOLT_UPDATABLE int stats(void) { return hits; }
"""

STORE_V2 = (STORE_C
            .replace("return ++calls;", "calls += 10;\n    return calls;")
            .replace("return base + bump();", "return base * 1000 + bump();")
            .replace("fib(n - 1) + fib(n - 2); }", "fib(n - 1) + fib(n - 2) + 1; }")
            .replace("int r = vsnprintf(buf, n, fmt, ap);",
                     "int k = snprintf(buf, n, \"[v2] \");\n    int r = k + vsnprintf(buf + k, n - k, fmt, ap);")
            .replace("return t ?: 1;", "return (t ?: 1) + 100;")
            .replace('return "v1";', 'return "v2";'))

LINE = re.compile(r"^(\[v2\] )?tick (\d+) score=(\d+) hits=(\d+) fib=(\d+) gnu=(\d+) ver=(v\d)$")


@pytest.fixture
def built(tool, needs_stamp):
    t = tool
    t.write("store.h", STORE_H)
    t.write("main.c", MAIN_C)
    t.write("store.c", STORE_C)
    r = t.moltcc("-O2", "-g", "-Wall", "main.c", "store.c", "-o", "server").ok()
    t.write("v2/store.c", STORE_V2)
    t.write("v2/store.h", STORE_H)
    t.moltcc("--molt-patch", "--molt-target", "./server", "-o", "fix1.so", "v2/store.c",
             "-O2", "-g", "--molt-description", "v2 of the store").ok()
    os.chmod(t.path("fix1.so"), 0o755)
    return t


def parse(lines):
    out = []
    for l in lines:
        m = LINE.match(l)
        if m:
            out.append(dict(prefixed=bool(m.group(1)), tick=int(m.group(2)), score=int(m.group(3)),
                            hits=int(m.group(4)), fib=int(m.group(5)), gnu=int(m.group(6)),
                            ver=m.group(7)))
    return out


def check_switch(ticks, base):
    v1 = [t for t in ticks if t["ver"] == "v1"]
    v2 = [t for t in ticks if t["ver"] == "v2"]
    assert v1 and v2, ticks
    assert max(t["tick"] for t in v1) < min(t["tick"] for t in v2)
    for t in v1:
        assert not t["prefixed"] and t["fib"] == 55 and t["gnu"] == 2
        assert t["score"] == base + t["tick"] + 1           # bump() counts calls
    last = v1[-1]
    for t in v2:
        assert t["prefixed"] and t["fib"] == 143 and t["gnu"] == 102
    first = v2[0]
    # live static state: hits and the hoisted `calls` continue from the old
    # code's values (a copy would restart at 0)
    assert first["hits"] > last["hits"]
    calls_before = last["score"] - base
    assert first["score"] - base * 1000 >= calls_before + 10
    # ops[0] (taken before the patch) reached the new score(): *1000
    assert first["score"] > base * 1000
    hits = [t["hits"] for t in ticks]
    assert hits == sorted(hits)


def test_patch_applied_from_inside(built):
    r = built.run(["./server", "40", "7", built.path("fix1.so")], timeout=120).ok()
    lines = r.out.splitlines()
    applied = [l for l in lines if l.startswith("apply ")]
    assert applied and applied[0].startswith("apply rc=0 gen=1"), r.out
    check_switch(parse(lines), 7)
    assert lines[-1].startswith("done load=")


def patch_copies(pid, name):
    """Distinct loaded copies of a patch in a process: molt loads each
    apply from its own sealed memfd, named after the file."""
    inodes = set()
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5].endswith(name):
                inodes.add(fields[4])
    return inodes


def test_patch_applied_with_molt_apply(built, needs_cli):
    t = built
    p = Program(["./server", "4000", "9"], cwd=t.cwd, env=make_env())
    lines = p.out.all               # every line so far, read by a thread
    try:
        p.out.wait(lambda lines: len(lines) >= 30, 20)
        assert len(lines) >= 30, "program did not start: %s" % p.stderr()
        r = t.run([molt_cli(), "apply", str(p.pid), t.path("fix1.so")], timeout=60)
        assert r.rc == 0, r
        assert p.out.wait_line(lambda l: "ver=v2" in l, 20), lines[-5:]
        time.sleep(0.2)
        check_switch(parse(list(lines)), 9)
        assert p.alive()                  # still serving
        # The same patch again is a new object.  The first one's code can no
        # longer run, but the patch is pinned (its version() returns a string
        # literal of the patch, which the program may keep): it stays mapped.
        assert len(patch_copies(p.pid, "fix1.so")) == 1
        r = t.run([molt_cli(), "apply", str(p.pid), t.path("fix1.so")], timeout=60)
        assert r.rc == 0, r
        time.sleep(0.5)
        copies = patch_copies(p.pid, "fix1.so")
        assert len(copies) == 2, copies
        st = t.run([molt_cli(), "status", str(p.pid)], timeout=60)
        assert 'string literal "v2" is returned' in st.out, st      # (the reason)
        assert p.alive()
    finally:
        p.kill()
        err = p.err.join()
    # sanitized build trees: no report before the kill
    assert not sanitizer_reports(err), err


GETTERS = r"""
#include <stdio.h>
#include <molt.h>
struct pt { int x, y; };
static int scale = 1;
#define GETTER(field) int get_##field(const struct pt *p) { return p->field * scale; }
/// DSU_FUNC
GETTER(x)
/// DSU_FUNC
GETTER(y)
int main(int argc, char **argv)
{
    struct pt p = {2, 3};
    scale = argc;                       /* 2: set at run time */
    printf("%d %d\n", get_x(&p), get_y(&p));
    char err[200] = "";
    int rc = molt_apply(argv[1], MOLT_POLICY_IMMEDIATE, 10000, err, sizeof err);
    printf("rc=%d %s\n", rc, err);
    printf("%d %d\n", get_x(&p), get_y(&p));
    return 0;
}
"""


def test_macro_defined_functions_are_patched(tool, needs_stamp):
    tool.write("g.c", GETTERS)
    tool.moltcc("-O2", "g.c", "-o", "g").ok()
    tool.write("v2/g.c", GETTERS.replace("p->field * scale;", "p->field * scale * 100;"))
    tool.moltcc("--molt-patch", "--molt-target", "./g", "-o", "p.so", "v2/g.c").ok()
    out = tool.run(["./g", tool.path("p.so")]).ok().out.splitlines()
    assert out == ["4 6", "rc=0 ", "400 600"]
