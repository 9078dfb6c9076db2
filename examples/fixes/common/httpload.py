#!/usr/bin/env python3
"""Checking HTTP load for examples/fixes (stdlib only).

Each of --conns workers sends GET /fN.txt (N random in 0..63) and checks the
reply: status 200 and exactly the body that --write-files makes for N
(sha256(N) in hex, repeated 1 + 7N times).  --proxy sends absolute-form
requests for http://ORIGIN/fN.txt to a forward proxy (tinyproxy); otherwise
origin-form to --port (nginx).  --keepalive reuses connections (HTTP/1.1),
else one request per connection.  A wrong status, a wrong body, a closed
connection or a timeout is a failed reply.

Runs until --duration s have passed or --stop-file exists.  --status FILE is
rewritten (atomically) every 0.2 s with the counts so far, so a caller can
take the failures of a window; --report FILE gets the final JSON.  Exit
status 1 if any reply failed.

    httpload.py --write-files DIR      # the 64 files, for a server to serve
"""
import argparse, asyncio, hashlib, json, os, random, sys, time


def body(n):
    return hashlib.sha256(str(n).encode()).hexdigest().encode() * (1 + n * 7)


EXPECT = [body(n) for n in range(64)]


async def read_response(r):
    head = await r.readuntil(b"\r\n\r\n")
    lines = head.decode("latin1").split("\r\n")
    status = int(lines[0].split()[1])
    hdr = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            hdr[k.strip().lower()] = v.strip()
    if "content-length" in hdr:
        data = await r.readexactly(int(hdr["content-length"]))
    elif hdr.get("transfer-encoding", "").lower() == "chunked":
        data = b""
        while True:
            n = int((await r.readline()).split(b";")[0], 16)
            if n == 0:
                await r.readline()
                break
            data += await r.readexactly(n)
            await r.readline()
    else:
        data = await r.read()
    return status, hdr, data


def count(st, key):
    st["failed"] += 1
    st["errors"][key] = st["errors"].get(key, 0) + 1


async def worker(a, st, deadline):
    rnd = random.Random()
    r = w = None
    while time.time() < deadline and not os.path.exists(a.stop_file):
        n = rnd.randrange(64)
        origin = "%s:%d" % (a.origin_host, a.origin_port)
        target = "http://%s/f%d.txt" % (origin, n) if a.proxy else "/f%d.txt" % n
        req = ("GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (
            target, origin, "" if a.keepalive else "Connection: close\r\n")).encode()
        t0 = time.time()
        try:
            if w is None:
                r, w = await asyncio.wait_for(asyncio.open_connection(a.host, a.port), a.timeout)
            w.write(req)
            status, hdr, data = await asyncio.wait_for(read_response(r), a.timeout)
            if status != 200 or data != EXPECT[n]:
                count(st, "status %d, body %s" % (status, "ok" if data == EXPECT[n] else "wrong"))
            else:
                st["ok"] += 1
            if not a.keepalive or hdr.get("connection", "").lower() == "close":
                w.close()
                w = None
        except Exception as e:      # every way a reply can go wrong counts
            count(st, type(e).__name__)
            if w:
                w.close()
            w = None
        st["lat"].append(time.time() - t0)
    if w:
        w.close()


def snapshot(st, t0):
    lat = sorted(st["lat"]) or [0]
    dt = time.time() - t0
    return {"requests": st["ok"] + st["failed"], "ok": st["ok"], "failed": st["failed"],
            "errors": st["errors"], "seconds": round(dt, 2),
            "req_per_s": round((st["ok"] + st["failed"]) / dt, 1) if dt > 0 else 0,
            "p50_ms": round(1000 * lat[len(lat) // 2], 2),
            "p99_ms": round(1000 * lat[int(len(lat) * .99)], 2), "max_ms": round(1000 * lat[-1], 2)}


def write_json(path, d):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(d, f, indent=1)
    os.replace(tmp, path)


async def status_writer(a, st, t0, done):
    while not done.is_set():
        write_json(a.status, {"requests": st["ok"] + st["failed"], "ok": st["ok"],
                              "failed": st["failed"], "errors": st["errors"]})
        try:
            await asyncio.wait_for(done.wait(), 0.2)
        except asyncio.TimeoutError:
            pass


async def main(a):
    st = {"ok": 0, "failed": 0, "errors": {}, "lat": []}
    t0 = time.time()
    done = asyncio.Event()
    sw = asyncio.ensure_future(status_writer(a, st, t0, done)) if a.status else None
    await asyncio.gather(*[worker(a, st, t0 + a.duration) for _ in range(a.conns)])
    done.set()
    if sw:
        await sw
    rep = snapshot(st, t0)
    if a.status:
        write_json(a.status, rep)
    print(json.dumps(rep))
    if a.report:
        write_json(a.report, rep)
    return 1 if st["failed"] or not st["ok"] else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--write-files", metavar="DIR", help="write f0.txt..f63.txt into DIR and exit")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int)
    p.add_argument("--proxy", action="store_true", help="the server is a forward proxy")
    p.add_argument("--origin-host", default="127.0.0.1")
    p.add_argument("--origin-port", type=int, default=80)
    p.add_argument("--conns", type=int, default=8)
    p.add_argument("--duration", type=float, default=3600)
    p.add_argument("--timeout", type=float, default=5)
    p.add_argument("--keepalive", action="store_true")
    p.add_argument("--stop-file", default="/nonexistent")
    p.add_argument("--status")
    p.add_argument("--report")
    a = p.parse_args()
    if a.write_files:
        os.makedirs(a.write_files, exist_ok=True)
        for n in range(64):
            with open(os.path.join(a.write_files, "f%d.txt" % n), "wb") as f:
                f.write(EXPECT[n])
        sys.exit(0)
    if not a.port:
        p.error("--port is needed")
    sys.exit(asyncio.run(main(a)))
