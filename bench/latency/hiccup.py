#!/usr/bin/env python3
"""hiccup.py — what an update takes from the workers: a hiccup meter in
each server, with and without a patch every 1.5 s, side by side in one run
with an A/A control (issue 14, item 4).

    MOLT_BUILD=... LAT_WORK=... python3 bench/latency/hiccup.py \\
        [--rounds 20] [--rate 8000] [--policies none,immediate,none2] [--threads-meter 1]

(run by hiccup.sh, which builds first.)  Three kvstores (by default: none,
immediate, none2) run under LD_PRELOAD=hiccup.so; latclient drives one at a
time in 3 s segments, in rounds ABC CBA ... as latbench.py does, and the
server that has the load is the one whose meter runs (hiccup.c: a thread
reading the clock in a tight loop, recording every gap).  `immediate` gets
a real `molt apply` every 1.5 s (+-50 ms), alternating two 11-function
patches; none and none2 get none -- none2 is the A/A control, how far two
identical servers differ.

Reported per server: the longest stall in a millisecond of metered time
(every gap counts in each millisecond it overlaps) at p99, p99.9 and max;
gaps >= 50 us per second; and, around the patch requests, the longest gap
that began within 0-100 ms after a request (for none/none2: after the same
grid of times).  Target: p99.9 of `immediate` within the A/A control's.
Writes results/hiccup.md and results/hiccup.json.
"""
import argparse
import json
import mmap
import os
import random
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import latbench as lb  # noqa: E402

SUB, BUCKETS, BIG_MAX = 16, 640, 65536
HEAD = struct.Struct("<8sII4Q")  # magic, on, threads, metered, reads, max, windows


def bucket_value(b):
    """Upper edge of bucket b (ns), the inverse of hiccup.c's bucket()."""
    if b < SUB:
        return b
    e = b // SUB + 3
    return ((SUB + b % SUB + 1) << (e - 4)) - 1


def read_meter(path):
    with open(path, "rb") as f:
        raw = f.read()
    magic, on, threads, metered, reads, maxgap, windows = HEAD.unpack_from(raw, 0)
    assert magic == b"HICCUP02", path
    off = HEAD.size
    wmax = struct.unpack_from("<%dQ" % BUCKETS, raw, off)
    off += 8 * BUCKETS
    gaps = struct.unpack_from("<%dQ" % BUCKETS, raw, off)
    off += 8 * BUCKETS
    (nbig,) = struct.unpack_from("<Q", raw, off)
    off += 8
    big = [struct.unpack_from("<QQ", raw, off + 16 * i) for i in range(min(nbig, BIG_MAX))]
    return {"metered_ns": metered, "reads": reads, "max_gap_ns": maxgap, "windows": windows,
            "window_max": wmax, "gaps": gaps, "nbig": nbig, "big": sorted(big)}


def hist_pct(h, p):
    n = sum(h)
    if not n:
        return 0
    want, acc = p / 100.0 * n, 0
    for b, c in enumerate(h):
        acc += c
        if acc >= want:
            return bucket_value(b)
    return bucket_value(len(h) - 1)


class Meter:
    def __init__(self, path):
        self.path = path
        self.f = None

    def set(self, on):
        if self.f is None:
            fd = os.open(self.path, os.O_RDWR)
            self.f = mmap.mmap(fd, HEAD.size)
            os.close(fd)
        struct.pack_into("<I", self.f, 8, 1 if on else 0)


RESAMPLES = 2000


def p999_verdicts(segs, policies, rounds, resamples=RESAMPLES, seed=20261206):
    """The verdict of issue 14 item 4, for the segments of `rounds`.

    A point comparison of three p99.9s (the first version: "within" if
    immediate <= max(none, none2)) says "NOT within" about one time in
    three when the update does nothing at all.  Instead, a paired bootstrap
    over rounds (as report.py): resample the rounds with replacement, the
    same draw for every server, and recompute each server's p99.9 of the
    longest gap per millisecond from the resampled segments.  For each
    server p: d = p99.9(p) - p99.9(none) with its 95% interval; for none2
    that is the A/A difference, how far two identical servers differ in
    this run.  p is "within the A/A control's spread" when its d is no
    larger than the upper end of the A/A interval; the upper end of p's own
    interval is the largest added stall the data do not exclude.

    segs: dicts with "policy", "round" and "window_max" (a histogram).
    Returns {policy: {"d": [point, lo, hi], "within": bool}} in µs, or {}
    without none, none2 or 3 rounds."""
    if "none" not in policies or "none2" not in policies or len(rounds) < 3:
        return {}
    rounds = sorted(rounds)
    per = {p: {r: {} for r in rounds} for p in policies}
    for sg in segs:
        if sg["policy"] in per and sg["round"] in per[sg["policy"]]:
            h = per[sg["policy"]][sg["round"]]
            for b, c in enumerate(sg["window_max"]):
                if c:
                    h[b] = h.get(b, 0) + c

    def p999(p, weights):
        tot = [0] * BUCKETS
        for r, w in weights.items():
            for b, c in per[p][r].items():
                tot[b] += w * c
        return hist_pct(tot, 99.9) / 1e3

    rng = random.Random(seed)
    boot = {p: [] for p in policies}
    for _ in range(resamples):
        w = {}
        for _ in rounds:
            r = rng.choice(rounds)
            w[r] = w.get(r, 0) + 1
        for p in policies:
            boot[p].append(p999(p, w))
    ones = {r: 1 for r in rounds}
    point = {p: p999(p, ones) for p in policies}
    res = {}
    for p in policies:
        if p == "none":
            continue
        d = sorted(x - y for x, y in zip(boot[p], boot["none"]))
        res[p] = {"d": [point[p] - point["none"], d[int(0.025 * len(d))],
                        d[int(0.975 * len(d)) - 1]]}
    ahi = res["none2"]["d"][2]
    for p in res:
        res[p]["within"] = res[p]["d"][0] <= ahi
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--rate", type=float, default=8000)
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--threads", type=int, default=4, help="kvstore worker threads")
    ap.add_argument("--policies", default="none,immediate,none2")
    ap.add_argument("--threads-meter", type=int, default=1)
    ap.add_argument("--jitter-ms", type=float, default=50)
    ap.add_argument("--timeout", type=float, default=1.0)
    ap.add_argument("--window-ms", type=float, default=100,
                    help="a gap that begins this soon after a patch request is its")
    ap.add_argument("--cli-sched", choices=["normal", "fifo"], default="normal",
                    help="scheduling of the `molt apply` process: normal (default: the "
                         "operator's tool competes with other jobs, not with the server, "
                         "and the meter sees what the update does inside the server) or "
                         "fifo (as the servers: the CLI's own CPU time preempts the meter "
                         "too, which on 2 CPUs is most of what it sees)")
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    cfg = ap.parse_args()
    cfg.work = os.environ.get("LAT_WORK", "/tmp/molt-latency")
    cfg.molt_build = os.environ.get("MOLT_BUILD", "/tmp/lat-build")
    policies = cfg.policies.split(",")
    # As latbench.py: everything the run starts inherits SCHED_FIFO 10, so
    # that other jobs on a shared machine do not make the stalls; the meter
    # thread moves itself below (FIFO 1, hiccup.c).
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        cfg.sched = "fifo"
    except (PermissionError, OSError):
        cfg.sched = "normal"
    molt = os.path.join(cfg.molt_build, "bin", "molt")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    data = os.path.join(cfg.work, "hiccup", stamp)
    os.makedirs(data)
    lb.log(f"hiccup: {len(policies)} servers x {cfg.rounds} rounds of {lb.SEGMENT_S:g} s; "
           f"{cfg.rate:g} req/s; raw data in {data}")
    order = lb.schedule(policies, cfg.rounds, False)

    # The CLI's scheduling.  The driver itself drops to SCHED_OTHER once
    # the servers and the client run (below), so `normal` needs nothing:
    # the CLI inherits it, and the fork happens at normal priority.  An
    # earlier version forked the CLI from the driver at FIFO 10 and
    # lowered the child in preexec_fn: the driver's copy-on-write faults
    # after fork() and the child's Python code before exec then ran at
    # FIFO 10 on both CPUs for ~0.5-0.9 ms and stalled the meter -- the
    # "stall after any control request" of the first runs (RESULTS.md).
    def cli_sched():
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))

    cli_preexec = cli_sched if cfg.cli_sched == "fifo" and cfg.sched == "fifo" else None

    servers, logs, meters = [], [], []
    seed = time.time_ns() % 1_000_000
    rnd = random.Random(seed)
    marks = []
    try:
        for p in policies:
            path = os.path.join(data, f"meter-{p}.bin")
            os.environ["LD_PRELOAD"] = os.path.join(cfg.work, "hiccup.so")
            os.environ["MOLT_HICCUP_FILE"] = path
            os.environ["MOLT_HICCUP_THREADS"] = str(cfg.threads_meter)
            logs.append(open(os.path.join(data, f"server-{p}.log"), "w"))
            servers.append(lb.start_server(cfg, p, logs[-1]))
            meters.append(Meter(path))
        for k in ("LD_PRELOAD", "MOLT_HICCUP_FILE", "MOLT_HICCUP_THREADS"):
            del os.environ[k]
        t_start = time.monotonic_ns() + int(lb.LEAD_IN_S * 1e9)
        client = subprocess.Popen(
            [os.path.join(cfg.work, "latclient"),
             "--port", ",".join(str(s["port"]) for s in servers),
             "--conns", str(cfg.conns), "--rate", str(cfg.rate),
             "--duration", str(len(order) * lb.SEGMENT_S), "--segment", str(lb.SEGMENT_S),
             "--order", ",".join(map(str, order)), "--start-ns", str(t_start),
             "--out", os.path.join(data, "requests.bin")],
            stdout=subprocess.PIPE, text=True)
        # Everything that measures or is measured now runs at FIFO 10 (the
        # servers, the client) or 1 (the meters); the driver only sleeps,
        # switches meters, snapshots files and starts CLIs.  None of that
        # is the server's work, so none of it may preempt a meter: the
        # driver drops to SCHED_OTHER.  Its wake-ups may then be late by
        # a few ms on a busy machine: a request's time is taken when it
        # is actually sent, and a meter switched late meters a little less.
        if cfg.sched == "fifo":
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        n_applied = {p: 0 for p in policies}
        segs = []
        pids = [sv["pid"] for sv in servers] + [client.pid]
        cpu = [lb.cpu_sample(pids)]
        for seg, si in enumerate(order):
            srv = servers[si]
            lb.sleep_until_ns(t_start + int(seg * lb.SEGMENT_S * 1e9))
            meters[si].set(True)
            for at in lb.REQUESTS_AT_S:
                due = t_start + int((seg * lb.SEGMENT_S + at) * 1e9)
                due += int(rnd.uniform(-cfg.jitter_ms, cfg.jitter_ms) * 1e6)
                lb.sleep_until_ns(due)
                t0 = time.monotonic_ns()
                m = {"policy": srv["policy"], "request_ns": t0, "rc": None}
                if srv["policy"] == "status":
                    # Control: the CLI and a control-channel round trip
                    # (`molt status` scans the stacks as an apply does), no
                    # update.
                    r = subprocess.run([molt, "status", str(srv["pid"])], capture_output=True,
                                       text=True, preexec_fn=cli_preexec)
                    m["rc"] = r.returncode
                elif srv["policy"] not in ("none", "none2"):
                    n = n_applied[srv["policy"]]
                    n_applied[srv["policy"]] += 1
                    patch = os.path.join(srv["patch_dir"], lb.PATCHES[n % 2])
                    r = subprocess.run([molt, "apply", str(srv["pid"]), patch, "--policy",
                                        srv["molt_policy"], "--timeout", str(cfg.timeout)],
                                       capture_output=True, text=True, preexec_fn=cli_preexec)
                    m["rc"] = r.returncode
                    if r.returncode:
                        lb.log(f"  apply failed: {(r.stdout + r.stderr).strip()[-200:]}")
                m["done_ns"] = time.monotonic_ns()
                marks.append(m)
            lb.sleep_until_ns(t_start + int((seg + 1) * lb.SEGMENT_S * 1e9))
            meters[si].set(False)
            # The segment's own numbers: the meter's file is cumulative, so
            # a snapshot after each segment (once the meter has merged its
            # last stretch) gives them as differences.  With the time the
            # hypervisor stole meanwhile, for the quiet-round filter.
            time.sleep(0.02)
            cpu.append(lb.cpu_sample(pids))
            segs.append({"policy": srv["policy"], "round": seg // len(policies),
                         "from_ns": t_start + int(seg * lb.SEGMENT_S * 1e9),
                         "to_ns": time.monotonic_ns(),
                         "meter": read_meter(meters[si].path),
                         "steal_jiffies": cpu[-1][2] - cpu[-2][2]})
            if (seg + 1) % (3 * len(policies)) == 0:
                lb.log(f"  segment {seg + 1}/{len(order)}")
        cout, _ = client.communicate()
    finally:
        for s in servers:
            s["proc"].kill()
            s["proc"].wait()
        for f in logs:
            f.close()
    time.sleep(0.1)
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    out = {"config": vars(cfg) | {"policies": policies, "seed": seed}, "servers": {},
           "quiet": {}}
    os.makedirs(cfg.results, exist_ok=True)
    # Per segment: its histogram and gaps as differences of snapshots.
    last = {}
    for sg in segs:
        m, prev = sg["meter"], last.get(sg["policy"])
        sg["window_max"] = [a - (prev["window_max"][i] if prev else 0)
                            for i, a in enumerate(m["window_max"])]
        sg["metered_ns"] = m["metered_ns"] - (prev["metered_ns"] if prev else 0)
        sg["big"] = [(st, g) for st, g in m["big"] if sg["from_ns"] <= st < sg["to_ns"]]
        # The file keeps the last BIG_MAX gaps >= 50 us: more in one
        # segment and its earliest are lost (counted, reported below).
        sg["big_lost"] = max(0, m["nbig"] - (prev["nbig"] if prev else 0) - BIG_MAX)
        last[sg["policy"]] = m
    # A quiet round: the hypervisor stole at most 1 jiffy (10 ms) in each
    # of its segments.  The filter never looks at the gaps.
    quiet_rounds = {r for r in range(cfg.rounds)
                    if all(sg["steal_jiffies"] <= 1 for sg in segs if sg["round"] == r)}

    def summarize(p, rounds):
        ss = [sg for sg in segs if sg["policy"] == p and sg["round"] in rounds]
        hist = [sum(sg["window_max"][i] for sg in ss) for i in range(BUCKETS)]
        metered = sum(sg["metered_ns"] for sg in ss) / 1e9
        big = [b for sg in ss for b in sg["big"]]
        reqs = [m for m in marks if m["policy"] == p and
                any(sg["from_ns"] <= m["request_ns"] < sg["to_ns"] for sg in ss)]
        after = []
        for m in reqs:
            lo, hi = m["request_ns"], m["request_ns"] + int(cfg.window_ms * 1e6)
            g = [gap for start, gap in big if lo <= start < hi]
            after.append(max(g) / 1e3 if g else 0)
        return {"metered_s": metered, "ms_p99_us": hist_pct(hist, 99) / 1e3,
                "ms_p999_us": hist_pct(hist, 99.9) / 1e3,
                "max_us": max((g for _, g in big), default=0) / 1e3,
                "big_per_s": len(big) / max(metered, 1e-9), "requests": len(reqs),
                "failed": sum(1 for m in reqs if m["rc"]), "after_request_max_us": after,
                "rounds": len(rounds)}

    def table(key):
        rows = []
        for p in policies:
            r = out[key][p]
            a = sorted(r["after_request_max_us"])
            rows.append("| %s | %.1f | %.0f | %.0f | %.0f | %.1f | %s |" % (
                p, r["metered_s"], r["ms_p99_us"], r["ms_p999_us"], r["max_us"],
                r["big_per_s"],
                "%.0f / %.0f (%d%s)" % (a[len(a) // 2], a[-1], len(a),
                                        ", %d failed" % r["failed"] if r["failed"] else "")
                if a else "-"))
        return ["| server | metered s | p99 µs | p99.9 µs | max µs | gaps ≥ 50 µs /s | "
                "after a request µs |", "|---|---|---|---|---|---|---|"] + rows

    for p in policies:
        out["servers"][p] = summarize(p, set(range(cfg.rounds)))
        out["quiet"][p] = summarize(p, quiet_rounds)
    with open(os.path.join(data, "marks.json"), "w") as f:
        json.dump({"marks": marks, "segments": [
            {k: v for k, v in sg.items() if k != "meter"} for sg in segs]}, f)
    md = ["## Hiccups: the longest stall of a thread in the server, per millisecond",
          "",
          "%d rounds of %g s segments per server, %g requests/s, %d kvstore workers, %d meter "
          "thread(s) (metering 9 ms of every 10), scheduling %s (the meter at FIFO 1, below "
          "the server's threads; the driver at SCHED_OTHER), `molt apply` at %s; `immediate` gets `molt apply` every "
          "1.5 s; `status` gets `molt status` instead (the CLI and a request, no update); "
          "`none2` is the A/A control. Columns: metered seconds; the longest gap in a "
          "millisecond (a gap counts in every millisecond it overlaps) at p99 and p99.9, µs; "
          "the longest gap, µs; gaps ≥ 50 µs per second; the longest gap beginning within "
          "%g ms after a patch request (or the same grid of times), median / max over the "
          "requests, µs." % (cfg.rounds, lb.SEGMENT_S, cfg.rate, cfg.threads,
                             cfg.threads_meter, cfg.sched, cfg.cli_sched, cfg.window_ms),
          "", "All rounds:", ""] + table("servers") + [
          "", "Quiet rounds (%d of %d: the hypervisor stole at most 10 ms in every segment "
          "of the round):" % (len(quiet_rounds), cfg.rounds), ""] + table("quiet")
    # How long each CLI took (request to exit): the 'after a request'
    # window is the --window-ms from the request on, so a CLI that took
    # longer (a busy machine: it runs at SCHED_OTHER) did its update after
    # the window.
    cli = []
    for p in policies:
        ms = sorted((m["done_ns"] - m["request_ns"]) / 1e6 for m in marks
                    if m["policy"] == p and m["rc"] is not None)
        if ms:
            cli.append("%s %.0f / %.0f ms (%d over %g ms)" % (
                p, ms[len(ms) // 2], ms[-1], sum(1 for x in ms if x > cfg.window_ms),
                cfg.window_ms))
    if cli:
        md += ["", "CLI time, request to exit, median / max: " + "; ".join(cli) + "."]
    lost = sum(sg["big_lost"] for sg in segs)
    if lost:
        md += ["", "**%d gaps >= 50 µs were not kept** (more than %d in a segment): the "
               "'after a request' column and the max miss them." % (lost, BIG_MAX)]
    for key, what, rounds in (("servers", "all rounds", set(range(cfg.rounds))),
                              ("quiet", "quiet rounds", quiet_rounds)):
        res = p999_verdicts(segs, policies, rounds)
        out["verdict_" + key] = res
        if not res:
            continue
        a, alo, ahi = res["none2"]["d"]
        md += ["", "p99.9 differences (%s, %d rounds; paired bootstrap over rounds, %d "
               "resamples, 95%% intervals): A/A none2 - none %+.0f µs [%+.0f, %+.0f]." % (
                   what, len(rounds), RESAMPLES, a, alo, ahi)]
        for p in policies:
            if p in ("none", "none2"):
                continue
            d, lo, hi = res[p]["d"]
            md.append(
                "%s - none %+.0f µs [%+.0f, %+.0f]: %s the A/A control's spread (added stall "
                "%+.0f µs vs the A/A interval's upper end %+.0f µs); the data do not exclude an "
                "added p99.9 stall of up to %.0f µs." % (
                    p, d, lo, hi, "within" if res[p]["within"] else "NOT within", d, ahi,
                    max(hi, 0)))
    md += ["", "Command: `bash bench/latency/hiccup.sh %s` (%s)." % (
        " ".join(sys.argv[1:]), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))]
    os.makedirs(cfg.results, exist_ok=True)
    with open(os.path.join(cfg.results, "hiccup.json"), "w") as f:
        json.dump(out, f, indent=1)
    with open(os.path.join(cfg.results, "hiccup.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
