#!/bin/sh
# hiccup.sh — what an update takes from the workers (issue 14, item 4):
# the hiccup meter (hiccup.c) in three kvstores, a `molt apply` every 1.5 s
# to one of them, the other two unpatched (none2: the A/A control), side by
# side in one run; then the instructions the workers execute per request
# inside and outside a patch window (instr.py, callgrind).
#
#   bench/latency/hiccup.sh [hiccup.py options]     # ~3.5 min with --rounds 20
#   bench/latency/hiccup.sh --instr [instr.py options]
#
# Builds like run.sh (build.sh: molt Release in $MOLT_BUILD, the kvstore,
# its two patches and latclient in $LAT_WORK), plus hiccup.so.  Writes
# results/hiccup.md (.json) or results/instr.md (.json).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
export MOLT_BUILD=${MOLT_BUILD:-/tmp/lat-build}
export LAT_WORK=${LAT_WORK:-/tmp/molt-latency}
"$HERE/build.sh"
gcc -O2 -Wall -Wextra -fPIC -shared -pthread -o "$LAT_WORK/hiccup.so" "$HERE/hiccup.c"
if [ "${1:-}" = "--instr" ]; then
  shift
  exec /usr/bin/python3 "$HERE/instr.py" "$@"
fi
exec /usr/bin/python3 "$HERE/hiccup.py" "$@"
