"""P7b: a real open-source server, memcached 1.6.18 (Debian bookworm's source
package, the server of examples/realworld), built plain and with
`moltcc --molt-updatable=all` (every function but `main` and the `inline`
ones updatable), loaded with a standard client: `memcslap` from Debian's
libmemcached-tools (PSU 5.3: MySQL with its heap storage engine updatable).

Four servers run at once: *plain* (gcc), *molt* (moltcc, no patch: every
updatable call is the entry's direct jump), *molt-patched* (the same molt
binary after `molt apply` of examples/realworld's live patch `stats-live`,
which replaces the 30 updatable functions of proto_text.c, the text-protocol
command layer: their calls take the dispatch path) and *plain-2* (a second
process of the plain binary: the A/A control).  memcslap loads one at a time
with the same settings, the order alternating every round (round r in order,
round r+1 reversed), so the plain and molt runs of a round are back to back;
the servers are restarted for every block of rounds, so that each variant
is measured in several processes.  The verdict is molt vs plain (no patch).

Prerequisites come from apt (as examples/realworld/run.sh does it): the
build dependencies of memcached, `apt-get source memcached` (reused from
examples/realworld's work directory, $MOLT_WORK, if it is there) and
libmemcached-tools.  Where they cannot be had (not root, no network) the
measure is skipped with the reason, not failed.
"""
import glob
import hashlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import time

import benchlib as bl
from m_kvstore import server_cpu_ns

REALWORLD = os.path.join(bl.ROOT, "examples", "realworld")
PATCH_DIFF = os.path.join(REALWORLD, "patches", "stats-live.diff")
CONF_OPTS = ["--enable-sasl", "--enable-tls"]          # as debian/rules
BUILD_PKGS = ["libevent-dev", "libsasl2-dev", "libssl-dev", "pkg-config", "dpkg-dev", "patch",
              "make", "binutils"]
CLIENT_PKG = "libmemcached-tools"
VARIANTS = ("plain", "molt", "molt-patched", "plain-2")
# The server on one half of the CPUs, memcslap on the other (2 CPUs: one
# each), so the server is saturated ("full load") and its throughput is
# what its own CPU cost per request allows, not what the client leaves it.
_CPUS = sorted(os.sched_getaffinity(0))
PIN = len(_CPUS) >= 2
SERVER_CPUS, CLIENT_CPUS = set(_CPUS[:len(_CPUS) // 2]), set(_CPUS[len(_CPUS) // 2:])
HASHPOWER = 20      # 2^20 buckets: more than the keys a server gets in a block


class Skip(Exception):
    """A prerequisite cannot be had here: the measure is skipped, not failed."""


# ---- prerequisites -------------------------------------------------------------

def _missing(pkgs):
    if not shutil.which("dpkg"):
        raise Skip("not a Debian system (no dpkg): the measure builds Debian's memcached package")
    return [p for p in pkgs if subprocess.run(["dpkg", "-s", p], stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL).returncode != 0]


def _apt(ctx, args, what):
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Skip("%s is needed and cannot be installed here (needs root and apt-get): "
                   "apt-get %s" % (what, " ".join(args)))
    log = os.path.join(ctx.wdir("memcached"), "apt.log")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with open(log, "a") as f:
        r = subprocess.run(["apt-get"] + args, stdout=f, stderr=subprocess.STDOUT, env=env)
    if r.returncode != 0:
        raise Skip("apt-get %s failed (no network or no Debian archive? see %s)"
                   % (" ".join(args), log))


_updated = False


def _install(ctx, pkgs):
    global _updated
    miss = _missing(pkgs)
    if not miss:
        return
    bl.log("P7b: installing %s" % " ".join(miss))
    if not _updated:
        _apt(ctx, ["update", "-q"], "apt-get update")
        _updated = True
    _apt(ctx, ["install", "-y", "-q"] + miss, " ".join(miss))


def _source(ctx):
    """The memcached source tree (Debian's, patches applied): examples/
    realworld's copy if it is there, else apt-get source into the work dir."""
    for base in (os.path.join(os.environ.get("MOLT_WORK", "/tmp/molt-realworld"), "src"),
                 ctx.wdir("memcached", "src")):
        hits = sorted(glob.glob(os.path.join(base, "memcached-*", "memcached.c")))
        if hits:
            return os.path.dirname(hits[0])
    # deb-src lines come from a private apt configuration: the system's apt
    # sources are never changed (scripts/apt-private.sh).
    r = subprocess.run(["bash", os.path.join(bl.ROOT, "scripts", "apt-private.sh")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise Skip("no memcached source: %s" % r.stderr.strip()[-300:])
    apt_env = dict(os.environ, APT_CONFIG=r.stdout.strip())
    d = ctx.wdir("memcached", "src")
    bl.log("P7b: apt-get source memcached")
    r = subprocess.run(["apt-get", "source", "-q", "memcached"], cwd=d, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, env=apt_env)
    hits = sorted(glob.glob(os.path.join(d, "memcached-*", "memcached.c")))
    if r.returncode != 0 or not hits:
        raise Skip("apt-get source memcached failed: %s" % r.stdout[-300:])
    return os.path.dirname(hits[0])


def prerequisites(ctx):
    _install(ctx, BUILD_PKGS + [CLIENT_PKG])
    if not shutil.which("memcslap"):
        raise Skip("memcslap not found after installing %s" % CLIENT_PKG)
    src = _source(ctx)
    ver = subprocess.run(["dpkg-parsechangelog", "-S", "Version"], cwd=src, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.strip()
    return src, ver or os.path.basename(src)


# ---- builds --------------------------------------------------------------------

def _deps(ctx, molt):
    d = [os.path.join(os.path.dirname(__file__), "m_memcached.py")]
    if molt:
        d += [os.path.join(bl.INCLUDE, "molt.h"), ctx.moltcc]
        d += glob.glob(os.path.join(bl.ROOT, "tools", "moltcc", "**", "*.py"), recursive=True)
        d += glob.glob(os.path.join(bl.INCLUDE, "molt", "*.h"))
    return d


def build_server(ctx, src, name, cc, extra):
    """configure + make memcached (the server only) in a fresh copy of the
    tree; cached until the source, the compiler or molt's headers change."""
    d = os.path.join(ctx.wdir("memcached"), name)
    out = os.path.join(d, "memcached")
    cmd = ["./configure"] + CONF_OPTS + ["CC=" + cc, "CFLAGS=%s -g -O2" % extra, "#" + src]
    if bl.up_to_date(out, cmd, _deps(ctx, extra != "") + [os.path.join(src, "memcached.c")]):
        return out
    bl.log("P7b: building memcached (%s: CC=%s %s) ..." % (name, os.path.basename(cc), extra))
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(src, d, symlinks=True)
    bl.sh(cmd[:-1], cwd=d, capture=True)
    bl.sh(["make", "-j%d" % ctx.jobs, "memcached"], cwd=d, capture=True)
    with open(out + ".cmd", "w") as f:
        f.write(hashlib.sha1("\0".join(cmd).encode()).hexdigest())
    return out


def build_patch(ctx, src, molt_dir):
    """examples/realworld's live patch: proto_text.c + patches/stats-live.diff,
    built with `moltcc --molt-patch` and the flags of memcached's own objects
    (as examples/realworld/run.sh does)."""
    p = ctx.wdir("memcached", "patch")
    so = os.path.join(p, "stats-live.so")
    target = os.path.join(molt_dir, "memcached")
    if os.path.exists(so) and all(os.path.getmtime(x) <= os.path.getmtime(so)
                                  for x in (target, PATCH_DIFF)):
        return so
    shutil.copy2(os.path.join(src, "proto_text.c"), os.path.join(p, "proto_text.c"))
    bl.sh(["patch", "-s", "-p1", "-i", PATCH_DIFF], cwd=p, capture=True)
    flags = subprocess.run(
        ["make", "-s", "-f", "Makefile", "-f", "-", "print-flags"], cwd=molt_dir, text=True,
        input="print-flags:\n\t@echo $(DEFS) -I$(abs_srcdir) $(memcached_CPPFLAGS) $(CPPFLAGS) "
              "$(CFLAGS)\n", stdout=subprocess.PIPE, check=True).stdout.split()
    flags = [f for f in flags if f != "--molt-updatable=all"]
    if os.path.exists(so):
        os.unlink(so)
    bl.sh([ctx.moltcc, "--molt-patch", "--molt-target", target, "-o", so,
           os.path.join(p, "proto_text.c"), "--molt-patch-id", "stats-live",
           "--molt-description", "stats: live_patch and cmd_version"] + flags,
          cwd=p, capture=True)
    return so


# ---- servers and the client ----------------------------------------------------------

def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def mc_cmd(port, cmd):
    """One text-protocol command on a fresh connection; the reply up to END."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(cmd.encode() + b"\r\n")
        buf = b""
        while not buf.endswith((b"END\r\n", b"ERROR\r\n")) and not buf.startswith(b"VERSION"):
            d = s.recv(65536)
            if not d:
                break
            buf += d
            if buf.startswith(b"VERSION") and buf.endswith(b"\r\n"):
                break
    return buf.decode(errors="replace")


def mc_stats(port):
    return {m.group(1): m.group(2) for m in re.finditer(r"STAT (\S+) (\S+)", mc_cmd(port, "stats"))}


def start(binary, threads, mem_mb):
    """memcached on 127.0.0.1 with room for every key of the run (no
    evictions) and a hash table that never has to grow during it."""
    port = _free_port()
    argv = [binary, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-t", str(threads),
            "-m", str(mem_mb), "-o", "hashpower=%d" % HASHPOWER]
    if os.geteuid() == 0:
        argv[1:1] = ["-u", "root"]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         preexec_fn=(lambda: os.sched_setaffinity(0, SERVER_CPUS)) if PIN else None)
    for _ in range(200):
        try:
            if mc_cmd(port, "version").startswith("VERSION"):
                return p, port
        except OSError:
            pass
        if p.poll() is not None:
            break
        time.sleep(0.05)
    p.kill()
    raise RuntimeError("%s did not start (status %s)" % (binary, p.poll()))


def stop(p):
    if p.poll() is not None:
        return "server died during the run (status %s)" % p.returncode
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        return "server did not stop on SIGTERM"
    return None if rc == 0 else "server exited with status %d" % rc


TIME_RE = re.compile(r"Time to (set|get)\s+(\d+) keys(?: by\s+(\d+) threads)?:\s+([\d.]+) seconds")


def memcslap(port, conns, keys):
    """`memcslap -t get`: sets `keys` keys on one connection, then `conns`
    threads (one connection each) get all of them.  Returns
    {set_keys, set_s, get_keys, get_s, argv, out}."""
    argv = ["memcslap", "--servers=127.0.0.1:%d" % port, "--test=get",
            "--concurrency=%d" % conns, "--execute-number=%d" % keys]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       preexec_fn=(lambda: os.sched_setaffinity(0, CLIENT_CPUS)) if PIN else None)
    res = {"argv": argv, "out": r.stdout, "status": r.returncode}
    for m in TIME_RE.finditer(r.stdout):
        res[m.group(1) + "_keys"] = int(m.group(2))
        res[m.group(1) + "_s"] = float(m.group(4))
    # memcslap exits 0 even when the server fails; its errors name a key
    if r.returncode != 0 or "get_s" not in res or "set_s" not in res or "error" in r.stdout.lower():
        raise RuntimeError("memcslap failed (%d): %s" % (r.returncode, r.stdout[-500:]))
    return res


def user_sys_ticks(pid):
    """utime and stime of the whole process (all threads), in clock ticks."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def _count(st, k):
    return int(st.get(k, 0))


# ---- the measure ------------------------------------------------------------------------

def p7b(ctx):
    t0 = time.time()
    try:
        src, ver = prerequisites(ctx)
    except Skip as e:
        bl.log("P7b SKIPPED: %s" % e)
        data = {"measure": "P7b", "skipped": str(e)}
        bl.save("p7b", data)
        return data
    bins = {"plain": build_server(ctx, src, "plain", "gcc", ""),
            "molt": build_server(ctx, src, "molt", ctx.moltcc, "--molt-updatable=all")}
    patch_problem = None
    try:
        so = build_patch(ctx, src, os.path.dirname(bins["molt"]))
    except Exception as e:  # the unpatched comparison is the measure; the patch is extra
        so, patch_problem = None, "patch build failed: %s" % str(e)[-1000:]
        bl.log("P7b: %s" % patch_problem)
    build_s = time.time() - t0
    # Many short runs in blocks of fresh servers: one run's throughput moves
    # by +-15% on this machine, and two processes of the same binary differ
    # by up to ~5% (address layout, where the kernel put their memory), so
    # every variant gets one process per block, started in a rotating order,
    # and `plain-2` (a second plain process) measures that floor in the same
    # run.
    rounds = 10 if ctx.quick else 40
    blocks = 2 if ctx.quick else 8
    keys = 6000 if ctx.quick else 12000
    # 4 connections (one per worker thread); memcslap's values average
    # ~2.6 KB and every run adds `keys` new ones: 2 GB, so nothing is evicted
    conns, threads, mem_mb = 4, 4, 2048
    variants = [v for v in VARIANTS if v != "molt-patched" or so]
    problems, applies, statuses = [], [], []
    runs = {v: [] for v in variants}
    rnd = 0
    for blk in range(blocks):
        servers = {}
        try:
            k = blk % len(variants)
            for v in variants[k:] + variants[:k]:
                servers[v] = start(bins["molt" if v.startswith("molt") else "plain"], threads,
                                   mem_mb)
            if "molt-patched" in servers:
                pid = servers["molt-patched"][0].pid
                ta = time.time()
                r = subprocess.run([ctx.molt_cli, "apply", str(pid), so], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
                applies.append({"status": r.returncode, "out": r.stdout.strip(),
                                "ms": 1e3 * (time.time() - ta)})
                st = mc_cmd(servers["molt-patched"][1], "stats")
                if r.returncode != 0 or "STAT live_patch stats-live" not in st:
                    # a molt bug, reported as a problem; the unpatched comparison goes on
                    problems.append("molt apply of stats-live failed: %s" % r.stdout.strip())
                    stop(servers.pop("molt-patched")[0])
                    variants.remove("molt-patched")
                    runs.pop("molt-patched")
            # warm-up: one short load each (first connections, page faults)
            for v in variants:
                memcslap(servers[v][1], conns, max(1000, keys // 8))
            for _ in range(rounds // blocks):
                for v in (variants if rnd % 2 == 0 else variants[::-1]):
                    p, port = servers[v]
                    s0, c0, t0 = mc_stats(port), server_cpu_ns(p.pid), user_sys_ticks(p.pid)
                    res = memcslap(port, conns, keys)
                    c1, t1, s1 = server_cpu_ns(p.pid), user_sys_ticks(p.pid), mc_stats(port)
                    d = {k: _count(s1, k) - _count(s0, k)
                         for k in ("cmd_get", "get_hits", "get_misses", "cmd_set", "evictions")}
                    reqs = d["cmd_get"] + d["cmd_set"]
                    if d["cmd_get"] != res["get_keys"] or d["get_hits"] != res["get_keys"] \
                            or d["cmd_set"] != res["set_keys"]:
                        problems.append("%s round %d: the server counted %s for %d sets and %d "
                                        "gets" % (v, rnd + 1, d, res["set_keys"], res["get_keys"]))
                    runs[v].append({"block": blk, "get_rps": res["get_keys"] / res["get_s"],
                                    "set_rps": res["set_keys"] / res["set_s"],
                                    "get_s": res["get_s"], "set_s": res["set_s"],
                                    "requests": reqs, "cpu_ns": c1 - c0,
                                    "user_ticks": t1[0] - t0[0], "sys_ticks": t1[1] - t0[1],
                                    "cpu_ns_per_request": (c1 - c0) / max(1, reqs),
                                    "server_counts": d})
                rnd += 1
                bl.log("P7b round %d/%d (block %d): %s" % (rnd, rounds, blk + 1, ", ".join(
                    "%s %.0f get/s (%.0f ns CPU/req)" % (v, runs[v][-1]["get_rps"],
                                                         runs[v][-1]["cpu_ns_per_request"])
                    for v in variants)))
            if "molt-patched" in servers:
                st = mc_cmd(servers["molt-patched"][1], "stats")
                if "STAT live_patch stats-live" not in st:
                    problems.append("molt-patched: the patch was no longer live at the end of "
                                    "block %d" % (blk + 1))
                statuses.append(subprocess.run(
                    [ctx.molt_cli, "status", str(servers["molt-patched"][0].pid)],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout)
        finally:
            for v, (p, _) in servers.items():
                e = stop(p)
                if e:
                    problems.append("%s: %s" % (v, e))
    applied = None
    if applies:
        applied = {"ms": statistics.median(a["ms"] for a in applies),
                   "ms_all": [a["ms"] for a in applies], "out": applies[0]["out"],
                   "status_at_end": statuses[-1] if statuses else None}
    nm = subprocess.run(["nm", bins["molt"]], stdout=subprocess.PIPE, text=True).stdout
    updatable = sum(1 for l in nm.splitlines() if l.endswith("__molt_v0"))
    patched_fns = []
    if so:
        sy = subprocess.run(["readelf", "-sW", so], stdout=subprocess.PIPE, text=True).stdout
        patched_fns = sorted({l.split()[-1][:-len("__molt_p")] for l in sy.splitlines()
                              if l.split() and l.split()[-1].endswith("__molt_p")})

    def col(v, k):
        return [x[k] for x in runs[v]]

    data = {"measure": "P7b",
            "title": "memcached throughput, every function updatable, memcslap",
            "anchor": "PSU (thesis 5.3, fig. 5.7): MySQL at 95.02%", "target": ">= 98%",
            "config": {"project": "memcached %s (Debian source package, Debian's patches applied)"
                       % ver, "source": src, "configure": CONF_OPTS,
                       "plain": "CC=gcc CFLAGS='-g -O2'",
                       "molt": "CC=moltcc CFLAGS='--molt-updatable=all -g -O2'",
                       "updatable_functions": updatable, "patch": "stats-live",
                       "patch_functions": patched_fns, "patch_problem": patch_problem,
                       "apply": applied, "rounds": rounds, "blocks": blocks,
                       "server_threads": threads,
                       "server_mem_mb": mem_mb, "hashpower": HASHPOWER,
                       "pinned": {"server": sorted(SERVER_CPUS), "client": sorted(CLIENT_CPUS)}
                       if PIN else None,
                       "client": "memcslap (%s)" % CLIENT_PKG,
                       "client_argv": ["memcslap", "--servers=127.0.0.1:PORT", "--test=get",
                        "--concurrency=%d" % conns, "--execute-number=%d" % keys],
                       "conns": conns, "keys": keys, "build_seconds": build_s},
            "variants": variants,
            "get_rps": {v: bl.summary(col(v, "get_rps")) for v in variants},
            "set_rps": {v: bl.summary(col(v, "set_rps")) for v in variants},
            "server_cpu_ns_per_request": {v: bl.summary(col(v, "cpu_ns_per_request"))
                                          for v in variants},
            # the user-space share of the server's CPU (the rest is the kernel)
            "user_share": {v: sum(x["user_ticks"] for x in runs[v]) /
                           max(1, sum(x["user_ticks"] + x["sys_ticks"] for x in runs[v]))
                           for v in variants},
            "evictions": {v: sum(x["server_counts"]["evictions"] for x in runs[v])
                          for v in variants},
            "ratio": bl.ratio_summary(col("molt", "get_rps"), col("plain", "get_rps")),
            # A/A: a second process of the plain binary against the first
            "aa_ratio": bl.ratio_summary(col("plain-2", "get_rps"), col("plain", "get_rps")),
            "aa_cpu_efficiency": bl.ratio_summary(col("plain", "cpu_ns_per_request"),
                                                  col("plain-2", "cpu_ns_per_request")),
            "set_ratio": bl.ratio_summary(col("molt", "set_rps"), col("plain", "set_rps")),
            # plain/molt: the throughput a CPU-bound molt server keeps
            "cpu_efficiency": bl.ratio_summary(col("plain", "cpu_ns_per_request"),
                                               col("molt", "cpu_ns_per_request")),
            "runs": runs, "problems": problems}
    if "molt-patched" in variants:
        data["patched_ratio"] = bl.ratio_summary(col("molt-patched", "get_rps"),
                                                 col("plain", "get_rps"))
        data["patched_set_ratio"] = bl.ratio_summary(col("molt-patched", "set_rps"),
                                                     col("plain", "set_rps"))
        data["patched_cpu_efficiency"] = bl.ratio_summary(
            col("plain", "cpu_ns_per_request"), col("molt-patched", "cpu_ns_per_request"))
    bl.save("p7b", data)
    if problems:
        raise RuntimeError("; ".join(problems))
    return data
