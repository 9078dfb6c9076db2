#!/usr/bin/env python3
"""p10_overhead.py -- P10's first two numbers, measured so that a 2-core
machine shared with other jobs can resolve them: the cost of the wrappers
with no shadow (one version) and of a follower (two versions), on
tests/shadowupd/progs/kvs.c (4 workers, CONNS connections of kvsload).

One version ("shadowing armed, no follower"): the program image linked
with libmolt's wrappers of the followed calls (moltcc --molt-program, as
every image is) against the same source linked without them
(MOLT_NO_SHADOW_WRAP=1 moltcc ...).  Both servers run side by side and
the rounds alternate between them: requests per second, the server's CPU
time per request (the sum of its threads' /proc/PID/task/*/schedstat), and
under `valgrind --tool=callgrind` its instructions per request (user
space only: the kernel's part of a system call is not counted).

Two versions: the image with wrappers, each round measured without a
shadow and then with a follower of the same version (kvs rebuilt
--molt-from itself) replaying every call, then `molt rollback`.  Per
request: the leader's CPU time and the follower's, and requests per
second, in two placements -- "shared": no pinning, leader, follower and
load generator on the machine's 2 cores (the raw number: the follower's
CPU comes out of the leader's); "spare core": the leader and the load
generator pinned to CPU 0 in both halves of the round and the follower
to CPU 1 (MVEDSUA's setting, a core of its own for the follower).  And
under callgrind: the leader's instructions per request without and with
a follower, and the follower's (it runs with MOLT_SHADOW_BACKSTOP=off,
valgrind making the guest's system calls from its own code; it is ended
by a request that diverges -- the shadow's version is variant 1 -- so
that callgrind writes its profile at its exit: its worker threads' cost
from the fork on, divided by the requests it replayed).

With --server mosquitto the same on a real server, the MQTT broker
mosquitto 2.0.11 (examples/fullreal/mosquitto/; images and the plain build
from bench/shadowupd/mosquitto.sh --build-only, in --work) under
mqttstep.c's lock-step load (QoS 1 messages to the publisher's own topic,
one in flight per connection, every message checked; a request here is a
message).  One version compares three builds of deb12u1: plain
(mosquitto.patch taken out, built with gcc, no molt), the program image
without libmolt's wrappers (MOLT_NO_SHADOW_WRAP=1) and the image with them
(every image): under callgrind, the three run side by side and each round
sends the same COUNT messages (--cg-count) on one connection to each in
turn, instructions per message of the whole process (all threads) from
`callgrind_control -z` to `-d`, with where the difference goes (the image's
code, libc, libmolt's functions) from the last round's profiles.  Two
versions: the image shadowed by itself (u1same.so), the leader's and the
follower's CPU per message as for kvs, and under callgrind the leader's
instructions per message alone and with a follower (u1odd.so, ended by a
PUBLISH to molt/odd that it acks with another packet id).

  bench/shadowupd/p10_overhead.py [--server kvs|mosquitto] [--rounds 7]
      [--seconds 3] [--cg-seconds 4] [--cg-reps 2] [--cg-count N] [--conns N]
      [--molt-build DIR] [--work DIR] [--port P] [--skip one,two,cg]
"""

import argparse
import os
import pwd
import re
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KVS = os.path.join(ROOT, "tests", "shadowupd", "progs", "kvs.c")


def sh(args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


class Ctx:
    def __init__(self, a):
        self.build = os.path.abspath(a.molt_build)
        self.molt = os.path.join(self.build, "bin", "molt")
        self.run = os.path.join(self.build, "bin", "molt-run")
        self.moltcc = os.path.join(self.build, "bin", "moltcc")
        self.work = a.work
        self.conns = a.conns
        os.makedirs(self.work, exist_ok=True)

    def path(self, name):
        return os.path.join(self.work, name)

    def images(self):
        sh(["gcc", "-O2", "-pthread", "-o", self.path("kvsload"),
            os.path.join(HERE, "kvsload.c")])
        cc = [self.moltcc, "--molt-program", "-O2", "-g"]
        env = dict(os.environ, MOLT_NO_SHADOW_WRAP="1")
        sh(cc + ["-o", self.path("nowrap.so"), KVS], env=env)
        sh(cc + ["-o", self.path("wrap.so"), KVS])
        sh(cc + ["-o", self.path("wrapb.so"), KVS, "--molt-from", self.path("wrap.so")])
        sh(cc + ["-DKVS_VARIANT=1", "-o", self.path("wrapd.so"), KVS,
                 "--molt-from", self.path("wrap.so")])

    def start(self, image, name, pre=(), env=None):
        port = self.path(name + ".port")
        if os.path.exists(port):
            os.unlink(port)
        p = subprocess.Popen(list(pre) + [self.run, self.path(image), port, "4"],
                             stdout=subprocess.DEVNULL,
                             stderr=open(self.path(name + ".log"), "w"),
                             env=env, start_new_session=True)
        for _ in range(600):
            if os.path.exists(port) and open(port).read().strip():
                return p, int(open(port).read())
            time.sleep(0.1)
        raise SystemExit("p10_overhead: %s did not start (%s)" % (image, self.path(name + ".log")))

    def load(self, port, secs, cpu=None):
        pre = ["taskset", "-c", str(cpu)] if cpu is not None else []
        out = sh(pre + [self.path("kvsload"), str(port), str(self.conns), str(secs)])
        m = re.match(r"requests (\d+) seconds ([\d.]+) errors (\d+)", out)
        if not m or int(m.group(3)):
            raise SystemExit("p10_overhead: load failed: " + out)
        return int(m.group(1)), float(m.group(2))

    unit = "req"

    def diverge(self, port):
        """A request the shadow's version (variant 1) answers differently."""
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET magic\n")
        s.recv(100)
        s.close()

    def status(self, pid):
        out = sh([self.molt, "status", str(pid)])
        line = [ln for ln in out.splitlines() if ln.startswith("shadowed update")]
        return line[0] if line else ""

    def shadow(self, pid, image):
        sh([self.molt, "update", "--shadow", "--timeout", "120", str(pid), self.path(image)])
        st = self.status(pid)
        m = re.search(r"follower (\d+)", st)
        if "shadowing" not in st or not m:
            raise SystemExit("p10_overhead: no follower: " + st)
        return int(m.group(1))


class MosqCtx(Ctx):
    """The same measurements on mosquitto: images named as kvs's are
    (nowrap, wrap, wrapb: a follower of the same version, wrapd: one that
    diverges on request), plus plain; a message is a request."""
    IMAGES = {"nowrap.so": "u1nowrap.so", "wrap.so": "u1.so", "wrapb.so": "u1same.so",
              "wrapd.so": "u1odd.so"}
    unit = "msg"

    def __init__(self, a):
        super().__init__(a)
        self.port0 = a.port
        self.ports = {}

    def images(self):
        env = dict(os.environ, MOLT_FULLREAL_WORK=self.work, MOLT_BUILD=self.build)
        sh(["bash", os.path.join(HERE, "mosquitto.sh"), "--build-only"], env=env)
        sh(["gcc", "-O2", "-pthread", "-o", self.path("mqttstep"),
            os.path.join(HERE, "mqttstep.c")])

    def path(self, name):
        return os.path.join(self.work, self.IMAGES.get(name, name))

    def start(self, image, name, pre=(), env=None):
        # one port per server name: servers of one run side by side
        port = self.ports.setdefault(name, self.port0 + len(self.ports))
        conf = self.path(name + ".conf")
        with open(conf, "w") as f:
            f.write("listener %d 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    "user %s\nlog_dest none\n" % (port, pwd.getpwuid(os.getuid()).pw_name))
        cmd = [self.path("plain.bin")] if image == "plain" else [self.run, self.path(image)]
        p = subprocess.Popen(list(pre) + cmd + ["-c", conf], stdout=subprocess.DEVNULL,
                             stderr=open(self.path(name + ".log"), "w"), env=env,
                             start_new_session=True)
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return p, port
            except OSError:
                if p.poll() is not None:
                    break
                time.sleep(0.1)
        raise SystemExit("p10_overhead: %s did not start (%s)" % (image, self.path(name + ".log")))

    def load(self, port, secs, cpu=None, count=None):
        pre = ["taskset", "-c", str(cpu)] if cpu is not None else []
        args = ["1", str(count)] if count else [str(self.conns), "0", str(secs)]
        out = sh(pre + [self.path("mqttstep"), str(port)] + args)
        m = re.match(r"messages (\d+) seconds ([\d.]+) errors (\d+)", out)
        if not m or int(m.group(3)):
            raise SystemExit("p10_overhead: load failed: " + out)
        return int(m.group(1)), float(m.group(2))

    def diverge(self, port):
        sh(["python3", os.path.join(ROOT, "examples", "fullreal", "mosquitto", "mqttload.py"),
            "--port", str(port), "--publish", "molt/odd"])


def cpu_ns(pid):
    """CPU time of every thread of pid so far (ns)."""
    t = 0
    d = "/proc/%d/task" % pid
    for tid in os.listdir(d):
        try:
            with open(os.path.join(d, tid, "schedstat")) as f:
                t += int(f.read().split()[0])
        except OSError:
            pass
    return t


def pin(pid, cpu):
    subprocess.run(["taskset", "-a", "-cp", str(cpu), str(pid)], check=True,
                   stdout=subprocess.DEVNULL)


def stop(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def spread(xs):
    return "median %.4g (min %.4g, max %.4g, n %d)" % (statistics.median(xs), min(xs),
                                                       max(xs), len(xs))


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def one_version(c, rounds, secs):
    print("== one version: wrappers (no shadow) against no wrappers, %d rounds of %d s"
          % (rounds, secs))
    srv = {k: c.start(k + ".so", k) for k in ("nowrap", "wrap")}
    res = {k: {"rps": [], "cpu": []} for k in srv}
    try:
        for r in range(rounds):
            order = ("nowrap", "wrap") if r % 2 == 0 else ("wrap", "nowrap")
            line = []
            for k in order:
                p, port = srv[k]
                c0 = cpu_ns(p.pid)
                n, s = c.load(port, secs)
                cpu = (cpu_ns(p.pid) - c0) / n
                res[k]["rps"].append(n / s)
                res[k]["cpu"].append(cpu)
                line.append("%s %.0f req/s %.0f ns CPU/req" % (k, n / s, cpu))
            print("round %d: %s (load %s)" % (r + 1, ", ".join(line), loadavg()))
    finally:
        for p, _ in srv.values():
            stop(p)
    for k in ("nowrap", "wrap"):
        print("%-7s req/s %s; CPU ns/req %s" % (k, spread(res[k]["rps"]), spread(res[k]["cpu"])))
    rel = [100 * (w - n) / n for n, w in zip(res["nowrap"]["rps"], res["wrap"]["rps"])]
    relc = [100 * (w - n) / n for n, w in zip(res["nowrap"]["cpu"], res["wrap"]["cpu"])]
    print("wrappers: req/s %+.2f%% (per-round pairs: %s); CPU/req %+.2f%% (pairs: %s)" %
          (-100 * (1 - statistics.median(res["wrap"]["rps"]) / statistics.median(res["nowrap"]["rps"])),
           spread(rel), 100 * (statistics.median(res["wrap"]["cpu"]) /
                               statistics.median(res["nowrap"]["cpu"]) - 1), spread(relc)))
    return res


def two_versions(c, rounds, secs, spare):
    name = "spare core" if spare else "shared"
    print("== two versions (%s): no shadow, then a follower of the same version, %d rounds "
          "of %d s each" % (name, rounds, secs))
    p, port = c.start("wrap.so", "two")
    cpu = 0 if spare else None
    if spare:
        pin(p.pid, 0)
    res = {"rps0": [], "rps1": [], "lead0": [], "lead1": [], "fol": []}
    try:
        for r in range(rounds):
            c0 = cpu_ns(p.pid)
            n0, s0 = c.load(port, secs, cpu)
            l0 = (cpu_ns(p.pid) - c0) / n0
            fp = c.shadow(p.pid, "wrapb.so")
            if spare:
                pin(fp, 1)
            time.sleep(0.3)  # the follower's update and relaunch
            c0, f0 = cpu_ns(p.pid), cpu_ns(fp)
            n1, s1 = c.load(port, secs, cpu)
            # the follower's replay of this load, caught up (at most 5 s)
            for _ in range(50):
                st = c.status(p.pid)
                m = re.search(r"(\d+) calls recorded, (\d+) compared", st)
                if m and m.group(1) == m.group(2):
                    break
                time.sleep(0.1)
            l1 = (cpu_ns(p.pid) - c0) / n1
            fo = (cpu_ns(fp) - f0) / n1
            st = c.status(p.pid)
            sh([c.molt, "rollback", str(p.pid)])
            if "shadowing" not in st:
                raise SystemExit("p10_overhead: the shadow ended early: " + st)
            for k, v in (("rps0", n0 / s0), ("rps1", n1 / s1), ("lead0", l0), ("lead1", l1),
                         ("fol", fo)):
                res[k].append(v)
            print(("round %d: no shadow %.0f req/s, leader %.0f ns CPU/req; shadowing %.0f "
                   "req/s, leader %.0f ns/req, follower %.0f ns/req (%s) (load %s)")
                  .replace("req", c.unit) %
                  (r + 1, n0 / s0, l0, n1 / s1, l1, fo,
                   re.search(r"\d+ calls recorded.*ring use up to \d+%", st).group(0), loadavg()))
    finally:
        stop(p)
    m = {k: statistics.median(v) for k, v in res.items()}
    for k in res:
        print("%-6s %s" % (k, spread(res[k])))
    print(("%s: req/s %+.1f%%, leader CPU/req %+.1f%%, follower CPU/req %.2f of the "
           "leader's (no shadow)").replace("req", c.unit) % (name, 100 * (m["rps1"] / m["rps0"] - 1),
                                    100 * (m["lead1"] / m["lead0"] - 1),
                                    m["fol"] / m["lead0"]))
    return res


# ---- callgrind ----------------------------------------------------------------------

def cg_totals(path):
    for ln in open(path):
        if ln.startswith("totals:") or ln.startswith("summary:"):
            return int(ln.split()[1])
    raise SystemExit("p10_overhead: no totals in " + path)


def cg_inclusive(path, fn):
    """Inclusive Ir of function fn (callgrind_annotate)."""
    out = sh(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path])
    for ln in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s.*:(\S+) \[", ln)
        if m and m.group(2) == fn:
            return int(m.group(1).replace(",", ""))
    raise SystemExit("p10_overhead: no %s in %s" % (fn, path))


def cg_start(c, image, name, env=None):
    for f in os.listdir(c.work):
        if f.startswith("cg." + name + "."):
            os.unlink(c.path(f))
    pre = ["valgrind", "--tool=callgrind", "--dump-instr=yes",
           "--callgrind-out-file=" + c.path("cg." + name + ".%p")]
    return c.start(image, name, pre, env)


def cg_window(c, pid, port, secs):
    """Instructions of pid during a load of secs: (Ir, requests, profile)."""
    before = set(os.listdir(c.work))
    sh(["callgrind_control", "-z", str(pid)])
    n, _ = c.load(port, secs, count=c.cg_count) if c.cg_count else c.load(port, secs)
    sh(["callgrind_control", "-d", str(pid)])
    new = sorted(set(os.listdir(c.work)) - before)
    dump = [f for f in new if f.startswith("cg.") and ".%d." % pid in f + "."]
    if not dump:
        raise SystemExit("p10_overhead: no callgrind dump of %d" % pid)
    path = c.path(dump[-1])
    return cg_totals(path), n, path


def cg_self(path):
    """Self cost (Ir) of each (function, object) of a callgrind profile, and
    the calls made to each: read from the file (the cost lines after a
    calls= line are the call's inclusive cost, not the caller's own)."""
    names, objs = {}, {}
    own, calls = {}, {}
    fn = ob = cob = cfn = None
    skip = False

    def name(table, text):
        m = re.match(r"\((\d+)\)(?: (.*))?$", text)
        if not m:
            return text
        if m.group(2) is not None:
            table[m.group(1)] = m.group(2)
        return table.get(m.group(1), "?")

    for ln in open(path):
        ln = ln.rstrip("\n")
        if ln.startswith("ob="):
            ob = name(objs, ln[3:])
        elif ln.startswith("fn="):
            fn = (name(names, ln[3:]), os.path.basename(ob or "?"))
        elif ln.startswith("cob="):
            cob = name(objs, ln[4:])
        elif ln.startswith("cfn="):
            cfn = name(names, ln[4:])
        elif ln.startswith("calls="):
            k = (cfn, os.path.basename(cob or ob or "?"))
            calls[k] = calls.get(k, 0) + int(ln[6:].split()[0])
            skip, cob = True, None
        elif ln[:1].isdigit() or ln[:1] in "+-*":
            f = ln.split()
            if len(f) >= 2:
                if skip:
                    skip = False
                else:
                    own[fn] = own.get(fn, 0) + int(f[-1])  # Ir, the only event
    return own, calls


def cg_where(paths, n, labels):
    """Per message: each profile's instructions by object (the image, whose
    code molt's loader maps from a sealed copy, shows as ???), and the self
    cost and calls of libmolt's functions and of the libc functions whose
    cost differs between the profiles by 10 or more per message."""
    prof = [cg_self(p) for p in paths]
    objs = {}
    for i, (own, _) in enumerate(prof):
        for (f, o), v in own.items():
            o = "image" if o in ("???", "plain.bin") else o
            objs.setdefault(o, [0] * len(prof))[i] += v
    print("   by object, Ir/%s: %s" % (labels[0], " | ".join(labels[1:])))
    for o, v in sorted(objs.items(), key=lambda x: -max(x[1])):
        if max(v) / n >= 1:
            print("   %-24s %s" % (o, " | ".join("%9.1f" % (x / n) for x in v)))
    keys = set()
    for own, _ in prof:
        keys |= set(own)
    rows = []
    for k in keys:
        v = [own.get(k, 0) / n for own, _ in prof]
        if k[1].startswith("libmolt") and max(v) >= 1 or \
                k[1].startswith("libc") and max(v) - min(v) >= 10:
            rows.append((k, v, [cl.get(k, 0) / n for _, cl in prof]))
    print("   functions (self Ir per %s, calls per %s):" % (labels[0], labels[0]))
    for k, v, cl in sorted(rows, key=lambda r: -max(r[1])):
        print("   %-36s %s" % ("%s [%s]" % (k[0][:28], k[1].split(".so")[0]),
                               " | ".join("%7.1f (%4.1f)" % x for x in zip(v, cl))))


def cg_one_version(c, rounds, count):
    """mosquitto: plain, the image without wrappers and with them, side by
    side under callgrind; each round the same count of messages to each."""
    kinds = ("plain", "nowrap", "wrap")
    print("== one version under callgrind: %s side by side, %d rounds of %d messages "
          "(one connection, lock-step) each" % (", ".join(kinds), rounds, count))
    srv = {k: cg_start(c, "plain" if k == "plain" else k + ".so", "cg" + k) for k in kinds}
    res = {k: [] for k in kinds}
    last = {}
    try:
        for r in range(rounds):
            order = kinds if r % 2 == 0 else kinds[::-1]
            line = []
            for k in order:
                p, port = srv[k]
                ir, n, path = cg_window(c, p.pid, port, 0)
                res[k].append(ir / n)
                last[k] = (path, n)
                line.append("%s %.1f" % (k, ir / n))
            print("round %d: Ir/%s %s (load %s)" % (r + 1, c.unit, ", ".join(line), loadavg()))
    finally:
        for p, _ in srv.values():
            stop(p)
    for k in kinds:
        print("%-7s Ir/%s %s" % (k, c.unit, spread(res[k])))
    m = {k: statistics.median(res[k]) for k in kinds}
    for a, b in (("plain", "wrap"), ("plain", "nowrap"), ("nowrap", "wrap")):
        pairs = [100 * (y / x - 1) for x, y in zip(res[a], res[b])]
        print("%s against %s: %+.2f%% (medians; per-round pairs %s)"
              % (b, a, 100 * (m[b] / m[a] - 1), spread(pairs)))
    print("where (the last round's profiles):")
    cg_where([last[k][0] for k in kinds], count, [c.unit] + list(kinds))
    return res


def callgrind(c, secs, reps, one=True):
    print("== callgrind: instructions per %s (user space), %s of load each"
          % (c.unit, "%d messages" % c.cg_count if c.cg_count else "%d s" % secs))
    res = {"nowrap": [], "wrap": [], "lead0": [], "lead1": [], "fol": []}
    for rep in range(reps):
        for k in ("nowrap", "wrap") if one else ():
            p, port = cg_start(c, k + ".so", "cg" + k)
            try:
                ir, n, _ = cg_window(c, p.pid, port, secs)
            finally:
                stop(p)
            res[k].append(ir / n)
            print("%s: %d Ir / %d requests = %.1f Ir/req" % (k, ir, n, ir / n))
        env = dict(os.environ, MOLT_SHADOW_BACKSTOP="off")
        p, port = cg_start(c, "wrap.so", "cgtwo", env)
        try:
            ir, n, p0 = cg_window(c, p.pid, port, secs)
            res["lead0"].append(ir / n)
            fp = c.shadow(p.pid, "wrapd.so")
            time.sleep(1)  # the follower's update and relaunch (under valgrind)
            ir1, n1, p1 = cg_window(c, p.pid, port, secs)
            for _ in range(300):
                m = re.search(r"(\d+) calls recorded, (\d+) compared", c.status(p.pid))
                if m and m.group(1) == m.group(2):
                    break
                time.sleep(0.2)
            res["lead1"].append(ir1 / n1)
            if c.cg_count:
                print("leader alone against shadowing (the two windows' profiles):")
                cg_where([p0, p1], n1, [c.unit, "alone", "shadowing"])
            # a reply that differs ends the follower: callgrind writes its profile
            c.diverge(port)
            fpath = c.path("cg.cgtwo.%d" % fp)
            for _ in range(100):
                if os.path.exists(fpath) and cg_totals(fpath):
                    break
                time.sleep(0.2)
            time.sleep(0.5)
            # its program threads from their relaunch on (not the update)
            fir = cg_inclusive(fpath, "relaunched")
            res["fol"].append(fir / n1)
            u = c.unit
            print("leader alone %.1f Ir/%s; with a follower %.1f Ir/%s; follower %.1f Ir/%s "
                  "(its program threads since the fork: %d Ir, %d %ss replayed)"
                  % (ir / n, u, ir1 / n1, u, fir / n1, u, fir, n1, u))
        finally:
            stop(p)
    for k in res:
        if res[k]:
            print("%-6s Ir/%s %s" % (k, c.unit, spread(res[k])))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--cg-seconds", type=int, default=4)
    ap.add_argument("--cg-reps", type=int, default=2)
    ap.add_argument("--conns", type=int, default=None,
                    help="connections of the load (kvs: 3, mosquitto: 4)")
    ap.add_argument("--server", choices=("kvs", "mosquitto"), default="kvs")
    ap.add_argument("--cg-count", type=int, default=5000,
                    help="mosquitto: messages per callgrind window")
    ap.add_argument("--port", type=int, default=27811,
                    help="mosquitto: the first of the brokers' ports")
    ap.add_argument("--molt-build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default=None,
                    help="default /tmp/molt-bench-p10-overhead (kvs), "
                         "/var/tmp/molt-p10-mosquitto (mosquitto)")
    ap.add_argument("--skip", default="")
    a = ap.parse_args()
    skip = set(a.skip.split(",")) - {""}
    mosq = a.server == "mosquitto"
    a.conns = a.conns or (4 if mosq else 3)
    a.work = a.work or ("/var/tmp/molt-p10-mosquitto" if mosq else "/tmp/molt-bench-p10-overhead")
    c = MosqCtx(a) if mosq else Ctx(a)
    c.cg_count = a.cg_count if mosq else None
    c.images()
    print("%s; load average at the start: %s; %d CPUs" % (a.server, loadavg(), os.cpu_count()))
    if "one" not in skip:
        if mosq:
            cg_one_version(c, a.rounds, a.cg_count)
        else:
            one_version(c, a.rounds, a.seconds)
    if "two" not in skip:
        two_versions(c, a.rounds, a.seconds, spare=False)
        two_versions(c, a.rounds, a.seconds, spare=True)
    if "cg" not in skip:
        callgrind(c, a.cg_seconds, a.cg_reps, one=not mosq)
    print("load average at the end: %s" % loadavg())


if __name__ == "__main__":
    main()
