#!/usr/bin/env bash
# memcached from Debian 12's source package as a program image, updated as a
# whole (full updates) again and again under a checking load.
#
#   examples/fullreal/run.sh [--updates N] [--threads T] [--keep] [--images-only]
#                            [--failures]
#
# Fetches memcached's source with `apt-get source` through a private apt
# configuration (scripts/apt-private.sh; the system's sources are not
# touched), applies memcached.patch (33 added, 15 removed lines in 8 files:
# update points with molt.h's helpers in the event loops and in the helper
# threads' waits, the one-time initialisation skipped when a thread
# resumes, two MOLT_PTRARRAY annotations), configures it with the plain
# compiler and builds it with `make CC="moltcc --molt-program"`.
# Then builds a chain of N identical rebuilds, each linked
# `--molt-from` the one before (the objects are compiled once), starts the
# first with `molt run`, puts examples/realworld/mcload.py on it (8
# connections, every reply checked) and runs the N updates one after the
# other.  Prints the pause of each update, p50/max, failed updates, failed
# requests, and the process's descriptors, threads and RSS before and
# after (and RSS per update over the second half of a run of 20 or more);
# exit status 0 only if every update and every request succeeded, every
# connection was kept and descriptors and threads are what they were.
# --images-only: build the images and stop (bench/fullupdate/memcached_p9.py).
# --failures: after the updates, failures.py forces failures on purpose (a
# faulting transformer, a thread that never arrives) and checks that each
# aborts with its cause named while the old version serves on.
#
# memcached runs with its defaults and -t T worker threads (default 4): the
# main thread, the workers, the logger, the LRU crawler and maintainer, the
# hash table expander and the slab rebalancer all take part.
#
# Environment: MOLT_FULLREAL_WORK (work directory outside the repository;
# default /var/tmp/molt-fullreal), MOLT_BUILD (molt build tree with
# bin/moltcc and bin/molt; default <repo>/build), MOLT_FULLREAL_PORT
# (default 27411).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${MOLT_FULLREAL_WORK:-/var/tmp/molt-fullreal}
MOLT_BUILD=${MOLT_BUILD:-$REPO/build}
PORT=${MOLT_FULLREAL_PORT:-27411}
UPDATES=20
THREADS=4
KEEP=0
IMAGES_ONLY=0
FAILURES=0
while [ $# -gt 0 ]; do
    case "$1" in
        --updates) UPDATES=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --images-only) IMAGES_ONLY=1; shift ;;
        --failures) FAILURES=1; shift ;;
        -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
case "$WORK" in "$REPO"|"$REPO"/*) echo "run.sh: MOLT_FULLREAL_WORK must be outside the repository" >&2; exit 2 ;; esac
MOLTCC=$MOLT_BUILD/bin/moltcc
MOLT=$MOLT_BUILD/bin/molt
[ -x "$MOLTCC" ] && [ -x "$MOLT" ] || { echo "run.sh: build molt first ($MOLT_BUILD)" >&2; exit 2; }
CC_IMAGE="$MOLTCC --molt-program"

cd "$WORK"
SRC=memcached-1.6.18
if [ ! -d "$SRC" ]; then
    echo "== apt-get source memcached"
    APT_CONFIG=$(MOLT_APT_DIR=$WORK/apt bash "$REPO/scripts/apt-private.sh")
    APT_CONFIG=$APT_CONFIG apt-get source -q memcached=1.6.18-1+deb12u1 >apt-source.log 2>&1 ||
        { cat apt-source.log >&2; exit 1; }
fi

echo "== patch, configure (plain compiler), make CC=\"moltcc --molt-program\""
rm -rf mc && cp -a "$SRC" mc
patch -d mc -p1 -s <"$HERE/memcached.patch"
(cd mc && ./configure --disable-extstore >../configure.log 2>&1) || { tail -20 configure.log >&2; exit 1; }
(cd mc && make -j"$(nproc)" memcached CC="$CC_IMAGE" >../make.log 2>&1) || { tail -30 make.log >&2; exit 1; }
cp mc/memcached img0.so
echo "== $UPDATES identical rebuilds, each linked --molt-from the one before"
for i in $(seq 1 "$UPDATES"); do
    rm -f mc/memcached
    (cd mc && make memcached CC="$CC_IMAGE" LDFLAGS="--molt-from $WORK/img$((i - 1)).so" \
        >../make-$i.log 2>&1) || { tail -30 "make-$i.log" >&2; exit 1; }
    cp mc/memcached "img$i.so"
done

if [ "$FAILURES" = 1 ]; then
    echo "== for --failures: one more link of the chain, and one with a faulting transformer (fault.xf)"
    last=$UPDATES
    for name in "img$((last + 1))" imgfault; do
        xf=(); [ "$name" = imgfault ] && xf=(--molt-xf "$HERE/fault.xf")
        rm -f mc/memcached
        (cd mc && make memcached CC="$CC_IMAGE" LDFLAGS="--molt-from $WORK/img$last.so ${xf[*]}" \
            >../make-$name.log 2>&1) || { tail -30 "make-$name.log" >&2; exit 1; }
        cp mc/memcached "$name.so"
    done
fi
[ "$IMAGES_ONLY" = 0 ] || { echo "images: $WORK/img0.so .. img$UPDATES.so"; exit 0; }

echo "== molt run img0.so; mcload; $UPDATES full updates"
"$MOLT" run ./img0.so -u "$(id -un)" -p "$PORT" -U 0 -l 127.0.0.1 -t "$THREADS" \
    >mc.out 2>mc.err &
PID=$!
cleanup() { kill "$PID" 2>/dev/null || true; rm -f stop; }
trap cleanup EXIT
for _ in $(seq 50); do
    python3 "$REPO/examples/realworld/mcload.py" --port "$PORT" --cmd version >/dev/null 2>&1 && break
    sleep 0.1
done
rm -f stop
python3 "$REPO/examples/realworld/mcload.py" --port "$PORT" --stop-file stop \
    --report load.json >load.out 2>&1 &
LOAD=$!
sleep 1
fds0=$(ls /proc/$PID/fd | wc -l)
rss0=$(awk '/VmRSS/ {print $2}' /proc/$PID/status)
: >pauses
: >per-update   # update, RSS KiB, descriptors, threads after each update
threads0=$(ls /proc/$PID/task | wc -l)
failed=0
for i in $(seq 1 "$UPDATES"); do
    if out=$("$MOLT" update "$PID" "./img$i.so" --timeout 10 2>&1); then
        echo "$out" | sed -n 's/.*pause \([0-9.]*\) ms.*/\1/p' >>pauses
        echo "$i $(awk '/VmRSS/ {print $2}' /proc/$PID/status) $(ls /proc/$PID/fd | wc -l) $(ls /proc/$PID/task | wc -l)" >>per-update
    else
        failed=$((failed + 1))
        echo "update $i failed: $out"
        kill -0 "$PID" 2>/dev/null || { echo "the server died"; break; }
    fi
    sleep 0.3
done
if [ "$FAILURES" = 1 ] && kill -0 "$PID" 2>/dev/null; then
    echo "== failures forced on purpose, under the same load"
    python3 "$HERE/failures.py" "$MOLT" "$PID" "./img$((UPDATES + 1)).so" ./imgfault.so ||
        failed=$((failed + 1))
fi
sleep 1
fds1=$(ls /proc/$PID/fd 2>/dev/null | wc -l)
rss1=$(awk '/VmRSS/ {print $2}' /proc/$PID/status 2>/dev/null || echo 0)
threads1=$(ls /proc/$PID/task 2>/dev/null | wc -l)
touch stop
load_rc=0
wait "$LOAD" || load_rc=$?
tail -1 load.out
python3 - "$UPDATES" "$failed" "$fds0" "$fds1" "$rss0" "$rss1" "$threads0" "$threads1" <<'EOF'
import statistics, sys
n, failed, fds0, fds1, rss0, rss1, th0, th1 = map(int, sys.argv[1:])
p = [float(x) for x in open("pauses").read().split()]
print("updates: %d, failed: %d" % (n, failed))
if p:
    print("pause ms: p50 %.3f, max %.3f, min %.3f" % (statistics.median(p), max(p), min(p)))
print("fds: %d -> %d, RSS: %d -> %d KiB, threads: %d -> %d" % (fds0, fds1, rss0, rss1, th0, th1))
rows = [list(map(int, l.split())) for l in open("per-update")]
if len(rows) >= 20:
    # RSS growth per update over the second half of the run (the first
    # updates also fault in pages the load touches for the first time)
    half = rows[len(rows) // 2:]
    slope = (half[-1][1] - half[0][1]) / max(1, half[-1][0] - half[0][0])
    print("RSS after update %d: %d KiB, after update %d: %d KiB (%.1f KiB per update over the second half)"
          % (half[0][0], half[0][1], half[-1][0], half[-1][1], slope))
EOF
[ "$KEEP" = 1 ] || rm -f img*.so
[ "$failed" = 0 ] && [ "$load_rc" = 0 ] && [ "$fds0" = "$fds1" ] && [ "$threads0" = "$threads1" ]
