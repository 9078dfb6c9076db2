#!/usr/bin/env python3
"""demo.py -- the molt live-update demo: patch a loaded kvstore three times.

  ./demo.py [--short] [--molt-build DIR] [--policy immediate|local|global]

1. builds kvstore with moltcc and the three patches (make),
2. starts the server on 127.0.0.1 (port 0) and the checking load generator
   (loadgen.py: every reply is verified, connections stay open throughout),
3. applies patches/fix-del.so, value-length.so, new-command.so one after the
   other with `molt apply`, pausing between them,
4. stops the load and prints: requests served, requests failed (must be 0),
   the versions the clients saw, latency p50/p99 before, during (+-0.5 s
   around each apply) and after each patch, and `molt status`.

Exit status 0 only if every apply succeeded, no request failed, every
version was observed, and the server is still alive and exits cleanly.

Other modes:
  --plain     no molt: the plain-gcc server under the same checked load
  --selftest  checks the load generator itself: plain builds of every version
              (must pass), a deliberately wrong one (must be caught), and,
              if molt is built, two wrong patches applied live (must be
              caught)
  --bench     P7: throughput of kvstore (whole command layer updatable) vs
              kvstore-plain, side by side with kvbench (no patching)
"""

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

# (patch id, version it installs); the order of application.
PATCHES = [("fix-del", "1.1"), ("value-length", "1.2"), ("new-command", "1.3")]
BASE_VERSION = "1.0"


def log(msg):
    print(msg, flush=True)


def run_make(args, targets):
    cmd = ["make", "-C", HERE, "MOLT_BUILD=" + args.molt_build] + targets
    log("$ " + " ".join(cmd))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stdout)
        raise SystemExit("demo: build failed (make exit %d)" % r.returncode)
    if args.verbose:
        sys.stdout.write(r.stdout)


def read_line(proc, timeout, what):
    """First line of proc's stdout, or exit with an error."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            raise SystemExit("demo: %s did not start (exit %s, output %r)"
                             % (what, proc.poll(), buf))
        r, _, _ = select.select([fd], [], [], left)
        if r:
            chunk = os.read(fd, 4096)
            if not chunk:
                continue
            buf += chunk
    return buf.split(b"\n", 1)[0].decode()


def start_server(binary, args, outdir):
    if not os.access(binary, os.X_OK):
        raise SystemExit("demo: %s not built (run without --no-build, or "
                         "make it)" % os.path.relpath(binary))
    errf = open(os.path.join(outdir, "server.log"), "w")
    p = subprocess.Popen([binary, "--port", "0", "--threads",
                          str(args.threads)], stdout=subprocess.PIPE,
                         stderr=errf, cwd=HERE)
    line = read_line(p, 10, "kvstore")
    if not line.startswith("listening on 127.0.0.1:"):
        raise SystemExit("demo: unexpected server output %r" % line)
    return p, int(line.rsplit(":", 1)[1])


def start_loadgen(port, args, outdir, expect_versions, extra=()):
    stop = os.path.join(outdir, "stop")
    # Leftovers of an earlier run would stop this one at once, or give it
    # another run's latency windows.
    for old in (stop, os.path.join(outdir, "marks.json")):
        if os.path.exists(old):
            os.unlink(old)
    cmd = [sys.executable, os.path.join(HERE, "loadgen.py"),
           "--port", str(port), "--conns", str(args.conns),
           "--duration", "0", "--stop-file", stop,
           "--marks", os.path.join(outdir, "marks.json"),
           "--report", os.path.join(outdir, "loadgen.json"),
           "--pipeline", str(args.pipeline)]
    if expect_versions:
        cmd += ["--expect-versions", ",".join(expect_versions)]
    cmd += list(extra)
    # Its stderr (summary line, -v failure lines) goes to a log file so the
    # demo's own output stays readable.
    errf = open(os.path.join(outdir, "loadgen.log"), "w")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, cwd=HERE)
    read_line(p, 30, "loadgen")
    return p, stop


def stop_loadgen(p, stop, timeout=60):
    open(stop, "w").close()
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)
        p.wait(10)
    return p.returncode


def ask(port, line, timeout=5):
    """One request on a fresh connection; returns the reply line."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(line.encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.decode().rstrip("\n")


def stop_server(p):
    """SIGTERM; the server must still be alive and exit with status 0."""
    if p.poll() is not None:
        return "server died during the run (exit status %s)" % p.returncode
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        return "server did not stop on SIGTERM"
    return None if rc == 0 else "server exited with status %d" % rc


def fmt_us(v):
    return "-" if v is None else ("%.0f" % v)


def print_report(rep, applies, problems):
    log("")
    log("==== kvstore live-update demo: report ====")
    if rep is None:
        for p in problems:
            log("PROBLEM         : " + p)
        log("result          : FAILED (no load report)")
        return
    log("requests served : %d  (%.0f req/s over %.1f s, %d connections open "
        "throughout)" % (rep["served"], rep["throughput_rps"],
                         rep["duration_s"], rep["connections"]))
    log("requests failed : %d" % rep["failed"])
    vs = rep.get("versions", {})
    log("versions seen   : " + ", ".join(
        "%s (%d probes, %.2f-%.2f s)" % (v, e["probes"], e["first_s"],
                                         e["last_s"])
        for v, e in sorted(vs.items())))
    for a in applies:
        log("%-16s: %-28s %s in %.1f ms%s" % (
            "rollback" if a["patch"].startswith("rollback") else "apply",
            a["patch"] + " -> " + a["version"],
            "ok" if a["rc"] == 0 else "FAILED (exit %d)" % a["rc"],
            a["ms"], "" if a["rc"] == 0 else ": " + a["output"].strip()))
    if rep.get("windows"):
        log("latency (us)    : %-26s %8s %8s %8s %8s %9s" %
            ("window", "requests", "p50", "p99", "max", "req/s"))
        for w in rep["windows"]:
            log("                  %-26s %8d %8s %8s %8s %9s" % (
                w["name"], w["count"], fmt_us(w["p50_us"]),
                fmt_us(w["p99_us"]), fmt_us(w["max_us"]),
                "-" if w["rps"] is None else "%.0f" % w["rps"]))
    lat = rep["latency"]
    log("latency overall : p50 %s us, p99 %s us, p99.9 %s us, max %s us" % (
        fmt_us(lat["p50_us"]), fmt_us(lat["p99_us"]), fmt_us(lat["p999_us"]),
        fmt_us(lat["max_us"])))
    for f in rep.get("failures", [])[:10]:
        log("failure         : %s" % json.dumps(f))
    for p in problems:
        log("PROBLEM         : " + p)
    log("result          : " + ("OK" if not problems else "FAILED"))


def find_molt(args):
    """The CLI: <build>/bin/molt (CMakeLists.txt), or <build>/molt."""
    for rel in (("bin", "molt"), ("molt",)):
        path = os.path.join(args.molt_build, *rel)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def demo(args, outdir):
    molt = find_molt(args)
    if molt is None:
        raise SystemExit("demo: no molt CLI in %s (build molt first: cmake -S "
                         "%s -B %s -G Ninja && ninja -C %s)"
                         % (args.molt_build, ROOT, args.molt_build,
                            args.molt_build))
    problems = []
    if not args.no_build:
        run_make(args, ["all"])

    server, port = start_server(os.path.join(HERE, "kvstore"), args, outdir)
    log("server: pid %d on 127.0.0.1:%d (%d worker threads)"
        % (server.pid, port, args.threads))
    applies = []
    rep = None
    lg = None
    try:
        v = ask(port, "VERSION")
        if v != "VERSION " + BASE_VERSION:
            problems.append("server starts as %r, expected VERSION %s"
                            % (v, BASE_VERSION))
        lg, stop = start_loadgen(port, args, outdir,
                                 [BASE_VERSION] + [p[1] for p in PATCHES],
                                 ["--allow-rollback"] if args.rollback else [])
        t_start = time.monotonic()
        log("load: %d connections; %.1f s before the first patch"
            % (args.conns, args.phase))
        time.sleep(args.phase)
        # The steps: apply each patch; with --rollback, then undo them one by
        # one (molt rollback), back to the program as built.
        steps = [("apply", pid_, ver) for pid_, ver in PATCHES]
        if args.rollback:
            vers = [BASE_VERSION] + [v for _, v in PATCHES]
            steps += [("rollback", "rollback-%d" % (i + 1), vers[-i - 2])
                      for i in range(len(PATCHES))]
        for action, pid_, ver in steps:
            if action == "apply":
                so = os.path.join(HERE, "patches", pid_ + ".so")
                cmd = [molt, "apply", str(server.pid), so]
            else:
                cmd = [molt, "rollback", str(server.pid)]
            if args.policy:
                cmd += ["--policy", args.policy]
            t0 = time.monotonic()
            r = subprocess.run(cmd, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            t1 = time.monotonic()
            a = {"patch": pid_, "version": ver, "t0": t0, "t1": t1,
                 "ms": (t1 - t0) * 1e3, "rc": r.returncode,
                 "output": r.stdout}
            applies.append(a)
            log("$ molt %s  -> exit %d in %.1f ms%s" % (
                " ".join(cmd[1:]), r.returncode, a["ms"],
                ("\n  " + r.stdout.strip().replace("\n", "\n  "))
                if r.stdout.strip() else ""))
            if r.returncode != 0:
                problems.append("molt %s %s failed" % (action, pid_))
            else:
                # guarantees H2/H8: a call that starts after `molt apply` (or
                # rollback) returned runs the new version, also on a
                # brand-new connection.
                v = ask(port, "VERSION")
                if v != "VERSION " + ver:
                    problems.append("after %s the server says %r, expected "
                                    "VERSION %s" % (pid_, v, ver))
            time.sleep(args.phase)
        marks = {"start": t_start, "end": time.monotonic(),
                 "events": [{"name": a["patch"], "t0": a["t0"], "t1": a["t1"]}
                            for a in applies]}
        with open(os.path.join(outdir, "marks.json"), "w") as f:
            json.dump(marks, f)
        lg_rc = stop_loadgen(lg, stop)
        lg = None
        with open(os.path.join(outdir, "loadgen.json")) as f:
            rep = json.load(f)
        if lg_rc != 0:
            problems.append("load generator reported failures (exit %d)"
                            % lg_rc)
        if rep.get("missing_versions"):
            problems.append("versions never observed by the clients: "
                            + ", ".join(rep["missing_versions"]))
        if rep.get("dead_connections"):
            problems.append("connections lost: %s" % rep["dead_connections"])

        st = subprocess.run([molt, "status", str(server.pid)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
        log("")
        log("$ molt status %d  -> exit %d" % (server.pid, st.returncode))
        log(st.stdout.rstrip())
        if st.returncode != 0:
            problems.append("molt status failed")
    finally:
        if lg is not None:  # interrupted: do not leave the load running
            stop_loadgen(lg, stop, timeout=15)
        err = stop_server(server)
    if err:
        problems.append(err)
    print_report(rep, applies, problems)
    with open(os.path.join(outdir, "demo.json"), "w") as f:
        json.dump({"ok": not problems, "problems": problems,
                   "applies": applies, "loadgen": rep}, f, indent=1)
    log("details: %s/{loadgen.json,demo.json,server.log}" % outdir)
    return 0 if not problems else 1


def plain(args, outdir):
    """The plain-gcc server under the same checked load, no patches."""
    if not args.no_build:
        run_make(args, ["plain"])
    server, port = start_server(os.path.join(HERE, "kvstore-plain"), args,
                                outdir)
    log("plain server: pid %d on 127.0.0.1:%d" % (server.pid, port))
    problems = []
    try:
        lg, stop = start_loadgen(port, args, outdir, [BASE_VERSION])
        time.sleep(args.phase * (len(PATCHES) + 1))
        lg_rc = stop_loadgen(lg, stop)
        with open(os.path.join(outdir, "loadgen.json")) as f:
            rep = json.load(f)
        if lg_rc != 0:
            problems.append("load generator reported failures")
    finally:
        err = stop_server(server)
    if err:
        problems.append(err)
    print_report(rep, [], problems)
    return 0 if not problems else 1


def selftest(args, outdir):
    """The checker must accept each version's behaviour and reject a server
    that behaves like 1.1 while claiming 1.0."""
    if not args.no_build:
        run_make(args, ["selftest-bins"])
    cases = [("kvstore-plain", BASE_VERSION, True)]
    cases += [("obj/selftest/kvstore-" + p, v, True) for p, v in PATCHES]
    cases += [("obj/selftest/kvstore-mislabeled", BASE_VERSION, False)]
    bad = 0
    for binary, ver, should_pass in cases:
        server, port = start_server(os.path.join(HERE, binary), args, outdir)
        lg, stop = start_loadgen(port, args, outdir, [ver])
        time.sleep(args.phase)
        rc = stop_loadgen(lg, stop)
        with open(os.path.join(outdir, "loadgen.json")) as f:
            rep = json.load(f)
        err = stop_server(server)
        good = (rc == 0) == should_pass and not err
        bad += not good
        log("selftest %-34s version %s: served %6d failed %5d -> %s%s" % (
            binary, ver, rep["served"], rep["failed"],
            "as expected" if good else "WRONG",
            "" if should_pass else " (must be caught)"))
    # Live: wrong patches applied under load must be caught too (needs molt).
    molt = find_molt(args)
    if molt is None:
        log("selftest: live cases skipped (no molt CLI in %s)"
            % args.molt_build)
    else:
        if not args.no_build:
            run_make(args, ["selftest-patches"])
        for name, why in (("mislabeled", "1.0 code claiming 1.1"),
                          ("stats-copy", "private copy of the statistics")):
            server, port = start_server(os.path.join(HERE, "kvstore"), args,
                                        outdir)
            lg, stop = start_loadgen(port, args, outdir, [BASE_VERSION])
            time.sleep(args.phase / 2)
            so = os.path.join(HERE, "obj", "selftest", name + ".so")
            r = subprocess.run([molt, "apply", str(server.pid), so],
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            time.sleep(args.phase / 2)
            rc = stop_loadgen(lg, stop)
            with open(os.path.join(outdir, "loadgen.json")) as f:
                rep = json.load(f)
            err = stop_server(server)
            good = r.returncode == 0 and rc != 0 and not err
            bad += not good
            log("selftest live patch %-20s: served %6d failed %5d -> %s "
                "(must be caught: %s)%s" % (
                    name, rep["served"], rep["failed"],
                    "as expected" if good else "WRONG", why,
                    "" if r.returncode == 0 else
                    "; apply failed: " + r.stdout.strip()))
    log("selftest: " + ("OK" if not bad else "%d case(s) WRONG" % bad))
    return 1 if bad else 0


def bench(args, outdir):
    """P7: the moltcc build against the plain build, measured side by side:
    both servers run at once, kvbench loads one at a time, alternating the
    order every round; the medians are compared."""
    if not args.no_build:
        run_make(args, ["kvstore", "plain", "kvbench"])
    rounds = args.rounds or (2 if args.short else 5)
    secs = 1.0 if args.short else 3.0
    servers = {}
    rps = {"molt": [], "plain": []}
    problems = []
    try:
        for name, binary in (("molt", "kvstore"), ("plain", "kvstore-plain")):
            servers[name] = start_server(os.path.join(HERE, binary), args,
                                         outdir)
        for r in range(rounds):
            order = ["molt", "plain"] if r % 2 == 0 else ["plain", "molt"]
            for name in order:
                cmd = [os.path.join(HERE, "kvbench"), "--port",
                       str(servers[name][1]), "--conns", str(args.conns),
                       "--pipeline", str(args.bench_pipeline),
                       "--duration", str(secs), "--json"]
                res = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
                out = json.loads(res.stdout)
                if res.returncode != 0 or out["errors"]:
                    problems.append("kvbench against %s: %d errors"
                                    % (name, out["errors"]))
                rps[name].append(out["rps"])
                log("round %d %-5s %10.0f req/s" % (r + 1, name, out["rps"]))
    finally:
        for name, (p, _) in servers.items():
            err = stop_server(p)
            if err:
                problems.append("%s: %s" % (name, err))

    def median(v):
        v = sorted(v)
        return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2

    m, p = median(rps["molt"]), median(rps["plain"])
    ratio = m / p if p else 0.0
    # The two runs of a round are back to back, so their ratio cancels slow
    # drift of the machine (other load, frequency); its median is the
    # figure to quote on a noisy machine.
    paired = median([a / b for a, b in zip(rps["molt"], rps["plain"]) if b])
    log("P7: kvstore (moltcc, command layer updatable) %.0f req/s, "
        "kvstore-plain %.0f req/s: %.1f%%; median of per-round ratios "
        "%.1f%% (target >= 98%%)" % (m, p, ratio * 100, paired * 100))
    with open(os.path.join(outdir, "bench.json"), "w") as f:
        json.dump({"rps": rps, "median": {"molt": m, "plain": p},
                   "ratio": ratio, "paired_ratio": paired,
                   "problems": problems}, f, indent=1)
    for pr in problems:
        log("PROBLEM: " + pr)
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--short", action="store_true",
                    help="CI mode: a few seconds in all")
    ap.add_argument("--molt-build", default=os.environ.get(
        "MOLT_BUILD", os.path.join(ROOT, "build")),
        help="molt build directory (default: $MOLT_BUILD or <repo>/build)")
    ap.add_argument("--policy", choices=["immediate", "local", "global"],
                    help="molt apply --policy (default: molt's default)")
    ap.add_argument("--phase", type=float,
                    help="seconds of load before, between and after the "
                    "patches (default 4, --short 1.5)")
    ap.add_argument("--conns", type=int, help="client connections "
                    "(default 8, --short 4)")
    ap.add_argument("--threads", type=int, default=4,
                    help="server worker threads (default 4)")
    ap.add_argument("--pipeline", type=int, default=1,
                    help="loadgen requests in flight per connection")
    ap.add_argument("--out", default=os.path.join(HERE, "obj", "demo"),
                    help="directory for reports and logs")
    ap.add_argument("--no-build", action="store_true",
                    help="do not run make first")
    ap.add_argument("--rollback", action="store_true",
                    help="after the three patches, undo them one by one with "
                    "molt rollback (the clients then accept versions going "
                    "backwards)")
    ap.add_argument("--plain", action="store_true",
                    help="plain-gcc server, no molt, no patches")
    ap.add_argument("--selftest", action="store_true",
                    help="check the load generator's checker (no molt)")
    ap.add_argument("--bench", action="store_true",
                    help="P7 throughput comparison with kvbench (no patches)")
    ap.add_argument("--rounds", type=int,
                    help="--bench rounds per server (default 5, --short 2)")
    ap.add_argument("--bench-pipeline", type=int, default=32,
                    help="kvbench requests in flight per connection")
    ap.add_argument("--verbose", "-v", action="store_true")
    args = ap.parse_args()
    if args.phase is None:
        # Short phases still leave >= 0.5 s "after" each patch once the
        # +-0.5 s "during" windows are cut out.
        args.phase = 1.5 if args.short else 4.0
    if args.conns is None:
        args.conns = 4 if args.short else 8
    args.molt_build = os.path.abspath(args.molt_build)
    os.makedirs(args.out, exist_ok=True)
    if args.selftest:
        return selftest(args, args.out)
    if args.plain:
        return plain(args, args.out)
    if args.bench:
        return bench(args, args.out)
    return demo(args, args.out)


if __name__ == "__main__":
    sys.exit(main())
