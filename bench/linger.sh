#!/usr/bin/env bash
# The reclaimer's polling while an old generation lingers (issue 14, item
# 3): membarrier calls over one run of src/linger_main.c (a counted call
# holds a retired generation for 2 s), under each libmolt build given.
#
#   bash bench/linger.sh BUILD_DIR [LIB_DIR...]     (LIB_DIR: holds libmolt.so)
#
# The program and patches are built against BUILD_DIR (its moltstamp);
# each LIB_DIR's libmolt is loaded in turn (LD_LIBRARY_PATH).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "$1" && pwd)
shift
work=${LINGER_WORK:-/tmp/molt-linger}
mkdir -p "$work"
gcc -O2 -Wall -I"$root/include" -o "$work/linger" "$here/src/linger_main.c" \
  -L"$build" -lmolt -pthread -Wl,--build-id
for t in 1 2; do
  gcc -O2 -fPIC -shared -nostartfiles -DMOLT__NO_AUTO_REGISTER -Wl,--build-id -DTAG=$t \
    -I"$root/include" -o "$work/p$t.so" "$here/src/linger_patch.c"
  "$build/bin/moltstamp" "$work/p$t.so" "$work/linger" >/dev/null
  chmod go-w "$work/p$t.so"
done
echo "| libmolt | membarrier (PRIVATE_EXPEDITED) | membarrier (SYNC_CORE) |"
echo "|---|---|---|"
for lib in "$build" "$@"; do
  lib=$(cd "$lib" && pwd)
  MOLT_COUNT_CALLS=1 LD_LIBRARY_PATH=$lib strace -f -e trace=membarrier \
    -o "$work/trace.txt" "$work/linger" "$work/p1.so" "$work/p2.so"
  echo "| $lib | $(grep -c 'CMD_PRIVATE_EXPEDITED,' "$work/trace.txt") | $(grep -c 'SYNC_CORE,' "$work/trace.txt") |"
done
