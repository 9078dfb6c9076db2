#!/bin/sh
# run.sh — the WFPATCH section 4.3 experiment on the kvstore (guarantee P8).
#
#   bench/latency/run.sh [--quick] [latbench.py options]
#
# Builds molt (Release, in $MOLT_BUILD, default /tmp/lat-build), the kvstore,
# two patches and the load client (in $LAT_WORK, default /tmp/molt-latency),
# then runs latbench.py: one kvstore per policy (none, immediate, local,
# global, and none2 as the A/A control), the same open-loop load moving
# between them in 3 s segments, and a `molt apply` every 1.5 s to the one
# under load; writes bench/latency/results/ (latency.json, summary.md, PNGs).
#
#   full run  ~5.5 min: 20 rounds = 60 s of load and 40 patch requests per
#             policy
#   --quick   ~1.5 min: 5 rounds (15 s, 10 requests per policy); indicative
#             only, and says so in its output
# See README.md for the other options (--wait-quiet, --pool, --nowake,
# --control, --sched, ...).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
export MOLT_BUILD=${MOLT_BUILD:-/tmp/lat-build}
export LAT_WORK=${LAT_WORK:-/tmp/molt-latency}

# numpy and matplotlib of the system python (Debian packages).
PY=/usr/bin/python3
if ! "$PY" -c 'import numpy, matplotlib' 2>/dev/null; then
  echo "run.sh: needs python3-numpy and python3-matplotlib (apt-get install -y python3-matplotlib)" >&2
  exit 2
fi

"$HERE/build.sh"
exec "$PY" "$HERE/latbench.py" "$@"
