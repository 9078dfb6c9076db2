"""P1 (function call, PSU 5.2.1) and P2 (multi-threaded calls, PSU 5.2.2).

The program is src/fcall_main.c (the loop) + src/fcall_target.c (the callee,
one variant per build).  Variants:
    plain         direct call (the baseline)
    molt          MOLT_FUNCTION (molt.h's manual interface); no patch, so the
                  stable entry jumps straight to version 0
    molt-patched  the molt program, which first applies src/fcall_patch.c
                  in-process (replacing target): every call takes the
                  dispatch path (generation table, per-thread counters)
    moltcc        the plain source made updatable by moltcc
                  --molt-updatable=all (-O2 only)
"""
import os
import re
import subprocess

import benchlib as bl

COMPILERS = {"gcc": "gcc", "clang": "clang-14"}
OPTS = ["O0", "O1", "O2", "O3"]


def fcall_bin(ctx, cc, opt, variant):
    """Builds (cached) the fcall program for one compiler/level/variant."""
    d = ctx.wdir("fcall")
    out = os.path.join(d, "fcall-%s-%s-%s" % (cc, opt, variant))
    main = os.path.join(bl.SRC, "fcall_main.c")
    tgt = os.path.join(bl.SRC, "fcall_target.c")
    deps = [main, tgt] + bl.molt_deps(ctx)
    comp = COMPILERS[cc]
    flags = ["-" + opt, "-Wall", "-I" + bl.INCLUDE]
    if variant == "plain":
        cmd = [comp] + flags + ["-DVARIANT_PLAIN", "-o", out, main, tgt, "-pthread"]
        return bl.build(out, cmd, deps)
    if variant == "molt":
        cmd = [comp] + flags + ["-DVARIANT_MOLT", "-o", out, main, tgt] + ctx.molt_link()
        return bl.build(out, cmd, deps)
    if variant == "moltcc":
        # The loop is compiled by the plain compiler (with --molt-updatable=all
        # moltcc would make the loop itself updatable); the callee by moltcc;
        # the link by moltcc (it adds libmolt).
        src = os.path.join(bl.SRC, "fcall_target_cc.c")
        env = dict(os.environ, MOLT_CC=comp)
        mo, to = out + ".main.o", out + ".target.o"
        bl.build(mo, [comp] + flags + ["-c", "-o", mo, main], [main])
        bl.build(to, [ctx.moltcc, "-" + opt, "--molt-updatable=all", "-c", "-o", to, src],
                 [src] + bl.molt_deps(ctx), env=env)
        return bl.build(out, [ctx.moltcc, "-" + opt, "-o", out, mo, to, "-pthread"], [mo, to], env=env)
    raise ValueError(variant)


def stamped_patch(ctx, cc, opt, src, prog):
    """Builds (cached) the patch `src` for program `prog`: same compiler and
    level as the program, -fPIC -shared, stamped with prog's build-id and
    not writable by group/others (the runtime refuses such files)."""
    out = prog + ".patch.so"
    # (-nostartfiles, no registration constructor: as moltcc builds a patch;
    # the runtime refuses a patch with DT_INIT)
    return bl.build(out, [COMPILERS[cc], "-" + opt, "-Wall", "-fPIC", "-shared", "-nostartfiles",
                          "-DMOLT__NO_AUTO_REGISTER", "-Wl,--build-id",
                          "-I" + bl.INCLUDE, "-o", out, src],
                    [src, prog] + bl.molt_deps(ctx),
                    post=[[ctx.moltstamp, out, prog], ["chmod", "go-w", out]])


def fcall_argv(ctx, bins, cc, opt, v, n, threads=1):
    """argv of variant v (molt-patched: the molt program with its patch)."""
    if v == "molt-patched":
        prog = bins[(cc, opt, "molt")]
        patch = stamped_patch(ctx, cc, opt, os.path.join(bl.SRC, "fcall_patch.c"), prog)
        return [prog, str(n), str(threads), patch]
    return [bins[(cc, opt, v)], str(n)] + ([str(threads)] if threads != 1 else [])


def per_call(recs, iters, threads=1):
    """ns per call from the program's own loop timing."""
    return [r["loop_ns"] / (iters * threads) for r in recs]


def disasm(path, fn="target"):
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path],
                         stdout=subprocess.PIPE, text=True).stdout
    m = re.search(r"^[0-9a-f]+ <%s>:\n(.*?)\n\n" % fn, out, re.S | re.M)
    if not m:
        return ""
    lines = []
    for l in m.group(1).splitlines():
        l = re.sub(r"^\s*[0-9a-f]+:\s*", "", l).rstrip()
        if l.startswith(("nop", "cs nop", "xchg   %ax,%ax", "data16")):
            continue
        lines.append(l)
    return "\n".join(lines)


def callgrind_per_call(ctx, argv, label, n1=100000, n2=200000):
    """Instructions per loop iteration (loop + call + callee), from two runs
    under callgrind, counting only inside main (the runtime thread's work
    and the start-up are not counted) and taking the difference, so the
    constant part (printf, the apply of molt-patched) cancels.  argv[1] is
    the iteration count, replaced by n1 and n2."""
    tot = []
    for n in (n1, n2):
        f = os.path.join(ctx.wdir("callgrind"), label + ".%d.out" % n)
        cmd = [argv[0], str(n)] + argv[2:]
        # --smc-check=all: molt-patched rewrites target's entry (code) at run
        # time; valgrind must not keep a translation of the old jump.
        r = subprocess.run(["valgrind", "--tool=callgrind", "--smc-check=all", "--toggle-collect=main",
                            "--callgrind-out-file=" + f] + cmd,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise RuntimeError("callgrind failed on %s: %s" % (" ".join(cmd), r.stderr[-500:]))
        with open(f) as fh:
            m = re.search(r"^(?:summary|totals):\s*(\d+)", fh.read(), re.M)
        tot.append(int(m.group(1)))
    return (tot[1] - tot[0]) / (n2 - n1)


def have_valgrind():
    try:
        return subprocess.run(["valgrind", "--version"], stdout=subprocess.PIPE).returncode == 0
    except OSError:
        return False


def perf_instructions(binary, n):
    """perf stat -e instructions, if the machine exposes the counter (a VM
    often does not): returns None when it does not."""
    try:
        r = subprocess.run(["perf", "stat", "-x,", "-e", "instructions:u", binary, str(n)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError:
        return None
    for line in r.stderr.splitlines():
        f = line.split(",")
        if len(f) > 2 and f[2].startswith("instructions") and f[0].strip().isdigit():
            return int(f[0])
    return None


def p1(ctx):
    quick = ctx.quick
    runs = 10
    compilers = list(COMPILERS)
    opts = ["O2"] if quick else OPTS
    iters = [10 ** k for k in ((3, 5, 7) if quick else (3, 4, 5, 6, 7, 8))]
    big = 10 ** 7 if quick else 10 ** 9   # only at -O2: the one the target names
    bl.log("P1: building %d compiler x level configurations" % (len(compilers) * len(opts)))
    items = []
    for cc in compilers:
        for opt in opts:
            for v in ["plain", "molt", "molt-patched"] + (["moltcc"] if opt == "O2" else []):
                items.append((cc, opt, v))
    bins = {}
    for cc, opt, v in items:
        if v != "molt-patched":
            bins[(cc, opt, v)] = fcall_bin(ctx, cc, opt, v)

    process, loops = [], []
    for cc in compilers:
        for opt in opts:
            sizes = iters + ([big] if opt == "O2" and big not in iters else [])
            variants = [v for c, o, v in items if (c, o) == (cc, opt)]
            for n in sizes:
                progs = [(v, fcall_argv(ctx, bins, cc, opt, v, n)) for v in variants]
                bl.log("P1 %s -%s n=%.0e: %d programs x %d runs" % (cc, opt, n, len(progs), runs))
                res = bl.alternate(ctx, progs, runs)
                for r in res.get("molt-patched", []):
                    if r.get("entry_moved") != 1:
                        raise RuntimeError("molt-patched did not report entry_moved=1: %r" % r["out"])
                wall = {k: [r["wall_ns"] for r in v] for k, v in res.items()}
                pc = {k: per_call(v, n) for k, v in res.items()}
                process.append({"cc": cc, "opt": opt, "iterations": n,
                                "wall_ns": {k: bl.summary(v) for k, v in wall.items()},
                                # molt vs plain (kept under these names for the plots)
                                "ratio": bl.ratio_summary(wall["molt"], wall["plain"]),
                                "loop_ratio": bl.ratio_summary(pc["molt"], pc["plain"]),
                                "ratios": {k: bl.ratio_summary(wall[k], wall["plain"])
                                           for k in wall if k != "plain"},
                                "loop_ratios": {k: bl.ratio_summary(pc[k], pc["plain"])
                                                for k in pc if k != "plain"}})
                if n >= 10 ** 7:
                    best = {k: [r["best_ns"] for r in v] for k, v in res.items()}
                    loops.append({"cc": cc, "opt": opt, "iterations": n,
                                  "ns_per_call": {k: bl.summary(v) for k, v in pc.items()},
                                  "ratio": {k: bl.ratio_summary(pc[k], pc["plain"])
                                            for k in pc if k != "plain"},
                                  "best_ns_per_call": {k: bl.summary(v) for k, v in best.items()},
                                  "best_ratio": {k: bl.ratio_summary(best[k], best["plain"])
                                                 for k in best if k != "plain"}})
    # Instruction counts (deterministic, unlike time on a shared machine).
    counts = []
    if have_valgrind():
        for cc, opt, v in items:
            bl.log("P1 callgrind %s -%s %s" % (cc, opt, v))
            argv = fcall_argv(ctx, bins, cc, opt, v, 1)
            counts.append({"cc": cc, "opt": opt, "variant": v,
                           "instr_per_iteration": callgrind_per_call(
                               ctx, argv, "fcall-%s-%s-%s" % (cc, opt, v))})
    perf = perf_instructions(bins[("gcc", "O2", "plain")], 10 ** 6)
    asm = {}
    for cc in compilers:
        asm["%s/plain" % cc] = disasm(bins[(cc, "O2", "plain")], "target")
        asm["%s/molt" % cc] = disasm(bins[(cc, "O2", "molt")], "target")
        asm["%s/molt-v0" % cc] = disasm(bins[(cc, "O2", "molt")], "target__molt_v0")
        asm["%s/molt-dispatch" % cc] = disasm(bins[(cc, "O2", "molt")], "target__molt_dispatch")
        if (cc, "O2", "moltcc") in bins:
            asm["%s/moltcc" % cc] = disasm(bins[(cc, "O2", "moltcc")], "target")
    data = {
        "measure": "P1",
        "title": "call of an updatable function vs a direct call",
        "anchor": "PSU (thesis 5.2.1, fig. 5.1/5.2): 2.97x-4.24x",
        "target": "<= 1.5x (noinline, -O2)",
        "config": {"runs": runs, "iterations": iters, "largest_o2": big, "opts": opts,
                   "compilers": {k: COMPILERS[k] for k in compilers},
                   "variants": {
                       "plain": "direct call of a noinline target in another TU",
                       "molt": "MOLT_FUNCTION, no patch: the entry jumps straight to version 0",
                       "molt-patched": "the molt program after molt_apply() of src/fcall_patch.c "
                                       "(same body, same compiler and level, stamped): every "
                                       "call takes the dispatch path",
                       "moltcc": "fcall_target_cc.c through moltcc --molt-updatable=all (-O2)"},
                   "cap": ("10^9 iterations only at -O2 (the level the target names); "
                           "the other levels stop at 10^8 so that the suite fits its "
                           "time budget" if not quick else "quick run: 10^3..10^7, -O2 only")},
        "process": process, "loops": loops, "callgrind": counts,
        "perf_stat_instructions": perf, "asm_o2": asm,
    }
    bl.save("p1", data)
    return data


def p2(ctx):
    quick = ctx.quick
    runs = 10 if quick else 15
    threads = [1, 2, 4, 8]
    per_thread = 5 * 10 ** 6 if quick else 2 * 10 ** 7
    compilers = ["gcc"] if quick else list(COMPILERS)
    rows = []
    for cc in compilers:
        bins = {(cc, "O2", v): fcall_bin(ctx, cc, "O2", v) for v in ("plain", "molt")}
        variants = ["plain", "molt", "molt-patched"]
        for t in threads:
            bl.log("P2 %s -O2 %d threads x %.0e calls: %d programs x %d runs"
                   % (cc, t, per_thread, len(variants), runs))
            res = bl.alternate(ctx, [(v, fcall_argv(ctx, bins, cc, "O2", v, per_thread, t))
                                     for v in variants], runs)
            loop = {k: [r["loop_ns"] for r in v] for k, v in res.items()}
            cpu = {k: [r["user_ns"] + r["sys_ns"] for r in v] for k, v in res.items()}
            best = {k: [r["best_ns"] for r in v] for k, v in res.items()}
            rows.append({"cc": cc, "threads": t, "calls_per_thread": per_thread,
                         "loop_ns": {k: bl.summary(v) for k, v in loop.items()},
                         "cpu_ns": {k: bl.summary(v) for k, v in cpu.items()},
                         "ratio": {k: bl.ratio_summary(loop[k], loop["plain"]) for k in loop if k != "plain"},
                         # per-call cost of thread 0 in its fastest chunk (see fcall_main.c)
                         "best_ns_per_call": {k: bl.summary(v) for k, v in best.items()},
                         "best_ratio": {k: bl.ratio_summary(best[k], best["plain"]) for k in best if k != "plain"}})
    for cc in compilers:
        base = next(r for r in rows if r["cc"] == cc and r["threads"] == 1)
        for r in rows:
            if r["cc"] == cc:
                r["rel_to_1_thread"] = {k: r["ratio"][k]["ratio"] / base["ratio"][k]["ratio"]
                                        for k in r["ratio"]}
    data = {"measure": "P2", "title": "P1's ratio at 1, 2, 4, 8 threads",
            "anchor": "PSU (thesis 5.2.2, fig. 5.3): flat", "target": "flat (+-10%)",
            "config": {"runs": runs, "threads": threads, "calls_per_thread": per_thread,
                       "variants": ["plain", "molt", "molt-patched"],
                       "compilers": compilers, "cpus": os.cpu_count()},
            "rows": rows}
    bl.save("p2", data)
    return data
