#!/usr/bin/env bash
# bench/attach/run.sh [--quick] [bench.py options] — guarantee P11: the stop
# and the total time of `molt attach` on a generated target (threads
# 1/10/100/1000 x functions 1/16/256, threads blocked and busy), and a real
# server's throughput and latency around the attach (memcached as
# examples/attach/run.sh builds it; run that first, or that part is skipped
# with the reason).  Writes bench/results/attach.json and attach.md and its
# section of bench/RESULTS.md.  Needs root (ptrace).  Not part of
# bench/run.sh, not in CI.
#
#   --quick        3 runs per row, 1 memcached run (a smoke run: ~2 minutes)
#   --no-compare   skip the rows with the target in the harness's session
#
# Environment:
#   MOLT_BUILD=DIR        the molt build (default <repo>/build; no sanitizers)
#   MOLT_ATTACH_WORK=DIR  examples/attach/run.sh's work directory
#                         (default /var/tmp/molt-attach)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$(dirname "$here")")"
build="${MOLT_BUILD:-$root/build}"
case "${1:-}" in -h|--help) sed -n '2,18p' "$0"; exit 0 ;; esac
if grep -q '^MOLT_SANITIZE:STRING=.\+' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "run.sh: $build is a sanitizer build; benchmarks need a plain build" >&2
  exit 2
fi
[ -x "$build/bin/molt" ] && [ -x "$build/bin/moltcc" ] || { echo "run.sh: build molt first ($build)" >&2; exit 2; }
exec /usr/bin/python3 "$here/bench.py" --molt-build "$build" "$@"
