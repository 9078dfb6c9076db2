"""The hiccup meter of bench/latency (hiccup.c, read by hiccup.py): loaded
into a real process, switched on through its file, it records a stall the
test makes (the process stopped with SIGSTOP for 60 ms) as a gap of that
length, counts the stall in every millisecond it overlaps, and records
nothing while it is switched off.  And hiccup.py's verdict (a paired
bootstrap over rounds against the A/A control): on synthetic histograms it
flags an added stall, and three servers drawn from one distribution are
judged within the A/A spread (where the old point rule failed one time in
three)."""
import os
import signal
import subprocess
import sys
import time

from harness.tree import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench", "latency"))
import hiccup  # noqa: E402

STALL_S = 0.06


def test_meter_records_a_stall(tmp_path):
    lib = str(tmp_path / "hiccup.so")
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-pthread",
                    "-o", lib, os.path.join(ROOT, "bench", "latency", "hiccup.c")], check=True)
    meter_file = str(tmp_path / "meter.bin")
    env = dict(os.environ, LD_PRELOAD=lib, MOLT_HICCUP_FILE=meter_file)
    env.pop("ASAN_OPTIONS", None)
    p = subprocess.Popen(["sleep", "30"], env=env)
    try:
        for _ in range(100):
            if os.path.exists(meter_file) and os.path.getsize(meter_file) > 0:
                break
            time.sleep(0.01)
        time.sleep(0.1)
        off = hiccup.read_meter(meter_file)
        assert off["reads"] == 0 and off["windows"] == 0, "the meter ran while switched off"
        m = hiccup.Meter(meter_file)
        m.set(True)
        # At least five stalls, more (up to 20) until one was recorded: a
        # stall that falls into the meter's 1 ms rest out of every 10 ms
        # is not metered, nor one while the thread, runnable after its
        # rest, waits for a CPU on a loaded machine (a CI run once saw
        # none of five).
        made = 0
        while made < 5 or (made < 20 and hiccup.read_meter(meter_file)["max_gap_ns"]
                           < 0.9 * STALL_S * 1e9):
            time.sleep(0.05)
            os.kill(p.pid, signal.SIGSTOP)
            time.sleep(STALL_S)
            os.kill(p.pid, signal.SIGCONT)
            made += 1
            time.sleep(0.02)   # the stretch that saw it merges within 9 ms
        time.sleep(0.05)
        m.set(False)
        time.sleep(0.1)
    finally:
        p.kill()
        p.wait()
    r = hiccup.read_meter(meter_file)
    assert r["reads"] > 1000
    # Every millisecond of metered time is one window (a few are cut at
    # the ends of the 9 ms stretches), and each window is counted once.
    assert sum(r["window_max"]) == r["windows"]
    assert 0.5 * r["metered_ns"] / 1e6 <= r["windows"] <= r["metered_ns"] / 1e6 + 1
    # A stall is one gap about as long, kept with its time, and counted in
    # every millisecond it overlaps (at least 50 of them).
    assert r["max_gap_ns"] >= 0.9 * STALL_S * 1e9, r["max_gap_ns"]
    stalls = [g for _, g in r["big"] if g >= 0.9 * STALL_S * 1e9]
    assert 1 <= len(stalls) <= made + 1, (stalls, made)
    long_windows = sum(c for b, c in enumerate(r["window_max"])
                       if hiccup.bucket_value(b) >= 0.9 * STALL_S * 1e9)
    assert long_windows >= 50 * len(stalls) - 5, (long_windows, len(stalls))
    assert hiccup.hist_pct(r["window_max"], 100) >= 0.9 * STALL_S * 1e9
    assert sum(r["gaps"]) >= len(stalls)


def test_bucket_edges_are_the_inverse_of_the_meter():
    # hiccup.c's bucket(): values below 16 are their own bucket, above 16
    # steps per power of two; bucket_value(b) is b's largest value.
    def bucket(v):
        if v < 16:
            return v
        e = v.bit_length() - 1
        return (e - 3) * 16 + (v >> (e - 4)) - 16
    for v in list(range(0, 300)) + [10 ** k + d for k in range(3, 11) for d in (-1, 0, 1)]:
        b = bucket(v)
        assert v <= hiccup.bucket_value(b), v
        assert b == 0 or v > hiccup.bucket_value(b - 1), v


def _bucket(v):
    """hiccup.c's bucket() (as in the test above)."""
    if v < 16:
        return v
    e = v.bit_length() - 1
    return (e - 3) * 16 + (v >> (e - 4)) - 16


def _segments(rng, rounds, extra_us=0, extra_per_round=0, policies=("none", "immediate", "none2")):
    """Synthetic segments: per round and server 3000 milliseconds, most with
    a longest gap of 40-60 us, a random handful with 500-1000 us (the
    machine's own hiccups, alike for every server); `immediate` also gets
    extra_per_round milliseconds with a stall of extra_us."""
    segs = []
    for r in range(rounds):
        for p in policies:
            h = [0] * hiccup.BUCKETS
            for _ in range(3000):
                h[_bucket(rng.randint(40_000, 60_000))] += 1
            for _ in range(rng.randint(1, 6)):
                h[_bucket(rng.randint(500_000, 1_000_000))] += 1
            if p == "immediate":
                for _ in range(extra_per_round):
                    h[_bucket(extra_us * 1000)] += 1
            segs.append({"policy": p, "round": r, "window_max": h})
    return segs


def test_verdict_sees_an_added_stall():
    # 5 ms-long stalls in 5 milliseconds of every round: p99.9 of the
    # update's server is the stall, far beyond what separates the controls.
    import random
    policies = ["none", "immediate", "none2"]
    segs = _segments(random.Random(1), 20, extra_us=5000, extra_per_round=5)
    v = hiccup.p999_verdicts(segs, policies, set(range(20)), resamples=300)
    d, lo, hi = v["immediate"]["d"]
    assert not v["immediate"]["within"], v
    assert lo > 0 and d > v["none2"]["d"][2], v
    assert 4000 < d < 6000, v


def test_verdict_on_identical_servers():
    # Three servers from one distribution: the update's server is judged
    # within the A/A spread far more often than the old point rule's
    # two times in three; each verdict's A/A interval covers 0.
    import random
    policies = ["none", "immediate", "none2"]
    within = old_within = 0
    trials = 15
    for seed in range(trials):
        segs = _segments(random.Random(100 + seed), 20)
        v = hiccup.p999_verdicts(segs, policies, set(range(20)), resamples=200, seed=seed)
        a, alo, ahi = v["none2"]["d"]
        assert alo <= 0 <= ahi or alo <= a <= ahi, v
        within += v["immediate"]["within"]
        pt = {p: v[p]["d"][0] for p in ("immediate", "none2")}
        old_within += pt["immediate"] <= max(0, pt["none2"])
    print("within", within, "old rule", old_within, "of", trials)
    assert within >= trials - 3, (within, old_within)


def test_verdict_needs_both_controls_and_rounds():
    import random
    segs = _segments(random.Random(2), 5)
    assert hiccup.p999_verdicts(segs, ["none", "immediate"], set(range(5))) == {}
    assert hiccup.p999_verdicts(segs, ["none", "immediate", "none2"], {0, 1}) == {}
