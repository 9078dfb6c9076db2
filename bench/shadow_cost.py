#!/usr/bin/python3
"""Cost of shadow data (molt_shadow_*, guarantee H13): instructions per operation
from callgrind, and wall-clock time per operation with 1 and 2 threads, for
the lock-free get (hit and miss) and the writers, beside two baselines: the
same lookup under one pthread mutex, and reading a real struct field.

    bench/shadow_cost.py --molt-build DIR [--runs N]

Instructions: two callgrind runs (1e5 and 2e5 iterations) counting only
inside run_op (bench/src/shadow_cost.c); their difference per iteration, so
set-up and the loop's constant part cancel.  Time: N runs of 2e6 iterations
per configuration, interleaved (round r in one order, round r+1 reversed);
median, min and max.  Writes bench/results/shadow.json and prints a table.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OPS = ["field", "get_hit", "get_miss", "get_or_alloc_hit", "mutex_hit", "alloc_free",
       "attach_free"]


def build(molt_build, out):
    exe = os.path.join(out, "shadow_cost")
    subprocess.run(["cc", "-O2", "-g", "-pthread", "-I", os.path.join(ROOT, "include"),
                    os.path.join(HERE, "src", "shadow_cost.c"), "-o", exe,
                    "-L", molt_build, "-lmolt", "-Wl,-rpath," + molt_build], check=True)
    return exe


def callgrind(exe, op, out, n1=100000, n2=200000):
    tot = []
    for n in (n1, n2):
        f = os.path.join(out, "cg.%s.%d" % (op, n))
        subprocess.run(["valgrind", "--tool=callgrind", "--toggle-collect=run_op",
                        "--callgrind-out-file=" + f, exe, op, str(n)],
                       check=True, capture_output=True)
        with open(f) as fh:
            tot.append(int(re.search(r"^(?:summary|totals):\s*(\d+)", fh.read(), re.M).group(1)))
    return (tot[1] - tot[0]) / (n2 - n1)


def timed(exe, op, threads, n=2000000):
    r = subprocess.run([exe, op, str(n), str(threads)], check=True, capture_output=True, text=True)
    return float(re.search(r"ns_per_op=([\d.]+)", r.stdout).group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--molt-build", required=True)
    ap.add_argument("--runs", type=int, default=11)
    a = ap.parse_args()
    out = tempfile.mkdtemp(prefix="molt-shadow-bench.")
    exe = build(os.path.abspath(a.molt_build), out)
    res = {"ops": {}, "runs": a.runs, "loadavg": os.getloadavg()}
    for op in OPS:
        res["ops"][op] = {"instructions": callgrind(exe, op, out)}
    configs = [(op, t) for t in (1, 2) for op in OPS]
    samples = {c: [] for c in configs}
    for r in range(a.runs):
        order = configs if r % 2 == 0 else list(reversed(configs))
        for c in order:
            samples[c].append(timed(exe, *c))
    for (op, t), v in samples.items():
        res["ops"][op]["ns_%dt" % t] = {"median": statistics.median(v), "min": min(v),
                                        "max": max(v)}
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "shadow.json"), "w") as f:
        json.dump(res, f, indent=1)
    base = res["ops"]["mutex_hit"]
    print("%-18s %8s   %-26s %-26s" % ("op", "instr", "ns/op 1 thread (min-max)",
                                         "ns/op 2 threads (min-max)"))
    for op in OPS:
        o = res["ops"][op]
        print("%-18s %8.1f   %6.1f (%5.1f-%5.1f) x%-5.2f %6.1f (%5.1f-%5.1f) x%.2f" % (
            op, o["instructions"],
            o["ns_1t"]["median"], o["ns_1t"]["min"], o["ns_1t"]["max"],
            o["ns_1t"]["median"] / base["ns_1t"]["median"],
            o["ns_2t"]["median"], o["ns_2t"]["min"], o["ns_2t"]["max"],
            o["ns_2t"]["median"] / base["ns_2t"]["median"]))
    print("(x: ratio to mutex_hit, the same lookup under one mutex; load average %.2f)"
          % res["loadavg"][0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
