#!/usr/bin/python3
"""P11: the cost of `molt attach` (issue 13; docs/guarantees.md P11).

    bench/attach/bench.py [--molt-build DIR] [--quick] [--runs N] [--threads 1,10,100,1000]
                          [--funcs 1,16,64,256] [--modes blocked,busy] [--server-work DIR]
                          [--work DIR] [--busy-crowd-runs N] [--no-compare] [--no-report]

Part 1, a generated target (target.c here: F functions f0..f(F-1) of a
few instructions each, noinline; T threads, either *blocked* in read() on
a pipe that never gets data, or *busy*, calling the F functions in a loop
through a table), built with plain gcc -O2; its attach patch (new versions
of all F functions) built with `moltcc --molt-attach`.  For every threads
x functions x mode: N times `molt attach` then `molt rollback` on one
process; the stop (the time every thread was stopped, as molt attach
reports it), the attempts, and the whole `molt attach` command's wall time
(from the fork of its process to its exit: reading the patch, planning,
staging, the stop, the record), with where it went (molt's `took` line:
start -- its process's creation to its first step, at raised priority --
prepare, staging, stop, finish).  p50 / p99 / max over the N runs.  The
target is started in a session of its own, as a service is (a session is
a scheduling group of its own under autogroup); the comparison rows at
100 and 1000 busy threads run it in the harness's session instead -- molt
and the target one group -- with molt as is and under `chrt -f 1`.  The
harness runs at SCHED_FIFO 2 while it measures (reset on fork: the target
and molt start at the normal policy, as from a shell), so its own wait for
a CPU when molt exits is not counted.

Part 2, a real server: memcached as examples/attach/run.sh builds it
(plainly, SASL), under the checking load of examples/attach/mcsasl.py (4
clients); the SASL fix attached at 2 s of a 4 s load, N times on fresh
servers: throughput and latency of the load in 100 ms windows -- the
window of the attach against the median window before it.  Skipped, with
the reason, when that build is missing (run examples/attach/run.sh first).

Writes bench/results/attach.json and attach.md and puts the section into
bench/RESULTS.md between its markers.  Targets (P11): <= 5 ms stopped at
100 threads, <= 100 ms total.  Not part of bench/run.sh; not in CI.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(ROOT, "bench", "results")
BEGIN, END = "<!-- attach: begin -->", "<!-- attach: end -->"
STOP_TARGET_MS, TOTAL_TARGET_MS = 5.0, 100.0


def sh(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


# ---------------------------------------------------------------------------
# Part 1: the generated target
# ---------------------------------------------------------------------------

# A function of the target: a loop of 64 dependent steps (about 200
# instructions a call), so that a busy thread spends a few percent of its
# time in the first bytes that a jump replaces -- not a whole function of
# three instructions, which 100 threads calling it back to back keep
# occupied at every stop (see bench/README.md).
BODY = ("__attribute__((noinline)) long f%d(long x) {\n"
        "  long r = x;\n"
        "  for (int i = 0; i < 64; i++)\n"
        "    r = (r * %d + %d) ^ (r >> 7);\n"
        "  return r;\n"
        "}\n")


def build_target(work, nfuncs, molt_build):
    """(program, patch) for nfuncs functions, cached in work."""
    d = os.path.join(work, "f%d" % nfuncs)
    exe, so = os.path.join(d, "target"), os.path.join(d, "fix.so")
    if os.path.exists(exe) and os.path.exists(so):
        return exe, so
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(HERE, "target.c")) as f:
        main = f.read()
    funcs = "".join(BODY % (i, 3, i) for i in range(nfuncs))
    table = "long (*const table[NFUNCS])(long) = {%s};\n" % ", ".join(
        "f%d" % i for i in range(nfuncs))
    src = os.path.join(d, "target.c")
    with open(src, "w") as f:
        f.write("#define NFUNCS %d\n" % nfuncs + funcs + table + main)
    r = sh(["gcc", "-O2", "-g", "-pthread", "-o", exe, src])
    if r.returncode:
        raise SystemExit(r.stderr)
    fix = os.path.join(d, "fix.c")
    with open(fix, "w") as f:
        f.write("".join(BODY.replace("__attribute__((noinline)) ", "") % (i, 5, i)
                        for i in range(nfuncs)))
    r = sh([os.path.join(molt_build, "bin", "moltcc"), "--molt-attach", "--molt-target", exe,
            "-O2", "-o", so, fix])
    if r.returncode:
        raise SystemExit(r.stderr)
    return exe, so


TOOK = re.compile(r"^took ([\d.]+) ms \((.*)\)$", re.M)
PRIORITY = re.compile(r"^priority (.*?)(?:; before its first step molt waited ([\d.]+) ms for "
                      r"a CPU)?$", re.M)


def took(out):
    """molt's `took` line as {step: ms}, its priority line and wait."""
    m = TOOK.search(out)
    steps = {}
    if m:
        for part in m.group(2).split(", "):
            name, ms = part.rsplit(" ", 1)
            steps[name] = float(ms)
    p = PRIORITY.search(out)
    return steps, (p.group(1) if p else None), (float(p.group(2)) if p and p.group(2) else None)


def run_target(exe, so, threads, mode, runs, molt, timeout=5, own_session=True, prefix=()):
    p = subprocess.Popen([exe, str(threads), mode], stdout=subprocess.PIPE, text=True,
                         start_new_session=own_session)
    out = {"threads": threads, "mode": mode, "stop_ms": [], "total_ms": [], "attempts": [],
           "rollback_stop_ms": [], "rollback_total_ms": [], "steps": [], "waited_ms": [],
           "priority": None, "own_session": own_session, "prefix": list(prefix),
           "errors": []}
    try:
        line = p.stdout.readline()
        if not line.startswith("ready"):
            out["errors"].append("target did not start: %r" % line)
            return out
        time.sleep(0.2)
        for _ in range(runs):
            t0 = time.monotonic()
            r = sh(list(prefix) + [molt, "attach", "--timeout", str(timeout), p.pid, so])
            total = (time.monotonic() - t0) * 1e3
            if r.returncode:
                out["errors"].append(r.stderr.strip())
                break
            m = re.search(r"(\d+) threads? stopped for ([\d.]+) ms \((\d+) attempt", r.stdout)
            out["stop_ms"].append(float(m.group(2)))
            out["attempts"].append(int(m.group(3)))
            out["total_ms"].append(round(total, 2))
            out["stopped"] = int(m.group(1))
            steps, prio, waited = took(r.stdout)
            out["steps"].append(steps)
            out["priority"] = prio
            if waited is not None:
                out["waited_ms"].append(waited)
            t0 = time.monotonic()
            rb = sh(list(prefix) + [molt, "rollback", "--timeout", "10", p.pid])
            out["rollback_total_ms"].append(round((time.monotonic() - t0) * 1e3, 2))
            if rb.returncode:
                # noted, and tried again (twice) so that the next attach
                # starts from the original program; the row ends if it
                # still fails
                out["errors"].append("rollback: " + rb.stderr.strip())
                rb = sh(list(prefix) + [molt, "rollback", "--timeout", "10", p.pid])
                if rb.returncode:
                    rb = sh(list(prefix) + [molt, "rollback", "--timeout", "10", p.pid])
                if rb.returncode:
                    out["errors"].append("rollback again: " + rb.stderr.strip())
                    break
            m = re.search(r"stopped for ([\d.]+) ms", rb.stdout)
            if m:
                out["rollback_stop_ms"].append(float(m.group(1)))
    finally:
        if os.path.exists("/run/molt/attach/%d" % p.pid):
            sh([molt, "rollback", p.pid])
        p.kill()
        p.wait()
    return out


def harness_raise():
    """The harness at SCHED_FIFO 2 while it measures, its children reset to
    the normal policy at fork: its wake-up when molt exits is not counted.
    Returns what it runs at."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(2))
        return "SCHED_FIFO 2 (children reset to the normal policy at fork)"
    except (OSError, AttributeError) as e:
        return "normal (could not raise: %s)" % e


def harness_lower():
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass


def stats(xs):
    if not xs:
        return None
    return {"p50": pct(xs, 0.5), "p99": pct(xs, 0.99), "max": max(xs), "n": len(xs)}


# ---------------------------------------------------------------------------
# Part 2: memcached (examples/attach)
# ---------------------------------------------------------------------------

def run_server(server_work, molt, runs, port0):
    sys.path.insert(0, os.path.join(ROOT, "examples", "attach"))
    import mcsasl
    import memcached as ex
    tree = os.path.join(server_work, ex.SRC)
    so = os.path.join(server_work, ex.FIXES[0][0].replace(".patch", ".so"))
    if not os.path.exists(os.path.join(tree, "memcached")) or not os.path.exists(so):
        return {"skipped": "no memcached build and patch in %s: run examples/attach/run.sh "
                           "(MOLT_ATTACH_WORK=%s) first" % (server_work, server_work)}
    out = {"runs": []}
    for k in range(runs):
        port = ex.free_port(port0)
        mc = ex.Memcached(server_work, tree, port, 4)
        load = mcsasl.Load(port, ex.USER, "first", 4)
        try:
            load.start()
            time.sleep(2.0)
            mark = time.time() - load.t0
            r = sh([molt, "attach", mc.pid, so])
            m = re.search(r"(\d+) threads stopped for ([\d.]+) ms", r.stdout)
            time.sleep(2.0)
            res = load.finish()
        finally:
            if not load.stop:
                load.finish()
            mc.close()
        w = res["windows"]
        before = [c for t, c, _ in w if 0.5 <= t < mark - 0.1]
        before_max = [x for t, _, x in w if 0.5 <= t < mark - 0.1]
        at = [(c, x) for t, c, x in w if mark - 0.1 <= t < mark + 0.2]
        after = [c for t, c, _ in w if mark + 0.5 <= t < mark + 1.8]
        out["runs"].append({
            "attach_rc": r.returncode, "stop_ms": float(m.group(2)) if m else None,
            "threads": int(m.group(1)) if m else None, "mark_s": round(mark, 3),
            "requests": res["requests"], "failed": res["failed"],
            "per_window_before_median": pct(before, 0.5),
            "per_window_at_attach": [c for c, _ in at],
            "per_window_after_median": pct(after, 0.5),
            "slowest_ms_before_p50_window": pct(before_max, 0.5),
            "slowest_ms_before_max": max(before_max) if before_max else None,
            "slowest_ms_at_attach": max((x for _, x in at), default=None),
            "latency_ms": res["latency_ms"]})
    return out


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

def fmt(x, f="%.1f"):
    return f % x if x is not None else "–"


def shown_command(cmd):
    """The command as a reader would type it: without the --molt-build that
    run.sh passes, paths of the checkout relative to it."""
    words = cmd.split()
    out = []
    for i, word in enumerate(words):
        if word == "--molt-build" or (i and words[i - 1] == "--molt-build"):
            continue
        out.append(os.path.relpath(word, ROOT) if word.startswith(ROOT + os.sep) else word)
    return " ".join(out)


def section(res):
    L = []
    w = L.append
    w("## P11 — molt attach (issue 13)")
    w("")
    w("`%s` (%s). Machine: %s, %d CPUs, shared with other sessions' jobs; load average at "
      "the start %s, at the end %s. Harness: %s."
      % (shown_command(res.get("command", "bench/attach/run.sh")), res["date"], res["cpu"],
         res["ncpu"],
         res.get("load_start", "?"), res["load"], res.get("harness", "normal")))
    w("")
    w("**Targets:** ≤ %g ms stopped at 100 threads, ≤ %g ms for the whole `molt attach`. "
      "**Anchor:** POLUS, under 200 ms in total, about 30%% throughput dip during its update."
      % (STOP_TARGET_MS, TOTAL_TARGET_MS))
    w("")
    w("A generated target (`bench/attach/target.c`, gcc -O2), started in a session of its own "
      "as a service is: T threads *blocked* in `read()` or *busy* calling the F functions; its "
      "attach patch replaces all F. Per row %d x (1000 busy threads: %d x) `molt attach` + "
      "`molt rollback` on one process; *stop* = every thread stopped (as `molt attach` prints "
      "it); *total* = the `molt attach` command from the fork of its process to its exit; "
      "*start* = the part of it before molt's first step (from molt's `took` line: its "
      "process's creation to the raise of its priority -- the kernel's exec, the loader, and "
      "the wait for a first turn on a CPU). p50 / p99 / max in ms."
      % (res["runs"], res["busy_crowd_runs"]))
    w("")
    w("| threads | functions | mode | stop p50 | p99 | max | attempts max | total p50 | p99 | "
      "max | start p50 | start max | rollback stop p50 | rollback total p50 | note |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in res["rows"]:
        s, t, rb = row.get("stop"), row.get("total"), row.get("rollback_stop")
        rt, st = row.get("rollback_total"), (row.get("steps") or {}).get("start")
        note = "; ".join(row["errors"])[:160] if row["errors"] else ""
        if s is None:
            w("| %d | %d | %s | – | – | – | – | – | – | – | – | – | – | – | %s |" % (
                row["threads"], row["funcs"], row["mode"], note or "no run"))
            continue
        w("| %d | %d | %s | %.3f | %.3f | %.3f | %d | %.1f | %.1f | %.1f | %s | %s | %s | %s | "
          "%s |" % (row["threads"], row["funcs"], row["mode"], s["p50"], s["p99"], s["max"],
                    max(row["attempts"]), t["p50"], t["p99"], t["max"],
                    fmt(st and st["p50"]), fmt(st and st["max"]),
                    "%.3f" % rb["p50"] if rb else "–", fmt(rt and rt["p50"]), note))
    w("")
    # where the total goes, per step (p50 / max), at 100 threads and above
    w("Where the total goes (molt's `took` line, p50 / max per step, ms; *waited* = the part "
      "of *start* spent waiting for a CPU):")
    w("")
    w("| threads | functions | mode | target's session | total | start | waited | prepare | "
      "staging | stop | finish | molt's priority |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|")

    def pm(x):
        return "%s / %s" % (fmt(x["p50"]), fmt(x["max"])) if x else "–"
    for row in [r for r in res["rows"] if r["threads"] >= 100] + res.get("compare", []):
        if not row.get("total"):
            continue
        st = row.get("steps") or {}
        w("| %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            row["threads"], row["funcs"], row["mode"],
            row.get("variant", "own"), pm(row["total"]), pm(st.get("start")),
            pm(row.get("waited")), pm(st.get("prepare")), pm(st.get("staging")),
            pm(st.get("stop")), pm(st.get("finish")), row.get("priority") or "–"))
    w("")
    v = res["verdict"]
    w("**Verdict at 100 threads:** stop %s; total %s." % (v["stop"], v["total"]))
    if v.get("compare"):
        w("")
        w(v["compare"])
    w("")
    w("How to read the rows. *Blocked* threads stop at once: their stop is molt's own work "
      "(seize, interrupt and wait for each thread, read its registers and look at its stack, "
      "write the jumps). A *busy* thread stops when it next gets a CPU, so the stop of T busy "
      "threads also waits on the scheduler (2 CPUs shared with other sessions' jobs). molt "
      "runs at SCHED_FIFO 1 from its first step to its exit (the *priority* column); *start* "
      "is what came before, nearly all of it (*waited*) the wait of molt's new process for a "
      "first turn on a CPU, before it ran an instruction: the scheduler's, long when the "
      "target's busy threads are in molt's scheduling group (the *same session* rows; `chrt` "
      "typed there is a new process too and waits as long), about a slice when the target is "
      "a group of its own (the *own* rows, as a service runs). *Rollback total* includes "
      "waiting for the target's threads to leave the patch's code before it is unmapped.")
    w("")
    srv = res.get("server") or {}
    if srv.get("skipped"):
        w("**memcached:** skipped: %s." % srv["skipped"])
    elif srv.get("runs"):
        w("**memcached** (examples/attach: plainly built, SASL, 10 threads; 4 checking clients; "
          "the SASL fix attached at 2 s of a 4 s load, %d fresh servers). Requests per 100 ms "
          "window: median before the attach, the windows around it, median after; the slowest "
          "request of a window:" % len(srv["runs"]))
        w("")
        w("| run | stop ms | failed | req/window before | around the attach | after | "
          "slowest ms: median window before | worst before | around the attach |")
        w("|---|---|---|---|---|---|---|---|---|")
        for i, r in enumerate(srv["runs"], 1):
            w("| %d | %s | %d of %d | %s | %s | %s | %s | %s | %s |" % (
                i, r["stop_ms"], r["failed"], r["requests"], r["per_window_before_median"],
                ", ".join(map(str, r["per_window_at_attach"])), r["per_window_after_median"],
                r["slowest_ms_before_p50_window"], r["slowest_ms_before_max"],
                r["slowest_ms_at_attach"]))
    w("")
    w("Numbers: `bench/results/attach.json`.")
    w("")
    return "\n".join(L) + "\n"


def verdict(rows, compare=()):
    """Per mode, at 100 threads: the worst p50 and max over the function
    counts, against the targets; rows that ended early say so.  Then the
    comparison: the same-session rows, plain and under chrt."""
    out = {"stop": [], "total": []}
    for mode in ("blocked", "busy"):
        at100 = [r for r in rows if r["threads"] == 100 and r["mode"] == mode and r.get("stop")]
        failed = [r for r in rows if r["threads"] == 100 and r["mode"] == mode and r["errors"]]
        if not at100:
            continue
        tail = " (%d of its rows had a failure, in the note: %s)" % (len(failed), ", ".join(
            "%d functions" % r["funcs"] for r in failed)) if failed else ""
        for key, target, f in (("stop", STOP_TARGET_MS, "%.3f"), ("total", TOTAL_TARGET_MS, "%.1f")):
            p50 = max(r[key]["p50"] for r in at100)
            mx = max(r[key]["max"] for r in at100)
            out[key].append(("%s: p50 " + f + " ms (%s), max " + f + " ms (%s)%s") % (
                mode, p50, "holds" if p50 <= target else "**misses**", mx,
                "holds" if mx <= target else "**misses**", tail if key == "stop" else ""))
    res = {k: "; ".join(v) or "not measured" for k, v in out.items()}
    parts = []
    for r in compare:
        if r.get("total"):
            st = (r.get("steps") or {}).get("start")
            parts.append("%d busy threads, %s: total p50 %.1f / max %.1f ms, of it start p50 "
                         "%s / max %s ms" % (r["threads"], r["variant"], r["total"]["p50"],
                                             r["total"]["max"], fmt(st and st["p50"]),
                                             fmt(st and st["max"])))
        elif r.get("errors"):
            parts.append("%d busy threads, %s: %s" % (r["threads"], r["variant"],
                                                      "; ".join(r["errors"])[:120]))
    if parts:
        res["compare"] = "**The target in molt's session** (one scheduling group): " + \
            "; ".join(parts) + "."
    return res


def write_report(res, no_report=False):
    text = section(res)
    if no_report:
        print(text)
        return
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "attach.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(RESULTS, "attach.md"), "w") as f:
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
    print(text)


def make_row(r, nf):
    steps = {}
    for st in r["steps"]:
        for k, v in st.items():
            steps.setdefault(k, []).append(v)
    return {"threads": r["threads"], "funcs": nf, "mode": r["mode"], "errors": r["errors"],
            "attempts": r["attempts"], "stop": stats(r["stop_ms"]),
            "total": stats(r["total_ms"]), "rollback_stop": stats(r["rollback_stop_ms"]),
            "rollback_total": stats(r["rollback_total_ms"]),
            "steps": {k: stats(v) for k, v in steps.items()}, "waited": stats(r["waited_ms"]),
            "priority": r["priority"], "own_session": r["own_session"], "raw": r}


def print_row(row, label):
    s, t, st = row["stop"], row["total"], row["steps"].get("start")
    print("threads %4d funcs %3d %-7s %s stop p50 %s max %s  total p50 %s max %s  start p50 %s "
          "max %s  %s" % (row["threads"], row["funcs"], row["mode"], label, s and s["p50"],
                          s and s["max"], t and t["p50"], t and t["max"], st and st["p50"],
                          st and st["max"], "; ".join(row["errors"])[:120]), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--molt-build", default=os.environ.get("MOLT_BUILD",
                                                           os.path.join(ROOT, "build")))
    ap.add_argument("--work", default="/var/tmp/molt-bench-attach")
    ap.add_argument("--server-work", default=os.environ.get("MOLT_ATTACH_WORK",
                                                            "/var/tmp/molt-attach"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--threads", default="1,10,100,1000")
    ap.add_argument("--funcs", default="1,16,64,256")
    ap.add_argument("--modes", default="blocked,busy")
    ap.add_argument("--server-runs", type=int)
    ap.add_argument("--busy-crowd-runs", type=int, default=2,
                    help="runs of the rows with 1000 busy threads")
    ap.add_argument("--no-compare", action="store_true",
                    help="skip the same-session and chrt rows")
    ap.add_argument("--no-report", action="store_true", help="print only (the smoke run)")
    ap.add_argument("--report-only", action="store_true",
                    help="write the report again from results/attach.json")
    a = ap.parse_args()
    if a.report_only:
        with open(os.path.join(RESULTS, "attach.json")) as f:
            res = json.load(f)
        res["verdict"] = verdict(res["rows"], res.get("compare", []))
        write_report(res)
        return 0
    runs = a.runs or (3 if a.quick else 10)
    molt = os.path.join(a.molt_build, "bin", "molt")
    load_start = " ".join("%.2f" % x for x in os.getloadavg())
    harness = harness_raise()
    rows = []
    for nf in [int(x) for x in a.funcs.split(",")]:
        exe, so = build_target(a.work, nf, a.molt_build)
        for nt in [int(x) for x in a.threads.split(",")]:
            for mode in a.modes.split(","):
                # 1000 runnable threads hold the whole (shared) machine:
                # fewer runs there
                n = min(runs, a.busy_crowd_runs) if mode == "busy" and nt >= 1000 else runs
                row = make_row(run_target(exe, so, nt, mode, n, molt), nf)
                rows.append(row)
                print_row(row, "")
    # The comparison: the target in the harness's session (one scheduling
    # group with molt), molt as is and started real-time.
    compare = []
    if not a.no_compare:
        exe, so = build_target(a.work, 1, a.molt_build)
        for nt in [int(x) for x in a.threads.split(",") if int(x) >= 100]:
            n = min(runs, a.busy_crowd_runs) if nt >= 1000 else runs
            for label, prefix in (("same session", ()),
                                  ("same session, chrt -f 1", ("chrt", "-f", "1"))):
                row = make_row(run_target(exe, so, nt, "busy", n, molt, own_session=False,
                                          prefix=prefix), 1)
                row["variant"] = label
                compare.append(row)
                print_row(row, label)
    harness_lower()
    server = run_server(a.server_work, molt, a.server_runs or (1 if a.quick else 5), 27700)
    print("memcached: %s" % json.dumps(server)[:600], flush=True)
    res = {"quick": a.quick, "runs": runs, "busy_crowd_runs": a.busy_crowd_runs,
           "rows": rows, "compare": compare, "harness": harness, "server": server,
           "command": " ".join(["bench/attach/run.sh"] + sys.argv[1:]),
           "verdict": verdict(rows, compare), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load_start": load_start,
           "cpu": platform.processor() or "x86_64", "ncpu": os.cpu_count(),
           "load": " ".join("%.2f" % x for x in os.getloadavg())}
    try:
        with open("/proc/cpuinfo") as f:
            res["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    write_report(res, a.no_report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
