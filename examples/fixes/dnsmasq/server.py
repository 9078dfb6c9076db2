"""dnsmasq 2.90 (Debian 2.90-4~deb12u2) for examples/fixes.

One process (no-daemon), DNS on 127.0.0.1 in front of dnsfake.py (a fake
upstream), with add-subnet=24 and cache-rr=MX so that the code of the two
demonstrated fixes runs.  Built as the package builds it (its COPTS and
Debian's hardening flags) with CC=moltcc, every function updatable."""
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dnsq  # noqa: E402
from harness import DEB_CFLAGS, DEB_CPPFLAGS, DEB_LDFLAGS, Fix, Load  # noqa: E402

NAME = PACKAGE = "dnsmasq"
VERSION = "2.90-4~deb12u2"
FIRST_FIX = "CVE-2026-2291.patch"
HERE = os.path.dirname(os.path.abspath(__file__))
BASE = int(os.environ.get("MOLT_FIXES_PORT", "27300"))
PORT, UPSTREAM, THROWAWAY = BASE + 53, BASE + 54, BASE + 55
COPTS = "-DHAVE_DBUS -DHAVE_LIBIDN2 -DHAVE_NFTSET -DHAVE_CONNTRACK -DHAVE_DNSSEC"


def binary(h):
    return os.path.join(h.work, NAME, "tree", "src", "dnsmasq")


def build(h, tree):
    return h.run(["make", "-j%d" % os.cpu_count(), "CC=" + h.moltcc, "COPTS=" + COPTS,
                  "CFLAGS=--molt-updatable=all %s %s" % (DEB_CFLAGS, DEB_CPPFLAGS),
                  "LDFLAGS=" + DEB_LDFLAGS], "build-dnsmasq.log", cwd=tree)



def _conf(h, port, tag):
    d = os.path.join(h.work, NAME, "run")
    os.makedirs(d, exist_ok=True)
    conf = os.path.join(d, tag + ".conf")
    with open(conf, "w") as f:
        f.write("\n".join([
            "port=%d" % port, "listen-address=127.0.0.1", "bind-interfaces", "no-resolv",
            "no-hosts", "no-daemon", "user=root", "pid-file=",
            "log-facility=%s" % os.path.join(d, tag + ".log"),
            "server=127.0.0.1#%d" % UPSTREAM, "cache-size=1000",
            "add-subnet=24",        # sends ECS upstream: CVE-2026-4893's check runs
            "cache-rr=MX",          # caches MX: CVE-2026-5172's code runs
            ""]))
    return conf


def _helpers(h):
    if not getattr(h, "dnsfake", None) or h.dnsfake.poll() is not None:
        h.ensure_free(UPSTREAM)
        h.dnsfake = h.start([sys.executable, os.path.join(HERE, "dnsfake.py"), "--port",
                             str(UPSTREAM)], "dnsfake.log")
        time.sleep(0.3)


def start(h, tag="live", port=PORT, limit_as=None):
    _helpers(h)
    h.ensure_free(port)
    # dnsmasq closes every inherited descriptor at start (close_fds in
    # main), the runtime's included: the runtime makes them anew (docs/
    # design.md, "Descriptors the host may close"), so no shim is needed.
    env = dict(os.environ)
    pre = None
    if limit_as:
        def pre():
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))
    p = h.start([binary(h), "-C", _conf(h, port, tag)], "dnsmasq-%s.log" % tag, env=env, preexec=pre)
    h.wait_port(port, p, udp=True)
    return p, port


def load(h):
    return Load(h, NAME, [sys.executable, os.path.join(HERE, "dnsload.py"), "--port", str(PORT),
                          "--conns", "8"])


def rss_mb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return "%.1f MB" % (int(line.split()[1]) / 1024)
    except OSError:
        pass
    return "gone"


def demo_ecs(h, port, proc):
    return dnsq.query(port, "ecs-bad.test", "A", 1.5)


def demo_mx(h, port, proc):
    ans = dnsq.query(port, "lie.test", "MX", 2)
    return "%s, RSS %s" % (ans, rss_mb(proc.pid))


BY_HAND_2291 = "CVE-2026-2291-reworded.patch"


def fixes():
    return [
        Fix("CVE-2026-2291", "CVE-2026-2291.patch", kind="refuse", quick=True,
            refusal=r"union bigname.*size", carries="CVE-2026-2291-reworded"),
        Fix("CVE-2026-2291-reworded", BY_HAND_2291, kind="byhand",
            note="names that would overflow the old union bigname are not cached"),
        Fix("CVE-2026-4890", "CVE-2026-4890.patch", note="needs a DNSSEC chain: no demo"),
        Fix("CVE-2026-4891", "CVE-2026-4891.patch", needs=["CVE-2026-4890"],
            note="needs a DNSSEC chain: no demo"),
        Fix("CVE-2026-4892", "CVE-2026-4892.patch",
            note="the fixed loop runs in the DHCP script helper (not started here): no demo"),
        Fix("CVE-2026-4893", "CVE-2026-4893.patch", quick=True, demo=demo_ecs,
            expect_before=r"^A 10\.66\.66\.66$", expect_after=r"^no reply"),
        Fix("CVE-2026-5172", "CVE-2026-5172.patch", quick=True, demo=demo_mx,
            before_on_throwaway=True, expect_before=r"^no reply", expect_after=r"^SERVFAIL"),
    ]
