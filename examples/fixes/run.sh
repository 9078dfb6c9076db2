#!/usr/bin/env bash
# Real security fixes of real servers, applied live as hot patches.
#
#   examples/fixes/run.sh [--quick] [--only tinyproxy,dnsmasq,nginx] [--fixes NAME,...] [--rebuild] [--strict]
#
# For tinyproxy, dnsmasq and nginx (Debian 12's source packages, fetched with
# `apt-get source` through a private apt configuration, scripts/apt-private.sh):
# builds the sources as they were before the security fixes with CC=moltcc;
# builds every fix straight from its patch file in debian/patches
# (moltcc --molt-patch --molt-diff); checks that the fixes a hot patch cannot
# carry are refused with the right reason, and applies our rewordings of them;
# runs the server under a checking load and applies each fix with `molt apply`,
# with a request that behaves differently before and after where there is one.
# Prints a table and writes $MOLT_FIXES_WORK/summary.json.  See README.md.
#
# --quick: dnsmasq only, two fixes and one refusal (the CI test `realworld_fixes`).
# --rebuild: build the servers again (otherwise a build in the work directory is reused).
# --strict: a fix blocked by a known moltcc problem fails the run.
#
#   examples/fixes/run.sh sweep [--only tinyproxy,dnsmasq] [--files N] [--match REGEX]
#
# The coverage sweep (sweep.py): for every C file of the servers, one
# function's body changed, the patch built from that diff, applied under
# load and rolled back; prints "<server>: P/T files patched".
#
# Environment: MOLT_FIXES_WORK (work directory, outside the repository;
# default /var/tmp/molt-fixes), MOLT_BUILD (molt build tree with bin/moltcc
# and bin/molt; default <repo>/build, built there if it has none), MOLTCC /
# MOLT (the two tools), MOLT_FIXES_PORT (first of the loopback ports used,
# default 27300).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${MOLT_FIXES_WORK:-/var/tmp/molt-fixes}
MOLT_BUILD=${MOLT_BUILD:-$REPO/build}
case "${1:-}" in -h|--help) sed -n '2,33p' "$0"; exit 0 ;; esac 2>/dev/null || true
WORK=$(mkdir -p "$WORK" && cd "$WORK" && pwd)
case "$WORK" in "$REPO"|"$REPO"/*) echo "run.sh: MOLT_FIXES_WORK must be outside the repository" >&2; exit 2 ;; esac

if [ -z "${MOLTCC:-}" ] || [ -z "${MOLT:-}" ]; then
    if [ ! -x "$MOLT_BUILD/bin/moltcc" ] || [ ! -x "$MOLT_BUILD/bin/molt" ]; then
        echo "== building molt in $MOLT_BUILD"
        cmake -S "$REPO" -B "$MOLT_BUILD" -G Ninja -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
        ninja -C "$MOLT_BUILD" >/dev/null
    fi
fi
MOLTCC=${MOLTCC:-$MOLT_BUILD/bin/moltcc}
MOLT=${MOLT:-$MOLT_BUILD/bin/molt}
for tool in dpkg-source patch make gcc; do
    command -v $tool >/dev/null || { echo "run.sh: $tool is missing (bash scripts/setup-debian.sh installs it)" >&2; exit 2; }
done
script=fixes.py
if [ "${1:-}" = sweep ]; then script=sweep.py; shift; fi
exec /usr/bin/python3 "$HERE/$script" --work "$WORK" --repo "$REPO" --moltcc "$MOLTCC" --molt "$MOLT" "$@"
