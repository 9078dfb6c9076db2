"""moltcc — drop-in wrapper around the system C compiler that makes C
programs updatable with molt, and builds hot patches for them.

    make CC=moltcc                  # program build (build.py)
    moltcc --molt-patch --molt-target ./server -o fix1.so server.c [cflags]
                                    # a hot patch (patch/)
    moltcc --molt-program -o prog.so *.c [cflags]          # full updates: an image
    moltcc --molt-program --molt-from prog.so --molt-xf v2.xf -o prog2.so *.c
                                    # the next version, with its migration code
                                    # (image/)
    moltcc --molt-show-build PROG   # PROG's compile record (record.py) as
                                    # compile_commands.json
    moltcc --molt-patch --molt-target ./plain-server --molt-diff fix.patch -o fix.so -O2 -g ...
                                    # a patch for `molt attach`: PROG built without
                                    # moltcc (patch/plain.py); --molt-attach is the same
    moltcc --molt-attach --molt-target ./server -o fix.so fix.c [cflags]
                                    # a patch for `molt attach` from the new functions
                                    # themselves (attach.py)

The driver reads the command line: the --molt-* options (the real compiler
never sees them) and the compiler's own (gccargs.Command), finds molt
(toolchain.locate), makes the Session that every mode takes, and runs the
mode.  It turns errors.Fatal into `moltcc: error: ...` and exit status 1.
"""
import os
import re
import sys
import time

from . import gccargs, record
from .errors import PROG, Diagnostic, Fatal
from .session import Session
from .toolchain import Toolchain, locate

# How a --molt-* option takes its value.
FLAG = "flag"       # --molt-keep
VALUE = "value"     # --molt-target PROG or --molt-target=PROG
LIST = "list"       # a value that may be given several times (--molt-xf)

# option -> (MoltOptions attribute, kind)
MOLT_OPTIONS = {
    "--molt-patch": ("patch", FLAG),
    "--molt-attach": ("attach", FLAG),
    "--molt-program": ("program", FLAG),
    "--molt-keep": ("keep", FLAG),
    "--molt-verbose": ("verbose", FLAG),
    "--molt-target": ("target", VALUE),
    "--molt-patch-id": ("patch_id", VALUE),
    "--molt-description": ("description", VALUE),
    "--molt-funcs": ("funcs", VALUE),
    "--molt-updatable": ("updatable", VALUE),
    "--molt-from": ("from_image", VALUE),
    "--molt-xf": ("xf", LIST),
    "--molt-diff": ("diff", LIST),          # a fix as a unified diff (a series: in order)
    "--molt-strip": ("strip", VALUE),       # its strip level (also -p N with --molt-diff)
    "--molt-source": ("source", VALUE),     # where the sources PROG was built from are now
    "--molt-orig": ("orig", VALUE),         # a fix as OLD tree + new files/tree (inputs)
    "--molt-report": ("report", VALUE),     # the patch build's report as JSON
    "--molt-callbacks": ("callbacks", VALUE),  # the fix's pre/post-update callbacks (a C file)
    "--molt-show-build": ("show_build", VALUE),
}
# From the CMake-generated launcher (moltcc.cmake): where molt is
# (toolchain.locate); not listed to the user.
INTERNAL_OPTIONS = {
    "--molt-internal-include": "include",
    "--molt-internal-libdir": "libdir",
    "--molt-internal-moltstamp": "moltstamp",
    "--molt-internal-sanitize": "sanitize",
}

# Options that belong to one mode only.
PATCH_ONLY = ("--molt-target", "--molt-patch-id", "--molt-description", "--molt-diff",
              "--molt-strip", "--molt-source", "--molt-orig", "--molt-report",
              "--molt-callbacks")
PROGRAM_ONLY = ("--molt-from", "--molt-xf")
NOT_WITH_PROGRAM = PATCH_ONLY + ("--molt-funcs", "--molt-updatable")


class MoltOptions:
    """The --molt-* options of one run (None / False / [] when not given)."""

    def __init__(self):
        for attr, kind in MOLT_OPTIONS.values():
            setattr(self, attr, False if kind == FLAG else [] if kind == LIST else None)
        self.internal = {}      # INTERNAL_OPTIONS' names -> value
        self.given = set()      # the options on the command line


def split_molt_options(argv):
    """(MoltOptions, the compiler's arguments): strips --molt-* options."""
    opts = MoltOptions()
    rest = []
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if not a.startswith("--molt-"):
            rest.append(a)
            continue
        name, eq, val = a.partition("=")
        attr, kind = MOLT_OPTIONS.get(name) or (INTERNAL_OPTIONS.get(name), VALUE)
        if attr is None or (kind == FLAG and eq):
            raise Fatal("unknown option %s (known: %s)" % (a, ", ".join(sorted(MOLT_OPTIONS))))
        opts.given.add(name)
        if kind == FLAG:
            setattr(opts, attr, True)
            continue
        if not eq:
            if i >= len(argv):
                raise Fatal("%s needs a value" % name)
            val = argv[i]
            i += 1
        if name in INTERNAL_OPTIONS:
            opts.internal[attr] = val
        elif kind == LIST:
            getattr(opts, attr).append(val)
        else:
            setattr(opts, attr, val)
    return opts, rest


def take_strip_option(opts, rest):
    """With --molt-diff, `-p N` and `-pN` are the diff's strip level, as
    for patch(1) (the compiler's flags are not used with a diff; without
    --molt-diff, -p keeps gcc's meaning).  Returns the rest without them."""
    if not opts.diff:
        return rest
    out = []
    i = 0
    found = []
    while i < len(rest):
        a = rest[i]
        if a == "-p" and i + 1 < len(rest) and rest[i + 1].isdigit():
            found.append(rest[i + 1])
            i += 2
            continue
        if re.fullmatch(r"-p\d+", a):
            found.append(a[2:])
            i += 1
            continue
        out.append(a)
        i += 1
    for v in found:
        if opts.strip is not None and int(opts.strip) != int(v):
            raise Fatal("two strip levels given (%s and %s)" % (opts.strip, v))
        opts.strip = v
    if opts.strip is not None:
        if not str(opts.strip).isdigit():
            raise Fatal("--molt-strip needs a number (the -p of patch(1)), not %r" % opts.strip)
        opts.strip = int(opts.strip)
    return out


def show_build(s):
    """--molt-show-build PROG: PROG's compile record as compile_commands.json."""
    prog = s.options.show_build
    recs = record.read_records(prog)
    if not recs:
        raise Fatal("%s has no compile record (it was not built by this moltcc, or a tool "
                    "removed the %s section)" % (prog, record.SECTION))
    sys.stdout.write(record.compile_commands(recs))
    return 0


def choose_mode(opts, rest):
    """The build function for these options; refuses options that do not
    belong to the mode."""
    if opts.show_build is not None:
        others = sorted(k for k in opts.given if k not in ("--molt-show-build", "--molt-verbose")
                        and k not in INTERNAL_OPTIONS)
        if others or rest:
            raise Fatal("--molt-show-build PROG takes nothing else (got %s)"
                        % " ".join(others + rest))
        return show_build
    if opts.strip is not None and not opts.diff:
        raise Fatal("--molt-strip is only meaningful with --molt-diff")
    if opts.attach and (opts.diff or opts.orig is not None):
        # --molt-attach with a fix is --molt-patch: the builder sees that
        # PROG has no compile record and makes an attach patch
        if opts.program:
            raise Fatal("--molt-program and --molt-attach cannot be combined")
        opts.patch = True
    elif opts.attach:
        others = sorted(k for k in opts.given if k not in
                        ("--molt-attach", "--molt-target", "--molt-verbose", "--molt-keep",
                         "--molt-callbacks")
                        and k not in INTERNAL_OPTIONS)
        if others:
            raise Fatal("%s not meaningful with --molt-attach" % ", ".join(others))
        from .attach import build_attach
        return build_attach
    if opts.program:
        if opts.patch:
            raise Fatal("--molt-program and --molt-patch cannot be combined")
        for k in NOT_WITH_PROGRAM:
            if k in opts.given:
                raise Fatal("%s is not meaningful with --molt-program" % k)
        # libclang and pyelftools are loaded only by the modes that need them
        from .image.build import build_image
        return build_image
    for k in PROGRAM_ONLY:
        if k in opts.given:
            raise Fatal("%s is only meaningful with --molt-program" % k)
    if opts.patch:
        from .patch.build import build_patch
        return build_patch
    for k in PATCH_ONLY:
        if k in opts.given:
            raise Fatal("%s is only meaningful with --molt-patch" % k)
    from .build import build_program
    return build_program


def main(argv):
    started = time.time() - 1
    try:
        opts, rest = split_molt_options(argv)
        verbose = opts.verbose or os.environ.get("MOLT_VERBOSE", "") not in ("", "0")
        rest = take_strip_option(opts, gccargs.expand_response_files(rest))
        if rest and not (opts.patch or opts.show_build or opts.attach):
            rest = rest + gccargs.env_flags()
        layout = locate(opts.internal)
        cmd = gccargs.Command(rest)
        build = choose_mode(opts, rest)
        return build(Session(cmd, opts, layout, Toolchain(verbose), started))
    except Diagnostic as e:
        sys.stderr.write("%s\n" % e)
        return 1
    except Fatal as e:
        sys.stderr.write("%s: error: %s\n" % (PROG, e))
        return 1
    except KeyboardInterrupt:
        return 130
