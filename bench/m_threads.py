"""P3: thread create + join in a molt program vs plain (PSU 5.2.3), without
and with a live patch of the function the threads call."""
import os

import benchlib as bl
from m_calls import COMPILERS, OPTS, stamped_patch


def thread_bin(ctx, cc, opt, variant):
    d = ctx.wdir("threads")
    out = os.path.join(d, "threads-%s-%s-%s" % (cc, opt, variant))
    main = os.path.join(bl.SRC, "thread_main.c")
    tgt = os.path.join(bl.SRC, "thread_target.c")
    cmd = [COMPILERS[cc], "-" + opt, "-Wall", "-I" + bl.INCLUDE, "-o", out, main, tgt]
    if variant == "plain":
        cmd += ["-DVARIANT_PLAIN", "-pthread"]
    else:
        cmd += ctx.molt_link()
    return bl.build(out, cmd, [main, tgt] + bl.molt_deps(ctx))


def p3(ctx):
    quick = ctx.quick
    runs = 10 if quick else 20
    n = 2000 if quick else 4000
    compilers = ["gcc"] if quick else list(COMPILERS)
    opts = ["O2"] if quick else OPTS
    rows = []
    for cc in compilers:
        for opt in opts:
            plain = thread_bin(ctx, cc, opt, "plain")
            molt = thread_bin(ctx, cc, opt, "molt")
            patch = stamped_patch(ctx, cc, opt, os.path.join(bl.SRC, "thread_patch.c"), molt)
            progs = [("plain", [plain, str(n)]), ("molt", [molt, str(n)]),
                     ("molt-idle", [molt, str(n), "idle"]),
                     ("molt-patched", [molt, str(n), "call", patch])]
            bl.log("P3 %s -%s: %d create+join x %d programs x %d runs" % (cc, opt, n, len(progs), runs))
            res = bl.alternate(ctx, progs, runs)
            per = {k: [r["loop_ns"] / n for r in v] for k, v in res.items()}
            best = {k: [r["best_ns"] for r in v] for k, v in res.items()}
            rows.append({"cc": cc, "opt": opt, "threads_created": n,
                         "ns_per_thread": {k: bl.summary(v) for k, v in per.items()},
                         "ratio": {k: bl.ratio_summary(per[k], per["plain"])
                                   for k in per if k != "plain"},
                         "best_ns_per_thread": {k: bl.summary(v) for k, v in best.items()},
                         "best_ratio": {k: bl.ratio_summary(best[k], best["plain"])
                                        for k in best if k != "plain"}})
    data = {"measure": "P3", "title": "pthread create+join in a molt program vs plain",
            "anchor": "PSU (thesis 5.2.3, fig. 5.4): up to 24x", "target": "<= 1.2x",
            "config": {"runs": runs, "threads_created_per_run": n, "compilers": compilers,
                       "opts": opts,
                       "variants": {"plain": "no molt; the thread calls a plain bump()",
                                    "molt": "the thread calls an updatable bump() that no patch "
                                            "replaces: a direct jump, the thread never registers",
                                    "molt-idle": "molt program, the thread makes no updatable call",
                                    "molt-patched": "the molt program after molt_apply() of "
                                                    "src/thread_patch.c (replaces bump): each thread "
                                                    "registers on its first (dispatched) call of bump "
                                                    "and unregisters at exit"}},
            "rows": rows}
    bl.save("p3", data)
    return data
