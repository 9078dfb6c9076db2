# Shared shell of the examples/fullreal servers' run.sh scripts (sourced;
# bash): fetching a Debian source package, the series of full updates, and
# the summary.  Needs REPO, WORK and MOLT_BUILD set by the caller (fullreal_prepare sets MOLT); works in $WORK.

# fullreal_prepare: makes $WORK (refused inside the repository) and sets
# MOLTCC and MOLT from $MOLT_BUILD, which must hold a built molt.
fullreal_prepare() {
    mkdir -p "$WORK"
    WORK=$(cd "$WORK" && pwd)
    case "$WORK" in "$REPO" | "$REPO"/*)
        echo "run.sh: MOLT_FULLREAL_WORK must be outside the repository" >&2
        exit 2
        ;;
    esac
    MOLTCC=$MOLT_BUILD/bin/moltcc
    MOLT=$MOLT_BUILD/bin/molt
    [ -x "$MOLTCC" ] && [ -x "$MOLT" ] || {
        echo "run.sh: build molt first ($MOLT_BUILD)" >&2
        exit 2
    }
}

# fullreal_fetch PKG VERSION DIR: `apt-get source PKG=VERSION` into $WORK
# through a private apt configuration (scripts/apt-private.sh: deb-src
# lines; the system's apt sources are not touched), unless DIR (the
# unpacked tree) is there already.
fullreal_fetch() {
    local pkg=$1 ver=$2 dir=$3 conf
    [ -d "$WORK/$dir" ] && return 0
    echo "== apt-get source $pkg"
    conf=$(MOLT_APT_DIR=$WORK/apt bash "$REPO/scripts/apt-private.sh")
    (cd "$WORK" && APT_CONFIG=$conf apt-get source -q "$pkg=$ver") >"$WORK/apt-source.log" 2>&1 ||
        { cat "$WORK/apt-source.log" >&2; return 1; }
}

# fullreal_updates PID N: `molt update PID ./imgI.so` for I = 1..N, one
# after the other (0.3 s apart), in $WORK.  Appends each update's pause
# (ms) to $WORK/pauses and "I RSS-KiB descriptors threads" to
# $WORK/per-update; sets fullreal_failed to the number of failed updates.
# Stops early if the server died.
fullreal_updates() {
    local pid=$1 n=$2 i out
    : >"$WORK/pauses"
    : >"$WORK/per-update"
    fullreal_failed=0
    for i in $(seq 1 "$n"); do
        if out=$(cd "$WORK" && "$MOLT" update "$pid" "./img$i.so" --timeout 10 2>&1); then
            echo "$out" | sed -n 's/.*pause \([0-9.]*\) ms.*/\1/p' >>"$WORK/pauses"
            echo "$i $(awk '/VmRSS/ {print $2}' /proc/$pid/status) $(ls /proc/$pid/fd | wc -l) $(ls /proc/$pid/task | wc -l)" \
                >>"$WORK/per-update"
        else
            fullreal_failed=$((fullreal_failed + 1))
            echo "update $i failed: $out"
            kill -0 "$pid" 2>/dev/null || { echo "the server died"; break; }
        fi
        sleep 0.3
    done
}

# fullreal_summary N FAILED FDS0 FDS1 RSS0 RSS1 THREADS0 THREADS1: prints
# the updates, failed updates, pause p50/max/min (from $WORK/pauses), the
# descriptors, RSS and threads before and after, and, for a run of 20 or
# more updates, RSS growth per update over its second half.
fullreal_summary() {
    (cd "$WORK" && python3 - "$@" <<'PY'
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
PY
    )
}
