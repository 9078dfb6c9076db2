"""The moltcc package (tools/moltcc) keeps its dependencies one way: the
driver chooses a mode, a mode uses the layers below it, and nothing below
the modes knows a mode or the driver (tools/moltcc/README.md, "The
package").  Reads the imports of every module with ast; pure Python."""
import ast
import os

from harness.tree import TOOLS

PKG = os.path.join(TOOLS, "moltcc")

ENTRY = {"moltcc.__main__", "moltcc.driver"}
MODES = {"moltcc.build", "moltcc.patch.build", "moltcc.image.build", "moltcc.attach"}
# What every mode may use, and what may use only these (never a mode, a
# mode's own parts or the driver).
BASE = {"moltcc", "moltcc.errors", "moltcc.gccargs", "moltcc.toolchain", "moltcc.session",
        "moltcc.record",
        "moltcc.markers", "moltcc.unit", "moltcc.rewrite", "moltcc.weave", "moltcc.elf",
        "moltcc.dwarf"}


def modules():
    """{module name: path} of every .py file of the package."""
    out = {}
    for dp, dirs, files in os.walk(PKG):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dp, f), os.path.dirname(PKG))[:-3]
                name = rel.replace(os.sep, ".")
                out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = \
                    os.path.join(dp, f)
    return out


def imports_of(name, path, known):
    """The package's modules that `name` imports (at any depth of its code)."""
    is_pkg = path.endswith("__init__.py")
    here = name if is_pkg else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            cands = [mod] + ["%s.%s" % (mod, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            cands = [a.name for a in node.names]
        else:
            continue
        found |= {c for c in cands if c in known and c != name}
    return found


def graph():
    mods = modules()
    return {n: imports_of(n, p, mods) for n, p in mods.items()}


def cycle(g):
    """A list of modules forming an import cycle, or None."""
    state = {}      # 1: on the current path, 2: done

    def visit(n, stack):
        state[n] = 1
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                c = visit(m, stack + [m])
                if c:
                    return c
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state:
            c = visit(n, [n])
            if c:
                return c
    return None


def violations(g):
    """Imports that run upwards or sideways: into the entry from anything
    but the entry, into a mode from anything but the driver, from the base
    layers into anything but the base, from one mode's folder into
    another's."""
    out = []
    for n, deps in sorted(g.items()):
        for m in sorted(deps):
            if m in ENTRY and n not in ENTRY:
                out.append("%s imports the driver %s" % (n, m))
            elif m in MODES and n != "moltcc.driver":
                out.append("%s imports the mode %s" % (n, m))
            elif n in BASE and m not in BASE:
                out.append("%s (below the modes) imports %s" % (n, m))
            elif folder(n) and folder(m) and folder(n) != folder(m):
                out.append("%s imports %s of another mode" % (n, m))
    return out


def folder(name):
    """The mode folder (patch, image) of a module, or None."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ("patch", "image") else None


def test_every_module_is_placed():
    g = graph()
    placed = ENTRY | MODES | BASE
    parts = {n for n in g if n.startswith(("moltcc.patch", "moltcc.image"))}
    assert set(g) - placed - parts == set(), "a new module: place it in this test's layers"
    assert MODES <= set(g) and BASE <= set(g)


def test_imports_run_one_way():
    g = graph()
    assert g["moltcc.driver"] >= MODES        # the sanity of the reader itself
    assert violations(g) == []
    assert cycle(g) is None


def test_the_check_sees_upward_imports_and_cycles():
    g = graph()
    g["moltcc.session"] = g["moltcc.session"] | {"moltcc.patch.build"}
    g["moltcc.patch.plan"] = g["moltcc.patch.plan"] | {"moltcc.image.build"}
    g["moltcc.patch.weave"] = g["moltcc.patch.weave"] | {"moltcc.image.xf"}
    g["moltcc.unit"] = g["moltcc.unit"] | {"moltcc.weave"}
    v = violations(g)
    assert "moltcc.session imports the mode moltcc.patch.build" in v
    assert "moltcc.patch.plan imports the mode moltcc.image.build" in v
    assert "moltcc.patch.weave imports moltcc.image.xf of another mode" in v
    assert cycle(g) is not None
