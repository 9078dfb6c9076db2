"""P7: the kvstore demo at full load, whole command layer updatable (moltcc)
vs the plain build (PSU 5.3: MySQL with its heap storage engine updatable).

The demo's sources are copied to the work directory and built there with
their own Makefile (the example directory is not ours to write into): the
server with moltcc, the plain server with gcc, kvbench with gcc.  Both
servers run at once; kvbench loads one at a time, alternating the order every
round, so each round's two runs are back to back.
"""
import os
import shutil
import signal
import subprocess

import benchlib as bl

KV = os.path.join(bl.ROOT, "examples", "kvstore")


def build(ctx):
    d = ctx.wdir("kvstore")
    for f in os.listdir(KV):
        if f.endswith((".c", ".h")) or f == "Makefile":
            src, dst = os.path.join(KV, f), os.path.join(d, f)
            if not os.path.exists(dst) or open(src, "rb").read() != open(dst, "rb").read():
                shutil.copy2(src, dst)
    bl.sh(["make", "-s", "MOLT_ROOT=" + bl.ROOT, "MOLT_BUILD=" + ctx.molt_build,
           "kvstore", "plain", "kvbench"], cwd=d, capture=True)
    return {"molt": os.path.join(d, "kvstore"), "plain": os.path.join(d, "kvstore-plain"),
            "kvbench": os.path.join(d, "kvbench")}


def start(binary, threads):
    p = subprocess.Popen([binary, "--port", "0", "--threads", str(threads)],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    if not line.startswith("listening on 127.0.0.1:"):
        p.kill()
        raise RuntimeError("%s: unexpected output %r" % (binary, line))
    return p, int(line.rsplit(":", 1)[1])


def stop(p):
    if p.poll() is not None:
        return "server died during the run (status %s)" % p.returncode
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        return "server did not stop on SIGTERM"
    return None if rc == 0 else "server exited with status %d" % rc


def server_cpu_ns(pid):
    """CPU time the server's threads have run so far (sum of the first field
    of /proc/PID/task/*/schedstat, in ns: finer than utime's 10 ms ticks)."""
    total = 0
    d = "/proc/%d/task" % pid
    for t in os.listdir(d):
        try:
            with open(os.path.join(d, t, "schedstat")) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def p7(ctx):
    b = build(ctx)
    rounds = 10 if ctx.quick else 20
    secs = 0.5 if ctx.quick else 1.5
    threads, conns, pipeline = 4, 8, 32
    servers, rps, problems = {}, {"molt": [], "plain": []}, []
    # Server CPU time per request: on a 2-CPU machine shared with the client
    # (and with other jobs) throughput moves with whoever else runs; the CPU
    # the server spends per request moves much less and says the same thing
    # for a CPU-bound server.
    cpu_per_req = {"molt": [], "plain": []}
    import json
    try:
        for name in ("molt", "plain"):
            servers[name] = start(b[name], threads)
        # warm-up: one short load each (first connections, page faults)
        for name in ("molt", "plain"):
            subprocess.run([b["kvbench"], "--port", str(servers[name][1]), "--duration", "0.3",
                            "--json"], stdout=subprocess.PIPE)
        for r in range(rounds):
            for name in (["molt", "plain"] if r % 2 == 0 else ["plain", "molt"]):
                c0 = server_cpu_ns(servers[name][0].pid)
                res = subprocess.run([b["kvbench"], "--port", str(servers[name][1]), "--conns",
                                      str(conns), "--pipeline", str(pipeline), "--duration",
                                      str(secs), "--json"], stdout=subprocess.PIPE, text=True)
                c1 = server_cpu_ns(servers[name][0].pid)
                out = json.loads(res.stdout)
                cpu_per_req[name].append((c1 - c0) / max(1, out["requests"]))
                if res.returncode != 0 or out["errors"]:
                    problems.append("kvbench against %s: %d errors" % (name, out["errors"]))
                rps[name].append(out["rps"])
            bl.log("P7 round %d/%d: molt %.0f req/s (%.0f ns CPU/req), plain %.0f req/s (%.0f ns)"
                   % (r + 1, rounds, rps["molt"][-1], cpu_per_req["molt"][-1],
                      rps["plain"][-1], cpu_per_req["plain"][-1]))
    finally:
        for name, (p, _) in servers.items():
            e = stop(p)
            if e:
                problems.append("%s: %s" % (name, e))
    status = subprocess.run(["nm", b["molt"]], stdout=subprocess.PIPE, text=True).stdout
    updatable = sorted(l.split()[-1][:-len("__molt_v0")] for l in status.splitlines()
                       if l.endswith("__molt_v0"))
    data = {"measure": "P7", "title": "kvstore throughput, whole command layer updatable vs plain",
            "anchor": "PSU (thesis 5.3, fig. 5.7): MySQL at 95.02%", "target": ">= 98%",
            "config": {"rounds": rounds, "seconds_per_run": secs, "server_threads": threads,
                       "kvbench_conns": conns, "pipeline": pipeline,
                       "updatable_functions": updatable},
            "rps": {k: bl.summary(v) for k, v in rps.items()}, "rps_raw": rps,
            "ratio": bl.ratio_summary(rps["molt"], rps["plain"]),
            "server_cpu_ns_per_request": {k: bl.summary(v) for k, v in cpu_per_req.items()},
            "cpu_per_request_raw": cpu_per_req,
            # plain/molt: the throughput a CPU-bound molt server keeps
            "cpu_efficiency": bl.ratio_summary(cpu_per_req["plain"], cpu_per_req["molt"]),
            "problems": problems}
    bl.save("p7", data)
    if problems:
        raise RuntimeError("; ".join(problems))
    return data
