# Shared shell of examples/fixes/run.sh (sourced; bash).  Needs: REPO, WORK,
# MOLTCC, MOLT, LOG set by run.sh.

note() { echo "== $*"; }
now() { date +%s.%N; }
msecs() { python3 -c "import sys; print('%.1f' % (1000 * (float(sys.argv[2]) - float(sys.argv[1]))))" "$1" "$2"; }
# timed FILE CMD...: runs CMD, writes "wall user sys" seconds to FILE
timed() { local f=$1; shift; /usr/bin/time -f '%e %U %S' -o "$f" "$@"; }
tsum() { tail -1 "$1" | awk '{printf "%.1f s wall, %.1f s CPU", $1, $2 + $3}'; }

# Debian bookworm's dpkg-buildflags (hardening as the packages build),
# without -ffile-prefix-map (the patch build finds sources by their paths).
DEB_CFLAGS="-g -O2 -fstack-protector-strong -Wformat -Werror=format-security"
DEB_CPPFLAGS="-Wdate-time -D_FORTIFY_SOURCE=2"
DEB_LDFLAGS="-Wl,-z,relro -Wl,-z,now"

# fetch_source PKG VERSION: the Debian source package PKG=VERSION, fetched
# once with `apt-get source --download-only` through the private apt
# configuration (deb-src lines; the system's apt sources are not touched)
# into $WORK/src/PKG.  Prints the .dsc path.
fetch_source() {
    local pkg=$1 ver=$2 d=$WORK/src/$1
    local dsc=$d/${pkg}_${ver#*:}.dsc
    if [ ! -f "$dsc" ]; then
        mkdir -p "$d"
        local conf
        conf=$(bash "$REPO/scripts/apt-private.sh") || return 1
        (cd "$d" && APT_CONFIG=$conf apt-get source --download-only -q "$pkg=$ver") \
            >"$LOG/fetch-$pkg.log" 2>&1 || { echo "apt-get source $pkg=$ver failed (see $LOG/fetch-$pkg.log)" >&2; return 1; }
    fi
    echo "$dsc"
}

# unpack_pre DSC TREE FIRST_FIX: TREE = the upstream sources with the
# package's patches applied in series order up to (not including)
# FIRST_FIX: the sources as they were before the security fixes, which the
# running server is built from.  The patch files stay in TREE/debian/patches.
unpack_pre() {
    local dsc=$1 tree=$2 first=$3 p
    rm -rf "$tree"; mkdir -p "$(dirname "$tree")"
    dpkg-source -x --skip-patches "$dsc" "$tree" >"$LOG/unpack-$(basename "$tree").log" 2>&1 ||
        { echo "dpkg-source -x $dsc failed (see $LOG/unpack-$(basename "$tree").log)" >&2; return 1; }
    while read -r p; do
        p=${p%%#*}; p=${p%% *}; [ -n "$p" ] || continue
        [ "$p" = "$first" ] && return 0
        patch -s -p1 -d "$tree" < "$tree/debian/patches/$p" || return 1
    done < "$tree/debian/patches/series"
    echo "unpack_pre: $first is not in the series of $dsc" >&2
    return 1
}
