"""An object built for another molt ABI is refused (molt/abi.h, MOLT__ABI):
its registration puts the runtime into the refusing state, with a reason
naming the object and both versions, visible in `molt status` and `molt
log`; updates are refused from then on and the program keeps running.

Environment (set by tests/runtime/tests.cmake):
  MOLT_BUILD_DIR  the build tree: bin/molt (harness.tree)
  ABI_HOST   the host program (abi_host.c + target.c)
  ABI_OTHER  the object that claims MOLT__ABI + 1 (abi_other.c)
  ABI_PATCH  a patch stamped for the host (patch_b.c: tag 2)
"""
import os

from harness.proc import Program, log, molt, status
from harness.tree import molt_abi as abi


def test_object_of_another_abi_is_refused():
    p = Program([os.environ["ABI_HOST"]])
    try:
        pid = int(p.line().split()[1])
        s = status(pid)
        assert s["state"] == "ok" and s["refusing_reason"] is None, s
        r = molt("apply", pid, os.environ["ABI_PATCH"])
        assert r.returncode == 0, r
        p.send("call")
        assert p.line() == "tag 2"

        other = os.environ["ABI_OTHER"]
        p.send("load %s" % other)
        assert p.line() == "loaded"
        s = status(pid)
        assert s["state"] == "refusing", s
        reason = s["refusing_reason"]
        assert os.path.basename(other) in reason, reason
        assert "molt ABI %d" % (abi() + 1) in reason and "speaks %d" % abi() in reason, reason
        # its function was not registered: the host's functions only
        assert "other_version" not in [f["name"] for f in s["functions"]], s["functions"]
        human = molt("status", pid)
        assert human.returncode == 0 and "REFUSING updates" in human.stdout, human
        entries = log(pid)
        assert any(e["event"] == "fail" and "ABI" in e["message"] for e in entries), entries

        # Updates are refused from now on; the program runs on unchanged.
        r = molt("rollback", pid)
        assert r.returncode == 1 and "refuses updates" in r.stderr, r
        r = molt("apply", pid, os.environ["ABI_PATCH"])
        assert r.returncode == 1 and "refuses updates" in r.stderr, r
        p.send("call")
        assert p.line() == "tag 2"
        assert status(pid)["generation"] == 1
    finally:
        p.finish(rc=None)
