#!/usr/bin/env python3
"""soak.py -- many updates in a row under checked load, with a hostile
client on the control socket and a forking thread in the program (R4 of
docs/guarantees.md).

Two real processes, real sockets, the molt CLI for every update:

  hot   examples/kvstore (built with moltcc, plus forker.c: a thread that
        forks every --fork-ms ms) is patched with its fix-del patch and
        rolled back, --hot times each (an apply and a rollback per round);
  full  examples/kvfull v1 run with `molt run` is updated --full times,
        alternating between two images of the same source, each built
        --molt-from the other (build-ids set so that the pair closes).

Meanwhile --clients threads per process keep one TCP connection each and
check every reply against their own model (SET, GET, DEL of their own
keys: the replies are the same in every version used here), and the
hostile client (--hostile KINDS) -- forked children, as root and as
`nobody` (setresuid) -- sends the control socket garbage, half frames and
connect/close floods.

The run prints its figures: updates done, replies checked, wrong and lost
replies, forks, hostile connections, and fd count, /proc/PID/maps lines and
RSS at the start (after a warm-up) and at the end.  It exits 1 if any
update failed, any reply was wrong or lost, a forked child got stuck, the
process died, or (with --bounds) fd count, mappings or RSS grew past
--max-fds, --max-maps, --max-rss-kb (under a sanitizer RSS is not
bounded, and under AddressSanitizer only named mappings are counted: its
allocator's own regions grow).  A mappings failure lists the names whose count grew.

  soak.py                     the full run (10,000 rounds, 1,000 full updates)
  soak.py --short --bounds    the CI version (tests/soak, label soak)

--molt-build DIR: the molt build tree (default <repo>/build); --work DIR:
where the programs are built (default a temporary directory).
"""
import argparse
import collections
import os
import random
import re
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
HERE = os.path.dirname(os.path.abspath(__file__))
KVSTORE = os.path.join(ROOT, "examples", "kvstore")
KVFULL = os.path.join(ROOT, "examples", "kvfull")
NOBODY = 65534


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="the CI version (a few seconds each)")
    ap.add_argument("--hot", type=int, help="apply+rollback rounds (10000; short: 60)")
    ap.add_argument("--full", type=int, help="full updates (1000; short: 30)")
    ap.add_argument("--clients", type=int, default=4, help="checking clients per process")
    ap.add_argument("--fork-ms", type=int, default=20, help="forking thread period (0: none)")
    ap.add_argument("--hostile", default="flood,garbage,half",
                    help="kinds of hostile connections, comma-separated, from "
                         "flood, garbage, half, slow (half a frame held open); "
                         "'none' for none")
    ap.add_argument("--hostile-uids", default="0,%d" % NOBODY,
                    help="uids the hostile children run as (setresuid; needs root)")
    ap.add_argument("--only", choices=("hot", "full"), help="run one part only")
    ap.add_argument("--kept-patch", action="store_true",
                    help="patch with kvstore's fix-del, which molt keeps loaded after a rollback")
    ap.add_argument("--bounds", action="store_true", help="fail when a figure grows past its bound")
    ap.add_argument("--max-fds", type=int, default=2)
    ap.add_argument("--max-maps", type=int, default=4)
    ap.add_argument("--max-rss-kb", type=int, default=2048)
    ap.add_argument("--molt-build", default=os.environ.get("MOLT_BUILD_DIR") or
                    os.path.join(ROOT, "build"))
    ap.add_argument("--work")
    a = ap.parse_args()
    if a.hot is None:
        a.hot = 60 if a.short else 10000
    if a.full is None:
        a.full = 30 if a.short else 1000
    a.hostile = [] if a.hostile in ("", "none") else a.hostile.split(",")
    for k in a.hostile:
        if k not in ("flood", "garbage", "half", "slow"):
            ap.error("unknown hostile kind %r" % k)
    a.hostile_uids = [int(u) for u in a.hostile_uids.split(",") if u != ""]
    a.molt_build = os.path.abspath(a.molt_build)
    return a


ARGS = parse_args()
os.environ["MOLT_BUILD_DIR"] = os.path.abspath(ARGS.molt_build)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from harness.moltcc import moltcc  # noqa: E402  (after MOLT_BUILD_DIR is set)
from harness.proc import Program, molt, status  # noqa: E402
from harness.tree import build_sanitize, san_flags  # noqa: E402

# AddressSanitizer keeps freed memory in its quarantine (up to 256 MiB),
# and ThreadSanitizer's shadow memory and access history grow with the
# memory the run touches (+3.4 to +3.8 MiB over the short soak, with fds
# and mappings flat; as fullupdate_memory found): RSS says nothing about
# leaks under either, and is printed but not bounded.
RSS_BOUNDED = not build_sanitize()
# Its allocator also maps new anonymous regions as the quarantine turns over
# (+3 to +5 over the short soak's 30 full updates, where the plain build's
# count stays flat), so there only named mappings (images, memfds, files)
# are bounded.
ANON_MAPS_BOUNDED = build_sanitize() != "address"


def log(msg):
    print("soak: " + msg, flush=True)


# ---- building ------------------------------------------------------------------------

def build_hot(work):
    """kvstore (+ forker.c) and its fix-del patch -> (binary, patch)."""
    obj = os.path.join(work, "kvstore-obj")
    os.makedirs(obj, exist_ok=True)
    flags = ["-O2", "-g", "-I", KVSTORE, "-I", os.path.join(ROOT, "include")] + san_flags()
    srcs = [os.path.join(KVSTORE, s) for s in ("kvstore.c", "kv_net.c", "kv_store.c",
                                                "kv_commands.c")] + [os.path.join(HERE, "forker.c")]
    objs = [os.path.join(obj, os.path.basename(src)[:-2] + ".o") for src in srcs]
    with ThreadPoolExecutor(2) as ex:
        for r in ex.map(lambda so: moltcc(flags + ["-c", "-o", so[1], so[0]], cwd=KVSTORE),
                        zip(srcs, objs)):
            r.ok()
    exe = os.path.join(work, "kvstore")
    moltcc(["-O2", "-g"] + san_flags() + ["-o", exe] + objs + ["-pthread"], cwd=KVSTORE).ok()
    # The patch: kv_format_reply (every reply goes through it) writes its
    # space and newline from variables instead of string literals: other
    # code, the same replies, and no literal, so that molt can unload each
    # copy after its rollback.  kvstore's own patches return a literal
    # from kv_version_string, and molt keeps every applied copy of such a
    # patch loaded (by design; --kept-patch uses fix-del to show the cost).
    with open(os.path.join(KVSTORE, "kv_commands.c")) as f:
        text = f.read()
    edits = [('kv_out_append(out, " ", 1);', "char sp = ' ';\n    kv_out_append(out, &sp, 1);"),
             ('kv_out_append(out, "\\n", 1);', "char nl = '\\n';\n  kv_out_append(out, &nl, 1);")]
    for a, b in edits:
        assert text.count(a) == 1, "examples/kvstore/kv_commands.c changed: adapt the soak (%s)" % a
        text = text.replace(a, b)
    os.makedirs(os.path.join(work, "soak-patch"), exist_ok=True)
    src = os.path.join(work, "soak-patch", "kv_commands.c")
    with open(src, "w") as f:
        f.write(text)
    if ARGS.kept_patch:
        src = os.path.join(KVSTORE, "patches", "fix-del", "kv_commands.c")
    patch = os.path.join(work, "soak.so")
    moltcc(["--molt-patch", "--molt-target", exe, "-o", patch, src,
            "--molt-patch-id", "soak", "--molt-description", "soak: cmd_del, same replies"],
           cwd=KVSTORE).ok()
    return exe, patch


def set_build_id(path, hexid):
    """Rewrites the GNU build-id note of an image in place (same length)."""
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        data = bytearray(f.read())
        f.seek(0)
        elf = ELFFile(f)
        old = None
        for sec in elf.iter_sections():
            if sec["sh_type"] != "SHT_NOTE":
                continue
            for n in sec.iter_notes():
                if n["n_type"] == "NT_GNU_BUILD_ID":
                    old = bytes.fromhex(n["n_desc"])
    new = bytes.fromhex(hexid)
    assert old and len(old) == len(new) and data.count(old) == 1, path
    data[data.index(old):data.index(old) + len(old)] = new
    with open(path, "wb") as f:
        f.write(data)


def build_full(work):
    """Three images of kvfull v1: P0 (first version), Q (from P0) and P
    (from Q), with build-ids set so that P0 and P share one: the process
    runs P0 and is then updated Q, P, Q, P, ... for ever."""
    d = os.path.join(work, "kvfull")
    os.makedirs(d, exist_ok=True)
    ids = {"P": "50" * 20, "Q": "51" * 20}
    src = sorted(os.path.join(KVFULL, "v1", f) for f in os.listdir(os.path.join(KVFULL, "v1"))
                 if f.endswith(".c"))
    flags = ["--molt-program", "-O2", "-g", "-I", os.path.join(KVFULL, "v1")]
    out = {}
    prev = None
    for name, bid in (("P0", "P"), ("Q", "Q"), ("P", "P")):
        path = os.path.join(d, "kvfull-%s.so" % name)
        args = flags + ["-o", path] + src + (["--molt-from", prev] if prev else [])
        moltcc(args, cwd=d).ok()
        set_build_id(path, ids[bid])
        out[name] = prev = path
    return out


# ---- measuring -----------------------------------------------------------------------

def mapping_name(line):
    """What a /proc/PID/maps line maps: its path with numbers as "N" (an image
    loaded per update has a new number each time), or "[anon]"."""
    parts = line.split(None, 5)
    return re.sub(r"[0-9]+", "N", parts[5].strip()) if len(parts) == 6 else "[anon]"


def figures(pid):
    fds = len(os.listdir("/proc/%d/fd" % pid))
    with open("/proc/%d/maps" % pid) as f:
        names = [mapping_name(line) for line in f]
    maps = len(names)
    with open("/proc/%d/statm" % pid) as f:
        rss_kb = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    named = sum(1 for n in names if n != "[anon]")
    return {"fds": fds, "maps": maps, "named_maps": named, "rss_kb": rss_kb, "names": names}


# ---- checked load --------------------------------------------------------------------

class Checker(threading.Thread):
    """One connection; SET/GET/DEL of its own keys, each reply checked
    against the model.  ok_set: the server's reply to SET."""

    def __init__(self, cid, port, ok_set):
        threading.Thread.__init__(self, daemon=True)
        self.cid, self.ok_set = cid, ok_set
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.model = {}
        self.rng = random.Random(cid)
        self.checked = self.wrong = self.lost = 0
        self.errors = []
        self.stop = threading.Event()

    def ask(self, line):
        self.sock.sendall(line.encode() + b"\n")
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed by the server")
            self.buf += chunk
        reply, self.buf = self.buf.split(b"\n", 1)
        return reply.decode()

    def step(self):
        key = "s%d:k%d" % (self.cid, self.rng.randrange(32))
        op = self.rng.random()
        if op < 0.4:
            val = "v%d" % self.rng.randrange(10 ** 9)
            want, line = self.ok_set, "SET %s %s" % (key, val)
            self.model[key] = val
        elif op < 0.85 or key not in self.model:
            want = "VALUE " + self.model[key] if key in self.model else "NOT_FOUND"
            line = "GET " + key
        else:
            # DEL of a key that exists: the same reply in every version
            # (kvstore 1.0 and 1.1 differ only for a missing key)
            want, line = "DELETED", "DEL " + key
            del self.model[key]
        got = self.ask(line)
        self.checked += 1
        if got != want:
            self.wrong += 1
            if len(self.errors) < 5:
                self.errors.append("%s -> %r, expected %r" % (line, got, want))

    def run(self):
        try:
            while not self.stop.is_set():
                self.step()
        except (OSError, ConnectionError) as e:
            self.lost += 1
            self.errors.append("client %d: %s" % (self.cid, e))


# ---- the hostile client --------------------------------------------------------------

def control_name(pid):
    """The abstract name of pid's control socket, from /proc/net/unix and
    the sockets pid has open (whatever the name is)."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            t = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if t.startswith("socket:["):
            inodes.add(t[8:-1])
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            # Num RefCount Protocol Flags Type St Inode Path; St 01 = listening
            if len(parts) >= 8 and parts[6] in inodes and parts[7].startswith("@molt"):
                return "\0" + parts[7][1:]
    return "\0molt.%d" % pid


def hostile_child(name, uid, kinds, stopfile, wfd):
    """Runs in a forked child: hammers the socket until stopfile exists,
    then writes its count to wfd."""
    n = 0
    try:
        if uid != os.getuid():
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        rng = random.Random(uid * 7919 + os.getpid())
        held = []
        parent = os.getppid()
        # until told to stop, or until the soak is gone (an orphan)
        while not os.path.exists(stopfile) and os.getppid() == parent:
            kind = rng.choice(kinds)
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(0.5)
                s.connect(name)
                if kind == "garbage":
                    s.sendall(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))))
                elif kind in ("half", "slow"):
                    # a request header that promises more than it sends
                    hdr = struct.pack("<IHHiI", 0x544c4f4d, 1, rng.choice((1, 2, 5)), 0, 200)
                    s.sendall(hdr[:rng.randrange(1, 16)] if rng.random() < 0.5 else hdr + b"x")
                if kind == "slow":
                    held.append((time.monotonic() + 0.2, s))
                else:
                    s.close()
                n += 1
            except OSError:
                pass
            now = time.monotonic()
            for item in [h for h in held if h[0] <= now]:
                item[1].close()
                held.remove(item)
            time.sleep(0.002)
        for _, s in held:
            s.close()
    finally:
        try:
            os.write(wfd, b"%d\n" % n)
        finally:
            os._exit(0)


class Hostile:
    def __init__(self, pid, kinds, uids, stopfile):
        self.children = []
        self.stopfile = stopfile
        if os.path.exists(stopfile):
            os.unlink(stopfile)
        if not kinds:
            return
        name = control_name(pid)
        for uid in uids:
            r, w = os.pipe()
            child = os.fork()
            if child == 0:
                os.close(r)
                hostile_child(name, uid, kinds, stopfile, w)
            os.close(w)
            self.children.append((child, r))

    def stop(self):
        open(self.stopfile, "w").close()
        total = 0
        for child, r in self.children:
            os.waitpid(child, 0)
            data = os.read(r, 64)
            os.close(r)
            total += int(data or b"0")
        return total


# ---- one soak ------------------------------------------------------------------------

class Soak:
    def __init__(self, name, prog, port, ok_set, rounds, update):
        self.name, self.prog, self.rounds, self.update = name, prog, rounds, update
        self.checkers = [Checker(i, port, ok_set) for i in range(ARGS.clients)]
        self.failures = []
        self.done = 0

    def run(self, ops_per_round, counter):
        """counter(status JSON) -> updates the process counts: it must
        grow by exactly the updates done."""
        pid = self.prog.pid
        count0 = counter(status(pid))
        # warm-up: the first rounds allocate what stays (caches, rings)
        warm = max(5, self.rounds // 10)
        hostile = Hostile(pid, ARGS.hostile, ARGS.hostile_uids,
                          os.path.join(WORK, "hostile-stop"))
        for c in self.checkers:
            c.start()
        t0 = time.monotonic()
        start = None
        try:
            for i in range(self.rounds):
                if i == warm:
                    start = figures(pid)
                err = self.update(i)
                if err:
                    self.failures.append("round %d: %s" % (i, err))
                    if len(self.failures) >= 3:
                        break
                self.done += 1
        finally:
            took = time.monotonic() - t0
            for c in self.checkers:
                c.stop.set()
            for c in self.checkers:
                c.join(30)
            hostile_n = hostile.stop()
        time.sleep(0.3)   # let the last reclamation pass run
        end = figures(pid)
        checked = sum(c.checked for c in self.checkers)
        wrong = sum(c.wrong for c in self.checkers)
        lost = sum(c.lost for c in self.checkers)
        for c in self.checkers:
            self.failures += c.errors
        if not self.prog.alive():
            self.failures.append("the process died: " + self.prog.stderr())
        log("%s: %d rounds (%d updates) in %.1f s; replies checked %d, wrong %d, lost %d; "
            "hostile connections %d" % (self.name, self.done, self.done * ops_per_round, took,
                                        checked, wrong, lost, hostile_n))
        start = start or end
        log("%s: fds %d -> %d, maps %d -> %d, RSS %d -> %d KiB (from round %d to the end)" % (
            self.name, start["fds"], end["fds"], start["maps"], end["maps"], start["rss_kb"],
            end["rss_kb"], warm))
        if checked == 0:
            self.failures.append("no reply was checked")
        if self.prog.alive():
            counted = counter(status(pid)) - count0
            if counted != self.done * ops_per_round:
                self.failures.append("the process counts %d updates, the soak did %d" % (
                    counted, self.done * ops_per_round))
        if ARGS.bounds:
            bounds = [("fds", ARGS.max_fds),
                      ("maps" if ANON_MAPS_BOUNDED else "named_maps", ARGS.max_maps)]
            if RSS_BOUNDED:
                bounds.append(("rss_kb", ARGS.max_rss_kb))
            for k, bound in bounds:
                if end[k] - start[k] > bound:
                    self.failures.append("%s grew by %d (bound %d)%s" % (
                        k, end[k] - start[k], bound,
                        grown_mappings(start, end) if k.endswith("maps") else ""))
        return self.failures


def grown_mappings(start, end):
    """The mappings counted more often at the end than at the start, by name."""
    before = collections.Counter(start["names"])
    after = collections.Counter(end["names"])
    grown = ["%s +%d" % (n, after[n] - before[n]) for n in sorted(after) if after[n] > before[n]]
    return ": " + ", ".join(grown) if grown else ""


def molt_op(*args):
    r = molt(*args, merge=True, timeout=120)
    return None if r.rc == 0 else "molt %s: exit %d: %s" % (
        " ".join(str(a) for a in args[:2]), r.rc, r.out.strip()[-300:])


def soak_hot(work, built):
    exe, patch = built
    report = os.path.join(work, "forks")
    env = dict(os.environ, SOAK_FORK_MS=str(ARGS.fork_ms), SOAK_FORK_REPORT=report)
    with Program([exe, "--port", "0", "--threads", "4"], env=env, name="kvstore") as p:
        port = int(p.expect(r"listening on 127\.0\.0\.1:(\d+)").group(1))
        p.wait_control()

        def update(i):
            return molt_op("apply", p.pid, patch, "--timeout", 10) or \
                molt_op("rollback", p.pid, "--timeout", 10)

        s = Soak("hot", p, port, "OK", ARGS.hot, update)
        fails = s.run(2, lambda st: st["generation"])
        if ARGS.fork_ms > 0:
            try:
                with open(report) as f:
                    fk = dict(kv.split("=") for kv in f.read().split())
            except OSError:
                fk = {}
            log("hot: forking thread: %s" % (" ".join("%s=%s" % kv for kv in fk.items())
                                              or "no report"))
            if not fk or int(fk["forks"]) == 0:
                fails.append("the forking thread did not fork")
            elif int(fk["stuck"]) or int(fk["bad_exit"]):
                fails.append("forked children stuck or failed: %s" % fk)
        p.stop()
    return fails


def soak_full(work, im):
    runs = os.path.join(work, "kvfull-run")
    os.makedirs(runs, exist_ok=True)
    with Program([os.path.join(ARGS.molt_build, "bin", "molt"), "run", im["P0"], "--port", "0",
                  "--workers", "4"], name="kvfull") as p:
        port = int(p.expect(r"listening on 127\.0\.0\.1:(\d+)").group(1))
        p.wait_control()

        def update(i):
            # A copy of its own each time: the image two updates back may
            # not be unloaded yet (F7), and dlopen of the same file would
            # hand back that one, state and all.  The copy is deleted once
            # loaded (the mapping keeps it).
            img = os.path.join(runs, "kvfull-%d.so" % i)
            shutil.copyfile(im["Q" if i % 2 == 0 else "P"], img)
            try:
                return molt_op("update", p.pid, img, "--timeout", 10)
            finally:
                os.unlink(img)

        s = Soak("full", p, port, "STORED", ARGS.full, update)
        fails = s.run(1, lambda st: st["image"]["full_updates"])
        p.stop()
    return fails


WORK = os.path.abspath(ARGS.work or tempfile.mkdtemp(prefix="molt-soak-"))


def main():
    work = WORK
    os.makedirs(work, exist_ok=True)
    log("work directory %s; hostile: %s as uids %s; forking every %d ms" % (
        work, ",".join(ARGS.hostile) or "none", ARGS.hostile_uids, ARGS.fork_ms))
    fails = []
    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as ex:
        hot = ex.submit(build_hot, work) if ARGS.only in (None, "hot") else None
        full = ex.submit(build_full, work) if ARGS.only in (None, "full") else None
        hot, full = hot and hot.result(), full and full.result()
    log("built kvstore, its patch and three kvfull images in %.1f s" % (time.monotonic() - t0))
    if hot:
        fails += ["hot: " + f for f in soak_hot(work, hot)]
    if full:
        fails += ["full: " + f for f in soak_full(work, full)]
    for f in fails:
        log("FAILED " + f)
    log("passed" if not fails else "%d failures" % len(fails))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
