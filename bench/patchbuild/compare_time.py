#!/usr/bin/python3
"""Time of the patch builder's object comparison and DWARF checks on a large
translation unit (issue 10, design §3/§4).

Builds three versions of one TU the way the patch builder does (woven by
moltcc --molt-updatable=all, -O2 -g -ffunction-sections -fdata-sections):
the original, a new version (one function changed, one added at the top),
and the new version line-remapped; then times, in fresh processes:
  compare   objdiff.compare_objects(orig, new, remapped, locate=False)
  dwarf     reading the DWARF of orig and new (typecheck.load_debug)
  check     typecheck.check_types after that (DWARF cached)
and prints medians and min/max of CPU and wall time over --runs runs.

  bench/patchbuild/compare_time.py [--build BUILD] [--runs 5] [--source FILE.c -- CFLAGS...]

Without --source it generates a C file of ~6,700 lines (600 functions:
switches, strings, asserts, static locals, floats).  With --source FILE.c
it uses a real file (its directory is copied; CFLAGS after `--`, e.g. the
project's -I options).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from moltcc.patch import objdiff as od  # noqa: E402

FLAGS = ["-O2", "-g", "-ffunction-sections", "-fdata-sections", "-c"]


def generate(n=600):
    out = ["#include <stdio.h>", "#include <string.h>", "#include <assert.h>",
           "struct rec { int a; long b; char name[16]; };", "int g_total;"]
    for i in range(n):
        k = i % 4
        if k == 0:
            out.append("int f%d(int x)\n{\n    static int calls;\n    calls++;\n"
                       "    if (x > %d) return x * %d + calls;\n    return x - %d;\n}" % (i, i, i + 3, i))
        elif k == 1:
            cases = "\n".join('    case %d: return "s%d_%d";' % (j, i, j) for j in range(6))
            out.append('const char *f%d(int x)\n{\n    switch (x) {\n%s\n    default: return "other%d";\n'
                       "    }\n}" % (i, cases, i))
        elif k == 2:
            out.append('double f%d(struct rec *r)\n{\n    printf("rec %%s %%d\\n", r->name, %d);\n'
                       "    assert(r->a >= 0);\n    return r->b * %d.5 + g_total;\n}" % (i, i, i))
        else:
            cases = "\n".join("    case %d: y = x * %d + %d; break;" % (j, j + i, j) for j in range(8))
            out.append("int f%d(int x)\n{\n    int y = 0;\n    switch (x & 15) {\n%s\n    default: y = -1;\n"
                       '    }\n    return y + (int)strlen("f%d");\n}' % (i, cases, i))
    return "\n\n".join(out) + "\n"


def change(src):
    """The first `return <value>;` after the includes gets `1 +`, and a
    function is added right after the includes."""
    lines = src.split("\n")
    inc = max(i for i, l in enumerate(lines[:300]) if l.startswith("#include"))
    for i in range(inc + 1, len(lines)):
        s = lines[i].strip()
        if s.startswith("return ") and s.endswith(";") and not s.startswith("return ("):
            lines[i] = lines[i].replace("return ", "return 1 + ", 1)
            break
    lines.insert(inc + 1, "int bench_added_top(int q) { return q * 3 + 1; }")
    return "\n".join(lines)


def build(moltcc, src_dir, rel, text, out, cflags):
    d = tempfile.mkdtemp(prefix="pbbench-")
    shutil.copytree(src_dir, d, dirs_exist_ok=True)
    with open(os.path.join(d, rel), "w") as f:
        f.write(text)
    subprocess.run(moltcc + ["--molt-updatable=all"] + cflags + FLAGS + [rel, "-o", out],
                   cwd=d, check=True)
    shutil.rmtree(d, ignore_errors=True)


TIMER = r'''
import json, resource, sys, time
sys.path.insert(0, %(tools)r)
from moltcc.patch import objdiff as od, typecheck as tc
o, n, r = sys.argv[1:4]
def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime
c0, w0 = cpu(), time.time()
res = od.compare_objects(o, n, r, locate=False)
c1, w1 = cpu(), time.time()
tc.load_debug(o); tc.load_debug(n)
c2, w2 = cpu(), time.time()
chk = tc.check_types(o, n, comparison=res)
c3, w3 = cpu(), time.time()
m = od.load_object(o)
print(json.dumps({"compare": [c1 - c0, w1 - w0], "dwarf": [c2 - c1, w2 - w1], "check": [c3 - c2, w3 - w2],
                  "functions": sum(1 for u in m.units if u.kind == "func"),
                  "sections": len(m.elf.sections),
                  "relocations": sum(len(s.relocs) for s in m.elf.sections),
                  "replaced": [f.name for f in res.replaced],
                  "new": [f.name for f in res.new_functions],
                  "line_only": len(res.line_only), "refusals": len(chk.refusals)}))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("MOLT_BUILD_DIR") or os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--source")
    ap.add_argument("cflags", nargs="*")
    a = ap.parse_args()
    moltcc = [os.path.join(os.path.abspath(a.build), "bin", "moltcc")]
    work = tempfile.mkdtemp(prefix="pbbench-")
    if a.source:
        src_dir = os.path.dirname(os.path.abspath(a.source))
        rel = os.path.basename(a.source)
        with open(a.source) as f:
            orig = f.read()
    else:
        src_dir = os.path.join(work, "src")
        os.makedirs(src_dir)
        rel = "big.c"
        orig = generate()
    new = change(orig)
    objs = [os.path.join(work, x + ".o") for x in ("orig", "new", "rem")]
    for text, out in zip((orig, new, od.remap_source(orig, new)), objs):
        build(moltcc, src_dir, rel, text, out, a.cflags)
    script = TIMER % {"tools": os.path.join(ROOT, "tools")}
    runs = []
    for _ in range(a.runs):
        p = subprocess.run(["/usr/bin/python3", "-c", script] + objs, capture_output=True, text=True,
                           check=True)
        runs.append(json.loads(p.stdout))
    first = runs[0]
    print("%s: %d lines, %d functions (entries, bodies, dispatch paths), %d sections, %d relocations; "
          "object %.1f MB" % (a.source or "generated", orig.count("\n"), first["functions"],
                              first["sections"], first["relocations"], os.path.getsize(objs[0]) / 1e6))
    print("replaced %s, new %s, line-only %d, refusals %d" % (first["replaced"], first["new"],
                                                             first["line_only"], first["refusals"]))
    for k, what in (("compare", "compare_objects, 3 objects"), ("dwarf", "DWARF of orig+new"),
                    ("check", "check_types (DWARF cached)")):
        cpu = [r[k][0] for r in runs]
        wall = [r[k][1] for r in runs]
        print("%-28s cpu median %.2fs (%.2f..%.2f)  wall median %.2fs (%.2f..%.2f)" % (
            what, statistics.median(cpu), min(cpu), max(cpu), statistics.median(wall), min(wall), max(wall)))
    print("load average %.2f %.2f %.2f" % os.getloadavg())
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
