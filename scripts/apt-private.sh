#!/usr/bin/env bash
# Prints the path of a private apt configuration that has deb-src lines, for
# `apt-get source` and `apt-get build-dep`, without touching the system's
# apt sources:
#
#   export APT_CONFIG=$(bash scripts/apt-private.sh)
#   apt-get source memcached
#
# The private configuration lists the same archives as the system's own
# sources (deb822 files in /etc/apt/sources.list.d and one-line entries in
# /etc/apt/sources.list), each as deb and deb-src, with its own lists and
# package cache under $MOLT_APT_DIR (default /var/tmp/molt-apt); it reads the
# system's dpkg status, so build-dep installs into the system as usual.
# It runs `apt-get update` on the private lists when they are missing or older
# than a day (MOLT_APT_REFRESH=1 forces it).  Idempotent.
set -euo pipefail

dir=${MOLT_APT_DIR:-/var/tmp/molt-apt}
mkdir -p "$dir/etc/sources.list.d" "$dir/etc/preferences.d" "$dir/state" \
         "$dir/lists/partial" "$dir/cache" "$dir/archives/partial"

# One "deb URI SUITE COMPONENTS" line per archive of the system's sources.
system_lines() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        sed -n 's/^[[:space:]]*deb\(-src\)\?[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?/\2/p' "$f" |
            sed 's/^\[[^]]*\][[:space:]]*//' | awk 'NF >= 2 { print }'
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # deb822: blank-line separated stanzas with URIs, Suites, Components.
        awk '
            function flush() {
                if (uris != "" && suites != "" && enabled != "no")
                    for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++)
                        print u[i], s[j], comps
                uris = ""; suites = ""; comps = ""; enabled = ""
            }
            /^[[:space:]]*$/ { flush(); next }
            /^[[:space:]]*#/ { next }
            tolower($1) == "uris:"       { uris = $0; sub(/^[^:]*:[[:space:]]*/, "", uris); nu = split(uris, u, /[[:space:]]+/) }
            tolower($1) == "suites:"     { suites = $0; sub(/^[^:]*:[[:space:]]*/, "", suites); ns = split(suites, s, /[[:space:]]+/) }
            tolower($1) == "components:" { comps = $0; sub(/^[^:]*:[[:space:]]*/, "", comps) }
            tolower($1) == "enabled:"    { enabled = tolower($2) }
            END { flush() }' "$f"
    done
}

lines=$(system_lines | sort -u)
if [ -z "$lines" ]; then
    echo "apt-private.sh: no apt sources found in /etc/apt" >&2
    exit 1
fi
new=$(printf '%s\n' "$lines" | while read -r uri rest; do
    printf 'deb %s %s\ndeb-src %s %s\n' "$uri" "$rest" "$uri" "$rest"
done)
list=$dir/etc/sources.list
if [ ! -f "$list" ] || [ "$(cat "$list")" != "$new" ]; then
    printf '%s\n' "$new" > "$list"
    rm -f "$dir/lists/"*_Sources* 2>/dev/null || true
fi

conf=$dir/apt.conf
cat > "$conf.tmp" <<EOF
Dir::Etc::sourcelist "$dir/etc/sources.list";
Dir::Etc::sourceparts "$dir/etc/sources.list.d";
Dir::Etc::preferencesparts "$dir/etc/preferences.d";
Dir::State "$dir/state";
Dir::State::lists "$dir/lists";
Dir::State::status "/var/lib/dpkg/status";
Dir::Cache "$dir/cache";
Dir::Cache::archives "$dir/archives";
EOF
mv "$conf.tmp" "$conf"

stamp=$dir/lists/.molt-updated
if [ "${MOLT_APT_REFRESH:-0}" = 1 ] || ! ls "$dir/lists/"*_Sources* >/dev/null 2>&1 ||
   [ -z "$(find "$stamp" -mmin -1440 2>/dev/null)" ]; then
    if ! APT_CONFIG=$conf apt-get update -q >"$dir/update.log" 2>&1; then
        echo "apt-private.sh: apt-get update failed (see $dir/update.log)" >&2
        exit 1
    fi
    touch "$stamp"
fi
echo "$conf"
