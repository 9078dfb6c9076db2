"""Pre- and post-update callbacks (molt.h MOLT_PATCH_PRE/POST) end to end:
a patch built from a fix with `--molt-callbacks FILE.c`, applied with
`molt apply` to a running program whose answers show what the callbacks
did; build-time refusals by moltcc and moltstamp (two callbacks of a kind,
a callback outside the code, a callback in the program's source).  The
runtime's own checks of damaged files are in tests/runtime (case
callbacks)."""
import json
import time

import pytest

from harness.proc import Program, mapped, molt
from harness.tree import INCLUDE, bin_path

SERVER_C = r"""
#include <stdio.h>
#include <molt.h>

int cb_state;   /* what the patch's callbacks did */
int cb_mode;    /* what they are to do (set from stdin) */
static volatile int post_runs;   /* a static: the post callback counts here */

MOLT_UPDATABLE int answer(void) { return 1; }

int main(void)
{
    char line[64];
    int m;
    puts("ready");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "mode %d", &m) == 1) {
            __atomic_store_n(&cb_mode, m, __ATOMIC_SEQ_CST);
            printf("mode %d\n", m);
        } else {
            printf("answer=%d state=%d runs=%d\n", answer(),
                   __atomic_load_n(&cb_state, __ATOMIC_SEQ_CST), post_runs);
        }
        fflush(stdout);
    }
    return 0;
}
"""

# The fix: answer() returns 2.
FIXED_C = SERVER_C.replace("int answer(void) { return 1; }", "int answer(void) { return 2; }")

# The fix's callbacks: mode 0 succeeds (pre sets 10, post adds 1), 1 makes
# pre fail, 2 makes pre loop, 4 makes post fail.
CALLBACKS_C = r"""
#include <sched.h>
#include <molt.h>

extern int cb_state, cb_mode;   /* the program's: imported */
MOLT_IMPORT_STATIC(volatile int, post_runs, "server.c");

static int before(void)
{
    int mode = __atomic_load_n(&cb_mode, __ATOMIC_SEQ_CST);
    if (mode == 1)
        return 3;
    while (mode == 2)
        sched_yield();
    __atomic_store_n(&cb_state, 10, __ATOMIC_SEQ_CST);
    return 0;
}
MOLT_PATCH_PRE(before);

static int after(void)
{
    if (__atomic_load_n(&cb_mode, __ATOMIC_SEQ_CST) == 4)
        return 7;
    __atomic_add_fetch(&cb_state, 1, __ATOMIC_SEQ_CST);
    MOLT_REF(post_runs)++;
    return 0;
}
MOLT_PATCH_POST(after);
"""

TWO_PRE_C = r"""
#include <molt.h>
static int first(void) { return 0; }
static int second(void) { return 0; }
MOLT_PATCH_PRE(first);
MOLT_PATCH_PRE(second);
"""

# A callback note written by hand whose target is a variable, not code.
DATA_TARGET_C = r"""
__attribute__((used)) static int data_word = 1;
__asm__(".pushsection .note.molt.callback,\"a\",@note\n"
        ".balign 4\n.long 5\n.long 2f - 1f\n.long 0x4d43\n.asciz \"molt\"\n.balign 4\n"
        "1: .long 1\n.long 0\n.quad data_word - .\n.asciz \"data_word\"\n"
        "2: .balign 4\n.popsection");
"""

HAND_PATCH_C = r"""
#include <molt.h>
MOLT_PATCH("hand", "answer 3");
MOLT_PATCH_FUNCTION(int, answer, (void)) { return 3; }
"""


@pytest.fixture
def server(tool, needs_cli):
    t = tool
    t.write("server.c", SERVER_C)
    t.moltcc("-O2", "-g", "server.c", "-o", "server").ok()
    t.write("v2/server.c", FIXED_C)
    t.write("cb.c", CALLBACKS_C)
    r = t.moltcc("--molt-patch", "--molt-target", "./server", "-o", "fix.so", "v2/server.c",
                 "--molt-callbacks", "cb.c").ok()
    assert "callbacks: pre-update before, post-update after (" in r.err, r
    return t


def ask(p):
    p.send("?")
    return p.expect(r"answer=(\d+) state=(-?\d+)").groups()


def mode(p, m):
    p.send("mode %d" % m)
    p.expect("mode %d" % m)


def status(pid):
    r = molt("status", pid, "--json")
    assert r.rc == 0, r
    return json.loads(r.out)


def test_callbacks_run_around_the_switch(server):
    t = server
    fix = t.path("fix.so")
    with Program([t.path("server")], cwd=t.cwd) as p:
        p.expect("ready")
        p.wait_control()
        assert ask(p) == ("1", "0")

        # pre fails: refused, nothing changed, the patch unloaded
        mode(p, 1)
        r = molt("apply", p.pid, fix)
        assert r.rc == 1, r
        assert "pre-update callback before of patch fix returned 3" in r.err, r
        assert ask(p) == ("1", "0")
        assert not mapped(p.pid, "fix.so")
        assert status(p.pid)["patches"] == []

        # both succeed: pre before the switch, post after it
        mode(p, 0)
        r = molt("apply", p.pid, fix)
        assert r.rc == 0 and "warning" not in r.err, r
        assert ask(p) == ("2", "11")
        p.send("?")
        assert p.expect(r"runs=(\d+)").group(1) == "1"     # the program's static
        s = status(p.pid)
        assert [x["callbacks"] for x in s["patches"]] == ["pre=before post=after"]
        table = molt("status", p.pid).out
        assert "CALLBACKS" in table and "pre=before post=after" in table, table
        log = molt("log", p.pid).out
        assert "pre-update callback before of fix ran: returned 0" in log, log
        assert "post-update callback after of fix ran: returned 0" in log, log
        # rollback runs nothing
        assert molt("rollback", p.pid).rc == 0
        assert ask(p) == ("1", "11")

        # post fails: applied, with a warning
        mode(p, 4)
        r = molt("apply", p.pid, fix)
        assert r.rc == 0, r
        assert "molt: warning: post-update callback after of patch fix returned 7" in r.err, r
        assert ask(p) == ("2", "10")
        assert "post-update callback after of fix failed: returned 7" in molt("log", p.pid).out
        assert molt("rollback", p.pid).rc == 0

        # pre loops: refused within its timeout; the program serves; the
        # patch stays loaded, status says why
        mode(p, 2)
        t0 = time.monotonic()
        r = molt("apply", p.pid, fix, "--callback-timeout", "0.5")
        took = time.monotonic() - t0
        assert r.rc == 1 and "pre-update callback before of patch fix timed out" in r.err, r
        assert took < 30, took
        assert ask(p) == ("1", "10")
        s = status(p.pid)
        kept = [o for o in s["objects"] if o["id"] == "fix"]
        assert [o["kept_loaded"] for o in kept] == ["pre-update callback still running"], s
        assert kept[0]["callbacks"] == "pre=before post=after"
        assert mapped(p.pid, "fix.so")
        assert "pre-update callback before of fix timed out after" in molt("log", p.pid).out
        # the runtime goes on: a rollback request is answered at once
        r = molt("rollback", p.pid)
        assert r.rc == 1 and "nothing to roll back" in r.err, r
        p.kill()


def test_callbacks_refused_at_build(tool, needs_stamp):
    t = tool
    t.write("server.c", SERVER_C)
    t.moltcc("-O2", "-g", "server.c", "-o", "server").ok()
    t.write("v2/server.c", FIXED_C)
    # moltcc: two of a kind, a target that is not code
    t.write("two.c", TWO_PRE_C)
    r = t.moltcc("--molt-patch", "--molt-target", "./server", "-o", "two.so", "v2/server.c",
                 "--molt-callbacks", "two.c")
    assert r.rc == 1 and "declares two pre-update callbacks (first and second)" in r.err, r
    t.write("data.c", DATA_TARGET_C)
    r = t.moltcc("--molt-patch", "--molt-target", "./server", "-o", "data.so", "v2/server.c",
                 "--molt-callbacks", "data.c")
    assert r.rc == 1 and "pre-update callback data_word does not point into the patch's code" \
        in r.err, r
    # a callback in the program's own source is refused: it would be
    # declared again by every later patch of that file
    t.write("v3/server.c", FIXED_C + "static int cb(void) { return 0; }\nMOLT_PATCH_PRE(cb);\n")
    r = t.moltcc("--molt-patch", "--molt-target", "./server", "-o", "v3.so", "v3/server.c")
    assert r.rc == 1 and "belongs in a patch source" in r.err, r
    # moltstamp, where a hand-written patch is made, refuses as the runtime would
    stamp = bin_path("moltstamp")
    for name, extra, want in (("hand_two", TWO_PRE_C.replace("#include <molt.h>\n", ""),
                               "two pre-update callbacks (first and second)"),
                              ("hand_data", DATA_TARGET_C, "points outside the patch's code")):
        t.write(name + ".c", HAND_PATCH_C + extra)
        t.cc("-I" + INCLUDE, "-fPIC", "-shared", "-nostartfiles", "-DMOLT__NO_AUTO_REGISTER",
             name + ".c", "-o", name + ".so").ok()
        r = t.run([stamp, name + ".so", "./server"])
        assert r.rc == 1 and want in r.err, r
    # and stamps a sound one
    t.write("hand_ok.c", HAND_PATCH_C + CALLBACKS_C.replace("#include <molt.h>\n", "")
            .replace("extern int cb_state, cb_mode;", "int cb_state, cb_mode;")
            .replace('MOLT_IMPORT_STATIC(volatile int, post_runs, "server.c");',
                     "static int post_runs_of_mine;")
            .replace("MOLT_REF(post_runs)++;", "post_runs_of_mine++;"))
    t.cc("-I" + INCLUDE, "-fPIC", "-shared", "-nostartfiles", "-DMOLT__NO_AUTO_REGISTER",
         "hand_ok.c", "-o", "hand_ok.so").ok()
    t.run([stamp, "hand_ok.so", "./server"]).ok()
