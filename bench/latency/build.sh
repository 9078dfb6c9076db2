#!/bin/sh
# build.sh — builds everything the latency benchmark needs, outside the repo.
#
#   bench/latency/build.sh            (run.sh calls it; safe to run again)
#
# Environment:
#   MOLT_BUILD  molt build tree (default /tmp/lat-build; configured and built
#               here with -DCMAKE_BUILD_TYPE=Release if it has no bin/molt)
#   LAT_WORK    where the server, the patches and the client go
#               (default /tmp/molt-latency)
#
# Why not examples/kvstore/Makefile in place: other people build and
# `make clean` that directory while this benchmark runs, and a rebuilt
# ./kvstore would get a new build-id that our patches no longer match.  So
# the server is compiled here, from the same sources, with the same flags
# as the Makefile (moltcc, -O2 -g), into LAT_WORK.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
KV="$ROOT/examples/kvstore"
MOLT_BUILD=${MOLT_BUILD:-/tmp/lat-build}
LAT_WORK=${LAT_WORK:-/tmp/molt-latency}

# A Release tree: the numbers must not include debug-build overhead.
if [ ! -x "$MOLT_BUILD/bin/molt" ]; then
  cmake -S "$ROOT" -B "$MOLT_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
ninja -C "$MOLT_BUILD" >/dev/null

MOLTCC="$MOLT_BUILD/bin/moltcc"
CFLAGS="-O2 -g -Wall -Wextra -Wno-unused-parameter"
mkdir -p "$LAT_WORK/obj" "$LAT_WORK/patches"

# The server.  Compiled from a snapshot of the sources so that a concurrent
# edit of examples/kvstore cannot give the server and its patches different
# sources.  Each file keeps its basename: molt matches statics by file name.
SRC="$LAT_WORK/src"
rm -rf "$SRC"
mkdir -p "$SRC/patches/fix-del" "$SRC/patches/value-length"
cp "$KV"/kv.h "$KV"/kvstore.c "$KV"/kv_net.c "$KV"/kv_store.c "$KV"/kv_commands.c "$SRC/"
cp "$KV/patches/fix-del/kv_commands.c" "$SRC/patches/fix-del/"
cp "$KV/patches/value-length/kv_commands.c" "$SRC/patches/value-length/"

# Compile in $SRC with relative names, as the Makefile does, so that the
# TU names recorded for static functions are the same as in a normal build.
(
  cd "$SRC"
  for f in kvstore kv_net kv_store kv_commands; do
    "$MOLTCC" -I. -I"$ROOT/include" $CFLAGS -c -o "$LAT_WORK/obj/$f.o" "$f.c"
  done
  "$MOLTCC" $CFLAGS -o "$LAT_WORK/kvstore" "$LAT_WORK"/obj/kvstore.o \
    "$LAT_WORK"/obj/kv_net.o "$LAT_WORK"/obj/kv_store.o \
    "$LAT_WORK"/obj/kv_commands.o -pthread

  # The same server without its molt_on_update_pending() wake-up (see
  # nowake.c), for the optional global-nowake policy of latbench.py.
  gcc $CFLAGS -c -o "$LAT_WORK/obj/nowake.o" "$HERE/nowake.c"
  "$MOLTCC" $CFLAGS -o "$LAT_WORK/kvstore-nowake" "$LAT_WORK"/obj/kvstore.o \
    "$LAT_WORK"/obj/kv_net.o "$LAT_WORK"/obj/kv_store.o \
    "$LAT_WORK"/obj/kv_commands.o "$LAT_WORK/obj/nowake.o" -pthread

  # Two patches that are not pinned (instr.py --pair unpinned-a,unpinned-b):
  # kv_format_reply with its separators in a local array instead of string
  # literals passed to kv_net.c, so that moltcc has no reason to keep them
  # loaded; a superseded one is proved unused and unloaded (design §4).
  # They differ from each other (and from 1.0) in that array only.
  /usr/bin/python3 - <<'PY'
import os
src = open("kv_commands.c").read()
old = """  kv_out_append(out, status, strlen(status));
  if (payload) {
    kv_out_append(out, " ", 1);
    kv_out_append(out, payload, plen);
  }
  kv_out_append(out, "\\n", 1);
}"""
if old not in src:
    raise SystemExit("build.sh: kv_format_reply changed: update the unpinned patches")
for name, init in (("a", "{' ', '\\n'}"), ("b", "{' ', '\\n', 0}")):
    new = """  char sep[] = %s; /* not literals: the patch is not pinned */
  kv_out_append(out, status, strlen(status));
  if (payload) {
    kv_out_append(out, &sep[0], 1);
    kv_out_append(out, payload, plen);
  }
  kv_out_append(out, &sep[1], 1);
}""" % init
    os.makedirs("patches/unpinned-" + name, exist_ok=True)
    with open("patches/unpinned-%s/kv_commands.c" % name, "w") as f:
        f.write(src.replace(old, new))
PY
  for p in unpinned-a unpinned-b; do
    "$MOLTCC" --molt-patch --molt-target "$LAT_WORK/kvstore" \
      -o "$LAT_WORK/patches/$p.so" "patches/$p/kv_commands.c" \
      --molt-patch-id "$p" --molt-description "latency bench: $p" \
      -I. -I"$ROOT/include" $CFLAGS
  done

  # The two patches the patcher alternates between: 1.1 (bug fix) and 1.2
  # (reply format change).  Both are complete versions of kv_commands.c, so
  # either can follow the other; every apply loads a fresh copy (dlopen).
  # Patches record the build-id of their target, so kvstore-nowake gets
  # its own pair in patches/nowake/.
  mkdir -p "$LAT_WORK/patches/nowake"
  for t in kvstore kvstore-nowake; do
    dir="$LAT_WORK/patches"
    [ "$t" = kvstore ] || dir="$dir/nowake"
    for p in fix-del value-length; do
      "$MOLTCC" --molt-patch --molt-target "$LAT_WORK/$t" \
        -o "$dir/$p.so" "patches/$p/kv_commands.c" \
        --molt-patch-id "$p" --molt-description "latency bench: $p" \
        -I. -I"$ROOT/include" $CFLAGS
    done
  done
)
# molt refuses patches writable by group/others (guarantee R7).
chmod go-w "$LAT_WORK"/patches/*.so "$LAT_WORK"/patches/nowake/*.so

# The load client: plain gcc, it is not part of the system under test.
gcc -O2 -g -Wall -Wextra -o "$LAT_WORK/latclient" "$HERE/latclient.c" -lm

echo "built: $LAT_WORK/kvstore{,-nowake}, $LAT_WORK/patches/{fix-del,value-length,unpinned-a,unpinned-b}.so, $LAT_WORK/latclient (molt: $MOLT_BUILD)"
