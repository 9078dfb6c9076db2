#!/usr/bin/env python3
"""mqttload — checked load for an MQTT broker (MQTT 3.1.1, stdlib only).

    mqttload.py --port P [--conns 8] [--window 8] [--retained 100]
                (--duration S | --stop-file F) [--report out.json]
    mqttload.py --port P --check-retained N      a fresh client must get them
    mqttload.py --port P --shared                a shared subscription works
    mqttload.py --port P --shared-hold GO        one made before the update
    mqttload.py --port P --publish TOPIC         one QoS 1 PUBLISH, its PUBACK checked
    mqttload.py --port P --fill N                N retained messages keep/K, then exit

Load: each of --conns clients connects once (clean session), subscribes to
its own topic `load/I` at QoS 1, and publishes numbered QoS 1 messages to
it, --window in flight.  Every PUBLISH must be PUBACKed with its packet id,
and must come back to its publisher, exactly once and in order, with its
payload.  Before the load, --retained messages `keep/K` = "value-K" are
published retained (the broker's data); at the end a fresh client
subscribes to `keep/#` and must get every one of them with its value.

A connection that closes, a reply that differs, or a message lost, repeated
or late (10 s) is a failure; connections are kept for the whole run.  Exit
status 0 only if nothing failed.

--shared-hold GO: a client subscribes to `$share/molt/pre/t`, says
"subscribed", and waits for the file GO (the update is made meanwhile);
then a message to `pre/t` must reach it exactly once, and after its
UNSUBSCRIBE none may (the subscription must have moved to the new tree).

--latency FILE (with the load): each message's round trip, from its
PUBLISH to its coming back, as lines "T MS" (T: seconds since the epoch
when it came back), for the maximum latency around an update (bench).

--publish TOPIC: a fresh client publishes one message to TOPIC at QoS 1
and must get the PUBACK of its packet id (examples/fullreal/mosquitto/
shadow.sh: the leader's answer, whatever a follower would have said).

--shared: a client subscribes to `$share/molt/shared/t`, another publishes
to `shared/t` at QoS 1, and the first must get it (mosquitto 2.0.11's
+deb12u2 keeps such subscriptions in a tree of their own).
"""
import argparse
import json
import os
import socket
import struct
import sys
import threading
import time

CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK = 1, 2, 3, 4, 8, 9
UNSUBSCRIBE, UNSUBACK = 10, 11
PINGREQ, PINGRESP, DISCONNECT = 12, 13, 14


class Failure(Exception):
    pass


def remaining_length(n):
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def utf8(s):
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def packet(kind, flags, body):
    return bytes([kind << 4 | flags]) + remaining_length(len(body)) + body


class Client:
    def __init__(self, port, client_id, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.next_id = 1
        body = utf8("MQTT") + bytes([4, 0x02]) + struct.pack("!H", 60) + utf8(client_id)
        self.sock.sendall(packet(CONNECT, 0, body))
        kind, _, body = self.read()
        if kind != CONNACK or body != b"\x00\x00":
            raise Failure("CONNECT of %s: got packet %d %r" % (client_id, kind, body))

    def read(self):
        while True:
            if len(self.buf) >= 2:
                n, mult, i = 0, 1, 1
                while i < len(self.buf) and i <= 4:
                    n += (self.buf[i] & 0x7F) * mult
                    mult *= 128
                    if not self.buf[i] & 0x80:
                        break
                    i += 1
                else:
                    i = None
                if i is not None and i < len(self.buf) and len(self.buf) >= i + 1 + n:
                    head, body = self.buf[0], self.buf[i + 1:i + 1 + n]
                    self.buf = self.buf[i + 1 + n:]
                    return head >> 4, head & 0x0F, body
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise Failure("no reply within the timeout")
            if not data:
                raise Failure("the broker closed the connection")
            self.buf += data

    def packet_id(self):
        pid = self.next_id
        self.next_id = self.next_id % 65535 + 1
        return pid

    def subscribe(self, topic, qos=1):
        pid = self.packet_id()
        self.sock.sendall(packet(SUBSCRIBE, 2, struct.pack("!H", pid) + utf8(topic) + bytes([qos])))
        kind, _, body = self.read()
        if kind != SUBACK or body != struct.pack("!H", pid) + bytes([qos]):
            raise Failure("SUBSCRIBE %s: got packet %d %r" % (topic, kind, body))

    def unsubscribe(self, topic):
        pid = self.packet_id()
        self.sock.sendall(packet(UNSUBSCRIBE, 2, struct.pack("!H", pid) + utf8(topic)))
        kind, _, body = self.read()
        if kind != UNSUBACK or body != struct.pack("!H", pid):
            raise Failure("UNSUBSCRIBE %s: got packet %d %r" % (topic, kind, body))

    def nothing_pending(self, what):
        """PINGREQ/PINGRESP: whatever the broker sent before is read first."""
        self.sock.sendall(packet(PINGREQ, 0, b""))
        kind, flags, body = self.read()
        if kind == PUBLISH:
            raise Failure("%s: got %r" % (what, self.ack(flags, body)))
        if kind != PINGRESP:
            raise Failure("%s: got packet %d" % (what, kind))

    def publish(self, topic, payload, qos=1, retain=False):
        pid = self.packet_id() if qos else None
        body = utf8(topic) + (struct.pack("!H", pid) if qos else b"") + payload
        self.sock.sendall(packet(PUBLISH, qos << 1 | int(retain), body))
        return pid

    def ack(self, flags, body):
        """Parses a PUBLISH; PUBACKs it at QoS 1; returns (topic, payload)."""
        n = struct.unpack("!H", body[:2])[0]
        topic = body[2:2 + n].decode()
        rest = body[2 + n:]
        if (flags >> 1) & 3:
            pid = rest[:2]
            rest = rest[2:]
            self.sock.sendall(packet(PUBACK, 0, pid))
        return topic, rest

    def close(self):
        try:
            self.sock.sendall(packet(DISCONNECT, 0, b""))
        except OSError:
            pass
        self.sock.close()


def publish_retained(port, count):
    c = Client(port, "mqttload-retain")
    pending = set()
    for k in range(count):
        pending.add(c.publish("keep/%d" % k, b"value-%d" % k, qos=1, retain=True))
    while pending:
        kind, _, body = c.read()
        if kind != PUBACK:
            raise Failure("retained PUBLISH: got packet %d" % kind)
        pending.discard(struct.unpack("!H", body)[0])
    c.close()


def check_retained(port, count):
    c = Client(port, "mqttload-check-%d" % os.getpid())
    c.subscribe("keep/#")
    got = {}
    while len(got) < count:
        kind, flags, body = c.read()
        if kind != PUBLISH:
            raise Failure("retained check: got packet %d" % kind)
        topic, payload = c.ack(flags, body)
        got[topic] = payload
    c.close()
    for k in range(count):
        if got.get("keep/%d" % k) != b"value-%d" % k:
            raise Failure("retained keep/%d: %r" % (k, got.get("keep/%d" % k)))


def check_shared(port):
    sub = Client(port, "mqttload-shared-sub")
    sub.subscribe("$share/molt/shared/t")
    pub = Client(port, "mqttload-shared-pub")
    pub.publish("shared/t", b"to the group", qos=1)
    kind, _, _ = pub.read()
    if kind != PUBACK:
        raise Failure("shared PUBLISH: got packet %d" % kind)
    kind, flags, body = sub.read()
    if kind != PUBLISH or sub.ack(flags, body) != ("shared/t", b"to the group"):
        raise Failure("shared subscription: got packet %d %r" % (kind, body))
    pub.close()
    sub.close()


def publish_once(port, topic, payload):
    pub = Client(port, "mqttload-pub-%d" % os.getpid())
    pub.publish(topic, payload, qos=1)
    kind, _, _ = pub.read()
    if kind != PUBACK:
        raise Failure("PUBLISH %s: got packet %d" % (topic, kind))
    pub.close()


def publish_checked(port, topic):
    """One QoS 1 PUBLISH on a fresh connection: the PUBACK must carry its
    packet id."""
    pub = Client(port, "mqttload-one-%d" % os.getpid())
    pub.next_id = 4242
    pid = pub.publish(topic, b"one message", qos=1)
    kind, _, body = pub.read()
    if kind != PUBACK or body[:2] != struct.pack("!H", pid):
        raise Failure("PUBLISH %s (packet id %d): got packet %d %r" % (topic, pid, kind, body))
    pub.close()


def shared_hold(port, go_file):
    """A shared subscription made before the update, checked after it."""
    sub = Client(port, "mqttload-shared-hold")
    sub.subscribe("$share/molt/pre/t")
    print("subscribed", flush=True)
    while not os.path.exists(go_file):
        time.sleep(0.05)
    publish_once(port, "pre/t", b"after the update")
    kind, flags, body = sub.read()
    if kind != PUBLISH or sub.ack(flags, body) != ("pre/t", b"after the update"):
        raise Failure("shared subscription from before the update: got packet %d %r" % (kind, body))
    sub.nothing_pending("the same message twice")
    sub.unsubscribe("$share/molt/pre/t")
    publish_once(port, "pre/t", b"after UNSUBSCRIBE")
    sub.nothing_pending("a message after UNSUBSCRIBE")
    sub.close()


class Conn(threading.Thread):
    def __init__(self, port, index, window, stop, latency=False):
        super().__init__(daemon=True)
        self.port, self.index, self.window, self.stop = port, index, window, stop
        self.done = 0
        self.error = None
        self.latency = [] if latency else None   # (came back, ms)

    def run(self):
        try:
            self.loop()
        except Exception as e:  # noqa: BLE001 - every failure is reported
            self.error = "connection %d: %s" % (self.index, e)

    def loop(self):
        c = Client(self.port, "mqttload-%d-%d" % (os.getpid(), self.index))
        topic = "load/%d" % self.index
        c.subscribe(topic)
        sent = 0            # messages published
        acked = {}          # packet id -> sequence number, PUBACK pending
        expect = 0          # the next sequence number that must come back
        sent_at = {}        # sequence number -> when it was published (--latency)
        while True:
            stopping = self.stop()
            while not stopping and sent - expect < self.window:
                pid = c.publish(topic, b"%d:%d:%s" % (self.index, sent, b"x" * (sent % 64)))
                if self.latency is not None:
                    sent_at[sent] = time.time()
                acked[pid] = sent
                sent += 1
            if stopping and expect == sent and not acked:
                break
            kind, flags, body = c.read()
            if kind == PUBACK:
                pid = struct.unpack("!H", body)[0]
                if pid not in acked:
                    raise Failure("PUBACK for packet id %d never sent or acked twice" % pid)
                del acked[pid]
            elif kind == PUBLISH:
                got_topic, payload = c.ack(flags, body)
                want = b"%d:%d:%s" % (self.index, expect, b"x" * (expect % 64))
                if got_topic != topic or payload != want:
                    raise Failure("message %d: got %s %r" % (expect, got_topic, payload[:40]))
                if self.latency is not None:
                    now = time.time()
                    self.latency.append((now, (now - sent_at.pop(expect)) * 1000.0))
                expect += 1
                self.done += 1
            else:
                raise Failure("unexpected packet %d" % kind)
        c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--retained", type=int, default=100)
    ap.add_argument("--duration", type=float)
    ap.add_argument("--stop-file")
    ap.add_argument("--report")
    ap.add_argument("--check-retained", type=int)
    ap.add_argument("--shared", action="store_true")
    ap.add_argument("--shared-hold", metavar="GO_FILE")
    ap.add_argument("--publish", metavar="TOPIC")
    ap.add_argument("--fill", type=int, metavar="N")
    ap.add_argument("--latency", metavar="FILE")
    a = ap.parse_args()
    try:
        if a.check_retained is not None:
            check_retained(a.port, a.check_retained)
            print("retained: %d of %d kept" % (a.check_retained, a.check_retained))
            return 0
        if a.shared_hold:
            shared_hold(a.port, a.shared_hold)
            print("shared subscription from before the update: delivered once, then unsubscribed")
            return 0
        if a.fill is not None:
            publish_retained(a.port, a.fill)
            print("retained: %d published" % a.fill)
            return 0
        if a.publish:
            publish_checked(a.port, a.publish)
            print("PUBLISH %s: acked" % a.publish)
            return 0
        if a.shared:
            check_shared(a.port)
            print("shared subscription: delivered")
            return 0
        if a.retained:
            publish_retained(a.port, a.retained)
    except (Failure, OSError) as e:
        print("mqttload: %s" % e, file=sys.stderr)
        return 1
    t0 = time.time()
    if a.stop_file:
        stop = lambda: os.path.exists(a.stop_file)  # noqa: E731
    else:
        stop = lambda: time.time() - t0 >= (a.duration or 5)  # noqa: E731
    conns = [Conn(a.port, i, a.window, stop, bool(a.latency)) for i in range(a.conns)]
    for c in conns:
        c.start()
    for c in conns:
        c.join()
    seconds = time.time() - t0
    if a.latency:
        with open(a.latency, "w") as f:
            for t, ms in sorted(x for c in conns for x in c.latency):
                f.write("%.6f %.3f\n" % (t, ms))
    errors = [c.error for c in conns if c.error]
    retained_error = None
    if a.retained:
        try:
            check_retained(a.port, a.retained)
        except (Failure, OSError) as e:
            retained_error = str(e)
    rep = {"messages": sum(c.done for c in conns), "failed": len(errors) + bool(retained_error),
           "errors": errors + ([retained_error] if retained_error else []),
           "seconds": round(seconds, 2), "conns_kept": a.conns - len(errors),
           "retained_kept": 0 if retained_error else a.retained}
    rep["msg_per_s"] = round(rep["messages"] / max(seconds, 1e-9), 1)
    print(json.dumps(rep))
    if a.report:
        with open(a.report, "w") as f:
            json.dump(rep, f)
    return 0 if not rep["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
