"""scripts/check_layers.py: the tree is layered one way, and the check
catches what it is there for -- run on copies of the tree with a
deliberately added upward include, a sibling include, a cycle, and a file
outside every layer.  Also: the lock table of docs/design.md lists the
locks of src/runtime/base/base.h (the source) in the same order."""
import os
import re
import shutil
import sys

import pytest

from harness import proc
from harness.tree import ROOT

CHECK = os.path.join(ROOT, "scripts", "check_layers.py")


def run(root):
    return proc.run([sys.executable, CHECK, root], timeout=60)


@pytest.fixture
def tree(tmp_path):
    """A copy of the sources the check reads."""
    for d in ("include", "src", "tools"):
        shutil.copytree(os.path.join(ROOT, d), tmp_path / d)
    return tmp_path


def add_include(tree, path, header):
    p = tree / path
    text = p.read_text()
    first = text.index("#include")
    p.write_text(text[:first] + '#include "%s"\n' % header + text[first:])


def test_the_tree_is_layered():
    r = run(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every include goes down" in r.stdout


def test_the_copy_is_layered_too(tree):
    r = run(str(tree))
    assert r.returncode == 0, r.stdout


def test_an_upward_include_fails(tree):
    # core (generations) reaching up into the service layer
    add_include(tree, "src/runtime/core/gen.c", "service/service.h")
    r = run(str(tree))
    assert r.returncode == 1, r.stdout
    assert re.search(r"src/runtime/core/gen\.c:\d+: includes src/runtime/service/service\.h "
                     r"of src/runtime/service \(a layer above it\)", r.stdout), r.stdout


def test_the_cli_may_not_see_the_runtime(tree):
    add_include(tree, "src/cli/client.c", "base/base.h")
    r = run(str(tree))
    assert r.returncode == 1 and "src/cli/client.c" in r.stdout, r.stdout


def test_attach_may_not_see_the_runtime_or_the_cli(tree):
    # the CLI uses src/attach (its own tree passes); attach stays below both
    add_include(tree, "src/attach/attach.c", "base/base.h")
    add_include(tree, "src/attach/state.c", "cli/cli.h")
    r = run(str(tree))
    assert r.returncode == 1, r.stdout
    assert "src/attach/attach.c" in r.stdout and "src/attach/state.c" in r.stdout, r.stdout


def test_a_mode_may_not_name_another_mode(tree):
    add_include(tree, "src/runtime/hot/hot.c", "full/full.h")
    r = run(str(tree))
    assert r.returncode == 1 and "a sibling layer" in r.stdout, r.stdout


def test_a_cycle_fails(tree):
    # base including core, which includes base: upward, and a cycle
    add_include(tree, "src/runtime/base/state.c", "core/core.h")
    r = run(str(tree))
    assert r.returncode == 1, r.stdout
    assert "src/runtime/base/state.c" in r.stdout
    assert re.search(r"cycle: src/runtime/(base|core) -> src/runtime/(core|base) -> "
                     r"src/runtime/\1", r.stdout), r.stdout


def test_a_file_outside_every_layer_fails(tree):
    (tree / "src" / "runtime" / "stray.c").write_text('#include "base/base.h"\n')
    r = run(str(tree))
    assert r.returncode == 1 and "src/runtime/stray.c: not in a layer folder" in r.stdout


def test_lock_table_of_the_design_matches_base_h():
    base = open(os.path.join(ROOT, "src", "runtime", "base", "base.h")).read()
    table = base[base.index("#define MOLT__LOCKS(XX)"):]
    table = table[:table.index("\n\n")]
    order = re.findall(r"XX\((\w+),", table)
    assert order[0] == "shadow" and "op" in order and order[-1] == "fd", order
    design = open(os.path.join(ROOT, "docs", "design.md")).read()
    locks = design[design.index("## 5. Locks"):]
    locks = locks[:locks.index("\n## ", 1)]
    rows = re.findall(r"^\| `(\w+)_lock`", locks, re.M)
    assert rows == order, "docs/design.md lists %s, base.h %s" % (rows, order)
