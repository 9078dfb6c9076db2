#!/usr/bin/env python3
"""A long-lived connection through tinyproxy, kept open across a full update
(run.sh --failures).

    tunnel.py PROXY_PORT ORIGIN_PORT FILE GO_FILE

Opens a CONNECT tunnel through the proxy on 127.0.0.1:PROXY_PORT to the
origin (origin.py, HTTP/1.1 with keep-alive) on 127.0.0.1:ORIGIN_PORT, gets
/FILE through it and checks the body against FILE on disk, prints "open"
and waits (the proxy's thread of this connection relays, in
relay_connection) until GO_FILE exists; then gets /FILE again over the same
tunnel and checks it.  Prints what it saw; exit status 0 only if both
replies were complete and right and the tunnel was never closed."""
import os
import socket
import sys
import time

proxy, origin, path, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
want = open(path, "rb").read()
name = os.path.basename(path)


def reply(s, buf):
    """One HTTP reply from s (buf: bytes already read): (head, body, rest)."""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            raise SystemExit("tunnel: closed before a reply's head (%d bytes)" % len(buf))
        buf += d
    head, buf = buf.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(buf) < length:
        d = s.recv(65536)
        if not d:
            raise SystemExit("tunnel: closed in a body (%d of %d bytes)" % (len(buf), length))
        buf += d
    return head.decode("latin1"), buf[:length], buf[length:]


def get(s, buf, when):
    s.sendall(b"GET /%s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % name.encode())
    head, body, buf = reply(s, buf)
    status = head.split("\r\n", 1)[0]
    if " 200 " not in status + " " or body != want:
        raise SystemExit("tunnel: %s: %s, %d bytes, %s" % (
            when, status, len(body), "right body" if body == want else "wrong body"))
    print("%s: %s, %d bytes, right body" % (when, status, len(body)), flush=True)
    return buf


s = socket.create_connection(("127.0.0.1", proxy), timeout=30)
s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (origin, origin))
head, _, buf = reply(s, b"")
if " 200 " not in head.split("\r\n", 1)[0] + " ":
    raise SystemExit("tunnel: CONNECT answered %s" % head.split("\r\n", 1)[0])
buf = get(s, buf, "before")
print("open", flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(go):
    if time.monotonic() > deadline:
        raise SystemExit("tunnel: %s never appeared" % go)
    time.sleep(0.05)
get(s, buf, "after")
s.close()
