#!/usr/bin/env python3
"""Checking DNS load over UDP for examples/fixes (stdlib only).

--conns sockets each keep one query in flight for qN.load.test (A), N random
below --names; the reply must carry the same id and question, NOERROR and exactly
A 10.(N>>16&255).(N>>8&255).(N&255) (what dnsfake.py answers; dnsmasq forwards it or
answers from its cache).  A timeout (--timeout s) or any other reply is a failure.
Stops after --duration s or when --stop-file appears; --status FILE is rewritten
(atomically) every 0.2 s with the counts so far; --report writes the final JSON."""
import argparse, json, os, random, select, socket, struct, sys, time

def query(qid, n):
    name = b"".join(bytes([len(l)]) + l for l in (b"q%d" % n, b"load", b"test")) + b"\0"
    return struct.pack(">6H", qid, 0x0100, 1, 0, 0, 0) + name + struct.pack(">HH", 1, 1), name

def check(rep, qid, qname, n):
    if len(rep) < 12: return "short reply"
    rid, flags, qd, an = struct.unpack(">4H", rep[:8])
    if rid != qid: return None                      # a late reply to an older query: ignore
    if flags & 0xf: return "rcode %d" % (flags & 0xf)
    if rep[12:12 + len(qname)] != qname: return "question mismatch"
    off = 12 + len(qname) + 4
    want = bytes([10, n >> 16 & 255, n >> 8 & 255, n & 255])
    for _ in range(an):
        if rep[off] & 0xc0 == 0xc0: off += 2
        else:
            while rep[off]: off += rep[off] + 1
            off += 1
        t, c, ttl, l = struct.unpack(">HHIH", rep[off:off + 10]); off += 10
        if t == 1 and rep[off:off + l] == want: return "ok"
        off += l
    return "wrong answer"

def main(a):
    socks = []
    for _ in range(a.conns):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect((a.host, a.port)); s.setblocking(False)
        socks.append(s)
    rnd = random.Random(); st = {"ok": 0, "failed": 0, "errors": {}}; lat = []
    inflight = {}
    def send(s):
        qid = rnd.randrange(65536); n = rnd.randrange(a.names); q, qname = query(qid, n)
        s.send(q); inflight[s] = (qid, qname, n, time.time())
    def fail(k):
        st["failed"] += 1; st["errors"][k] = st["errors"].get(k, 0) + 1
    def status(d):
        if a.status:
            tmp = a.status + ".tmp"
            with open(tmp, "w") as f: json.dump(d, f)
            os.replace(tmp, a.status)
    t0 = time.time(); end = t0 + a.duration; last = 0
    for s in socks: send(s)
    while time.time() < end and not os.path.exists(a.stop_file):
        if time.time() - last > 0.2:
            last = time.time()
            status({"requests": st["ok"] + st["failed"], "ok": st["ok"], "failed": st["failed"], "errors": st["errors"]})
        r, _, _ = select.select(socks, [], [], 0.05)
        now = time.time()
        for s in r:
            try: rep = s.recv(4096)
            except OSError as e: fail(type(e).__name__); send(s); continue
            qid, qname, n, ts = inflight[s]
            res = check(rep, qid, qname, n)
            if res is None: continue
            if res == "ok": st["ok"] += 1
            else: fail(res)
            lat.append(now - ts); send(s)
        for s, (qid, qname, n, ts) in list(inflight.items()):
            if now - ts > a.timeout: fail("timeout"); send(s)
    dt = time.time() - t0; lat.sort(); lat = lat or [0]
    rep = {"requests": st["ok"] + st["failed"], "ok": st["ok"], "failed": st["failed"], "errors": st["errors"],
           "seconds": round(dt, 2), "req_per_s": round((st["ok"] + st["failed"]) / dt, 1),
           "p50_ms": round(1000 * lat[len(lat) // 2], 2), "p99_ms": round(1000 * lat[int(len(lat) * .99)], 2),
           "max_ms": round(1000 * lat[-1], 2)}
    status(rep); print(json.dumps(rep))
    if a.report: json.dump(rep, open(a.report, "w"), indent=1)
    return 1 if st["failed"] else 0

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1"); p.add_argument("--port", type=int, required=True)
    p.add_argument("--conns", type=int, default=8); p.add_argument("--names", type=int, default=5000)
    p.add_argument("--duration", type=float, default=10); p.add_argument("--timeout", type=float, default=2)
    p.add_argument("--stop-file", default="/nonexistent"); p.add_argument("--report"); p.add_argument("--status")
    sys.exit(main(p.parse_args()))
