#!/usr/bin/env python3
"""report.py — analysis and plots for the kvstore latency benchmark (P8).

    report.py DATA_DIR [DATA_DIR...] [--results RESULTS_DIR]

DATA_DIR is what latbench.py wrote ($LAT_WORK/data/<stamp>); several are
pooled (their rounds add up; they must have the same policies).
RESULTS_DIR defaults to bench/latency/results.  Writes there:

  latency.json             every number below, per policy
  summary.md               the tables (pasted into RESULTS.md)
  latency_around_patch.png response rate and latency vs. time from the
                           patch request, over all requests (WFPATCH fig. 6)
  latency_patch_zoom.png   the first 20 ms after the request, 0.5 ms bins
  latency_cdf.png          CDF and tail (1 - CDF) of latency
  latency_hist.png         latency histograms, log counts (WFPATCH fig. 5)

Latency of a request = reply received - request *due* (open loop; see
latclient.c).  "svc" = reply received - request actually sent; "client
lag" = sent - due.

Uncertainty.  A p99.9 over a million requests looks precise, but it is
made by the ~0.1% slowest requests, and on a shared machine those cluster
in episodes of background activity.  Each round of the experiment holds one
3 s segment of every policy, close together in time, so the confidence
interval of p99.9(policy) / p99.9(none) is a *paired* bootstrap over
rounds: the same resampled rounds for every policy.  Percentiles inside the
bootstrap come from per-(round, policy) histograms on a log grid (0.2%
wide bins), which keeps 2000 resamples fast.
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REC = np.dtype([("sched", "<i8"), ("send", "<i8"), ("recv", "<i8"),
                ("conn", "<u4"), ("flags", "<u4")])
F_ERR, F_LOST = 2, 4
WIN_LO_MS, WIN_HI_MS, BIN_MS = -250, 700, 5  # around each patch request
NBINS = (WIN_HI_MS - WIN_LO_MS) // BIN_MS
ZOOM_LO_MS, ZOOM_HI_MS, ZOOM_BIN_MS = -5, 20, 0.5
ZOOM_SLOW_US = 100   # latency_patch_zoom.png: share of requests slower than this
NEAR_MS = 10         # "right after the request": [0, NEAR_MS) ms of due time
DISTURB_MS = 2       # where the CPU cost of an apply shows (latency_patch_zoom.png)
GRID = np.logspace(3, 10, 3501)  # histogram grid, ns: 1 us .. 10 s
COLORS = {"none": "#444444", "none2": "#aaaaaa", "immediate": "#1f77b4", "local": "#2ca02c",
          "global": "#d62728", "global-nowake": "#ff7f0e",
          "cli-status": "#9467bd"}
P8_LIMIT = 1.1
QUIET_CPUS = 0.3     # a "quiet" round: other jobs used at most this many CPUs
QUIET_STEAL = 0.004  # ... and the hypervisor stole at most one 10 ms tick per segment
MS = 1_000_000


def pct_from_hist(h, q):
    c = np.cumsum(h, axis=-1)
    idx = np.argmax(c >= np.ceil(c[..., -1:] * q / 100.0), axis=-1)
    return np.sqrt(GRID[idx] * GRID[idx + 1])


def summarize(x_ns):
    if len(x_ns) == 0:
        return {}
    p = np.percentile(x_ns, [50, 99, 99.9])
    return {"p50_us": p[0] / 1e3, "p99_us": p[1] / 1e3, "p999_us": p[2] / 1e3,
            "max_us": float(x_ns.max()) / 1e3, "mean_us": float(x_ns.mean()) / 1e3}


def binned(off, val, lo, hi, width):
    """count, max, p99, mean, p50 of val per bin of off (bins of `width`)."""
    nb = int(round((hi - lo) / width))
    bi = np.floor((off - lo) / width).astype(int)
    keep = (bi >= 0) & (bi < nb)
    bi, val = bi[keep], val[keep]
    order = np.argsort(bi, kind="stable")
    bi, val = bi[order], val[order]
    edges = np.searchsorted(bi, np.arange(nb + 1))
    out = {"count": [], "max": [], "p99": [], "mean": [], "p50": [], "p90": [], "slow_share": []}
    for k in range(nb):
        seg = val[edges[k]:edges[k + 1]]
        out["count"].append(int(len(seg)))
        out["p50"].append(float(np.median(seg)) if len(seg) else None)
        out["p90"].append(float(np.percentile(seg, 90)) if len(seg) else None)
        out["slow_share"].append(float((seg > ZOOM_SLOW_US).mean()) if len(seg) else None)
        out["max"].append(float(seg.max()) if len(seg) else None)
        out["p99"].append(float(np.percentile(seg, 99)) if len(seg) else None)
        out["mean"].append(float(seg.mean()) if len(seg) else None)
    return out


def stats(xs):
    if not xs:
        return None
    x = np.array(xs)
    return {"n": len(x), "p50": float(np.median(x)), "max": float(x.max())}


def load_run(data, round0, quiet_only=False):
    """One latbench run: per policy, its requests and patch requests, with
    rounds numbered from round0 (so that several runs can be pooled).
    quiet_only: keep only the requests and patch requests of quiet rounds."""
    with open(os.path.join(data, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(data, "run.json")) as f:
        run = json.load(f)
    with open(os.path.join(data, "requests.bin"), "rb") as f:
        if f.read(8) != b"MOLTLAT1":
            raise SystemExit(f"{data}/requests.bin: not a latclient file")
        n = int(np.frombuffer(f.read(8), "<u8")[0])
        rec = np.frombuffer(f.read(n * REC.itemsize), REC)
    policies = run["policies"]
    npol = len(policies)
    seg_ns = int(run["segment_s"] * 1e9)
    t0 = run["t_start_ns"]
    nrounds = len(run["order"]) // npol
    srv = (rec["conn"] >> 16).astype(int)
    rnd = (rec["sched"] - t0) // seg_ns // npol
    bad = (rec["flags"] & (F_ERR | F_LOST)) != 0
    bg = np.array(run.get("background_cpus", []))
    st = np.array(run.get("steal_cpus", []))
    # A round is quiet when, in every one of its segments, other jobs used
    # at most QUIET_CPUS and the hypervisor stole at most QUIET_STEAL.
    if len(bg) >= nrounds * npol and len(st) >= nrounds * npol:
        round_quiet = ((bg[:nrounds * npol].reshape(nrounds, npol).max(axis=1) <= QUIET_CPUS)
                       & (st[:nrounds * npol].reshape(nrounds, npol).max(axis=1) <= QUIET_STEAL))
    else:
        round_quiet = np.zeros(nrounds, bool)
    marks_all = run["marks"]
    if quiet_only:
        keep = round_quiet[np.clip(rnd, 0, nrounds - 1)]
        rec, srv, rnd, bad = rec[keep], srv[keep], rnd[keep], bad[keep]
        marks_all = [m for m in marks_all if round_quiet[m["segment"] // npol]]
    res = {"cfg": cfg, "client": run["client"], "policies": policies, "nrounds": nrounds,
           "background": bg, "steal": st, "round_quiet": round_quiet, "per": {}}
    for pi, p in enumerate(policies):
        mine = srv == pi
        ok = mine & ~bad
        r = rec[ok]
        lat = r["recv"] - r["sched"]
        d = {"lat": lat, "svc": r["recv"] - r["send"], "lag": r["send"] - r["sched"],
             "rnd": rnd[ok] + round0, "requests": int(mine.sum()),
             "errors": int((mine & ((rec["flags"] & F_ERR) != 0)).sum()),
             "lost": int((mine & ((rec["flags"] & F_LOST) != 0)).sum())}
        d["hists"] = [np.histogram(lat[rnd[ok] == k], GRID)[0] for k in range(nrounds)]
        marks = [m for m in marks_all if m["policy"] == p]
        info = run["servers"][p]
        sw = sorted(e["mono_ns"] for e in info["molt_log"] if e["event"] == "switch")
        ul = sorted(e["mono_ns"] for e in info["molt_log"] if e["event"] == "unload")
        d["apply_ms"], d["switch_ms"], d["unload_ms"] = [], [], []
        for m in marks:
            if m["rc"] is None:
                continue
            d["apply_ms"].append((m["done_ns"] - m["request_ns"]) / 1e6)
            if m["rc"] != 0:
                continue
            x = [t for t in sw if m["request_ns"] <= t <= m["done_ns"] + 5 * MS]
            if x:
                d["switch_ms"].append((x[0] - m["request_ns"]) / 1e6)
            x = [t for t in ul if m["request_ns"] <= t < m["request_ns"] + 1500 * MS]
            if x:
                d["unload_ms"].append((x[0] - m["request_ns"]) / 1e6)
        d["marks"] = len(marks)
        d["failed"] = sum(1 for m in marks if m["rc"] not in (None, 0))
        d["final_status"] = info.get("final_status")
        d["exit_status"] = info.get("exit_status")

        # Around each patch request.  Denominator of the response rate: how
        # much of each bin of each request's window belongs to it (a window
        # ends at the end of its segment or where the next one starts).
        mk = np.array([m["request_ns"] for m in marks], dtype=np.int64)
        mseg = np.array([m["segment"] for m in marks], dtype=np.int64)
        cov = np.zeros(NBINS)
        kb = np.arange(NBINS) * BIN_MS * MS
        for j, m in enumerate(mk):
            limit = t0 + (mseg[j] + 1) * seg_ns
            if j + 1 < len(mk):
                limit = min(limit, mk[j + 1] + WIN_LO_MS * MS)
            cov += np.clip((limit - (m + WIN_LO_MS * MS) - kb) / (BIN_MS * MS), 0, 1)
        d["coverage"] = cov
        for key, t in (("recv", r["recv"]), ("due", r["sched"])):
            # Each reply belongs to the latest request at most 250 ms after it.
            i = np.searchsorted(mk + WIN_LO_MS * MS, t, side="right") - 1
            sel = i >= 0
            off = np.full(len(t), np.iinfo(np.int64).max)
            off[sel] = t[sel] - mk[i[sel]]
            sel &= off < WIN_HI_MS * MS
            d["off_" + key] = off[sel] / MS
            d["lat_" + key] = lat[sel] / 1e3
        res["per"][p] = d
    return res


def verdict(s):
    """P8 for one policy, read together with its confidence interval."""
    r, (lo, hi) = s["ratio_p999"], s["ratio_p999_ci95"]
    if hi <= P8_LIMIT:
        return "holds (the whole 95% interval is within the limit)"
    if lo > P8_LIMIT:
        return "fails (the whole 95% interval is above the limit)"
    side = "within" if r <= P8_LIMIT else "above"
    return (f"point estimate {side} the limit, but the 95% interval "
            f"({lo:.2f}-{hi:.2f}) spans it: not resolved at this noise level")


def report(datas, results=None, quiet_only=False):
    """datas: one data directory or several (pooled: their rounds add up).
    quiet_only: everything (tables, plots) from the quiet rounds only."""
    if isinstance(datas, str):
        datas = [datas]
    results = results or os.path.join(HERE, "results")
    os.makedirs(results, exist_ok=True)
    runs, round0 = [], 0
    for d in datas:
        runs.append(load_run(d, round0, quiet_only))
        round0 += runs[-1]["nrounds"]
        if runs[-1]["policies"] != runs[0]["policies"]:
            raise SystemExit(f"{d}: other policies than {datas[0]}; cannot pool")
    policies = runs[0]["policies"]
    npol, nrounds = len(policies), round0
    cfg = runs[0]["cfg"]

    def cat(p, key):
        return np.concatenate([r["per"][p][key] for r in runs])

    def lst(p, key):
        return [x for r in runs for x in r["per"][p][key]]

    bg = np.concatenate([r["background"] for r in runs])
    st = np.concatenate([r["steal"] for r in runs])
    round_quiet = np.concatenate([r["round_quiet"] for r in runs])
    clients = [r["client"] for r in runs]
    out = {"config": cfg, "runs": [os.path.basename(d) for d in datas],
           "client": {k: sum(c.get(k, 0) for c in clients)
                      for k in ("requests", "completed", "errors", "lost")},
           "rounds": nrounds, "policies": {},
           "background_cpus": {"mean": float(bg.mean()) if len(bg) else None,
                               "max": float(bg.max()) if len(bg) else None,
                               "segments_over_half_a_cpu": int((bg > 0.5).sum())},
           "steal_cpus": {"mean": float(st.mean()) if len(st) else None,
                          "max": float(st.max()) if len(st) else None}}
    per = {}
    hists = np.zeros((npol, nrounds, len(GRID) - 1))
    for pi, p in enumerate(policies):
        lat = cat(p, "lat")
        per[p] = {"lat": lat, "rnd": cat(p, "rnd")}
        hists[pi] = np.array(lst(p, "hists"))
        last = runs[-1]["per"][p]
        out["policies"][p] = summarize(lat) | {
            "requests": sum(r["per"][p]["requests"] for r in runs),
            "errors": sum(r["per"][p]["errors"] for r in runs),
            "lost": sum(r["per"][p]["lost"] for r in runs),
            "patch_requests": sum(r["per"][p]["marks"] for r in runs),
            "apply_failed": sum(r["per"][p]["failed"] for r in runs),
            "svc": summarize(cat(p, "svc")),
            "client_lag": summarize(cat(p, "lag")),
            "apply_cli_ms": stats(lst(p, "apply_ms")),
            "switch_after_request_ms": stats(lst(p, "switch_ms")),
            "unload_after_request_ms": stats(lst(p, "unload_ms")),
            "final_status": last["final_status"],
            "server_exit_status": last["exit_status"]}

    # Paired bootstrap over rounds.
    rng = np.random.default_rng(20240)

    def paired_ci(rounds):
        """95% CI of p99.9(policy)/p99.9(none), resampling `rounds`."""
        H = hists[:, rounds]
        boot = []
        for _ in range(10):
            # 200 resamples at a time: W[s, k] = how often round k was drawn.
            idx = rng.integers(0, len(rounds), size=(200, len(rounds)))
            W = np.stack([np.bincount(row, minlength=len(rounds)) for row in idx]).astype(float)
            boot.append(pct_from_hist(np.einsum("prb,sr->psb", H, W), 99.9))
        boot = np.concatenate(boot, axis=1)  # (npol, 2000)
        r = boot / boot[0]
        return np.percentile(r, 2.5, axis=1), np.percentile(r, 97.5, axis=1)

    used = np.nonzero(round_quiet)[0] if quiet_only else np.arange(nrounds)
    if len(used) < 3:
        raise SystemExit(f"report: only {len(used)} usable rounds; nothing to compare")
    out["rounds_used"] = int(len(used))
    out["quiet_only"] = quiet_only
    lo, hi = paired_ci(used)
    round_p999 = pct_from_hist(hists[:, used], 99.9)  # (npol, len(used))
    base = out["policies"]["none"]
    for pi, p in enumerate(policies):
        s = out["policies"][p]
        s["ratio_p999"] = s["p999_us"] / base["p999_us"]
        s["ratio_p99"] = s["p99_us"] / base["p99_us"]
        s["ratio_p999_ci95"] = [float(lo[pi]), float(hi[pi])]
        s["p999_per_round_us"] = (round_p999[pi] / 1e3).round(1).tolist()
        s["ratio_p999_per_round_median"] = float(np.median(round_p999[pi] / round_p999[0]))

    # The same on the quiet rounds only (see load_run).  The filter looks at
    # the CPU use of other processes and the steal time only, never at
    # latency, and drops whole rounds, so it treats every policy alike.
    quiet = np.nonzero(round_quiet)[0]
    q = {"limit_cpus": QUIET_CPUS, "limit_steal": QUIET_STEAL, "rounds": int(len(quiet)),
         "policies": {}}
    if len(quiet) >= 3:
        lo, hi = paired_ci(quiet)
        p999 = {p: float(np.percentile(per[p]["lat"][np.isin(per[p]["rnd"], quiet)], 99.9))
                for p in policies}
        for pi, p in enumerate(policies):
            q["policies"][p] = {"p999_us": p999[p] / 1e3, "ratio_p999": p999[p] / p999["none"],
                                "ratio_p999_ci95": [float(lo[pi]), float(hi[pi])]}
    out["quiet_rounds"] = q

    # Around the patch request, and how many slow requests follow it.
    thresh_us = base["p999_us"]
    for p in policies:
        s = out["policies"][p]
        nm = max(s["patch_requests"], 1)
        cov = np.maximum(sum(r["per"][p]["coverage"] for r in runs), 1e-9)
        around = {"bin_start_ms": list(range(WIN_LO_MS, WIN_HI_MS, BIN_MS)), "marks": nm}
        for key in ("recv", "due"):
            offm, latu = cat(p, "off_" + key), cat(p, "lat_" + key)
            b = binned(offm, latu, WIN_LO_MS, WIN_HI_MS, BIN_MS)
            around[key] = {"rate_per_s": (np.array(b["count"]) / cov / (BIN_MS / 1e3)).tolist(),
                           "max_us": b["max"], "p99_us": b["p99"]}
        offm, latu = cat(p, "off_due"), cat(p, "lat_due")
        z = binned(offm, latu, ZOOM_LO_MS, ZOOM_HI_MS, ZOOM_BIN_MS)
        around["zoom_due"] = {"bin_start_ms": np.arange(ZOOM_LO_MS, ZOOM_HI_MS,
                                                        ZOOM_BIN_MS).tolist()} | {
            (k if k == "slow_share" else k + "_us"): v for k, v in z.items() if k != "count"}
        # Requests due in the first NEAR_MS after a patch request that are
        # slower than none's p99.9, per patch request, against the same
        # count for an equally long stretch before requests (chance level).
        slow = latu > thresh_us
        near = (offm >= 0) & (offm < NEAR_MS)
        before = (offm >= WIN_LO_MS) & (offm < 0)
        s["slow_after_request"] = {
            "threshold_us": thresh_us, "window_ms": NEAR_MS,
            "per_request": float((near & slow).sum()) / nm,
            "chance_per_request": float((before & slow).sum()) / nm * NEAR_MS / -WIN_LO_MS,
            "mean_latency_after_us": float(latu[near].mean()) if near.any() else None,
            "mean_latency_before_us": float(latu[before].mean()) if before.any() else None}
        # The disturbance itself, with statistics that background hiccups
        # hardly move: median and p90 of requests due in the first
        # DISTURB_MS after the request, against those due before it.
        first = (offm >= 0) & (offm < DISTURB_MS)
        s["disturbance"] = {
            "window_ms": DISTURB_MS, "requests": int(first.sum()),
            "p50_after_us": float(np.median(latu[first])) if first.any() else None,
            "p90_after_us": float(np.percentile(latu[first], 90)) if first.any() else None,
            "p50_before_us": float(np.median(latu[before])) if before.any() else None,
            "p90_before_us": float(np.percentile(latu[before], 90)) if before.any() else None}
        s["around_patch"] = around

    imm_local = [p for p in ("immediate", "local") if p in out["policies"]]
    out["p8"] = {"limit": P8_LIMIT,
                 "ratios": {p: out["policies"][p]["ratio_p999"] for p in imm_local},
                 "ci95": {p: out["policies"][p]["ratio_p999_ci95"] for p in imm_local},
                 "holds": all(out["policies"][p]["ratio_p999"] <= P8_LIMIT for p in imm_local),
                 "verdict": {p: verdict(out["policies"][p]) for p in imm_local}}
    if "none2" in out["policies"]:
        a = out["policies"]["none2"]
        out["p8"]["aa_control"] = {"ratio": a["ratio_p999"], "ci95": a["ratio_p999_ci95"],
                                   "consistent": a["ratio_p999_ci95"][0] <= 1.0
                                   <= a["ratio_p999_ci95"][1]}
    with open(os.path.join(results, "latency.json"), "w") as f:
        json.dump(out, f, indent=1)
    text = write_summary(out, policies, results)
    print(text)
    plots(out, per, policies, results)
    print(f"report: {results}/latency.json, summary.md, latency_*.png")
    return 0


def write_summary(out, policies, results):
    cfg = out["config"]
    c = out["client"]
    lines = [
        (f"{len(out['runs'])} runs pooled ({', '.join(out['runs'])}): " if len(out["runs"]) > 1
         else f"run {out['runs'][0]}: ")
        + f"{len(policies)} policies x {out['rounds']} rounds of {cfg['segment_s']:g} s segments "
        + (f"of which the {out['rounds_used']} QUIET rounds are used "
           f"({out['rounds_used'] * cfg['segment_s']:g} s of load per policy)"
           if out["quiet_only"] else f"({out['rounds'] * cfg['segment_s']:g} s of load per policy)")
        + f", {cfg['rate']:g} req/s "
        f"open loop over {cfg['conns']} connections, {cfg['threads']} workers, patch request "
        f"every {cfg['period_s']:g} s (±{cfg['jitter_ms']:g} ms), scheduling {cfg['sched']}; "
        f"client: {c.get('completed')}/{c.get('requests')} replies, {c.get('errors')} errors, "
        f"{c.get('lost')} lost; background load (other jobs) "
        f"{out['background_cpus']['mean']:.2f} CPUs on average, "
        f"{out['background_cpus']['max']:.2f} at most (of {cfg['nproc']}); steal "
        f"{out['steal_cpus']['mean']:.2f} CPUs on average, {out['steal_cpus']['max']:.2f} at most"
        + (" — QUICK run: indicative only" if cfg.get("quick") else ""), "",
        "| policy | requests | patch requests (failed) | p50 µs | p99 µs | p99.9 µs | max µs "
        "| p99.9 / none | 95% CI | median per-round ratio |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for p in policies:
        s = out["policies"][p]
        ci = s["ratio_p999_ci95"]
        pr = "—" if p in ("none", "none2") else f"{s['patch_requests']} ({s['apply_failed']})"
        lines.append(
            f"| {p} | {s['requests']} | {pr} | {s['p50_us']:.0f} | {s['p99_us']:.0f} | "
            f"{s['p999_us']:.0f} | {s['max_us']:.0f} | **{s['ratio_p999']:.2f}** | "
            f"{ci[0]:.2f}–{ci[1]:.2f} | {s['ratio_p999_per_round_median']:.2f} |")
    lines += ["", "| policy | `molt apply` (CLI) p50 / max ms | switched after p50 / max ms "
              f"| old patch unloaded after p50 ms | mean latency {NEAR_MS} ms after / before µs "
              f"| slow requests in the {NEAR_MS} ms after a request (chance) "
              f"| p50 / p90 µs of requests due {DISTURB_MS} ms after (before) "
              "| svc p99.9 µs | client lag p99.9 µs |",
              "|---|---|---|---|---|---|---|---|---|"]
    for p in policies:
        s = out["policies"][p]
        f = lambda d, k: f"{d[k]:.1f}" if d else "—"
        a, sw, ul = s["apply_cli_ms"], s["switch_after_request_ms"], s["unload_after_request_ms"]
        sa = s["slow_after_request"]
        lines.append(f"| {p} | {f(a, 'p50')} / {f(a, 'max')} | {f(sw, 'p50')} / {f(sw, 'max')} | "
                     f"{f(ul, 'p50')} | {sa['mean_latency_after_us']:.0f} / "
                     f"{sa['mean_latency_before_us']:.0f} | {sa['per_request']:.2f} "
                     f"({sa['chance_per_request']:.2f}) | "
                     f"{s['disturbance']['p50_after_us']:.0f} / {s['disturbance']['p90_after_us']:.0f} "
                     f"({s['disturbance']['p50_before_us']:.0f} / "
                     f"{s['disturbance']['p90_before_us']:.0f}) | "
                     f"{s['svc']['p999_us']:.0f} | {s['client_lag']['p999_us']:.0f} |")
    q = out.get("quiet_rounds")
    if q and q["policies"]:
        lines += ["", f"Quiet rounds only ({q['rounds']} of {out['rounds']}: other jobs used "
                  f"≤ {q['limit_cpus']} CPUs and the hypervisor stole ≤ 10 ms in each of their "
                  "segments): " + "; ".join(
                      f"{p} p99.9 {v['p999_us']:.0f} µs, {v['ratio_p999']:.2f}× "
                      f"[{v['ratio_p999_ci95'][0]:.2f}–{v['ratio_p999_ci95'][1]:.2f}]"
                      for p, v in q["policies"].items())]
    elif q:
        lines += ["", f"Quiet rounds only: {q['rounds']} of {out['rounds']} rounds had other "
                  f"jobs at ≤ {q['limit_cpus']} CPUs and ≤ 10 ms stolen per segment; too few "
                  "for a comparison."]
    p8 = out["p8"]
    lines += ["", f"slow = above none's p99.9 ({out['policies']['none']['p999_us']:.0f} µs); "
              "per patch request (for none: per point of the same grid); chance = the same "
              f"count for {NEAR_MS} ms of the 250 ms before requests.", "",
              "P8 (p99.9 under immediate and local ≤ %.1f× no patching), point estimates: "
              "%s (%s)" % (
                  p8["limit"], "HOLDS" if p8["holds"] else "DOES NOT HOLD",
                  ", ".join(f"{k} {v:.2f}× [CI {p8['ci95'][k][0]:.2f}–{p8['ci95'][k][1]:.2f}]"
                            for k, v in p8["ratios"].items()))]
    lines += [f"- {k}: {v}" for k, v in p8["verdict"].items()]
    if "aa_control" in p8:
        aa = p8["aa_control"]
        lines += [f"- A/A control (two unpatched servers): none2 / none = {aa['ratio']:.2f}× "
                  f"[CI {aa['ci95'][0]:.2f}–{aa['ci95'][1]:.2f}]: the noise floor of every ratio"]
        if not aa["ci95"][0] <= 1.0 <= aa["ci95"][1]:
            lines += ["- WARNING: the A/A interval excludes 1.0 — two identical servers differ "
                      "beyond the interval, so this run's noise exceeds what the intervals "
                      "account for; it cannot judge P8 (see the quiet-round line, or pool runs)"]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(results, "summary.md"), "w") as f:
        f.write(text)
    return text


def arr(xs):
    return np.array([v if v is not None else np.nan for v in xs], float)


def plots(out, per, policies, results):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib missing (apt-get install -y python3-matplotlib); no plots")
        return
    quick = " (quick run)" if out["config"].get("quick") else ""
    n = out["policies"][policies[-1]]["around_patch"]["marks"]

    # WFPATCH figure 6: what the clients see around a patch request.
    fig, ax = plt.subplots(3, 1, figsize=(9, 10), sharex=True)
    for p in policies:
        ar = out["policies"][p]["around_patch"]
        x = np.array(ar["bin_start_ms"]) + BIN_MS / 2
        c = COLORS.get(p)
        ax[0].plot(x, ar["recv"]["rate_per_s"], color=c, lw=1, label=p)
        ax[1].plot(x, arr(ar["recv"]["max_us"]) / 1e3, color=c, lw=1, label=p)
        ax[2].plot(x, arr(ar["due"]["max_us"]) / 1e3, color=c, lw=1, label=f"{p} max")
        ax[2].plot(x, arr(ar["due"]["p99_us"]) / 1e3, color=c, lw=1, ls=":", label=f"{p} p99")
    ax[0].set_ylabel("responses/s (by receive time)")
    ax[0].set_title(f"kvstore, around a patch request (t=0): {n} requests per policy, "
                    f"{BIN_MS} ms bins{quick}", fontsize=10)
    ax[1].set_ylabel("max latency, ms (by receive time)")
    ax[2].set_ylabel("latency, ms (by due time)")
    for a in ax[1:]:
        a.set_yscale("log")
    for a in ax:
        a.axvline(0, color="k", lw=0.5)
        a.grid(alpha=0.3)
    ax[0].legend(loc="lower right", fontsize=8)
    ax[2].legend(loc="upper right", fontsize=7, ncol=2)
    ax[2].set_xlabel("time since patch request (ms)")
    fig.tight_layout()
    fig.savefig(os.path.join(results, "latency_around_patch.png"), dpi=85)
    plt.close(fig)

    # Zoom on the first milliseconds: where the cost of an apply shows.
    # Median and p90 (robust against the rare hiccups of a shared machine)
    # and the share of requests slower than ZOOM_SLOW_US.
    fig, ax = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for p in policies:
        z = out["policies"][p]["around_patch"]["zoom_due"]
        x = np.array(z["bin_start_ms"]) + ZOOM_BIN_MS / 2
        c = COLORS.get(p)
        ax[0].plot(x, arr(z["p50_us"]), color=c, lw=1, label=f"{p} median")
        ax[0].plot(x, arr(z["p90_us"]), color=c, lw=1, ls=":", label=f"{p} p90")
        ax[1].plot(x, 100 * arr(z["slow_share"]), color=c, lw=1, label=p)
    ax[0].set_ylabel("latency, µs")
    ax[0].set_yscale("log")
    ax[1].set_ylabel(f"% of requests > {ZOOM_SLOW_US} µs")
    for a in ax:
        a.axvline(0, color="k", lw=0.5)
        a.grid(alpha=0.3, which="both")
    ax[0].legend(fontsize=7, ncol=2)
    ax[1].legend(fontsize=7)
    ax[0].set_title(f"first {ZOOM_HI_MS} ms after the patch request, by due time, "
                    f"{ZOOM_BIN_MS} ms bins{quick}", fontsize=10)
    ax[1].set_xlabel("time since patch request (ms)")
    fig.tight_layout()
    fig.savefig(os.path.join(results, "latency_patch_zoom.png"), dpi=85)
    plt.close(fig)

    # CDF and its tail.
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    for p in policies:
        lat = np.sort(per[p]["lat"]) / 1e3
        y = np.arange(1, len(lat) + 1) / len(lat)
        # Thin the curve: a sample of the body, all of the tail.
        keep = np.unique(np.concatenate([np.linspace(0, len(lat) - 1, 4000).astype(int),
                                         np.arange(max(0, len(lat) - 20000), len(lat))]))
        ax[0].plot(lat[keep], y[keep], color=COLORS.get(p), lw=1, label=p)
        ax[1].plot(lat[keep], 1 - y[keep] + 1 / len(lat), color=COLORS.get(p), lw=1, label=p)
    ax[0].set_ylabel("CDF")
    ax[1].set_yscale("log")
    ax[1].set_ylabel("1 - CDF")
    for q in (1e-2, 1e-3):
        ax[1].axhline(q, color="k", lw=0.4, ls="--")
    for a in ax:
        a.set_xscale("log")
        a.set_xlabel("latency (µs)")
        a.grid(alpha=0.3, which="both")
        a.legend(fontsize=8)
    fig.suptitle("kvstore latency, patch request every 1.5 s" + quick)
    fig.tight_layout()
    fig.savefig(os.path.join(results, "latency_cdf.png"), dpi=85)
    plt.close(fig)

    # WFPATCH figure 5: histograms with log counts, p99.9 marked.
    fig, ax = plt.subplots(len(policies), 1, figsize=(9, 2.2 * len(policies)), sharex=True)
    edges = np.logspace(0.5, 6, 120)
    for a, p in zip(np.atleast_1d(ax), policies):
        a.hist(per[p]["lat"] / 1e3, bins=edges, color=COLORS.get(p), log=True)
        s = out["policies"][p]
        a.axvline(s["p999_us"], color="k", ls="--", lw=0.8)
        a.text(0.99, 0.8, f"{p}: p99.9 {s['p999_us']:.0f} µs ({s['ratio_p999']:.2f}× none)",
               transform=a.transAxes, ha="right", fontsize=8)
        a.set_xscale("log")
        a.set_ylabel("requests")
    np.atleast_1d(ax)[-1].set_xlabel("latency (µs)")
    fig.tight_layout()
    fig.savefig(os.path.join(results, "latency_hist.png"), dpi=85)
    plt.close(fig)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="analysis and plots for bench/latency")
    ap.add_argument("data", nargs="+", help="latbench data directories (pooled)")
    ap.add_argument("--results", help="output directory (default bench/latency/results)")
    ap.add_argument("--quiet-only", action="store_true",
                    help="use only the quiet rounds (other jobs <= 0.3 CPUs and <= 10 ms "
                         "stolen in every segment) for everything")
    a = ap.parse_args()
    sys.exit(report(a.data, a.results, a.quiet_only))
