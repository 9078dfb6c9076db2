#!/usr/bin/env python3
"""loadgen.py -- checked load for the kvstore live-update demo.

Opens N client connections that stay open for the whole run.  Each one sends
a steady mix of GET / SET / DEL / INCR / STATS / bad commands on keys that
only it uses (its own key prefix), so it can predict every reply from its own
model of those keys, and it checks every reply.  It runs until --duration
expires, SIGINT/SIGTERM, --stop-file appears, or stdin is closed
(--stop-on-eof), then writes a JSON report.  Exit status 0 means: requests
were served and not a single reply was wrong or missing.

Checking replies across live patches
------------------------------------
The server's command layer changes while we talk to it.  Every version has a
known behaviour (VERSIONS below).  The difficulty is to accept the new
behaviour exactly when the new version may have answered, without turning
the patch boundary into false failures and without accepting a wrong reply.

Each connection sends its commands in groups; every group ends with a
VERSION probe.  Replies of one connection are produced in order, and a
version, once it has served a connection, never gives way to an older one
(molt switches generations forward; with --allow-rollback this assumption is
dropped and each group is checked against every version between the probes
around it).  So every request between a probe that said A and the next probe
that said B was served by a version in [A, B]:

  * outside a patch window A == B and only that version's exact reply is
    accepted;
  * across the boundary the reply must match one of the versions in [A, B];
    the version it matched also proves the following requests cannot be
    older (the lower bound moves up), and a STATS reply (which names its
    version) bounds the requests before it from above.

The model of the keys is updated with the effect of the version whose reply
matched, so e.g. an INCR that one version rejects and the next one executes
keeps the model exact.  STATS counters are checked to be consistent with what
this connection alone has done and to never go backwards: a patch that got
its own copy of the server's statistics instead of the running instance would
show up as counters that drop.

Latency of every request is recorded with its send time (time.monotonic(),
the same clock as CLOCK_MONOTONIC in other processes of the machine), so
latency can be split into windows around events (see --marks).
"""

import argparse
import array
import json
import os
import random
import re
import signal
import socket
import sys
import threading
import time

# ---------------------------------------------------------------------------
# Protocol versions: what each version of the command layer does.
# ---------------------------------------------------------------------------
#   1.0  as built.  Bug: DEL of a missing key answers DELETED.
#   1.1  patch fix-del: DEL of a missing key answers NOT_FOUND.
#   1.2  patch value-length: GET answers "VALUE <len> <value>".
#   1.3  patch new-command: INCR key -> "INTEGER <n>".
VERSIONS = ["1.0", "1.1", "1.2", "1.3"]
FEATURES = {
    "1.0": frozenset(),
    "1.1": frozenset({"fix-del"}),
    "1.2": frozenset({"fix-del", "value-length"}),
    "1.3": frozenset({"fix-del", "value-length", "incr"}),
}
VINDEX = {v: i for i, v in enumerate(VERSIONS)}

INT_RE = re.compile(r"-?[0-9]+\Z")
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
STATS_RE = re.compile(
    r"STATS keys=(\d+) gets=(\d+) sets=(\d+) dels=(\d+) hits=(\d+) "
    r"misses=(\d+) cmds=(\d+) conns=(\d+) version=(\S+)\Z")
STATS_FIELDS = ("keys", "gets", "sets", "dels", "hits", "misses", "cmds",
                "conns")
MONOTONIC_FIELDS = ("gets", "sets", "dels", "hits", "misses", "cmds")

# Operation codes, stored per request in the latency record.
OPS = ["GET", "SET", "DEL", "INCR", "STATS", "VERSION", "BOGUS", "BADARGS"]
OPCODE = {name: i for i, name in enumerate(OPS)}
# The steady mix (VERSION probes come on top, one per group).
MIX = [("GET", 40), ("SET", 28), ("DEL", 14), ("INCR", 10), ("STATS", 3),
       ("BOGUS", 2), ("BADARGS", 3)]

NOCHANGE = ("none",)


def expected(feats, op, model):
    """The reply version `feats` gives to `op`, and the op's effect on the
    model: (reply, effect)."""
    kind = op[0]
    if kind == "GET":
        v = model.get(op[1])
        if v is None:
            return "NOT_FOUND", NOCHANGE
        if "value-length" in feats:
            return "VALUE %d %s" % (len(v.encode("latin-1")), v), NOCHANGE
        return "VALUE " + v, NOCHANGE
    if kind == "SET":
        return "OK", ("set", op[1], op[2])
    if kind == "DEL":
        if op[1] in model:
            return "DELETED", ("del", op[1])
        return ("NOT_FOUND" if "fix-del" in feats else "DELETED"), NOCHANGE
    if kind == "INCR":
        if "incr" not in feats:
            return "ERROR unknown command", NOCHANGE
        v = model.get(op[1])
        if v is None:
            n = 0
        elif INT_RE.match(v) and INT64_MIN <= int(v) <= INT64_MAX:
            n = int(v)
        else:
            return "ERROR not an integer", NOCHANGE
        if n == INT64_MAX:
            return "ERROR not an integer", NOCHANGE
        return "INTEGER %d" % (n + 1), ("set", op[1], str(n + 1))
    if kind == "BOGUS":
        return "ERROR unknown command", NOCHANGE
    if kind == "BADARGS":
        return "ERROR wrong number of arguments", NOCHANGE
    raise ValueError(kind)


def pct(sorted_vals, p):
    """Nearest-rank percentile of an already sorted list (None if empty)."""
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1,
                   int(round(p / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[k]


def lat_summary(lats):
    """Latency summary in microseconds of a list of seconds."""
    s = sorted(lats)
    out = {"count": len(s)}
    for name, p in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9)):
        v = pct(s, p)
        out[name + "_us"] = None if v is None else round(v * 1e6, 1)
    out["max_us"] = round(s[-1] * 1e6, 1) if s else None
    return out


class Shared:
    """State shared by all connections (guarded by `lock`)."""

    def __init__(self, args):
        self.args = args
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.failures = []          # the first --max-failures, in detail
        self.failed = 0
        self.versions = {}          # version -> {"probes", "first_s", "last_s"}
        self.t_start = None


class Conn(threading.Thread):
    def __init__(self, shared, idx, run_id):
        super().__init__(name="conn-%d" % idx, daemon=True)
        self.sh = shared
        self.a = shared.args
        self.idx = idx
        self.rng = random.Random((self.a.seed or 0) * 1000003 + idx
                                 if self.a.seed is not None else None)
        self.keys = ["%s-%d-k%d" % (run_id, idx, i)
                     for i in range(self.a.keys)]
        self.model = {}
        self.lo = None            # lowest version that may serve us next
        self.allow_rollback = self.a.allow_rollback
        # What this connection alone has caused, for the STATS checks.
        self.own = dict.fromkeys(STATS_FIELDS, 0)
        self.last_stats = None
        # Per-request records.
        self.t_send = array.array("d")
        self.lat = array.array("d")
        self.opc = array.array("b")
        self.ok = array.array("b")
        self.served = 0
        self.failed = 0
        self.by_op = {}
        self.sock = None
        self.rfile = None
        self.dead = None

    # -- command generation --------------------------------------------------
    def rand_value(self):
        r = self.rng.random()
        if r < 0.25:
            return str(self.rng.randint(-50, 1000))
        if r < 0.28:
            n = self.rng.randint(200, 4000)
        else:
            n = self.rng.randint(1, 24)
        alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
        v = "".join(self.rng.choice(alphabet) for _ in range(n))
        if n >= 3 and self.rng.random() < 0.15:
            # An inner space: values are the rest of the line.
            i = self.rng.randint(1, n - 2)
            v = v[:i] + " " + v[i + 1:]
        return v

    def make_op(self):
        kind = self.rng.choices([m[0] for m in MIX],
                                weights=[m[1] for m in MIX])[0]
        key = self.rng.choice(self.keys)
        if kind == "GET":
            return ("GET", key), "GET " + key
        if kind == "SET":
            v = self.rand_value()
            return ("SET", key, v), "SET %s %s" % (key, v)
        if kind == "DEL":
            return ("DEL", key), "DEL " + key
        if kind == "INCR":
            return ("INCR", key), "INCR " + key
        if kind == "STATS":
            return ("STATS",), "STATS"
        if kind == "BOGUS":
            return ("BOGUS",), self.rng.choice(
                ["FROB " + key, "PUT %s x" % key, "GETT " + key, "HELLO"])
        return ("BADARGS",), self.rng.choice(
            ["GET", "DEL", "SET " + key, "GET %s extra" % key, "SET"])

    # -- failures --------------------------------------------------------------
    def fail(self, what, line=None, reply=None, expect=None, vrange=None):
        self.failed += 1
        with self.sh.lock:
            self.sh.failed += 1
            if len(self.sh.failures) < self.a.max_failures:
                self.sh.failures.append({
                    "t": round(time.monotonic() - self.sh.t_start, 6),
                    "conn": self.idx, "what": what, "request": line,
                    "reply": reply, "expected_any_of": expect,
                    "versions": vrange})
        if self.a.verbose:
            print("loadgen: FAIL conn %d: %s: %r -> %r (expected %r, versions %r)"
                  % (self.idx, what, line, reply, expect, vrange),
                  file=sys.stderr, flush=True)

    # -- I/O ---------------------------------------------------------------------
    def connect(self):
        s = socket.create_connection((self.a.host, self.a.port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(self.a.timeout)
        self.sock = s
        self.rfile = s.makefile("rb", buffering=1 << 16)

    def exchange(self, lines):
        """Sends lines (in chunks of --pipeline) and returns
        [(reply or None, t_send, latency)] in order.  None: no reply, the
        connection is dead."""
        out = []
        i = 0
        while i < len(lines):
            chunk = lines[i:i + self.a.pipeline]
            i += len(chunk)
            t0 = time.monotonic()
            try:
                self.sock.sendall(("\n".join(chunk) + "\n").encode("latin-1"))
                for _ in chunk:
                    raw = self.rfile.readline(1 << 20)
                    t1 = time.monotonic()
                    if not raw.endswith(b"\n"):
                        raise ConnectionError("connection closed by server"
                                              if not raw else "truncated reply")
                    out.append((raw[:-1].decode("latin-1"), t0, t1 - t0))
            except (OSError, ConnectionError) as e:
                self.dead = "%s: %s" % (type(e).__name__, e)
                out.extend((None, t0, 0.0) for _ in range(len(lines) - len(out)))
                return out
        return out

    # -- checking ----------------------------------------------------------------
    def vrange(self, lo, hi):
        return VERSIONS[lo:hi + 1]

    def check_stats(self, line, reply, lo, hi):
        """Returns the version index the STATS reply names (None if wrong)."""
        m = STATS_RE.match(reply)
        if not m:
            self.fail("malformed STATS", line, reply, ["STATS ..."],
                      self.vrange(lo, hi))
            return None
        vals = dict(zip(STATS_FIELDS, (int(x) for x in m.groups()[:8])))
        ver = m.group(9)
        vi = VINDEX.get(ver)
        if vi is None or not (lo <= vi <= hi):
            self.fail("STATS from unexpected version", line, reply,
                      ["version in %s" % self.vrange(lo, hi)],
                      self.vrange(lo, hi))
            return None
        # Lower bounds: this connection's own requests; the keys it holds
        # (no other client touches them); itself as an open connection.
        low = dict(self.own, keys=len(self.model), conns=1)
        bad = ["%s=%d < %d" % (f, vals[f], low[f]) for f in STATS_FIELDS
               if vals[f] < low[f]]
        if self.last_stats:
            bad += ["%s went backwards (%d < %d)" % (f, vals[f],
                                                     self.last_stats[f])
                    for f in MONOTONIC_FIELDS if vals[f] < self.last_stats[f]]
        if bad:
            self.fail("inconsistent STATS: " + ", ".join(bad), line, reply,
                      ["counters >= %s" % low], self.vrange(lo, hi))
            return None
        self.last_stats = vals
        return vi

    def note_own(self, op, reply):
        """Counts what this request did to the server's counters (STATS
        checks compare against these lower bounds)."""
        kind = op[0]
        self.own["cmds"] += 1
        if kind == "GET":
            self.own["gets"] += 1
            self.own["hits" if reply.startswith("VALUE") else "misses"] += 1
        elif kind == "SET":
            self.own["sets"] += 1
        elif kind == "DEL" and reply == "DELETED":
            # A 1.0 DEL of a missing key counts too, which only makes the
            # server's number larger: still a valid lower bound.
            self.own["dels"] += 1

    def validate(self, group, replies, lo, hi_probe):
        """Checks one group (commands + final probe) given that the version
        before it was at least `lo`.  Returns the new lower bound."""
        n = len(group)
        # Upper bound of each request: the next version marker after it
        # (a STATS reply or the final probe).  Computed backwards.
        his = [hi_probe] * n
        hi = hi_probe
        for j in range(n - 1, -1, -1):
            his[j] = hi
            op, _ = group[j]
            r = replies[j][0]
            if op[0] == "STATS" and r is not None:
                m = STATS_RE.match(r)
                if m and m.group(9) in VINDEX:
                    hi = min(hi, VINDEX[m.group(9)])
        # With rollbacks, versions may move both ways: every request of the
        # group is checked against all versions between the probe before it
        # and the probe after it, and nothing narrows that window.
        between = (min(lo, hi_probe), max(lo, hi_probe))
        for j, ((op, line), (reply, t0, lat)) in enumerate(zip(group, replies)):
            if self.allow_rollback:
                lo_j, hi_j = between
            else:
                lo_j, hi_j = lo, his[j]
            ok = False
            if reply is None:
                self.fail("no reply: " + (self.dead or "?"), line, None, None,
                          self.vrange(lo_j, hi_j))
            elif op[0] == "VERSION":
                vi = VINDEX.get(reply[8:]) if reply.startswith("VERSION ") else None
                if vi is None:
                    self.fail("unknown version", line, reply, VERSIONS, None)
                elif vi < lo and not self.allow_rollback:
                    self.fail("version went backwards", line, reply,
                              self.vrange(lo, len(VERSIONS) - 1),
                              self.vrange(lo, hi_j))
                else:
                    ok = True
                    lo = vi
                    self.note_version(reply[8:], t0)
            elif op[0] == "STATS":
                vi = self.check_stats(line, reply, lo_j, hi_j)
                if vi is not None:
                    ok = True
                    if not self.allow_rollback:
                        lo = max(lo, vi)
            else:
                cands = []
                for vi in range(lo_j, hi_j + 1):
                    exp, eff = expected(FEATURES[VERSIONS[vi]], op, self.model)
                    cands.append((vi, exp, eff))
                match = [c for c in cands if c[1] == reply]
                if not match:
                    self.fail("wrong reply", line, reply,
                              sorted({c[1][:80] for c in cands}),
                              self.vrange(lo_j, hi_j))
                else:
                    effs = {c[2] for c in match}
                    if len(effs) > 1:  # would be a bug in this table
                        self.fail("ambiguous reply", line, reply, None,
                                  self.vrange(lo_j, hi_j))
                    else:
                        ok = True
                        eff = match[0][2]
                        if eff[0] == "set":
                            self.model[eff[1]] = eff[2]
                        elif eff[0] == "del":
                            self.model.pop(eff[1], None)
                        if not self.allow_rollback:
                            lo = max(lo, match[0][0])
            if reply is not None:
                self.note_own(op, reply)
            self.t_send.append(t0 - self.sh.t_start)
            self.lat.append(lat)
            self.opc.append(OPCODE[op[0]])
            self.ok.append(1 if ok else 0)
            if ok:
                self.served += 1
                self.by_op[op[0]] = self.by_op.get(op[0], 0) + 1
        return lo

    def note_version(self, v, t0):
        t = round(t0 - self.sh.t_start, 6)
        with self.sh.lock:
            e = self.sh.versions.setdefault(v, {"probes": 0, "first_s": t,
                                               "last_s": t})
            e["probes"] += 1
            e["first_s"] = min(e["first_s"], t)
            e["last_s"] = max(e["last_s"], t)

    # -- main loop ---------------------------------------------------------------
    def run(self):
        try:
            self.connect()
        except OSError as e:
            self.dead = "connect: %s" % e
            self.fail("cannot connect: %s" % e)
            return
        finally:
            self.sh.connected.release()
        # First probe: the version serving us at the start.
        probe = (("VERSION",), "VERSION")
        r = self.exchange([probe[1]])
        self.lo = 0
        self.lo = self.validate([probe], r, 0, len(VERSIONS) - 1)
        while not self.sh.stop.is_set() and not self.dead:
            group = [self.make_op() for _ in range(self.a.probe_every)]
            group.append(probe)
            replies = self.exchange([g[1] for g in group])
            self.lo = self.validate(group, replies, self.lo,
                                    self.probe_hi(replies[-1][0]))
            if self.a.rate:
                time.sleep(len(group) / self.a.rate)
        try:
            self.sock.close()
        except OSError:
            pass

    def probe_hi(self, reply):
        """Upper bound for a group from its closing probe.  An unusable probe
        reply is reported by validate(); bound the group by the newest known
        version so its other replies are still checked."""
        if reply and reply.startswith("VERSION ") and reply[8:] in VINDEX:
            v = VINDEX[reply[8:]]
            return v if self.allow_rollback else max(v, self.lo)
        return len(VERSIONS) - 1


def load_marks(path):
    """Marks written by the driver (demo.py):
    {"start": t, "end": t, "events": [{"name": n, "t0": t, "t1": t}, ...]}
    with times from time.monotonic()."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def windows_from_marks(marks, margin, t_base, t_end):
    """Before / during (+-margin around each event) / after each event."""
    evs = sorted(marks.get("events", []), key=lambda e: e["t0"])
    wins = []
    start = t_base
    for i, e in enumerate(evs):
        d0, d1 = e["t0"] - margin, e.get("t1", e["t0"]) + margin
        name = "before" if i == 0 else "after " + evs[i - 1]["name"]
        wins.append((name, start, d0))
        wins.append(("during " + e["name"], d0, d1))
        start = d1
    wins.append(("after " + evs[-1]["name"] if evs else "all", start, t_end))
    return wins


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--conns", type=int, default=8,
                    help="client connections (default 8)")
    ap.add_argument("--duration", type=float, default=10.0,
                    help="seconds; 0 = until stopped (default 10)")
    ap.add_argument("--stop-file", help="stop when this file exists")
    ap.add_argument("--stop-on-eof", action="store_true",
                    help="stop when stdin is closed")
    ap.add_argument("--keys", type=int, default=12,
                    help="keys per connection (default 12)")
    ap.add_argument("--probe-every", type=int, default=4,
                    help="commands between VERSION probes (default 4)")
    ap.add_argument("--pipeline", type=int, default=1,
                    help="requests sent before reading replies (default 1)")
    ap.add_argument("--rate", type=float, default=0,
                    help="max requests/s per connection (default: unlimited)")
    ap.add_argument("--timeout", type=float, default=10.0,
                    help="seconds to wait for a reply (default 10)")
    ap.add_argument("--seed", type=int, help="random seed (reproducible mix)")
    ap.add_argument("--allow-rollback", action="store_true",
                    help="versions may also go backwards (molt rollback)")
    ap.add_argument("--expect-versions",
                    help="comma-separated versions that must all be observed")
    ap.add_argument("--marks", help="JSON file of event marks, read at the "
                    "end, for latency windows (see load_marks)")
    ap.add_argument("--window-margin", type=float, default=0.5,
                    help="seconds around each mark counted as 'during'")
    ap.add_argument("--samples", help="write every request as CSV "
                    "(t_send_s,latency_us,op,ok) to this file")
    ap.add_argument("--report", help="write the JSON report here "
                    "(default: stdout)")
    ap.add_argument("--max-failures", type=int, default=100,
                    help="failures kept in detail in the report")
    ap.add_argument("--verbose", "-v", action="store_true")
    a = ap.parse_args()
    if a.pipeline < 1 or a.probe_every < 1 or a.conns < 1 or a.keys < 1:
        ap.error("--pipeline, --probe-every, --conns and --keys must be >= 1")

    sh = Shared(a)
    sh.connected = threading.Semaphore(0)

    def on_signal(signum, frame):
        sh.stop.set()
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if a.stop_on_eof:
        def watch_stdin():
            try:
                while sys.stdin.buffer.read(4096):
                    pass
            except OSError:
                pass
            sh.stop.set()
        threading.Thread(target=watch_stdin, daemon=True).start()

    run_id = "lg%x%04x" % (os.getpid(), random.getrandbits(16))
    sh.t_start = time.monotonic()
    wall_start = time.time()
    conns = [Conn(sh, i, run_id) for i in range(a.conns)]
    for c in conns:
        c.start()
    for _ in conns:
        sh.connected.acquire()
    print("loadgen: %d connections to %s:%d running (pid %d)"
          % (a.conns, a.host, a.port, os.getpid()), flush=True)

    deadline = sh.t_start + a.duration if a.duration > 0 else None
    while not sh.stop.is_set():
        if deadline and time.monotonic() >= deadline:
            break
        if a.stop_file and os.path.exists(a.stop_file):
            break
        if all(not c.is_alive() for c in conns):
            break
        sh.stop.wait(0.05)
    sh.stop.set()
    t_stop = time.monotonic()
    for c in conns:
        c.join(a.timeout + 5)
    t_end = time.monotonic()

    # -- report -------------------------------------------------------------------
    served = sum(c.served for c in conns)
    failed = sum(c.failed for c in conns)
    by_op = {}
    for c in conns:
        for k, v in c.by_op.items():
            by_op[k] = by_op.get(k, 0) + v
    # All requests, ordered by send time: (t_send rel. to t_start, latency).
    recs = []
    for c in conns:
        recs.extend(zip(c.t_send, c.lat, c.opc, c.ok))
    recs.sort(key=lambda r: r[0])
    lats = [r[1] for r in recs if r[3]]
    elapsed = max(1e-9, t_stop - sh.t_start)

    timeline = []
    if recs:
        sec = {}
        for t, l, _, ok in recs:
            sec.setdefault(int(t), []).append(l)
        for s in sorted(sec):
            ls = lat_summary(sec[s])
            timeline.append({"t_s": s, "count": ls["count"],
                             "p50_us": ls["p50_us"], "p99_us": ls["p99_us"],
                             "max_us": ls["max_us"]})

    windows = []
    marks = load_marks(a.marks) if a.marks else None
    if marks:
        base = marks.get("start", sh.t_start)
        end = marks.get("end", t_stop)
        for name, w0, w1 in windows_from_marks(marks, a.window_margin,
                                               base, end):
            ls = [r[1] for r in recs if r[3] and w0 <= r[0] + sh.t_start < w1]
            w = {"name": name, "from_s": round(w0 - sh.t_start, 3),
                 "to_s": round(w1 - sh.t_start, 3)}
            w.update(lat_summary(ls))
            w["rps"] = round(len(ls) / (w1 - w0), 1) if w1 > w0 else None
            windows.append(w)

    missing = []
    if a.expect_versions:
        missing = [v for v in a.expect_versions.split(",")
                   if v and v not in sh.versions]
    dead = [{"conn": c.idx, "error": c.dead} for c in conns if c.dead]
    ok = failed == 0 and served > 0 and not missing and not dead
    report = {
        "ok": ok,
        "served": served,
        "failed": failed,
        "connections": a.conns,
        "dead_connections": dead,
        "duration_s": round(elapsed, 3),
        "throughput_rps": round(served / elapsed, 1),
        "by_op": by_op,
        "versions": sh.versions,
        "missing_versions": missing,
        "latency": lat_summary(lats),
        "windows": windows,
        "timeline": timeline,
        "failures": sh.failures,
        "time_base": {"monotonic": sh.t_start, "wall": wall_start},
        "settings": {k: v for k, v in vars(a).items()},
    }
    if a.samples:
        with open(a.samples, "w") as f:
            f.write("t_send_s,latency_us,op,ok\n")
            for t, l, o, k in recs:
                f.write("%.6f,%.1f,%s,%d\n" % (t, l * 1e6, OPS[o], k))
    text = json.dumps(report, indent=1)
    if a.report:
        tmp = a.report + ".tmp"
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, a.report)
    else:
        print(text)
    print("loadgen: served %d, failed %d, %.0f req/s, versions %s, p50 %s us, "
          "p99 %s us%s" % (served, failed, served / elapsed,
                           ",".join(sorted(sh.versions, key=VINDEX.get)),
                           report["latency"]["p50_us"],
                           report["latency"]["p99_us"],
                           "" if ok else "  FAILED"),
          file=sys.stderr, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
