#!/usr/bin/env bash
# Shadowed updates (docs/design.md §17, `molt update --shadow`) of a real
# server: the MQTT broker mosquitto 2.0.11 from Debian's source package, the
# program image run.sh builds (deb12u1, and deb12u2 linked --molt-from it
# with deb12u2.xf), serving mqttload's checking load the whole time on one
# broker:
#
#   examples/fullreal/mosquitto/shadow.sh [--seconds S] [--images-only]
#
#  1. self: a shadow of deb12u1 by itself (its objects linked again with
#     --molt-from u1.so: u1same.so) for S seconds (default 60) while 8
#     clients publish and get back QoS 1 messages and a fresh client
#     connects every second, gets the 100 retained messages and leaves:
#     0 divergences, the follower caught up, then `molt rollback`.
#  2. a deliberately different version (u1odd.so: deb12u1 with odd.patch,
#     3 lines: a PUBLISH to `molt/odd` is acked with another packet id, one
#     to `molt/crash` crashes): a PUBLISH to molt/odd must be a divergence
#     with both sides logged, the follower ended and the client acked
#     correctly by the leader; a second shadow and a PUBLISH to molt/crash
#     must end the follower by its signal, the leader serving on; then
#     deb12u2 with a transformer that faults after its stores (run.sh
#     --abort's u2fault.so): the follower's migration fails, named, and the
#     leader, whose tree the follower's rule never touched, serves on.
#  3. the real pair deb12u1 -> deb12u2 (deb12u2.xf moves the shared
#     subscriptions to the new tree): a shadow, `molt promote` (deb12u2
#     leads, deb12u1 follows), fresh clients served by deb12u2, `molt
#     rollback` (deb12u1 leads again); then a shadow, promote and `molt
#     commit`: the broker runs deb12u2 in place (status: u2.so), and a
#     shared subscription ($share/...) made then works.
#  4. a broker with persistence and autosave: its saves are file writes
#     no rule covers; a shadow must end at the follower's first save,
#     naming the call and the file (unlink of mosquitto.db.new), and the
#     leader must save on.
# Every shadow runs under shadow.rules (`forward write file drop`: the
# broker's log, which libc writes with fprintf, is the leader's to write).
# At the end the load must have lost, repeated or changed no message, kept
# its 8 connections and the 100 retained messages, and the broker's
# descriptors must be what they were.  Exit status 0 only then.
#
# --seconds S: the self-shadow's length (the ctest shadowupd_mosquitto
# uses 8).  --images-only: build the five images and stop
# (bench/shadowupd/mosquitto.sh uses them).  Environment as run.sh's: MOLT_FULLREAL_WORK (default
# /var/tmp/molt-fullreal-mosquitto), MOLT_BUILD, MOLT_FULLREAL_PORT.  The
# images u1.so and u2.so come from run.sh --images-only (built once per work
# directory); u1same.so and u1odd.so are linked here from run.sh's
# deb12u1 tree.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
WORK=${MOLT_FULLREAL_WORK:-/var/tmp/molt-fullreal-mosquitto}
MOLT_BUILD=${MOLT_BUILD:-$REPO/build}
PORT=${MOLT_FULLREAL_PORT:-27541}
SECONDS_SELF=60
IMAGES_ONLY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) SECONDS_SELF=$2; shift 2 ;;
        --images-only) IMAGES_ONLY=1; shift ;;
        -h|--help) sed -n '2,46p' "$0"; exit 0 ;;
        *) echo "shadow.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
# shellcheck source=../lib.sh
. "$HERE/../lib.sh"
fullreal_prepare
LOAD=$HERE/mqttload.py
MAKE_OPTS=(WITH_TLS=no WITH_CJSON=no WITH_DOCS=no WITH_WEBSOCKETS=no WITH_SRV=no WITH_SYSTEMD=no)

# u1.so, u2.so, u2fault.so and deb12u1's built tree u1/ (run.sh keeps it
# for this); everything again if a piece is missing
{ [ -d "$WORK/u1/src" ] && { [ -f "$WORK/u2fault.so" ] || [ -d "$WORK/u2/src" ]; }; } || rm -f "$WORK/u1.so"
MOLT_FULLREAL_WORK=$WORK MOLT_BUILD=$MOLT_BUILD bash "$HERE/run.sh" --images-only --abort | grep -v '^images:' || true
cd "$WORK"
[ -f u1.so ] && [ -f u2.so ] && [ -f u2fault.so ] && [ -d u1/src ] ||
    { echo "shadow.sh: run.sh built no images" >&2; exit 1; }
if [ ! -f u1same.so ] || [ u1.so -nt u1same.so ]; then
    echo "== deb12u1 linked again with --molt-from u1.so: u1same.so (a shadow of a version by itself)"
    rm -f u1/src/mosquitto
    (cd u1 && make -C src mosquitto CC="$MOLTCC --molt-program" "${MAKE_OPTS[@]}" \
        LDFLAGS="--molt-from $WORK/u1.so" >../make-u1same.log 2>&1) ||
        { grep -v 'note: not migrated' make-u1same.log | tail -30 >&2; exit 1; }
    cp u1/src/mosquitto u1same.so
fi
if [ ! -f u1odd.so ] || [ u1.so -nt u1odd.so ] || [ "$HERE/odd.patch" -nt u1odd.so ]; then
    echo "== deb12u1 with odd.patch, --molt-from u1.so: u1odd.so (a version that differs)"
    rm -rf u1odd
    cp -a u1 u1odd
    patch -d u1odd -p1 -s <"$HERE/odd.patch"
    rm -f u1odd/src/mosquitto
    (cd u1odd && make -C src mosquitto CC="$MOLTCC --molt-program" "${MAKE_OPTS[@]}" \
        LDFLAGS="--molt-from $WORK/u1.so" >../make-u1odd.log 2>&1) ||
        { grep -v 'note: not migrated' make-u1odd.log | tail -30 >&2; exit 1; }
    cp u1odd/src/mosquitto u1odd.so
    rm -rf u1odd
fi

[ "$IMAGES_ONLY" = 0 ] || { echo "images: $WORK/u1.so $WORK/u1same.so $WORK/u1odd.so $WORK/u2.so"; exit 0; }

cat >shadow.conf <<CONF
listener $PORT 127.0.0.1
allow_anonymous true
persistence false
user $(id -un)
log_dest file $WORK/shadow-broker.log
CONF
cp "$HERE/shadow.rules" shadow.rules

failed=0
fail() { failed=$((failed + 1)); echo "FAILED: $*"; }
PID=
LOADPID=
cleanup() {
    touch "$WORK/stop"
    [ -z "$PID" ] || kill -9 "$PID" $(followers) 2>/dev/null || true
}
trap cleanup EXIT
# every follower a shadow of $PID started (one is the leader's child)
followers() { cat "$WORK/followers" 2>/dev/null || true; }
sh_field() { # sh_field KEY...: the shadow record's KEYs from one molt status --json
    "$MOLT" status --json "$PID" 2>/dev/null |
        python3 -c 'import json,sys; s = json.load(sys.stdin)["shadow"]; print(*[s.get(k, "") for k in sys.argv[1:]])' "$@" 2>/dev/null
}
# divergences of earlier sessions (the count is the process's)
DIV0=0
new_divergences() { echo $(($(sh_field divergences) - DIV0)); }
start_shadow() { # start_shadow IMAGE: molt update --shadow under shadow.rules
    local out
    DIV0=$(sh_field divergences)
    DIV0=${DIV0:-0}
    if ! out=$("$MOLT" update --shadow "$PID" "./$1" --rules shadow.rules --timeout 20 2>&1); then
        fail "molt update --shadow to $1: $out"; return 1
    fi
    echo "$out"
    sh_field follower >>followers
}
# wait_stage STAGE [SECONDS]: until the shadow's stage is STAGE
wait_stage() {
    local i
    for i in $(seq $((${2:-20} * 5))); do
        [ "$(sh_field stage)" = "$1" ] && return 0
        sleep 0.2
    done
    return 1
}
# caught_up: the follower compared every call recorded (load paused or not,
# it must come within 1% of them and stay shadowing)
caught_up() {
    local i st rec cmp
    for i in $(seq 100); do
        read -r st rec cmp <<<"$(sh_field stage recorded compared)"
        [ "$st" = shadowing ] || [ "$st" = promoted ] || return 1
        [ "$cmp" -ge $((rec - rec / 100)) ] && return 0
        sleep 0.2
    done
    return 1
}
fresh_clients() { # fresh_clients N: N clients one after another, each checks the retained messages
    local i
    for i in $(seq "$1"); do
        python3 "$LOAD" --port "$PORT" --check-retained 100 >/dev/null 2>&1 ||
            { fail "a fresh client did not get the 100 retained messages"; return; }
        sleep 0.2
    done
}

: >shadow-broker.log
: >followers
rm -f stop
"$MOLT" run ./u1.so -c shadow.conf >shadow-broker.out 2>shadow-broker.err &
PID=$!
for _ in $(seq 100); do
    grep -q running shadow-broker.log 2>/dev/null && break
    sleep 0.1
done
fds0=$(ls /proc/$PID/fd | wc -l)
python3 "$LOAD" --port "$PORT" --stop-file stop --retained 100 --report shadow-load.json >shadow-load.out 2>&1 &
LOADPID=$!
sleep 1
echo "broker $PID (deb12u1), load: 8 clients, 100 retained messages, load average $(cut -d' ' -f1-3 /proc/loadavg)"

echo "[$SECONDS s] == 1. self: deb12u1 shadowed by itself for $SECONDS_SELF s, a fresh client every ~1 s"
if start_shadow u1same.so; then
    end=$((SECONDS + SECONDS_SELF))
    while [ $SECONDS -lt $end ] && [ "$(sh_field stage)" = shadowing ]; do
        fresh_clients 1
        sleep 0.8
    done
    caught_up || fail "the follower did not catch up: $(sh_field compared) of $(sh_field recorded) compared"
    read -r st rec cmp use dropped <<<"$(sh_field stage recorded compared ring_use_pct rule_decided)"
    echo "self: $rec calls recorded, $cmp compared, $(new_divergences) divergences, ring use up to $use%, $dropped log writes dropped by the rule, stage $st"
    [ "$st" = shadowing ] && [ "$(new_divergences)" = 0 ] ||
        fail "self-shadow: $(sh_field outcome)"
    "$MOLT" rollback "$PID" >/dev/null || fail "rollback of the self-shadow"
fi

echo "[$SECONDS s] == 2. a version that differs: deb12u1 + odd.patch"
if start_shadow u1odd.so; then
    fresh_clients 2
    out=$(python3 "$LOAD" --port "$PORT" --publish molt/odd 2>&1) || fail "molt/odd: $out"
    if wait_stage ended; then
        o=$(sh_field outcome)
        echo "molt/odd: $out; outcome: $o"
        case "$o" in *divergence*"the leader made"*"the follower"*) ;; *) fail "not a divergence: $o" ;; esac
        "$MOLT" log "$PID" | grep -q 'shadow.*diverged: divergence' || fail "no divergence in molt log"
    else
        fail "the follower of u1odd.so was not ended by molt/odd: $(sh_field stage) $(sh_field outcome)"
    fi
fi
if start_shadow u1odd.so; then
    fresh_clients 1
    out=$(python3 "$LOAD" --port "$PORT" --publish molt/crash 2>&1) || fail "molt/crash: $out"
    if wait_stage ended; then
        o=$(sh_field outcome)
        echo "molt/crash: $out; outcome: $o"
        case "$o" in *SIGSEGV*|*signal*) ;; *) fail "not a crash: $o" ;; esac
    else
        fail "the follower of u1odd.so did not crash on molt/crash: $(sh_field stage) $(sh_field outcome)"
    fi
fi
fresh_clients 1
echo "[$SECONDS s] == 2b. a transformer that faults in the follower: u2fault.so (run.sh --abort's deb12u2.xf + a fault after its stores)"
if start_shadow u2fault.so; then
    if wait_stage ended; then
        o=$(sh_field outcome)
        echo "outcome: $o"
        case "$o" in *"db -> db"*fault*) ;; *) fail "not the transformer's fault: $o" ;; esac
    else
        fail "the follower of u2fault.so did not end: $(sh_field stage) $(sh_field outcome)"
    fi
fi
fresh_clients 1

echo "[$SECONDS s] == 3. deb12u1 -> deb12u2 (deb12u2.xf): shadow, promote, rollback; shadow, promote, commit"
if start_shadow u2.so; then
    sleep 2
    caught_up || fail "deb12u2 fell behind: $(sh_field outcome)"
    r=$("$MOLT" promote "$PID" --timeout 20 2>&1) || fail "promote: $r"
    echo "[$SECONDS s] $r"
    fresh_clients 3
    sleep 1
    caught_up || fail "deb12u1 following deb12u2: $(sh_field outcome)"
    read -r st rec cmp <<<"$(sh_field stage recorded compared)"
    echo "promoted: $rec calls recorded, $cmp compared (both directions), $(new_divergences) divergences, stage $st"
    r=$("$MOLT" rollback "$PID" --timeout 20 2>&1) || fail "rollback after promote: $r"
    echo "[$SECONDS s] $r"
    [ "$(new_divergences)" = 0 ] || fail "rollback: $(sh_field outcome)"
fi
fresh_clients 1
if start_shadow u2.so; then
    sleep 2
    r=$("$MOLT" promote "$PID" --timeout 20 2>&1) || fail "promote: $r"
    fresh_clients 2
    caught_up || fail "deb12u1 following deb12u2: $(sh_field outcome)"
    r=$("$MOLT" commit "$PID" --timeout 20 2>&1) || fail "commit: $r"
    echo "[$SECONDS s] $r"
    [ "$(sh_field stage)" = committed ] && [ "$(new_divergences)" = 0 ] ||
        fail "commit: stage $(sh_field stage): $(sh_field outcome)"
    "$MOLT" status "$PID" | grep -q "^program image .*/u2.so" || fail "the broker does not run u2.so"
    out=$(python3 "$LOAD" --port "$PORT" --shared 2>&1) || fail "$out"
    echo "after the commit: $out (deb12u2's shared subscriptions)"
fi

sleep 1
touch stop
wait "$LOADPID" || fail "load: $(cat shadow-load.out)"
LOADPID=
tail -1 shadow-load.out
sleep 0.5
fds1=$(ls /proc/$PID/fd | wc -l)
[ "$fds0" = "$fds1" ] || fail "descriptors $fds0 -> $fds1"
for f in $(followers); do
    [ ! -d /proc/$f ] || [ "$(awk '{print $3}' /proc/$f/stat)" = Z ] || fail "follower $f still runs"
done
echo "descriptors: $fds0 -> $fds1; followers: $(followers | tr '\n' ' ')"
kill "$PID" 2>/dev/null || true
wait "$PID" 2>/dev/null || true
PID=

echo "[$SECONDS s] == 4. persistence with autosave: not followed, the follower ended naming the file"
mkdir -p persist
rm -f persist/mosquitto.db*
cat >persist.conf <<CONF
listener $PORT 127.0.0.1
allow_anonymous true
persistence true
persistence_location $WORK/persist/
autosave_interval 1
user $(id -un)
log_dest file $WORK/persist-broker.log
CONF
: >persist-broker.log
"$MOLT" run ./u1.so -c persist.conf >persist-broker.out 2>&1 &
PID=$!
for _ in $(seq 100); do
    grep -q running persist-broker.log 2>/dev/null && break
    sleep 0.1
done
python3 "$LOAD" --port "$PORT" --fill 100 >/dev/null || fail "filling the persistent broker"
if start_shadow u1same.so; then
    if wait_stage ended; then
        o=$(sh_field outcome)
        echo "outcome: $o"
        case "$o" in *'unlink('*'mosquitto.db.new"'*"change files the leader changes"*) ;;
            *) fail "not the autosave's refusal: $o" ;; esac
    else
        fail "the follower went on through autosaves: $(sh_field stage) $(sh_field outcome)"
    fi
    fresh_clients 1
    sleep 1.5
    [ -s persist/mosquitto.db ] || fail "the leader did not save its database"
fi
kill "$PID" 2>/dev/null || true
wait "$PID" 2>/dev/null || true
PID=
echo "[$SECONDS s] shadow.sh: $failed failure(s), load average $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$failed" = 0 ]
