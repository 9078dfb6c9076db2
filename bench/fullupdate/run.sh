#!/usr/bin/env bash
# bench/fullupdate/run.sh [--quick] [--only throughput|pause] — guarantee P9 for
# full updates on examples/kvfull: steady-state throughput of the program
# image under `molt run` vs an ordinary executable of the same sources, the
# update pause vs state size (1K, 10K, 100K, 1M entries), and the
# transformation rate.  Writes results/fullupdate.json, results/p9_*.png and
# RESULTS.md (this directory).
#
#   --quick        ~1 minute: 4 rounds of 1 s, sizes up to 100K, 2 reps
#   --only X       just throughput or pause (the report keeps the other's
#                  latest results)
#
# Environment:
#   MOLT_BUILD=DIR   use this molt build (no sanitizers) instead of
#                    configuring bench/build/molt (Release), shared with
#                    bench/run.sh
#
# Needs: cmake, ninja, gcc, clang-14 + python3-clang-14 (moltcc),
# pyelftools (moltcc's DWARF reader), /usr/bin/python3 with matplotlib.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$(dirname "$here")")"
py=/usr/bin/python3   # the system Python: moltcc and matplotlib live there

args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) args+=(--quick) ;;
    --only) args+=(--only "$2"); shift ;;
    --only=*) args+=(--only "${1#--only=}") ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

for tool in cmake ninja gcc make; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool is required" >&2; exit 2; }
done
"$py" -c 'import matplotlib' 2>/dev/null || {
  echo "run.sh: $py has no matplotlib (apt install python3-matplotlib)" >&2; exit 2; }

if [ -n "${MOLT_BUILD:-}" ]; then
  build="$(cd "$MOLT_BUILD" && pwd)"
  if grep -q '^MOLT_SANITIZE:STRING=.\+' "$build/CMakeCache.txt" 2>/dev/null; then
    echo "run.sh: $build is a sanitizer build; benchmarks need a plain build" >&2
    exit 2
  fi
else
  build="$root/bench/build/molt"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOLT_SANITIZE= >/dev/null
  ninja -C "$build" molt molt-cli molt-run moltstamp moltcc >/dev/null
fi

exec "$py" "$here/bench.py" --molt-build "$build" "${args[@]}"
