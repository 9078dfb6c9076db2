#!/usr/bin/env bash
# tinyproxy from Debian 12's source package as a program image, updated as a
# whole (full updates) again and again under a checking load.
#
#   examples/fullreal/tinyproxy/run.sh [--updates N] [--keep] [--images-only]
#                                      [--failures] [--pair]
#
# Fetches tinyproxy's source with `apt-get source` through a private apt
# configuration (../lib.sh, scripts/apt-private.sh; the system's sources are
# not touched), applies tinyproxy.patch (3 files, 25 added and 5 removed
# lines: the update point and molt_update_fd() in the accept loop's poll
# and in the relay loop's, the start-up skipped when the main thread
# resumes, a connection's thread resumed relaying after an update),
# configures it with the
# plain compiler and builds it with `make CC="moltcc --molt-program"`.
# Then builds a chain of N identical rebuilds, each linked `--molt-from` the
# one before (the objects are compiled once), starts the first with `molt
# run` as a forward proxy on 127.0.0.1 in front of examples/fixes/common/
# origin.py, puts examples/fixes/common/httpload.py on it (8 clients, a new
# connection per request, every reply's status and body checked) and runs
# the N updates one after the other.  Prints the pause of each update,
# p50/max, failed updates, failed requests, and the process's descriptors,
# threads and RSS before and after (measured with the load stopped: the
# proxy has a thread and a descriptor or two per connection in flight);
# exit status 0 only if every update and every request succeeded and
# descriptors and threads are what they were.
# --images-only: build the images and stop.
# --failures: after the updates, under the same load, a CONNECT tunnel
# (tunnel.py) through the proxy to the origin is opened and used, an update
# runs while it is open (its thread relays in relay_connection, which has
# an update point and polls molt_update_fd(): the thread restarts in the
# new version and resumes relaying) and the tunnel must carry a second
# request, right, afterwards.  Then a client connects and sends nothing:
# its connection thread waits in read(), where it has no update point, so
# `molt update --timeout 2` must fail naming that thread (its entry
# function child_thread) while the old version serves on; once the client
# closes, the same update must succeed.
# --pair: instead of the series, the real version pair: tinyproxy as it was
# before Debian's security update (1.11.1-2.1: the package's patches
# skipped) is updated under the load to 1.11.1-2.1+deb12u1 (its two fixes,
# CVE-2022-40468 and CVE-2023-49606; code only, no type changes); then a
# request with `Connection: Connection` (CVE-2023-49606: a double free that
# aborts the old version) must get its reply with the server alive.
#
# Environment: MOLT_FULLREAL_WORK (work directory outside the repository;
# default /var/tmp/molt-fullreal-tinyproxy), MOLT_BUILD (molt build tree
# with bin/moltcc and bin/molt; default <repo>/build), MOLT_FULLREAL_PORT
# (the proxy's port, default 27531; the origin listens on the one below).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
WORK=${MOLT_FULLREAL_WORK:-/var/tmp/molt-fullreal-tinyproxy}
MOLT_BUILD=${MOLT_BUILD:-$REPO/build}
PORT=${MOLT_FULLREAL_PORT:-27531}
ORIGIN=$((PORT - 1))
UPDATES=20
KEEP=0
IMAGES_ONLY=0
FAILURES=0
PAIR=0
while [ $# -gt 0 ]; do
    case "$1" in
        --updates) UPDATES=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --images-only) IMAGES_ONLY=1; shift ;;
        --failures) FAILURES=1; shift ;;
        --pair) PAIR=1; UPDATES=0; shift ;;
        -h|--help) sed -n '2,48p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
# shellcheck source=../lib.sh
. "$HERE/../lib.sh"
fullreal_prepare
CC_IMAGE="$MOLTCC --molt-program"
COMMON=$REPO/examples/fixes/common   # origin.py and httpload.py, shared with examples/fixes

cd "$WORK"
SRC=tinyproxy-1.11.1
fullreal_fetch tinyproxy 1.11.1-2.1+deb12u1 "$SRC"

echo "== patch, configure (plain compiler), make CC=\"moltcc --molt-program\""
rm -rf tp && cp -a "$SRC" tp
patch -d tp -p1 -s <"$HERE/tinyproxy.patch"
(cd tp && ./configure >../configure.log 2>&1) || { tail -20 configure.log >&2; exit 1; }
(cd tp && make -j"$(nproc)" CC="$CC_IMAGE" >../make.log 2>&1) || { tail -30 make.log >&2; exit 1; }
cp tp/src/tinyproxy img0.so
echo "== $UPDATES identical rebuilds, each linked --molt-from the one before"
LAST=$UPDATES; [ "$FAILURES" = 0 ] || LAST=$((UPDATES + 2))  # two more for --failures
for i in $(seq 1 "$LAST"); do
    rm -f tp/src/tinyproxy
    (cd tp/src && make tinyproxy CC="$CC_IMAGE" LDFLAGS="--molt-from $WORK/img$((i - 1)).so" \
        >../../make-$i.log 2>&1) || { tail -30 "make-$i.log" >&2; exit 1; }
    cp tp/src/tinyproxy "img$i.so"
done
if [ "$PAIR" = 1 ]; then
    echo "== the version before the security update (the package's patches skipped), its image pre.so"
    rm -rf pre
    dpkg-source -x --skip-patches tinyproxy_1.11.1-2.1+deb12u1.dsc pre >dpkg-source.log 2>&1 ||
        { cat dpkg-source.log >&2; exit 1; }
    patch -d pre -p1 -s <"$HERE/tinyproxy.patch"
    (cd pre && ./configure >../configure-pre.log 2>&1) || { tail -20 configure-pre.log >&2; exit 1; }
    (cd pre && make -j"$(nproc)" CC="$CC_IMAGE" >../make-pre.log 2>&1) || { tail -30 make-pre.log >&2; exit 1; }
    cp pre/src/tinyproxy pre.so
    echo "== the security update (+deb12u1) linked --molt-from pre.so"
    rm -f tp/src/tinyproxy
    (cd tp/src && make tinyproxy CC="$CC_IMAGE" LDFLAGS="--molt-from $WORK/pre.so" >../../make-pair.log 2>&1) ||
        { tail -30 make-pair.log >&2; exit 1; }
    cp tp/src/tinyproxy img1.so
    cp pre.so img0.so
    UPDATES=1 FAILURES=0
fi
[ "$IMAGES_ONLY" = 0 ] || { echo "images: $WORK/img0.so .. img$UPDATES.so"; exit 0; }

echo "== origin.py, molt run img0.so (a forward proxy), httpload; $UPDATES full updates"
[ -f files/f63.txt ] || python3 "$COMMON/httpload.py" --write-files files
cat >tinyproxy.conf <<CONF
User $(id -un)
Group $(id -gn)
Port $PORT
Listen 127.0.0.1
Timeout 60
MaxClients 200
LogLevel Warning
LogFile "$WORK/tinyproxy.log"
Allow 127.0.0.1
CONF
python3 "$COMMON/origin.py" --port "$ORIGIN" --dir files >origin.log 2>&1 &
ORIGIN_PID=$!
"$MOLT" run ./img0.so -d -c tinyproxy.conf >tinyproxy.out 2>tinyproxy.err &
PID=$!
cleanup() { kill "$PID" "$ORIGIN_PID" 2>/dev/null || true; rm -f stop; }
trap cleanup EXIT
for _ in $(seq 50); do
    python3 "$COMMON/httpload.py" --port "$PORT" --proxy --origin-port "$ORIGIN" --conns 1 \
        --duration 0.2 >/dev/null 2>&1 && break
    sleep 0.2
done
sleep 0.5
fds0=$(ls /proc/$PID/fd | wc -l)
threads0=$(ls /proc/$PID/task | wc -l)
rm -f stop
python3 "$COMMON/httpload.py" --port "$PORT" --proxy --origin-port "$ORIGIN" --conns 8 \
    --stop-file stop --report load.json >load.out 2>&1 &
LOAD=$!
sleep 1
rss0=$(awk '/VmRSS/ {print $2}' /proc/$PID/status)
fullreal_updates "$PID" "$UPDATES"
failed=$fullreal_failed
if [ "$FAILURES" = 1 ] && kill -0 "$PID" 2>/dev/null; then
    echo "== a CONNECT tunnel kept open across an update, under the same load"
    rm -f tunnel-go
    python3 "$HERE/tunnel.py" "$PORT" "$ORIGIN" files/f7.txt tunnel-go >tunnel.out 2>&1 &
    TUNNEL=$!
    for _ in $(seq 100); do grep -q '^open$' tunnel.out && break; sleep 0.1; done
    if ! grep -q '^open$' tunnel.out; then
        echo "the tunnel did not open: $(cat tunnel.out)"; failed=$((failed + 1))
    elif out=$("$MOLT" update "$PID" "./img$((UPDATES + 1)).so" --timeout 10 2>&1); then
        echo "tunnel open, update: $out"
    else
        echo "tunnel open, the update failed: $out"; failed=$((failed + 1))
    fi
    touch tunnel-go
    tunnel_rc=0
    wait "$TUNNEL" || tunnel_rc=$?
    sed 's/^/tunnel: /' tunnel.out
    [ "$tunnel_rc" = 0 ] || { echo "the tunnel failed across the update"; failed=$((failed + 1)); }
    echo "== a connection that sends nothing, under the same load"
    exec 9<>"/dev/tcp/127.0.0.1/$PORT"
    sleep 0.3
    t0=$(date +%s.%N)
    if out=$("$MOLT" update "$PID" "./img$LAST.so" --timeout 2 2>&1); then
        echo "idle connection: the update succeeded, expected a timeout: $out"; failed=$((failed + 1))
    else
        echo "idle connection: $(python3 -c "import sys; print('%.2f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$t0" "$(date +%s.%N)") s: $out"
        case "$out" in *"did not reach an update point"*"started in child_thread"*) ;; *) failed=$((failed + 1)) ;; esac
    fi
    exec 9>&-
    sleep 0.5
    if out=$("$MOLT" update "$PID" "./img$LAST.so" --timeout 10 2>&1); then
        echo "client gone, the same update: $out"
    else
        echo "client gone, the same update failed: $out"; failed=$((failed + 1))
    fi
fi
if [ "$PAIR" = 1 ] && kill -0 "$PID" 2>/dev/null; then
    echo "== CVE-2023-49606 (Connection: Connection) after the update"
    reply=$(python3 "$COMMON/rawreq.py" 127.0.0.1 "$PORT" \
        "GET http://127.0.0.1:$ORIGIN/f1.txt HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nConnection: Connection\\r\\n\\r\\n" 3 | head -1)
    sleep 0.5
    if kill -0 "$PID" 2>/dev/null; then alive="server alive"; else alive="server died"; fi
    echo "reply: ${reply%$'\r'}, $alive"
    case "$reply $alive" in "HTTP/1."?" 200 "*"server alive") ;; *) failed=$((failed + 1)) ;; esac
fi
rss1=$(awk '/VmRSS/ {print $2}' /proc/$PID/status 2>/dev/null || echo 0)
touch stop
load_rc=0
wait "$LOAD" || load_rc=$?
sleep 1   # the threads of the last connections finish
fds1=$(ls /proc/$PID/fd 2>/dev/null | wc -l)
threads1=$(ls /proc/$PID/task 2>/dev/null | wc -l)
tail -1 load.out
fullreal_summary "$UPDATES" "$failed" "$fds0" "$fds1" "$rss0" "$rss1" "$threads0" "$threads1"
[ "$KEEP" = 1 ] || rm -f img*.so
[ "$failed" = 0 ] && [ "$load_rc" = 0 ] && [ "$fds0" = "$fds1" ] && [ "$threads0" = "$threads1" ]
