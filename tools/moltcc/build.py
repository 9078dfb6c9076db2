"""Program builds, the default mode (make CC=moltcc): the user's compile or
link, with the translation units that have updatable functions woven into
a private directory and compiled from there, and libmolt on every link.

Everything that needs no weaving (-E, -M, probes, files without markers)
goes to the real compiler unchanged, with molt.h's directory and the
sanitizer flags; libclang is loaded only when a file mentions a marker.
"""
import os

from . import gccargs
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
    fns = w.select(sel)
    if not fns:
        return None
    text = w.weave(fns)
    d = s.work.subdir()
    out = os.path.join(d, os.path.basename(inp.path))
    with open(out, "wb") as f:
        f.write(text)
    return Woven(inp, out, [f.name for f in fns])


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


STRICT_C89 = ("-ansi", "-std=c89", "-std=c90", "-std=iso9899:1990", "-std=iso9899:199409")


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
    if not todo:
        tools.exec_cc(cmd.args + inc + link_extra)

    sel = Selection(updatable == "all", from_funcs, s.report.verbose)
    work = s.work
    try:
        woven = {}
        for x in todo:
            wv = weave_file(s, x, sel)
            s.flush_report()
            if wv:
                woven[x.index] = wv
        if not woven:
            work.finish()
            tools.exec_cc(cmd.args + inc + link_extra)
        strict89 = [a for a in cmd.args if a in STRICT_C89]
        if strict89 and not any(a.startswith("-std=") and a not in strict89 for a in
                                cmd.args[cmd.args.index(strict89[-1]) + 1:]):
            raise Fatal("%s: updatable functions need C99 or GNU C (molt.h uses inline and "
                        "_Atomic), but this compile uses %s" % (
                            ", ".join(w.inp.path for w in woven.values()), strict89[-1]))
        if mode == "compile":
            rc = _compile_mode(s, woven, inc)
        else:
            rc = _link_mode(s, woven, inc, link_extra)
        work.finish()
        return rc
    except BaseException:
        work.finish(failed_internal=work.keep)
        raise


def _compile_mode(s, woven, inc):
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
    for args, x in groups:
        wv = woven.get(x.index)
        if wv is None:
            rc, _ = tools.run(tools.cc + args + inc)
            rc_all = rc_all or rc
            continue
        if len(cmd.inputs) == 1:
            new = list(args)
            new[x.index] = wv.path
        else:
            new = list(args[:-len(x.args())]) + x.args(wv.path)
        front, back = generated_flags(x.path, wv.path)
        full = tools.cc + front + strip_lto(new, x.path) + inc + back + extra_color
        # The check compile is the user's command writing its outputs into
        # the work directory (it must not leave a non-updatable object where
        # make would take it for up to date).
        check = tools.cc + gccargs.without(args, gccargs.OUTPUT, gccargs.DEPS) + \
            ["-o", s.work.file("check.out")] + inc + extra_color
        rc = s.compile_generated(full, check, x.path)
        if rc == 0:
            for d in dep_candidates(cmd, x):
                fix_dep_file(d, wv.path, x.path)
        rc_all = rc_all or rc
    return rc_all


def _link_mode(s, woven, inc, link_extra):
    """Generated sources are compiled to private objects first, then the
    user's link line runs with those objects in place of the sources."""
    cmd, tools = s.cmd, s.tools
    compile_base = gccargs.without(cmd.args, gccargs.INPUT, gccargs.OUTPUT, gccargs.DEPS,
                                   gccargs.LINK)
    final = list(cmd.args)
    for idx, wv in sorted(woven.items(), reverse=True):
        obj = os.path.join(os.path.dirname(wv.path),
                           os.path.splitext(os.path.basename(wv.path))[0] + ".o")
        front, back = generated_flags(wv.inp.path, wv.path)
        full = tools.cc + front + strip_lto(compile_base, wv.inp.path) + ["-c", wv.path, "-o", obj] \
            + inc + back + color_flags(cmd)
        orig = tools.cc + compile_base + ["-c", wv.inp.path, "-o", obj + ".orig.o"] + inc
        rc = s.compile_generated(full, orig, wv.inp.path)
        if rc != 0:
            return rc
        final[idx:idx + 1] = ["-x", "none", obj] + (["-x", wv.inp.lang] if wv.inp.explicit else [])
    rc, _ = tools.run(tools.cc + final + inc + link_extra)
    return rc
