"""Patch builds: `moltcc --molt-patch --molt-target PROG -o fix.so` with the
fix as --molt-diff FIX.patch (a series: repeated), --molt-orig OLD NEW...,
or the new versions of the changed files (the old form).

The fix becomes changed files, affected translation units and their builds
(source.py); pipeline.py compares the builds, refuses what a hot patch
cannot carry, decides what each function becomes, generates, compiles,
links and stamps the patch, and reports what it contains.
"""
import os

from .. import gccargs
from ..elf import SymbolError, read_symtab
from ..errors import Fatal


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
    """Every patch is built from a fix: --molt-diff, --molt-orig, or (the
    old form) the new versions of recorded files on the command line."""
    return build_patch_from_fix(s)


# ---------------------------------------------------------------------------
# A patch from the fix (issue 10): --molt-diff FIX.patch..., --molt-orig OLD
# NEW..., or the new files themselves; pipeline.py decides what it contains
# ---------------------------------------------------------------------------

def prepare_fix(s):
    """PROG's compile record, the fix, the affected TUs and their builds
    (source.TUBuild: orig/new text and compile, in the real tree or a
    mirror under the work directory).  Notes go to the report."""
    from .source import (Program, affected_units, fix_from_new_files, fix_from_options,
                         prepare_builds)
    opts = s.options
    target = opts.target
    flags = gccargs.without(s.cmd.args, gccargs.INPUT, gccargs.OUTPUT)
    prog = Program(target, s.report)
    if opts.diff or opts.orig is not None:
        if flags and opts.diff:
            s.report.warn("compiler options are not used with a fix (%s): each file is compiled "
                          "with the flags of %s's compile record" % (" ".join(flags[:4]), target))
        fix = fix_from_options(s, prog)
    else:
        news = [x.path for x in s.cmd.inputs if x.lang == "c"]
        if not news:
            raise Fatal("--molt-patch needs the fix: --molt-diff FIX.patch, --molt-orig OLD NEW..., "
                        "or the new versions of the changed source files")
        missing = [n for n in news if not os.path.isfile(n)]
        if missing:
            raise Fatal("%s: no such file" % missing[0])
        names = [os.path.basename(n) for n in news]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise Fatal("two patch sources are named %s; give the fix as --molt-diff or "
                        "--molt-orig, or build separate patches" % dups[0])
        if flags:
            s.report.messages.append(
                "moltcc: note: compiler options are not used (%s): each file is compiled with "
                "the flags of %s's compile record" % (" ".join(flags[:4]), target))
        fix = fix_from_new_files(prog, news)
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
    from .pipeline import build_from_fix
    opts = s.options
    s.layout.check_include()
    target = opts.target
    if not target:
        raise Fatal("--molt-patch needs --molt-target PROGRAM (the program the patch is for)")
    if not os.path.isfile(target):
        raise Fatal("target %s does not exist" % target)
    if not s.cmd.output:
        raise Fatal("--molt-patch needs -o PATCH.so")
    # the old form may add objects and archives to the patch's link; with
    # --molt-orig the inputs are the new files and trees
    others = [] if opts.diff or opts.orig is not None else \
        [x for x in s.cmd.inputs if x.lang != "c"]
    for x in others:
        if x.lang not in ("object",):
            raise Fatal("%s: only C sources, objects and archives can go into a patch" % x.path)
    if opts.callbacks:
        if not os.path.isfile(opts.callbacks):
            raise Fatal("--molt-callbacks %s: no such file" % opts.callbacks)
        opts.callbacks = os.path.abspath(opts.callbacks)
    from .plain import has_compile_record
    if not has_compile_record(target):
        return build_plain(s, others)
    if opts.attach:
        raise Fatal("%s was built with moltcc (it has a compile record): give it a hot patch "
                    "(molt apply) and build that without --molt-attach" % target)
    symtab = read_target(target)
    try:
        prog, fix, builds = prepare_fix(s)
        return build_from_fix(s, symtab, prog, fix, builds, [x.path for x in others])
    finally:
        s.work.finish()


# ---------------------------------------------------------------------------
# A plainly built PROG (no compile record): an attach patch (plain.py)
# ---------------------------------------------------------------------------

def build_plain(s, others):
    """The patch for `molt attach` of a program built without moltcc: the
    fix's files from the source tree (the current directory or
    --molt-source), compiled with the command line's flags."""
    from .pipeline import build_from_fix
    from .plain import PlainImage, PlainProgram, check_flags, compiler_and_flags
    from .source import affected_units, fix_from_options, prepare_builds
    opts = s.options
    target = opts.target
    if not (opts.diff or opts.orig is not None):
        raise Fatal("%s has no compile record (it was built without moltcc): its patch is built "
                    "from the fix, --molt-diff FIX.patch or --molt-orig OLD NEW..., with the "
                    "flags it was compiled with on the command line" % target)
    if others:
        raise Fatal("%s: objects cannot go into an attach patch" % others[0].path)
    # the patch runs in a process without sanitizer runtimes, whatever
    # libmolt was built with
    s.layout.san_flags = lambda: []
    s.layout.sanitizers = lambda: []
    s.layout.check_include()
    root = os.path.abspath(opts.source or os.getcwd())
    if not os.path.isdir(root):
        raise Fatal("--molt-source %s: not a directory" % opts.source)
    image = PlainImage(target)
    compiler, flags = compiler_and_flags(s)
    if not flags and not image.has_debug:
        raise Fatal("%s has no compile record (it was built without moltcc) and no debug "
                    "information: give the flags it was compiled with on the command line "
                    "(at least its -O level, and its -I and -D options)" % target)
    s.report.note("%s was built without moltcc: an attach patch (molt attach), compiled in %s "
                  "with %s" % (target, root, " ".join(flags) or "no flags"))
    if not image.has_debug:
        s.report.warn("%s has no debug information: moltcc cannot check the flags given against "
                      "it, nor find copies of a changed function that its compiler inlined and "
                      "this rebuild does not (build it with -g)" % target)
    try:
        prog = PlainProgram(target, image, root, compiler, flags, s.report)
        fix = fix_from_options(s, prog)
        units = affected_units(prog, fix)
        check_flags(image, flags, sorted({os.path.basename(a.record.abspath) for a in units}))
        builds = prepare_builds(prog, fix, units, s.work.file("fix"))
        for n in fix.notes:
            s.report.messages.append("moltcc: note: " + n)
        s.flush_report()
        return build_from_fix(s, image.symtab(), prog, fix, builds)
    finally:
        s.work.finish()
