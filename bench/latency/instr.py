#!/usr/bin/env python3
"""instr.py — instructions the kvstore's workers execute per request during
a patch window and outside one (callgrind, exact; issue 14, item 4).

    MOLT_BUILD=... LAT_WORK=... python3 bench/latency/instr.py [--rounds 5] [--requests 2000]

(run by `hiccup.sh --instr`, which builds first.)  The kvstore (1 worker by
default: with more, which one wakes for a request varies) runs under `valgrind --tool=callgrind --separate-threads=yes`; a closed-loop
client on one connection sends GETs of existing keys (every request the
same work).  Each round has three intervals, counted apart with
`callgrind_control --dump` (which dumps and zeroes every thread's
counters):

  transition  `molt apply <pid> <patch> --policy immediate` is started,
              and requests are sent until it returned and the transition
              is over (`molt status`: one live generation, no function on
              the dispatch path);
  tail        more requests, up to REQUESTS from the apply on (transition
              + tail is the *window*: the update's cost spread over a
              fixed stretch of requests);
  outside     REQUESTS requests in the steady state of the same version;
  control     as many again: the A/A control (how far two identical
              stretches differ).

Per interval: the instructions of the worker threads (the files of the
threads that run worker_main) over the requests the client counted, and
the runtime thread's (runtime_main) for comparison.  Target: the window's
per-request count within 1% of outside's.  The same patch pair as
latbench.py, alternating.  Writes results/instr.md and results/instr.json.
"""
import argparse
import glob
import json
import os
import re
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PATCHES = ["fix-del.so", "value-length.so"]


def log(msg):
    print(msg, flush=True)


class Client:
    def __init__(self, port, keys):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.s.makefile("rb")
        self.keys = keys
        self.i = 0
        for k in range(keys):
            self.req(b"SET key:%d value-%d\r\n" % (k, k), b"OK")

    def req(self, line, want):
        self.s.sendall(line)
        reply = self.f.readline()
        if not reply.startswith(want):
            raise SystemExit("instr: %r got %r" % (line, reply))

    def get(self):
        k = self.i % self.keys
        self.i += 1
        self.req(b"GET key:%d\r\n" % k, b"VALUE")


def dump(pid, tag):
    r = subprocess.run(["callgrind_control", "--dump=" + tag, str(pid)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit("instr: callgrind_control failed: %s %s" % (r.stdout, r.stderr))


def counts(outdir, tag):
    """Worker and runtime-thread instructions of the dump named tag."""
    workers = rt = 0
    nw = 0
    for f in glob.glob(os.path.join(outdir, "cg.out*")):
        text = open(f, errors="replace").read()
        if not re.search(r"^desc: Trigger:.*\b%s$" % re.escape(tag), text, re.M):
            continue
        m = re.search(r"^(?:summary|totals): *(\d+)", text, re.M)
        total = int(m.group(1)) if m else 0
        # (A name is given once, in the first fn= or cfn= line naming it.)
        if re.search(r"^c?fn=\(\d+\) worker_main$", text, re.M):
            workers += total
            nw += 1
        elif re.search(r"^c?fn=\(\d+\) runtime_main$", text, re.M):
            rt += total
    return workers, rt, nw


def transition_over(molt, pid):
    r = subprocess.run([molt, "status", str(pid), "--json"], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        return False
    st = json.loads(r.stdout)
    live = st.get("live_generations", [])
    fns = st.get("functions", [])
    dispatching = [f for f in fns if isinstance(f, dict) and
                   f.get("entry") == "dispatch"]
    return len(live) == 1 and not dispatching


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1,
                    help="kvstore worker threads (with more, which one wakes for a request "
                         "and how many wake in vain varies from run to run)")
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    cfg = ap.parse_args()
    work = os.environ.get("LAT_WORK", "/tmp/molt-latency")
    molt = os.path.join(os.environ.get("MOLT_BUILD", "/tmp/lat-build"), "bin", "molt")
    outdir = os.path.join(work, "instr", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(outdir)
    vg = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--smc-check=all",
         "--callgrind-out-file=" + os.path.join(outdir, "cg.out"),
         os.path.join(work, "kvstore"), "--port", "0", "--threads", str(cfg.threads)],
        stdout=subprocess.PIPE, stderr=open(os.path.join(outdir, "valgrind.log"), "w"),
        text=True)
    rows, out = [], {"rounds": []}
    try:
        line = vg.stdout.readline()
        if not line.startswith("listening on"):
            raise SystemExit("instr: kvstore did not start under valgrind: %r" % line)
        port = int(line.rsplit(":", 1)[1])
        c = Client(port, 100)
        # The first apply of a fresh server registers the workers and loads
        # the first patch: a round before the counted ones.
        for i in range(cfg.rounds + 1):
            dump(vg.pid, "skip-%d" % i)
            apply = subprocess.Popen([molt, "apply", str(vg.pid),
                                      os.path.join(work, "patches", PATCHES[i % 2]),
                                      "--policy", "immediate", "--timeout", "30"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            t0 = time.monotonic()
            n_tr, over = 0, False
            while not over:
                for _ in range(10):
                    c.get()
                n_tr += 10
                if apply.poll() is None:
                    continue
                over = transition_over(molt, vg.pid)
                if time.monotonic() - t0 > 300:
                    raise SystemExit("instr: the transition did not end within 300 s")
            if apply.returncode != 0:
                raise SystemExit("instr: molt apply failed: %s" % apply.stdout.read())
            dump(vg.pid, "trans-%d" % i)
            n_tail = max(cfg.requests - n_tr, 0)
            for _ in range(n_tail):
                c.get()
            dump(vg.pid, "tail-%d" % i)
            # Outside: the same version's steady state (the two patches
            # differ in cmd_get, so a request's cost depends on which one
            # is current).
            for _ in range(cfg.requests):
                c.get()
            dump(vg.pid, "outside-%d" % i)
            n_out = cfg.requests
            # The A/A control: the same again.
            for _ in range(cfg.requests):
                c.get()
            dump(vg.pid, "control-%d" % i)
            if i == 0:
                continue
            wo, ro, _ = counts(outdir, "outside-%d" % i)
            wt, rt, _ = counts(outdir, "trans-%d" % i)
            wl, rl, _ = counts(outdir, "tail-%d" % i)
            wc, _, _ = counts(outdir, "control-%d" % i)
            r = {"outside_requests": n_out, "outside_worker_instr": wo, "outside_rt_instr": ro,
                 "transition_requests": n_tr, "transition_worker_instr": wt,
                 "transition_rt_instr": rt, "tail_requests": n_tail, "tail_worker_instr": wl,
                 "tail_rt_instr": rl, "control_requests": n_out, "control_worker_instr": wc}
            out["rounds"].append(r)
            po, pt, pw = wo / n_out, wt / n_tr, (wt + wl) / (n_tr + n_tail)
            pc = wc / n_out
            rows.append("| %d | %.0f | %.0f (%+.2f%%) | %.0f (%+.1f%%) | %.0f (%+.2f%%) | %d | %.0f |"
                        % (i, po, pc, (pc / po - 1) * 100, pt, (pt / po - 1) * 100, pw,
                           (pw / po - 1) * 100, n_tr, rt))
            log("round %d: outside %.0f, transition %.0f (%d requests), window of %d requests "
                "%.0f instructions per request" % (i, po, pt, n_tr, n_tr + n_tail, pw))
    finally:
        vg.terminate()
        try:
            vg.wait(timeout=60)
        except subprocess.TimeoutExpired:
            vg.kill()
    ro = out["rounds"]
    req = lambda k: sum(r[k + "_requests"] for r in ro)  # noqa: E731
    ins = lambda k: sum(r[k + "_worker_instr"] for r in ro)  # noqa: E731
    tot_o = ins("outside") / req("outside")
    tot_t = ins("transition") / req("transition")
    tot_w = (ins("transition") + ins("tail")) / (req("transition") + req("tail"))
    tot_c = ins("control") / req("control")
    out.update(control_per_request=tot_c, control_percent=(tot_c / tot_o - 1) * 100)
    out.update(outside_per_request=tot_o, transition_per_request=tot_t,
               window_per_request=tot_w, transition_extra_percent=(tot_t / tot_o - 1) * 100,
               window_extra_percent=(tot_w / tot_o - 1) * 100)
    md = ["## Instructions per request of the kvstore's workers, in and out of a patch window",
          "",
          "callgrind (`--separate-threads=yes`), kvstore with %d workers, closed-loop GETs of "
          "existing keys on one connection. Per round: `molt apply --policy immediate` and "
          "requests until the transition is over (`molt status`: one live generation, no entry "
          "on the dispatch path: *transition*), more requests up to %d from the apply on "
          "(*window*: the transition's cost spread over a fixed stretch of requests), then %d "
          "requests in the steady state of the same version (*outside*) and as many again (the "
          "A/A control: how far two identical stretches differ); the two patches alternate. Instructions of the threads running "
          "`worker_main` over the requests the client counted; the runtime thread's during the "
          "transition for comparison." % (cfg.threads, cfg.requests, cfg.requests),
          "",
          "| round | outside / request | A/A control / request | transition / request | "
          "window / request | transition requests | runtime thread in the transition |",
          "|---|---|---|---|---|---|---|"] + rows + [
          "| all | %.0f | %.0f (%+.2f%%) | %.0f (%+.1f%%) | %.0f (**%+.2f%%**) | | |" % (
              tot_o, tot_c, out["control_percent"], tot_t, out["transition_extra_percent"],
              tot_w, out["window_extra_percent"]),
          "",
          "Target (issue 14): ≤ 1%% extra per request during a patch window: %s over the "
          "window of %d requests, %s over the transition alone." % (
              "met" if out["window_extra_percent"] <= 1 else "**missed**", cfg.requests,
              "met" if out["transition_extra_percent"] <= 1 else "**missed**"),
          "",
          "Command: `bash bench/latency/hiccup.sh --instr %s` (%s)." % (
              " ".join(sys.argv[1:]), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))]
    os.makedirs(cfg.results, exist_ok=True)
    with open(os.path.join(cfg.results, "instr.json"), "w") as f:
        json.dump(out, f, indent=1)
    with open(os.path.join(cfg.results, "instr.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
