"""Sanitizers: a libmolt built with -DMOLT_SANITIZE=address|thread needs every
program and patch linked against it to use the same -fsanitize= flags.
The build-tree launcher passes them (--molt-internal-sanitize, from
tools/moltcc/moltcc.cmake); without a launcher moltcc reads them from the
libmolt it links.  These tests run in every build configuration: the last
one checks whatever this build tree is."""
import os
import subprocess

from harness.elf import Elf
from harness.moltcc import MOLTCC_PY
from harness.proc import sanitizer_reports
from harness.tree import ROOT, SYS_PYTHON, build_sanitize

SAN_GUARDED = """#include <molt.h>
#ifdef __SANITIZE_ADDRESS__
MOLT_UPDATABLE int under_asan(int x) { return x + 1; }
#endif
#ifdef __SANITIZE_THREAD__
MOLT_UPDATABLE int under_tsan(int x) { return x + 2; }
#endif
MOLT_UPDATABLE int always(int x) { return x; }
"""


def direct(tool, sanitize, *args, env=None):
    """moltcc run the way the build-tree launcher runs it."""
    return tool.run([SYS_PYTHON, MOLTCC_PY,
                     "--molt-internal-include=" + os.path.join(ROOT, "include"),
                     "--molt-internal-libdir=" + tool.path("nolib"),
                     "--molt-internal-moltstamp=",
                     "--molt-internal-sanitize=" + sanitize] + list(args), env=env)


def predefined(tool, result):
    return {l.split()[1] for l in result.out.splitlines() if l.startswith("#define ")}


def test_launcher_flags_reach_every_compile(tool):
    tool.write("g.c", SAN_GUARDED)
    r = direct(tool, "address,undefined", "-O2", "-c", "g.c", "-o", "g.o",
               env={"MOLT_VERBOSE": "1"}).ok()
    # (the compiler's runs: objcopy adds the compile record afterwards)
    runs = [l for l in r.err.splitlines() if ": run: cc " in l]
    assert runs and all("-fsanitize=address,undefined" in l for l in runs), r.err
    assert all("-fno-sanitize-recover=undefined" in l for l in runs), r.err
    # libclang saw gcc's __SANITIZE_ADDRESS__: the guarded function is updatable
    names = sorted(d["name"] for d in Elf(tool.path("g.o")).descriptors())
    assert names == ["always", "under_asan"]
    # the object is instrumented
    nm = tool.run(["nm", "-u", "g.o"]).ok().out
    assert "__asan_" in nm or "__ubsan_" in nm, nm

    r = direct(tool, "thread", "-c", "g.c", "-o", "t.o").ok()
    names = sorted(d["name"] for d in Elf(tool.path("t.o")).descriptors())
    assert names == ["always", "under_tsan"]
    assert "__tsan_" in tool.run(["nm", "-u", "t.o"]).ok().out

    # an empty list: no sanitizer, nothing added
    r = direct(tool, "", "-c", "g.c", "-o", "n.o", env={"MOLT_VERBOSE": "1"}).ok()
    assert "-fsanitize" not in r.err
    assert [d["name"] for d in Elf(tool.path("n.o")).descriptors()] == ["always"]


def test_preprocessing_sees_the_same_macros(tool):
    tool.write("e.c", "int x;\n")
    r = direct(tool, "address,undefined", "-E", "-dM", "e.c").ok()
    assert "__SANITIZE_ADDRESS__" in predefined(tool, r)
    r = direct(tool, "", "-E", "-dM", "e.c").ok()
    assert "__SANITIZE_ADDRESS__" not in predefined(tool, r)


def test_unknown_sanitizer_is_refused(tool):
    tool.write("e.c", "int x;\n")
    r = direct(tool, "adress", "-c", "e.c")
    assert r.rc == 1 and "unknown sanitizer adress" in r.err, r


def _fake_prefix(tool, name, flags):
    """A molt "installation" whose libmolt is linked with `flags`."""
    pfx = tool.path(name)
    os.makedirs(os.path.join(pfx, "lib"))
    os.makedirs(os.path.join(pfx, "include"))
    os.symlink(os.path.join(ROOT, "include", "molt.h"), os.path.join(pfx, "include", "molt.h"))
    tool.write(name + "/empty.c", "int molt__fake;\n")
    tool.cc("-shared", "-fPIC", *flags, tool.path(name + "/empty.c"),
            "-o", os.path.join(pfx, "lib", "libmolt.so")).ok()
    return pfx


def test_sanitizers_detected_from_libmolt(tool):
    # MOLT_PREFIX (and the installed launcher) pass no list: moltcc reads it
    # from the libmolt's DT_NEEDED sanitizer runtimes
    tool.write("e.c", "int x;\n")
    cases = [("tsan", ["-fsanitize=thread"], "__SANITIZE_THREAD__"),
             ("asan", ["-fsanitize=address,undefined"], "__SANITIZE_ADDRESS__"),
             ("plain", [], None)]
    for name, flags, macro in cases:
        pfx = _fake_prefix(tool, name, flags)
        r = tool.run([SYS_PYTHON, MOLTCC_PY, "-E", "-dM", "e.c"], env={"MOLT_PREFIX": pfx}).ok()
        defs = predefined(tool, r)
        for m in ("__SANITIZE_THREAD__", "__SANITIZE_ADDRESS__"):
            assert (m in defs) == (m == macro), (name, m)


PROG = r"""
#include <stdio.h>
#include <molt.h>
MOLT_UPDATABLE const char *greet(void) { return "v1"; }
int main(int argc, char **argv)
{
    printf("%s\n", greet());
    char err[256] = "";
    int rc = molt_apply(argv[1], MOLT_POLICY_IMMEDIATE, 10000, err, sizeof err);
    printf("rc=%d %s\n", rc, err);
    printf("%s\n", greet());
    return 0;
}
"""

RUNTIMES = {"": set(), "address": {"libasan", "libubsan"}, "thread": {"libtsan"}}


def _san_needed(path):
    out = subprocess.run(["readelf", "-dW", path], capture_output=True, text=True).stdout
    libs = set()
    for lib in ("libasan", "libubsan", "libtsan"):
        if "[%s." % lib in out:
            libs.add(lib)
    return libs


def test_program_and_patch_match_this_build_tree(tool, needs_stamp):
    # plain build: no sanitizer runtime anywhere; sanitized build: the
    # program and the patch need the same runtimes as libmolt, and run clean
    want = RUNTIMES[build_sanitize()]
    tool.write("p.c", PROG)
    tool.moltcc("-O2", "-g", "p.c", "-o", "p").ok()
    tool.write("v2/p.c", PROG.replace('"v1"', '"v2"'))
    tool.moltcc("--molt-patch", "--molt-target", "./p", "-o", "p.so", "v2/p.c").ok()
    assert _san_needed(tool.path("p")) == want
    assert _san_needed(tool.path("p.so")) == want
    r = tool.run(["./p", tool.path("p.so")]).ok()
    assert r.out.splitlines() == ["v1", "rc=0 ", "v2"], r
    assert not sanitizer_reports(r.err), r.err
