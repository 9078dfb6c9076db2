"""P6: RSS and number of mappings over 10,000 sequential patches."""
import os
import subprocess

import benchlib as bl


def build(ctx):
    d = ctx.wdir("mem")
    main = os.path.join(bl.SRC, "mem_main.c")
    psrc = os.path.join(bl.SRC, "mem_patch.c")
    prog = os.path.join(d, "mem")
    bl.build(prog, ["gcc", "-O2", "-Wall", "-I" + bl.INCLUDE, "-o", prog, main] + ctx.molt_link(),
             [main] + bl.molt_deps(ctx))
    patches = []
    for tag in (1, 2):
        out = os.path.join(d, "patch_%d.so" % tag)
        # As moltcc builds a patch: no start files (the runtime refuses a
        # patch with DT_INIT), no registration constructor.
        bl.build(out, ["gcc", "-O2", "-fPIC", "-shared", "-nostartfiles", "-DMOLT__NO_AUTO_REGISTER",
                       "-Wl,--build-id", "-DTAG=%d" % tag,
                       "-I" + bl.INCLUDE, "-o", out, psrc],
                 [psrc, prog] + bl.molt_deps(ctx),
                 post=[[ctx.moltstamp, out, prog], ["chmod", "go-w", out]])
        patches.append(out)
    return prog, patches


def run_once(prog, patches, count, every):
    r = subprocess.run([prog, patches[0], patches[1], str(count), str(every)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError("mem failed: %s %s" % (r.stdout[-500:], r.stderr[-500:]))
    samples, kv = [], bl.parse_kv(r.stdout)
    for line in r.stdout.splitlines():
        f = line.split()
        if f and f[0] in ("before", "first", "sample", "final"):
            samples.append({"tag": f[0], "patches": int(f[1]), "rss_kib": int(f[2]),
                            "mappings": int(f[3])})
    by = {s["tag"]: s for s in samples}
    # Steady baseline: the median number of mappings over the first 10% of
    # the patches (one patch loaded).  A single sample can be off by one
    # because the kernel merges a patch's mapping with a neighbour or not,
    # depending on where it lands; that is not a leak.
    early = sorted(s["mappings"] for s in samples
                   if s["tag"] != "before" and s["patches"] <= max(1, count // 10))
    steady = early[len(early) // 2]
    return {"samples": samples,
            "steady_mappings": steady,
            "mappings_growth_steady": by["final"]["mappings"] - steady,
            "before": by["before"], "first": by["first"], "final": by["final"],
            "max_rss_kib": max(s["rss_kib"] for s in samples),
            "max_mappings": max(s["mappings"] for s in samples),
            "rss_growth_kib": by["final"]["rss_kib"] - by["first"]["rss_kib"],
            "rss_growth_from_before_kib": by["final"]["rss_kib"] - by["before"]["rss_kib"],
            "mappings_growth": by["final"]["mappings"] - by["first"]["mappings"],
            "apply_loop_ns": kv.get("apply_loop_ns"),
            "us_per_apply": kv.get("apply_loop_ns", 0) / count / 1000.0}


def p6(ctx):
    prog, patches = build(ctx)
    count = 1000 if ctx.quick else 10000
    every = 10 if ctx.quick else 100
    nruns = 1 if ctx.quick else 3
    runs = []
    for i in range(nruns):
        bl.log("P6 run %d/%d: %d sequential patches" % (i + 1, nruns, count))
        runs.append(run_once(prog, patches, count, every))
    worst_rss = max(r["rss_growth_kib"] for r in runs)
    worst_maps = max(r["mappings_growth_steady"] for r in runs)
    data = {"measure": "P6", "title": "memory after %d sequential patches" % count,
            "anchor": "PSU: reclaims old versions", "target": "RSS +<= 2 MiB, mappings back to baseline",
            "config": {"patches": count, "sample_every": every, "runs": nruns,
                       "baseline": "'first' = after the first patch (one patch is always loaded); "
                                   "'before' = no patch yet; 'steady' = median mappings over the "
                                   "first 10% of the patches",
                       "patches_alternate": "A, B, A, B, ... (each replaces 2 functions)"},
            "runs": runs, "worst_rss_growth_kib": worst_rss, "worst_mappings_growth": worst_maps}
    bl.save("p6", data)
    return data
