"""moltcc as a drop-in compiler: pass-through, several sources, -MD files,
diagnostics, build systems."""
import os
import re
import shutil
import subprocess

import pytest

from harness.elf import Elf
from harness.moltcc import make_env, moltcc_cmd
from harness.tree import BUILD, ROOT, san_flags, skip

PLAIN = """#include <stdio.h>
int twice(int x) { return 2 * x; }
"""

MARKED = """#include <molt.h>
MOLT_UPDATABLE int twice(int x) { return 2 * x; }
"""


# -- pass-through ---------------------------------------------------------------

def test_version_and_probes_pass_through(tool):
    for args in (["--version"], ["-dumpversion"], ["-dumpmachine"], ["-print-prog-name=ld"],
                 ["-print-search-dirs"], ["-v"]):
        m = tool.moltcc(*args)
        c = tool.cc(*args)
        assert m.rc == c.rc == 0, (m, c)
        assert m.out == c.out, args
        if args != ["-v"]:
            assert m.err == c.err, args


def test_molt_options_are_stripped_and_unknown_ones_refused(tool):
    # --molt-* never reaches the compiler (it would reject them)
    tool.moltcc("--molt-keep", "--version").ok()
    r = tool.moltcc("--molt-frobnicate", "--version")
    assert r.rc == 1
    assert r.err.startswith("moltcc: error: unknown option --molt-frobnicate")
    assert len(r.err.strip().splitlines()) == 1


def test_preprocess_is_untouched(tool):
    tool.write("m.c", MARKED + "#define X 42\nint y = X;\n")
    m = tool.moltcc("-E", "-P", "-I" + os.path.join(ROOT, "include"), "m.c").ok()
    c = tool.cc("-E", "-P", "-I" + os.path.join(ROOT, "include"), "m.c").ok()
    assert m.out == c.out
    assert "twice__molt_v0" not in m.out
    # -M / -MM: dependency listing only
    m = tool.moltcc("-MM", "m.c", "-I" + os.path.join(ROOT, "include")).ok()
    c = tool.cc("-MM", "m.c", "-I" + os.path.join(ROOT, "include")).ok()
    assert m.out == c.out and m.out.startswith("m.o: m.c")


def test_stdin_preprocess_probe(tool):
    # what configure scripts do
    r = tool.moltcc("-E", "-", input="#ifdef __GNUC__\ngnu\n#endif\n").ok()
    assert "gnu" in r.out


def test_assembler_and_objects_pass_through(tool, needs_lib):
    tool.write("a.S", ".globl answer\n.text\nanswer:\n  movl $42, %eax\n  ret\n")
    tool.write("main.c", "int answer(void);\nint main(void) { return answer() == 42 ? 0 : 1; }\n")
    tool.moltcc("-c", "a.S", "-o", "a.o").ok()
    tool.moltcc("-c", "main.c", "-o", "main.o").ok()
    tool.run(["ar", "rcs", "liba.a", "a.o"]).ok()
    tool.moltcc("main.o", "liba.a", "-o", "prog").ok()
    tool.run(["./prog"]).ok()


def test_unmarked_file_compiles_exactly_like_cc(tool):
    # (plus the sanitizer flags of a sanitized build tree, and the compile
    # record, which is all that objcopy -R takes away again)
    tool.write("p.c", PLAIN)
    tool.moltcc("-O2", "-c", "p.c", "-o", "m.o").ok()
    tool.cc("-O2", "-c", "p.c", "-o", "c.o", "-I" + os.path.join(ROOT, "include"),
            *san_flags()).ok()
    assert Elf(tool.path("m.o")).section(".molt.build") is not None
    assert Elf(tool.path("c.o")).section(".molt.build") is None
    tool.run(["objcopy", "-R", ".molt.build", "m.o"]).ok()
    with open(tool.path("m.o"), "rb") as a, open(tool.path("c.o"), "rb") as b:
        assert a.read() == b.read()


# -- several sources, outputs --------------------------------------------------

def test_several_sources_per_call(tool):
    tool.write("a.c", MARKED)
    tool.write("b.c", PLAIN.replace("twice", "thrice"))
    tool.write("sub/c.c", '#include "c.h"\n#include <molt.h>\n/// DSU_FUNC\nint quad(int x) { return C * x; }\n')
    tool.write("sub/c.h", "#define C 4\n")
    tool.moltcc("-c", "a.c", "b.c", "sub/c.c").ok()
    for o in ("a.o", "b.o", "c.o"):
        assert os.path.exists(tool.path(o))
    assert Elf(tool.path("a.o")).section("molt_fns") is not None
    assert Elf(tool.path("b.o")).section("molt_fns") is None
    assert Elf(tool.path("c.o")).section("molt_fns") is not None


def test_compile_and_link_in_one_call(tool, needs_lib):
    tool.write("a.c", MARKED)
    tool.write("main.c", '#include <stdio.h>\nint twice(int);\nint main(void) { printf("%d\\n", twice(21)); return 0; }\n')
    tool.moltcc("-O2", "a.c", "main.c", "-o", "prog").ok()
    r = tool.run(["./prog"]).ok()
    assert r.out == "42\n"
    names = [d["name"] for d in Elf(tool.path("prog")).descriptors()]
    assert names == ["twice"]


def test_output_basename_and_tu_name_are_the_users(tool):
    tool.write("src/handler.c", MARKED)
    tool.moltcc("-c", "src/handler.c").ok()
    e = Elf(tool.path("handler.o"))
    files = {s.file for s in e.symbols() if s.file}
    assert files == {"handler.c"}


# -- dependency files ------------------------------------------------------------------

@pytest.mark.parametrize("flags,dep", [
    (["-MD"], "x.d"),
    (["-MMD", "-MP"], "x.d"),
    (["-MD", "-MF", "deps/x.dep", "-MT", "custom-target"], "deps/x.dep"),
])
def test_md_names_the_users_file(tool, flags, dep):
    tool.write("src/x.c", '#include "local.h"\n' + MARKED)
    tool.write("src/local.h", "#define LOCAL 1\n")
    os.makedirs(tool.path("deps"), exist_ok=True)
    tool.moltcc(*flags, "-c", "src/x.c", "-o", "x.o").ok()
    with open(tool.path(dep)) as f:
        text = f.read()
    assert "src/x.c" in text
    # No path into moltcc's private build directory (under $TMPDIR); the
    # test's own directory and the molt tree itself may well be under /tmp.
    rest = text.replace(tool.cwd, "").replace(ROOT, "")
    assert "moltcc-" not in rest and "/tmp/" not in rest
    assert "src/local.h" in text
    if "-MT" in flags:
        assert text.startswith("custom-target:")
    else:
        assert text.startswith("x.o:")


def test_md_without_output_name(tool):
    tool.write("y.c", MARKED)
    tool.moltcc("-MMD", "-c", "y.c").ok()
    with open(tool.path("y.d")) as f:
        text = f.read()
    assert text.split(":")[0] == "y.o" and " y.c" in text and "moltcc-" not in text


# -- diagnostics ------------------------------------------------------------------------

def test_warning_points_at_user_source(tool):
    src = """#include <molt.h>
#include <stdio.h>

static int helper(int a) { return a; }

/** DSU_FUNC */
static int compute(int a, int b)
{
    int unused_here;
    return helper(a) + b;
}

int main(void) { printf("%d\\n", compute(1, 2)); return 0; }
"""
    tool.write("w.c", src)
    r = tool.moltcc("-Wall", "-c", "w.c").ok()
    m = re.search(r"^w\.c:(\d+):(\d+): warning: unused variable .unused_here.", r.err, re.M)
    assert m, r
    assert (int(m.group(1)), int(m.group(2))) == (9, 9)
    # the caret line is the user's source line
    assert "    int unused_here;" in r.err
    assert "moltcc-" not in r.err


def test_error_in_user_code_reports_user_lines(tool):
    tool.write("e.c", "#include <molt.h>\nMOLT_UPDATABLE int f(int a)\n{\n  return a +;\n}\n")
    r = tool.moltcc("-c", "e.c")
    assert r.rc != 0
    assert re.search(r"^e\.c:4:\d+: error:", r.err, re.M), r
    assert "moltcc-" not in r.err


def test_debug_info_names_the_users_file(tool):
    tool.write("src/dbg.c", MARKED)
    tool.moltcc("-g", "-c", "src/dbg.c", "-o", "dbg.o").ok()
    r = tool.run(["readelf", "--debug-dump=info", "dbg.o"]).ok()
    names = re.findall(r"DW_AT_name\s*:.*?:\s*(\S+dbg\.c)\s*$", r.out, re.M)
    assert names and all("moltcc-" not in n for n in names), names
    r = tool.run(["readelf", "--debug-dump=line", "dbg.o"]).ok()
    assert "moltcc-" not in r.out


# -- keep / verbose --------------------------------------------------------------------------

def test_keep_and_verbose(tool):
    tool.write("k.c", MARKED)
    r = tool.moltcc("--molt-keep", "-c", "k.c", env={"MOLT_VERBOSE": "1"}).ok()
    m = re.search(r"moltcc: generated sources kept in (\S+)", r.err)
    assert m, r
    kept = m.group(1)
    gen = [os.path.join(dp, f) for dp, _, fs in os.walk(kept) for f in fs if f.endswith(".c")]
    assert [os.path.basename(g) for g in gen] == ["k.c"]
    with open(gen[0]) as f:
        text = f.read()
    assert "twice__molt_v0" in text and '#line 2 "k.c"' in text
    assert "moltcc: run: " in r.err
    shutil.rmtree(kept)
    # without --molt-keep nothing is left behind
    r = tool.moltcc("-c", "k.c", env={"TMPDIR": tool.cwd}).ok()
    assert not [d for d in os.listdir(tool.cwd) if d.startswith("moltcc-")]


# -- build systems -------------------------------------------------------------------------------

def test_make_cc_moltcc(tool, needs_lib):
    tool.write("a.c", MARKED)
    tool.write("main.c", '#include <stdio.h>\nint twice(int);\nint main(void) { printf("%d\\n", twice(4)); return 0; }\n')
    tool.write("Makefile", "prog: a.o main.o\n\t$(CC) -o $@ $^\n%.o: %.c\n\t$(CC) $(CFLAGS) -MMD -c $< -o $@\n-include *.d\n")
    cc = " ".join(moltcc_cmd())
    r = tool.run(["make", "CC=" + cc, "CFLAGS=-O2 -Wall"])
    assert r.rc == 0, r
    assert tool.run(["./prog"]).ok().out == "8\n"
    # the dependency files keep make happy on a second run
    r = tool.run(["make", "CC=" + cc, "CFLAGS=-O2 -Wall"]).ok()
    assert "up to date" in r.out or "Nothing to be done" in r.out


def test_cmake_c_compiler_moltcc(tool, needs_lib):
    if shutil.which("cmake") is None:
        skip("cmake missing")
    launcher = os.path.join(BUILD, "bin", "moltcc")
    if not os.path.exists(launcher):
        skip("no build-tree launcher (tools/moltcc/moltcc.cmake not included)")
    tool.write("proj/CMakeLists.txt",
               "cmake_minimum_required(VERSION 3.16)\nproject(t C)\n"
               "add_executable(prog a.c main.c)\n")
    tool.write("proj/a.c", MARKED)
    tool.write("proj/main.c", '#include <stdio.h>\nint twice(int);\nint main(void) { printf("%d\\n", twice(5)); return 0; }\n')
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    tool.run(["cmake", "-S", "proj", "-B", "b", "-DCMAKE_C_COMPILER=" + launcher] + gen).ok()
    tool.run(["cmake", "--build", "b"]).ok()
    assert tool.run(["b/prog"]).ok().out == "10\n"
    assert [d["name"] for d in Elf(tool.path("b/prog")).descriptors()] == ["twice"]


def test_language_option(tool):
    # -x c makes any file a C source (and -x none ends it)
    tool.write("unit.txt", MARKED)
    tool.moltcc("-c", "-x", "c", "unit.txt", "-x", "none", "-o", "unit.o").ok()
    assert [d["name"] for d in Elf(tool.path("unit.o")).descriptors()] == ["twice"]


def test_dash_o_with_several_compiled_files_is_gccs_error(tool):
    tool.write("a.c", MARKED)
    tool.write("b.c", PLAIN)
    r = tool.moltcc("-c", "a.c", "b.c", "-o", "x.o")
    c = tool.cc("-c", "a.c", "b.c", "-o", "y.o", "-I" + os.path.join(ROOT, "include"))
    assert r.rc != 0 and c.rc != 0
    assert "cannot specify" in r.err


def test_failed_generated_compile_leaves_no_object(tool, monkeypatch):
    # If the generated source ever failed to compile while the user's source
    # compiles, moltcc must fail loudly and leave no (non-updatable) object.
    tool.write("ok.c", MARKED)
    wrapper = tool.write("fakecc.sh", "#!/bin/sh\nfor a in \"$@\"; do case $a in */moltcc-*/*.c) "
                                      "echo 'injected failure' >&2; exit 1;; esac; done\nexec cc \"$@\"\n")
    os.chmod(wrapper, 0o755)
    r = tool.moltcc("-c", "ok.c", "-o", "ok.o", env={"MOLT_CC": wrapper})
    assert r.rc == 1
    assert "moltcc: error: internal error: the generated source of ok.c does not compile" in r.err
    assert not os.path.exists(tool.path("ok.o"))
    kept = re.search(r"kept in (\S+)\)", r.err).group(1)
    shutil.rmtree(kept)


def test_lto_is_dropped_for_woven_files(tool, needs_lib):
    tool.write("l.c", MARKED + "int main(void) { return twice(0); }\n")
    tool.write("p.c", "int plain_one(void) { return 0; }\n")
    r = tool.moltcc("-O2", "-flto", "l.c", "p.c", "-o", "prog").ok()
    assert "moltcc: warning: l.c: -flto is not used for files with updatable functions" in r.err
    e = Elf(tool.path("prog"))
    assert e.symbol("twice__molt_v0", file="l.c") is not None
    tool.run(["./prog"]).ok()


def test_moltcc_flags_are_appended_to_every_compile(tool, needs_lib):
    # MOLTCC_FLAGS comes last: it defines what the source needs and turns
    # off the -Werror of the command line; woven and plain files alike
    src = """#include <molt.h>
static int unused_here;
MOLT_UPDATABLE int f(void) { return FROM_ENV; }
int main(void) { return f() == 7 ? 0 : 1; }
"""
    tool.write("m.c", src)
    tool.write("p.c", "int g(void);\nint g(void) { return FROM_ENV; }\n")
    r = tool.moltcc("-Wall", "-Werror", "m.c", "-o", "prog")
    assert r.rc != 0                    # FROM_ENV undefined, and the unused static
    env = {"MOLTCC_FLAGS": "-DFROM_ENV=7 -Wno-error"}
    tool.moltcc("-Wall", "-Werror", "m.c", "-o", "prog", env=env).ok()
    tool.moltcc("-Wall", "-Werror", "-c", "p.c", env=env).ok()
    assert tool.run(["./prog"]).rc == 0
