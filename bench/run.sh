#!/usr/bin/env bash
# bench/run.sh [--quick] [--only p1,p5] — build molt and every benchmark
# program, run targets P1-P7 and P7b (the experiments of the PSU thesis,
# chapter 5), write bench/results/*.json and *.png and bench/RESULTS.md.
#
#   --quick        smoke run, under ~3 minutes (fewer sizes, -O2 only)
#   --only LIST    just these measures (p1..p7, p7b); plots and report use
#                  the latest results of the others
#
# Environment:
#   MOLT_BUILD=DIR   use this molt build (must be a Release build without
#                    sanitizers) instead of configuring bench/build/molt
#
# Needs: cmake, ninja, gcc, clang-14, python3-clang-14 (moltcc), valgrind
# (instruction counts; skipped if absent), /usr/bin/python3 with matplotlib
# (apt install python3-matplotlib).  P7b (memcached) installs what it needs
# with apt (memcached's build dependencies and source, libmemcached-tools),
# which needs root and Debian's archive; without them it is skipped, with
# the reason in RESULTS.md.  See bench/README.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
py=/usr/bin/python3   # the system Python: moltcc and matplotlib live there

args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) args+=(--quick) ;;
    --only) args+=(--only "$2"); shift ;;
    --only=*) args+=(--only "${1#--only=}") ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

for tool in cmake ninja gcc clang-14 make; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool is required" >&2; exit 2; }
done
"$py" -c 'import matplotlib' 2>/dev/null || {
  echo "run.sh: $py has no matplotlib (apt install python3-matplotlib)" >&2; exit 2; }

# molt itself: a Release build of our own, so that a sanitizer or debug
# build elsewhere never ends up in the numbers.
if [ -n "${MOLT_BUILD:-}" ]; then
  build="$(cd "$MOLT_BUILD" && pwd)"
  if grep -q '^MOLT_SANITIZE:STRING=.\+' "$build/CMakeCache.txt" 2>/dev/null; then
    echo "run.sh: $build is a sanitizer build; benchmarks need a plain Release build" >&2
    exit 2
  fi
else
  build="$here/build/molt"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOLT_SANITIZE= >/dev/null
  # Only what the bench uses (the tests would double the build time).
  ninja -C "$build" molt molt-cli moltstamp moltcc >/dev/null
fi

start=$(date +%s)
status=0
"$py" "$here/bench.py" --molt-build "$build" "${args[@]}" || status=$?
"$py" "$here/plot.py"
"$py" "$here/report.py"
echo "run.sh: done in $(( $(date +%s) - start )) s (measures exit status $status);" \
     "see bench/RESULTS.md and bench/results/" >&2
exit $status
