#!/usr/bin/python3
"""Patch builds of real security fixes (issue 10): time and size.

On the servers and fixes of examples/fixes (run `examples/fixes/run.sh`
first: it fetches and builds the servers in its work directory), for each
fix that is built into a hot patch:

  time       `moltcc --molt-patch --molt-target SERVER --molt-diff FIX...`
             (as run.sh builds it) against a plain compile of the changed
             files: the compiler and flags of the program's compile record
             (`moltcc --molt-show-build`), i.e. the package's own `gcc`
             command without moltcc, each file once.  Wall and CPU time (of
             the command and its children), --runs runs each, alternating;
             medians and min-max.
  functions  replaced by the patch (its --molt-report) against what the
             whole-file mode (every updatable function of each changed
             file, as moltcc built patches before it compared objects) would
             replace: the updatable functions of the changed files in the
             running program's objects (their `<name>__molt_desc` symbols).

Fixes that do not build (refused, or blocked by a moltcc problem) are
listed as misses with the reason.  Writes bench/results/patchbuild_realfixes.json
and .md, and the section "Patch builds of real fixes" of bench/RESULTS.md.

    bench/patchbuild/realfixes.py [--work /var/tmp/molt-fixes] [--runs 3] [--only nginx,dnsmasq] [--fixes A,B]
"""
import argparse
import importlib.util
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FIXES = os.path.join(ROOT, "examples", "fixes")
sys.path.insert(0, os.path.join(FIXES, "common"))
from harness import blocked_by  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
BEGIN, END = "<!-- patchbuild-realfixes: begin -->", "<!-- patchbuild-realfixes: end -->"


def server(name):
    spec = importlib.util.spec_from_file_location(name + "_server", os.path.join(FIXES, name, "server.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def timed(cmd, cwd=None):
    """(rc, wall s, CPU s of cmd and its children)"""
    b = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    rc = subprocess.call(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.time() - t0
    a = resource.getrusage(resource.RUSAGE_CHILDREN)
    return rc, wall, (a.ru_utime - b.ru_utime) + (a.ru_stime - b.ru_stime)


def stats(xs):
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3),
            "max": round(max(xs), 3), "runs": [round(x, 3) for x in xs]}


def updatable_in(obj):
    out = subprocess.check_output(["nm", "--defined-only", obj], text=True)
    return sorted({m.group(1) for m in re.finditer(r" (\S+)__molt_desc$", out, re.M)})


def bench_fix(a, moltcc, srv, fix, by_name, records, tmp):
    h_patch = lambda f: (os.path.join(FIXES, srv.NAME, f.patch) if f.kind == "byhand" else
                         os.path.join(a.work, srv.NAME, "tree", "debian", "patches", f.patch))
    so, rep = os.path.join(tmp, fix.name + ".so"), os.path.join(tmp, fix.name + ".json")
    cmd = [moltcc, "--molt-patch", "--molt-target", srv.binary(a)]
    for n in fix.needs + [fix.name]:
        cmd += ["--molt-diff", h_patch(by_name[n])]
    cmd += ["-o", so, "--molt-report", rep, "--molt-patch-id", fix.name]
    p = subprocess.run(cmd, cwd=a.work, capture_output=True, text=True)
    row = {"server": srv.NAME, "fix": fix.name, "kind": fix.kind, "diffs": fix.needs + [fix.name]}
    if p.returncode != 0:
        errs = [l[len("moltcc: error: "):] for l in (p.stdout + p.stderr).splitlines()
                if l.startswith("moltcc: error:")]
        blocked = blocked_by(p.stdout + p.stderr)
        row["miss"] = ("blocked: %s" % blocked) if blocked else ("refused: " + "; ".join(errs[1:] or errs))[:300]
        return row
    with open(rep) as f:
        report = json.load(f)
    replaced = [x["name"] if isinstance(x, dict) else x for x in report.get("replaced", [])]
    m = re.search(r"files: (.*)$", report.get("provenance", ""))
    changed = sorted(m.group(1).split() if m else [])
    # the changed .c files and their compile records
    recs = [r for r in records if os.path.relpath(r["abspath"], srv_root(a, srv)) in changed]
    row.update({"replaced": replaced, "new_functions": len(report.get("new_functions", [])),
                "changed_files": changed,
                "compiled_files": [os.path.relpath(r["abspath"], srv_root(a, srv)) for r in recs]})
    whole = []
    for r in recs:
        whole += updatable_in(os.path.join(r["directory"], r["output"]))
    row["whole_file"] = len(whole)
    plain = []
    for r in recs:
        args = list(r["arguments"])
        if "-o" in args:
            i = args.index("-o")
            del args[i:i + 2]
        plain.append((args + ["-o", os.path.join(tmp, "plain.o")], r["directory"]))
    pw, pc, cw, cc = [], [], [], []
    for i in range(a.runs):
        order = ["patch", "plain"] if i % 2 == 0 else ["plain", "patch"]
        for what in order:
            if what == "patch":
                rc, w, c = timed(cmd, cwd=a.work)
                if rc != 0:
                    row["miss"] = "the patch build failed in run %d" % i
                    return row
                pw.append(w)
                pc.append(c)
            else:
                tw = tc = 0
                for args, d in plain:
                    rc, w, c = timed(args, cwd=d)
                    if rc != 0:
                        row["miss"] = "the plain compile failed: %s" % " ".join(args)[:200]
                        return row
                    tw += w
                    tc += c
                cw.append(tw)
                cc.append(tc)
    row.update({"patch_wall_s": stats(pw), "patch_cpu_s": stats(pc),
                "plain_wall_s": stats(cw), "plain_cpu_s": stats(cc),
                "cpu_ratio": round(statistics.median(pc) / statistics.median(cc), 2),
                "wall_ratio": round(statistics.median(pw) / statistics.median(cw), 2)})
    return row


def srv_root(a, srv):
    return os.path.join(a.work, srv.NAME, "tree")


def section(res):
    L = ["## Patch builds of real fixes (issue 10)", "",
         "`bench/patchbuild/realfixes.py` on the Debian security fixes of `examples/fixes` "
         "(tinyproxy, dnsmasq and nginx as Debian 12 packages them, built with `CC=moltcc`, every "
         "function updatable; each fix built from its patch file with `moltcc --molt-patch "
         "--molt-diff`). **Time**: the patch build against a plain compile of the changed files "
         "with the package's own compiler command from the program's compile record (`gcc`, the "
         "package's flags), %d runs each, alternating; medians [min–max]; CPU is user + system "
         "time of the command and its children. **Functions**: what the patch replaces against "
         "the whole-file mode, which replaced every updatable function of each changed file "
         "(counted in the running program's objects)." % res["runs"], "",
         "Machine: %s; load averages (1, 5, 15 min) %s (other jobs share it: wall times are "
         "inflated, CPU times are the better guide)." % (res["machine"], res.get("load_note") or ", ".join(
             "%s %s" % (k, v) for k, v in res.get("loads", {}).items())), "",
         "| server | fix | files | patch build CPU s | plain compile CPU s | CPU ratio | patch build wall s "
         "| plain wall s | replaced | whole-file mode |", "|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda s: "%.2f [%.2f–%.2f]" % (s["median"], s["min"], s["max"])
    for r in res["fixes"]:
        if "miss" in r:
            continue
        L.append("| %s | %s%s | %s | %s | %s | %.1f× | %s | %s | %d (%s) | %d |" % (
            r["server"], r["fix"], " (+%s)" % ", ".join(r["diffs"][:-1]) if len(r["diffs"]) > 1 else "",
            ", ".join("`%s`" % f for f in r["compiled_files"]), fmt(r["patch_cpu_s"]),
            fmt(r["plain_cpu_s"]), r["cpu_ratio"], fmt(r["patch_wall_s"]), fmt(r["plain_wall_s"]),
            len(r["replaced"]), ", ".join("`%s`" % x for x in r["replaced"][:4]) +
            (", …" if len(r["replaced"]) > 4 else ""), r["whole_file"]))
    ok = [r for r in res["fixes"] if "miss" not in r]
    if ok:
        L += ["", "Over %d fixes: the patch build takes %.1f× (median; %.1f–%.1f×) the CPU time of a "
              "plain compile of the changed files, and replaces %d functions in all where the "
              "whole-file mode replaced %d." % (
                  len(ok), statistics.median(r["cpu_ratio"] for r in ok),
                  min(r["cpu_ratio"] for r in ok), max(r["cpu_ratio"] for r in ok),
                  sum(len(r["replaced"]) for r in ok), sum(r["whole_file"] for r in ok))]
    miss = [r for r in res["fixes"] if "miss" in r]
    if miss:
        L += ["", "Not measured (no patch is built):", ""]
        L += ["- %s %s: %s" % (r["server"], r["fix"], r["miss"]) for r in miss]
    L += ["", "A patch build compiles each affected translation unit three times (as it was, "
          "with the fix, and the fixed version line-remapped to tell line-only changes), runs "
          "libclang over the source to generate the patch and compiles that, and reads the DWARF "
          "of both builds for the layout checks: a few times a plain compile is what that costs.",
          "", "Numbers: `bench/results/patchbuild_realfixes.json`."]
    return "\n".join(L) + "\n"


def save(a, res):
    """Writes the results so far (after every fix: a long run that is
    stopped keeps what it measured), merged with the rows of the last run
    for the fixes not measured in this one."""
    res = dict(res, fixes=list(res["fixes"]))
    os.makedirs(RESULTS, exist_ok=True)
    # the servers not measured now keep their rows of the last run
    prev_path = os.path.join(RESULTS, "patchbuild_realfixes.json")
    done = {(r["server"], r["fix"]) for r in res["fixes"]}
    if os.path.exists(prev_path):
        with open(prev_path) as f:
            prev = json.load(f)
        keep = [r for r in prev.get("fixes", []) if (r["server"], r["fix"]) not in done]
        if keep:
            res["fixes"] = keep + res["fixes"]
    order = ["tinyproxy", "dnsmasq", "nginx"]
    res["fixes"].sort(key=lambda r: order.index(r["server"]) if r["server"] in order else 9)
    loads = [r["load"].split()[0] for r in res["fixes"] if "load" in r]
    res["loads"] = {"after each fix's runs: from": min(loads, key=float),
                    "to": max(loads, key=float)} if loads else {}
    with open(os.path.join(RESULTS, "patchbuild_realfixes.json"), "w") as f:
        json.dump(res, f, indent=1)
    text = section(res)
    with open(os.path.join(RESULTS, "patchbuild_realfixes.md"), "w") as f:
        f.write(text)
    md = os.path.join(ROOT, "bench", "RESULTS.md")
    with open(md) as f:
        cur = f.read()
    block = BEGIN + "\n" + text + END
    if BEGIN in cur:
        cur = cur[:cur.index(BEGIN)] + block + cur[cur.index(END) + len(END):]
    else:
        cur = cur.replace("## Proposals, collected", block + "\n\n## Proposals, collected", 1)
    with open(md, "w") as f:
        f.write(cur)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=os.environ.get("MOLT_FIXES_WORK", "/var/tmp/molt-fixes"))
    ap.add_argument("--moltcc", default=os.path.join(ROOT, "build", "bin", "moltcc"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="tinyproxy,dnsmasq,nginx")
    ap.add_argument("--fixes", help="only these fixes (names as in examples/fixes)")
    a = ap.parse_args()
    res = {"runs": a.runs, "load_start": " ".join(open("/proc/loadavg").read().split()[:3]),
           "machine": "%d CPUs, %s" % (os.cpu_count(), subprocess.check_output(
               ["gcc", "--version"], text=True).splitlines()[0]), "fixes": []}
    with tempfile.TemporaryDirectory(prefix="realfixes-") as tmp:
        for name in a.only.split(","):
            srv = server(name)
            if not os.path.exists(srv.binary(a)):
                print("%s: no build in %s (run examples/fixes/run.sh first)" % (name, a.work))
                continue
            records = json.loads(subprocess.check_output([a.moltcc, "--molt-show-build", srv.binary(a)]))
            by_name = {f.name: f for f in srv.fixes()}
            for fix in srv.fixes():
                if fix.kind == "refuse" or (a.fixes and fix.name not in a.fixes.split(",")):
                    continue
                row = bench_fix(a, a.moltcc, srv, fix, by_name, records, tmp)
                row["load"] = " ".join(open("/proc/loadavg").read().split()[:3])
                res["fixes"].append(row)
                save(a, res)
                if "miss" in row:
                    print("%s %s: %s" % (name, fix.name, row["miss"]))
                else:
                    print("%s %s: patch %.2f s CPU (%.1f s wall), plain %.2f s CPU (%.1f s wall), "
                          "%.1fx; replaced %d, whole-file %d" % (
                              name, fix.name, row["patch_cpu_s"]["median"], row["patch_wall_s"]["median"],
                              row["plain_cpu_s"]["median"], row["plain_wall_s"]["median"],
                              row["cpu_ratio"], len(row["replaced"]), row["whole_file"]))
    save(a, res)
    print("wrote bench/results/patchbuild_realfixes.json and the section of bench/RESULTS.md")


if __name__ == "__main__":
    sys.exit(main())
