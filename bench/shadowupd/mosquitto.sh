#!/usr/bin/env bash
# bench/shadowupd/mosquitto.sh [--build-only] [ROUNDS] [SECONDS] [RETAINED] -- P10 on a
# real server: the MQTT broker mosquitto 2.0.11 (Debian's deb12u1 made a
# program image, examples/fullreal/mosquitto/) under mqttload (8 clients
# publishing QoS 1 messages that come back to them, 8 in flight each, every
# message checked).
#
#  throughput: ROUNDS rounds (default 5) of SECONDS each (default 5) of
#    - plain: mosquitto built from the same tree with gcc, without molt
#      (mosquitto.patch taken out), run directly;
#    - one version: the image under `molt run`, no shadow (the wrappers
#      linked in: one flag test per followed call);
#    - two versions: the same, shadowed by itself (u1same.so, a follower
#      replaying every call), then `molt rollback`;
#    medians of messages per second.
#  latency: the image filled with RETAINED retained messages (default
#    100000), then 2 x SECONDS of load with every message's round trip
#    logged; at SECONDS, `molt update --shadow` to deb12u2 (u2.so, the real
#    update with deb12u2.xf: the follower migrates the store); the longest
#    round trip before the update and after it, and their ratio (P10's
#    target: at most 2x).  ROUNDS runs.
# Prints each measurement with the load average.
#
# bench/shadowupd/mosquitto.sh --build-only: builds the images, plain.bin
# and u1nowrap.so (deb12u1's image linked without libmolt's wrappers,
# MOLT_NO_SHADOW_WRAP=1: the one-version baseline that is a program image
# too) and stops; bench/shadowupd/p10_overhead.py --server mosquitto uses
# them (instruction and CPU counts per message).  Environment as
# examples/fullreal/mosquitto/run.sh's (MOLT_FULLREAL_WORK, default
# /var/tmp/molt-fullreal-mosquitto; MOLT_BUILD; MOLT_FULLREAL_PORT); the
# images come from shadow.sh --images-only, the plain build is made in
# $MOLT_FULLREAL_WORK/plain.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$(dirname "$here")")"
build_only=0
if [ "${1:-}" = --build-only ]; then build_only=1; shift; fi
rounds=${1:-5}
secs=${2:-5}
retained=${3:-100000}
ex=$root/examples/fullreal/mosquitto
work=${MOLT_FULLREAL_WORK:-/var/tmp/molt-fullreal-mosquitto}
build=${MOLT_BUILD:-$root/build}
port=${MOLT_FULLREAL_PORT:-27541}
molt=$build/bin/molt
load=$ex/mqttload.py
MOLT_FULLREAL_WORK=$work MOLT_BUILD=$build bash "$ex/shadow.sh" --images-only | grep -v '^images:' || true
cd "$work"
if [ ! -x plain.bin ] || [ u1.so -nt plain.bin ]; then
    echo "== mosquitto from deb12u1's tree without molt, built with gcc: plain.bin"
    rm -rf plain
    cp -a u1 plain
    patch -d plain -R -p1 -s <"$ex/mosquitto.patch"
    (cd plain && make -C src mosquitto -B CC=gcc WITH_TLS=no WITH_CJSON=no WITH_DOCS=no \
        WITH_WEBSOCKETS=no WITH_SRV=no WITH_SYSTEMD=no >../make-plain.log 2>&1) ||
        { tail -20 make-plain.log >&2; exit 1; }
    cp plain/src/mosquitto plain.bin
    rm -rf plain
fi
if [ ! -f u1nowrap.so ] || [ u1.so -nt u1nowrap.so ]; then
    echo "== deb12u1's image linked without the wrappers (MOLT_NO_SHADOW_WRAP=1): u1nowrap.so"
    rm -rf nowrap
    cp -a u1 nowrap
    rm -f nowrap/src/mosquitto
    (cd nowrap && MOLT_NO_SHADOW_WRAP=1 make -C src mosquitto CC="$build/bin/moltcc --molt-program" \
        WITH_TLS=no WITH_CJSON=no WITH_DOCS=no WITH_WEBSOCKETS=no WITH_SRV=no WITH_SYSTEMD=no \
        >../make-nowrap.log 2>&1) || { tail -20 make-nowrap.log >&2; exit 1; }
    cp nowrap/src/mosquitto u1nowrap.so
    rm -rf nowrap
fi
[ "$build_only" = 0 ] || { echo "built: $work/plain.bin $work/u1nowrap.so $work/u1.so $work/u1same.so"; exit 0; }
cp "$ex/shadow.rules" shadow.rules
cat >bench.conf <<CONF
listener $port 127.0.0.1
allow_anonymous true
persistence false
user $(id -un)
log_dest file $work/bench-broker.log
CONF

pid=
trap '[ -z "$pid" ] || kill -9 $pid $(cat followers 2>/dev/null) 2>/dev/null || true' EXIT
: >followers
start() { # start plain|image
    : >bench-broker.log
    if [ "$1" = plain ]; then ./plain.bin -c bench.conf >/dev/null 2>&1 & else
        "$molt" run ./u1.so -c bench.conf >/dev/null 2>&1 & fi
    pid=$!
    for _ in $(seq 100); do grep -q running bench-broker.log 2>/dev/null && break; sleep 0.1; done
}
stop() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; }
rate() { # rate SECONDS: messages per second of one mqttload run
    python3 "$load" --port "$port" --retained 0 --duration "$1" | python3 -c \
        'import json,sys; r = json.loads(sys.stdin.read()); assert r["failed"] == 0, r; print(r["msg_per_s"])'
}
shadow() { # shadow IMAGE
    "$molt" update --shadow "$pid" "./$1" --rules shadow.rules --timeout 30 >/dev/null
    "$molt" status --json "$pid" | python3 -c 'import json,sys; print(json.load(sys.stdin)["shadow"]["follower"])' >>followers
}
field() { "$molt" status --json "$pid" | python3 -c 'import json,sys; print(json.load(sys.stdin)["shadow"][sys.argv[1]])' "$1"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo "== throughput: $rounds rounds of $secs s each (msg/s, every message checked)"
P=() O=() T=()
for r in $(seq "$rounds"); do
    start plain; p=$(rate "$secs"); stop
    start image; o=$(rate "$secs")
    shadow u1same.so
    t=$(rate "$secs")
    st=$(field stage) dv=$(field divergences)
    [ "$st" = shadowing ] && [ "$dv" = 0 ] || { echo "round $r: the shadow ended: $(field outcome)" >&2; exit 1; }
    "$molt" rollback "$pid" >/dev/null
    stop
    printf 'round %d: plain %.0f, one version %.0f, two versions %.0f msg/s (load average %s)\n' \
        "$r" "$p" "$o" "$t" "$(cut -d' ' -f1-3 /proc/loadavg)"
    P+=("$p") O+=("$o") T+=("$t")
done
mp=$(median "${P[@]}") mo=$(median "${O[@]}") mt=$(median "${T[@]}")
printf 'median: plain %.0f, one version %.0f (%.1f%% less), two versions %.0f msg/s (%.1f%% less than one version, %.1f%% less than plain)\n' \
    "$mp" "$mo" "$(echo "$mp $mo" | awk '{print 100 * ($1 - $2) / $1}')" "$mt" \
    "$(echo "$mo $mt" | awk '{print 100 * ($1 - $2) / $1}')" "$(echo "$mp $mt" | awk '{print 100 * ($1 - $2) / $1}')"

echo "== latency around molt update --shadow to deb12u2 with $retained retained messages"
for r in $(seq "$rounds"); do
    start image
    python3 "$load" --port "$port" --fill "$retained" >/dev/null
    rss=$(awk '/VmRSS/ {print int($2 / 1024)}' /proc/$pid/status)
    python3 "$load" --port "$port" --retained 0 --duration $((2 * secs)) --latency latency.txt >load.json &
    lp=$!
    sleep "$secs"
    t0=$(date +%s.%N)
    shadow u2.so
    t1=$(date +%s.%N)
    wait "$lp"
    python3 -c 'import json,sys; r = json.loads(open("load.json").read()); assert r["failed"] == 0, r'
    st=$(field stage) dv=$(field divergences) use=$(field ring_use_pct)
    "$molt" rollback "$pid" >/dev/null
    stop
    python3 - "$t0" "$t1" "$r" "$rss" "$st" "$dv" "$use" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import sys
t0, t1 = float(sys.argv[1]), float(sys.argv[2])
rows = [tuple(map(float, l.split())) for l in open("latency.txt")]
first = rows[0][0]
# before: from 1 s into the load to the update; after: from the update on
before = [ms for t, ms in rows if first + 1 <= t < t0]
after = [ms for t, ms in rows if t >= t0]
print("run %s: store %s MiB RSS; longest round trip: no update %.1f ms (%d messages), around the update "
      "%.1f ms (%d messages): %.2fx; molt update --shadow took %.0f ms; stage %s, %s divergences, "
      "ring use up to %s%% (load average %s)"
      % (sys.argv[3], sys.argv[4], max(before), len(before), max(after), len(after),
         max(after) / max(before), (t1 - t0) * 1000, sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8]))
PY
done
