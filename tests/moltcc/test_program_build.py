"""Full updates, build side: `moltcc --molt-program` images and the
migration code generated with `--molt-from OLD.so --molt-xf FILE.xf`
(tools/moltcc/image/build.py, dwarf.py, image/xfgen.py).

Real compiles.  The fixture program is tests/moltcc/program/{v1,v2}/ (a
key-value store whose struct entry changes: float -> double, int -> size_t,
a new field; a renamed global; statics of the same name in two files; a
MOLT_NO_MIGRATE array; a migrated local) with program/v2.xf.  The last test
runs v1 under `molt run`, updates it to v2 with `molt update` and checks the
migrated state."""
import os
import re
import subprocess

import pytest

from harness.moltcc import make_env
from harness.proc import Program, molt, sanitizer_reports
from harness.tree import BUILD, ROOT, have_pyelftools, molt_cli, san_flags, skip

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "program")
V1 = [os.path.join(FIX, "v1", "kv.c"), os.path.join(FIX, "v1", "stats.c")]
V2 = [os.path.join(FIX, "v2", "kv.c"), os.path.join(FIX, "v2", "stats.c")]
XF = os.path.join(FIX, "v2.xf")


@pytest.fixture
def ptool(tool, needs_lib):
    if not have_pyelftools():
        skip("/usr/bin/python3 has no pyelftools (apt-get install python3-pyelftools)")
    return tool


def kept_dir(err):
    m = re.search(r"generated sources kept in (\S+)", err)
    assert m, err
    return m.group(1)


def generated_source(err):
    d = kept_dir(err)
    for root, _, files in os.walk(d):
        if "molt__program.c" in files:
            return os.path.join(root, "molt__program.c")
    raise AssertionError("no molt__program.c in %s" % d)


def no_traceback(r):
    assert "Traceback" not in r.err, r


CHECKER = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <molt.h>
#include <molt/program.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
    const molt__program_info *p = dlsym(h, "molt__program");
    if (!p) { printf("no molt__program\n"); return 1; }
    printf("abi=%u from=%s migrate=%s\n", p->abi,
           p->from_build_id ? p->from_build_id : "NULL", p->migrate ? "yes" : "NULL");
    return 0;
}
"""


def program_info(t, image):
    """molt__program of an image, read by a compiled program that dlopens it."""
    if not os.path.exists(t.path("checker")):
        t.write("checker.c", CHECKER)
        r = t.cc("-DMOLT__NO_AUTO_REGISTER", "-I" + os.path.join(ROOT, "include"), "-o", "checker",
                 "checker.c", "-ldl",
                 *san_flags())
        r.ok()
    env = {"LD_LIBRARY_PATH": BUILD}
    if san_flags():
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    r = t.run([t.path("checker"), os.path.abspath(t.path(image))], env=env)
    r.ok()
    return r.out.strip()


def build_id(path):
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True,
                         env=make_env()).stdout
    m = re.search(r"Build ID: ([0-9a-f]+)", out)
    assert m, out
    return m.group(1)


def section_text(path, name):
    out = subprocess.run(["objcopy", "-O", "binary", "--only-section=" + name, path, "/dev/stdout"],
                         capture_output=True, env=make_env()).stdout
    return out.rstrip(b"\0").decode("utf-8", "replace")


def build_v1(t):
    r = t.moltcc("--molt-program", "-O2", "-Wall", "-o", "v1.so", *V1)
    r.ok()
    no_traceback(r)
    return r


# ---------------------------------------------------------------------------
# First version
# ---------------------------------------------------------------------------

def test_first_version_image(ptool):
    t = ptool
    build_v1(t)
    syms = subprocess.run(["nm", "-D", "--defined-only", t.path("v1.so")], capture_output=True,
                          text=True).stdout
    assert re.search(r"\bmolt__program\b", syms), syms
    assert re.search(r"\bmain\b", syms), syms
    undef = subprocess.run(["nm", "-D", "--undefined-only", t.path("v1.so")], capture_output=True,
                           text=True).stdout
    # the pthread wrapper is the runtime's (linked with --wrap=pthread_create)
    needed = subprocess.run(["readelf", "-dW", t.path("v1.so")], capture_output=True,
                            text=True).stdout
    assert "libmolt.so" in needed and "SYMBOLIC" in needed, needed
    del undef
    assert program_info(t, "v1.so") == "abi=1 from=NULL migrate=NULL"
    ann = section_text(t.path("v1.so"), ".molt_types")
    import json
    data = json.loads(ann)
    assert data["fields"]["struct table"]["slots"] == ["molt_ptrarray:n"], data
    assert {"name": "cache", "tu": "kv.c", "file": "kv.c", "line": 24,
            "annotations": ["molt_no_migrate"]} in data["vars"], data
    assert {"func": "main", "var": "local_count"} in [
        {"func": l["func"], "var": l["var"]} for l in data["locals"]], data
    # kept DWARF at -O2
    info = subprocess.run(["readelf", "-S", t.path("v1.so")], capture_output=True, text=True).stdout
    assert ".debug_info" in info


def test_annotations_of_generic_structs(ptool):
    t = ptool
    t.write("g.c", r"""
#include <molt.h>
struct user { int id; };
struct list { void *val MOLT_VAR(t); struct list *next MOLT_INST(t); } MOLT_FORALL(t);
struct list *users MOLT_INST(struct user);
typedef struct { char *p MOLT_OPAQUE; } handle_t;
handle_t h;
int main(void) { return users != 0 || h.p != 0; }
""")
    t.moltcc("--molt-program", "-o", "g.so", "g.c").ok()
    import json
    data = json.loads(section_text(t.path("g.so"), ".molt_types"))
    assert data["types"]["struct list"] == ["molt_forall:t"]
    assert data["fields"]["struct list"] == {"val": ["molt_var:t"], "next": ["molt_inst:t"]}
    assert data["fields"]["struct {handle_t}"] == {"p": ["molt_opaque"]}
    assert any(v["name"] == "users" and v["annotations"] == ["molt_inst:struct user"]
               for v in data["vars"]), data


# ---------------------------------------------------------------------------
# Updates
# ---------------------------------------------------------------------------

def test_update_image_and_generated_code(ptool):
    t = ptool
    build_v1(t)
    r = t.moltcc("--molt-program", "-O2", "-Wall", "-o", "v2.so", *V2, "--molt-from", "v1.so",
                 "--molt-xf", XF, "--molt-keep")
    r.ok()
    no_traceback(r)
    # provenance: from_build_id is the old image's build-id
    assert program_info(t, "v2.so") == "abi=1 from=%s migrate=yes" % build_id(t.path("v1.so"))
    src = generated_source(r.err)
    with open(src) as f:
        code = f.read()
    # compiles without warnings on its own
    c = t.cc("-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-I" + os.path.join(ROOT, "include"),
             "-c", src, "-o", t.path("gen.o"))
    c.ok()
    assert c.err.strip() == "", c
    # both versions' types, exact layout
    assert "struct __attribute__((packed, aligned(8))) molt_o_entry {" in code
    assert "struct __attribute__((packed, aligned(8))) molt_n_entry {" in code
    assert "_Static_assert(sizeof(struct molt_o_entry) == 24," in code
    assert "_Static_assert(sizeof(struct molt_n_entry) == 40," in code
    assert "_Static_assert(__builtin_offsetof(struct molt_n_entry, weight) == 8," in code
    # field by field: float -> double converted by assignment, new field from INIT
    assert "/* field weight: float -> double */\n    out->weight = in->weight;" in code
    assert "/* field len: int -> size_t */\n    out->len = in->len;" in code
    assert re.search(r"#line 3 \"[^\"]*v2.xf\"\n\s*\(out->hits\) = \(\*in\).key \+ 100;", code), code
    # pointers through the pointee pair; MOLT_PTRARRAY(n) counts from the old object
    # (molt__xf_fptr: the field is named in messages about pointers not followed)
    assert re.search(r"molt__xf_fptr\(cx, molt_xf_ld\(&in->slots\), &molt_xf_t\d+, \(size_t\)\(in->n\), "
                     r"\"struct table.slots\"\)", code), code
    assert re.search(r"molt_xf_st\(&out->next, molt__xf_fptr\(cx, molt_xf_ld\(&in->next\), "
                     r"&molt_xf_t\d+, 1, \"struct entry.next\"\)\);", code), code
    # descriptors: changed struct, unchanged struct with pointers, plain int
    assert re.search(r'molt_xf_t\d+ = \{"struct entry", 24, 40, molt_xf_f\d+, '
                     r'MOLT__XF_CHANGED \| MOLT__XF_TRAVERSE\};', code), code
    assert re.search(r'molt_xf_t\d+ = \{"struct table", 24, 24, molt_xf_f\d+, MOLT__XF_TRAVERSE\};',
                     code), code
    assert re.search(r'molt_xf_t\d+ = \{"int", 4, 4, NULL, 0\};', code), code
    # migrate(): globals, the rename, statics told apart by file, the local
    assert 'molt__xf_var(cx, molt__xf_oldsym(cx, "store", NULL),' in code
    assert re.search(r'molt__xf_oldsym\(cx, "rounds", NULL\),\s*molt__xf_newsym\(cx, "loops", NULL\)',
                     code), code
    assert re.search(r'molt__xf_oldsym\(cx, "counter", "stats.c"\),\s*'
                     r'molt__xf_newsym\(cx, "counter", "stats.c"\)', code), code
    assert re.search(r'molt__xf_oldsym\(cx, "counter", "kv.c"\)', code), code
    assert "cache" not in re.sub(r"/\*.*?\*/", "", code.split("static void migrate")[1]), \
        "MOLT_NO_MIGRATE variable migrated"
    assert re.search(r'molt__xf_local\(cx, "main", "local_count", &molt_xf_t\d+\);', code), code
    assert re.search(r'\(\*\(int \*\)molt__xf_oldsym\(cx, "rounds", NULL\)\) > 0 \? 2 : -1;', code), code
    assert code.count("molt__xf_run(cx);") >= 1
    assert "#define MOLT_XF_INVOKE(xf, in, out)" in code and "#define XF_INVOKE" in code
    assert "#define MOLT_XF_PTR(p, xf)" in code
    # function-scope statics are reported as not migrated
    assert "not migrated (function-scope static, keeps its initializer): stats.c: " \
           "stats_tick(): 'calls'" in r.err, r


def test_refusal_lists_each_variable_and_difference(ptool):
    t = ptool
    build_v1(t)
    r = t.moltcc("--molt-program", "-o", "v2.so", *V2, "--molt-from", "v1.so")
    assert r.rc == 1, r
    no_traceback(r)
    assert "moltcc: error: the state of v2 cannot be migrated from v1 without transformers:" in r.err
    assert "  kv.c: variable 'store' (struct table): struct entry changed: field 'weight' " \
           "float -> double; field 'len' int -> size_t; field 'hits' added" in r.err, r
    assert "add a rule such as" in r.err
    assert not os.path.exists(t.path("v2.so"))
    # a rule for struct entry, but the INIT is for a field of another type:
    # still refused for the same reason
    t.write("partial.xf", "rounds -> loops\n")
    r = t.moltcc("--molt-program", "-o", "v2.so", *V2, "--molt-from", "v1.so",
                 "--molt-xf", "partial.xf")
    assert r.rc == 1 and "struct entry changed" in r.err, r
    # acknowledging the type is enough (fields copied by name, hits zero)
    t.write("ack.xf", "struct entry -> struct entry\n")
    t.moltcc("--molt-program", "-o", "v2.so", *V2, "--molt-from", "v1.so", "--molt-xf", "ack.xf").ok()


def test_changed_global_type_needs_a_rule(ptool):
    t = ptool
    t.write("a/c.c", "long total = 1;\nint main(void) { return (int)total; }\n".replace("long", "int"))
    t.write("b/c.c", "long total = 1;\nint main(void) { return (int)total; }\n")
    t.moltcc("--molt-program", "-o", "a.so", "a/c.c").ok()
    r = t.moltcc("--molt-program", "-o", "b.so", "b/c.c", "--molt-from", "a.so")
    assert r.rc == 1 and "  c.c: variable 'total' (long int): type int -> long int" in r.err, r
    t.write("t.xf", "total -> total\n")
    r = t.moltcc("--molt-program", "-o", "b.so", "b/c.c", "--molt-from", "a.so", "--molt-xf", "t.xf",
                 "--molt-keep")
    r.ok()
    code = open(generated_source(r.err)).read()
    assert re.search(r'"int -> long int", 4, 8, molt_xf_f\d+, MOLT__XF_CHANGED\}', code), code
    assert "*out = *in;" in code


def test_rules_naming_unknown_symbols(ptool):
    t = ptool
    build_v1(t)
    t.write("bad.xf", "struct entry -> struct entry\n"
                      "INIT struct entry.nothere { $out = 1; }\n"
                      "nosuch -> loops\n"
                      "  struct ghost -> struct table\n"
                      "INIT missing_var { $out = 0; }\n"
                      "counter@nofile.c -> counter@kv.c\n")
    r = t.moltcc("--molt-program", "-o", "v2.so", *V2, "--molt-from", "v1.so", "--molt-xf", "bad.xf")
    assert r.rc == 1, r
    no_traceback(r)
    assert "bad.xf:2:6: error: struct entry has no field 'nothere' in the new version" in r.err, r
    assert "bad.xf:3:1: error: no variable 'nosuch' in the old version" in r.err, r
    assert "bad.xf:4:3: error: no type 'struct ghost' in the old version" in r.err, r
    assert "bad.xf:5:6: error: no variable 'missing_var' in the new version" in r.err, r
    assert "bad.xf:6:1: error: no variable 'counter@nofile.c' in the old version" in r.err, r
    # a special naming an unknown variable, at the special's position
    t.write("bad2.xf", "struct entry -> struct entry\nINIT version_tag {\n  $out = $oldsym(nope);\n}\n")
    r = t.moltcc("--molt-program", "-o", "v2.so", *V2, "--molt-from", "v1.so", "--molt-xf", "bad2.xf")
    assert r.rc == 1 and "bad2.xf:3:10: error: no variable 'nope' in the old version" in r.err, r
    no_traceback(r)


def test_xf_syntax_error_and_c_error_in_a_body(ptool):
    t = ptool
    build_v1(t)
    t.write("syn.xf", "struct entry -> \n")
    r = t.moltcc("--molt-program", "-o", "v2.so", *V2, "--molt-from", "v1.so", "--molt-xf", "syn.xf")
    assert r.rc == 1 and re.search(r"^syn.xf:2:1: error: ", r.err, re.M), r
    no_traceback(r)
    # a C error inside a rule body points at the .xf line
    t.write("cerr.xf", "struct entry -> struct entry\n\nINIT struct entry.hits {\n"
                       "    $out = $base.no_such_field;\n}\n")
    r = t.moltcc("--molt-program", "-o", "v2.so", *V2, "--molt-from", "v1.so", "--molt-xf", "cerr.xf")
    assert r.rc == 1, r
    assert re.search(r"cerr.xf:4:\d+: error: .*no_such_field", r.err), r
    assert "moltcc: error: the migration code generated from cerr.xf does not compile" in r.err, r
    no_traceback(r)


def test_from_a_file_that_is_not_an_image(ptool):
    t = ptool
    t.write("lib.c", "int x = 1;\n")
    t.cc("-shared", "-fPIC", "-g", "-o", "plain.so", "lib.c").ok()
    r = t.moltcc("--molt-program", "-o", "v2.so", *V2, "--molt-from", "plain.so")
    assert r.rc == 1 and r.err.strip() == (
        "moltcc: error: plain.so is not a molt program image (no .molt_types section; build it "
        "with moltcc --molt-program)"), r
    t.write("notelf.so", "hello\n")
    r = t.moltcc("--molt-program", "-o", "v2.so", *V2, "--molt-from", "notelf.so")
    assert r.rc == 1 and "notelf.so is not an ELF file" in r.err, r
    r = t.moltcc("--molt-program", "-o", "v2.so", *V2, "--molt-from", "missing.so")
    assert r.rc == 1 and "moltcc: error: --molt-from missing.so: no such file" in r.err, r
    # an image without DWARF
    build_v1(t)
    subprocess.run(["strip", "--strip-debug", "-o", t.path("stripped.so"), t.path("v1.so")], check=True)
    r = t.moltcc("--molt-program", "-o", "v2.so", *V2, "--molt-from", "stripped.so")
    assert r.rc == 1 and "stripped.so has no DWARF debug information" in r.err, r
    for x in (r,):
        no_traceback(x)


def test_option_errors(ptool):
    t = ptool
    r = t.moltcc("--molt-program", "-o", "v2.so", *V2, "--molt-xf", XF)
    assert r.rc == 1 and "--molt-xf needs --molt-from" in r.err, r
    r = t.moltcc("-c", V2[1], "--molt-from", "v1.so")
    assert r.rc == 1 and "--molt-from is only meaningful with --molt-program" in r.err, r
    r = t.moltcc("--molt-program", *V1)
    assert r.rc == 1 and "--molt-program needs -o IMAGE.so" in r.err, r


# ---------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------

def test_full_update_end_to_end(ptool, needs_cli):
    t = ptool
    if not os.path.exists(os.path.join(BUILD, "bin", "molt-run")):
        skip("molt-run not built in %s/bin" % BUILD)
    build_v1(t)
    t.moltcc("--molt-program", "-O2", "-o", "v2.so", *V2, "--molt-from", "v1.so",
             "--molt-xf", XF).ok()
    env = make_env()
    proc = Program([molt_cli(), "run", t.path("v1.so")], env=env, cwd=t.cwd)
    try:
        proc.out.wait_line(lambda l: "v1 ready" in l, 30)
        out = proc.out.text()
        assert "v1 ready counter=5 cache=42" in out, (out, proc.p.poll())
        u = molt("update", proc.pid, t.path("v2.so"), env=env)
        assert u.returncode == 0, (u.stdout, u.stderr)
        assert "now at generation 1" in u.stdout, u.stdout
        proc.out.wait_line(lambda l: "v2 done" in l, 30)
        out = proc.out.text()
    finally:
        proc.stop()
        err = proc.err.join()
    assert "v2 updated local=7 got=1 n=4 name=kv-store loops=1 tag=2 counter=5 cache=0 stats=1" \
        in out, (out, err)
    for i in range(4):
        assert "entry %d weight=%.2f len=%d hits=%d next=%d" % (
            i, i + 0.25, i * 3, 100 + i, i - 1) in out, (out, err)
    assert not sanitizer_reports(err), err
