#!/usr/bin/env python3
"""examples/attach, after run.sh has built memcached plainly: Debian's
security fixes of memcached 1.6.18-1+deb12u1 built as attach patches
straight from their files in debian/patches, and applied with `molt
attach` to the running server under a checking load.

    memcached.py --work DIR --molt MOLT --moltcc MOLTCC [--cycles N] [--seconds S] [--port P]

DIR/memcached-1.6.18 is the source tree as the version before the security
update had it, built there with its own build system (gcc -O2 -g).  For
each patch of the update:

- built with `moltcc --molt-patch --molt-target ./memcached --molt-diff
  debian/patches/P -o P.so <the flags of memcached's own compiles>`, in
  the tree; a fix moltcc refuses must name why (expected reasons below),
  and nothing is attached then;
- a carried fix: memcached started with SASL (binary protocol, a password
  file that lists the user twice with two passwords); the load's clients
  authenticate with the first password and set/get their own keys,
  checking every reply; the probe authenticates with the second password:
  refused before (the old code stops at the user's first line), accepted
  once the fix is attached, refused again after rollback; N cycles of
  attach, probe, rollback, probe, then attached for good.

Prints a table and writes DIR/summary.json: per fix built or refused (with
the reason), the stop and total time of each attach, the load's requests,
failed replies, throughput and latency before/around/after.
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mcsasl  # noqa: E402

SRC = "memcached-1.6.18"
USER = "molt"
# The patches of the security update (debian/changelog 1.6.18-1+deb12u1),
# in series order, with what must happen to each.
FIXES = [
    ("0008-CVE-2026-47783-CVE-2026-47784.patch", "carried",
     "sasl_server_userdb_checkpass"),
    ("0009-CVE-2023-46852.patch", "refused",
     r"none of the files of .* is a source or header \./memcached was built from"),
    ("CVE-2023-46853.patch", "refused",
     r"none of the files of .* is a source or header \./memcached was built from"),
]


def compile_flags(work, log="make.log"):
    """The flags of memcached's own compile of memcached.c, read from the
    build's log (WORK/make.log), without its dependency options, -c, -o and
    the input: what moltcc is given."""
    line = None
    with open(os.path.join(work, log)) as f:
        for l in f:
            if " -c " in l and "-o memcached-memcached.o" in l:
                line = l
    if line is None:
        raise SystemExit("memcached.py: no compile of memcached.c in %s/make.log" % work)
    words = line.split("`")[0].split()      # automake's `test -f 'x.c' || echo './'`x.c
    out, skip = [], False
    for w in words[1:]:
        if skip:
            skip = False
            continue
        if w in ("-MT", "-MF", "-o"):
            skip = True
            continue
        if w in ("-MD", "-MP", "-c") or w.endswith(".c"):
            continue
        out.append(w)
    return out


# The same patches against a build with the proxy (--enable-proxy; run.sh
# --proxy): the proxy's code is in the binary now.
FIXES_PROXY = [
    ("0009-CVE-2023-46852.patch", "carried", "proxy_process_command"),
    ("CVE-2023-46853.patch", "refused",
     r"struct mcp_parser_s: field 'endlen' \(uint32_t\) added"),
]


def build_fixes(a, tree, flags, fixes, tag=""):
    """Builds every patch of fixes in tree; (carried [(name, so)], failures, records)."""
    carried, bad, recs = [], [], []
    for name, want, what in fixes:
        so = os.path.join(a.work, tag + name.replace(".patch", ".so"))
        if os.path.exists(so):
            os.unlink(so)
        t0 = time.time()
        r = run([a.moltcc, "--molt-patch", "--molt-target", "./memcached", "--molt-diff",
                 os.path.join("debian", "patches", name), "-o", so] + flags, cwd=tree)
        secs = round(time.time() - t0, 2)
        err = r.stderr.strip()
        if want == "carried":
            ok = r.returncode == 0 and re.search(r"replaced \(1\): %s" % what, err)
            reason = err.splitlines()[1].strip() if ok else err
            if ok:
                carried.append((name, so))
        else:
            ok = r.returncode != 0 and re.search(what, err) and not os.path.exists(so)
            reason = next((l for l in err.splitlines() if re.search(what, l)),
                          err.splitlines()[0] if err else "")
        print("  %-40s %-8s %5.1f s  %s" % (name, "built" if r.returncode == 0 else "refused",
                                            secs, reason[:150]))
        recs.append({"patch": name, "build": tag.rstrip("-") or "plain", "expected": want,
                     "rc": r.returncode, "seconds": secs, "message": err})
        if not ok:
            bad.append("%s: expected %s, got rc %d: %s" % (name, want, r.returncode, err))
    return carried, bad, recs


def proxy_part(a, summary):
    """The proxy build: its patches built; the carried one attached to the
    running proxy build (serving as a cache, the load checking) and rolled
    back.  The failures."""
    tree = os.path.join(a.work, SRC + "-proxy")
    flags = compile_flags(a.work, "make-proxy.log")
    print("== the same patches against the build with the proxy (flags: %s)" % " ".join(flags))
    carried, bad, recs = build_fixes(a, tree, flags, FIXES_PROXY, "proxy-")
    summary["fixes"] += recs
    if bad:
        return bad
    port = free_port(a.port + 50)
    mc = Memcached(a.work, tree, port, a.threads)
    load = mcsasl.Load(port, USER, "first", a.clients)
    out = {}
    try:
        load.start()
        time.sleep(1)
        for name, so in carried:
            r = run([a.molt, "attach", mc.pid, so])
            out["attach"] = r.stdout.strip() or r.stderr.strip()
            if r.returncode:
                bad.append("molt attach %s (proxy build): %s" % (name, r.stderr.strip()))
                continue
            time.sleep(1)
            rb = run([a.molt, "rollback", mc.pid])
            out["rollback"] = rb.stdout.strip() or rb.stderr.strip()
            if rb.returncode:
                bad.append("molt rollback (proxy build): %s" % rb.stderr.strip())
        time.sleep(1)
        res = load.finish()
    finally:
        if not load.stop:
            load.finish()
        mc.close()
    out["load"] = {k: v for k, v in res.items() if k != "windows"}
    summary["proxy"] = out
    print("   %s" % out.get("attach", ""))
    print("   %s" % out.get("rollback", ""))
    print("   load: %d requests, %d failed" % (res["requests"], res["failed"]))
    if res["failed"]:
        bad += res["errors"]
    return bad


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def free_port(first):
    for p in range(first, first + 200):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            return p
        except OSError:
            continue
        finally:
            s.close()
    raise SystemExit("memcached.py: no free port from %d" % first)


class Memcached:
    def __init__(self, work, tree, port, threads):
        run_dir = os.path.join(work, "run")
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "memcached.conf"), "w") as f:
            f.write("mech_list: plain\n")
        # the realm memcached appends to the user name is its host name
        host = socket.gethostname()
        self.pwdb = os.path.join(run_dir, "pwdb")
        with open(self.pwdb, "w") as f:
            f.write("%s@%s:first\n%s@%s:second\n" % (USER, host, USER, host))
        env = dict(os.environ, SASL_CONF_PATH=run_dir, MEMCACHED_SASL_PWDB=self.pwdb)
        self.err = open(os.path.join(run_dir, "memcached.err"), "w")
        self.exe = os.path.join(tree, "memcached")
        self.p = subprocess.Popen([self.exe, "-S", "-B", "binary", "-l", "127.0.0.1", "-p",
                                   str(port), "-U", "0", "-t", str(threads), "-u", "nobody"],
                                  env=env, stdout=self.err, stderr=self.err)
        self.pid, self.port = self.p.pid, port
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("memcached.py: memcached did not start (see %s)" % self.err.name)

    def threads(self):
        return len(os.listdir("/proc/%d/task" % self.pid))

    def probe(self):
        """Whether the second password of the user is accepted."""
        return mcsasl.auth_once(self.port, USER, "second")

    def close(self):
        self.p.kill()
        self.p.wait()
        self.err.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--molt", required=True)
    ap.add_argument("--moltcc", required=True)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=2.0, help="load before and after")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--port", type=int, default=27600)
    ap.add_argument("--proxy", action="store_true",
                    help="also the build with the proxy (%s-proxy, run.sh --proxy)" % SRC)
    a = ap.parse_args()
    tree = os.path.join(a.work, SRC)
    flags = compile_flags(a.work)
    summary = {"flags": flags, "fixes": [], "cycles": []}
    print("== patches built from debian/patches (flags: %s)" % " ".join(flags))
    carried, bad, recs = build_fixes(a, tree, flags, FIXES)
    summary["fixes"] += recs
    if bad:
        print("\n".join("FAIL " + b for b in bad))
        return 1

    port = free_port(a.port)
    mc = Memcached(a.work, tree, port, a.threads)
    print("== memcached (pid %d, %d threads, SASL, binary protocol) on 127.0.0.1:%d; load: %d "
          "clients" % (mc.pid, mc.threads(), port, a.clients))
    load = mcsasl.Load(port, USER, "first", a.clients)
    try:
        if mc.probe():
            bad.append("before the fix, the second password was accepted")
        load.start()
        time.sleep(a.seconds)
        marks = []
        for name, so in carried:
            for k in range(a.cycles + 1):
                t0 = time.time()
                marks.append(t0 - load.t0)
                r = run([a.molt, "attach", mc.pid, so])
                total = (time.time() - t0) * 1e3
                if r.returncode != 0:
                    bad.append("molt attach %s: %s" % (name, r.stderr.strip()))
                    break
                m = re.search(r"(\d+) threads stopped for ([\d.]+) ms \((\d+) attempt", r.stdout)
                live = mc.probe()
                cyc = {"patch": name, "cycle": k, "stop_ms": float(m.group(2)),
                       "threads": int(m.group(1)), "attempts": int(m.group(3)),
                       "attach_total_ms": round(total, 1), "fixed_live": live}
                if not live:
                    bad.append("cycle %d: the fix is attached but the second password is "
                               "refused" % k)
                if k < a.cycles:
                    t0 = time.time()
                    rb = run([a.molt, "rollback", mc.pid])
                    cyc["rollback_total_ms"] = round((time.time() - t0) * 1e3, 1)
                    if rb.returncode != 0:
                        bad.append("molt rollback: %s" % rb.stderr.strip())
                        break
                    cyc["restored"] = not mc.probe()
                    if not cyc["restored"]:
                        bad.append("cycle %d: rolled back, but the second password is still "
                                   "accepted" % k)
                summary["cycles"].append(cyc)
                if load.errors or bad:
                    break
        time.sleep(a.seconds)
        out = load.finish()
        out["attach_marks_s"] = [round(x, 3) for x in marks]
        summary["load"] = out
        st = run([a.molt, "status", mc.pid]).stdout
        summary["status"] = st
        summary["threads"] = mc.threads()
    finally:
        if not load.stop:
            load.finish()
        mc.close()
    if a.proxy and not bad:
        bad += proxy_part(a, summary)
    cyc = summary["cycles"]
    stops = sorted(c["stop_ms"] for c in cyc)
    totals = sorted(c["attach_total_ms"] for c in cyc)
    out = summary["load"]
    if stops:
        print("== %d attaches (%d attach + rollback cycles, then attached): stop p50 %.3f ms, max "
              "%.3f ms (%d threads); molt attach total p50 %.1f ms, max %.1f ms"
              % (len(cyc), a.cycles, stops[len(stops) // 2], stops[-1], cyc[0]["threads"],
                 totals[len(totals) // 2], totals[-1]))
        print("   the fix live after every attach: %s; undone after every rollback: %s"
              % (all(c["fixed_live"] for c in cyc),
                 all(c.get("restored", True) for c in cyc)))
    print("== load: %d requests in %.1f s (%d/s), %d failed; latency p50 %s ms, p99 %s ms, max "
          "%s ms" % (out["requests"], out["seconds"], out["per_second"], out["failed"],
                     out["latency_ms"]["p50"], out["latency_ms"]["p99"],
                     out["latency_ms"]["max"]))
    if out["failed"]:
        bad += out["errors"]
    summary["ok"] = not bad
    with open(os.path.join(a.work, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    for b in bad:
        print("FAIL " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
