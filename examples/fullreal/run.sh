#!/usr/bin/env bash
# memcached from Debian 12's source package as a program image, updated as a
# whole (full updates) again and again under a checking load.
#
#   examples/fullreal/run.sh [--updates N] [--threads T] [--keep] [--images-only]
#                            [--failures]
#
# Fetches memcached's source with `apt-get source` through a private apt
# configuration (scripts/apt-private.sh; the system's sources are not
# touched), applies memcached.patch (34 added, 15 removed lines in 8 files:
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
# shellcheck source=lib.sh
. "$HERE/lib.sh"
fullreal_prepare
CC_IMAGE="$MOLTCC --molt-program"

cd "$WORK"
SRC=memcached-1.6.18
fullreal_fetch memcached 1.6.18-1+deb12u1 "$SRC"

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
# The baseline once mcload's 8 connections are all accepted (on a loaded
# machine 1 s was not always enough: the later count then had 8 more).
for _ in $(seq 300); do
    [ "$(ss -Htn state established "( sport = :$PORT )" | wc -l)" -ge 8 ] && break
    sleep 0.1
done
sleep 1
fds0=$(ls /proc/$PID/fd | wc -l)
rss0=$(awk '/VmRSS/ {print $2}' /proc/$PID/status)
threads0=$(ls /proc/$PID/task | wc -l)
fullreal_updates "$PID" "$UPDATES"
failed=$fullreal_failed
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
fullreal_summary "$UPDATES" "$failed" "$fds0" "$fds1" "$rss0" "$rss1" "$threads0" "$threads1"
[ "$KEEP" = 1 ] || rm -f img*.so
[ "$failed" = 0 ] && [ "$load_rc" = 0 ] && [ "$fds0" = "$fds1" ] && [ "$threads0" = "$threads1" ]
