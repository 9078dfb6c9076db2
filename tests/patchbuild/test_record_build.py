"""The compile record (tools/moltcc/record.py): a small program with a
project header and a static library, built by make with CC=moltcc, carries
the record of every C file it was built from, through the archive and
through strip; --molt-show-build prints it as compile_commands.json; the
recorded command rebuilds the same object."""
import hashlib
import os
import shutil

import pytest

from fixtools import moltcc, needs_moltcc, run, show_build, write
from harness.moltcc import moltcc_cmd
from harness import tree
from harness.tree import BUILD, ROOT, have_bindings, skip

from moltcc import record

PROJECT = {
    "include/util.h": """#ifndef UTIL_H
#define UTIL_H
#define SCALE 3
int scale(int x);
int offset(int x);
const char *where(void);
#endif
""",
    "lib/util.c": """#include <stdio.h>
#include "util.h"
int scale(int x) { return x * SCALE; }
const char *where(void) { return __FILE__; }
""",
    "lib/more.c": """#include "util.h"
#include "more.h"
int offset(int x) { return x + MORE; }
""",
    "lib/more.h": "#define MORE 5\n",
    "src/main.c": """#include <stdio.h>
#include <string.h>
#include "util.h"
#include "local.h"
int compute(int v) { return offset(scale(v)) + LOCAL; }
int main(void) { printf("%d %s\\n", compute(2), where()); return 0; }
""",
    "src/local.h": "#define LOCAL 1\n",
    "tools/tool.c": """#include <stdio.h>
#include "util.h"
int main(void) { printf("%d\\n", SCALE); return 0; }
""",
    "tools/flags.rsp": "-O1 -DTOOL=1\n",
    # automake's depcomp style (-MD -MP -MF) for the library, -MMD for
    # main.c, nothing for the tool (moltcc adds its own private -MMD)
    "Makefile": """CFLAGS = -O2 -g -Iinclude -I$(CURDIR)/include
all: prog tools/tool
lib/%.o: lib/%.c
\t$(CC) $(CFLAGS) -MT $@ -MD -MP -MF lib/$*.Tpo -c -o $@ $<
src/main.o: src/main.c
\t$(CC) $(CFLAGS) -MMD -c -o $@ $<
lib/libutil.a: lib/util.o lib/more.o
\tar rcs $@ $^
prog: src/main.o lib/libutil.a
\t$(CC) $(CFLAGS) -o $@ src/main.o lib/libutil.a
tools/tool: tools/tool.c
\t$(CC) @tools/flags.rsp -Iinclude -o $@ tools/tool.c
""",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if not have_bindings() or not tree.built("libmolt.so"):
        skip("moltcc needs libclang bindings and libmolt.so in %s" % BUILD)
    for tool in ("make", "objcopy", "strip", "ar"):
        if not shutil.which(tool):
            skip("%s is not installed" % tool)
    d = tmp_path_factory.mktemp("recorded") / "proj"
    write(d, PROJECT)
    cc = " ".join(moltcc_cmd() + ["--molt-updatable=all"])
    run(["make", "CC=" + cc], d)
    return d


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_every_object_carries_its_record(built):
    for obj, src in (("lib/util.o", "lib/util.c"), ("lib/more.o", "lib/more.c"),
                     ("src/main.o", "src/main.c")):
        recs = record.read_records(str(built / obj))
        assert len(recs) == 1, obj
        r = recs[0]
        assert r.file == src and r.directory == str(built) and r.output == obj
        assert r.abspath == str(built / src) and r.sha256 == sha(built / src)
        assert r.compiler == ["cc"] and r.woven and r.updatable == "all"
        # the user's arguments: no --molt-*, nothing moltcc adds
        assert not any(a.startswith("--molt-") for a in r.arguments)
        assert "-I" + os.path.join(ROOT, "include") not in r.arguments
        assert not any(a.startswith(("-iquote", "-fdebug-prefix-map")) for a in r.arguments)
        assert r.arguments[-4:] == ["-c", "-o", obj, src]
    # section flags: not allocated (no memory in the running program)
    out = run(["readelf", "-SW", "src/main.o"], built).stdout
    line = [l for l in out.splitlines() if record.SECTION in l][0]
    assert "PROGBITS" in line and " A " not in line.split("PROGBITS")[1]


def test_deps_are_project_headers_with_hashes(built):
    by = {r.file: r for r in record.read_records(str(built / "prog"))}
    assert set(by) == {"src/main.c", "lib/util.c", "lib/more.c"}
    assert dict(by["src/main.c"].deps) == {str(built / "include/util.h"): sha(built / "include/util.h"),
                                           str(built / "src/local.h"): sha(built / "src/local.h")}
    # -MD (user's) lists system headers: they are left out of the record,
    # and the user's dependency file is the user's, untouched
    assert dict(by["lib/util.c"].deps) == {str(built / "include/util.h"):
                                           sha(built / "include/util.h")}
    assert dict(by["lib/more.c"].deps) == {str(built / "include/util.h"):
                                           sha(built / "include/util.h"),
                                           str(built / "lib/more.h"): sha(built / "lib/more.h")}
    with open(built / "lib/util.Tpo") as f:
        tpo = f.read()
    assert tpo.startswith("lib/util.o: lib/util.c") and "/usr/include/stdio.h" in tpo
    assert "include/util.h:" in tpo              # -MP's phony rule: the user's own options
    with open(built / "src/main.d") as f:
        assert f.read().startswith("src/main.o: src/main.c")


def test_archive_program_and_strip_keep_the_records(built, tmp_path):
    lib = record.read_records(str(built / "lib/libutil.a"))
    assert [r.file for r in lib] == ["lib/util.c", "lib/more.c"]
    prog = record.read_records(str(built / "prog"))
    assert sorted(r.file for r in prog) == ["lib/more.c", "lib/util.c", "src/main.c"]
    for how in ([], ["--strip-unneeded"], ["--strip-all"], ["--strip-debug"]):
        p = tmp_path / ("prog" + "".join(how))
        shutil.copy(built / "prog", p)
        run(["strip"] + how + [str(p)], tmp_path)
        assert [r.data for r in record.read_records(str(p))] == [r.data for r in prog], how
    # the stripped program still runs
    assert run([str(tmp_path / "prog--strip-all")], built).stdout == "12 lib/util.c\n"


def test_link_mode_and_response_files(built):
    (r,) = record.read_records(str(built / "tools/tool"))
    assert r.file == "tools/tool.c" and r.output == "tools/tool"
    # @file expanded, link-only options gone, the compile it was: -c
    assert r.arguments == ["-O1", "-DTOOL=1", "-Iinclude", "-c", "tools/tool.c"]
    assert dict(r.deps) == {str(built / "include/util.h"): sha(built / "include/util.h")}
    assert not r.woven                           # main only: nothing is updatable


def test_show_build_is_compile_commands(built, tmp_path):
    cmds = show_build(built / "prog", tmp_path)
    assert isinstance(cmds, list) and len(cmds) == 3
    for c in cmds:
        assert set(c) >= {"directory", "file", "arguments", "output", "abspath", "sha256", "deps",
                          "compiler", "molt"}
        assert c["arguments"][0] == "cc"               # the compiler first
        assert os.path.isfile(os.path.join(c["directory"], c["file"]))
    main = [c for c in cmds if c["file"] == "src/main.c"][0]
    assert main["arguments"][1:] == record.read_records(str(built / "src/main.o"))[0].arguments
    r = moltcc(["--molt-show-build", str(built / "src/main.c")], tmp_path, check=False)
    assert r.returncode == 1 and "not an ELF file" in r.stderr
    r = moltcc(["--molt-show-build", str(built / "prog"), "-O2"], tmp_path, check=False)
    assert r.returncode == 1 and "takes nothing else" in r.stderr


def test_recorded_command_rebuilds_the_same_object(built, tmp_path):
    """From the recorded directory, moltcc with the recorded selection and
    arguments (output elsewhere) makes the object the build made."""
    for obj in ("src/main.o", "lib/util.o"):
        (r,) = record.read_records(str(built / obj))
        args = list(r.arguments)
        k = args.index("-o")
        again = str(tmp_path / os.path.basename(obj))
        args[k + 1] = again
        args = [a for a in args if a not in ("-MD", "-MMD", "-MP")]
        while "-MF" in args:
            k = args.index("-MF")
            del args[k:k + 2]
        while "-MT" in args:
            k = args.index("-MT")
            del args[k:k + 2]
        run(moltcc_cmd() + ["--molt-updatable=" + r.updatable] + args, r.directory)
        for p in (str(built / obj), again):
            run(["objcopy", "-R", record.SECTION, p, p + ".bare"], tmp_path)
        with open(str(built / obj) + ".bare", "rb") as a, open(again + ".bare", "rb") as b:
            assert a.read() == b.read(), obj


def test_plain_compile_records_and_several_inputs(tmp_path, needs_moltcc):
    write(tmp_path, {"a.c": "int a(void) { return 1; }\n",
                     "b.c": '#include "b.h"\nint b(void) { return B; }\n', "b.h": "#define B 2\n"})
    moltcc(["-c", "a.c", "b.c"], tmp_path)         # no markers: passed through, recorded
    (ra,) = record.read_records(str(tmp_path / "a.o"))
    (rb,) = record.read_records(str(tmp_path / "b.o"))
    assert ra.arguments == ["-c", "a.c"] and rb.arguments == ["-c", "b.c"]
    assert not ra.woven and ra.output == "a.o"
    assert dict(rb.deps) == {str(tmp_path / "b.h"): sha(tmp_path / "b.h")}
    # -S: the record goes into the assembler output, and from there into
    # the object
    moltcc(["-S", "b.c"], tmp_path)
    run(["cc", "-c", "b.s", "-o", "b2.o"], tmp_path)
    assert record.read_records(str(tmp_path / "b2.o"))[0].arguments == ["-S", "b.c"]
    # a shared object linked from sources carries their records
    moltcc(["-shared", "-fPIC", "-O2", "-o", "libab.so", "a.c", "b.c"], tmp_path)
    assert [(r.file, r.arguments) for r in record.read_records(str(tmp_path / "libab.so"))] == \
        [("a.c", ["-fPIC", "-O2", "-c", "a.c"]), ("b.c", ["-fPIC", "-O2", "-c", "b.c"])]
    # the user's -MD file of a passed-through compile is the compiler's own
    inc = "-I" + os.path.join(ROOT, "include")
    moltcc(["-MD", "-MF", "m.d", "-c", "b.c", "-o", "bm.o"], tmp_path)
    run(["cc", inc, "-MD", "-MF", "c.d", "-c", "b.c", "-o", "bm.o"], tmp_path)
    assert (tmp_path / "m.d").read_text() == (tmp_path / "c.d").read_text()
    # LTO objects: the linker plugin keeps only their IR; the link carries
    # their records over
    write(tmp_path, {"m.c": "int a(void);\nint main(void) { return a() - 1; }\n"})
    moltcc(["-O2", "-flto", "-c", "a.c", "-o", "alto.o"], tmp_path)
    moltcc(["-O2", "-flto", "-c", "m.c", "-o", "mlto.o"], tmp_path)
    run(["cc", "-O2", "-flto", "-o", "plain-lto", "alto.o", "mlto.o"], tmp_path)
    assert record.read_records(str(tmp_path / "plain-lto")) == []     # what cc alone does
    moltcc(["-O2", "-flto", "-o", "lto", "alto.o", "mlto.o"], tmp_path)
    assert sorted(r.file for r in record.read_records(str(tmp_path / "lto"))) == ["a.c", "m.c"]
    run(["./lto"], tmp_path)
    # a failed compile writes nothing and adds nothing
    write(tmp_path, {"bad.c": "int broken(void) { return }\n"})
    r = moltcc(["-c", "bad.c"], tmp_path, check=False)
    assert r.returncode != 0 and not os.path.exists(tmp_path / "bad.o")
    assert "error" in r.stderr and "record" not in r.stderr
