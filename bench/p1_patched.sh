#!/usr/bin/env bash
# P1 with a live patch, in instructions (callgrind, exact): a direct call
# (plain), an updatable call without a patch (molt), a call of a patched
# function once the transition is over (patched: its entry jumps into the
# patch through a trampoline slot), and the same call during a transition
# (dispatch: MOLT_COUNT_CALLS=1 keeps every call on the dispatch path, the
# path a call takes while an old generation is alive), gcc and clang at -O2.
#
#   bash bench/p1_patched.sh [BUILD_DIR [WORK_DIR]]
#
# Prints the table and writes it to bench/results/p1_patched.md, which
# bench/report.py puts into RESULTS.md (section "P1 with a live patch").
#
# Instructions per iteration of fcall's loop (loop + call + callee),
# counted only inside `loop` and taken as the difference of two runs
# (200,000 and 100,000 iterations), so anything run once cancels.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
work=${2:-/tmp/molt-p1-patched}
mkdir -p "$work"
src=$here/src
n1=100000
n2=200000

count() { # label argv... -> instructions per iteration
  local label=$1
  shift
  local t=()
  for n in $n1 $n2; do
    local out=$work/$label.$n.callgrind
    local argv=("$@")
    argv[1]=$n
    valgrind --tool=callgrind --smc-check=all --toggle-collect=loop \
      --callgrind-out-file="$out" "${argv[@]}" >"$work/$label.$n.stdout" 2>"$work/$label.$n.stderr"
    t+=("$(sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$out" | head -1)")
  done
  python3 -c "print('%.2f' % ((${t[1]} - ${t[0]}) / ($n2 - $n1)))"
}

rows=()
for cc in gcc clang-14; do
  flags=(-O2 -Wall -I"$root/include")
  link=(-L"$build" -lmolt -Wl,-rpath,"$build" -Wl,--build-id -pthread)
  $cc "${flags[@]}" -DVARIANT_PLAIN -o "$work/plain-$cc" "$src/fcall_main.c" "$src/fcall_target.c" -pthread
  $cc "${flags[@]}" -DVARIANT_MOLT -o "$work/molt-$cc" "$src/fcall_main.c" "$src/fcall_target.c" "${link[@]}"
  # As moltcc builds a patch: no start files, no registration constructor.
  $cc "${flags[@]}" -fPIC -shared -nostartfiles -DMOLT__NO_AUTO_REGISTER -Wl,--build-id \
    -o "$work/patch-$cc.so" "$src/fcall_patch.c"
  "$build/bin/moltstamp" "$work/patch-$cc.so" "$work/molt-$cc" >/dev/null
  chmod go-w "$work/patch-$cc.so"
  plain=$(count "plain-$cc" "$work/plain-$cc" 0)
  molt=$(count "molt-$cc" "$work/molt-$cc" 0)
  patched=$(count "patched-$cc" "$work/molt-$cc" 0 1 "$work/patch-$cc.so")
  grep -q "entry=patch" "$work/patched-$cc.$n2.stdout" ||
    { echo "patched-$cc: the entry never jumped into the patch" >&2; exit 1; }
  dispatch=$(MOLT_COUNT_CALLS=1 count "dispatch-$cc" "$work/molt-$cc" 0 1 "$work/patch-$cc.so")
  grep -q "entry=dispatch" "$work/dispatch-$cc.$n2.stdout" ||
    { echo "dispatch-$cc: the entry left the dispatch path" >&2; exit 1; }
  rows+=("$(python3 -c "print('| %s -O2 | %g | %g | %g | **%.2f×** | %g | %.2f× |' % ('$cc'.replace('-14', ''), $plain, $molt, $patched, $patched / $plain, $dispatch, $dispatch / $plain))")")
done
md=$here/results/p1_patched.md
{
  echo "## P1 with a live patch, after the transition"
  echo
  echo "Instructions per call (loop iteration: loop + call + callee), exact, from callgrind; the callee is fcall's \`target\` (\`return *p;\`, another translation unit). *patched*: the molt program after \`molt_apply\` of \`src/fcall_patch.c\` once the transition is over -- the entry jumps into the patch through its trampoline slot, two jumps. *dispatch*: the same program and patch with \`MOLT_COUNT_CALLS=1\`, where every call takes the dispatch path: what a call costs during a transition (an older generation alive, a proof pending) and always in a program that counts calls. **Target** (issue 14): patched ≤ 1.5× plain at -O2."
  echo
  echo "| compiler | plain | molt, no patch | patched | patched / plain | dispatch | dispatch / plain |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Command: \`bash bench/p1_patched.sh BUILD_DIR\` ($(date -u +%Y-%m-%d), $(gcc --version | head -1), $(clang-14 --version | head -1))."
} >"$md"
cat "$md"
