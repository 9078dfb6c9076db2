#!/usr/bin/env python3
"""loadgen.py -- checked load for kvfull (used by demo.py).

Every client keeps ONE connection for the whole run and checks every reply
against what it has stored itself (each client has its own keys):

  SET k v   -> v1: "STORED"; v2 and later: "STORED <rev>", where rev is 1 for
               a new key and +1 per SET; a key stored under v1 is at rev 1
               right after the update to v2 (v2.xf: INIT struct entry.rev)
  GET k     -> "VALUE v" / "NOT_FOUND", exactly as stored
  DEL k     -> "DELETED" / "NOT_FOUND"
  REV k     -> (once this connection has seen version 2) "REV <rev>"
  INCR k    -> (once this connection has seen version 3) "VALUE <n+1>"
  VERSION   -> never goes back

A reply in an older version's format after a newer version was seen on the
same connection, a wrong value, a dropped connection or a timeout is an
error.  Busy clients issue requests back to back; idle clients store their
keys once and then stay connected without a word until verify().
"""

import random
import socket
import threading
import time


class CheckError(Exception):
    pass


class Client:
    def __init__(self, cid, port, keys=64, seed=None, timeout=10.0):
        self.cid = cid
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.keys = ["c%d:k%d" % (cid, j) for j in range(keys)]
        self.ctr = "c%d:ctr" % cid
        self.expect = {}        # key -> [value, rev]
        self.version = 0        # highest version seen on this connection
        self.versions = set()
        self.rng = random.Random(seed if seed is not None else cid)
        self.requests = 0
        self.errors = []
        self.lat = []           # (t_send, t_reply) of every request, monotonic
        self.seq = 0

    # -- wire -------------------------------------------------------------
    def send_raw(self, data):
        self.sock.sendall(data)

    def readline(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise CheckError("client %d: connection closed by the server" % self.cid)
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def req(self, line):
        t0 = time.monotonic()
        self.send_raw((line + "\n").encode())
        r = self.readline()
        self.lat.append((t0, time.monotonic()))
        self.requests += 1
        return r

    def fail(self, msg):
        self.errors.append("client %d: %s" % (self.cid, msg))

    # -- checked operations -------------------------------------------------
    def check_stored(self, key, reply):
        old = self.expect.get(key)
        if reply == "STORED":
            if self.version >= 2:
                self.fail("SET %s answered %r in v1 format after version %d"
                          % (key, reply, self.version))
            return 1                       # becomes rev 1 when migrated to v2
        if not reply.startswith("STORED "):
            self.fail("SET %s: unexpected reply %r" % (key, reply))
            return None
        rev = int(reply.split()[1])
        want = old[1] + 1 if old is not None and old[1] is not None else 1
        if rev != want:
            self.fail("SET %s: revision %d, expected %d" % (key, rev, want))
        return rev

    def do_set(self, key, value):
        reply = self.req("SET %s %s" % (key, value))
        rev = self.check_stored(key, reply)
        self.expect[key] = [value, rev]

    def do_get(self, key):
        reply = self.req("GET " + key)
        old = self.expect.get(key)
        want = "VALUE " + old[0] if old else "NOT_FOUND"
        if reply != want:
            self.fail("GET %s: %r, expected %r" % (key, reply, want))

    def do_del(self, key):
        reply = self.req("DEL " + key)
        want = "DELETED" if key in self.expect else "NOT_FOUND"
        if reply != want:
            self.fail("DEL %s: %r, expected %r" % (key, reply, want))
        self.expect.pop(key, None)

    def do_rev(self, key):
        reply = self.req("REV " + key)
        old = self.expect.get(key)
        want = "REV %d" % old[1] if old else "NOT_FOUND"
        if reply != want:
            self.fail("REV %s: %r, expected %r" % (key, reply, want))

    def do_incr(self):
        reply = self.req("INCR " + self.ctr)
        old = self.expect.get(self.ctr)
        n = int(old[0]) + 1 if old else 1
        if reply != "VALUE %d" % n:
            self.fail("INCR %s: %r, expected 'VALUE %d'" % (self.ctr, reply, n))
        rev = old[1] + 1 if old and old[1] is not None else 1
        self.expect[self.ctr] = [str(n), rev]

    def do_version(self):
        reply = self.req("VERSION")
        if not reply.startswith("VERSION "):
            self.fail("VERSION: %r" % reply)
            return
        v = int(reply.split()[1])
        if v < self.version:
            self.fail("VERSION went back from %d to %d" % (self.version, v))
        self.version = max(self.version, v)
        self.versions.add(v)

    def step(self):
        self.seq += 1
        op = self.rng.random()
        key = self.rng.choice(self.keys)
        if self.seq % 16 == 0:
            self.do_version()
        elif op < 0.40:
            self.do_set(key, "v%d.%d" % (self.cid, self.seq))
        elif op < 0.80:
            self.do_get(key)
        elif op < 0.86:
            self.do_del(key)
        elif op < 0.93 and self.version >= 2:
            self.do_rev(key)
        elif self.version >= 3:
            self.do_incr()
        else:
            self.do_get(key)

    def fill(self, n):
        for j in range(n):
            self.do_set(self.keys[j % len(self.keys)], "idle%d.%d" % (self.cid, j))

    def verify(self):
        """Every key this client stored (and nothing it deleted) is there."""
        self.do_version()
        for key in sorted(set(self.keys) | {self.ctr}):
            self.do_get(key)
            if self.version >= 2:
                self.do_rev(key)

    def close(self):
        try:
            self.req("QUIT")
        except (OSError, CheckError):
            pass
        self.sock.close()


class Load:
    """Busy clients, each in its own thread, until stop()."""

    def __init__(self, port, busy=4, idle=4, idle_keys=48):
        self.idle = [Client(100 + i, port) for i in range(idle)]
        for c in self.idle:
            c.fill(idle_keys)
        self.busy = [Client(i, port) for i in range(busy)]
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(c,), daemon=True)
                        for c in self.busy]

    def start(self):
        for t in self.threads:
            t.start()

    def _run(self, c):
        try:
            while not self.stopping.is_set():
                c.step()
        except (OSError, CheckError) as e:
            c.fail("stopped: %s" % e)

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(30)

    def clients(self):
        return self.busy + self.idle

    def errors(self):
        return [e for c in self.clients() for e in c.errors]

    def requests(self):
        return sum(c.requests for c in self.clients())

    def max_gap(self, t0, t1):
        """Longest time a busy client waited for one reply sent in [t0, t1]."""
        worst = 0.0
        for c in self.busy:
            for s, r in list(c.lat):
                if t0 <= s <= t1 or t0 <= r <= t1:
                    worst = max(worst, r - s)
        return worst
