#!/usr/bin/python3
"""Draws bench/results/*.png from bench/results/*.json, in the manner of the
PSU thesis's figures 5.1-5.7 (same experiment, same axes), with molt's
target and PSU's figure drawn in where they apply.

    plot.py            (reads and writes bench/results)
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402

PLAIN, MOLT = "#4c72b0", "#dd8452"
COLORS = {"plain": PLAIN, "molt": MOLT, "moltcc": "#c44e52", "molt-patched": "#8172b3",
          "molt-idle": "#64b5cd", "plain-2": "#8fa9d6"}
OPT_STYLE = {"O0": ":", "O1": "-.", "O2": "-", "O3": "--"}
CC_MARK = {"gcc": "o", "clang": "s"}


def out(name):
    return os.path.join(bl.RESULTS, name)


def err(s):
    """matplotlib error bars (below, above) from a summary: min and max."""
    return [[s["median"] - s["min"]], [s["max"] - s["median"]]]


def save(fig, name):
    fig.tight_layout()
    fig.savefig(out(name), dpi=110)
    plt.close(fig)
    print("wrote", out(name))


def fig_5_1(p1):
    variants = ["molt"] + (["molt-patched"] if "ratios" in p1["process"][0] and
                           "molt-patched" in p1["process"][0]["ratios"] else [])
    fig, axes = plt.subplots(len(variants), 2, figsize=(12, 4.4 * len(variants)), sharey="row",
                             squeeze=False)
    for vi, v in enumerate(variants):
        for ax, key, title in ((axes[vi][0], "ratios", "whole program (exec to exit)"),
                               (axes[vi][1], "loop_ratios", "the calling loop alone")):
            configs = sorted({(r["cc"], r["opt"]) for r in p1["process"]})
            for cc, opt in configs:
                rows = sorted((r for r in p1["process"] if r["cc"] == cc and r["opt"] == opt),
                              key=lambda r: r["iterations"])
                x = [r["iterations"] for r in rows]
                rs = [r[key][v] if key in r else r[key.rstrip("s")] for r in rows]
                y = [q["ratio"] for q in rs]
                lo = [q["round_q1"] for q in rs]
                hi = [q["round_q3"] for q in rs]
                line, = ax.plot(x, y, OPT_STYLE[opt], marker=CC_MARK[cc], label="%s -%s" % (cc, opt))
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.08)
            ax.axhspan(2.97, 4.24, color="red", alpha=0.08, label="PSU 2.97x-4.24x")
            ax.axhline(1.5, color="green", ls="--", lw=1.2, label="target <= 1.5x")
            ax.axhline(1.0, color="grey", lw=0.6)
            ax.set_xscale("log")
            ax.set_xlabel("loop iterations (log scale)")
            ax.set_title("%s: %s" % (v if v != "molt" else "molt (no live patch)", title), fontsize=10)
            ax.grid(alpha=0.3)
        axes[vi][0].set_ylabel("time ratio, %s / direct" % v)
    axes[0][1].legend(fontsize=7, ncol=2, loc="upper left")
    fig.suptitle("P1 (cf. thesis fig. 5.1): ratio of execution time, updatable vs direct call "
                 "(median of %d runs; band: per-round IQR)\nmolt: no patch (direct jump to "
                 "version 0); molt-patched: target replaced by a live patch (dispatch path)"
                 % p1["config"]["runs"], fontsize=10)
    save(fig, "fig5_1_call_ratio.png")


def largest_loops(p1):
    """Per compiler/level, the row with the most iterations."""
    best = {}
    for r in p1["loops"]:
        k = (r["cc"], r["opt"])
        if k not in best or r["iterations"] > best[k]["iterations"]:
            best[k] = r
    return [best[k] for k in sorted(best, key=lambda k: (k[0], k[1]))]


def fig_5_2(p1):
    rows = largest_loops(p1)
    variants = [v for v in ("plain", "molt", "molt-patched") if v in rows[0]["ns_per_call"]]
    fig, ax = plt.subplots(figsize=(12, 4.8))
    w = 0.8 / len(variants)
    for i, r in enumerate(rows):
        for j, v in enumerate(variants):
            s = r["ns_per_call"][v]
            x = i + (j - (len(variants) - 1) / 2) * w
            ax.bar(x, s["median"], w, yerr=err(s), capsize=3,
                   color=COLORS[v], label=v if i == 0 else None)
            if v != "plain":
                ax.text(x, s["max"] * 1.03, "%.2fx" % r["ratio"][v]["ratio"], ha="center",
                        fontsize=7, rotation=90)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(["%s -%s\n%.0e it." % (r["cc"], r["opt"], r["iterations"]) for r in rows], fontsize=8)
    ax.set_ylabel("ns per loop iteration (call + loop)")
    ax.set_title("P1 (cf. thesis fig. 5.2): time of a direct call, an updatable call (molt) and a "
                 "call of a patched function (molt-patched)\nat the largest iteration count "
                 "(median, bars: min-max; label: ratio to plain)", fontsize=10)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    save(fig, "fig5_2_call_time.png")


def fig_5_3(p2):
    rows = p2["rows"]
    ccs = sorted({r["cc"] for r in rows})
    threads = p2["config"]["threads"]
    variants = [v for v in ("plain", "molt", "molt-patched") if v in rows[0]["loop_ns"]]
    fig, axes = plt.subplots(1, len(threads) + 1, figsize=(15, 4.2))
    for ti, t in enumerate(threads):
        ax = axes[ti]
        w = 0.8 / len(variants)
        for ci, cc in enumerate(ccs):
            r = next(r for r in rows if r["cc"] == cc and r["threads"] == t)
            for vi, v in enumerate(variants):
                s = r["loop_ns"][v]
                ax.bar(ci + (vi - (len(variants) - 1) / 2) * w, s["median"] / 1e6, w,
                       yerr=[[x / 1e6 for x in e] for e in err(s)], capsize=2, color=COLORS[v],
                       label=v if ci == 0 and ti == 0 else None)
        ax.set_xticks(range(len(ccs)))
        ax.set_xticklabels([c + " -O2" for c in ccs])
        ax.set_title("(%s) %d thread%s" % ("abcd"[ti] if ti < 4 else "", t, "s" if t > 1 else ""),
                     fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("loop time, ms (%.0e calls per thread)" % p2["config"]["calls_per_thread"])
    axes[0].legend(fontsize=8)
    ax = axes[-1]
    key = "best_ratio" if "best_ratio" in rows[0] else "ratio"
    for cc in ccs:
        rr = [r for r in rows if r["cc"] == cc]
        for v in variants[1:]:
            y = [r[key][v]["ratio"] for r in rr]
            ax.plot(threads, y, marker=CC_MARK[cc], color=COLORS[v], label="%s %s" % (cc, v))
            ax.fill_between(threads, [y[0] * 0.9] * len(threads), [y[0] * 1.1] * len(threads),
                            color=COLORS[v], alpha=0.07)
    ax.set_xscale("log", base=2)
    ax.set_xticks(threads)
    ax.set_xticklabels(threads)
    ax.set_xlabel("threads (%d CPUs)" % (p2["config"].get("cpus") or 0))
    ax.set_ylabel("ratio to plain, per call (fastest chunk)" if key == "best_ratio" else "ratio to plain")
    ax.set_ylim(bottom=0)
    ax.set_title("(%s) ratio vs threads (band: +-10%%)" % "abcde"[len(threads)], fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.suptitle("P2 (cf. thesis fig. 5.3): multi-threaded calls, each thread on its own variable",
                 fontsize=10)
    save(fig, "fig5_3_threads_calls.png")


def fig_5_4(p3):
    rows = p3["rows"]
    ccs = sorted({r["cc"] for r in rows})
    variants = [v for v in ("plain", "molt", "molt-idle", "molt-patched")
                if v in rows[0]["ns_per_thread"]]
    panels = [("ns_per_thread", "ratio", "whole loop (median of runs)")]
    if "best_ns_per_thread" in rows[0]:
        panels.append(("best_ns_per_thread", "best_ratio", "fastest chunk of 50 (median of runs)"))
    fig, axes = plt.subplots(len(panels), len(ccs), figsize=(6 * len(ccs), 4.2 * len(panels)),
                             squeeze=False)
    for pi, (key, rkey, what) in enumerate(panels):
        for ax, cc in zip(axes[pi], ccs):
            rr = [r for r in rows if r["cc"] == cc]
            w = 0.8 / len(variants)
            top = 0
            for i, r in enumerate(rr):
                for vi, v in enumerate(variants):
                    s = r[key][v]
                    ax.bar(i + (vi - (len(variants) - 1) / 2) * w, s["median"] / 1e3, w,
                           yerr=[[x / 1e3 for x in e] for e in err(s)], capsize=2, color=COLORS[v],
                           label=v if i == 0 else None)
                    top = max(top, s["median"] / 1e3)
                label = "\n".join("%.2fx" % r[rkey][v]["ratio"] for v in ("molt", "molt-patched")
                                   if v in r[rkey])
                ax.text(i, max(r[key][v]["median"] for v in variants) / 1e3 * 1.05 + 0.5,
                        label, ha="center", fontsize=7)
            ax.set_ylim(0, top * 1.8)  # outliers' bars run off the top; medians matter
            ax.set_xticks(range(len(rr)))
            ax.set_xticklabels(["-" + r["opt"] for r in rr])
            ax.set_title("%s: %s" % (cc, what), fontsize=10)
            ax.set_ylabel("us per pthread_create + join")
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("P3 (cf. thesis fig. 5.4): thread creation and destruction (labels: molt/plain, "
                 "molt-patched/plain; PSU: up to 24x, target <= 1.2x)", fontsize=10)
    save(fig, "fig5_4_thread_create.png")


def fig_5_5(p4):
    rows = p4["rows"]
    x = [r["functions"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for v in ("plain", "molt"):
        s = [r["exec_to_main_ns"][v] for r in rows]
        ax.errorbar(x, [a["median"] / 1e6 for a in s],
                    yerr=[[(a["median"] - a["min"]) / 1e6 for a in s], [(a["max"] - a["median"]) / 1e6 for a in s]],
                    marker="o", color=COLORS[v], capsize=3, label="%s: exec to main" % v)
    # differences of medians can come out <= 0 at small N on a noisy
    # machine; a log axis cannot show those points, so they are left out
    for key, style, color, label in (("median_diff_to_main_ns", "--", "k", "molt - plain, to main"),
                                     ("median_diff_to_first_call_ns", ":", "purple",
                                      "molt - plain, to the first call")):
        pts = [(a, r[key] / 1e6) for a, r in zip(x, rows) if r[key] > 0]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, marker=".", label=label)
    ax.plot([10000], [10], "g*", ms=14, label="target: <= 10 ms at 10,000")
    ax.axhline(430, color="red", ls=":", lw=1)
    ax.text(x[0], 430 / 1.8, "PSU: 430 ms for its largest program", color="red", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("updatable functions")
    ax.set_ylabel("ms")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left")
    ax.set_title("P4 (cf. thesis fig. 5.5): start-up with N updatable functions "
                 "(median of %d, bars min-max)" % p4["config"]["runs"], fontsize=10)
    save(fig, "fig5_5_startup.png")


def fig_5_6(p5):
    rows = p5["rows"]
    x = [r["functions"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    for key, label, c in (("inproc_first_call_ns", "molt_apply() in-process", MOLT),
                          ("cli_first_call_ns", "`molt apply` CLI", "#c44e52"),
                          ("dlopen_ns", "dlopen of the patch alone", PLAIN)):
        s = [r[key] for r in rows]
        axes[0].errorbar(x, [a["median"] / 1e6 for a in s],
                         yerr=[[(a["median"] - a["min"]) / 1e6 for a in s],
                               [(a["max"] - a["median"]) / 1e6 for a in s]],
                         marker="o", capsize=3, color=c, label=label)
    axes[0].axhline(2150, color="red", ls=":", lw=1)
    axes[0].text(x[0], 2150 * 1.15, "PSU peak 2.15 s", color="red", fontsize=8)
    axes[0].set_ylabel("ms, request to the first call of the new version")
    axes[0].set_yscale("log")
    for key, label, c in (("inproc_ns_per_function", "in-process", MOLT),
                          ("cli_ns_per_function", "CLI", "#c44e52")):
        s = [r[key] for r in rows]
        axes[1].errorbar(x, [a["median"] / 1e3 for a in s],
                         yerr=[[(a["median"] - a["min"]) / 1e3 for a in s],
                               [(a["max"] - a["median"]) / 1e3 for a in s]],
                         marker="o", capsize=3, color=c, label=label)
    axes[1].axhline(2, color="green", ls="--", label="target <= 2 us/function")
    axes[1].axhline(5, color="red", ls=":", label="PSU ~5 us/function")
    axes[1].set_ylabel("us per function")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("functions in the patch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("P5 (cf. thesis fig. 5.6): applying a patch of N functions (median, bars min-max; "
                 "runs per size in p5.json)", fontsize=10)
    save(fig, "fig5_6_patch_load.png")


def fig_p6(p6):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, run in enumerate(p6["runs"]):
        s = run["samples"]
        x = [a["patches"] for a in s]
        axes[0].plot(x, [a["rss_kib"] / 1024 for a in s], lw=1, label="run %d" % (i + 1))
        axes[1].plot(x, [a["mappings"] for a in s], lw=1, label="run %d" % (i + 1))
    base = p6["runs"][0]["first"]
    axes[0].axhline(base["rss_kib"] / 1024 + 2, color="green", ls="--", label="first + 2 MiB (target)")
    steady = p6["runs"][0].get("steady_mappings", base["mappings"])
    axes[1].axhline(steady, color="green", ls="--", label="one patch loaded (baseline)")
    axes[1].axhline(p6["runs"][0]["before"]["mappings"], color="grey", ls=":", label="before any patch")
    axes[0].set_ylabel("RSS, MiB")
    axes[1].set_ylabel("mappings (/proc/self/maps lines)")
    for ax in axes:
        ax.set_xlabel("patches applied")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("P6: memory over %d sequential patches (no PSU figure; PSU reclaims)"
                 % p6["config"]["patches"], fontsize=10)
    save(fig, "p6_memory.png")


def fig_5_7(p7):
    fig, ax = plt.subplots(figsize=(6.5, 4.6))
    for i, v in enumerate(("plain", "molt")):
        s = p7["rps"][v]
        ax.bar(i, s["median"] / 1e3, 0.6, yerr=[[x / 1e3 for x in e] for e in err(s)], capsize=4,
               color=COLORS[v])
        ax.plot([i] * len(p7["rps_raw"][v]), [x / 1e3 for x in p7["rps_raw"][v]], "k.", alpha=0.5)
    ax.set_xticks([0, 1])
    ax.set_xticklabels(["kvstore-plain (gcc)", "kvstore (moltcc,\ncommand layer updatable)"])
    ax.set_ylabel("thousand requests/s (kvbench)")
    r = p7["ratio"]
    ax.set_title("P7 (cf. thesis fig. 5.7): molt/plain = %.1f%% (per-round median %.1f%%)\n"
                 "target >= 98%%, PSU MySQL 95.02%%" % (r["ratio"] * 100, r["round_median"] * 100),
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    save(fig, "fig5_7_kvstore.png")


def fig_p7b(p7b):
    """memcached: GET throughput per server (bars: medians, whiskers: min/max,
    dots: the runs) and server CPU per request."""
    if p7b.get("skipped"):
        print("P7b was skipped: no plot")
        return
    vs = p7b["variants"]
    names = {"plain": "memcached\n(gcc)", "molt": "memcached (moltcc,\nall updatable)",
             "molt-patched": "molt + live patch\n(stats-live)",
             "plain-2": "2nd plain process\n(A/A control)"}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.6))
    for i, v in enumerate(vs):
        s = p7b["get_rps"][v]
        ax.bar(i, s["median"] / 1e3, 0.6, yerr=[[x / 1e3 for x in e] for e in err(s)], capsize=4,
               color=COLORS[v])
        ax.plot([i] * len(p7b["runs"][v]), [x["get_rps"] / 1e3 for x in p7b["runs"][v]], "k.",
                alpha=0.4)
        c = p7b["server_cpu_ns_per_request"][v]
        bx.bar(i, c["median"] / 1e3, 0.6, yerr=[[x / 1e3 for x in e] for e in err(c)], capsize=4,
               color=COLORS[v])
        bx.plot([i] * len(p7b["runs"][v]), [x["cpu_ns_per_request"] / 1e3 for x in p7b["runs"][v]],
                "k.", alpha=0.4)
    for a in (ax, bx):
        a.set_xticks(range(len(vs)))
        a.set_xticklabels([names[v] for v in vs], fontsize=8)
        a.grid(axis="y", alpha=0.3)
    ax.set_ylabel("thousand GETs/s (memcslap)")
    bx.set_ylabel("server CPU µs per request (schedstat)")
    r = p7b["ratio"]
    t = "molt/plain = %.1f%% (per-round median %.1f%%)" % (r["ratio"] * 100, r["round_median"] * 100)
    if "patched_ratio" in p7b:
        t += "; patched %.1f%%" % (p7b["patched_ratio"]["ratio"] * 100)
    if "aa_ratio" in p7b:
        t += "; A/A %.1f%%" % (p7b["aa_ratio"]["ratio"] * 100)
    ax.set_title("P7b: memcached GET throughput\n" + t, fontsize=9)
    e = p7b["cpu_efficiency"]
    bx.set_title("server CPU per request\nplain/molt = %.1f%% (target >= 98%%, PSU MySQL 95.02%%)"
                 % (e["ratio"] * 100), fontsize=9)
    save(fig, "p7b_memcached.png")


def main():
    for name, fns in (("p1", [fig_5_1, fig_5_2]), ("p2", [fig_5_3]), ("p3", [fig_5_4]),
                      ("p4", [fig_5_5]), ("p5", [fig_5_6]), ("p6", [fig_p6]), ("p7", [fig_5_7]),
                      ("p7b", [fig_p7b])):
        d = bl.load(name)
        if not d or "error" in d:
            print("no results for %s: no plot" % name)
            continue
        for fn in fns:
            try:
                fn(d)
            except Exception as e:  # a plot must not stop the others
                print("plot %s failed: %r" % (fn.__name__, e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
