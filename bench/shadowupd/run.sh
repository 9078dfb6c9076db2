#!/usr/bin/env bash
# bench/shadowupd/run.sh [ROUNDS] [SECONDS] -- the cost of a shadowed update
# (docs/design.md §17) on tests/shadowupd/progs/kvs.c (each worker accepts
# and serves its own connections; examples/kvfull/shadow.py shadows kvfull,
# whose acceptor hands them to workers): throughput under `molt run` with
# no shadow, and while a follower of a shadowed update to the same version
# (kvs rebuilt --molt-from itself) replays every call.  The two
# alternate: each round measures SECONDS without a shadow, starts one
# (molt update --shadow), measures SECONDS, ends it (molt rollback).  Prints
# each round and the medians.  A first look, not P10 yet: no plots, no
# update latency, no two-version run with rules.
#
# Environment: MOLT_BUILD (default build/ of this tree: a plain build,
# no sanitizers), WORK (default /tmp/molt-bench-shadowupd), CONNS (default
# 3) and WORKERS (default 4: kvs serves one connection per worker at a
# time, so CONNS must stay below WORKERS).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$(dirname "$here")")"
rounds=${1:-5}
secs=${2:-3}
build=${MOLT_BUILD:-$root/build}
work=${WORK:-/tmp/molt-bench-shadowupd}
conns=${CONNS:-3}
workers=${WORKERS:-4}
molt=$build/bin/molt
moltcc=$build/bin/moltcc
kvs=$root/tests/shadowupd/progs/kvs.c
mkdir -p "$work"
gcc -O2 -pthread -o "$work/kvsload" "$here/kvsload.c"
"$moltcc" --molt-program -O2 -g -o "$work/v1.so" "$kvs"
"$moltcc" --molt-program -O2 -g -o "$work/v1b.so" "$kvs" --molt-from "$work/v1.so"
rm -f "$work/port"
"$molt" run "$work/v1.so" "$work/port" $workers 2>"$work/server.log" &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
port=$(cat "$work/port")
tput() { "$work/kvsload" $port $conns $secs | awk '{print $2 / $4}'; }
base=() shad=()
for r in $(seq "$rounds"); do
  b=$(tput)
  "$molt" update --shadow $pid "$work/v1b.so" >/dev/null
  s=$(tput)
  st=$("$molt" status $pid | grep '^shadowed update')
  "$molt" rollback $pid >/dev/null
  case "$st" in *shadowing*) ;; *) echo "round $r: the shadow ended early: $st" >&2; exit 1 ;; esac
  printf 'round %d: no shadow %.0f req/s, shadowing %.0f req/s (%s)\n' "$r" "$b" "$s" \
    "$(echo "$st" | grep -o '[0-9]* calls recorded, [0-9]* compared, ring use up to [0-9]*%')"
  base+=("$b") shad+=("$s")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
mb=$(median "${base[@]}") ms=$(median "${shad[@]}")
printf 'median: no shadow %.0f req/s, shadowing %.0f req/s: %.1f%% less (load average %s)\n' \
  "$mb" "$ms" "$(echo "$mb $ms" | awk '{print 100 * ($1 - $2) / $1}')" "$(cut -d' ' -f1-3 /proc/loadavg)"
