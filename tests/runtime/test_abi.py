"""An object built for another molt ABI is refused (molt/abi.h, MOLT__ABI):
its registration puts the runtime into the refusing state, with a reason
naming the object and both versions, visible in `molt status` and `molt
log`; updates are refused from then on and the program keeps running.

Environment (set by tests/runtime/tests.cmake):
  MOLT_CLI   the molt binary
  ABI_HOST   the host program (abi_host.c + target.c)
  ABI_OTHER  the object that claims MOLT__ABI + 1 (abi_other.c)
  ABI_PATCH  a patch stamped for the host (patch_b.c: tag 2)
"""
import json
import os
import subprocess

CLI = os.environ["MOLT_CLI"]


def molt(*args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=60)


def status(pid):
    r = molt("status", pid, "--json")
    assert r.returncode == 0, r
    return json.loads(r.stdout)


def test_object_of_another_abi_is_refused():
    p = subprocess.Popen([os.environ["ABI_HOST"]], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, bufsize=1)
    try:
        pid = int(p.stdout.readline().split()[1])
        s = status(pid)
        assert s["state"] == "ok" and s["refusing_reason"] is None, s
        r = molt("apply", pid, os.environ["ABI_PATCH"])
        assert r.returncode == 0, r
        p.stdin.write("call\n")
        assert p.stdout.readline() == "tag 2\n"

        other = os.environ["ABI_OTHER"]
        p.stdin.write("load %s\n" % other)
        assert p.stdout.readline() == "loaded\n"
        s = status(pid)
        assert s["state"] == "refusing", s
        reason = s["refusing_reason"]
        assert os.path.basename(other) in reason, reason
        assert "molt ABI %d" % (abi() + 1) in reason and "speaks %d" % abi() in reason, reason
        # its function was not registered: the host's functions only
        assert "other_version" not in [f["name"] for f in s["functions"]], s["functions"]
        human = molt("status", pid)
        assert human.returncode == 0 and "REFUSING updates" in human.stdout, human
        log = json.loads(molt("log", pid, "--json").stdout)
        assert any(e["event"] == "fail" and "ABI" in e["message"] for e in log), log

        # Updates are refused from now on; the program runs on unchanged.
        r = molt("rollback", pid)
        assert r.returncode == 1 and "refuses updates" in r.stderr, r
        r = molt("apply", pid, os.environ["ABI_PATCH"])
        assert r.returncode == 1 and "refuses updates" in r.stderr, r
        p.stdin.write("call\n")
        assert p.stdout.readline() == "tag 2\n"
        assert status(pid)["generation"] == 1
    finally:
        p.stdin.close()
        p.wait(timeout=10)


def abi():
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "include", "molt", "abi.h")) as f:
        return int(re.search(r"^#define MOLT__ABI (\d+)u", f.read(), re.M).group(1))
