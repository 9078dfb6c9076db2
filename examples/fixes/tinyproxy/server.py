"""tinyproxy 1.11.1 (Debian 1.11.1-2.1+deb12u1) for examples/fixes.

One process, a thread per connection: a forward proxy on 127.0.0.1 in front
of common/origin.py (a small HTTP server with the files the load checks).
Built with Debian's configure options and hardening flags, CC=moltcc, every
function updatable."""
import os
import re
import signal
import subprocess
import sys
import time

from harness import DEB_CFLAGS, DEB_CPPFLAGS, DEB_LDFLAGS, EXAMPLE, Fix, Load  # noqa: E402

NAME = PACKAGE = "tinyproxy"
VERSION = "1.11.1-2.1+deb12u1"
FIRST_FIX = "0001-prevent-junk-from-showing-up-in-error-page-in-invali.patch"
BASE = int(os.environ.get("MOLT_FIXES_PORT", "27300"))
PORT, ORIGIN, THROWAWAY = BASE + 88, BASE + 80, BASE + 89
COMMON = os.path.join(EXAMPLE, "common")


def binary(h):
    return os.path.join(h.work, NAME, "tree", "src", "tinyproxy")


def build(h, tree):
    cfg = ["./configure", "--enable-filter", "--enable-reverse", "--enable-upstream",
           "--enable-xtinyproxy", "CC=" + h.moltcc,
           "CFLAGS=--molt-updatable=all " + DEB_CFLAGS, "CPPFLAGS=" + DEB_CPPFLAGS,
           "LDFLAGS=" + DEB_LDFLAGS]
    rc1, w1, c1 = h.run(cfg, "build-tinyproxy-configure.log", cwd=tree)
    # tinyproxy compiles with --std=c89 -ansi: moltcc builds such a program
    # as it is (molt.h is C89 clean; the weaver writes C89 declarations).
    rc2, w2, c2 = h.run(["make", "-j%d" % os.cpu_count()], "build-tinyproxy.log", cwd=tree)
    return 0, w1 + w2, c1 + c2



def _files(h):
    d = os.path.join(h.work, NAME, "files")
    if not os.path.exists(os.path.join(d, "f63.txt")):
        subprocess.check_call([sys.executable, os.path.join(COMMON, "httpload.py"), "--write-files", d])
    return d


def _conf(h, port, tag):
    d = os.path.join(h.work, NAME, "run")
    os.makedirs(d, exist_ok=True)
    err = os.path.join(d, "400.html")
    with open(err, "w") as f:
        # CVE-2022-40468: the 400 page shows {url}; before the fix a request
        # line without spaces leaves it uninitialised (heap junk shows).
        f.write("<html><body>bad request url=[{url}]</body></html>\n")
    conf = os.path.join(d, tag + ".conf")
    with open(conf, "w") as f:
        f.write("\n".join([
            "User root", "Group root", "Port %d" % port, "Listen 127.0.0.1", "Timeout 60",
            "MaxClients 200", "LogLevel Warning", 'LogFile "%s"' % os.path.join(d, tag + ".log"),
            "Allow 127.0.0.1", 'ErrorFile 400 "%s"' % err, ""]))
    return conf


def start(h, tag="live", port=PORT, limit_as=None):
    if not getattr(h, "origin", None) or h.origin.poll() is not None:
        h.ensure_free(ORIGIN)
        h.origin = h.start([sys.executable, os.path.join(COMMON, "origin.py"), "--port", str(ORIGIN),
                            "--dir", _files(h)], "origin.log")
        h.wait_port(ORIGIN, h.origin)
    h.ensure_free(port)
    p = h.start([binary(h), "-d", "-c", _conf(h, port, tag)], "tinyproxy-%s.log" % tag)
    h.wait_port(port, p)
    return p, port


def load(h):
    return Load(h, NAME, [sys.executable, os.path.join(COMMON, "httpload.py"), "--port", str(PORT),
                          "--proxy", "--origin-port", str(ORIGIN), "--conns", "8"])


def _raw(port, req, timeout=3):
    out = subprocess.run([sys.executable, os.path.join(COMMON, "rawreq.py"), "127.0.0.1", str(port),
                          req, str(timeout)], capture_output=True, text=True, errors="replace")
    return out.stdout


def demo_double_free(h, port, proc):
    """CVE-2023-49606: a `Connection: Connection` header."""
    rep = _raw(port, "GET http://127.0.0.1:%d/f1.txt HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n"
               "Connection: Connection\\r\\n\\r\\n" % ORIGIN)
    time.sleep(0.5)
    first = rep.split("\n")[0].strip() if rep.strip() and not rep.startswith("[") else rep.strip()
    state = "server alive" if proc.poll() is None else "server died (%s)" % (
        "SIGABRT" if proc.returncode == -signal.SIGABRT else proc.returncode)
    return "%s, %s" % (first[:40], state)


def demo_junk(h, port, proc, n=10):
    """CVE-2022-40468: n times a long request, then a request line without
    spaces; how many 400 pages show something in {url}."""
    junk = 0
    for _ in range(n):
        _raw(port, "GET http://127.0.0.1:%d/%s HTTP/1.0\\r\\n\\r\\n" % (ORIGIN, "A" * 200), 2)
        rep = _raw(port, "X" * 130 + "\\r\\n\\r\\n", 2)
        m = re.search(r"url=\[([^\]]*)\]", rep)
        if not m or m.group(1):
            junk += 1
    return "%d/%d error pages with junk in {url}" % (junk, n)


def fixes():
    return [
        Fix("CVE-2022-40468", FIRST_FIX, demo=demo_junk,
            expect_before=r"^\d+/10", expect_after=r"^0/10",
            note="before is probabilistic (heap contents)"),
        Fix("CVE-2023-49606", "0002-CVE-2023-49606.patch", needs=["CVE-2022-40468"],
            demo=demo_double_free, before_on_throwaway=True,
            expect_before=r"server died", expect_after=r"^HTTP/1\.[01] 200 .*server alive"),
    ]
