#!/usr/bin/env bash
# Installs what molt needs to build, test and run its demo on Debian 12.
# Idempotent: asks apt only for packages that are missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  python3 python3-pytest        # integration tests
  python3-clang-14 libclang1-14 # moltcc's source transformer (libclang)
  python3-pyelftools            # moltcc --molt-from: DWARF of program images
  clang-14                      # second compiler for tests and benchmarks
  clang-format-14               # the C style (tests/style)
  binutils procps iproute2      # ss: the examples count established connections
  gdb                           # tests/debug: gdb and gcore on a patched process
  libcapstone-dev               # molt attach: the x86-64 instruction decoder
  git diffutils                 # patch builder tests: real git diff and diff -u
  # examples/fixes (ctest -L realworld): apt-get source, and the build
  # dependencies of the servers it builds, by name (build-dep needs deb-src)
  dpkg-dev patch xz-utils curl openssl
  libdbus-1-dev libidn2-dev libnftables-dev libnetfilter-conntrack-dev nettle-dev libgmp-dev  # dnsmasq
  libssl-dev libpcre2-dev zlib1g-dev                                                           # nginx
  libevent-dev libsasl2-dev libsasl2-modules  # memcached (examples/attach with SASL, examples/fullreal)
)
if [ "${MOLT_WITH_BENCH:-0}" = 1 ]; then
  packages+=(python3-matplotlib valgrind linux-perf)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
