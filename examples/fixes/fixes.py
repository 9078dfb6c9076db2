#!/usr/bin/python3
"""Real security fixes of real servers, as hot patches (run by run.sh).

For each server: its Debian source package (apt-get source), the sources
before the security fixes, built with CC=moltcc; each fix built straight from
its patch file (moltcc --molt-patch --molt-diff), the refusals checked; then
the server runs under a checking load, and every built fix is applied with
`molt apply`, its demonstration request made before and after; every reply
of the load is checked.  Writes WORK/summary.json and prints a table.
Exit status 0 only if every fix was built/applied or refused as expected,
every demo changed as expected and no reply failed; a fix blocked by a known
moltcc problem is recorded as blocked (not a pass) and fails the run only
with --strict.

    fixes.py --work DIR --moltcc M --molt M [--quick] [--only a,b] [--fixes x,y] [--rebuild] [--strict]
"""
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "common"))
from harness import Failure, Harness, arguments, table  # noqa: E402

SERVERS = ["tinyproxy", "dnsmasq", "nginx"]
QUICK_SERVER = "dnsmasq"


def load_server(name):
    spec = importlib.util.spec_from_file_location(name + "_server", os.path.join(HERE, name, "server.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def molt_key(repo):
    """What the server builds depend on: the committed moltcc, molt.h and
    runtime of the repository (git tree ids), and the moltcc used."""
    try:
        return subprocess.check_output(["git", "-C", repo, "rev-parse", "HEAD:tools", "HEAD:include",
                                        "HEAD:src"], text=True, stderr=subprocess.DEVNULL).split()
    except (OSError, subprocess.CalledProcessError):
        return ["unknown"]


def build_server(h, srv, args):
    """The server's moltcc build, reused when it exists (WORK/<server>/built.json):
    with --quick only if molt did not change since (molt_key), otherwise with
    a note (a full nginx build takes long; --rebuild builds again)."""
    stamp = os.path.join(h.work, srv.NAME, "built.json")
    key = molt_key(h.repo) + [h.moltcc]
    if not args.rebuild and os.path.exists(stamp) and os.path.exists(srv.binary(h)):
        with open(stamp) as f:
            info = json.load(f)
        same = info.get("key") == key
        if same or not args.quick:
            print("== %s: reusing the build in %s%s" % (srv.NAME, srv.binary(h), "" if same else
                  " (made with another moltcc or molt: --rebuild builds again)"))
            return info
    print("== %s: apt-get source %s=%s, sources before %s" % (srv.NAME, srv.PACKAGE, srv.VERSION,
                                                              srv.FIRST_FIX))
    tree = h.source_tree(srv)
    print("== %s: building with CC=moltcc (every function updatable)" % srv.NAME)
    rc, wall, cpu = srv.build(h, tree)
    info = {"moltcc": h.moltcc, "key": key, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "binary": srv.binary(h)}
    with open(stamp, "w") as f:
        json.dump(info, f)
    print("   built in %.1f s wall, %.1f s CPU" % (wall, cpu))
    return info


def demo(h, srv, fix, port, proc):
    try:
        return fix.demo(h, port, proc)
    except Exception as e:     # a demo that cannot reach the server says so
        return "demo error: %s" % e


def run_server(h, srv, args):
    fixes = [f for f in srv.fixes() if (f.quick or not args.quick) and
             (not args.fixes or f.name in args.fixes.split(","))]
    by_name = {f.name: f for f in srv.fixes()}
    for f in fixes:
        f.result["server"] = srv.NAME
    out = {"server": srv.NAME, "package": "%s=%s" % (srv.PACKAGE, srv.VERSION)}
    out["build"] = build_server(h, srv, args)

    # 1. every hot patch, straight from its patch file
    sos = {}
    for f in fixes:
        so = h.build_patch(srv, f, by_name)
        r = f.result
        print("== %s %s (%s): %s%s" % (srv.NAME, f.name, f.patch, r["status"],
              ", replaces %d: %s" % (len(r["replaced"]), " ".join(r["replaced"][:8])) if so else
              " -- " + r["reason"][:300]))
        if so:
            sos[f.name] = so

    # 2. demos that would break the live server run on a throwaway instance first
    for f in fixes:
        if f.name in sos and f.demo and f.before_on_throwaway:
            p, port = srv.start(h, tag="throwaway", port=srv.THROWAWAY, limit_as=1 << 31)
            f.result["demo_before"] = demo(h, srv, f, port, p)
            h.stop(p, signal.SIGKILL)
            f.result["demo_before"] += " (throwaway instance, exit %s)" % p.returncode

    # 3. the live server under load; the fixes applied one by one
    proc, port = srv.start(h)
    for f in fixes:
        if f.name in sos and f.demo and not f.before_on_throwaway:
            f.result["demo_before"] = demo(h, srv, f, port, proc)
    load = srv.load(h)
    settle = 1.0 if args.quick else 2.0
    time.sleep(settle)
    for f in fixes:
        if f.name not in sos:
            continue
        r = f.result
        n0, f0 = load.counts()
        rc, ms, text = h.apply(proc.pid, sos[f.name])
        r["apply_ms"] = ms
        if f.demo:
            r["demo_after"] = demo(h, srv, f, port, proc)
        time.sleep(settle)
        n1, f1 = load.counts()
        r["load_replies"], r["load_failed"] = n1 - n0, f1 - f0
        if rc != 0:
            r["status"], r["reason"] = "FAILED", "molt apply: " + text
        else:
            r["status"] = "applied"
        if f.demo:
            r["demo_ok"] = bool(re.search(f.expect_before, r["demo_before"] or "") and
                                re.search(f.expect_after, r["demo_after"] or ""))
        print("== %s %s: molt apply rc=%d in %.1f ms; load %d replies, %d failed; demo: %s -> %s" % (
            srv.NAME, f.name, rc, ms, n1 - n0, f1 - f0, r["demo_before"], r["demo_after"]))
    time.sleep(settle)
    final = load.finish()
    out["load"] = final
    out["alive"] = proc.poll() is None
    status = h.run([h.molt, "status", str(proc.pid)], "%s-status.log" % srv.NAME, check=False)[0]
    out["molt_status_rc"] = status
    out["exit"] = h.stop(proc)
    print("== %s: load %d replies, %d failed (%s req/s); server %s, exit status %s" % (
        srv.NAME, final["requests"], final["failed"], final.get("req_per_s"),
        "alive until stopped" if out["alive"] else "DIED", out["exit"]))
    out["fixes"] = [f.result for f in fixes]
    return out


def verdict(results, strict):
    problems = []
    for s in results:
        if "error" in s:
            problems.append("%s: %s" % (s["server"], s["error"]))
            continue
        if s["load"]["failed"] or not s["load"]["ok"]:
            problems.append("%s: %d failed replies" % (s["server"], s["load"]["failed"]))
        if not s["alive"]:
            problems.append("%s: the server died" % s["server"])
        for r in s["fixes"]:
            if r["status"] == "FAILED" or (r["status"] == "blocked" and strict):
                problems.append("%s %s: %s" % (s["server"], r["fix"], r["reason"]))
            if r["demo_ok"] is False:
                problems.append("%s %s: demo %r -> %r not as expected" % (
                    s["server"], r["fix"], r["demo_before"], r["demo_after"]))
    return problems


def main():
    ap = arguments()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only")
    ap.add_argument("--fixes", help="only these fixes (names as in the table)")
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--strict", action="store_true")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else ([QUICK_SERVER] if args.quick else SERVERS)
    h = Harness(args.work, args.repo, args.moltcc, args.molt, quick=args.quick)
    results = []
    t0 = time.time()
    try:
        for n in names:
            srv = load_server(n)
            try:
                results.append(run_server(h, srv, args))
            except Failure as e:
                print("== %s: %s" % (n, e))
                results.append({"server": n, "error": str(e), "fixes": []})
            finally:
                h.cleanup()
    finally:
        h.cleanup()
    problems = verdict(results, args.strict)
    # every server's latest result stays in its folder; summary.json holds
    # this run's servers and, marked as earlier, the latest of the others
    for s in results:
        s["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
        s["quick"] = args.quick
        with open(os.path.join(args.work, s["server"], "result.json"), "w") as f:
            json.dump(s, f, indent=1)
    if not args.quick:
        for n in SERVERS:
            old = os.path.join(args.work, n, "result.json")
            if n not in names and os.path.exists(old):
                with open(old) as f:
                    prev = json.load(f)
                if not prev.get("quick"):
                    prev["earlier_run"] = True
                    results.append(prev)
    results.sort(key=lambda s: SERVERS.index(s["server"]))
    rows = [r for s in results for r in s["fixes"]]
    summary = {"quick": args.quick, "seconds": round(time.time() - t0, 1), "servers": results,
               "this_run": names, "problems": problems,
               "counts": {k: sum(1 for r in rows if r["status"] == k)
                          for k in ("applied", "refused", "blocked", "FAILED")}}
    with open(os.path.join(args.work, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print()
    print(table(rows))
    print()
    print("fixes applied live: %(applied)d, refused as expected: %(refused)d, blocked: %(blocked)d, "
          "failed: %(FAILED)d" % summary["counts"])
    earlier = [s["server"] + " (" + s["finished_at"] + ")" for s in results if s.get("earlier_run")]
    if earlier:
        print("from earlier runs: " + ", ".join(earlier))
    print("summary: %s" % os.path.join(args.work, "summary.json"))
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
