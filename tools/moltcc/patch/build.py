"""Patch builds: `moltcc --molt-patch --molt-target PROG -o fix.so new.c ...`.

The target's symbol table decides what every function of the new sources
becomes (plan.py); each source is woven into patch code (weave.py),
compiled -fPIC into the work directory, linked -shared with a generated
patch header, and moltstamp writes PROG's build-id into the result.
"""
import os
import re

from .. import gccargs
from ..elf import SymbolError, read_symtab
from ..errors import Fatal
from ..markers import Selection, read_funcs_file
from ..toolchain import color_flags, generated_flags
from ..unit import Unit, UnitError
from .plan import PatchPlan
from .weave import PatchWeaver, WeaveError, patch_header_source

# Patches compile the whole new file but keep only what the new versions
# need (main and constructors are dropped), so "unused" warnings there are
# expected, not the user's problem.
PATCH_CFLAGS = ["-fPIC", "-fvisibility=hidden", "-DMOLT__NO_AUTO_REGISTER",
                "-Wno-unused-function", "-Wno-unused-variable", "-Wno-unused-const-variable"]


def read_target(target):
    """The target's symbol table, refused if it cannot carry patches."""
    try:
        symtab = read_symtab(target)
    except SymbolError as e:
        raise Fatal(str(e))
    if not symtab.has_symtab:
        raise Fatal("target %s has no symbol table (stripped?); build patches against the "
                    "unstripped program" % target)
    if not any(n.endswith("__molt_v0") for g in symtab.files.values() for grp in g for n in grp) \
            and not any(n.endswith("__molt_v0") for n in symtab.globals):
        raise Fatal("target %s has no updatable function (was it built with moltcc?)" % target)
    return symtab


def build_patch(s):
    if s.options.diff or s.options.orig is not None:
        return build_patch_from_fix(s)
    cmd, layout, opts = s.cmd, s.layout, s.options
    layout.check_include()
    target = opts.target
    if not target:
        raise Fatal("--molt-patch needs --molt-target PROGRAM (the program the patch is for)")
    if not os.path.isfile(target):
        raise Fatal("target %s does not exist" % target)
    out = cmd.output
    if not out:
        raise Fatal("--molt-patch needs -o PATCH.so")
    sources = cmd.c_inputs()
    missing = [x.path for x in cmd.inputs if x.lang == "c" and not os.path.isfile(x.path)]
    if missing:
        raise Fatal("%s: no such file" % missing[0])
    if not sources:
        raise Fatal("--molt-patch needs the C sources of the new version")
    others = [x for x in cmd.inputs if x.lang != "c"]
    for x in others:
        if x.lang not in ("object",):
            raise Fatal("%s: only C sources, objects and archives can go into a patch" % x.path)
    names = [os.path.basename(x.path) for x in sources]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise Fatal("two patch sources are named %s; the runtime tells statics apart by file "
                    "name, so they must be built as separate patches" % dups[0])
    patch_id = opts.patch_id or re.sub(r"\.so$", "", os.path.basename(out))
    description = opts.description or ""
    symtab = read_target(target)

    report = s.report
    cargs = s.clang_args()
    funcs = read_funcs_file(opts.funcs, cargs) if opts.funcs is not None else set()
    sel = Selection(opts.updatable == "all", funcs, report.verbose)
    plan = PatchPlan(symtab, target, sel, report)

    units = []
    for x in sources:
        try:
            u = Unit(os.path.abspath(x.path), x.path, cargs)
        except UnitError as e:
            raise Fatal(str(e))
        units.append((x, u, plan.decide(u)))
        s.flush_report()
    if not any(getattr(f, "role", None) == "pfn" for _, _, fns in units for f in fns):
        s.flush_report()
        raise Fatal("no updatable function of %s in %s" % (target, " ".join(x.path for x in sources)))

    return s.make_output(out, lambda: _compile_and_link(s, units, plan, others, patch_id, description))


def _compile_and_link(s, units, plan, others, patch_id, description):
    """Weaves and compiles every unit, adds the patch header, links the
    patch and stamps it with the target's build-id."""
    cmd, layout, tools, work, report = s.cmd, s.layout, s.tools, s.work, s.report
    out, target = cmd.output, s.options.target
    # The user's options for linking the patch, and for compiling its
    # TUs (without the link-only ones).
    clean = gccargs.without(cmd.args, gccargs.INPUT, gccargs.OUTPUT, gccargs.DEPS,
                            gccargs.STAGE)
    compile_opts = gccargs.without(clean, gccargs.LINK)
    # the same -fsanitize= flags as libmolt (see build.build_program)
    san = layout.san_flags()
    inc = ["-I" + layout.include] + san
    objs = []
    for x, u, fns in units:
        try:
            text = PatchWeaver(u, layout.include, report, plan).weave(fns)
        except WeaveError as e:
            s.flush_report()
            raise Fatal(str(e))
        s.flush_report()
        d = work.subdir()
        src = os.path.join(d, os.path.basename(x.path))
        with open(src, "wb") as f:
            f.write(text)
        obj = os.path.splitext(src)[0] + ".o"
        front, back = generated_flags(x.path, src)
        full = tools.cc + front + compile_opts + PATCH_CFLAGS + ["-c", src, "-o", obj] + inc + back \
            + color_flags(cmd)
        orig = tools.cc + compile_opts + PATCH_CFLAGS + ["-c", x.path, "-o", obj + ".orig.o"] + inc
        rc = s.compile_generated(full, orig, x.path)
        if rc != 0:
            return rc
        objs.append(obj)
    hdr = work.file("molt_patch_header.c")
    with open(hdr, "w") as f:
        f.write(patch_header_source(patch_id, description))
    hobj = hdr[:-2] + ".o"
    rc, _ = tools.run(tools.cc + ["-fPIC", "-DMOLT__NO_AUTO_REGISTER", "-c", hdr, "-o", hobj] + inc)
    if rc != 0:
        raise Fatal("internal error: cannot compile the patch header")
    objs.append(hobj)
    rc, _ = tools.run(tools.cc + ["-shared", "-o", out] + objs + [x.path for x in others]
                      + clean + san + ["-Wl,--build-id"])
    if rc != 0:
        return rc
    stamp = layout.check_moltstamp()
    rc, _ = tools.run([stamp, out, target])
    if rc != 0:
        raise Fatal("moltstamp could not stamp %s with the build-id of %s" % (out, target))
    return 0


# ---------------------------------------------------------------------------
# A patch from the fix itself (issue 10): --molt-diff FIX.patch... or
# --molt-orig OLD NEW...  (entry point; the object-level pipeline that
# takes the TUBuilds is the lead's, not integrated yet)
# ---------------------------------------------------------------------------

def prepare_fix(s):
    """PROG's compile record, the fix, the affected TUs and their builds
    (source.TUBuild: orig/new text and compile, in the real tree or a
    mirror under the work directory).  Notes go to the report."""
    from .source import Program, affected_units, fix_from_options, prepare_builds
    opts = s.options
    target = opts.target
    if not target:
        raise Fatal("--molt-patch needs --molt-target PROGRAM (the program the patch is for)")
    if not os.path.isfile(target):
        raise Fatal("target %s does not exist" % target)
    flags = gccargs.without(s.cmd.args, gccargs.INPUT, gccargs.OUTPUT)
    if flags and opts.diff:
        s.report.warn("compiler options are not used with a fix (%s): each file is compiled with "
                      "the flags of %s's compile record" % (" ".join(flags[:4]), target))
    prog = Program(target, s.report)
    fix = fix_from_options(s, prog)
    units = affected_units(prog, fix)
    builds = prepare_builds(prog, fix, units, s.work.file("fix"))
    for n in fix.notes:
        s.report.messages.append("moltcc: note: " + n)
    for b in builds:
        s.report.note("%s: affected by %s (%s; orig in the %s tree, new in the %s tree)"
                      % (b.rel, ", ".join(b.because), "woven" if b.woven else "not woven",
                         b.orig.tree, b.new.tree))
    s.flush_report()
    return prog, fix, builds


def build_patch_from_fix(s):
    if not s.cmd.output:
        raise Fatal("--molt-patch needs -o PATCH.so")
    try:
        prog, fix, builds = prepare_fix(s)
    finally:
        s.work.finish()
    raise Fatal("building a patch from a fix is not finished yet (found %d affected "
                "translation units: %s)" % (len(builds), " ".join(b.rel for b in builds)))
