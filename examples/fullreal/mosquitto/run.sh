#!/usr/bin/env bash
# A real version pair that changes a type, updated as a whole under load:
# the MQTT broker mosquitto from Debian 12, security update 2.0.11-1.2+deb12u1
# -> 2.0.11-1.2+deb12u2, whose CVE-2024-8376 fix splits the broker's one
# subscription tree `db.subs` (struct mosquitto_db) into `normal_subs` and a
# new `shared_subs`.
#
#   examples/fullreal/mosquitto/run.sh [--rounds N] [--abort] [--keep] [--images-only]
#
# Fetches mosquitto's source with `apt-get source` through a private apt
# configuration (../lib.sh, scripts/apt-private.sh).  deb12u1 is that
# package with only the patches deb12u1 had (debian/patches/series up to
# CVE-2023-28366-regression.patch; +deb12u2 added the rest, its changelog
# says which); deb12u2 is the package as Debian builds it.  Both get
# mosquitto.patch (2 files, 9 added and 1 removed lines: the update point,
# the start-up skipped when main resumes, the configuration at file scope)
# and are built with `make -C src CC="moltcc --molt-program"` (TLS,
# websockets, cJSON and docs off: no build dependencies); deb12u2 is linked
# `--molt-from` deb12u1's image with deb12u2.xf (the field renamed, the
# shared subscriptions moved to the new field's tree).
# Then, N rounds (default 20), each on a fresh broker: `molt run` deb12u1
# on 127.0.0.1, mqttload.py on it (100 retained messages published first;
# 8 clients each subscribed to its own topic, publishing QoS 1 messages
# that must be PUBACKed and come back exactly once, in order, with their
# payload) and a shared subscription ($share/molt/pre/t) held by one more
# client, `molt update` to deb12u2 under that load, then checks that the
# change is live: in the first round gdb reads the running broker's `db`
# (before: `db.subs`; after: `db.normal_subs`, the same tree carried
# across, and `db.shared_subs`, holding the shared subscription moved
# there by deb12u2.xf); then that subscription must get a message exactly
# once and, after its UNSUBSCRIBE, none (the new code removes it from
# `shared_subs`), and a shared subscription made after the update must work.  At the end of each round every
# client must have kept its connection and every retained message must be
# there for a fresh client.  Prints each round's pause, p50/max, messages
# and failures; exit status 0 only if every update, message and check
# succeeded and descriptors are what they were.
# --abort: in the first round, before the real update, one that must
# abort: deb12u2 linked with deb12u2.xf plus a fault at the end of its
# variable rule (after the rule has moved the shared subscription with
# MOLT_XF_STORE).  It must fail naming the rule, and the old version must
# serve on with its tree exactly as it was (gdb: the shared subscription
# back in `db.subs`); the real update and its checks follow.
# --images-only: build the two images and stop.
#
# Environment: MOLT_FULLREAL_WORK (work directory outside the repository;
# default /var/tmp/molt-fullreal-mosquitto), MOLT_BUILD (molt build tree
# with bin/moltcc and bin/molt; default <repo>/build), MOLT_FULLREAL_PORT
# (the broker's port, default 27541).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
WORK=${MOLT_FULLREAL_WORK:-/var/tmp/molt-fullreal-mosquitto}
MOLT_BUILD=${MOLT_BUILD:-$REPO/build}
PORT=${MOLT_FULLREAL_PORT:-27541}
ROUNDS=20
KEEP=0
IMAGES_ONLY=0
ABORT=0
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS=$2; shift 2 ;;
        --abort) ABORT=1; shift ;;
        --keep) KEEP=1; shift ;;
        --images-only) IMAGES_ONLY=1; shift ;;
        -h|--help) sed -n '2,47p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
# shellcheck source=../lib.sh
. "$HERE/../lib.sh"
fullreal_prepare
LOAD=$HERE/mqttload.py
# Debian builds with TLS, websockets and cJSON; left out here so that the
# build needs nothing beyond a C compiler (the code the update changes is
# the same).
MAKE_OPTS=(WITH_TLS=no WITH_CJSON=no WITH_DOCS=no WITH_WEBSOCKETS=no WITH_SRV=no WITH_SYSTEMD=no)

cd "$WORK"
DSC=mosquitto_2.0.11-1.2+deb12u2.dsc
fullreal_fetch mosquitto 2.0.11-1.2+deb12u2 mosquitto-2.0.11

if [ ! -f u1.so ] || [ ! -f u2.so ] || [ "$HERE/mosquitto.patch" -nt u1.so ] || [ "$HERE/deb12u2.xf" -nt u2.so ] ||
   [ "$HERE/run.sh" -nt u2.so ]; then
    echo "== deb12u1: the source package with deb12u1's patches only; its image u1.so"
    rm -rf u1 u2
    dpkg-source -x --skip-patches "$DSC" u1 >dpkg-source.log 2>&1 || { cat dpkg-source.log >&2; exit 1; }
    for p in $(sed -n '1,/^CVE-2023-28366-regression.patch$/p' u1/debian/patches/series); do
        patch -d u1 -p1 -s <"u1/debian/patches/$p"
    done
    patch -d u1 -p1 -s <"$HERE/mosquitto.patch"
    (cd u1 && make -C src mosquitto -j"$(nproc)" CC="$MOLTCC --molt-program" "${MAKE_OPTS[@]}" >../make-u1.log 2>&1) ||
        { tail -30 make-u1.log >&2; exit 1; }
    cp u1/src/mosquitto u1.so
    echo "== deb12u2 as Debian builds it (apt-get source applied its whole series), linked --molt-from u1.so with deb12u2.xf; its image u2.so"
    # a full build: objects of deb12u1's tree would not do, since several
    # include mosquitto_broker_internal.h without their make rule saying so
    # (a stale one keeps the old layout of struct mosquitto_db)
    cp -a mosquitto-2.0.11 u2
    patch -d u2 -p1 -s <"$HERE/mosquitto.patch"
    (cd u2 && make -C src mosquitto -j"$(nproc)" CC="$MOLTCC --molt-program" "${MAKE_OPTS[@]}" \
        LDFLAGS="--molt-from $WORK/u1.so --molt-xf $HERE/deb12u2.xf" >../make-u2.log 2>&1) ||
        { grep -v 'note: not migrated' make-u2.log | tail -30 >&2; exit 1; }
    cp u2/src/mosquitto u2.so
fi
if [ "$ABORT" = 1 ] && { [ ! -f u2fault.so ] || [ u2.so -nt u2fault.so ]; }; then
    echo "== deb12u2 with a transformer that faults after its stores; its image u2fault.so"
    { sed '$ d' "$HERE/deb12u2.xf"
      echo '  { volatile long *wild = (volatile long *)16; (void)*wild; } /* run.sh --abort */'
      echo '}'; } >fault.xf
    rm -f u2/src/mosquitto
    (cd u2 && make -C src mosquitto CC="$MOLTCC --molt-program" "${MAKE_OPTS[@]}" \
        LDFLAGS="--molt-from $WORK/u1.so --molt-xf $WORK/fault.xf" >../make-u2fault.log 2>&1) ||
        { grep -v 'note: not migrated' make-u2fault.log | tail -30 >&2; exit 1; }
    cp u2/src/mosquitto u2fault.so
fi
[ "$IMAGES_ONLY" = 0 ] || { echo "images: $WORK/u1.so $WORK/u2.so"; exit 0; }

cat >mosquitto.conf <<CONF
listener $PORT 127.0.0.1
allow_anonymous true
persistence false
user $(id -un)
log_dest file $WORK/mosquitto.log
CONF

# peek PID IMAGE EXPR...: prints EXPRs evaluated by gdb in the running
# broker, with the symbols of IMAGE (loaded by molt from a memfd named
# after it) at the address where it is mapped.
peek() {
    local pid=$1 image=$2 base
    shift 2
    base=$(awk -v m="/memfd:$image" '$6 == m && $3 == "00000000" { split($1, a, "-"); print "0x" a[1]; exit }' \
        "/proc/$pid/maps")
    local args=(-batch -p "$pid" -ex "add-symbol-file $WORK/$image -o $base")
    for e in "$@"; do args+=(-ex "print $e"); done
    gdb "${args[@]}" 2>/dev/null | grep '^\$' || true
}

PID=
cleanup() { [ -z "$PID" ] || kill "$PID" 2>/dev/null || true; rm -f stop; }
trap cleanup EXIT
: >pauses
: >per-update
failed=0
messages=0
for round in $(seq 1 "$ROUNDS"); do
    : >mosquitto.log
    "$MOLT" run ./u1.so -c mosquitto.conf >mosquitto.out 2>mosquitto.err &
    PID=$!
    for _ in $(seq 50); do
        grep -q running mosquitto.log 2>/dev/null && break
        sleep 0.1
    done
    fds0=$(ls /proc/$PID/fd | wc -l)
    rm -f stop go
    # a shared subscription made before the update, checked after it
    python3 "$LOAD" --port "$PORT" --shared-hold go >hold.out 2>&1 &
    HOLDPID=$!
    for _ in $(seq 50); do
        grep -q subscribed hold.out 2>/dev/null && break
        sleep 0.1
    done
    python3 "$LOAD" --port "$PORT" --stop-file stop --retained 100 --report load.json >load.out 2>&1 &
    LOADPID=$!
    sleep 1
    before=
    [ "$round" != 1 ] || before=$(peek "$PID" u1.so 'db.subs')
    if [ "$ABORT" = 1 ] && [ "$round" = 1 ]; then
        tree=$(peek "$PID" u1.so 'db.subs->children->children->children->shared->name')
        if out=$("$MOLT" update "$PID" ./u2fault.so --timeout 10 2>&1); then
            failed=$((failed + 1)); echo "faulting transformer: the update succeeded: $out"
        else
            echo "faulting transformer: $out"
            case "$out" in *"variable rule db -> db"*SIGSEGV*) ;; *) failed=$((failed + 1)) ;; esac
        fi
        after=$(peek "$PID" u1.so 'db.subs' 'db.subs->children->children->children->shared->name')
        echo "gdb, after the abort: $(echo "$after" | tr '\n' ' ')"
        if [ "$(echo "$after" | sed -n '1s/.*) //p')" = "$(echo "$before" | sed -n 's/.*) //p')" ] &&
           [ -n "$tree" ] && [ "${tree#* = }" = "$(echo "$after" | sed -n '2s/^[^=]*= //p')" ] &&
           kill -0 "$PID" 2>/dev/null; then
            echo "the old version serves on, its shared subscription back where it was"
        else
            failed=$((failed + 1)); echo "after the abort, the old tree is not as it was (before: $tree)"
        fi
    fi
    if out=$("$MOLT" update "$PID" ./u2.so --timeout 10 2>&1); then
        echo "$out" | sed -n 's/.*pause \([0-9.]*\) ms.*/\1/p' >>pauses
        echo "round $round: $out"
    else
        failed=$((failed + 1))
        echo "round $round: update failed: $out"
    fi
    if [ "$round" = 1 ]; then
        after=$(peek "$PID" u2.so 'db.normal_subs' 'db.shared_subs' 'db.shared_subs->topic' \
            'db.shared_subs->children->children->topic' \
            'db.shared_subs->children->children->children->shared->name')
        echo "gdb, before the update: ${before:-(nothing)}"
        echo "gdb, after the update:"
        echo "$after" | sed 's/^/    /'
        # the normal tree is the one the old version built (the same
        # pointer); the new field holds the shared tree: its root "", and
        # the subscription $share/molt/pre/t made before the update, moved
        old_tree=$(echo "$before" | sed -n 's/.*) \(0x[0-9a-f]*\)$/\1/p')
        new_tree=$(echo "$after" | sed -n '1s/.*) \(0x[0-9a-f]*\)$/\1/p')
        shared=$(echo "$after" | sed -n '2s/.*) \(0x[0-9a-f]*\)$/\1/p')
        names=$(echo "$after" | sed -n '3,5s/.* "\(.*\)"$/\1/p' | tr '\n' ' ')
        if [ -n "$old_tree" ] && [ "$old_tree" = "$new_tree" ] && [ -n "$shared" ] &&
           [ "$shared" != 0x0 ] && [ "$names" = " pre molt " ]; then
            echo "the change is live: db.normal_subs is the old db.subs;" \
                "db.shared_subs holds \$share/molt/pre/t"
        else
            echo "the change is NOT seen in the running broker"; failed=$((failed + 1))
        fi
    fi
    touch go
    if wait "$HOLDPID"; then
        [ "$round" != 1 ] || tail -1 hold.out
    else
        failed=$((failed + 1)); echo "round $round: $(tail -1 hold.out)"
    fi
    if ! python3 "$LOAD" --port "$PORT" --shared >shared.out 2>&1; then
        failed=$((failed + 1)); echo "round $round: $(cat shared.out)"
    fi
    [ "$round" != 1 ] || cat shared.out
    sleep 1
    touch stop
    load_rc=0
    wait "$LOADPID" || load_rc=$?
    [ "$load_rc" = 0 ] || { failed=$((failed + 1)); echo "round $round: load failed: $(cat load.out)"; }
    messages=$((messages + $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["messages"])' load.json 2>/dev/null || echo 0)))
    [ "$round" != 1 ] || tail -1 load.out
    sleep 0.3
    fds1=$(ls /proc/$PID/fd 2>/dev/null | wc -l)
    echo "$round $(awk '/VmRSS/ {print $2}' /proc/$PID/status 2>/dev/null || echo 0) $fds1 1" >>per-update
    [ "$fds0" = "$fds1" ] || { failed=$((failed + 1)); echo "round $round: descriptors $fds0 -> $fds1"; }
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    PID=
done
echo "rounds: $ROUNDS, messages checked: $messages, failed: $failed"
python3 - <<'PY'
import statistics
p = [float(x) for x in open("pauses").read().split()]
if p:
    print("pause ms over %d updates deb12u1 -> deb12u2: p50 %.3f, max %.3f, min %.3f"
          % (len(p), statistics.median(p), max(p), min(p)))
PY
# deb12u1's built tree stays: shadow.sh links its variants from its objects
[ "$KEEP" = 1 ] || rm -rf u2
[ "$failed" = 0 ] && [ "$(wc -l <pauses)" = "$ROUNDS" ]
