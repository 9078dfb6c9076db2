"""gdb and core dumps see patches (issue 12, "Must show"): on a live molt
process with a patch loaded and a thread stopped inside the patched
function, gdb in batch mode names every frame of that thread (the patched
one from the patch's file), `list` at the patched frame shows the patch's
source, and tools/gdb/molt-gdb.py prints the molt state; the same on a
core file written by gcore."""
import os
import re
import shutil

from harness.proc import Program, molt, run
from harness.tree import ROOT, build_sanitize

HELPER = os.path.join(ROOT, "tools", "gdb", "molt-gdb.py")

SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

int step(int i)
{
    usleep(5000);                       /* version 0 */
    return i + 1;
}

static void *worker(void *arg)
{
    int i = 0;
    (void)arg;
    for (;;)
        i = step(i);
    return NULL;
}

int main(void)
{
    pthread_t t;
    char line[64];
    pthread_create(&t, NULL, worker, NULL);
    pthread_setname_np(t, "stepper");
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    while (fgets(line, sizeof line, stdin))
        ;
    return 0;
}
"""
PATCHED = SOURCE.replace("usleep(5000);                       /* version 0 */",
                         "usleep(6000);                       /* the patch */")

# For the worker thread: every frame as "FRAME|function|object|file:line",
# then `list` at the first frame of step that is in the patch.
DUMP = r"""
python
import gdb
def frames_of(t):
    t.switch()
    out, f = [], gdb.newest_frame()
    while f is not None:
        out.append(f)
        f = f.older()
    return out

for t in gdb.selected_inferior().threads():
    # the worker thread (a core file has no thread names)
    if not any(f.name() == "worker" for f in frames_of(t)):
        continue
    t.switch()
    f = gdb.newest_frame()
    patched = None
    while f is not None:
        sal = f.find_sal()
        lib = gdb.solib_name(f.pc()) or "program"
        where = "%s:%d" % (sal.symtab.filename, sal.line) if sal.symtab else "-"
        print("FRAME|%s|%s|%s" % (f.name(), lib, where))
        if f.name() == "step" and lib.endswith("fix.so") and patched is None:
            patched = f
        f = f.older()
    if patched is not None:
        gdb.execute("frame %d" % patched.level(), to_string=True)
        print("LIST-BEGIN")
        gdb.execute("list")
        print("LIST-END")
end
"""


def gdb_batch(tool, args):
    tool.write("dump.gdb", DUMP)
    return run(["gdb", "-nx", "-batch", "-ex", "set debuginfod enabled off"] + args
               + ["-x", tool.path("dump.gdb"), "-x", HELPER, "-ex", "molt-status"],
               cwd=tool.cwd, timeout=120)


def check(out, pid_threads):
    frames = [l.split("|")[1:] for l in out.splitlines() if l.startswith("FRAME|")]
    assert frames, out
    # every frame has a name; the patched step is the patch's, on its line
    assert all(f[0] and f[0] != "None" and "??" not in f[0] for f in frames), frames
    names = [f[0] for f in frames]
    assert "worker" in names, frames
    patched = [f for f in frames if f[0] == "step" and f[1].endswith("fix.so")]
    assert patched, frames
    line = PATCHED.splitlines().index("    usleep(6000);                       /* the patch */") + 1
    assert patched[0][2].endswith("prog.c:%d" % line), patched
    listing = out.split("LIST-BEGIN", 1)[1].split("LIST-END", 1)[0]
    assert "usleep(6000);                       /* the patch */" in listing, listing
    # the helper: generation, the patch, where step's entry goes
    assert re.search(r"^molt generation 1$", out, re.M), out
    assert re.search(r"^patches loaded \(1\)\n  fix  \S*fix\.so", out, re.M), out
    # (dispatch during the switch, a jump into the patch once it is over)
    assert re.search(r"^  step +entry (dispatch|patch) +version patch fix \(\S*fix\.so\)$", out, re.M), out
    assert re.search(r"^  worker \(prog\.c\) +entry direct +version 0$", out, re.M), out
    for tid in pid_threads:
        assert re.search(r"^  %d \(.*\): " % tid, out, re.M), out


def test_gdb_names_patched_frames_live_and_in_a_core(tool):
    assert shutil.which("gdb") and shutil.which("gcore"), "gdb is not installed"
    tool.write("prog.c", SOURCE)
    tool.moltcc("--molt-updatable=all", "-O1", "-g", "-o", "prog", "prog.c").ok()
    tool.write("v2/prog.c", PATCHED)
    tool.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "fix.so", "v2/prog.c").ok()
    # the developer's tree holds the fixed source now (gdb lists it)
    tool.write("prog.c", PATCHED)
    with Program([tool.path("prog")], cwd=tool.cwd) as p:
        pid = int(p.expect(r"^ready (\d+)").group(1))
        molt("apply", pid, tool.path("fix.so"), check=0)
        tids = [int(t) for t in os.listdir("/proc/%d/task" % pid)]
        live = gdb_batch(tool, ["-p", str(pid)])
        assert live.rc == 0, live
        check(live.out, tids)
        if build_sanitize():
            # An AddressSanitizer process reserves terabytes for its
            # allocator that gcore would write out: the core file part runs
            # in the plain build tree (the live part above runs everywhere).
            p.send("still there")
            p.finish(rc=0)
            return
        core = run(["gcore", "-o", tool.path("core"), str(pid)], cwd=tool.cwd, timeout=120)
        assert core.rc == 0, core
        assert p.alive(), "gdb or gcore stopped the program"
        p.send("still there")
        p.finish(rc=0)
    dumped = gdb_batch(tool, [tool.path("prog"), tool.path("core.%d" % pid)])
    assert dumped.rc == 0, dumped
    check(dumped.out, tids)
