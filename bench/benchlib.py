"""Shared helpers of the molt benchmarks: paths, cached compiles, the
alternating runner, statistics, JSON results.

Everything that measures time goes through `alternate()` (the C runner in
src/runner.c): the programs of one comparison are run in turns, round r in
order and round r+1 in reverse order, so the ratio of their medians is taken
in the same run, under the same load.
"""
import glob
import hashlib
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
SRC = os.path.join(BENCH, "src")
RESULTS = os.path.join(BENCH, "results")
INCLUDE = os.path.join(ROOT, "include")


class Ctx:
    """What every measure needs: where molt is built, where to work, how
    much to run."""

    def __init__(self, molt_build, work, quick, log):
        self.molt_build = os.path.abspath(molt_build)
        self.work = os.path.abspath(work)
        self.quick = quick
        self.log = log
        self.jobs = os.cpu_count() or 2
        os.makedirs(self.work, exist_ok=True)
        os.makedirs(RESULTS, exist_ok=True)

    @property
    def libdir(self):
        return self.molt_build

    @property
    def moltcc(self):
        return os.path.join(self.molt_build, "bin", "moltcc")

    @property
    def molt_cli(self):
        return os.path.join(self.molt_build, "bin", "molt")

    @property
    def moltstamp(self):
        return os.path.join(self.molt_build, "bin", "moltstamp")

    def molt_link(self):
        """Link flags of a molt program (what moltcc adds to a link)."""
        return ["-L" + self.libdir, "-lmolt", "-Wl,-rpath," + self.libdir,
                "-Wl,--build-id", "-pthread"]

    def wdir(self, *parts):
        d = os.path.join(self.work, *parts)
        os.makedirs(d, exist_ok=True)
        return d


def log(msg):
    sys.stderr.write("[bench %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def sh(cmd, cwd=None, env=None, check=True, capture=False):
    """Runs a command; on failure shows it and its output."""
    r = subprocess.run(cmd, cwd=cwd, env=env, text=True,
                       stdout=subprocess.PIPE if capture else None,
                       stderr=subprocess.PIPE if capture else None)
    if check and r.returncode != 0:
        raise RuntimeError("command failed (%d): %s\n%s%s" % (
            r.returncode, " ".join(shlex.quote(c) for c in cmd),
            r.stdout or "", r.stderr or ""))
    return r


# ---- cached builds --------------------------------------------------------------

def _stamp_path(out):
    return out + ".cmd"


def up_to_date(out, cmd, deps):
    """True if `out` was made by exactly `cmd` after every file in `deps`
    last changed (so a rerun of the suite does not rebuild 100,000
    generated functions)."""
    key = hashlib.sha1("\0".join(cmd).encode()).hexdigest()
    try:
        with open(_stamp_path(out)) as f:
            if f.read() != key:
                return False
        t = os.path.getmtime(out)
    except OSError:
        return False
    return all(os.path.getmtime(d) <= t for d in deps)


def build(out, cmd, deps, cwd=None, env=None, post=None):
    """Runs `cmd` (which makes `out`) unless it is up to date; `post` (more
    commands, e.g. moltstamp) runs after it."""
    if up_to_date(out, cmd, deps):
        return out
    if os.path.exists(out):
        os.unlink(out)
    sh(cmd, cwd=cwd, env=env, capture=True)
    for p in post or []:
        sh(p, cwd=cwd, env=env, capture=True)
    key = hashlib.sha1("\0".join(cmd).encode()).hexdigest()
    with open(_stamp_path(out), "w") as f:
        f.write(key)
    return out


def build_many(jobs, items):
    """items: (out, cmd, deps); built in parallel, `jobs` at a time."""
    with ThreadPoolExecutor(max_workers=jobs) as ex:
        list(ex.map(lambda it: build(*it), items))


def molt_deps(ctx):
    return [os.path.join(INCLUDE, "molt.h")] + sorted(glob.glob(os.path.join(INCLUDE, "molt", "*.h")))


# ---- running ----------------------------------------------------------------------

_runner = None


def runner(ctx):
    global _runner
    if _runner is None:
        out = os.path.join(ctx.wdir("tools"), "runner")
        src = os.path.join(SRC, "runner.c")
        _runner = build(out, ["gcc", "-O2", "-Wall", "-o", out, src], [src])
    return _runner


def alternate(ctx, progs, runs, warmup=1):
    """progs: [(label, argv)].  Runs them in alternation, `runs` rounds,
    after `warmup` rounds that are thrown away (page cache, first-run
    effects of a freshly built binary).
    Returns {label: [record]} where a record has wall_ns, user_ns, sys_ns,
    maxrss_kb, minflt, t_spawn_ns, status, out and the key=value pairs the program
    printed (as ints where they are numbers)."""
    spec = "".join("%s\t%s\n" % (label, "\t".join(argv)) for label, argv in progs)
    r = subprocess.run([runner(ctx), str(runs + warmup)], input=spec, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise RuntimeError("runner failed: %s" % r.stderr)
    res = {label: [] for label, _ in progs}
    for line in r.stdout.splitlines():
        rec = json.loads(line)
        rec.update(parse_kv(rec["out"]))
        if rec["status"] != 0:
            raise RuntimeError("%s exited with %d: %s" % (rec["label"], rec["status"],
                                                          rec["out"][-500:]))
        if rec["run"] >= warmup:
            res[rec["label"]].append(rec)
    return res


def parse_kv(text):
    kv = {}
    for k, v in re.findall(r"(\w+)=(\S+)", text):
        try:
            kv[k] = int(v)
        except ValueError:
            try:
                kv[k] = float(v)
            except ValueError:
                kv[k] = v
    return kv


# ---- statistics --------------------------------------------------------------------

def summary(values):
    """median, spread (min/max and quartiles), n."""
    v = sorted(values)
    if not v:
        return None
    q = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else [v[0]] * 3
    return {"median": statistics.median(v), "min": v[0], "max": v[-1],
            "q1": q[0], "q3": q[2], "n": len(v)}


def ratio_summary(num, den):
    """Ratio of medians, plus the spread of the per-round ratios (the two
    runs of a round are back to back, so their ratio cancels slow drift)."""
    m = statistics.median(num) / statistics.median(den)
    per_round = [a / b for a, b in zip(num, den) if b]
    s = summary(per_round)
    return {"ratio": m, "round_median": s["median"], "round_min": s["min"],
            "round_max": s["max"], "round_q1": s["q1"], "round_q3": s["q3"],
            "ratio_of_mins": min(num) / min(den)}


# ---- results ----------------------------------------------------------------------

def machine_info():
    info = {"time": time.strftime("%Y-%m-%d %H:%M:%S %z"), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            info["cpu"] = m.group(1) if m else "?"
        with open("/proc/loadavg") as f:
            info["loadavg"] = f.read().split()[:3]
    except OSError:
        pass
    for tool, cmd in (("gcc", ["gcc", "--version"]), ("clang", ["clang-14", "--version"])):
        try:
            info[tool] = subprocess.run(cmd, stdout=subprocess.PIPE, text=True).stdout.splitlines()[0]
        except OSError:
            info[tool] = None
    info["kernel"] = os.uname().release
    return info


QUICK = False  # set by bench.py; recorded in every result file


def save(name, data):
    data.setdefault("machine", machine_info())
    data.setdefault("quick", QUICK)
    path = os.path.join(RESULTS, name + ".json")
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=False)
    return path


def load(name):
    path = os.path.join(RESULTS, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
