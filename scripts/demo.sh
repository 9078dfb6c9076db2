#!/usr/bin/env bash
# Sets everything up, builds molt and runs the two live-update demos:
#  1. hot patches: a loaded key-value server takes three patches without
#     dropping a request (examples/kvstore);
#  2. full updates: a connected, loaded server is replaced whole, twice,
#     its data migrated to new representations (examples/kvfull).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-debian.sh
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOLT_SANITIZE= -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
ninja -C build-demo >/dev/null
echo "=== 1. hot patches (examples/kvstore) ==="
/usr/bin/python3 examples/kvstore/demo.py --molt-build build-demo "$@"
echo
echo "=== 2. full updates (examples/kvfull) ==="
/usr/bin/python3 examples/kvfull/demo.py --molt-build build-demo
