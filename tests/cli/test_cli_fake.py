"""End-to-end tests of the `molt` CLI against a fake molt process.

The fake process is tests/protocol/test_control.c in --serve mode: the real
control server (control.c + protocol.c) with a scripted runtime behind it,
so these tests pin down the CLI's behaviour -- output formats, one-line
errors, exit codes -- independently of the real runtime.

Environment (set by tests/cli/tests.cmake):
  MOLT_BUILD_DIR      the build tree (its bin/molt: harness.tree)
  MOLT_TEST_CONTROL   path of the test_control binary
Run by hand:
  MOLT_BUILD_DIR=build MOLT_TEST_CONTROL=build/tests/protocol_test_control \
      python3 -m pytest tests/cli/test_cli_fake.py
"""

import json
import os
import re
import socket
import struct
import subprocess
import sys
import time

import pytest

from harness import proc
from harness.proc import Program
from harness.tree import molt_cli

CLI = molt_cli()
FAKE = os.environ.get("MOLT_TEST_CONTROL", "")

pytestmark = pytest.mark.skipif(
    not (os.path.isfile(CLI) and os.path.isfile(FAKE)),
    reason="the build tree's bin/molt and MOLT_TEST_CONTROL must be the built binaries",
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CONNECT, EXIT_PROTO = range(5)


def molt(*args, cwd=None, timeout=30, user=None, env=None):
    """The CLI's output as bytes (the tests check its encoding)."""
    return proc.molt(*args, cwd=cwd, timeout=timeout, user=user, text=False, env=env)


def one_line_error(r):
    """Every failure is exactly one line `molt: <what>: <why>; <todo>`."""
    err = r.stderr.decode()
    assert r.stdout == b""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("molt: "), err
    return err.rstrip("\n")


class Proc(Program):
    """A process that says `ready PID` when it serves."""

    def __init__(self, *args):
        Program.__init__(self, args)
        line = self.line(30)
        m = re.fullmatch(r"ready (\d+)", line)
        assert m, f"fake molt process did not start: {line!r}"
        self.pid = int(m.group(1))


@pytest.fixture
def fake():
    p = Proc(FAKE, "--serve")
    yield p.pid
    p.kill()


@pytest.fixture
def patch_file(tmp_path):
    def make(name):
        path = tmp_path / name
        path.write_bytes(b"\x7fELF not really")
        return path
    return make


# ---- local behaviour -------------------------------------------------------

def test_help_and_version():
    r = molt("help")
    assert r.returncode == 0
    out = r.stdout.decode()
    for word in ("molt ps", "molt status", "molt apply", "molt rollback",
                 "molt log", "exit status", "--policy", "--timeout"):
        assert word in out
    assert molt("--help").stdout == r.stdout
    r = molt("--version")
    assert r.returncode == 0
    assert r.stdout.decode() == "molt 0.1.0 (control protocol 1)\n"


@pytest.mark.parametrize("args", [
    [],
    ["frobnicate"],
    ["status"],
    ["status", "abc"],
    ["status", "-5"],
    ["status", "0"],
    ["status", "99999999999"],
    ["status", "1", "2"],
    ["status", "1", "--policy", "local"],
    ["apply", "1"],
    ["apply", "1", "x.so", "--policy", "sometimes"],
    ["apply", "1", "x.so", "--policy"],
    ["apply", "1", "x.so", "--timeout", "0"],
    ["apply", "1", "x.so", "--timeout", "-1"],
    ["apply", "1", "x.so", "--timeout", "soon"],
    ["apply", "1", "x.so", "--json"],
    ["rollback", "1", "--bogus"],
    ["log", "1", "--timeout=3"],
    ["ps", "1"],
    ["run", "x.so"],
])
def test_usage_errors(args):
    r = molt(*args)
    assert r.returncode == EXIT_USAGE, r
    one_line_error(r)


def test_apply_missing_file(fake, tmp_path):
    r = molt("apply", fake, "nope.so", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE
    err = one_line_error(r)
    assert err.startswith(f"molt: apply nope.so to {fake}: ")
    r = molt("apply", fake, str(tmp_path), cwd=tmp_path)
    assert r.returncode == EXIT_USAGE
    assert "not a regular file" in one_line_error(r)


# ---- status ------------------------------------------------------------------

def test_status_human(fake):
    r = molt("status", fake)
    assert r.returncode == 0, r
    out = r.stdout.decode()
    assert re.search(rf"^process\s+{fake} \(", out, re.M)
    assert re.search(r"^state\s+ok$", out, re.M)
    assert re.search(r"^generation\s+0$", out, re.M)
    assert re.search(r"^patches, bottom first: none$", out, re.M)
    assert re.search(r"^  NAME\s+FILE\s+STATIC\s+VERSION\s+ENTRY$", out, re.M)
    assert re.search(r"^  handle_get\s+kv\.c\s+no\s+base\s+direct$", out, re.M)
    # control characters from the target never reach the terminal
    assert "\x1b" not in out and "\t" not in out
    assert "parse?line" in out
    # columns are aligned: every row of a table starts its columns at the
    # same offsets as the header
    lines = out.splitlines()
    i = lines.index(next(l for l in lines if l.startswith("  TID")))
    col = lines[i].index("NAME")
    assert lines[i + 1][col - 2:col] == "  " and lines[i + 1][col] != " "


def test_status_json(fake):
    r = molt("status", fake, "--json")
    assert r.returncode == 0, r
    s = json.loads(r.stdout)
    assert list(s) == ["pid", "state", "refusing_reason", "generation",
                       "reclaim", "programs", "patches", "objects",
                       "live_generations", "functions", "threads", "image",
                       "program_threads", "shadow", "refused_connections", "old_code",
                       "old_code_uninspected"]
    assert s["pid"] == fake
    assert s["state"] == "ok" and s["refusing_reason"] is None
    assert s["generation"] == 0 and s["reclaim"] is True
    assert s["programs"] == [{"path": "/srv/bin/kv server",
                              "build_id": "0123456789abcdef0123"}]
    assert s["patches"] == [] and s["objects"] == []
    assert s["live_generations"] == [{"generation": 0, "slot": 0,
                                      "state": "current", "active_calls": 2}]
    assert s["functions"][1] == {"name": "parse\tline", "tu": "proto.c",
                                 "static": True, "version": "base", "entry": "direct"}
    assert s["threads"] == [
        {"tid": 4242, "name": "worker-1", "view": "global",
         "generation": None, "active_calls": 1},
        {"tid": 4243, "name": "w\x1b[31mred", "view": "local",
         "generation": 3, "active_calls": 0},
    ]
    assert s["old_code"] == [] and s["old_code_uninspected"] == 1
    assert s["shadow"] is None   # never a shadowed update


def test_old_code_apply_warning_and_status(fake, patch_file, tmp_path):
    """The runtime's findings of old code (its `warning` and `old` records)
    as the CLI shows them."""
    patch_file("loop1.so")
    r = molt("apply", fake, "loop1.so", cwd=tmp_path)
    assert r.returncode == 0, r
    assert r.stderr.decode() == ("molt: warning: thread 4242 (worker-1) is still running "
                                 "version 0 of handle_get\n")
    s = json.loads(molt("status", fake, "--json").stdout)
    old = s["old_code"]
    assert len(old) == 1 and old[0]["function"] == "handle_get" and old[0]["tid"] == 4242
    assert old[0]["thread"] == "worker-1" and old[0]["version"] == 0
    assert old[0]["static"] is False and 99 <= old[0]["seconds"] < 200
    assert old[0]["never_returns"] is True
    out = molt("status", fake).stdout.decode()
    assert re.search(r"^old versions still running \(1\) \(1 thread running, not looked at\)$",
                     out, re.M), out
    assert re.search(r"^  handle_get: still running version 0 on thread 4242 \(worker-1\) "
                     r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(\d+ s\): a loop that never "
                     r"returns; a full update replaces it$", out, re.M), out
    # a threshold above its age: listed, not flagged
    env = dict(os.environ, MOLT_OLD_CODE_SECONDS="1000")
    s = json.loads(molt("status", fake, "--json", env=env).stdout)
    assert s["old_code"][0]["never_returns"] is False
    out = molt("status", fake, env=env).stdout.decode()
    assert "never returns" not in out and "handle_get: still running version 0" in out
    assert molt("rollback", fake).returncode == 0


# ---- apply / rollback ---------------------------------------------------------

def test_apply_relative_path_and_rollback(fake, patch_file, tmp_path):
    p = patch_file("fix1.so")
    r = molt("apply", fake, "fix1.so", "--policy", "local", "--timeout", "2.5",
             cwd=tmp_path)
    assert r.returncode == 0, r
    assert r.stdout.decode() == (
        f"applied {os.path.realpath(p)} to {fake}: now at generation 1 "
        "(switched)\n")
    s = json.loads(molt("status", fake, "--json").stdout)
    assert s["generation"] == 1
    assert s["patches"] == [{"position": 1, "id": "fix1",
                             "description": 'patch\t"fix1"',
                             "path": os.path.realpath(p), "generation": 1,
                             "replaced": "", "built_from": "", "kept_loaded": None,
                             # the CLI opened the file and passed it (SCM_RIGHTS)
                             "file": "%d:%d" % (os.stat(p).st_dev, os.stat(p).st_ino),
                             "sha256": "", "callbacks": None}]
    assert s["objects"][0]["refs"] == 1
    assert s["functions"][0]["version"] == "fix1"

    r = molt("rollback", fake, "--policy=global")
    assert r.returncode == 0, r
    assert r.stdout.decode() == (
        f"rolled back {fake}: now at generation 2 (rolled back)\n")
    r = molt("rollback", fake)
    assert r.returncode == EXIT_FAILED
    assert one_line_error(r) == (
        f"molt: rollback {fake}: nothing to roll back; "
        "no patch is applied, nothing to undo")


def test_apply_symlink_is_resolved(fake, patch_file, tmp_path):
    p = patch_file("real.so")
    os.symlink(p, tmp_path / "link.so")
    r = molt("apply", fake, tmp_path / "link.so")
    assert r.returncode == 0, r
    s = json.loads(molt("status", fake, "--json").stdout)
    assert s["patches"][0]["path"] == str(p)


def test_apply_refused_buildid(fake, patch_file, tmp_path):
    patch_file("buildid.so")
    r = molt("apply", fake, "buildid.so", cwd=tmp_path)
    assert r.returncode == EXIT_FAILED
    assert one_line_error(r) == (
        f"molt: apply buildid.so to {fake}: patch was built for a different "
        "program (build-id mismatch); rebuild it with --molt-target pointing "
        "at the running binary")
    # nothing changed
    assert json.loads(molt("status", fake, "--json").stdout)["generation"] == 0


def test_runtime_advice_is_not_doubled(fake, patch_file):
    p = patch_file("unsafe.so")
    r = molt("apply", fake, p)
    assert r.returncode == EXIT_FAILED
    assert one_line_error(r) == (
        f"molt: apply {p} to {fake}: {p} is writable by others; "
        "run chmod o-w on it")


def test_refusing_state(fake, patch_file):
    r = molt("apply", fake, patch_file("breakme.so"))
    assert r.returncode == EXIT_FAILED
    one_line_error(r)
    s = json.loads(molt("status", fake, "--json").stdout)
    assert s["state"] == "refusing"
    assert s["refusing_reason"] == "simulated internal failure"
    out = molt("status", fake).stdout.decode()
    assert "REFUSING updates: simulated internal failure" in out
    r = molt("apply", fake, patch_file("fix2.so"))
    assert r.returncode == EXIT_FAILED
    assert "refusing state" in one_line_error(r)


def test_json_output_is_valid_utf8(fake, tmp_path):
    name = os.fsencode(tmp_path) + b"/bad\xff\xfename.so"
    with open(name, "wb") as f:
        f.write(b"x")
    r = subprocess.run([os.fsencode(CLI), b"apply", str(fake).encode(), name],
                       capture_output=True)
    assert r.returncode == 0, r
    s = json.loads(molt("status", fake, "--json").stdout.decode("utf-8"))
    assert s["patches"][0]["path"].endswith("bad\ufffd\ufffdname.so")


# ---- log ------------------------------------------------------------------------

def test_log(fake, patch_file):
    assert molt("apply", fake, patch_file("fix1.so")).returncode == 0
    r = molt("log", fake)
    assert r.returncode == 0, r
    lines = r.stdout.decode().splitlines()
    assert re.fullmatch(r"SEQ\s+TIME\s+EVENT\s+GENERATION\s+PATCH\s+MESSAGE",
                        lines[0])
    assert re.match(r"1\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\s+start\s+0\s+-"
                    r"\s+runtime started", lines[1])
    assert any(re.match(r"\d+\s+\S+ \S+\s+load\s+1\s+fix1\s+loaded /", l)
               for l in lines)
    r = molt("log", fake, "--json")
    assert r.returncode == 0
    entries = json.loads(r.stdout)
    assert [e["event"] for e in entries] == ["start", "load", "switch"]
    assert list(entries[0]) == ["seq", "time", "event", "generation", "patch",
                                "message"]
    assert entries[0]["patch"] is None and entries[1]["patch"] == "fix1"
    assert entries[2]["generation"] == 1
    assert isinstance(entries[0]["time"], float)
    assert abs(entries[0]["time"] - time.time()) < 600


# ---- ps ---------------------------------------------------------------------------

def test_ps(fake):
    r = molt("ps")
    assert r.returncode == 0, r
    lines = r.stdout.decode().splitlines()
    assert re.fullmatch(r"PID\s+USER\s+COMMAND\s+GENERATION\s+STATE", lines[0])
    with open(f"/proc/{fake}/comm") as f:
        comm = f.read().strip()
    row = [l for l in lines[1:] if l.split()[0] == str(fake)]
    assert len(row) == 1, lines
    fields = row[0].split()
    assert fields[2] == comm and fields[3] == "0" and fields[4] == "ok"


# ---- cannot talk ----------------------------------------------------------------

def test_no_such_process():
    pid = 4194303  # pid_max on 64-bit Linux at most 2^22
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    r = molt("status", pid)
    assert r.returncode == EXIT_CONNECT
    assert one_line_error(r) == (
        f"molt: status {pid}: no such process {pid}; "
        "check the pid with 'molt ps'")


def test_not_a_molt_process():
    r = molt("log", os.getpid())
    assert r.returncode == EXIT_CONNECT
    assert "is not a molt process" in one_line_error(r)


def test_impostor_socket():
    victim = subprocess.Popen(["sleep", "60"])
    squatter = Proc(FAKE, "--squat", str(victim.pid))
    try:
        r = molt("status", victim.pid)
        assert r.returncode == EXIT_CONNECT
        err = one_line_error(r)
        assert (f"refusing to talk to pid {victim.pid}: socket "
                f"molt.{victim.pid} is served by pid {squatter.pid}") in err
        rows = [l.split() for l in molt("ps").stdout.decode().splitlines()]
        assert [r[4] for r in rows if r[0] == str(victim.pid)] == ["impostor"]
    finally:
        squatter.kill()
        victim.kill()
        victim.wait()


def test_client_timeout(patch_file):
    p = Proc(FAKE, "--serve")  # its own: "hang" blocks it for 8 s
    try:
        t0 = time.monotonic()
        r = molt("apply", p.pid, patch_file("hang.so"), "--timeout", "0.5")
        dt = time.monotonic() - t0
        assert r.returncode == EXIT_CONNECT
        err = one_line_error(r)
        assert "no answer within 5.500 s" in err
        assert "may or may not have taken effect" in err
        assert 5.0 < dt < 7.5
    finally:
        p.kill()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become uid 1000")
def test_other_user_is_refused(fake):
    # the CLI must be reachable by uid 1000
    path = os.path.realpath(CLI)
    if not os.access(path, os.X_OK) or subprocess.run(
            ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups",
             "test", "-x", path]).returncode != 0:
        pytest.skip("uid 1000 cannot execute the CLI")
    r = molt("status", fake, user=1000)
    assert r.returncode == EXIT_CONNECT
    assert one_line_error(r) == (
        f"molt: status {fake}: uid 1000 is not allowed to control this "
        "process (owner uid 0); run molt as the process's owner or as root")
    # ps does not even knock on other users' doors
    # (the fake runs as root, so uid 1000 sees '-')
    rows = [l.split() for l in
            molt("ps", user=1000).stdout.decode().splitlines()]
    assert [r[3:] for r in rows if r[0] == str(fake)] == [["-", "-"]]
    entries = json.loads(molt("log", fake, "--json").stdout)
    denied = [e for e in entries if e["event"] == "denied"]
    assert len(denied) == 1 and "uid 1000" in denied[0]["message"]


# ---- protocol errors: a process that answers nonsense ------------------------------

BAD_SERVER = r"""
import os, socket, struct, sys
mode = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(b"\0molt.%d" % os.getpid())
s.listen(4)
print("ready %d" % os.getpid(), flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(2)
    try:
        c.recv(65536)
    except OSError:
        pass
    if mode == "magic":
        c.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
    elif mode == "version":
        c.sendall(struct.pack("<IHHiI", 0x544c4f4d, 2, 0, 0, 0))
    elif mode == "truncated":
        c.sendall(struct.pack("<IHHiI", 0x544c4f4d, 1, 0, 0, 100) + b"state\tok")
    elif mode == "tsv":
        c.sendall(struct.pack("<IHHiI", 0x544c4f4d, 1, 0, 0, 8) + b"state\tok")
    elif mode == "newcode":
        body = b"error\tsomething new\n"
        c.sendall(struct.pack("<IHHiI", 0x544c4f4d, 1, 0, -99, len(body)) + body)
    elif mode == "silent-close":
        pass
    c.close()
"""


@pytest.mark.parametrize("mode,code,text", [
    ("magic", EXIT_PROTO, "bad magic"),
    ("version", EXIT_PROTO, "version 2"),
    ("truncated", EXIT_PROTO, "truncated payload"),
    ("tsv", EXIT_PROTO, "not terminated"),
    ("newcode", EXIT_FAILED, "something new"),
    ("silent-close", EXIT_CONNECT, "closed the connection without answering"),
])
def test_bad_server(mode, code, text):
    p = Proc(sys.executable, "-c", BAD_SERVER, mode)
    try:
        r = molt("status", p.pid)
        assert r.returncode == code, r
        assert text in one_line_error(r)
    finally:
        p.kill()
