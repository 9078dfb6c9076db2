#!/usr/bin/env python3
"""Failures forced on purpose on a running memcached image, under the
load of run.sh (examples/fullreal/run.sh --failures):

  1. a transformer that faults (fault.xf: a wild read while migrating
     `stats_state`);
  2. a thread that never arrives at its update point (the LRU crawler
     thread, stopped with ptrace: PTRACE_SEIZE + PTRACE_INTERRUPT, as a
     thread stuck in a long system call would be), with --timeout 2.

Each `molt update` must fail, answer within its timeout (plus 5 s), and
say why: the variable and the fault; the thread's id, name and entry
function.  Then the
old version must still serve (the caller's load checks every reply), the
image of the failed update must not stay mapped, and an ordinary update
must still succeed.

    failures.py MOLT PID GOOD_IMAGE FAULT_IMAGE
"""
import ctypes
import os
import subprocess
import sys
import time

PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4206, 0x4207
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def fail(msg):
    print("failures: FAILED: " + msg)
    sys.exit(1)


def update(molt, pid, image, timeout):
    t0 = time.monotonic()
    r = subprocess.run([molt, "update", str(pid), image, "--timeout", str(timeout)],
                       capture_output=True, text=True, timeout=timeout + 30)
    return r.returncode, (r.stdout + r.stderr).strip(), time.monotonic() - t0


def mapped(pid, name):
    return name in open("/proc/%d/maps" % pid).read()


def thread_named(pid, prefix):
    for tid in os.listdir("/proc/%d/task" % pid):
        comm = open("/proc/%d/task/%s/comm" % (pid, tid)).read().strip()
        if comm.startswith(prefix):
            return int(tid), comm
    fail("no thread named %s* in process %d" % (prefix, pid))


def wait_stopped(tid):
    for _ in range(200):
        state = open("/proc/%d/status" % tid).read().split("State:")[1].split()[0]
        if state == "t":
            return
        time.sleep(0.01)
    fail("thread %d did not stop" % tid)


def main():
    molt, pid, good, fault = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

    # 1. a faulting transformer
    rc, out, took = update(molt, pid, fault, 10)
    print("faulting transformer: exit %d in %.2f s: %s" % (rc, took, out))
    if rc == 0:
        fail("the update with a faulting transformer succeeded")
    if "stats_state" not in out or "SIGSEGV" not in out:
        fail("the message names neither the variable nor the fault")
    if os.path.basename(fault) in open("/proc/%d/maps" % pid).read():
        fail("the image of the aborted update stays mapped")

    # 2. a thread that never arrives
    tid, comm = thread_named(pid, "mc-itemcrawler")
    if libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
        fail("PTRACE_SEIZE of thread %d: errno %d" % (tid, ctypes.get_errno()))
    try:
        libc.ptrace(PTRACE_INTERRUPT, tid, None, None)
        wait_stopped(tid)
        rc, out, took = update(molt, pid, good, 2)
    finally:
        # the thread is in a ptrace stop: PTRACE_DETACH lets it go on
        libc.ptrace(PTRACE_DETACH, tid, None, None)
    print("thread that never arrives: exit %d in %.2f s: %s" % (rc, took, out))
    if rc == 0:
        fail("the update succeeded without the stopped thread")
    if took > 2 + 5:
        fail("molt update --timeout 2 answered after %.1f s" % took)
    if str(tid) not in out or comm not in out:
        fail("the message does not name thread %d (%s)" % (tid, comm))
    if "started in item_crawler_thread" not in out:
        fail("the message does not name the thread's entry function item_crawler_thread")

    # the old version goes on, and updates again
    rc, out, took = update(molt, pid, good, 10)
    print("then an ordinary update: exit %d: %s" % (rc, out))
    if rc != 0:
        fail("the update after the failures did not succeed")
    print("failures: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
