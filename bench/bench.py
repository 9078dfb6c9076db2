#!/usr/bin/python3
"""Runs the molt benchmarks (targets P1-P7 and P7b, the experiments of the PSU thesis,
chapter 5) and writes bench/results/<measure>.json.  Use bench/run.sh, which
builds molt first and draws the plots and RESULTS.md afterwards.

    bench.py --molt-build DIR [--quick] [--only p1,p5] [--work DIR]
"""
import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402
import m_calls  # noqa: E402
import m_threads  # noqa: E402
import m_many  # noqa: E402
import m_memory  # noqa: E402
import m_kvstore  # noqa: E402
import m_memcached  # noqa: E402

MEASURES = [
    ("p1", m_calls.p1),
    ("p2", m_calls.p2),
    ("p3", m_threads.p3),
    ("p4", m_many.p4),
    ("p5", m_many.p5),
    ("p6", m_memory.p6),
    ("p7", m_kvstore.p7),
    ("p7b", m_memcached.p7b),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--molt-build", required=True, help="molt build directory (Release)")
    ap.add_argument("--work", default=os.path.join(bl.BENCH, "build", "work"),
                    help="where programs are generated and built (cached between runs)")
    ap.add_argument("--quick", action="store_true", help="smoke run (~3 minutes)")
    ap.add_argument("--only", default="", help="comma-separated measures, e.g. p1,p5")
    a = ap.parse_args()
    only = [m.strip() for m in a.only.split(",") if m.strip()]
    bl.QUICK = a.quick
    ctx = bl.Ctx(a.molt_build, a.work, a.quick, bl.log)
    failed = []
    timings = {}
    for name, fn in MEASURES:
        if only and name not in only:
            continue
        t0 = time.time()
        bl.log("=== %s ===" % name.upper())
        try:
            fn(ctx)
        except Exception:  # one broken measure must not hide the others
            traceback.print_exc()
            failed.append(name)
            bl.save(name, {"measure": name.upper(), "error": traceback.format_exc(),
                           "quick": a.quick})
        timings[name] = time.time() - t0
        bl.log("%s took %.0f s" % (name.upper(), timings[name]))
    # With --only, keep the timings of the measures not run this time.
    prev = bl.load("run") if only else None
    if prev and "seconds" in prev:
        prev["seconds"].update(timings)
        timings = prev["seconds"]
        failed = sorted(set(prev.get("failed", [])) - set(only) | set(failed))
    bl.save("run", {"quick": a.quick, "seconds": timings, "failed": failed,
                    "machine": bl.machine_info()})
    if failed:
        bl.log("FAILED: %s" % ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
