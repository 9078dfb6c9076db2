#!/usr/bin/env python3
"""mcload — checked load for a memcached server (text protocol, stdlib only).

    mcload.py --port P [--conns 8] [--pipeline 16] [--keys 64]
              (--duration S | --stop-file F) [--report out.json]
    mcload.py --port P --cmd 'stats'          one request on a fresh connection

Each connection owns a key prefix and keeps a model of its keys, so every
reply is predictable: set/add/replace/append/prepend/cas/get/gets/delete/
incr/decr/touch/version, pipelined `--pipeline` deep.  Every `--stats-every`
batches the connection also sends `stats` and checks the live patch
`stats-live` (examples/realworld/patches/stats-live.diff):

  - `live_patch` never disappears on a connection once it has appeared
    (a newer version never gives way to an older one);
  - `cmd_version` (added by the patch) never goes backwards and grows by at
    least the number of `version` commands this connection sent between two
    patched `stats` replies;
  - every other reply is exactly what memcached 1.6 answers.

`--collide` checks the checker: all connections then share their keys, so
their models go wrong and the run must fail.

A connection that closes, a reply that differs, or a timeout is a failure;
connections are opened once and kept for the whole run.  Exit status 0 only
if nothing failed.
"""
import argparse
import json
import os
import random
import socket
import sys
import threading
import time

VERSION_PREFIX = b"VERSION "


class Failure(Exception):
    pass


class Conn:
    def __init__(self, port, timeout):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def send(self, data):
        self.s.sendall(data)

    def _fill(self):
        d = self.s.recv(262144)
        if not d:
            raise Failure("connection closed by the server")
        self.buf += d

    def line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                out = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return out
            self._fill()

    def exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


class Item:
    """What the server must hold for a key.  `fuzzy`: a number written by
    incr/decr, which memcached may store padded with spaces (in place) or
    not (new item), so only value.rstrip() is known."""
    __slots__ = ("flags", "value", "cas", "fuzzy", "ver")

    def __init__(self, flags, value, fuzzy=False):
        self.flags, self.value, self.cas, self.fuzzy, self.ver = flags, value, None, fuzzy, 0


class Worker(threading.Thread):
    def __init__(self, idx, args, stop, t0):
        super().__init__(daemon=True)
        self.idx = idx
        self.args = args
        self.stop = stop
        self.t0 = t0
        self.rng = random.Random(args.seed * 1000 + idx)
        self.prefix = "w%d_%d:" % (os.getpid(), 0 if args.collide else idx)
        self.model = {}            # key -> Item
        self.requests = 0
        self.failed = 0
        self.errors = []
        self.per_sec = {}
        self.lat = []              # per-batch latency (s), sampled
        self.patched_at = None     # time (since t0) of the first patched stats
        self.stats_seen = 0
        self.stats_patched = 0
        self.last_cmd_version = None
        self.versions_since = 0    # version commands since the last patched stats
        self.seq = 0
        self.vctr = 0
        self.conn = None

    # -- request generation ---------------------------------------------------
    def value(self, key):
        self.seq += 1
        n = self.rng.choice((1, 5, 20, 100, 700, 3000))
        head = ("%s#%d#" % (key, self.seq)).encode()
        return (head * (n // len(head) + 1))[:max(n, 1)]

    def put(self, k, flags, value, fuzzy=False):
        self.vctr += 1
        it = Item(flags, value, fuzzy)
        it.ver = self.vctr
        self.model[k] = it

    def one(self):
        """One command: (bytes to send, checker(conn))."""
        k = self.prefix + str(self.rng.randrange(self.args.keys))
        kb = k.encode()
        m = self.model
        r = self.rng.random()
        if r < 0.30:
            return self.get(kb, k, gets=self.rng.random() < 0.3)
        if r < 0.50:
            flags = self.rng.randrange(1 << 16)
            v = self.value(k)
            self.put(k, flags, v)
            return (b"set %s %d 0 %d\r\n%s\r\n" % (kb, flags, len(v), v), self.expect(b"STORED"))
        if r < 0.56:
            v = self.value(k)
            if k in m:
                exp = b"NOT_STORED"
            else:
                self.put(k, 7, v)
                exp = b"STORED"
            return (b"add %s 7 0 %d\r\n%s\r\n" % (kb, len(v), v), self.expect(exp))
        if r < 0.60:
            v = self.value(k)
            if k in m:
                self.put(k, 9, v)
                exp = b"STORED"
            else:
                exp = b"NOT_STORED"
            return (b"replace %s 9 0 %d\r\n%s\r\n" % (kb, len(v), v), self.expect(exp))
        if r < 0.64:
            if k in m and m[k].fuzzy:
                return self.get(kb, k, gets=False)
            tail = b"x%d" % self.rng.randrange(100)      # never numeric
            pre = self.rng.random() < 0.5
            if k in m:
                it = m[k]
                self.put(k, it.flags, tail + it.value if pre else it.value + tail)
                exp = b"STORED"
            else:
                exp = b"NOT_STORED"
            return (b"%s %s 0 0 %d\r\n%s\r\n" % (b"prepend" if pre else b"append", kb, len(tail), tail),
                    self.expect(exp))
        if r < 0.72:
            if k not in m:
                exp = b"NOT_FOUND"
            else:
                exp = b"DELETED"
                del m[k]
            return (b"delete %s\r\n" % kb, self.expect(exp))
        if r < 0.82:
            return self.arith(kb, k)
        if r < 0.86:
            if k in m:
                self.vctr += 1
                m[k].ver = self.vctr
                m[k].cas = None
                exp = b"TOUCHED"
            else:
                exp = b"NOT_FOUND"
            return (b"touch %s 0\r\n" % kb, self.expect(exp))
        if r < 0.90:
            return self.cas(kb, k)
        self.versions_since += 1
        return (b"version\r\n", self.check_version)

    def expect(self, want):
        def chk(c):
            got = c.line()
            if got != want:
                raise Failure("expected %r, got %r" % (want, got))
        return chk

    def check_version(self, c):
        got = c.line()
        if not got.startswith(VERSION_PREFIX):
            raise Failure("version: got %r" % got)

    def get(self, kb, k, gets):
        m = self.model
        it = m.get(k)
        snap = (it.flags, it.value, it.fuzzy, it.ver) if it else None

        def chk(c):
            hdr = c.line()
            if snap is None:
                if hdr != b"END":
                    raise Failure("get %s: expected miss, got %r" % (k, hdr))
                return
            flags0, value0, fuzzy0, ver0 = snap
            parts = hdr.split()
            if len(parts) < 4 or parts[0] != b"VALUE" or parts[1] != kb:
                raise Failure("get %s: bad header %r" % (k, hdr))
            flags, n = int(parts[2]), int(parts[3])
            data = c.exact(n + 2)
            got = data[:-2].rstrip(b" ") if fuzzy0 else data[:-2]
            if data[-2:] != b"\r\n" or got != value0 or flags != flags0:
                raise Failure("get %s: wrong value/flags (flags %d, %r; want %d, %r)"
                              % (k, flags, data[:60], flags0, value0[:60]))
            if gets:
                if len(parts) != 5:
                    raise Failure("gets %s: no cas in %r" % (k, hdr))
                cur = m.get(k)
                if cur is not None and cur.ver == ver0:
                    cur.cas = int(parts[4])
            end = c.line()
            if end != b"END":
                raise Failure("get %s: expected END, got %r" % (k, end))
        return ((b"gets %s\r\n" if gets else b"get %s\r\n") % kb, chk)

    def arith(self, kb, k):
        m = self.model
        incr = self.rng.random() < 0.6
        d = self.rng.randrange(1000)
        verb = b"incr" if incr else b"decr"
        if k not in m:
            return (b"%s %s %d\r\n" % (verb, kb, d), self.expect(b"NOT_FOUND"))
        it = m[k]
        v = it.value
        if not v.isdigit() or len(v) > 19:
            if self.rng.random() < 0.7:
                # make it numeric first so that incr/decr has work to do
                nv = str(self.rng.randrange(1 << 20)).encode()
                self.put(k, 0, nv)
                return (b"set %s 0 0 %d\r\n%s\r\n" % (kb, len(nv), nv), self.expect(b"STORED"))
            return (b"%s %s %d\r\n" % (verb, kb, d),
                    self.expect(b"CLIENT_ERROR cannot increment or decrement non-numeric value"))
        cur = int(v)
        new = (cur + d) % (1 << 64) if incr else max(cur - d, 0)
        nb = str(new).encode()
        self.put(k, it.flags, nb, fuzzy=True)
        return (b"%s %s %d\r\n" % (verb, kb, d), self.expect(nb))

    def cas(self, kb, k):
        m = self.model
        v = self.value(k)
        if k not in m:
            return (b"cas %s 3 0 %d 12345\r\n%s\r\n" % (kb, len(v), v), self.expect(b"NOT_FOUND"))
        cas = m[k].cas
        if cas is None:
            # no known cas: a stale one (never issued) must be refused
            return (b"cas %s 3 0 %d %d\r\n%s\r\n" % (kb, len(v), 1 << 62, v), self.expect(b"EXISTS"))
        self.put(k, 3, v)
        return (b"cas %s 3 0 %d %d\r\n%s\r\n" % (kb, len(v), cas, v), self.expect(b"STORED"))

    def stats(self):
        mine = self.versions_since
        self.versions_since = 0

        def chk(c):
            st = {}
            while True:
                ln = c.line()
                if ln == b"END":
                    break
                p = ln.split(b" ", 2)
                if len(p) != 3 or p[0] != b"STAT":
                    raise Failure("stats: bad line %r" % ln)
                st[p[1].decode()] = p[2].decode()
            self.stats_seen += 1
            if "pid" not in st or "curr_connections" not in st:
                raise Failure("stats: missing general stats")
            if "live_patch" in st:
                if st["live_patch"] != "stats-live":
                    raise Failure("stats: live_patch=%r" % st["live_patch"])
                cv = int(st["cmd_version"])
                if self.patched_at is None:
                    self.patched_at = time.monotonic() - self.t0
                elif cv < self.last_cmd_version + mine:
                    raise Failure("stats: cmd_version %d < %d + %d version commands sent"
                                  % (cv, self.last_cmd_version, mine))
                self.last_cmd_version = cv
                self.stats_patched += 1
            elif self.patched_at is not None:
                raise Failure("stats: live_patch disappeared (an older version answered)")
        return (b"stats\r\n", chk)

    # -- main loop ----------------------------------------------------------------
    def run(self):
        a = self.args
        try:
            self.conn = Conn(a.port, a.timeout)
        except OSError as e:
            self.failed += 1
            self.errors.append("connect: %s" % e)
            return
        batch_no = 0
        while not self.stop.is_set():
            batch_no += 1
            cmds = [self.one() for _ in range(a.pipeline)]
            if batch_no % a.stats_every == 0:
                cmds.append(self.stats())
            t = time.monotonic()
            try:
                self.conn.send(b"".join(c[0] for c in cmds))
                for _, chk in cmds:
                    chk(self.conn)
            except (Failure, OSError) as e:
                self.failed += 1
                self.errors.append("%.3f s: %s" % (t - self.t0, e))
                break          # the connection's state is unknown now: stop it
            now = time.monotonic()
            self.requests += len(cmds)
            sec = int(now - self.t0)
            self.per_sec[sec] = self.per_sec.get(sec, 0) + len(cmds)
            if batch_no % 4 == 0:
                self.lat.append(now - t)
        self.conn.close()


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


def oneshot(port, cmd):
    c = Conn(port, 5)
    c.send(cmd.encode() + b"\r\n")
    out = []
    while True:
        ln = c.line().decode()
        out.append(ln)
        if ln in ("END", "OK", "ERROR") or ln.startswith("VERSION ") or ln.startswith("CLIENT_ERROR"):
            break
    c.close()
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--pipeline", type=int, default=16)
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--stats-every", type=int, default=8, help="batches between stats probes")
    ap.add_argument("--duration", type=float)
    ap.add_argument("--stop-file")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--report")
    ap.add_argument("--collide", action="store_true",
                    help="checker self-test: all connections share one key prefix, so their "
                         "models are wrong and failures must be reported")
    ap.add_argument("--cmd", help="send one command on a fresh connection, print the reply")
    a = ap.parse_args()
    if a.cmd:
        oneshot(a.port, a.cmd)
        return 0
    stop = threading.Event()
    t0 = time.monotonic()
    ws = [Worker(i, a, stop, t0) for i in range(a.conns)]
    for w in ws:
        w.start()
    try:
        while True:
            time.sleep(0.05)
            if a.duration is not None and time.monotonic() - t0 >= a.duration:
                break
            if a.stop_file and os.path.exists(a.stop_file):
                break
            if all(not w.is_alive() for w in ws):
                break
    except KeyboardInterrupt:
        pass
    stop.set()
    for w in ws:
        w.join(a.timeout + 5)
    elapsed = time.monotonic() - t0
    req = sum(w.requests for w in ws)
    failed = sum(w.failed for w in ws)
    alive = sum(1 for w in ws if w.failed == 0 and w.conn is not None)
    timeline = {}
    for w in ws:
        for s, n in w.per_sec.items():
            timeline[s] = timeline.get(s, 0) + n
    lat = [x for w in ws for x in w.lat]
    patched = [w.patched_at for w in ws if w.patched_at is not None]
    rep = {
        "conns": a.conns, "pipeline": a.pipeline, "elapsed_s": round(elapsed, 3),
        "requests": req, "failed": failed, "req_per_s": round(req / elapsed) if elapsed else 0,
        "connections_kept": alive,
        "stats_probes": sum(w.stats_seen for w in ws),
        "stats_probes_patched": sum(w.stats_patched for w in ws),
        "conns_that_saw_patch": len(patched),
        "first_patched_s": round(min(patched), 3) if patched else None,
        "last_first_patched_s": round(max(patched), 3) if patched else None,
        "batch_latency_ms": {k: round(v * 1000, 3) if v is not None else None
                             for k, v in (("p50", pct(lat, 50)), ("p99", pct(lat, 99)),
                                          ("max", max(lat) if lat else None))},
        "per_second": [timeline.get(s, 0) for s in range(int(elapsed) + 1)],
        "errors": [e for w in ws for e in w.errors][:20],
    }
    if a.report:
        with open(a.report, "w") as f:
            json.dump(rep, f, indent=1)
    print("mcload: %d requests in %.1f s (%d/s) over %d connections, %d failed, %d/%d connections kept"
          % (req, elapsed, rep["req_per_s"], a.conns, failed, alive, a.conns))
    for e in rep["errors"]:
        print("mcload: FAIL " + e)
    return 0 if failed == 0 and alive == a.conns else 1


if __name__ == "__main__":
    sys.exit(main())
