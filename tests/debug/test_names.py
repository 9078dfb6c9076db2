"""Names as the user wrote them (issue 12, "Must show"): a program with its
own SIGSEGV handler that prints backtrace_symbols_fd, and an assert in an
updatable function.  Built plain with the compiler and with moltcc (every
function updatable), it names the same functions in the same order, before
a patch and after one that replaces the crashing and the asserting
function; __func__, __FUNCTION__ and __PRETTY_FUNCTION__ are the source
name in version 0 and in the patch; addr2line names an address of the
patched code by the function and its source line."""
import os
import re
import subprocess

from harness.proc import Program, molt, run
from harness.tree import san_flags

SOURCE = r"""
#define _GNU_SOURCE
#include <assert.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void on_segv(int sig)
{
    void *frames[64];
    int n = backtrace(frames, 64);
    (void)sig;
    write(1, "backtrace:\n", 11);
    backtrace_symbols_fd(frames, n, 1);
    write(1, "end\n", 4);
    _exit(3);
}

void crash_here(int *where)
{
    printf("in %s %s %s\n", __func__, __FUNCTION__, __PRETTY_FUNCTION__);
    fflush(stdout);
    *where = 1;                         /* version 0 */
}

void check(int v)
{
    assert(v < 10);                     /* version 0 */
}

void handle(const char *cmd)
{
    if (strncmp(cmd, "segv", 4) == 0)
        crash_here((int *)(volatile long)atol(cmd + 4)); /* "segv8": not NULL, for UBSan */
    else if (strncmp(cmd, "assert", 6) == 0)
        check(atoi(cmd + 6));
    printf("done %s", cmd);
    fflush(stdout);
}

int main(void)
{
    char line[128];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv;
    sigaction(SIGSEGV, &sa, NULL);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    while (fgets(line, sizeof line, stdin))
        handle(line);
    return 0;
}
"""

PATCHED = SOURCE.replace("*where = 1;                         /* version 0 */",
                         "*where = 2;                         /* the patch */") \
                .replace("assert(v < 10);                     /* version 0 */",
                         "assert(v < 10 && v != 7);           /* the patch */")

FLAGS = ["-O0", "-g", "-rdynamic"]
# ASan would take SIGSEGV itself (the program's handler is what is shown)
ENV = dict(os.environ, ASAN_OPTIONS="handle_segv=0:detect_leaks=0")
FRAME = re.compile(r"^(\S+)\((\w*)(?:@\w+)?[+-]0x[0-9a-f]+\)\s*\[0x[0-9a-f]+\]$")


def frames(lines, modules):
    """The function names of the backtrace's frames in the given modules
    (program, patch), a repeated name once: a patched function's dispatch
    path and its new version are two frames of one function."""
    out = []
    inside = False
    for line in lines:
        if line == "backtrace:":
            inside = True
            continue
        if line == "end":
            break
        if not inside:
            continue
        m = FRAME.match(line)
        assert m or "libc" in line or "ld-linux" in line or "linux-vdso" in line, line
        if m and os.path.basename(m.group(1)) in modules:
            name = m.group(2) or "?"
            if not out or out[-1] != name:
                out.append(name)
    return out


def session(tool, prog, command, patch=None, rc=None):
    """Runs prog, applies patch (with the CLI) if any, sends one command;
    returns (stdout lines, stderr)."""
    with Program([tool.path(prog)], cwd=tool.cwd, env=ENV) as p:
        m = p.expect(r"^ready (\d+)")
        if patch:
            r = molt("apply", m.group(1), tool.path(patch))
            assert r.rc == 0, (r.out, r.err)
        p.send(command)
        got = p.finish(rc=None, timeout=20)
        out = p.out.join().splitlines()     # every line, up to the end of the pipe
        if rc is not None:
            assert got == rc, (got, out, p.stderr())
        return out, p.err.join()


def build(tool):
    tool.write("prog.c", SOURCE)
    tool.run(["cc"] + FLAGS + san_flags() + ["-o", "plain", "prog.c"]).ok()
    tool.moltcc("--molt-updatable=all", *FLAGS, "-o", "prog", "prog.c").ok()
    tool.write("v2/prog.c", PATCHED)
    tool.moltcc("--molt-patch", "--molt-target", "./prog", "-o", "fix.so", "v2/prog.c").ok()


def test_backtrace_symbols_and_assert_name_functions_as_the_plain_build(tool):
    build(tool)
    mods = {"plain", "prog", "fix.so"}
    plain, _ = session(tool, "plain", "segv8", rc=3)
    want = frames(plain, mods)
    # (the static handler is not in the dynamic symbol table: "?" in both)
    assert want[:4] == ["?", "crash_here", "handle", "main"], plain
    v0, _ = session(tool, "prog", "segv8", rc=3)
    assert frames(v0, mods) == want, (v0, plain)
    patched, _ = session(tool, "prog", "segv8", patch="fix.so", rc=3)
    assert frames(patched, mods) == want, (patched, plain)
    # the patched frame is the patch's: its file names which patch it is
    assert any(re.search(r"fix\.so\(crash_here\+0x", l) for l in patched), patched
    for out in (v0, patched):
        assert "in crash_here crash_here crash_here" in out, out

    # assert messages: "prog: prog.c:44: check: Assertion `v < 10' failed."
    def message(err):
        m = re.search(r"(\S+: \d+: \w+: Assertion .*failed\.)", err.replace("prog.c:", "prog.c: "))
        assert m, err
        return m.group(1)
    _, err_plain = session(tool, "plain", "assert20", rc=-6)
    _, err_v0 = session(tool, "prog", "assert20", rc=-6)
    _, err_patched = session(tool, "prog", "assert7", patch="fix.so", rc=-6)
    assert message(err_v0) == message(err_plain), (err_v0, err_plain)
    assert ": check: Assertion `v < 10 && v != 7' failed." in message(err_patched), err_patched


def test_addr2line_names_patched_code_by_source_name_and_line(tool):
    build(tool)
    nm = run(["nm", tool.path("fix.so")]).ok().out
    addr = [l.split()[0] for l in nm.splitlines() if l.split()[1:] == ["t", "crash_here"]]
    assert addr, nm
    # an address inside the new version: its store, on the patched line
    lines = run(["objdump", "-d", "-l", "--no-show-raw-insn", tool.path("fix.so")]).ok().out
    out = run(["addr2line", "-f", "-e", tool.path("fix.so"), "0x" + addr[0]]).ok().out.split()
    assert out[0] == "crash_here", out
    assert re.search(r"prog\.c:\d+$", out[1]), out
    src_line = int(out[1].rsplit(":", 1)[1])
    # the store of the patched statement: addr2line maps it to that line
    store = PATCHED.splitlines().index(
        "    *where = 2;                         /* the patch */") + 1
    assert re.search(r"prog\.c:%d\b" % store, lines), lines
    assert src_line <= store
    v0 = [l.split()[0] for l in run(["nm", tool.path("prog")]).ok().out.splitlines()
          if l.endswith(" t crash_here__molt_v0")]
    assert v0
    out = run(["addr2line", "-f", "-e", tool.path("prog"), "0x" + v0[0]]).ok().out.split()
    assert out[0] == "crash_here", out
