#!/usr/bin/env bash
# Sets everything up, builds molt and runs the live-update demo: a loaded
# key-value server takes three hot patches without dropping a request.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-debian.sh
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOLT_SANITIZE= -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
ninja -C build-demo >/dev/null
exec /usr/bin/python3 examples/kvstore/demo.py --molt-build build-demo "$@"
