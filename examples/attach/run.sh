#!/usr/bin/env bash
# Debian's security fixes of a real, plainly built, running memcached,
# attached with `molt attach` (no molt in its build, nothing preloaded).
#
#   examples/attach/run.sh [--quick] [--cycles N] [--seconds S] [--rebuild] [--no-proxy]
#
# Fetches memcached 1.6.18-1+deb12u1 (Debian 12's security update) with
# `apt-get source` through a private apt configuration (scripts/apt-private.sh;
# the system's sources are not touched), takes the three patches that update
# added (debian/changelog: CVE-2023-46852, CVE-2023-46853, CVE-2026-47783,
# CVE-2026-47784) back out of the tree -- the sources as the version before
# shipped them -- and builds memcached with its own build system and the
# plain compiler: ./configure --enable-sasl --enable-sasl-pwdb CFLAGS="-O2 -g";
# make memcached.  Then memcached.py builds each patch as published with
# `moltcc --molt-patch --molt-target ./memcached --molt-diff debian/patches/P
# -o P.so <memcached's own compile flags>`, checks that the two proxy fixes
# are refused with their reason (this build has no proxy), starts memcached
# with SASL under a checking load, and attaches the SASL fix, rolls it back
# and attaches it again N times, probing each time with a login the fix
# changes.  Then (not with --quick or --no-proxy) a second build of the same
# sources with the proxy (--enable-proxy, its vendored Lua): there the proxy
# fixes are in reach -- CVE-2023-46852 is built and attached to the running
# server and rolled back under the load, CVE-2023-46853 is refused because
# it changes the layout of struct mcp_parser_s.  Prints a table and writes
# $MOLT_ATTACH_WORK/summary.json.
#
# --quick: 2 cycles and 1 s of load before and after, no proxy build (the CI
# test attach_realworld).  --rebuild: unpack and build memcached again
# (otherwise the builds in the work directory are reused).
#
# Environment: MOLT_ATTACH_WORK (work directory, outside the repository;
# default /var/tmp/molt-attach), MOLT_BUILD (molt build tree with bin/moltcc
# and bin/molt; default <repo>/build), MOLT_ATTACH_PORT (first loopback port
# tried, default 27600).  Needs root (ptrace) and scripts/setup-debian.sh's
# packages (libevent-dev, libsasl2-dev, libsasl2-modules, dpkg-dev).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${MOLT_ATTACH_WORK:-/var/tmp/molt-attach}
MOLT_BUILD=${MOLT_BUILD:-$REPO/build}
VERSION=1.6.18-1+deb12u1
SRC=memcached-1.6.18
# The patches the security update added, last first (to take them out).
UPDATE_PATCHES="CVE-2023-46853.patch 0009-CVE-2023-46852.patch 0008-CVE-2026-47783-CVE-2026-47784.patch"
CYCLES=20
SECONDS_=2
REBUILD=0
PROXY=1
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) CYCLES=2; SECONDS_=1; PROXY=0; shift ;;
        --no-proxy) PROXY=0; shift ;;
        --cycles) CYCLES=$2; shift 2 ;;
        --seconds) SECONDS_=$2; shift 2 ;;
        --rebuild) REBUILD=1; shift ;;
        -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
case "$WORK" in "$REPO"|"$REPO"/*) echo "run.sh: MOLT_ATTACH_WORK must be outside the repository" >&2; exit 2 ;; esac
MOLTCC=$MOLT_BUILD/bin/moltcc
MOLT=$MOLT_BUILD/bin/molt
[ -x "$MOLTCC" ] && [ -x "$MOLT" ] || { echo "run.sh: build molt first ($MOLT_BUILD)" >&2; exit 2; }
for tool in dpkg-source patch make gcc; do
    command -v $tool >/dev/null || { echo "run.sh: $tool is missing (bash scripts/setup-debian.sh installs it)" >&2; exit 2; }
done
[ -e /usr/include/sasl/sasl.h ] || { echo "run.sh: libsasl2-dev is missing (bash scripts/setup-debian.sh installs it)" >&2; exit 2; }

cd "$WORK"
if [ ! -f "memcached_$VERSION.dsc" ]; then
    echo "== apt-get source memcached=$VERSION"
    APT_CONFIG=$(MOLT_APT_DIR=$WORK/apt bash "$REPO/scripts/apt-private.sh")
    APT_CONFIG=$APT_CONFIG apt-get source -q --download-only "memcached=$VERSION" >apt-source.log 2>&1 ||
        { cat apt-source.log >&2; exit 1; }
fi
if [ "$REBUILD" = 1 ] || [ ! -x "$SRC/memcached" ]; then
    echo "== unpack, take the security update's patches out, configure, make (gcc -O2 -g)"
    rm -rf "$SRC"
    dpkg-source -x "memcached_$VERSION.dsc" "$SRC" >unpack.log 2>&1 || { cat unpack.log >&2; exit 1; }
    for p in $UPDATE_PATCHES; do
        patch -d "$SRC" -R -p1 -s <"$SRC/debian/patches/$p"
    done
    (cd "$SRC" && ./configure --enable-sasl --enable-sasl-pwdb CFLAGS="-O2 -g" >../configure.log 2>&1) ||
        { tail -20 configure.log >&2; exit 1; }
    (cd "$SRC" && make -j"$(nproc)" memcached >../make.log 2>&1) || { tail -30 make.log >&2; exit 1; }
fi
proxy=()
if [ "$PROXY" = 1 ]; then
    if [ "$REBUILD" = 1 ] || [ ! -x "$SRC-proxy/memcached" ]; then
        echo "== the same sources with the proxy: configure --enable-proxy, its Lua, make (gcc -O2 -g)"
        rm -rf "$SRC-proxy"
        cp -a "$SRC" "$SRC-proxy"
        make -C "$SRC-proxy" distclean >/dev/null 2>&1 || true
        (cd "$SRC-proxy" && ./configure --enable-sasl --enable-sasl-pwdb --enable-proxy CFLAGS="-O2 -g" \
            >../configure-proxy.log 2>&1) || { tail -20 configure-proxy.log >&2; exit 1; }
        make -C "$SRC-proxy/vendor" >vendor-proxy.log 2>&1 || { tail -20 vendor-proxy.log >&2; exit 1; }
        (cd "$SRC-proxy" && make -j"$(nproc)" memcached >../make-proxy.log 2>&1) ||
            { tail -30 make-proxy.log >&2; exit 1; }
    fi
    proxy=(--proxy)
fi
exec /usr/bin/python3 "$HERE/memcached.py" --work "$WORK" --molt "$MOLT" --moltcc "$MOLTCC" \
    --cycles "$CYCLES" --seconds "$SECONDS_" --port "${MOLT_ATTACH_PORT:-27600}" "${proxy[@]}"
