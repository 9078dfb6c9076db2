"""Lifetimes (moltcc.patch.lifetime): which pointers into a patch may outlive
it.  One source read by libclang, as the patch builder reads the shipped
functions of a TU: every harmless use (system calls that do not keep
pointers, a same-file function that only reads its parameter, comparisons,
subscripts, sizeof, a local array's initializer) is left out; every use
that may keep the pointer is a reason with file:line; patch functions used
as values are listed."""
import pytest

from fixtools import write
from harness.tree import have_bindings, skip

SOURCE = r"""#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cfg { const char *name; int (*cb)(const void *, const void *); };
struct cfg live;                       /* the program's */
const char *last;                      /* the program's */
void keep(const char *s);              /* elsewhere in the program */

static char scratch[32];               /* new in the patch */
static int counter;                    /* new in the patch */

static int by_value(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
static void *worker(void *arg) { return arg; }

static int reads_only(const char *s) { return (int)strlen(s) + (s[0] == 'x'); }
static void stores(const char *s) { last = s; }
static void forwards(const char *s) { stores(s); }

int shipped(int *v, size_t n)
{
    char local[] = "copied";
    pthread_t t;
    printf("%s %zu\n", "printed", sizeof "sized");
    if (strcmp(local, "compared") == 0 || last == "ptr-compared")
        return 1;
    qsort(v, n, sizeof *v, by_value);
    reads_only("read");
    forwards("forwarded");
    keep("kept");
    live.name = "stored";
    live.cb = by_value;
    pthread_create(&t, NULL, worker, NULL);
    last = scratch;
    last = (const char *)&counter;
    return "abc"[1] + scratch[0];
}

const char *version(void) { return counter ? "v2" : "v1"; }

void locals(int k)
{
    const char *msg = "printed later";
    const char *kept = "kept later";
    const char *p;
    p = k ? "chosen" : "other";
    printf("%s %s\n", msg, p);
    last = kept;
}
"""


@pytest.fixture
def escapes(tmp_path):
    if not have_bindings():
        skip("/usr/bin/python3 has no libclang bindings (apt-get install python3-clang-14)")
    from moltcc.unit import Unit
    from moltcc.patch.lifetime import find_escapes
    write(tmp_path, {"t.c": SOURCE})
    u = Unit(str(tmp_path / "t.c"), "src/t.c", ["-x", "c"])
    fns = {f.name: f for f in u.functions()}
    patch_fns = {"by_value", "worker", "reads_only", "stores", "forwards"}
    return lambda *names: find_escapes(u, [fns[n] for n in names],
                                       lambda c: c.spelling in patch_fns,
                                       lambda v: v.spelling in ("scratch", "counter"))


def line_of(text):
    return SOURCE[:SOURCE.index(text)].count("\n") + 1


def test_reasons(escapes):
    e = escapes("shipped")
    got = [str(x) for x in e.pinned]
    assert got == [
        "src/t.c:%d: string literal \"forwarded\" is passed to 'forwards' (in 'shipped')"
        % line_of('forwards("forwarded")'),
        "src/t.c:%d: string literal \"kept\" is passed to 'keep' (in 'shipped')"
        % line_of('keep("kept")'),
        "src/t.c:%d: string literal \"stored\" is stored by '=' (in 'shipped')"
        % line_of('live.name = "stored"'),
        "src/t.c:%d: patch function 'by_value' is stored by '=' (in 'shipped')"
        % line_of("live.cb = by_value"),
        "src/t.c:%d: patch function 'worker' is passed to 'pthread_create', which keeps it "
        "(in 'shipped')" % line_of("pthread_create("),
        "src/t.c:%d: the patch's array 'scratch' is stored by '=' (in 'shipped')"
        % line_of("last = scratch"),
        "src/t.c:%d: the address of the patch's object 'counter' is stored by '=' (in 'shipped')"
        % line_of("last = (const char *)&counter"),
    ]
    # harmless: printf, sizeof, a local array, strcmp, ==, the same file's
    # reads_only, a subscript -- none of them is a reason
    for text in ("printed", "sized", "copied", "compared", "ptr-compared", '"read"', '"abc"'):
        assert not any(text in g for g in got), text


def test_address_taken(escapes):
    e = escapes("shipped")
    assert [(x.where[1], x.what) for x in e.address_taken] == [
        (line_of("qsort("), "patch function 'by_value'"),
        (line_of("live.cb = by_value"), "patch function 'by_value'"),
        (line_of("pthread_create("), "patch function 'worker'")]
    # qsort keeps nothing: listed as taken, not a reason to stay loaded
    assert not any(x.where[1] == line_of("qsort(") for x in e.pinned)


def test_returned_literal(escapes):
    e = escapes("version")
    assert [str(x) for x in e.pinned] == [
        "src/t.c:%d: string literal \"v2\" is returned (in 'version')" % line_of('"v2"'),
        "src/t.c:%d: string literal \"v1\" is returned (in 'version')" % line_of('"v2"')]
    assert e.reasons == [str(x) for x in e.pinned]


def test_locals_are_followed(escapes):
    # a literal put into a local pointer counts by what the local is used for
    e = escapes("locals")
    assert [str(x) for x in e.pinned] == [
        "src/t.c:%d: string literal \"kept later\" initializes 'kept' (in 'locals')"
        % line_of('"kept later"')]
