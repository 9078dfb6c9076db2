#!/usr/bin/env python3
"""shadow.py -- kvfull shadowed by itself under multi-threaded load.

A shadowed update (docs/design.md §17) of v1 to v1 itself (rebuilt with
--molt-from v1): the follower replays every call of the acceptor and the
workers while busy clients keep their connections from before the fork,
new persistent clients connect after it and churn threads open, use and
close short connections all the time (the acceptor hands each to a worker,
the case that diverged falsely before inter-thread ordering was handled).
Nothing differs between the versions, so any divergence is a false one:
the run fails on a divergence, a follower that ended, a wrong reply or a
follower that does not catch up.

  ./shadow.py [--seconds 60] [--molt-build DIR] [--obj DIR] [--workers 4]

Prints one line per 10 s and a summary: requests, connections, calls
recorded and compared, divergences (must be 0).
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from loadgen import CheckError, Client, Load  # noqa: E402


def status(molt, pid):
    r = subprocess.run([molt, "status", "--json", str(pid)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=30)
    if r.returncode:
        raise SystemExit("shadow: molt status failed: %s" % r.stderr.strip())
    return json.loads(r.stdout)["shadow"]


class Churn:
    """Threads that each connect, make a few checked requests and close,
    over and over: connections accepted after the fork, handed by the
    acceptor to a worker, closed, their numbers reused."""

    def __init__(self, port, n=2):
        self.port = port
        self.stopping = threading.Event()
        self.connections = 0
        self.requests = 0
        self.errors = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i, n), daemon=True)
                        for i in range(n)]
        for t in self.threads:
            t.start()

    def run(self, i, n):
        k = 0
        while not self.stopping.is_set():
            try:
                c = Client(10000 + i + n * k, self.port, keys=4)  # keys of its own
                for _ in range(6):
                    c.step()
                n = c.requests
                c.close()
                if c.errors:
                    raise CheckError("; ".join(c.errors))
            except (OSError, CheckError) as e:
                with self.lock:
                    self.errors.append("churn: %s" % e)
                return
            with self.lock:
                self.connections += 1
                self.requests += n
            k += 1

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--molt-build", default=os.environ.get(
        "MOLT_BUILD", os.path.join(ROOT, "build")))
    ap.add_argument("--obj", default=os.path.join(HERE, "obj"))
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    build = os.path.abspath(args.molt_build)
    molt = os.path.join(build, "bin", "molt")
    moltcc = os.path.join(build, "bin", "moltcc")
    obj = os.path.abspath(args.obj)
    r = subprocess.run(["make", "-s", "-C", HERE, "MOLT_BUILD=" + build, "O=" + obj,
                        os.path.join(obj, "v1.so")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        sys.stdout.write(r.stdout)
        raise SystemExit("shadow: build failed")
    v1 = os.path.join(obj, "v1.so")
    same = os.path.join(obj, "v1-same.so")
    srcs = sorted(os.path.join(HERE, "v1", f) for f in os.listdir(os.path.join(HERE, "v1"))
                  if f.endswith(".c"))
    r = subprocess.run([moltcc, "--molt-program", "-O2", "-g", "-I" + os.path.join(HERE, "v1"),
                        "-o", same] + srcs + ["--molt-from", v1],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        sys.stdout.write(r.stdout)
        raise SystemExit("shadow: building v1-same failed")

    os.makedirs(os.path.join(obj, "shadow"), exist_ok=True)
    errlog = open(os.path.join(obj, "shadow", "server.log"), "w")
    env = dict(os.environ)
    # the follower is the child of a multi-threaded fork() that starts threads
    env["TSAN_OPTIONS"] = (env.get("TSAN_OPTIONS", "") + " die_after_fork=0").strip()
    server = subprocess.Popen([molt, "run", v1, "--port", "0", "--workers",
                               str(args.workers)], stdout=subprocess.PIPE, stderr=errlog,
                              text=True, env=env)
    problems = []
    try:
        first = server.stdout.readline()
        m = re.search(r"127\.0\.0\.1:(\d+) pid (\d+)", first)
        if not m:
            raise SystemExit("shadow: the server did not start: %r" % first)
        port, pid = int(m.group(1)), int(m.group(2))
        before = Load(port, busy=3, idle=2)
        before.start()
        time.sleep(0.5)
        r = subprocess.run([molt, "update", "--shadow", str(pid), same, "--timeout", "20"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode:
            raise SystemExit("shadow: molt update --shadow failed: %s" % r.stdout.strip())
        t0 = time.monotonic()
        after = Load(port, busy=0, idle=0)  # persistent, accepted after the fork
        after.idle = [Client(300 + i, port) for i in range(1)]
        after.busy = [Client(200 + i, port) for i in range(2)]
        after.threads = [threading.Thread(target=after._run, args=(c,), daemon=True)
                         for c in after.busy]
        after.start()
        churn = Churn(port)
        next_line = t0 + 10
        s = status(molt, pid)
        while time.monotonic() - t0 < args.seconds and s["stage"] == "shadowing":
            time.sleep(0.5)
            s = status(molt, pid)
            if time.monotonic() >= next_line:
                next_line += 10
                print("%3.0f s: %d calls recorded, %d compared, %d connections made" %
                      (time.monotonic() - t0, s["recorded"], s["compared"], churn.connections),
                      flush=True)
        churn.stop()
        after.stop()
        before.stop()
        want = s["recorded"]
        deadline = time.monotonic() + 30
        while s["stage"] == "shadowing" and s["compared"] < want and time.monotonic() < deadline:
            time.sleep(0.2)
            s = status(molt, pid)
        requests = before.requests() + after.requests() + churn.requests
        errors = before.errors() + after.errors() + churn.errors
        print("shadow of v1 by itself, %.0f s, %d workers: %d requests, %d connections "
              "made after the fork, %d calls recorded, %d compared, %d divergences, "
              "stage %s" % (args.seconds, args.workers, requests, churn.connections,
                            s["recorded"], s["compared"], s["divergences"], s["stage"]))
        if s["stage"] != "shadowing":
            problems.append("the shadow ended: %s" % s["outcome"])
        if s["divergences"]:
            problems.append("%d divergences: %s" % (s["divergences"], s["outcome"]))
        if s["compared"] < want:
            problems.append("the follower did not catch up (%d of %d)" % (s["compared"], want))
        if errors:
            problems.append("%d client errors, first: %s" % (len(errors), errors[0]))
        if churn.connections < 10:
            problems.append("only %d connections made after the fork" % churn.connections)
        subprocess.run([molt, "rollback", str(pid)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        for c in before.clients() + after.clients():
            c.close()
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
    for p in problems:
        print("shadow: FAILED: %s" % p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
