"""The harness of examples/fixes (stdlib only): commands with their wall and
CPU time, the Debian source packages, hot patches built from patch files,
servers and their checking loads, and the per-fix results.

A server part (examples/fixes/<server>/server.py) describes one server:
its package, how it is built and started, its checking load and its fixes
(Fix below).  fixes.py runs them."""
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.dirname(HERE)

# Debian bookworm's dpkg-buildflags (hardening as the packages build), without
# -ffile-prefix-map: the patch build finds the sources by their recorded paths.
DEB_CFLAGS = "-g -O2 -fstack-protector-strong -Wformat -Werror=format-security"
DEB_CPPFLAGS = "-Wdate-time -D_FORTIFY_SOURCE=2"
DEB_LDFLAGS = "-Wl,-z,relro -Wl,-z,now"


# Known moltcc problems that keep a fix from building: (regex on moltcc's
# output, the reason recorded).  Such a fix is "blocked", not failed and not
# passed.
KNOWN_PROBLEMS = [
    # (none now: the sizeof of a static array in a patch, the last one, is
    # fixed -- the weaver keeps the array's complete type)
]


def blocked_by(text):
    for rx, why in KNOWN_PROBLEMS:
        if re.search(rx, text):
            return why
    return None


def arguments():
    """The arguments every driver takes from run.sh (the work directory,
    the repository and the two tools); the driver adds its own."""
    import argparse
    ap = argparse.ArgumentParser()
    for name in ("--work", "--repo", "--moltcc", "--molt"):
        ap.add_argument(name, required=True)
    return ap


class Failure(Exception):
    """Something the run needs did not work (a build, a start): the run stops."""


class Fix:
    """One fix of a server.

    kind    'carry': a patch file of the package, built unchanged into a hot
            patch and applied live; 'refuse': moltcc must refuse it, and
            `refusal` is a regex its message must match; 'byhand': our own
            rewording of a refused fix (a diff in the server's folder).
    patch   the file name in debian/patches (or, for 'byhand', in the
            server's folder)
    needs   earlier fixes whose diffs go first (--molt-diff in series order):
            the fix's context needs them
    demo    a function (harness, server) -> short text, run before and after
            the apply; expect_before/expect_after: regexes it must match
    """

    def __init__(self, name, patch, kind="carry", needs=(), demo=None, expect_before=None,
                 expect_after=None, before_on_throwaway=False, refusal=None, carries=None,
                 quick=False, note=""):
        self.name, self.patch, self.kind, self.needs = name, patch, kind, list(needs)
        self.demo, self.expect_before, self.expect_after = demo, expect_before, expect_after
        self.before_on_throwaway = before_on_throwaway
        self.refusal, self.carries, self.quick, self.note = refusal, carries, quick, note
        self.result = {"server": None, "fix": name, "patch": patch, "kind": kind, "status": None,
                       "reason": "", "replaced": [], "build_wall_s": None, "build_cpu_s": None,
                       "apply_ms": None, "load_replies": None, "load_failed": None,
                       "demo_before": None, "demo_after": None, "demo_ok": None}


class Harness:
    def __init__(self, work, repo, moltcc, molt, quick=False, duration=None):
        self.work, self.repo, self.moltcc, self.molt = work, repo, moltcc, molt
        self.quick, self.duration = quick, duration
        self.logdir = os.path.join(work, "logs")
        os.makedirs(self.logdir, exist_ok=True)
        self.started = []

    # -- commands ---------------------------------------------------------
    def run(self, cmd, log, cwd=None, env=None, check=True, shell=False):
        """Runs cmd with output to logs/<log>; returns (rc, wall s, CPU s of
        the command and its children)."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        with open(os.path.join(self.logdir, log), "w") as out:
            rc = subprocess.call(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 shell=shell)
        wall = time.time() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if rc != 0 and check:
            raise Failure("%s failed (exit %d), see %s" % (
                cmd if isinstance(cmd, str) else " ".join(cmd[:3]) + " ...", rc,
                os.path.join(self.logdir, log)))
        return rc, wall, cpu

    def logtext(self, log):
        with open(os.path.join(self.logdir, log), errors="replace") as f:
            return f.read()

    # -- the Debian source package ------------------------------------------
    def source_tree(self, srv):
        """srv.PACKAGE=srv.VERSION fetched with `apt-get source` through the
        private apt configuration (scripts/apt-private.sh: deb-src lines, the
        system's apt sources untouched), unpacked without its patches, and
        the package's patches applied in series order up to srv.FIRST_FIX:
        the sources as they were before the security fixes.  The running
        server is built from this tree (in it); the fixes apply to it.
        Returns the tree."""
        d = os.path.join(self.work, "src", srv.PACKAGE)
        ver = srv.VERSION.split(":")[-1]
        dsc = os.path.join(d, "%s_%s.dsc" % (srv.PACKAGE, ver))
        if not os.path.exists(dsc):
            os.makedirs(d, exist_ok=True)
            conf = subprocess.check_output(
                ["bash", os.path.join(self.repo, "scripts", "apt-private.sh")], text=True).strip()
            self.run(["apt-get", "source", "--download-only", "-q",
                      "%s=%s" % (srv.PACKAGE, srv.VERSION)], "fetch-%s.log" % srv.NAME, cwd=d,
                     env=dict(os.environ, APT_CONFIG=conf))
        tree = os.path.join(self.work, srv.NAME, "tree")
        shutil.rmtree(tree, ignore_errors=True)
        os.makedirs(os.path.dirname(tree), exist_ok=True)
        self.run(["dpkg-source", "-x", "--skip-patches", dsc, tree], "unpack-%s.log" % srv.NAME)
        with open(os.path.join(tree, "debian", "patches", "series")) as f:
            series = [l.split("#")[0].split() for l in f]
        for p in [s[0] for s in series if s]:
            if p == srv.FIRST_FIX:
                return tree
            self.run(["patch", "-s", "-p1", "-d", tree, "-i",
                      os.path.join(tree, "debian", "patches", p)], "unpack-%s.log" % srv.NAME)
        raise Failure("%s is not in the series of %s" % (srv.FIRST_FIX, dsc))

    def patch_file(self, srv, fix):
        if fix.kind == "byhand":
            return os.path.join(EXAMPLE, srv.NAME, fix.patch)
        return os.path.join(self.work, srv.NAME, "tree", "debian", "patches", fix.patch)

    # -- hot patches ----------------------------------------------------------
    def build_patch(self, srv, fix, fixes_by_name):
        """moltcc --molt-patch straight from the patch file (with the diffs
        of fix.needs before it), run from the work directory (not the
        source tree): the compile record in the binary says how.  Fills
        fix.result; returns the .so path or None."""
        r = fix.result
        out = os.path.join(self.work, srv.NAME, "patches")
        os.makedirs(out, exist_ok=True)
        so = os.path.join(out, fix.name + ".so")
        rep = os.path.join(out, fix.name + ".json")
        for f in (so, rep):
            if os.path.exists(f):
                os.unlink(f)
        cmd = [self.moltcc, "--molt-patch", "--molt-target", srv.binary(self)]
        for n in fix.needs + [fix.name]:
            cmd += ["--molt-diff", self.patch_file(srv, fixes_by_name[n])]
        cmd += ["-o", so, "--molt-report", rep, "--molt-patch-id", fix.name,
                "--molt-description", "%s %s" % (srv.PACKAGE, fix.patch)]
        log = "patch-%s-%s.log" % (srv.NAME, fix.name)
        rc, wall, cpu = self.run(cmd, log, cwd=self.work, check=False)
        r["build_wall_s"], r["build_cpu_s"] = round(wall, 2), round(cpu, 2)
        r["diffs"] = fix.needs + [fix.name]
        text = self.logtext(log)
        report = {}
        if os.path.exists(rep):
            with open(rep) as f:
                report = json.load(f)
        r["replaced"] = [x["name"] if isinstance(x, dict) else x for x in report.get("replaced", [])]
        errors = [l for l in text.splitlines() if l.startswith("moltcc: error:")]
        if fix.kind == "refuse":
            if rc != 0 and fix.refusal and re.search(fix.refusal, text) and not os.path.exists(so):
                r["status"] = "refused"
                r["reason"] = "; ".join(e[len("moltcc: error: "):] for e in errors[1:] or errors)
                return None
            r["status"] = "FAILED"
            r["reason"] = ("built, but must be refused" if rc == 0 else
                           "refused for another reason: " + " ".join(errors)[:400])
            return None
        if rc != 0:
            blocked = blocked_by(text)
            r["status"] = "blocked" if blocked else "FAILED"
            if blocked:
                cc = [l.strip() for l in text.splitlines() if ": error: " in l and
                      not l.startswith("moltcc:")]
                r["reason"] = "blocked: %s (%s)" % (blocked, cc[0] if cc else " ".join(errors)[:200])
            else:
                r["reason"] = " ".join(errors)[:500]
            return None
        r["status"] = "built"
        return so

    def apply(self, pid, so):
        t0 = time.time()
        p = subprocess.run([self.molt, "apply", str(pid), so], capture_output=True, text=True)
        return p.returncode, round(1000 * (time.time() - t0), 1), (p.stdout + p.stderr).strip()

    # -- processes --------------------------------------------------------
    def start(self, cmd, log, env=None, cwd=None, preexec=None):
        out = open(os.path.join(self.logdir, log), "w")
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                             preexec_fn=preexec)
        self.started.append(p)
        return p

    def stop(self, p, sig=signal.SIGTERM, timeout=10):
        """Stops p (one the harness started); returns its exit status."""
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return p.returncode

    def cleanup(self):
        for p in self.started:
            if p.poll() is None:
                p.kill()
                p.wait()

    @staticmethod
    def ensure_free(*ports):
        """Refuses to start on a port something else uses (another run)."""
        for port in ports:
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                s = socket.socket(socket.AF_INET, kind)
                if kind == socket.SOCK_STREAM:   # as servers do: TIME-WAIT is no user
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    raise Failure("port %d on 127.0.0.1 is in use (another run? set "
                                  "MOLT_FIXES_PORT to another base)" % port)
                finally:
                    s.close()

    @staticmethod
    def wait_port(port, proc, udp=False, timeout=20):
        end = time.time() + timeout
        while time.time() < end:
            if proc.poll() is not None:
                raise Failure("the server exited with %s before it listened" % proc.returncode)
            if udp:
                time.sleep(0.5)
                if proc.poll() is not None:
                    raise Failure("the server exited with %s at start" % proc.returncode)
                return
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise Failure("nothing listens on port %d after %d s" % (port, timeout))


class Load:
    """A checking load generator (common/httpload.py, dnsmasq/dnsload.py)
    that rewrites a status file with its counts: the replies and failures of
    a window are the difference of two reads."""

    def __init__(self, h, name, cmd):
        self.h = h
        self.status = os.path.join(h.work, name + "-load.status")
        self.stopfile = os.path.join(h.work, name + "-load.stop")
        for f in (self.status, self.stopfile):
            if os.path.exists(f):
                os.unlink(f)
        self.proc = h.start(cmd + ["--status", self.status, "--stop-file", self.stopfile,
                                   "--duration", "3600"], name + "-load.log")
        end = time.time() + 10
        while self.counts()[0] == 0 and time.time() < end:
            time.sleep(0.1)

    def counts(self):
        try:
            with open(self.status) as f:
                d = json.load(f)
            return d["requests"], d["failed"]
        except (OSError, ValueError):
            return 0, 0

    def finish(self):
        open(self.stopfile, "w").close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        with open(self.status) as f:
            return json.load(f)


def table(rows):
    """The summary as a plain text table."""
    head = ["server", "fix", "kind", "status", "replaced", "build s (CPU)", "apply ms",
            "replies/failed", "demo before -> after"]
    lines = []
    for r in rows:
        demo = ""
        if r["demo_before"] is not None or r["demo_after"] is not None:
            demo = "%s -> %s" % (r["demo_before"] or "-", r["demo_after"] or "-")
            if r["demo_ok"] is False:
                demo += " (NOT as expected)"
        lines.append([r["server"], r["fix"], r["kind"], r["status"],
                      str(len(r["replaced"])) if r["status"] in ("built", "applied") else "-",
                      "%.1f (%.1f)" % (r["build_wall_s"], r["build_cpu_s"]) if r["build_wall_s"] else "-",
                      str(r["apply_ms"]) if r["apply_ms"] is not None else "-",
                      "%s/%s" % (r["load_replies"], r["load_failed"]) if r["load_replies"] is not None else "-",
                      demo])
    w = [max(len(x[i]) for x in lines + [head]) for i in range(len(head) - 1)]
    out = ["  ".join(h.ljust(w[i]) for i, h in enumerate(head[:-1])) + "  " + head[-1]]
    for x in lines:
        out.append("  ".join(x[i].ljust(w[i]) for i in range(len(w))) + "  " + x[-1])
    for r in rows:
        if r["reason"]:
            out.append("  %s %s: %s" % (r["server"], r["fix"], r["reason"][:300]))
    return "\n".join(out)
