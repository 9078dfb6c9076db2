#!/usr/bin/env python3
"""What one hot-patch transition costs, for several libmolt builds side by
side in one run (issue 14, item 3).

    python3 bench/apply_cost.py --lib base=/tmp/old-build --lib new=build \\
        [--rounds 6] [--count 100] [--gap-ms 5] [--busy 1] [--blocking 2] \\
        [--syscalls] [--callgrind] [--work DIR]

Each --lib names a molt build tree (or a directory holding libmolt.so).
One program (src/apply_main.c) and one pair of patches (src/mem_patch.c)
are built once, against the first; every run loads the libmolt of its
build through LD_LIBRARY_PATH, and the builds take turns, round after
round, in alternating order, so that the machine's episodes fall on all
alike.  Reported per build:

  apply    the molt_apply call (in-process, policy immediate), µs: median
           and the 10th-90th percentiles over every apply of every round;
  settle   from the apply to the end of the transition (work()'s entry
           jumps into the new patch again), µs, the same way;
  rt cpu   CPU time of the runtime thread per apply, µs (schedstat);
  syscalls (--syscalls) system calls per apply by name, the difference of
           two strace -f -c runs (COUNT and 3*COUNT applies), so start-up
           cancels;
  instr    (--callgrind) instructions per apply of the runtime thread and
           of the workers (per work() call), callgrind --separate-threads,
           exact; the difference of two runs the same way.
"""
import argparse
import glob
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = os.path.join(HERE, "src")


def libdir(path):
    for d in (path, os.path.join(path, "lib")):
        if os.path.exists(os.path.join(d, "libmolt.so")):
            return os.path.abspath(d)
    sys.exit("apply_cost: no libmolt.so in %s" % path)


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if r.returncode != 0:
        sys.exit("apply_cost: %s failed (%d): %s%s" % (" ".join(cmd), r.returncode,
                                                      r.stdout[-800:], r.stderr[-800:]))
    return r


def build(work, lib, moltstamp):
    prog = os.path.join(work, "apply_cost")
    inc = os.path.join(ROOT, "include")
    run(["gcc", "-O2", "-g", "-Wall", "-I" + inc, "-o", prog, os.path.join(SRC, "apply_main.c"),
         "-L" + lib, "-lmolt", "-pthread", "-Wl,--build-id"])
    patches = []
    for tag in (1, 2):
        out = os.path.join(work, "patch_%d.so" % tag)
        # As moltcc builds a patch: no start files, no registration constructor.
        run(["gcc", "-O2", "-fPIC", "-shared", "-nostartfiles", "-DMOLT__NO_AUTO_REGISTER",
             "-Wl,--build-id", "-DTAG=%d" % tag, "-I" + inc, "-o", out,
             os.path.join(SRC, "mem_patch.c")])
        run([moltstamp, out, prog])
        os.chmod(out, 0o755)
        patches.append(out)
    return prog, patches


def argv(a, prog, patches, count):
    return [prog, patches[0], patches[1], str(count), str(a.gap_ms), str(a.busy),
            str(a.blocking)]


def env_for(lib):
    e = dict(os.environ)
    e["LD_LIBRARY_PATH"] = lib
    return e


def one_run(a, prog, patches, lib):
    r = run(argv(a, prog, patches, a.count), env=env_for(lib), timeout=1800)
    applies, settles, stuck = [], [], 0
    kv = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if f and f[0] == "apply":
            applies.append(float(f[1]))
            settles.append(float(f[2]))
            stuck += len(f) > 3
        elif "=" in line:
            k, v = line.split("=", 1)
            kv[k] = int(v)
    return applies, settles, stuck, kv


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def syscalls(a, prog, patches, lib, work, name):
    counts = []
    for n in (a.count, 3 * a.count):
        out = os.path.join(work, "strace-%s-%d.txt" % (name, n))
        run(["strace", "-f", "-c", "-o", out] + argv(a, prog, patches, n), env=env_for(lib),
            timeout=1800)
        c = {}
        for line in open(out):
            m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
            if m:
                c[m.group(2)] = int(m.group(1))
        counts.append(c)
    return {k: (counts[1].get(k, 0) - counts[0].get(k, 0)) / (2.0 * a.count)
            for k in set(counts[0]) | set(counts[1])}


def callgrind(a, prog, patches, lib, work, name):
    res = []
    for n in (a.count // 4, 3 * (a.count // 4)):
        d = os.path.join(work, "cg-%s-%d" % (name, n))
        os.makedirs(d, exist_ok=True)
        for f in glob.glob(os.path.join(d, "*")):
            os.unlink(f)
        r = run(["valgrind", "--tool=callgrind", "--separate-threads=yes", "--smc-check=all",
                 "--callgrind-out-file=" + os.path.join(d, "cg.out")]
                + argv(a, prog, patches, n), env=env_for(lib), timeout=3600)
        calls = int(re.search(r"calls=(\d+)", r.stdout).group(1))
        rt = workers = 0
        for f in glob.glob(os.path.join(d, "cg.out*")):
            text = open(f, errors="replace").read()
            m = re.search(r"^(?:summary|totals): *(\d+)", text, re.M)
            total = int(m.group(1)) if m else 0
            # (A name is given once, in the first fn= or cfn= line naming it.)
            if re.search(r"^c?fn=\(\d+\) runtime_main$", text, re.M):
                rt += total
            elif re.search(r"^c?fn=\(\d+\) worker$", text, re.M):
                workers += total
        res.append((n, rt, workers, calls))
    (n1, rt1, w1, c1), (n2, rt2, w2, c2) = res
    return {"rt_per_apply": (rt2 - rt1) / float(n2 - n1),
            "worker_per_call_1": w1 / float(max(c1, 1)),
            "worker_per_call_2": w2 / float(max(c2, 1))}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", action="append", required=True, metavar="NAME=BUILD")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--gap-ms", type=int, default=5)
    p.add_argument("--busy", type=int, default=1)
    p.add_argument("--blocking", type=int, default=2)
    p.add_argument("--syscalls", action="store_true")
    p.add_argument("--callgrind", action="store_true")
    p.add_argument("--work", default="/tmp/molt-apply-cost")
    p.add_argument("--results", metavar="FILE",
                   help="also write the tables there (bench/results/apply_cost.md, which "
                        "bench/report.py puts into RESULTS.md)")
    a = p.parse_args()
    libs = []
    for spec in a.lib:
        name, _, path = spec.partition("=")
        libs.append((name, libdir(path)))
    os.makedirs(a.work, exist_ok=True)
    first_build = a.lib[0].partition("=")[2]
    moltstamp = os.path.join(first_build, "bin", "moltstamp")
    if not os.path.exists(moltstamp):
        moltstamp = os.path.join(ROOT, "build", "bin", "moltstamp")
    prog, patches = build(a.work, libs[0][1], moltstamp)
    data = {name: {"apply": [], "settle": [], "rt": [], "stuck": 0} for name, _ in libs}
    for r in range(a.rounds):
        order = libs if r % 2 == 0 else libs[::-1]
        for name, lib in order:
            ap, st, stuck, kv = one_run(a, prog, patches, lib)
            d = data[name]
            d["apply"] += ap
            d["settle"] += st
            d["stuck"] += stuck
            d["rt"].append(kv["rt_cpu_ns"] / 1e3 / a.count)
        print("round %d/%d done" % (r + 1, a.rounds), file=sys.stderr)
    out = []
    out.append("%d rounds x %d applies per build, %d ms apart; %d busy + %d blocking workers"
               % (a.rounds, a.count, a.gap_ms, a.busy, a.blocking))
    out.append("")
    out.append("| build | apply µs median (p10-p90) | settle µs median (p10-p90) | runtime thread CPU µs/apply median (min-max of rounds) | transitions not over in 5 s |")
    out.append("|---|---|---|---|---|")
    for name, _ in libs:
        d = data[name]
        out.append("| %s | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | %d |" % (
            name, statistics.median(d["apply"]), pct(d["apply"], 10), pct(d["apply"], 90),
            statistics.median(d["settle"]), pct(d["settle"], 10), pct(d["settle"], 90),
            statistics.median(d["rt"]), min(d["rt"]), max(d["rt"]), d["stuck"]))
    if a.syscalls:
        per = {name: syscalls(a, prog, patches, lib, a.work, name) for name, lib in libs}
        keys = sorted({k for v in per.values() for k, n in v.items() if abs(n) >= 0.05})
        out.append("")
        out.append("System calls per apply (strace -f -c, %d vs %d applies):" % (a.count, 3 * a.count))
        out.append("")
        out.append("| call | " + " | ".join(n for n, _ in libs) + " |")
        out.append("|---|" + "---|" * len(libs))
        for k in keys:
            out.append("| %s | " % k + " | ".join("%.1f" % per[n].get(k, 0) for n, _ in libs) + " |")
    if a.callgrind:
        out.append("")
        out.append("Instructions (callgrind --separate-threads, exact for its run; %d vs %d "
                   "applies):" % (a.count // 4, 3 * (a.count // 4)))
        out.append("")
        out.append("| build | runtime thread per apply | workers per work() call (short run, long run) |")
        out.append("|---|---|---|")
        for name, lib in libs:
            c = callgrind(a, prog, patches, lib, a.work, name)
            out.append("| %s | %.0f | %.1f, %.1f |" % (
                name, c["rt_per_apply"], c["worker_per_call_1"], c["worker_per_call_2"]))
    md = ["## The cost of a transition (issue 14, item 3)", "",
          "`bench/src/apply_main.c` under each libmolt build in turn (same program, same "
          "patches: `src/mem_patch.c`), one run; *apply*: the `molt_apply` call in-process "
          "(policy immediate); *settle*: from the apply to the end of the transition "
          "(`work()`'s entry jumps into the new patch again: the old generation reclaimed, the "
          "superseded patch proved unused); *runtime thread CPU*: schedstat of `molt-runtime` "
          "over the loop, per apply.", ""] + out + [
          "", "Command: `python3 bench/apply_cost.py %s` (%s)." % (
              " ".join(sys.argv[1:]), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))]
    print("\n".join(md))
    if a.results:
        with open(a.results, "w") as f:
            f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
