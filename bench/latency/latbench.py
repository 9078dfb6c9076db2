#!/usr/bin/env python3
"""latbench.py — runs the WFPATCH section 4.3 experiment on the kvstore (P8).

    latbench.py [--quick] [--rounds N] [--reverse|--forward] [--pool N]
                [--wait-quiet MIN] [--rate R] [--conns N] [--threads N]
                [--sched fifo|normal] [--nowake] [--control] [--jitter-ms J]

Usually started by run.sh, which builds first (build.sh) and sets MOLT_BUILD
and LAT_WORK.  One kvstore per policy (none, immediate, local, global; with
--nowake also global-nowake) runs for the whole experiment; one open-loop
client (latclient) sends a steady stream of requests to one server at a
time, switching every SEGMENT_S seconds.  While a server has the load, it
gets a patch request every 1.5 s: a real `molt apply <pid> <patch>
--policy P`, alternating two patches (fix-del.so, value-length.so: two
complete versions of the command layer, so every request loads a patch with
dlopen, publishes a generation and lets the runtime unload the one before).
The `none` and `none2` servers get no patch requests, but the same grid is
recorded so that the plots around the patch request have a baseline;
`none2` / `none` is the A/A control (the noise floor of every ratio).

Why segments and not four 60 s runs one after the other: this is a shared
2-CPU VM, and other people's jobs add multi-second episodes of millisecond
hiccups.  Runs minutes apart compare different machines (measured: the
p99.9 of `none` alone moved 5x between 17 s blocks).  With 3 s segments in
rounds none-immediate-local-global, then reversed (ABCD DCBA ...), every
episode falls on all policies nearly alike, and each round is a paired
comparison.  Repeated invocations alternate the starting order too (or
--forward / --reverse), and --pool N reports on the last N runs together.

Raw per-request data stays in $LAT_WORK/data/<stamp>/ (it is large); the
report (report.py) writes results/latency.json and the plots.
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# none2: a second unpatched server, the A/A control: how far p99.9 moves
# between two identical servers is the noise floor every ratio is read
# against.  It sits at the other end of the round from `none`.
POLICIES = ["none", "immediate", "local", "global", "none2"]
PATCHES = ["fix-del.so", "value-length.so"]
PERIOD_S = 1.5             # WFPATCH: one patch request every 1.5 s
SEGMENT_S = 3.0            # one server has the load for this long
REQUESTS_AT_S = (0.75, 2.25)  # patch requests within a segment (1.5 s apart)
LEAD_IN_S = 1.5            # connect + prefill every server before the load


def log(msg):
    print(msg, flush=True)


def sleep_until_ns(t_ns):
    while True:
        d = t_ns - time.monotonic_ns()
        if d <= 0:
            return
        time.sleep(d / 1e9)


def start_server(cfg, policy, logf):
    # global-nowake: policy global on the kvstore copy whose wake-up
    # callback is disabled (nowake.c), with patches built for that copy.
    nowake = policy == "global-nowake"
    exe = os.path.join(cfg.work, "kvstore-nowake" if nowake else "kvstore")
    p = subprocess.Popen([exe, "--port", "0", "--threads", str(cfg.threads)],
                         stdout=subprocess.PIPE, stderr=logf, text=True)
    line = p.stdout.readline()  # "listening on 127.0.0.1:PORT"
    if not line.startswith("listening on"):
        p.kill()
        raise SystemExit(f"latbench: kvstore did not start: {line!r}")
    return {"policy": policy, "proc": p, "pid": p.pid, "port": int(line.rsplit(":", 1)[1]),
            "molt_policy": "global" if nowake else policy,
            "patch_dir": os.path.join(cfg.work, "patches", "nowake" if nowake else "")}


def cpu_sample(pids):
    """(busy jiffies of the whole machine, jiffies of our processes, steal).

    busy - ours over a segment is the CPU that other people's jobs used
    while we measured; steal is the time the hypervisor ran other VMs on
    our CPUs.  Both stall the experiment; the report gives both."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6]  # user nice system irq softirq
    ours = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ours += int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError):
            pass
    return busy, ours, v[7]


def wait_quiet(minutes, limit=0.25, window=5.0):
    """Waits until other jobs and the hypervisor (steal) take less than
    `limit` CPUs over `window` seconds (at most `minutes`).  Returns the
    load last seen."""
    deadline = time.monotonic() + minutes * 60
    hz = os.sysconf("SC_CLK_TCK")
    while True:
        a = cpu_sample([])
        time.sleep(window)
        b = cpu_sample([])
        load = ((b[0] - a[0]) + (b[2] - a[2])) / hz / window  # other jobs + steal
        if load < limit or time.monotonic() >= deadline:
            return load
        log(f"latbench: machine busy ({load:.2f} CPUs used by other jobs or stolen), waiting")


def schedule(policies, rounds, reverse):
    """Segment order: rounds of all policies, every other round reversed."""
    order = []
    for r in range(rounds):
        fwd = (r % 2 == 0) != reverse
        order += list(range(len(policies))) if fwd else list(reversed(range(len(policies))))
    return order


def run(cfg, policies, data):
    molt = os.path.join(cfg.molt_build, "bin", "molt")
    order = schedule(policies, cfg.rounds, cfg.reverse)
    servers, logs = [], []
    try:
        for p in policies:
            logs.append(open(os.path.join(data, f"server-{p}.log"), "w"))
            servers.append(start_server(cfg, p, logs[-1]))
        # realtime - monotonic: puts `molt log` times (realtime) on the
        # client's clock (monotonic).
        clock_off = time.time_ns() - time.monotonic_ns()
        t_start = time.monotonic_ns() + int(LEAD_IN_S * 1e9)
        duration = len(order) * SEGMENT_S
        client = subprocess.Popen(
            [os.path.join(cfg.work, "latclient"),
             "--port", ",".join(str(s["port"]) for s in servers),
             "--conns", str(cfg.conns), "--rate", str(cfg.rate),
             "--duration", str(duration), "--segment", str(SEGMENT_S),
             "--order", ",".join(map(str, order)), "--start-ns", str(t_start),
             "--out", os.path.join(data, "requests.bin")],
            stdout=subprocess.PIPE, text=True)

        marks, cpu = [], []
        rnd = random.Random(cfg.seed)
        pids = [s["pid"] for s in servers] + [client.pid]
        sleep_until_ns(t_start)
        cpu.append(cpu_sample(pids))
        last_report = time.monotonic()
        for seg, si in enumerate(order):
            srv = servers[si]
            for k, at in enumerate(REQUESTS_AT_S):
                # Each request moves by a random +-jitter so that requests
                # do not lock onto the phase of the server's 100 ms wait
                # timeouts (1.5 s is 15 of them): they must sample every
                # program state, as in WFPATCH.
                due = t_start + int((seg * SEGMENT_S + at) * 1e9)
                due += int(rnd.uniform(-cfg.jitter_ms, cfg.jitter_ms) * 1e6)
                sleep_until_ns(due)
                t0 = time.monotonic_ns()
                m = {"segment": seg, "policy": srv["policy"], "request_ns": t0,
                     "patch": None, "rc": None}
                if srv["policy"] == "cli-status":
                    # Control: the same CLI process and a control-channel
                    # round trip, but no update (`molt status`).
                    r = subprocess.run([molt, "status", str(srv["pid"])],
                                       capture_output=True, text=True)
                    m.update(rc=r.returncode)
                elif srv["policy"] not in ("none", "none2"):
                    # Alternate the two patches on each server.
                    n = sum(1 for x in marks if x["policy"] == srv["policy"])
                    patch = os.path.join(srv["patch_dir"], PATCHES[n % 2])
                    r = subprocess.run(
                        [molt, "apply", str(srv["pid"]), patch, "--policy",
                         srv["molt_policy"], "--timeout", str(cfg.timeout)],
                        capture_output=True, text=True)
                    m.update(patch=PATCHES[n % 2], rc=r.returncode,
                             msg=(r.stdout + r.stderr).strip()[-300:])
                    if r.returncode != 0:
                        log(f"  segment {seg} {srv['policy']}: apply failed "
                            f"(rc {r.returncode}): {m['msg']}")
                m["done_ns"] = time.monotonic_ns()
                marks.append(m)
            sleep_until_ns(t_start + int((seg + 1) * SEGMENT_S * 1e9))
            cpu.append(cpu_sample(pids))
            if time.monotonic() - last_report > 30 or seg == len(order) - 1:
                last_report = time.monotonic()
                log(f"  segment {seg + 1}/{len(order)}, {len(marks)} patch requests "
                    f"({sum(1 for x in marks if x['rc'] not in (None, 0))} failed)")

        cout, _ = client.communicate()
        summary = json.loads(cout.strip().splitlines()[-1]) if cout.strip() else {}
        if client.returncode != 0:
            log(f"latbench: client reported errors or lost requests: {summary}")
        per_server = {}
        for s in servers:
            info = {"pid": s["pid"], "port": s["port"], "molt_log": [], "final_status": {}}
            if s["policy"] not in ("none", "none2", "cli-status"):
                r = subprocess.run([molt, "log", str(s["pid"]), "--json"],
                                   capture_output=True, text=True)
                if r.returncode == 0:
                    info["molt_log"] = json.loads(r.stdout)
                    for e in info["molt_log"]:  # on the monotonic clock, in ns
                        e["mono_ns"] = int(e["time"] * 1e9) - clock_off
                r = subprocess.run([molt, "status", str(s["pid"]), "--json"],
                                   capture_output=True, text=True)
                if r.returncode == 0:
                    st = json.loads(r.stdout)
                    # What is still loaded after dozens of patches: with
                    # reclamation working (H7), one patch object and one
                    # live generation.  Kept as evidence.
                    info["final_status"] = {
                        "generation": st.get("generation"), "reclaim": st.get("reclaim"),
                        "objects": len(st.get("objects", [])),
                        "live_generations": len(st.get("live_generations", []))}
            per_server[s["policy"]] = info
    finally:
        for s in servers:
            s["proc"].send_signal(signal.SIGTERM)
        for s in servers:
            try:
                s["proc"].wait(timeout=5)
            except subprocess.TimeoutExpired:
                s["proc"].kill()
                s["proc"].wait()
        for f in logs:
            f.close()
    for s in servers:
        per_server[s["policy"]]["exit_status"] = s["proc"].returncode
    # Background CPU per segment, in CPUs (jiffies are 1/100 s here; the
    # CLI's own CPU counts as background, ~1 ms per request).
    hz = os.sysconf("SC_CLK_TCK")
    background = [max(0.0, ((b[0] - a[0]) - (b[1] - a[1])) / hz / SEGMENT_S)
                  for a, b in zip(cpu, cpu[1:])]
    steal = [(b[2] - a[2]) / hz / SEGMENT_S for a, b in zip(cpu, cpu[1:])]
    meta = {"t_start_ns": t_start, "segment_s": SEGMENT_S, "order": order,
            "background_cpus": background, "steal_cpus": steal,
            "policies": policies, "marks": marks, "client": summary,
            "client_rc": client.returncode, "servers": per_server}
    with open(os.path.join(data, "run.json"), "w") as f:
        json.dump(meta, f)
    return meta


SAME_SETUP = ("rate", "conns", "threads", "sched", "timeout", "jitter_ms", "policies")


def previous_runs(cfg, policies):
    """Earlier complete runs in $LAT_WORK/data with the same setup, newest
    first: [(dir, config)]."""
    root = os.path.join(cfg.work, "data")
    found = []
    for name in sorted(os.listdir(root) if os.path.isdir(root) else [], reverse=True):
        d = os.path.join(root, name)
        try:
            with open(os.path.join(d, "config.json")) as f:
                c = json.load(f)
            if not os.path.exists(os.path.join(d, "run.json")):
                continue  # interrupted
        except (OSError, ValueError):
            continue
        me = vars(cfg) | {"policies": policies}
        if all(c.get(k) == me.get(k) for k in SAME_SETUP):
            found.append((d, c))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="5 rounds (15 s of load, 10 patch requests per policy, ~1.5 min) "
                         "instead of 20 (60 s, 40 requests, ~5.5 min)")
    ap.add_argument("--rounds", type=int, help="rounds of 3 s segments (default 20; quick 5)")
    ap.add_argument("--reverse", action="store_true",
                    help="start with the reversed order (default: the opposite of the "
                         "previous run in $LAT_WORK/data, so that repeated runs alternate)")
    ap.add_argument("--forward", action="store_true", help="start with the forward order")
    ap.add_argument("--pool", type=int, default=1, metavar="N",
                    help="report on this run pooled with the N-1 previous runs of the same "
                         "setup (their rounds add up)")
    ap.add_argument("--rate", type=float, default=16000, help="requests/s in total")
    ap.add_argument("--conns", type=int, default=16, help="connections per server")
    ap.add_argument("--threads", type=int, default=4, help="kvstore worker threads")
    ap.add_argument("--timeout", type=float, default=1.0, help="molt apply --timeout (s)")
    ap.add_argument("--jitter-ms", type=float, default=50,
                    help="each patch request moves by a random +-this from its slot")
    ap.add_argument("--seed", type=int, help="seed of the jitter (default: from the clock)")
    ap.add_argument("--nowake", action="store_true",
                    help="add a 5th policy, global-nowake: global on a kvstore copy whose "
                         "molt_on_update_pending() wake-up is disabled (nowake.c)")
    ap.add_argument("--control", action="store_true",
                    help="add a policy cli-status: `molt status <pid>` instead of an apply "
                         "every 1.5 s, to separate the cost of running the CLI from the "
                         "cost of the update")
    ap.add_argument("--sched", choices=["fifo", "normal"],
                    help="scheduling class of everything the benchmark starts (servers, "
                         "client, molt CLI): fifo = SCHED_FIFO priority 10, so that other "
                         "jobs on a shared machine do not make the tail; default fifo if "
                         "permitted, else normal")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="MIN",
                    help="first wait up to MIN minutes until other jobs and steal take "
                         "< 0.25 CPUs")
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    ap.add_argument("--no-report", action="store_true")
    cfg = ap.parse_args()
    cfg.rounds = cfg.rounds or (5 if cfg.quick else 20)
    if cfg.seed is None:
        cfg.seed = time.time_ns() % 1_000_000  # recorded in config.json
    cfg.work = os.environ.get("LAT_WORK", "/tmp/molt-latency")
    cfg.molt_build = os.environ.get("MOLT_BUILD", "/tmp/lat-build")
    policies = (POLICIES + (["global-nowake"] if cfg.nowake else [])
                + (["cli-status"] if cfg.control else []))

    # Children inherit the scheduling class (fork/exec keep it), and so do
    # the servers' threads, molt's runtime thread included: every process
    # and thread of the experiment runs in the same class.
    if cfg.sched in (None, "fifo"):
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
            cfg.sched = "fifo"
        except (PermissionError, OSError):
            if cfg.sched == "fifo":
                raise SystemExit("latbench: SCHED_FIFO not permitted (run as root or --sched normal)")
            cfg.sched = "normal"

    if cfg.wait_quiet > 0:
        cfg.load_before = wait_quiet(cfg.wait_quiet)
        log(f"latbench: other jobs use {cfg.load_before:.2f} CPUs; starting")
    previous = previous_runs(cfg, policies)
    if not cfg.reverse and not cfg.forward:
        # Repeated runs alternate the order of the policies, so that drift
        # over a run does not always favour the same ones.
        cfg.reverse = bool(previous) and not previous[0][1].get("reverse", False)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    data = os.path.join(cfg.work, "data", stamp)
    os.makedirs(data)
    per_pol = cfg.rounds * len(REQUESTS_AT_S)
    log(f"latbench: {len(policies)} policies x {cfg.rounds} rounds of {SEGMENT_S:g} s segments "
        f"({cfg.rounds * SEGMENT_S:g} s of load and {per_pol} patch requests per policy, "
        f"{len(policies) * cfg.rounds * SEGMENT_S:g} s in all); {cfg.rate:g} req/s over "
        f"{cfg.conns} connections, {cfg.threads} workers; scheduling {cfg.sched}; "
        f"order {'reversed' if cfg.reverse else 'forward'} first"
        + ("; QUICK run: fewer rounds — indicative only" if cfg.quick else ""))
    log(f"latbench: raw data in {data}")
    with open(os.path.join(data, "config.json"), "w") as f:
        json.dump(vars(cfg) | {
            "policies": policies, "period_s": PERIOD_S, "segment_s": SEGMENT_S,
            "requests_at_s": REQUESTS_AT_S, "patches": PATCHES, "nproc": os.cpu_count(),
            "uname": " ".join(os.uname()), "started": time.strftime("%Y-%m-%d %H:%M:%S")},
            f, indent=1)
    run(cfg, policies, data)
    if cfg.no_report:
        return 0
    # Number crunching must not run at real-time priority.
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    sys.path.insert(0, HERE)
    import report
    pooled = [data] + [d for d, _ in previous[:max(cfg.pool, 1) - 1]]
    return report.report(pooled, cfg.results)


if __name__ == "__main__":
    sys.exit(main())
