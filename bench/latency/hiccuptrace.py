#!/usr/bin/env python3
"""hiccuptrace.py — who held the CPUs during the meter's gaps after a
control request (diagnostic for RESULTS.md, issue 14 item 4).

    MOLT_BUILD=... LAT_WORK=... python3 bench/latency/hiccuptrace.py \\
        [--request status|apply|none] [--seconds 10] [--fifo-fork] \\
        [--after-ms 5] [--min-us 150] [--out DIR]

Run as root, after hiccup.sh has built (hiccup.so, the kvstore, its
patches, latclient).  One kvstore with the hiccup meter (hiccup.c) under
latclient's load (8000 requests/s, 16 connections), everything at
SCHED_FIFO 10 and the meter at FIFO 1 as in hiccup.py, and a `molt status`
or `molt apply` every 1.5 s from this driver at SCHED_OTHER -- or, with
--fifo-fork, as the first hiccup.py did it: the driver stays at FIFO 10
and lowers the CLI in preexec_fn, after fork().

While it runs, ftrace (an instance of its own, molt-hiccup, under
/sys/kernel/tracing, clock mono = the meter's CLOCK_MONOTONIC) records
sched_switch/sched_wakeup/sched_migrate_task, IRQs, IPIs, TLB flushes,
user page faults, and the system calls and mmap_lock events of the
server's threads.  Then, for every gap of the meter of at least --min-us
that began within --after-ms after a request: how long each task
(comm-pid@kernel prio; 89 = FIFO 10, 98 = FIFO 1, 120 = normal) held each
CPU during the gap; and the runtime thread's time on a CPU after each
request.  The whole trace stays in DIR/trace.txt.
"""
import argparse
import bisect
import collections
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hiccup as hc  # noqa: E402

TRACE = "/sys/kernel/tracing/instances/molt-hiccup"
EVENTS = ["sched:sched_switch", "sched:sched_wakeup", "sched:sched_migrate_task",
          "irq:irq_handler_entry", "irq:irq_handler_exit", "irq:softirq_entry",
          "irq:softirq_exit", "ipi:ipi_send_cpu", "ipi:ipi_send_cpumask",
          "irq_vectors:call_function_entry", "irq_vectors:call_function_single_entry",
          "irq_vectors:reschedule_entry", "irq_vectors:local_timer_entry",
          "tlb:tlb_flush", "exceptions:page_fault_user",
          "raw_syscalls:sys_enter", "raw_syscalls:sys_exit",
          "mmap_lock:mmap_lock_start_locking", "mmap_lock:mmap_lock_acquire_returned",
          "mmap_lock:mmap_lock_released"]
PER_SERVER = ["raw_syscalls/sys_enter", "raw_syscalls/sys_exit",
              "mmap_lock/mmap_lock_start_locking", "mmap_lock/mmap_lock_acquire_returned",
              "mmap_lock/mmap_lock_released"]
SWITCH = re.compile(r"\[(\d+)\] \S+\s+(\d+\.\d+): sched_switch: prev_comm=.*? prev_pid=\d+ "
                    r"prev_prio=\d+ prev_state=\S+ ==> next_comm=(.*?) next_pid=(\d+) "
                    r"next_prio=(\d+)")


def tw(name, text, append=False):
    fd = os.open(os.path.join(TRACE, name), os.O_WRONLY | (os.O_APPEND if append else os.O_TRUNC))
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def threads(pid):
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                out[int(t)] = f.read().strip()
        except OSError:
            pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--request", choices=["status", "apply", "none"], default="status")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--fifo-fork", action="store_true",
                    help="fork the CLI from the driver at FIFO 10 (the first hiccup.py)")
    ap.add_argument("--after-ms", type=float, default=5)
    ap.add_argument("--min-us", type=float, default=150)
    ap.add_argument("--out", default=None)
    cfg = ap.parse_args()
    work = os.environ.get("LAT_WORK", "/tmp/molt-latency")
    molt = os.path.join(os.environ.get("MOLT_BUILD", "/tmp/lat-build"), "bin", "molt")
    out = cfg.out or os.path.join(work, "hiccuptrace", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    env = dict(os.environ, LD_PRELOAD=os.path.join(work, "hiccup.so"),
               MOLT_HICCUP_FILE=os.path.join(out, "meter.bin"))
    with open(os.path.join(out, "server.log"), "w") as log:
        srv = subprocess.Popen([os.path.join(work, "kvstore"), "--port", "0", "--threads", "4"],
                               stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    client = None
    try:
        port = int(srv.stdout.readline().rsplit(":", 1)[1])
        time.sleep(0.3)
        tids = threads(srv.pid)
        if not os.path.isdir(TRACE):
            os.mkdir(TRACE)
        tw("tracing_on", "0")
        tw("trace", "")
        tw("buffer_size_kb", "65536")
        tw("trace_clock", "mono")
        tw("set_event", "")
        for e in EVENTS:
            tw("set_event", e + "\n", append=True)
        flt = " || ".join(f"common_pid == {t}" for t in tids)
        for ev in PER_SERVER:
            tw(f"events/{ev}/filter", flt)
        tw("tracing_on", "1")
        t_start = time.monotonic_ns() + int(0.3e9)
        client = subprocess.Popen(
            [os.path.join(work, "latclient"), "--port", str(port), "--conns", "16",
             "--rate", "8000", "--duration", str(cfg.seconds), "--segment", str(cfg.seconds),
             "--order", "0", "--start-ns", str(t_start),
             "--out", os.path.join(out, "requests.bin")], stdout=subprocess.PIPE, text=True)
        meter = hc.Meter(os.path.join(out, "meter.bin"))

        def lower():
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))

        preexec = lower if cfg.fifo_fork else None
        if not cfg.fifo_fork:
            lower()  # the driver itself, as hiccup.py does now
        hc.lb.sleep_until_ns(t_start)
        meter.set(True)
        marks, k = [], 0
        at = t_start + int(0.75e9)
        while at < t_start + int((cfg.seconds - 0.5) * 1e9):
            hc.lb.sleep_until_ns(at)
            t0 = time.monotonic_ns()
            rc = 0
            if cfg.request == "status":
                rc = subprocess.run([molt, "status", str(srv.pid)], capture_output=True,
                                    preexec_fn=preexec).returncode
            elif cfg.request == "apply":
                patch = os.path.join(work, "patches", hc.lb.PATCHES[k % 2])
                rc = subprocess.run([molt, "apply", str(srv.pid), patch, "--policy",
                                     "immediate", "--timeout", "1"], capture_output=True,
                                    preexec_fn=preexec).returncode
            marks.append((t0, time.monotonic_ns(), rc))
            k += 1
            at += int(1.5e9)
        hc.lb.sleep_until_ns(t_start + int(cfg.seconds * 1e9))
        meter.set(False)
        tw("tracing_on", "0")
        client.communicate()
        tids.update(threads(srv.pid))
    finally:
        if client and client.poll() is None:
            client.kill()
        srv.kill()
        srv.wait()
        time.sleep(0.05)
        if os.path.isdir(TRACE):
            tw("tracing_on", "0")
            with open(os.path.join(TRACE, "trace"), "rb") as src, \
                    open(os.path.join(out, "trace.txt"), "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            # Enabled events cost every task on the machine even with
            # tracing off (the system-call tracepoints put every system
            # call on their slow path): switch them off and remove the
            # instance.
            tw("set_event", "")
            os.rmdir(TRACE)
    m = hc.read_meter(os.path.join(out, "meter.bin"))
    with open(os.path.join(out, "info.json"), "w") as f:
        json.dump({"marks": marks, "tids": tids, "pid": srv.pid, "big": m["big"],
                   "config": vars(cfg)}, f)

    # Per CPU: (time, comm-pid@prio) of every task switched in.
    switches = collections.defaultdict(list)
    with open(os.path.join(out, "trace.txt")) as f:
        for line in f:
            if "sched_switch" in line:
                g = SWITCH.search(line)
                if g:
                    switches[int(g.group(1))].append(
                        (int(round(float(g.group(2)) * 1e9)),
                         "%s-%s@%s" % (g.group(3), g.group(4), g.group(5))))
    if not switches:
        sys.exit("hiccuptrace: no sched_switch events in the trace")
    first = max(v[0][0] for v in switches.values())  # the ring may have lost the start
    times = {c: [e[0] for e in v] for c, v in switches.items()}

    def held(lo, hi):
        res = {}
        for c, ev in switches.items():
            i = bisect.bisect_right(times[c], lo) - 1
            acc, t = collections.Counter(), lo
            while t < hi:
                who = ev[i][1] if i >= 0 else "?"
                end = min(ev[i + 1][0] if i + 1 < len(ev) else hi, hi)
                acc[who] += end - t
                t, i = end, i + 1
            res[c] = acc
        return res

    print("%s every 1.5 s, driver %s; meter gaps >= %g us within %g ms after a request:" % (
        cfg.request, "at FIFO 10, CLI lowered after fork (--fifo-fork)" if cfg.fifo_fork
        else "at SCHED_OTHER", cfg.min_us, cfg.after_ms))
    for t0, t1, rc in marks:
        if t0 < first:
            print("request at %.6f: before the trace's first event (the ring wrapped)" % (t0 / 1e9))
            continue
        gaps = [(s, g) for s, g in m["big"] if t0 <= s < t0 + cfg.after_ms * 1e6
                and g >= cfg.min_us * 1e3]
        run_rt = sum(v for acc in held(t0, t0 + int(100e6)).values()
                     for who, v in acc.items() if who.startswith("molt-runtime-"))
        print("request at %.6f (rc %d, CLI %.1f ms; runtime thread on a CPU %d us in the "
              "100 ms after): %d gap(s)" % (t0 / 1e9, rc, (t1 - t0) / 1e6, run_rt // 1000,
                                            len(gaps)))
        for s, g in gaps:
            print("  +%.2f ms: gap %d us" % ((s - t0) / 1e6, g // 1000))
            for c, acc in sorted(held(s, s + g).items()):
                print("     cpu%d: %s" % (c, ", ".join("%s %d us" % (w, v // 1000)
                                                      for w, v in acc.most_common(4))))
    print("trace: %s/trace.txt" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
