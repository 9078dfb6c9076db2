#!/usr/bin/env python3
"""rawreq.py HOST PORT REQUEST [TIMEOUT]: sends REQUEST (with \\r\\n escapes)
and prints the reply, or what happened instead ([closed: N bytes],
[timeout: N bytes], [reset: N bytes], [refused]).  Exit status 0 if a reply
came, 1 otherwise."""
import socket, sys

host, port = sys.argv[1], int(sys.argv[2])
req = sys.argv[3].encode().decode("unicode_escape").encode("latin1")
timeout = float(sys.argv[4]) if len(sys.argv) > 4 else 3
try:
    s = socket.create_connection((host, port), timeout=timeout)
except OSError:
    print("[refused]")
    sys.exit(1)
s.sendall(req)
buf, how = b"", "closed"
try:
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
except socket.timeout:
    how = "timeout"
except ConnectionResetError:
    how = "reset"
sys.stdout.write(buf.decode("latin1"))
print("\n[%s: %d bytes]" % (how, len(buf)))
sys.exit(0 if buf else 1)
