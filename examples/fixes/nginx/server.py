"""nginx 1.22.1 (Debian 1.22.1-9+deb12u9) for examples/fixes.

One process (master_process off): static files and a WebDAV location with
`alias` over HTTP, and two TLS 1.3 virtual servers (a.test, b.test) that
require client certificates of different CAs.  Configured with the http
modules of Debian's package that the fixes here need (ssl, v2, dav,
realip, stub_status, threads; no mail/stream/perl), Debian's hardening
flags, CC=moltcc, every function updatable.  The build takes long (about 450
s of CPU): run.sh reuses it."""
import os
import subprocess
import sys
import time

from harness import DEB_CFLAGS, DEB_CPPFLAGS, DEB_LDFLAGS, EXAMPLE, Fix, Load  # noqa: E402

NAME = PACKAGE = "nginx"
VERSION = "1.22.1-9+deb12u9"
FIRST_FIX = "CVE-2025-23419.patch"
BASE = int(os.environ.get("MOLT_FIXES_PORT", "27300"))
PORT, TLS, THROWAWAY = BASE + 81, BASE + 43, BASE + 82
COMMON = os.path.join(EXAMPLE, "common")


def binary(h):
    return os.path.join(h.work, NAME, "tree", "objs", "nginx")


def _run_dir(h):
    return os.path.join(h.work, NAME, "run")


def build(h, tree):
    run = _run_dir(h)
    cfg = ["./configure", "--with-cc=" + h.moltcc,
           "--with-cc-opt=--molt-updatable=all %s -fPIC %s" % (DEB_CFLAGS, DEB_CPPFLAGS),
           "--with-ld-opt=%s -fPIC" % DEB_LDFLAGS,
           "--prefix=" + run, "--conf-path=%s/nginx.conf" % run, "--error-log-path=stderr",
           "--http-log-path=%s/access.log" % run, "--pid-path=%s/nginx.pid" % run,
           "--lock-path=%s/nginx.lock" % run]
    cfg += ["--http-%s-temp-path=%s/%s" % (t, run, t.split("-")[0])
            for t in ("client-body", "proxy", "fastcgi", "uwsgi", "scgi")]
    cfg += ["--with-compat", "--with-pcre-jit", "--with-threads", "--with-http_ssl_module",
            "--with-http_v2_module", "--with-http_dav_module", "--with-http_realip_module",
            "--with-http_stub_status_module"]
    rc1, w1, c1 = h.run(cfg, "build-nginx-configure.log", cwd=tree)
    rc2, w2, c2 = h.run(["make", "-j%d" % os.cpu_count(), "-f", "objs/Makefile"], "build-nginx.log",
                        cwd=tree)
    return 0, w1 + w2, c1 + c2



def _certs(d):
    """Two CAs; the server's and a client's certificate from the first."""
    if os.path.exists(os.path.join(d, "cli.pem")):
        return
    os.makedirs(d, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def ssl(*a):
        subprocess.check_call(["openssl"] + list(a), cwd=d, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    for ca in ("ca", "ca2"):
        ssl("req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "3650",
            "-subj", "/CN=molt fixes " + ca)
    for who, cn in (("srv", "a.test"), ("cli", "client of ca")):
        ssl("req", *ec, "-keyout", who + ".key", "-out", who + ".csr", "-subj", "/CN=" + cn)
        ssl("x509", "-req", "-in", who + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", who + ".pem", "-days", "3650")


def _conf(h, port, tls, tag):
    d = _run_dir(h)
    for sub in ("logs", "tmp", "davsrc"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    with open(os.path.join(d, "davsrc", "a.txt"), "w") as f:
        f.write("a file to COPY\n")
    files = os.path.join(h.work, NAME, "files")
    if not os.path.exists(os.path.join(files, "f63.txt")):
        subprocess.check_call([sys.executable, os.path.join(COMMON, "httpload.py"), "--write-files", files])
    t = os.path.join(d, "tls")
    _certs(t)
    conf = os.path.join(d, tag + ".conf")
    tmp = os.path.join(d, "tmp")
    with open(conf, "w") as f:
        f.write("""daemon off;
master_process off;
worker_processes 1;
error_log %(d)s/logs/%(tag)s-error.log info;
pid %(d)s/logs/%(tag)s.pid;
events { worker_connections 1024; }
http {
  access_log off;
  default_type text/plain;
  client_body_temp_path %(tmp)s/body;
  proxy_temp_path %(tmp)s/proxy;
  fastcgi_temp_path %(tmp)s/fastcgi;
  uwsgi_temp_path %(tmp)s/uwsgi;
  scgi_temp_path %(tmp)s/scgi;
  server {
    listen 127.0.0.1:%(port)d;
    root %(files)s;
    location /davdir/ {
      alias %(d)s/davsrc/;
      dav_methods PUT DELETE MKCOL COPY MOVE;
    }
  }
  ssl_certificate %(t)s/srv.pem;
  ssl_certificate_key %(t)s/srv.key;
  ssl_protocols TLSv1.3;
  ssl_session_cache shared:S%(tag)s:1m;
  server { listen 127.0.0.1:%(tls)d ssl default_server; server_name a.test;
           ssl_verify_client on; ssl_client_certificate %(t)s/ca.pem;
           location / { return 200 "a.test verified=$ssl_client_verify\\n"; } }
  server { listen 127.0.0.1:%(tls)d ssl; server_name b.test;
           ssl_verify_client on; ssl_client_certificate %(t)s/ca2.pem;
           location / { return 200 "b.test SECRET verified=$ssl_client_verify\\n"; } }
}
""" % dict(d=d, tag=tag, tmp=tmp, port=port, tls=tls, files=files, t=t))
    return conf


def start(h, tag="live", port=PORT, limit_as=None):
    tls = TLS if tag == "live" else TLS + 1
    h.ensure_free(port, tls)
    p = h.start([binary(h), "-p", _run_dir(h), "-c", _conf(h, port, tls, tag)], "nginx-%s.log" % tag)
    h.wait_port(port, p)
    h.wait_port(tls, p)
    return p, port


def load(h):
    return Load(h, NAME, [sys.executable, os.path.join(COMMON, "httpload.py"), "--port", str(PORT),
                          "--keepalive", "--conns", "8"])


def demo_copy(h, port, proc):
    """CVE-2026-27654: COPY under an alias location with a Destination
    shorter than the alias."""
    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "COPY", "-H",
                          "Destination: http://127.0.0.1:%d/d" % port,
                          "http://127.0.0.1:%d/davdir/a.txt" % port], capture_output=True, text=True)
    return "COPY -> %s" % out.stdout.strip()


def demo_sni(h, port, proc):
    """CVE-2025-23419: a TLS 1.3 session made with SNI a.test and a client
    certificate of a.test's CA, resumed with SNI b.test (which requires a
    certificate of another CA) and no certificate."""
    t = os.path.join(_run_dir(h), "tls")
    sess = os.path.join(h.work, NAME, "sni-session.pem")
    if os.path.exists(sess):
        os.unlink(sess)
    base = ["openssl", "s_client", "-connect", "127.0.0.1:%d" % TLS, "-CAfile",
            os.path.join(t, "ca.pem"), "-ign_eof"]
    subprocess.run(base + ["-quiet", "-servername", "a.test", "-cert", os.path.join(t, "cli.pem"),
                           "-key", os.path.join(t, "cli.key"), "-sess_out", sess],
                   input=b"GET / HTTP/1.0\r\nHost: a.test\r\n\r\n", capture_output=True, timeout=10)
    p = subprocess.Popen(base + ["-servername", "b.test", "-sess_in", sess], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(0.7)
    try:
        p.stdin.write(b"GET / HTTP/1.0\r\nHost: b.test\r\n\r\n")
        p.stdin.flush()
    except BrokenPipeError:
        pass
    try:
        out, _ = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    text = out.decode("latin1")
    reused = "Reused" if "\nReused," in text else "New session" if "\nNew," in text else "no session"
    if "b.test SECRET" in text:
        return "%s, b.test answered SECRET" % reused
    if "alert" in text:
        alert = [l for l in text.splitlines() if "alert" in l][0]
        return "%s, refused (%s)" % (reused, alert.split(":")[-1].strip()[:60])
    return "%s, no answer" % reused


SHADOW_40701 = "CVE-2026-40701-shadow.patch"


def fixes():
    return [
        Fix("CVE-2025-23419", "CVE-2025-23419.patch", demo=demo_sni,
            expect_before=r"^Reused, b\.test answered SECRET", expect_after=r"refused|no answer"),
        Fix("CVE-2026-1642", "CVE-2026-1642.patch", note="upstream TLS reply injection: no demo"),
        Fix("CVE-2026-27654", "CVE-2026-27654.patch", demo=demo_copy,
            expect_before=r"COPY -> (404|5\d\d)", expect_after=r"COPY -> 400"),
        Fix("CVE-2026-42945", "CVE-2026-42945.patch", note="rewrite/script engine: no demo"),
        Fix("CVE-2026-40701", "CVE-2026-40701.patch", kind="refuse",
            refusal=r"ngx_ssl_ocsp_ctx_s.*'resolve'", carries="CVE-2026-40701-shadow"),
        Fix("CVE-2026-40701-shadow", SHADOW_40701, kind="byhand",
            note="the added field 'resolve' as shadow data of the OCSP context"),
        Fix("CVE-2026-9256", "CVE-2026-9256.patch", needs=["CVE-2026-42945"],
            note="rewrite/script engine: no demo"),
        Fix("FIX-HTTP2bomb", "FIX-HTTP2bomb.patch", kind="refuse",
            refusal=r"ngx_modules|auto/modules|ngx_http_header_count"),
    ]
