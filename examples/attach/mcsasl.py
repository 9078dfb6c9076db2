#!/usr/bin/env python3
"""memcached's binary protocol with SASL PLAIN authentication (stdlib
only): the checking load and the probes of examples/attach.

    mcsasl.py auth PORT USER PASSWORD     prints "ok" or "refused"
    mcsasl.py load PORT USER PASSWORD --seconds S [--clients N] [--json FILE]
                                          N clients, each on a kept
                                          connection (authenticated once),
                                          sets and gets its own keys and
                                          checks every reply; prints one
                                          JSON line: requests, failed,
                                          throughput, latency percentiles
                                          (and per 100 ms: how many replies,
                                          the slowest)
    mcsasl.py load ... --until FILE       runs until FILE exists instead
"""
import argparse
import json
import os
import socket
import struct
import sys
import threading
import time

HEADER = struct.Struct(">BBHBBHIIQ")   # magic opcode keylen extlen type vbucket/status body opaque cas
REQ, RES = 0x80, 0x81
GET, SET, SASL_AUTH = 0x00, 0x01, 0x21


class Error(Exception):
    pass


class Conn:
    def __init__(self, port, timeout=10):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opaque = 0

    def _recv(self, n):
        buf = b""
        while len(buf) < n:
            got = self.s.recv(n - len(buf))
            if not got:
                raise Error("connection closed by the server")
            buf += got
        return buf

    def call(self, opcode, key=b"", value=b"", extras=b""):
        """(status, value) of one request."""
        self.opaque += 1
        body = len(extras) + len(key) + len(value)
        self.s.sendall(HEADER.pack(REQ, opcode, len(key), len(extras), 0, 0, body, self.opaque, 0)
                       + extras + key + value)
        magic, op, klen, elen, _t, status, blen, opaque, _cas = HEADER.unpack(self._recv(24))
        data = self._recv(blen) if blen else b""
        if magic != RES or op != opcode or opaque != self.opaque:
            raise Error("reply out of order: magic %#x opcode %#x opaque %d" % (magic, op, opaque))
        return status, data[elen + klen:]

    def auth(self, user, password):
        status, _ = self.call(SASL_AUTH, b"PLAIN", b"\0%s\0%s" % (user.encode(), password.encode()))
        return status == 0

    def set(self, key, value):
        status, _ = self.call(SET, key, value, struct.pack(">II", 0, 0))
        return status

    def get(self, key):
        return self.call(GET, key)

    def close(self):
        self.s.close()


def auth_once(port, user, password):
    c = Conn(port)
    try:
        return c.auth(user, password)
    finally:
        c.close()


class Load:
    """Clients that authenticate once and then set and get their own keys,
    checking every reply (a set must succeed, a get must return the value
    last set); a refused authentication, a wrong reply, a timeout or a
    broken connection is a failure."""

    def __init__(self, port, user, password, clients):
        self.port, self.user, self.password = port, user, password
        self.stop = False
        self.lock = threading.Lock()
        self.errors = []
        self.lat = []           # (end time, seconds) of every request
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True)
                        for i in range(clients)]

    def start(self):
        self.t0 = time.time()
        for t in self.threads:
            t.start()

    def fail(self, what):
        with self.lock:
            self.errors.append(what)

    def client(self, i):
        lat = []
        try:
            c = Conn(self.port)
            if not c.auth(self.user, self.password):
                self.fail("client %d: authentication refused" % i)
                return
            n = 0
            while not self.stop:
                n += 1
                key = b"k%d-%d" % (i, n % 64)
                val = b"v%d-%d" % (i, n)
                t = time.time()
                if c.set(key, val) != 0:
                    self.fail("client %d: set %s failed" % (i, key.decode()))
                    return
                status, got = c.get(key)
                e = time.time()
                lat.append((e, (e - t) / 2))
                if status != 0 or got != val:
                    self.fail("client %d: get %s: status %d, %r (want %r)"
                              % (i, key.decode(), status, got, val))
                    return
            c.close()
        except (OSError, Error) as e:
            self.fail("client %d: %s" % (i, e))
        finally:
            with self.lock:
                self.lat += lat

    def finish(self):
        self.stop = True
        for t in self.threads:
            t.join(30)
        self.t1 = time.time()
        return self.summary()

    def summary(self):
        lats = sorted(x for _, x in self.lat)
        n = len(lats)

        def pct(p):
            return round(lats[min(n - 1, int(p * n))] * 1e3, 3) if n else None
        windows = {}
        for end, x in self.lat:
            k = int((end - self.t0) * 10)
            cnt, mx = windows.get(k, (0, 0.0))
            windows[k] = (cnt + 1, max(mx, x))
        secs = self.t1 - self.t0
        return {"requests": 2 * n, "failed": len(self.errors), "errors": self.errors[:5],
                "seconds": round(secs, 3), "per_second": round(2 * n / secs) if secs else 0,
                "latency_ms": {"p50": pct(0.5), "p99": pct(0.99), "p999": pct(0.999),
                               "max": round(lats[-1] * 1e3, 3) if n else None},
                "windows": [[round(k / 10, 1), windows[k][0] * 2, round(windows[k][1] * 1e3, 3)]
                            for k in sorted(windows)]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("auth", "load"))
    p.add_argument("port", type=int)
    p.add_argument("user")
    p.add_argument("password")
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--until")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--json")
    a = p.parse_args()
    if a.what == "auth":
        print("ok" if auth_once(a.port, a.user, a.password) else "refused")
        return 0
    load = Load(a.port, a.user, a.password, a.clients)
    load.start()
    end = time.time() + a.seconds
    while not load.errors:
        if a.until:
            if os.path.exists(a.until):
                break
        elif time.time() >= end:
            break
        time.sleep(0.02)
    out = load.finish()
    line = json.dumps(out)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "windows"}))
    return 1 if out["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
