#!/usr/bin/env bash
# Sets everything up and runs the whole test suite (each build with the
# lock-order check on):
#   1. a normal build: every test
#   2. AddressSanitizer + UBSan: every test
#   3. ThreadSanitizer: the tests labelled concurrency or fullupdate
# (tests/README.md lists the labels)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-debian.sh

# Tests must not skip because something was not built.
export MOLT_REQUIRE_ALL=1
jobs=$(nproc)
py=/usr/bin/python3

run() { # name, cmake options..., -- ctest options...
  local dir=$1; shift
  local cm=() ct=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do cm+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  ct=("$@")
  echo "=== $dir: cmake ${cm[*]}"
  cmake -S . -B "$dir" -G Ninja -DPython3_EXECUTABLE=$py "${cm[@]}" >/dev/null
  ninja -C "$dir" >/dev/null
  (cd "$dir" && ctest --output-on-failure -j"$jobs" "${ct[@]}")
}

# Every test build checks the runtime's lock order (MOLT_LOCK_CHECK: a
# violation puts the runtime into the refusing state, which fails the tests).
run build -DMOLT_SANITIZE= -DMOLT_LOCK_CHECK=ON
run build-asan -DMOLT_SANITIZE=address -DMOLT_LOCK_CHECK=ON
run build-tsan -DMOLT_SANITIZE=thread -DMOLT_LOCK_CHECK=ON -- -L '^(concurrency|fullupdate)$'
echo "all test runs passed"
