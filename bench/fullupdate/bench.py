#!/usr/bin/env python3
"""bench.py -- guarantee P9 for full updates, on examples/kvfull (see run.sh).

Measures
  1. steady-state throughput of kvfull v1 as a program image under
     `molt run` vs the same sources built as an ordinary executable
     (alternating runs, medians, spread);
  2. the update pause vs the state size (FILL n entries, n = 1K..1M), for
     v1 -> v2 (array -> chained hash table, by the hand-written variable
     rule of v2.xf) and v2 -> v3 (every entry replaced by the generated
     transformer: rev int -> long): the runtime's own pause from `molt
     update`, the update's total from `molt log`, and the pause a client
     sees -- from the moment `molt update` is started to the first reply of
     the new version;
  3. the transformation rate: objects migrated per second of pause.
and writes results/fullupdate.json, results/*.png and RESULTS.md.
"""

import argparse
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
KVFULL = os.path.join(ROOT, "examples", "kvfull")
RESULTS = os.path.join(HERE, "results")


def log(msg):
    print(msg, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, **kw)


class Server:
    """kvfull started as an image (`molt run`) or an executable."""

    def __init__(self, cmd):
        self.p = subprocess.Popen(cmd + ["--port", "0", "--workers", "2"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True)
        first = self.p.stdout.readline()
        m = re.search(r"127\.0\.0\.1:(\d+) pid (\d+)", first)
        if not m:
            self.p.kill()
            raise RuntimeError("kvfull did not start: %r" % first)
        self.port, self.pid = int(m.group(1)), int(m.group(2))

    def ask(self, line, timeout=600):
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall((line + "\n").encode())
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
            return buf.decode().strip()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                return self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
                return "killed"
        return self.p.returncode


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for l in f:
            if l.startswith("VmRSS:"):
                return int(l.split()[1])
    return None


def cpu_s(pid):
    """User + system CPU seconds of every thread of pid so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quart(xs):
    xs = sorted(xs)
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


# ---- 1. throughput ---------------------------------------------------------
def throughput(a, images, exe, kvload):
    runs = {"image": [], "exe": []}
    cpu = {"image": [], "exe": []}   # server CPU microseconds per request
    ratios, cpu_ratios = [], []
    for r in range(a.rounds):
        order = ("image", "exe") if r % 2 == 0 else ("exe", "image")
        got = {}
        for kind in order:
            cmd = [a.molt, "run", images[0]] if kind == "image" else [exe]
            srv = Server(cmd)
            try:
                assert srv.ask("FILL %d" % a.keys) == "FILLED %d" % a.keys
                c0 = cpu_s(srv.pid)
                out = sh([kvload, "tput", str(srv.port), str(a.conns), str(a.seconds),
                          str(a.keys)], timeout=a.seconds + 60).stdout
                c1 = cpu_s(srv.pid)
            finally:
                rc = srv.stop()
            m = re.search(r"requests (\d+) seconds ([0-9.]+) errors (\d+)", out)
            if not m or int(m.group(3)) or rc != 0:
                raise RuntimeError("throughput run failed (%s, exit %s): %s" % (kind, rc, out))
            rps = int(m.group(1)) / float(m.group(2))
            runs[kind].append(rps)
            cpu[kind].append((c1 - c0) / int(m.group(1)) * 1e6)
            got[kind] = rps
        ratios.append(got["image"] / got["exe"])
        cpu_ratios.append(cpu["image"][-1] / cpu["exe"][-1])
        log("  round %d: image %.0f req/s, executable %.0f req/s, ratio %.4f; "
            "server CPU/request %.2f vs %.2f us" % (r + 1, got["image"], got["exe"],
                                                   ratios[-1], cpu["image"][-1], cpu["exe"][-1]))
    med = {k: statistics.median(v) for k, v in runs.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    return {
        "cpu_us_per_request": cpu, "median_cpu_us": cmed,
        "cpu_ratio_of_medians": cmed["image"] / cmed["exe"],
        "cpu_round_ratio_iqr": quart(cpu_ratios),
        "rounds": a.rounds, "seconds_per_run": a.seconds, "connections": a.conns,
        "workers": 2, "keys": a.keys, "runs": runs, "round_ratios": ratios,
        "median_rps": med, "ratio_of_medians": med["image"] / med["exe"],
        "median_round_ratio": statistics.median(ratios),
        "round_ratio_iqr": quart(ratios),
        "min_max": {k: (min(v), max(v)) for k, v in runs.items()},
    }


def instructions(a, images, exe, kvload):
    """Server instructions per request under callgrind (deterministic, unlike
    time on a shared machine): counters zeroed after FILL, dumped after the
    load; every thread of the server counts."""
    import glob
    import shutil
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        return None
    cgdir = os.path.join(HERE, "build", "callgrind")
    os.makedirs(cgdir, exist_ok=True)
    out = {"image": [], "exe": []}
    for r in range(a.cg_runs):
        for kind in ("image", "exe") if r % 2 == 0 else ("exe", "image"):
            for f in glob.glob(os.path.join(cgdir, "cg.*")):
                os.unlink(f)
            cmd = [a.molt, "run", images[0]] if kind == "image" else [exe]
            srv = Server(["valgrind", "--tool=callgrind", "--trace-children=yes",
                          "--callgrind-out-file=" + os.path.join(cgdir, "cg.%p")] + cmd)
            try:
                assert srv.ask("FILL %d" % a.keys) == "FILLED %d" % a.keys
                sh(["callgrind_control", "-z", str(srv.pid)], timeout=60)
                res = sh([kvload, "tput", str(srv.port), str(a.conns), "3", str(a.keys)],
                         timeout=120).stdout
                sh(["callgrind_control", "-d", str(srv.pid)], timeout=60)
            finally:
                srv.stop()
            m = re.search(r"requests (\d+) seconds ([0-9.]+) errors (\d+)", res)
            dump = os.path.join(cgdir, "cg.%d.1" % srv.pid)
            ir = None
            with open(dump) as f:
                for l in f:
                    if l.startswith(("summary:", "totals:")):
                        ir = int(l.split()[1])
                        break
            if not m or int(m.group(3)) or ir is None:
                raise RuntimeError("callgrind run failed (%s): %s" % (kind, res))
            out[kind].append(ir / int(m.group(1)))
            log("  callgrind %s: %.0f instructions per request (%s requests)"
                % (kind, out[kind][-1], m.group(1)))
    med = {k: statistics.median(v) for k, v in out.items()}
    return {"per_request": out, "median": med, "ratio": med["image"] / med["exe"]}


# ---- 2. pause vs state size -------------------------------------------------
UPD = {
    "threads": re.compile(r"(\d+) threads? restarted"),
    "objects": re.compile(r"(\d+) objects? migrated"),
    "bytes": re.compile(r"objects? migrated \((\d+) bytes\)"),
    "pause_ms": re.compile(r"pause ([0-9.]+) ms"),
    "total_ms": re.compile(r"total ([0-9.]+) ms"),
}


def parse(text):
    out = {}
    for k, rx in UPD.items():
        m = rx.search(text)
        if m:
            out[k] = float(m.group(1)) if k.endswith("_ms") else int(m.group(1))
    return out


def one_update(a, srv, image, version, kvload):
    w = subprocess.Popen([kvload, "watch", str(srv.port), str(version), "120"],
                         stdout=subprocess.PIPE, text=True)
    assert w.stdout.readline().strip() == "ready"
    time.sleep(0.05)   # the watcher is in its request loop
    t_req = time.monotonic_ns()
    r = sh([a.molt, "update", str(srv.pid), image, "--timeout", "60"], timeout=600)
    t_cli = time.monotonic_ns()
    wout = w.communicate(timeout=180)[0]
    if r.returncode or w.returncode:
        raise RuntimeError("update to v%d failed: %s / watcher: %s" % (version, r.stdout, wout))
    m = re.search(r"first (\d+) sent (\d+) maxgap (\d+)", wout)
    res = parse(r.stdout)
    res.update(client_pause_ms=(int(m.group(1)) - t_req) / 1e6,
               client_max_wait_ms=int(m.group(3)) / 1e6,
               molt_update_ms=(t_cli - t_req) / 1e6)
    lg = sh([a.molt, "log", str(srv.pid)]).stdout
    ups = [l for l in lg.splitlines()[1:] if len(l.split()) > 3 and l.split()[3] == "update"]
    if ups:
        res["log_total_ms"] = parse(ups[-1]).get("total_ms")
    if "objects" in res and res.get("pause_ms"):
        res["objects_per_s"] = res["objects"] / (res["pause_ms"] / 1000)
    return res


def pauses(a, images, kvload):
    out = []
    for n in a.sizes:
        reps = a.reps if n < 1000000 else max(1, a.reps - 1)
        for rep in range(reps):
            srv = Server([a.molt, "run", images[0]])
            try:
                t0 = time.monotonic()
                assert srv.ask("FILL %d" % n) == "FILLED %d" % n
                fill_s = time.monotonic() - t0
                rss0 = rss_kib(srv.pid)
                u2 = one_update(a, srv, images[1], 2, kvload)
                ok2 = srv.ask("COUNT") == "COUNT %d" % n and \
                    srv.ask("GET fill:%d" % (n - 1)) == "VALUE value-%d" % (n - 1) and \
                    srv.ask("REV fill:0") == "REV 1"
                u3 = one_update(a, srv, images[2], 3, kvload)
                ok3 = srv.ask("COUNT") == "COUNT %d" % n and \
                    srv.ask("GET fill:%d" % (n // 2)) == "VALUE value-%d" % (n // 2) and \
                    srv.ask("INCR ctr") == "VALUE 1"
                rss1 = rss_kib(srv.pid)
            finally:
                rc = srv.stop()
            if not (ok2 and ok3) or rc != 0:
                raise RuntimeError("state check failed at n=%d (v2 %s, v3 %s, exit %s)"
                                   % (n, ok2, ok3, rc))
            rec = {"entries": n, "rep": rep, "fill_s": fill_s, "rss_kib_before": rss0,
                   "rss_kib_after": rss1, "v1_v2": u2, "v2_v3": u3}
            out.append(rec)
            log("  %7d entries: v1->v2 pause %.2f ms (%s objects), client %.2f ms; "
                "v2->v3 pause %.2f ms (%s objects), client %.2f ms"
                % (n, u2.get("pause_ms", -1), u2.get("objects"), u2["client_pause_ms"],
                   u3.get("pause_ms", -1), u3.get("objects"), u3["client_pause_ms"]))
    return out


def profile(a, images, kvload, n):
    """Where the v2 -> v3 pause goes at n entries: perf (cpu-clock samples of
    the whole server process) around that update only."""
    import shutil
    if not shutil.which("perf"):
        return None
    data = os.path.join(HERE, "build", "perf.data")
    srv = Server([a.molt, "run", images[0]])
    try:
        assert srv.ask("FILL %d" % n) == "FILLED %d" % n
        one_update(a, srv, images[1], 2, kvload)
        perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "1999",
                                 "-p", str(srv.pid), "-o", data],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)   # perf is attached
        u = one_update(a, srv, images[2], 3, kvload)
        time.sleep(0.1)
        perf.send_signal(signal.SIGINT)
        perf.wait(60)
    finally:
        srv.stop()
    rep = sh(["perf", "report", "-i", data, "--no-children", "--sort", "dso,symbol",
              "--stdio", "-q"], timeout=120).stdout
    top = []
    for l in rep.splitlines():
        m = re.match(r"\s*([0-9.]+)%\s+(\S+)\s+\[[.k]\]\s+(.+?)\s*$", l)
        if m:
            top.append((float(m.group(1)), m.group(2), re.split(r"\s{2,}", m.group(3))[0]))
    return {"entries": n, "update": u, "top": top[:15],
            "note": "cpu-clock samples of the server process from 0.5 s before to 0.1 s "
                    "after the update; idle threads do not sample"}


# ---- plots and report --------------------------------------------------------
def summarize(pause_runs):
    by = {}
    for r in pause_runs:
        by.setdefault(r["entries"], []).append(r)
    rows = []
    for n in sorted(by):
        row = {"entries": n, "reps": len(by[n])}
        for step in ("v1_v2", "v2_v3"):
            for k in ("pause_ms", "client_pause_ms", "log_total_ms", "objects",
                      "objects_per_s", "client_max_wait_ms"):
                vals = [r[step][k] for r in by[n] if r[step].get(k) is not None]
                if vals:
                    row["%s_%s" % (step, k)] = statistics.median(vals)
                    row["%s_%s_range" % (step, k)] = (min(vals), max(vals))
        rows.append(row)
    return rows


def plots(res):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = res["pause_summary"]
    xs = [r["entries"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for step, lab, mk in (("v1_v2", "v1→v2 (xf rule: array → hash table)", "o"),
                          ("v2_v3", "v2→v3 (generated: every entry replaced)", "s")):
        ax.plot(xs, [r.get(step + "_pause_ms") for r in rows], mk + "-",
                label=lab + ", runtime pause")
        ax.plot(xs, [r.get(step + "_client_pause_ms") for r in rows], mk + "--",
                label=lab + ", request → first new reply")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("entries in the store")
    ax.set_ylabel("ms")
    ax.set_title("kvfull: update time vs state size (cf. Kitsune fig. 4)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "p9_pause.png"), dpi=110)
    plt.close(fig)

    t = res["throughput"]
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.boxplot([t["runs"]["exe"], t["runs"]["image"]],
               labels=["executable", "image (molt run)"])
    ax.set_ylabel("requests/s")
    ax.set_title("kvfull v1 steady state, %d alternating runs each" % t["rounds"])
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "p9_throughput.png"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for step, lab, mk in (("v1_v2", "v1→v2", "o"), ("v2_v3", "v2→v3", "s")):
        ax.plot(xs, [r.get(step + "_objects_per_s", 0) / 1e6 for r in rows], mk + "-", label=lab)
    ax.axhline(10, color="red", ls=":", label="target 10 M/s")
    ax.set_xscale("log")
    ax.set_xlabel("entries in the store")
    ax.set_ylabel("million objects / s (objects migrated / pause)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "p9_rate.png"), dpi=110)
    plt.close(fig)


def fmt_ms(v):
    return "%.2f" % v if v is not None else "–"


def report(res):
    t = res["throughput"]
    rows = res["pause_summary"]
    big = rows[-1] if rows else {}
    lines = []
    w = lines.append
    w("# Full updates (guarantee P9) — results")
    w("")
    w("Generated by `bench/fullupdate/bench.py` (`bench/fullupdate/run.sh`) from "
      "`results/fullupdate.json`. Do not edit by hand: rerun.")
    w("")
    w("Machine: %s, %d CPUs, %s; load average at the end %s (other jobs share this "
      "machine: the throughput comparison alternates the two builds run by run)."
      % (res["machine"]["cpu"], res["machine"]["cpus"], res["machine"]["kernel"],
         res["machine"]["loadavg"]))
    w("Program: `examples/kvfull` (4 files per version, 2 worker threads + the "
      "acceptor), built with `-O2 -g`; molt build `%s`%s." % (
          os.path.relpath(res["molt_build"], ROOT), " (quick run)" if res["quick"] else ""))
    w("")
    ratio = t["ratio_of_medians"]

    def verdict(r, iqr):
        if iqr[1] - iqr[0] > 0.04:
            return "**not resolved** (run-to-run spread wider than the target)"
        return "**yes**" if abs(r - 1) <= 0.02 else "**no**"
    rates = [r.get("v2_v3_objects_per_s") for r in rows if r.get("v2_v3_objects_per_s")]
    best_rate = max(rates) if rates else 0
    big_rate = big.get("v2_v3_objects_per_s", 0)
    w("## Summary")
    w("")
    w("| measure | anchor (Kitsune) | target (guarantee P9) | measured here | holds? |")
    w("|---|---|---|---|---|")
    w("| steady-state throughput, image under `molt run` / ordinary executable | ±2%% "
      "(Kitsune's overhead) | within ±2%% | **%.1f%%** (ratio of medians, %d alternating "
      "runs each; median per-round ratio %.1f%%, IQR %.1f–%.1f%%) | %s |"
      % (ratio * 100, t["rounds"], t["median_round_ratio"] * 100,
         t["round_ratio_iqr"][0] * 100, t["round_ratio_iqr"][1] * 100,
         verdict(ratio, t["round_ratio_iqr"])))
    w("| server CPU time per request, image / executable (the same runs) | — | "
      "(robust companion of the line above) | **%.1f%%** (ratio of medians; per-round "
      "IQR %.1f–%.1f%%) | %s |" % (
          t["cpu_ratio_of_medians"] * 100, t["cpu_round_ratio_iqr"][0] * 100,
          t["cpu_round_ratio_iqr"][1] * 100,
          verdict(t["cpu_ratio_of_medians"], t["cpu_round_ratio_iqr"])))
    ins = res.get("instructions")
    if ins:
        w("| server instructions per request, image / executable (callgrind, %d runs "
          "each) | — | (deterministic companion) | **%.1f%%** (%.0f vs %.0f) | %s |" % (
              len(ins["per_request"]["image"]), ins["ratio"] * 100, ins["median"]["image"],
              ins["median"]["exe"], "**yes**" if abs(ins["ratio"] - 1) <= 0.02 else "**no**"))
    w("| update pause at %s entries | 5,040 ms for a 1M-entry Redis (fig. 4); "
      "39.7 ms for redis with 1K pairs (table 3) | — | v1→v2 %s ms, v2→v3 %s ms "
      "(runtime pause); a client waits %s / %s ms from `molt update` to the first "
      "reply of the new version | (no target) |"
      % (f"{big.get('entries', 0):,}", fmt_ms(big.get("v1_v2_pause_ms")),
         fmt_ms(big.get("v2_v3_pause_ms")), fmt_ms(big.get("v1_v2_client_pause_ms")),
         fmt_ms(big.get("v2_v3_client_pause_ms"))))
    w("| transformation rate (objects migrated / pause, generated transformer v2→v3) | "
      "— | ≥ 10M objects/s | %.1fM/s at %s entries (best %.1fM/s) | %s |"
      % (big_rate / 1e6, f"{big.get('entries', 0):,}", best_rate / 1e6,
         "**yes**" if big_rate >= 10e6 else "**no**"))
    w("")
    w("## Throughput (steady state)")
    w("")
    w("Each run starts a fresh server (image: `molt run v1.so`; executable: the "
      "same `v1/*.c` built by `make exe`, an ordinary program linked with "
      "libmolt, where `molt_update_point()` returns at once), stores %s keys "
      "(`FILL`), and `kvload tput` drives it for %.1f s over %d connections, "
      "request/response (90%% GET, 10%% SET), every reply checked. The two "
      "builds alternate, %d runs each." % (f"{t['keys']:,}", t["seconds_per_run"],
                                         t["connections"], t["rounds"]))
    w("")
    w("| build | median req/s | min | max | median server CPU µs/request |")
    w("|---|---|---|---|---|")
    for k, lab in (("exe", "ordinary executable"), ("image", "program image (`molt run`)")):
        w("| %s | %.0f | %.0f | %.0f | %.2f |" % (lab, t["median_rps"][k], t["min_max"][k][0],
                                                t["min_max"][k][1], t["median_cpu_us"][k]))
    w("")
    w("Per-round ratios image/executable: %s." % ", ".join("%.3f" % x for x in t["round_ratios"]))
    if ins:
        w("")
        w("Instructions: the same servers under `valgrind --tool=callgrind "
          "--trace-children=yes`, counters zeroed after `FILL` and dumped after 3 s of "
          "`kvload tput` (every thread of the server counts, the kernel does not). "
          "Per request: image %s; executable %s." % (
              ", ".join("%.0f" % x for x in ins["per_request"]["image"]),
              ", ".join("%.0f" % x for x in ins["per_request"]["exe"])))
    w("")
    w("![throughput](results/p9_throughput.png)")
    w("")
    w("## Update pause vs state size (Kitsune fig. 4 / table 3)")
    w("")
    w("For each size a fresh v1 server gets `FILL n` (n keys `fill:<i>` with heap "
      "strings as values), then `molt update` to v2 and, on the same process, to "
      "v3, while one client (`kvload watch`) sends `VERSION` back to back. After "
      "each update the state is checked (COUNT, a GET, REV 1 after v2, INCR after "
      "v3). Columns:")
    w("")
    w("* *pause*: the runtime's own figure printed by `molt update` — from the "
      "moment every thread is parked until the migration has committed (new heap "
      "objects built, old ones freed); the threads do not run in between.")
    w("* *total*: `molt log`'s total of the update operation (opening and checking "
      "the file, `dlopen`, the barrier, the migration).")
    w("* *client*: what a client sees — from the start of `molt update` (a new "
      "process) to the first reply of the new version on an already open "
      "connection. This is P9's *pause* as the brief defines it; it includes "
      "starting the CLI and the control round trip.")
    w("* *objects*: objects migrated (reported by the runtime); *rate* = objects / pause.")
    w("")
    w("| entries | reps | v1→v2 pause ms (min–max) | total ms | client ms | objects | rate M/s "
      "| v2→v3 pause ms (min–max) | total ms | client ms | objects | rate M/s |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = ["%s" % f"{r['entries']:,}", str(r["reps"])]
        for step in ("v1_v2", "v2_v3"):
            rng = r.get(step + "_pause_ms_range")
            pause = fmt_ms(r.get(step + "_pause_ms"))
            if rng and r["reps"] > 1:
                pause += " (%s–%s)" % (fmt_ms(rng[0]), fmt_ms(rng[1]))
            cells += [pause, fmt_ms(r.get(step + "_log_total_ms")),
                      fmt_ms(r.get(step + "_client_pause_ms")),
                      "%s" % f"{int(r.get(step + '_objects', 0)):,}",
                      "%.1f" % (r.get(step + "_objects_per_s", 0) / 1e6)]
        w("| " + " | ".join(cells) + " |")
    w("")
    w("![pause](results/p9_pause.png)")
    w("")
    w("![rate](results/p9_rate.png)")
    w("")
    prof = res.get("profile")
    if prof and prof.get("top"):
        w("### Where the v2→v3 pause goes (%s entries, `perf record -e cpu-clock`)"
          % f"{prof['entries']:,}")
        w("")
        w("Update profiled: pause %s ms (perf's sampling slows it), %s objects. %s." % (
            fmt_ms(prof["update"].get("pause_ms")),
            f"{int(prof['update'].get('objects', 0)):,}", prof["note"]))
        w("")
        w("| share | object | symbol |")
        w("|---|---|---|")
        for pct, dso, sym in prof["top"]:
            w("| %.1f%% | %s | `%s` |" % (pct, dso, sym))
        w("")
    w("## Reading the numbers")
    w("")
    for para in res.get("notes", []):
        w(para)
        w("")
    with open(os.path.join(HERE, "RESULTS.md"), "w") as f:
        f.write("\n".join(lines))


def notes(res):
    """The honest part: which targets hold and why not where they do not."""
    t = res["throughput"]
    rows = res["pause_summary"]
    out = []
    ratio = t["ratio_of_medians"]
    ins = res.get("instructions")
    if ins:
        out.append("**Instructions per request: %.1f%%** of the ordinary executable "
                   "(%.0f vs %.0f, callgrind, deterministic to ±2 instructions across "
                   "runs). This is the steady-state cost of being a program image, "
                   "measured without the scheduler noise: %s" % (
                       ins["ratio"] * 100, ins["median"]["image"], ins["median"]["exe"],
                       "within the ±2% target." if abs(ins["ratio"] - 1) <= 0.02 else
                       "outside the ±2% target."))
    if abs(ratio - 1) <= 0.02 and t["round_ratio_iqr"][1] - t["round_ratio_iqr"][0] <= 0.04:
        out.append("**Throughput: holds.** The image runs at %.1f%% of the ordinary "
                   "executable (ratio of the medians). Both are the same code; the "
                   "image differs only in being position-independent (`-fPIC`), "
                   "keeping the frame pointer, and starting its threads through the "
                   "`pthread_create` wrapper; none of this is on the per-request path "
                   "in a measurable way here." % (ratio * 100))
    else:
        lo, hi = t["round_ratio_iqr"]
        out.append("**Throughput (requests/s): %s.** Ratio of medians %.1f%%, per-round "
                   "IQR %.1f–%.1f%%. %s" % (
                       "not resolved" if hi - lo > 0.04 else "outside ±2%",
                       ratio * 100, lo * 100, hi * 100,
                       "The per-round spread is wider than the target itself: on this "
                       "shared 2-CPU machine (server, client and other jobs compete for "
                       "the same two CPUs) a ±2% claim cannot be resolved either way with "
                       "this many runs." if hi - lo > 0.04 else
                       "The spread is narrower than the gap, so the difference is real; "
                       "candidates: `-fPIC` code in the image (GOT-relative accesses to "
                       "globals), the kept frame pointer, and the update-point check."))
    cr = t.get("cpu_ratio_of_medians")
    if cr is not None:
        lo, hi = t["cpu_round_ratio_iqr"]
        out.append("Server CPU time per request (user + system of the server process over "
                   "the same runs, from /proc): image/executable = %.1f%% (per-round IQR "
                   "%.1f–%.1f%%). It moves with the load too: how many requests one "
                   "`poll()` wake-up finds, and so the kernel's share per request, "
                   "depends on how the CPUs are shared at that moment."
                   % (cr * 100, lo * 100, hi * 100))
    if any(r.get("v2_v3_log_total_ms") is None for r in rows):
        out.append("A *total* shown as – is missing from `molt log`: the runtime keeps "
                   "256 bytes per log message (src/runtime/base/log.c), and the update's "
                   "message (two full image paths, a build-id, then the figures) is cut "
                   "before its last figure once the object count gets long.")
    if rows:
        big = rows[-1]
        r3 = big.get("v2_v3_objects_per_s", 0)
        if r3 >= 10e6:
            out.append("**Transformation rate: holds** (%.1fM objects/s at %s entries)."
                       % (r3 / 1e6, f"{big['entries']:,}"))
        else:
            out.append(
                "**Transformation rate: missed** (%.1fM objects/s at %s entries, target "
                "10M/s). Every migrated entry of v2→v3 is a heap object of a changed "
                "type, so the runtime `calloc`s a new one, records old→new in its map "
                "(the map keeps sharing and cycles), queues it, runs the generated "
                "function, undo-logs the in-place fix of the bucket array, and `free`s "
                "the old one after the commit (docs/full-updates.md); the pause also "
                "includes that freeing. The object count is the runtime's: %s objects "
                "for %s entries, i.e. the entries plus about one per element of the "
                "bucket array, which is fixed in place. Per entry the rate is %.1fM/s." %
                (r3 / 1e6, f"{big['entries']:,}", f"{int(big.get('v2_v3_objects', 0)):,}",
                 f"{big['entries']:,}",
                 big["entries"] / (big["v2_v3_pause_ms"] / 1000) / 1e6))
        prof = res.get("profile")
        if prof and prof.get("top"):
            share = {}
            for pct, dso, sym in prof["top"]:
                share[sym] = share.get(sym, 0) + pct
            kern = sum(p for p, d, _ in prof["top"] if d.startswith("[kernel"))
            libc = sum(p for p, d, _ in prof["top"] if d.startswith("libc"))
            eng = sum(p for p, d, _ in prof["top"] if d.startswith("libmolt"))
            out.append(
                "The profile says where: the engine's own code (`molt__xf_ptr` and "
                "`molt__xf_fptr`, the same for a named field: "
                "classifying every old pointer — each entry's `next`, `key`, `value` "
                "and its bucket slot; `molt__xf_run`: the work loop; `molt__xf_end`: "
                "freeing the replaced objects) %.0f%%, of which those two %.0f%%; "
                "the allocator (libc: a `calloc` per new object, a `free` per old one "
                "and the consolidation of the freed chunks) %.0f%%; the kernel (zeroing "
                "and faulting in fresh pages for the new objects and the engine's "
                "tables, memory cgroup accounting) %.0f%% of the samples in the top 15. "
                "The engine sizes its old→new map from the heap and keeps it in huge "
                "pages, answers untyped pointers (`key`, `value`) from a bitmap of the "
                "heap without probing the map, frees the replaced objects without "
                "sorting them when none can contain another, and prefetches ahead in "
                "its work loop (src/runtime/full/xf.c); what is left is mostly the "
                "allocator and fresh memory. The first update at 1M entries of a run "
                "is the slowest (see min–max), probably the first touch of memory on "
                "this VM: an earlier run's profiled update took 289 ms with a third of "
                "its samples in `clear_page_erms` (zeroing fresh pages); not verified "
                "further." % (
                    eng, share.get("molt__xf_ptr", 0) + share.get("molt__xf_fptr", 0), libc, kern))
        r2 = big.get("v1_v2_objects_per_s")
        if r2 is not None:
            out.append(
                "v1→v2 is dominated by the hand-written rule of `v2.xf` (one `calloc` per "
                "entry, the FNV hash of every key, `$xform(struct entry, struct entry)` "
                "per entry); the runtime counts only the objects it migrated itself, so "
                "its objects/s figure is not a transformer rate and is shown for "
                "completeness only.")
        out.append(
            "Kitsune's anchor: redis with 1M pairs took 5,040 ms to update (fig. 4), "
            "because its generated transformers traversed every item; memcached stayed "
            "flat by treating its arrays opaquely. kvfull is the redis case — every "
            "entry is traversed and, from v2 to v3, replaced.")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--molt-build", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--sizes")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--only", choices=["throughput", "pause"])
    a = ap.parse_args()
    build = os.path.abspath(a.molt_build)
    a.molt = os.path.join(build, "bin", "molt")
    a.rounds = a.rounds or (4 if a.quick else 10)
    a.seconds = a.seconds or (1.0 if a.quick else 2.0)
    a.reps = a.reps or (2 if a.quick else 3)
    a.sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else (
        [1000, 10000, 100000] if a.quick else [1000, 10000, 100000, 1000000])
    a.conns, a.keys = 2, 10000
    a.cg_runs = 2 if a.quick else 3
    os.makedirs(RESULTS, exist_ok=True)
    obj = os.path.join(HERE, "build", "kvfull")
    r = sh(["make", "-s", "-C", KVFULL, "O=" + obj, "MOLT_BUILD=" + build, "all", "exe"])
    if r.returncode:
        sys.exit("bench: building kvfull failed:\n" + r.stdout)
    kvload = os.path.join(HERE, "build", "kvload")
    r = sh(["gcc", "-O2", "-Wall", "-o", kvload, os.path.join(HERE, "kvload.c"), "-pthread"])
    if r.returncode:
        sys.exit("bench: building kvload failed:\n" + r.stdout)
    images = [os.path.join(obj, "v%d.so" % v) for v in (1, 2, 3)]
    exe = os.path.join(obj, "kvfull-v1")

    path = os.path.join(RESULTS, "fullupdate.json")
    res = {}
    if a.only and os.path.exists(path):
        with open(path) as f:
            res = json.load(f)
    t0 = time.time()
    if a.only in (None, "throughput"):
        log("P9 throughput: image vs executable, %d rounds" % a.rounds)
        res["throughput"] = throughput(a, images, exe, kvload)
        log("P9 instructions per request (callgrind), %d runs each" % a.cg_runs)
        res["instructions"] = instructions(a, images, exe, kvload)
    if a.only in (None, "pause"):
        log("P9 pause vs state size: %s" % a.sizes)
        res["pause_runs"] = pauses(a, images, kvload)
        res["pause_summary"] = summarize(res["pause_runs"])
        log("P9 profile of the v2 -> v3 update at %d entries" % max(a.sizes))
        res["profile"] = profile(a, images, kvload, max(a.sizes))
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for l in f:
            if l.startswith("model name"):
                cpu = l.split(":", 1)[1].strip()
                break
    res["machine"] = {"cpu": cpu, "cpus": os.cpu_count(), "kernel": platform.platform(),
                      "loadavg": " ".join(open("/proc/loadavg").read().split()[:3])}
    res["molt_build"] = build
    res["quick"] = a.quick
    res["seconds"] = time.time() - t0
    res["notes"] = notes(res)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    plots(res)
    report(res)
    log("wrote %s, results/*.png, RESULTS.md" % path)


if __name__ == "__main__":
    main()
