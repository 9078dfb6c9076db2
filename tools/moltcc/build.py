"""Program builds, the default mode (make CC=moltcc): the user's compile or
link, with the translation units that have updatable functions woven into
a private directory and compiled from there, and libmolt on every link.

Everything that needs no weaving (-E, -M, probes, files without markers)
goes to the real compiler unchanged, with molt.h's directory and the
sanitizer flags; libclang is loaded only when a file mentions a marker.

Every C file compiled here, woven or not, leaves its compile record
(record.py) in the object it went into: the compile's dependency output
is captured (Deps) and, after the compile succeeded, objcopy adds the
record to the object (compile mode) or to the linked file (link mode, for
the files the link compiles itself).
"""
import os

from . import gccargs, record
from .errors import Fatal
from .markers import Selection, file_has_markers, read_funcs_file
from .toolchain import color_flags, generated_flags, strip_lto


class Woven:
    def __init__(self, inp, path, names):
        self.inp = inp
        self.path = path          # generated file (same basename)
        self.names = names


def weave_file(s, inp, sel):
    """Returns a Woven, or None when the file has nothing to make updatable."""
    from .unit import Unit, UnitError
    from .weave import ProgramWeaver
    try:
        unit = Unit(os.path.abspath(inp.path), inp.path, s.clang_args())
    except UnitError as e:
        s.report.warn("%s; it is compiled unchanged (nothing in it is updatable)" % e)
        return None
    w = ProgramWeaver(unit, s.layout.include, s.report)
    # A PIC compile may be for a shared object, whose link would need the
    # versions of the source-name aliases defined (weave.ProgramWeaver).
    w.export_names = not s.cmd.has("-fPIC", "-fpic", "-shared")
    fns = w.select(sel)
    if not fns:
        return None
    text = w.weave(fns)
    d = s.work.subdir()
    out = os.path.join(d, os.path.basename(inp.path))
    with open(out, "wb") as f:
        f.write(text)
    return Woven(inp, out, [f.name for f in fns])


# The generated functions of a woven object that carry the function's name
# in its debug info (weave.py): version 0 and the dispatch path.
PROGRAM_SUFFIXES = ("__molt_v0", "__molt_dispatch")


def source_names(path):
    """Debuggers, addr2line and perf read a function's name from DWARF:
    version 0 and the dispatch path of f are named `f` there, as the user
    wrote it (the symbol table keeps f__molt_v0: the patch builder reads
    the program's bodies by that name)."""
    from .elf import rename_debug_names
    if os.path.isfile(path):
        rename_debug_names(path, PROGRAM_SUFFIXES)


def fix_dep_file(path, woven, original):
    """The dependency file names the generated source: make it name the
    user's file again (make would otherwise look for a deleted temp file)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return
    def esc(p):
        return p.replace("$", "$$").replace(" ", "\\ ").replace("#", "\\#").encode()
    new = data.replace(esc(woven), esc(original))
    if new != data:
        with open(path, "wb") as f:
            f.write(new)


def dep_candidates(cmd, inp):
    if cmd.dep_file:
        return [cmd.dep_file]
    if not cmd.has("-MD", "-MMD"):
        return []
    out = []
    if cmd.output and cmd.mode == "compile":
        out.append(os.path.splitext(cmd.output)[0] + ".d")
    out.append(os.path.splitext(os.path.basename(inp.path))[0] + ".d")
    return out


class Recorder:
    """Writes the compile records of one program build."""

    def __init__(self, s, updatable, funcs):
        self.s = s
        self.updatable = updatable
        self.funcs = sorted(funcs)
        self.cwd = os.getcwd()
        self.n = 0

    def deps(self, args, x):
        """The Deps of the compile of input x with the user's args."""
        self.n += 1
        return record.Deps(self.s.tools.cc, args, self.s.work.file("deps-%d.d" % self.n),
                           dep_candidates(self.s.cmd, x))

    def exclude(self):
        """Directories whose files are not the project's: molt.h's, and
        the work directory (woven sources)."""
        out = [os.path.normpath(self.s.layout.include)]
        if self.s.work.path:
            out.append(self.s.work.path)
        return out

    def make(self, args, x, output, dep_paths, woven):
        """The record of the compile of x (None, with a warning, when its
        dependency output is missing)."""
        if dep_paths is None:
            self.s.report.warn("%s: no dependency output of its compile; it has no compile "
                               "record (patches cannot be built from a diff of it)" % x.path)
            self.s.flush_report()
            return None
        return record.make_record(self.s.tools.cc, args, x.path, output, self.cwd, dep_paths,
                                  woven, self.updatable, self.funcs)

    def embed(self, path, records, asm=False):
        records = [r for r in records if r is not None]
        if not records:
            return
        err = record.embed(path, records, self.s.tools, self.s.work.file(""), asm)
        if err:
            self.s.report.warn("%s: cannot add the compile record (%s); patches cannot be built "
                               "from a diff of %s" % (path, err, ", ".join(r.file for r in records)))
            self.s.flush_report()


def default_output(cmd, x):
    """Where a compile writes the object of input x."""
    if cmd.output and len(cmd.inputs) == 1:
        return cmd.output
    stem = os.path.splitext(os.path.basename(x.path))[0]
    return stem + (".s" if cmd.has("-S") else ".o")




def build_program(s):
    cmd, layout, tools = s.cmd, s.layout, s.tools
    updatable = "marked" if s.options.updatable is None else s.options.updatable
    if updatable not in ("all", "marked"):
        raise Fatal("--molt-updatable must be 'all' or 'marked'")
    mode = cmd.mode
    if mode == "passthrough" or not cmd.inputs:
        # -E/-M see the macros (__SANITIZE_ADDRESS__) the compile will see
        extra = ["-I" + layout.include] + layout.san_flags() if cmd.inputs else []
        tools.exec_cc(cmd.args + extra)
    layout.check_include()
    from_funcs = set()
    if s.options.funcs is not None:
        from_funcs = read_funcs_file(s.options.funcs, s.clang_args())
    todo = [x for x in cmd.c_inputs()
            if updatable == "all" or file_has_markers(x.path, cmd, layout, from_funcs)]
    linking = mode == "link"
    link_extra = []
    san = layout.san_flags()
    if linking and not cmd.has("-r", "-nostdlib", "-nodefaultlibs"):
        layout.check_lib()
        link_extra = ["-L" + layout.libdir, "-lmolt", "-Wl,-rpath," + layout.libdir,
                      "-Wl,--build-id", "-pthread"]
    elif linking:
        san = []    # partial or bare link: no sanitizer runtime pulled in
    # Every compile and link gets molt.h's directory and, when libmolt was
    # built with sanitizers, the same -fsanitize= flags (a program or shared
    # object linked against a sanitized libmolt must be linked with them).
    inc = ["-I" + layout.include] + san
    lto = _lto_records(cmd) if linking else []
    if not todo and not cmd.c_inputs() and not lto:
        tools.exec_cc(cmd.args + inc + link_extra)    # nothing to weave or record

    sel = Selection(updatable == "all", from_funcs, s.report.verbose)
    rec = Recorder(s, updatable, from_funcs)
    work = s.work
    try:
        woven = {}
        for x in todo:
            wv = weave_file(s, x, sel)
            s.flush_report()
            if wv:
                woven[x.index] = wv
        if mode == "compile":
            rc = _compile_mode(s, woven, inc, rec)
        else:
            rc = _link_mode(s, woven, inc, link_extra, rec, lto)
        work.finish()
        return rc
    except BaseException:
        work.finish(failed_internal=work.keep)
        raise


def _compile_mode(s, woven, inc, rec):
    cmd, tools = s.cmd, s.tools
    extra_color = color_flags(cmd)
    if len(cmd.inputs) > 1 and cmd.output:
        # gcc refuses -o with -c/-S and several inputs: let it say so.
        tools.exec_cc(cmd.args + inc)
    if len(cmd.inputs) == 1:
        groups = [(cmd.args, cmd.inputs[0])]
    else:
        # One compiler run per input: the -iquote that makes a generated
        # file find its user's headers must not leak into other files.
        base = gccargs.without(cmd.args, gccargs.INPUT)
        groups = [(base + x.args(), x) for x in cmd.inputs]
    rc_all = 0
    c_inputs = {x.index for x in cmd.c_inputs()}
    for args, x in groups:
        wv = woven.get(x.index)
        deps = rec.deps(args, x) if x.index in c_inputs else None
        dep_flags = deps.flags if deps else []
        if wv is None:
            rc, _ = tools.run(tools.cc + args + inc + dep_flags)
            if rc == 0 and deps:
                _record_object(rec, cmd, args, x, deps, False)
            rc_all = rc_all or rc
            continue
        if len(cmd.inputs) == 1:
            new = list(args)
            new[x.index] = wv.path
        else:
            new = list(args[:-len(x.args())]) + x.args(wv.path)
        front, back = generated_flags(x.path, wv.path)
        full = tools.cc + front + strip_lto(new, x.path) + inc + back + extra_color + dep_flags
        # The check compile is the user's command writing its outputs into
        # the work directory (it must not leave a non-updatable object where
        # make would take it for up to date).
        check = tools.cc + gccargs.without(args, gccargs.OUTPUT, gccargs.DEPS) + \
            ["-o", s.work.file("check.out")] + inc + extra_color
        rc = s.compile_generated(full, check, x.path)
        if rc == 0:
            if not cmd.has("-S"):
                source_names(default_output(cmd, x))
            for d in dep_candidates(cmd, x):
                fix_dep_file(d, wv.path, x.path)
            _record_object(rec, cmd, args, x, deps, True)
        rc_all = rc_all or rc
    return rc_all


def _record_object(rec, cmd, args, x, deps, woven):
    out = default_output(cmd, x)
    r = rec.make(args, x, out, deps.read(rec.cwd, rec.exclude()), woven)
    rec.embed(out, [r], asm=cmd.has("-S"))


def _lto_records(cmd):
    """The records of the LTO objects on a link line (see
    record.lto_object_records).  Archive members are not looked at: which
    of them a link uses is the linker's choice."""
    out = []
    for x in cmd.inputs:
        if x.lang == "object" and not x.path.endswith(".a") and os.path.isfile(x.path):
            out += record.lto_object_records(x.path)
    return out


def _link_mode(s, woven, inc, link_extra, rec, lto):
    """Generated sources are compiled to private objects first, then the
    user's link line runs with those objects in place of the sources.  The
    records of all C inputs, and those of LTO objects, which the link would
    lose, go into the linked file."""
    cmd, tools = s.cmd, s.tools
    compile_base = gccargs.without(cmd.args, gccargs.INPUT, gccargs.OUTPUT, gccargs.DEPS,
                                   gccargs.LINK)
    final = list(cmd.args)
    records = {}
    for idx, wv in sorted(woven.items(), reverse=True):
        obj = os.path.join(os.path.dirname(wv.path),
                           os.path.splitext(os.path.basename(wv.path))[0] + ".o")
        front, back = generated_flags(wv.inp.path, wv.path)
        deps = rec.deps(compile_base, wv.inp)
        full = tools.cc + front + strip_lto(compile_base, wv.inp.path) + ["-c", wv.path, "-o", obj] \
            + inc + back + color_flags(cmd) + deps.flags
        orig = tools.cc + compile_base + ["-c", wv.inp.path, "-o", obj + ".orig.o"] + inc
        rc = s.compile_generated(full, orig, wv.inp.path)
        if rc != 0:
            return rc
        source_names(obj)
        records[idx] = (wv.inp, deps.read(rec.cwd, rec.exclude()), True)
        final[idx:idx + 1] = ["-x", "none", obj] + (["-x", wv.inp.lang] if wv.inp.explicit else [])
    # The C files the link compiles itself: one alone (nothing else the
    # link preprocesses) writes its deps to a private file through the
    # link; otherwise each is preprocessed once more for them (-MM).
    others = [x for x in cmd.c_inputs() if x.index not in woven]
    inline = None
    if len(others) == 1 and not any(x.kind == gccargs.DEPS for x in gccargs.split(cmd.args)) \
            and all(x.lang == "object" for x in cmd.inputs if x.index not in woven
                    and x is not others[0]):
        inline = rec.deps(cmd.args, others[0])
    rc, _ = tools.run(tools.cc + final + inc + link_extra + (inline.flags if inline else []))
    if rc != 0:
        return rc
    for x in others:
        if inline:
            paths = inline.read(rec.cwd, rec.exclude())
        else:
            paths = record.preprocess_deps(tools, compile_base + inc, x.args(),
                                           s.work.file("deps-mm-%d.d" % x.index), rec.cwd,
                                           rec.exclude())
        records[x.index] = (x, paths, False)
    out = cmd.output or "a.out"
    rec.embed(out, lto + [rec.make(compile_base + ["-c"] + x.args(), x, out, paths, wv)
                          for _, (x, paths, wv) in sorted(records.items())])
    return rc
