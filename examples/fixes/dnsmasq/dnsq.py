"""One DNS query over UDP for the demos of examples/fixes/dnsmasq (stdlib
only): query(port, name, qtype) -> a short text of the answer ('A
10.66.66.66', 'MX mail.mx.test', 'SERVFAIL', 'no reply in 2 s')."""
import random
import socket
import struct

TYPES = {"A": 1, "MX": 15}
RCODES = {1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 5: "REFUSED"}


def _name(pkt, off):
    out = []
    for _ in range(128):
        n = pkt[off]
        if n == 0:
            return ".".join(out)
        if n & 0xC0 == 0xC0:
            return ".".join(out + [_name(pkt, struct.unpack(">H", pkt[off:off + 2])[0] & 0x3FFF)])
        out.append(pkt[off + 1:off + 1 + n].decode("latin1"))
        off += n + 1
    return ".".join(out)


def query(port, name, qtype="A", timeout=2.0):
    qid = random.randrange(65536)
    q = struct.pack(">6H", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
    q += struct.pack(">HH", TYPES[qtype], 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(timeout)
    try:
        s.sendto(q, ("127.0.0.1", port))
        while True:
            rep = s.recv(4096)
            if rep[:2] == q[:2]:
                break
    except socket.timeout:
        return "no reply in %g s" % timeout
    finally:
        s.close()
    flags, qd, an = struct.unpack(">3H", rep[2:8])
    if flags & 0xF:
        return RCODES.get(flags & 0xF, "rcode %d" % (flags & 0xF))
    off = 12
    while rep[off]:
        off += rep[off] + 1
    off += 5
    answers = []
    for _ in range(an):
        if rep[off] & 0xC0 == 0xC0:
            off += 2
        else:
            while rep[off]:
                off += rep[off] + 1
            off += 1
        t, c, ttl, l = struct.unpack(">HHIH", rep[off:off + 10])
        off += 10
        if t == 1:
            answers.append("A " + ".".join(str(b) for b in rep[off:off + 4]))
        elif t == 15:
            answers.append("MX " + _name(rep, off + 2))
        off += l
    return ", ".join(answers) or "NOERROR, no answer"
