#!/usr/bin/env bash
# molt on a real open-source server: memcached (Debian's source package).
#
#   examples/realworld/run.sh [--quick] [--plain-tests] [--duration S] [--keep-going]
#
# 1. apt-get build-dep + apt-get source memcached into $MOLT_WORK
#    (default /tmp/molt-realworld; never inside the repository);
# 2. builds it twice, with Debian's configure options (--enable-sasl
#    --enable-tls): plain gcc, and CC=moltcc with every function updatable
#    (--molt-updatable=all), and times both;
# 3. runs memcached's own test suite (`make test`: testapp, the TLS basic
#    tests, then prove t/) on the moltcc build (--plain-tests: on the plain
#    build too; --quick: skip the test suites);
# 4. starts the moltcc-built memcached on 127.0.0.1, drives checked load
#    with mcload.py, builds a live patch from proto_text.c + patches/stats-live.diff
#    with `moltcc --molt-patch`, applies it with `molt apply` under load and
#    checks: the new stats are visible on a fresh connection as soon as
#    `molt apply` returns, every loaded connection sees them, no request
#    failed, no connection closed; then `molt rollback` and a clean shutdown;
# 5. prints the numbers and writes $MOLT_WORK/summary.json.
#
# Environment: MOLT_BUILD (molt build tree with bin/moltcc and bin/molt;
# default <repo>/build, built there with cmake+ninja if it has none),
# MOLTCC / MOLT (override the two tools), MOLT_WORK, JOBS.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${MOLT_WORK:-/tmp/molt-realworld}
MOLT_BUILD=${MOLT_BUILD:-$REPO/build}
JOBS=${JOBS:-$(nproc)}
QUICK=0; PLAIN_TESTS=0; DURATION=12; KEEP_GOING=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --plain-tests) PLAIN_TESTS=1 ;;
        --duration) DURATION=$2; shift ;;
        --keep-going) KEEP_GOING=1 ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
case "$WORK" in "$REPO"|"$REPO"/*) echo "run.sh: MOLT_WORK must be outside the repository" >&2; exit 2 ;; esac
mkdir -p "$WORK"
LOG=$WORK/logs; mkdir -p "$LOG"
FAILS=()
fail() { FAILS+=("$1"); echo "run.sh: FAIL: $1" >&2; [ $KEEP_GOING = 1 ] || { summary; exit 1; }; }
note() { echo "== $*"; }
now() { date +%s.%N; }
secs() { python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$2"; }
msecs() { python3 -c "import sys; print('%.1f' % (1000 * (float(sys.argv[2]) - float(sys.argv[1]))))" "$1" "$2"; }
# timed FILE CMD...: runs CMD, writes "wall user+sys" seconds to FILE
timed() { local f=$1; shift; /usr/bin/time -f '%e %U %S' -o "$f" "$@"; }
tsum() { tail -1 "$1" | awk '{printf "%.1f s wall, %.1f s CPU", $1, $2 + $3}'; }
declare -A NUM
STARTED=()      # servers and load generators started here: stopped on exit
cleanup() { local p; for p in "${STARTED[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

summary() {
    echo
    echo "================ molt on memcached: summary ================"
    for k in project configure_plain build_plain configure_moltcc build_moltcc \
             updatable_functions not_updatable tests_moltcc tests_plain patch_build \
             patch_functions apply_ms load_requests load_failed load_req_per_s \
             connections_kept conns_saw_patch fresh_conn_after_apply rollback checker_selftest \
             bench_plain_req_per_s bench_moltcc_req_per_s shutdown; do
        [ -n "${NUM[$k]:-}" ] && printf '%-24s %s\n' "$k" "${NUM[$k]}"
    done
    if [ ${#FAILS[@]} -gt 0 ]; then
        printf 'FAILED: %s\n' "${FAILS[@]}"
    else
        echo "result                   OK"
    fi
    for k in "${!NUM[@]}"; do printf '%s\t%s\n' "$k" "${NUM[$k]}"; done | python3 -c '
import json, sys
d = dict(l.rstrip("\n").split("\t", 1) for l in sys.stdin if "\t" in l)
d["failures"] = sys.argv[2:]
json.dump(d, open(sys.argv[1], "w"), indent=1, sort_keys=True)' "$WORK/summary.json" "${FAILS[@]}"
    echo "(logs in $LOG, numbers in $WORK/summary.json)"
}

# ---------------------------------------------------------------- molt tools
if [ -z "${MOLTCC:-}" ] || [ -z "${MOLT:-}" ]; then
    if [ ! -x "$MOLT_BUILD/bin/moltcc" ] || [ ! -x "$MOLT_BUILD/bin/molt" ]; then
        note "building molt in $MOLT_BUILD"
        cmake -S "$REPO" -B "$MOLT_BUILD" -G Ninja >"$LOG/molt-cmake.log"
        ninja -C "$MOLT_BUILD" >"$LOG/molt-ninja.log"
    fi
fi
MOLTCC=${MOLTCC:-$MOLT_BUILD/bin/moltcc}
MOLT=${MOLT:-$MOLT_BUILD/bin/molt}

# ------------------------------------------------------ build deps and source
need_pkgs="libevent-dev libsasl2-dev libssl-dev libio-socket-ssl-perl pkg-config dpkg-dev time patch binutils"
if ! dpkg -s $need_pkgs >/dev/null 2>&1 || ! ls "$WORK"/src/memcached-*/memcached.c >/dev/null 2>&1; then
    # deb-src lines come from a private apt configuration; the system's
    # apt sources are never changed (scripts/apt-private.sh).
    note "apt-get build-dep memcached (private APT_CONFIG with deb-src)"
    APT_PRIVATE=$(bash "$REPO/scripts/apt-private.sh")
    DEBIAN_FRONTEND=noninteractive APT_CONFIG=$APT_PRIVATE apt-get build-dep -y -q memcached >>"$LOG/apt.log" 2>&1
    DEBIAN_FRONTEND=noninteractive APT_CONFIG=$APT_PRIVATE apt-get install -y -q $need_pkgs >>"$LOG/apt.log" 2>&1
fi
if ! ls "$WORK"/src/memcached-*/memcached.c >/dev/null 2>&1; then
    note "apt-get source memcached"
    rm -rf "$WORK/src"; mkdir -p "$WORK/src"
    APT_PRIVATE=$(bash "$REPO/scripts/apt-private.sh")
    (cd "$WORK/src" && APT_CONFIG=$APT_PRIVATE apt-get source -q memcached >"$LOG/source.log" 2>&1)
fi
SRC=$(ls -d "$WORK"/src/memcached-*/ | head -1); SRC=${SRC%/}
VER=$(cd "$SRC" && dpkg-parsechangelog -S Version 2>/dev/null || basename "$SRC")
NUM[project]="memcached $VER (Debian source package, Debian's patches applied)"
note "${NUM[project]} in $SRC"

# ------------------------------------------------------------------ builds
CONF_OPTS="--enable-sasl --enable-tls"       # as debian/rules
MOLT_CFLAGS="--molt-updatable=all"
build() {   # build NAME CC EXTRA_CFLAGS
    local name=$1 cc=$2 extra=$3 d=$WORK/$1
    rm -rf "$d"; cp -a "$SRC" "$d"
    (cd "$d" && timed "$LOG/time-configure-$name" ./configure $CONF_OPTS CC="$cc" CFLAGS="$extra -g -O2" \
        >"$LOG/configure-$name.log" 2>&1) || { fail "configure ($name), see $LOG/configure-$name.log"; return 1; }
    (cd "$d" && MOLT_VERBOSE=${4:-0} timed "$LOG/time-make-$name" make -j"$JOBS" >"$LOG/make-$name.log" 2>&1) \
        || { fail "make ($name), see $LOG/make-$name.log"; return 1; }
    NUM[configure_${name}]=$(tsum "$LOG/time-configure-$name")
    NUM[build_${name}]="$(tsum "$LOG/time-make-$name") (make -j$JOBS: memcached, memcached-debug, testapp...)"
    note "$name: configure ${NUM[configure_$name]}; make ${NUM[build_$name]}"
}
note "plain build (gcc)"
build plain gcc ""
note "moltcc build ($MOLTCC, $MOLT_CFLAGS)"
build moltcc "$MOLTCC" "$MOLT_CFLAGS" 1
B=$WORK/moltcc
nv0() { nm "$1" | awk '$2 ~ /^[tT]$/ && $3 ~ /__molt_v0$/' | wc -l; }
nfn() { nm "$1" | awk '$2 ~ /^[tT]$/ && $3 !~ /__molt_v0$/ && $3 !~ /\./' | wc -l; }
NUM[updatable_functions]="$(nv0 "$B/memcached") in memcached, $(nv0 "$B/memcached-debug") in memcached-debug (plain gcc -O2 memcached has $(nfn "$WORK/plain/memcached") function symbols after inlining)"
# what moltcc left out (MOLT_VERBOSE notes), once per function
grep -h "is not made updatable" "$LOG/make-moltcc.log" | sed 's/^moltcc: note: //' | sort -u >"$WORK/not-updatable.txt" || true
NUM[not_updatable]="$(wc -l <"$WORK/not-updatable.txt") with a reason (listed in $WORK/not-updatable.txt); main and inline functions are left out by design"
note "updatable: ${NUM[updatable_functions]}"
cat "$WORK/not-updatable.txt"

# ------------------------------------------------------------------ tests
run_tests() {   # run_tests NAME
    local d=$WORK/$1 t0 t1 rc=0
    rm -f "$d/t/whitespace.t"      # needs a git checkout (debian/rules removes it too)
    t0=$(now)
    (cd "$d" && timeout 1800 make test PARALLEL=2 >"$LOG/test-$1.log" 2>&1) || rc=$?
    t1=$(now)
    local files tests result tls
    files=$(grep -o 'Files=[0-9]*, Tests=[0-9]*' "$LOG/test-$1.log" | tail -1)
    result=$(grep -o 'Result: [A-Z]*' "$LOG/test-$1.log" | tail -1)
    tls=$(grep -c '^Finished running basic TLS tests' "$LOG/test-$1.log" || true)
    NUM[tests_$1]="${result:-no result} (${files:-?}; TLS basic tests: $([ "$tls" = 1 ] && echo passed || echo FAILED); testapp: $(grep -cE "^ok [0-9]+ - " "$LOG/test-$1.log" || true) ok; $(grep -c 'skipped:' "$LOG/test-$1.log" || true) files skipped by the suite itself; $(secs "$t0" "$t1") s)"
    note "tests $1: ${NUM[tests_$1]}"
    [ $rc = 0 ] && [ "$result" = "Result: PASS" ] || fail "memcached test suite ($1), see $LOG/test-$1.log"
}
if [ $QUICK = 0 ]; then
    note "memcached test suite on the moltcc build (make test, ~5 min)"
    run_tests moltcc
    if [ $PLAIN_TESTS = 1 ]; then
        note "memcached test suite on the plain build"
        run_tests plain
    fi
fi

# ------------------------------------------------------------------ live patch
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MCPID=
start_mc() {   # start_mc DIR PORT: sets MCPID (a child of this shell)
    local u=(); [ "$(id -u)" = 0 ] && u=(-u root)
    "$1/memcached" "${u[@]}" -l 127.0.0.1 -p "$2" -U 0 -t 4 -m 256 >"$LOG/server-$(basename "$1").log" 2>&1 &
    MCPID=$!
    STARTED+=("$MCPID")
    for _ in $(seq 100); do
        python3 "$HERE/mcload.py" --port "$2" --cmd version >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    return 1
}
mc() { python3 "$HERE/mcload.py" --port "$1" --cmd "$2"; }

note "patch source: proto_text.c + patches/stats-live.diff"
P=$WORK/patch; rm -rf "$P"; mkdir -p "$P"
cp "$SRC/proto_text.c" "$P/proto_text.c"
(cd "$P" && patch -s -p1 <"$HERE/patches/stats-live.diff") || fail "stats-live.diff does not apply to $SRC/proto_text.c"
# the compile flags of memcached's own objects (memcached_CPPFLAGS, CFLAGS), minus the marker
PFLAGS=$(cd "$B" && make -s -f Makefile -f - print-flags <<'EOF'
print-flags:
	@echo $(DEFS) -I$(abs_srcdir) $(memcached_CPPFLAGS) $(CPPFLAGS) $(CFLAGS)
EOF
)
PFLAGS=${PFLAGS//--molt-updatable=all/}
# shellcheck disable=SC2086
timed "$LOG/time-patch" "$MOLTCC" --molt-patch --molt-target "$B/memcached" -o "$P/stats-live.so" "$P/proto_text.c" \
    --molt-patch-id stats-live --molt-description "stats: live_patch and cmd_version (version commands counted)" \
    $PFLAGS >"$LOG/patch-build.log" 2>&1 || { cat "$LOG/patch-build.log" | head -20; fail "moltcc --molt-patch (see $LOG/patch-build.log)"; }
NUM[patch_build]=$(tsum "$LOG/time-patch")
if [ -f "$P/stats-live.so" ]; then
    NUM[patch_functions]="$(readelf -sW "$P/stats-live.so" | grep -c '__molt_p$') new versions (every updatable function of proto_text.c)"
fi
note "patch: ${NUM[patch_functions]:-none}, built in ${NUM[patch_build]}"

PORT=$(free_port)
start_mc "$B" "$PORT" || fail "memcached (moltcc build) did not start"; PID=$MCPID
note "memcached (moltcc build) pid $PID on 127.0.0.1:$PORT"
"$MOLT" status "$PID" >"$LOG/status-before.txt" 2>&1 || fail "molt status before the patch"
mc "$PORT" stats | grep -q 'STAT live_patch' && fail "live_patch present before the patch"
STOP=$WORK/load.stop; rm -f "$STOP"
python3 "$HERE/mcload.py" --port "$PORT" --conns 8 --pipeline 16 --stop-file "$STOP" \
    --report "$WORK/load.json" >"$LOG/load.log" 2>&1 &
LOADPID=$!
STARTED+=("$LOADPID")
sleep $(python3 -c "print($DURATION/3)")
if [ -f "$P/stats-live.so" ]; then
    t0=$(now)
    if "$MOLT" apply "$PID" "$P/stats-live.so" >"$LOG/apply.log" 2>&1; then
        t1=$(now)
        # H2: a request that starts after `molt apply` returns runs the new version
        if mc "$PORT" stats >"$WORK/stats-after.txt" && grep -q '^STAT live_patch stats-live' "$WORK/stats-after.txt"; then
            NUM[fresh_conn_after_apply]="new stats visible ($(grep -E 'live_patch|cmd_version' "$WORK/stats-after.txt" | tr -d '\r' | paste -sd' '))"
        else
            NUM[fresh_conn_after_apply]="new stats NOT visible"; fail "fresh connection after molt apply: no live_patch"
        fi
        NUM[apply_ms]="$(msecs "$t0" "$t1") (whole molt apply command; $(cat "$LOG/apply.log"))"
    else
        cat "$LOG/apply.log"; fail "molt apply"
    fi
fi
sleep $(python3 -c "print($DURATION*2/3)")
touch "$STOP"; wait $LOADPID || true
cat "$LOG/load.log"
"$MOLT" status "$PID" >"$LOG/status-after.txt" 2>&1 || true
read -r req failed rps kept saw < <(python3 - "$WORK/load.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["requests"], d["failed"], d["req_per_s"], d["connections_kept"], d["conns_that_saw_patch"])
EOF
) || { req=0; failed=?; rps=0; kept=0; saw=0; }
NUM[load_requests]=$req; NUM[load_failed]=$failed; NUM[load_req_per_s]=$rps
NUM[connections_kept]="$kept/8"; NUM[conns_saw_patch]="$saw/8"
[ "$failed" = 0 ] || fail "$failed requests failed under load (see $LOG/load.log)"
[ "$kept" = 8 ] || fail "connections lost under load"
[ -f "$P/stats-live.so" ] && { [ "$saw" = 8 ] || fail "only $saw/8 loaded connections saw the patch"; }

if [ -f "$P/stats-live.so" ]; then
    if "$MOLT" rollback "$PID" >"$LOG/rollback.log" 2>&1 && ! mc "$PORT" stats | grep -q 'STAT live_patch'; then
        NUM[rollback]="ok (live_patch gone again on a fresh connection)"
    else
        NUM[rollback]="failed ($(cat "$LOG/rollback.log"))"; fail "molt rollback"
    fi
fi
# the checker must see wrong replies: connections sharing their keys
if python3 "$HERE/mcload.py" --port "$PORT" --duration 1 --collide >"$LOG/selftest.log" 2>&1; then
    NUM[checker_selftest]="FAILED (shared keys went unnoticed)"; fail "mcload --collide found nothing"
else
    NUM[checker_selftest]="ok ($(head -1 "$LOG/selftest.log" | sed 's/.*connections, //'))"
fi
kill -TERM "$PID"; rc=0; wait "$PID" || rc=$?
NUM[shutdown]="SIGTERM, exit status $rc"

# side-by-side throughput (the Python client is the bottleneck on small
# machines; this is a smoke figure, not the P7 benchmark)
PP=$(free_port); start_mc "$WORK/plain" "$PP" || fail "plain memcached did not start"; PPID_=$MCPID
PM=$(free_port); start_mc "$B" "$PM" || fail "moltcc memcached did not start"; PMID=$MCPID
for r in 1 2; do
    for which in plain moltcc; do
        port=$PP; [ $which = moltcc ] && port=$PM
        python3 "$HERE/mcload.py" --port "$port" --duration 4 --report "$WORK/bench-$which-$r.json" >/dev/null 2>&1 \
            || fail "checked load against the $which build failed"
    done
done
kill -TERM "$PPID_" "$PMID"; wait "$PPID_" "$PMID" 2>/dev/null || true
read -r bp bm < <(python3 - "$WORK" <<'EOF'
import json, sys
w = sys.argv[1]
r = lambda n: max(json.load(open("%s/bench-%s-%d.json" % (w, n, i)))["req_per_s"] for i in (1, 2))
print(r("plain"), r("moltcc"))
EOF
)
NUM[bench_plain_req_per_s]=$bp
NUM[bench_moltcc_req_per_s]="$bm ($(python3 -c "print('%.1f%%' % (100.0 * $bm / $bp))") of plain; best of 2 x 4 s, same client)"

summary
[ ${#FAILS[@]} = 0 ]
