#!/usr/bin/env python3
"""Checks that the C sources are layered one way (docs/design.md, "Layers").

Each folder below is a layer.  A file may include headers of its own folder
and of layers further down (lower rank), never of a layer above it or of a
sibling of the same rank (hot/ and full/ do not know each other).  The
folders' include graph must also have no cycle.  Files in a folder that is
not a layer are reported too: every source belongs to one.

    scripts/check_layers.py [ROOT]      exit 0 if the tree is layered, else 1
                                        with one line per problem

Only quoted includes of files that exist in the tree count (system headers
are nobody's layer).  An include resolves as the compiler resolves it: next
to the including file, then in include/, src/ and src/runtime/ (the include
path of CMakeLists.txt).
"""
import os
import re
import sys

# (folder, rank): higher ranks sit on lower ones.
LAYERS = [
    ("include", 0),              # molt.h (the API) and molt/*.h (the ABI)
    ("src/common", 1),           # errors, buf, proc, elf, protocol, arch/
    ("src/runtime/base", 2),     # locks, state, log, platform, file
    # molt attach (ptrace, decoder, patch loader): between common and the
    # layers of rank 2, so that the CLI may use it and still not see the
    # runtime, and it sees neither
    ("src/attach", 1.5),
    ("src/cli", 2),              # the molt command: on common and attach
    ("tools", 2),                # moltstamp: on common only
    ("src/runtime/core", 3),     # threads, entries, generations, modules
    ("src/runtime/switch", 4),   # points, barrier, policies, modes' hooks
    ("src/runtime/hot", 5),      # the modes, side by side
    ("src/runtime/full", 5),
    # shadowed updates: a full update rehearsed in a forked follower, so
    # on full/ (its steps, threads and relaunch), below the service
    ("src/runtime/shadow", 5.5),
    ("src/runtime/service", 6),  # runtime thread, requests, control, status
]
INCLUDE_PATH = ["include", "src", "src/runtime"]
CHECKED = ["include", "src", "tools"]
SOURCE = re.compile(r"\.(c|h)$")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def layer_of(rel):
    """The layer folder holding repository path rel (longest match), or None."""
    best = None
    for folder, _ in LAYERS:
        if rel == folder or rel.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def rank(folder):
    return dict(LAYERS)[folder]


def sources(root):
    for top in CHECKED:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if SOURCE.search(f):
                    yield os.path.relpath(os.path.join(d, f), root)


def resolve(root, including, name):
    """Repository path of the file `#include "name"` in `including` reads."""
    for d in [os.path.dirname(including)] + INCLUDE_PATH:
        cand = os.path.normpath(os.path.join(d, name))
        if os.path.isfile(os.path.join(root, cand)):
            return cand.replace(os.sep, "/")
    return None


def cycles(edges):
    """Cycles of the folder graph (each as a list of folders), by DFS."""
    found, state, stack = [], {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    return found


def check(root):
    problems, edges = [], {}
    for rel in sources(root):
        mine = layer_of(rel)
        if mine is None:
            problems.append("%s: not in a layer folder (scripts/check_layers.py, LAYERS)" % rel)
            continue
        text = open(os.path.join(root, rel), encoding="utf-8", errors="replace").read()
        for m in INCLUDE.finditer(text):
            target = resolve(root, rel, m.group(1))
            if target is None:
                continue  # generated or system: not part of the layers
            theirs = layer_of(target)
            if theirs is None or theirs == mine:
                continue
            edges.setdefault(mine, set()).add(theirs)
            line = text.count("\n", 0, m.start()) + 1
            if rank(theirs) >= rank(mine):
                how = "a sibling layer" if rank(theirs) == rank(mine) else "a layer above it"
                problems.append("%s:%d: includes %s of %s (%s): %s may include only lower "
                                "layers" % (rel, line, target, theirs, how, mine))
    for c in cycles(edges):
        problems.append("folders include each other in a cycle: %s" % " -> ".join(c))
    return problems


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems = check(os.path.abspath(root))
    for p in problems:
        print("check_layers: " + p)
    if not problems:
        print("check_layers: %d folders, every include goes down" % len(LAYERS))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
