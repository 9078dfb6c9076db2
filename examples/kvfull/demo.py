#!/usr/bin/env python3
"""demo.py -- a streak of full updates of a loaded, connected kvfull server.

  ./demo.py [--short] [--molt-build DIR] [--no-build] [--out DIR]

1. builds obj/v1.so, obj/v2.so (--molt-from v1, v2.xf: array -> chained
   hash table, new field `rev`), obj/v3.so (--molt-from v2, v3.xf: rev int
   -> long, total_served renamed requests_served, new command INCR);
2. starts `molt run obj/v1.so --port 0` and the checked load (loadgen.py):
   busy clients issue requests back to back, idle clients store their keys
   and then stay connected without a word; every client keeps its one
   connection for the whole run;
3. one client sends half a request ("SET partial hel") before the first
   update and the rest after it: the half line waits in the connection's
   buffer, which migrates with the rest of the state;
4. `molt update <pid> obj/v2.so`, then `molt update <pid> obj/v3.so`, each
   while the load runs; after each, a fresh connection must see the new
   VERSION, the PID and the thread ids are unchanged;
5. stops the load, checks every key of every client (value, revision), INCR,
   COUNT, and stops the server with SIGTERM (it must exit 0 from v3).

Prints a report: per update the time `molt update` took, what it reported,
the longest wait of a client for one reply around it; requests served;
errors (must be 0).  Exit status 0 only if everything held.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import loadgen  # noqa: E402


def log(msg=""):
    print(msg, flush=True)


def one_shot(port, line):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall((line + "\n").encode())
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
        return buf.decode().strip()


def tids(pid):
    return sorted(int(t) for t in os.listdir("/proc/%d/task" % pid))


def image_mapped(pid, image):
    """Lines of /proc/PID/maps of the image (molt maps a sealed memfd copy
    named after the file)."""
    name = os.path.basename(image)
    with open("/proc/%d/maps" % pid) as f:
        return [l.strip() for l in f if l.rstrip().endswith("/memfd:" + name)
                or l.rstrip().endswith("/memfd:%s (deleted)" % name)
                or l.rstrip().endswith("/" + name)]


def wait_unmapped(pid, image, timeout=5.0):
    end = time.monotonic() + timeout
    while image_mapped(pid, image) and time.monotonic() < end:
        time.sleep(0.02)
    return not image_mapped(pid, image)


UPDATE_RE = {
    "threads_restarted": re.compile(r"(\d+) threads? restarted"),
    "objects_migrated": re.compile(r"(\d+) objects? migrated"),
    "pause_ms": re.compile(r"pause ([0-9.]+) ms"),
    "total_ms": re.compile(r"total ([0-9.]+) ms"),
}


def parse_update(text):
    """What `molt update` / `molt log` say about one update."""
    out = {}
    for k, rx in UPDATE_RE.items():
        m = rx.search(text)
        if m:
            out[k] = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--short", action="store_true", help="~5 s instead of ~15 s")
    ap.add_argument("--molt-build", default=os.environ.get(
        "MOLT_BUILD", os.path.join(ROOT, "build")))
    ap.add_argument("--no-build", action="store_true", help="use obj/*.so as built")
    ap.add_argument("--obj", default=os.path.join(HERE, "obj"),
                    help="where the images are built (make O=DIR)")
    ap.add_argument("--moltcc", help="moltcc to build with (default: the build's)")
    ap.add_argument("--out", help="reports (default: OBJ/demo)")
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    build = os.path.abspath(args.molt_build)
    molt = os.path.join(build, "bin", "molt")
    args.obj = os.path.abspath(args.obj)
    args.out = args.out or os.path.join(args.obj, "demo")
    os.makedirs(args.out, exist_ok=True)
    phase = 1.0 if args.short else 4.0

    if not args.no_build:
        cmd = ["make", "-s", "-C", HERE, "MOLT_BUILD=" + build, "O=" + args.obj]
        if args.moltcc:
            cmd.append("MOLTCC=" + args.moltcc)
        log("$ " + " ".join(cmd))
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode:
            sys.stdout.write(r.stdout)
            raise SystemExit("demo: build failed")
    images = [os.path.join(args.obj, "v%d.so" % v) for v in (1, 2, 3)]

    errlog = open(os.path.join(args.out, "server.log"), "w")
    server = subprocess.Popen([molt, "run", images[0], "--port", "0",
                               "--workers", str(args.workers)],
                              stdout=subprocess.PIPE, stderr=errlog, text=True)
    problems = []
    report = {"updates": []}
    try:
        first = server.stdout.readline()
        m = re.search(r"127\.0\.0\.1:(\d+) pid (\d+)", first)
        if not m:
            raise SystemExit("demo: the server did not start: %r" % first)
        port, pid = int(m.group(1)), int(m.group(2))
        log("server: %s" % first.strip())
        if pid != server.pid:
            problems.append("the program's pid %d is not molt run's pid %d" % (pid, server.pid))
        tids0 = tids(pid)

        load = loadgen.Load(port, busy=4, idle=4)
        partial = loadgen.Client(200, port)
        load.start()
        log("load: %d busy + %d idle clients, each on one connection" %
            (len(load.busy), len(load.idle)))
        time.sleep(phase)
        partial.send_raw(b"SET partial hel")   # half a request, no newline

        for version, image in ((2, images[1]), (3, images[2])):
            before = load.requests()
            t0 = time.monotonic()
            r = subprocess.run([molt, "update", str(pid), image, "--timeout", "10"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            t1 = time.monotonic()
            out = r.stdout.strip()
            log("$ molt update %d %s   (%.1f ms)\n  %s" % (
                pid, image, (t1 - t0) * 1000,
                out.replace("\n", "\n  ")))
            if r.returncode:
                problems.append("molt update to v%d failed (exit %d): %s" % (version, r.returncode, out))
                break
            seen = one_shot(port, "VERSION")
            if seen != "VERSION %d" % version:
                problems.append("after the update a new connection got %r" % seen)
            if version == 2:
                partial.send_raw(b"lo world\n")
                rep = partial.readline()
                if rep != "STORED 1":
                    problems.append("the half-sent SET finished as %r, expected 'STORED 1'" % rep)
                rep = partial.req("GET partial")
                if rep != "VALUE hello world":
                    problems.append("GET partial: %r" % rep)
            time.sleep(phase / 2)
            tids1 = tids(pid)
            if tids1 != tids0:
                problems.append("thread ids changed: %s -> %s" % (tids0, tids1))
            old = images[version - 2]
            if not wait_unmapped(pid, old):
                problems.append("%s is still mapped after the update to v%d"
                                % (os.path.basename(old), version))
            if not image_mapped(pid, image):
                problems.append("%s is not mapped" % os.path.basename(image))
            report["updates"].append(dict(
                to=version, molt_update_ms=(t1 - t0) * 1000, output=out,
                max_reply_wait_ms=load.max_gap(t0 - 0.05, t1 + 0.05) * 1000,
                requests_during_phase=load.requests() - before,
                **parse_update(out)))
            time.sleep(phase / 2)

        # the new command, on a connection that has lived through both updates
        c = load.idle[0]
        c.do_version()
        if c.version == 3:
            for _ in range(3):
                c.do_incr()
        load.stop()
        for c in load.clients():
            c.verify()
        total_keys = sum(1 for c in load.clients() + [partial] for _ in c.expect) + 1
        count = one_shot(port, "COUNT")
        if count != "COUNT %d" % total_keys:
            problems.append("COUNT: %r, expected %d (every client's keys + 'partial')"
                            % (count, total_keys))
        stats = one_shot(port, "STATS")
        r = subprocess.run([molt, "log", str(pid)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=30)
        mlog = r.stdout
        if r.returncode:
            problems.append("molt log failed: %s" % mlog.strip())
        with open(os.path.join(args.out, "molt-log.txt"), "w") as f:
            f.write(mlog)
        events = [(l.split()[3], l) for l in mlog.splitlines()[1:] if len(l.split()) > 3]
        ups = [l for e, l in events if e == "update"]
        unloads = [l for e, l in events if e == "unload"]
        for u, l in zip(report["updates"], ups):
            u["log"] = parse_update(l)
        if len(unloads) < 2:
            problems.append("molt log shows %d image unloads, expected 2" % len(unloads))
        for c in load.clients():
            if 3 not in c.versions:
                problems.append("client %d never saw version 3 (saw %s)" % (c.cid, sorted(c.versions)))
        problems += load.errors()
        requests = load.requests()
        for c in load.clients() + [partial]:
            c.close()
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        try:
            rc = server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            rc = "killed after 20 s"
        errlog.close()
    if rc != 0:
        problems.append("the server exited with %s (see %s)" % (rc, os.path.join(args.out, "server.log")))
    with open(os.path.join(args.out, "server.log")) as f:
        slog = f.read()
    if "version 3 stopping" not in slog:
        problems.append("the server did not stop as version 3")

    log("\n== kvfull full-update demo ==")
    log("connections: %d busy + %d idle + 1 partial, all kept across 2 updates"
        % (len(load.busy), len(load.idle)))
    for u in report["updates"]:
        lg = u.get("log", {})
        log("update to v%d: %s threads restarted, %s objects migrated, pause %s ms "
            "(runtime), update total %s ms (molt log), `molt update` %.1f ms; "
            "longest client wait for one reply around it %.1f ms"
            % (u["to"], u.get("threads_restarted", "?"), u.get("objects_migrated", "?"),
               u.get("pause_ms", "?"), lg.get("total_ms", "?"), u["molt_update_ms"],
               u["max_reply_wait_ms"]))
    log("requests served by the clients: %d   (server: %s)" % (requests, stats))
    log("errors: %d" % len(problems))
    for p in problems[:20]:
        log("  " + p)
    report.update(requests=requests, errors=problems, server_stats=stats)
    with open(os.path.join(args.out, "demo.json"), "w") as f:
        json.dump(report, f, indent=1)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
