"""moltcc — drop-in wrapper around the system C compiler that makes C
programs updatable with molt, and builds hot patches for them.

    make CC=moltcc                  # program build
    moltcc --molt-patch --molt-target ./server -o fix1.so server.c [cflags]
    moltcc --molt-program -o prog.so *.c [cflags]          # full updates: an image
    moltcc --molt-program --molt-from prog.so --molt-xf v2.xf -o prog2.so *.c
                                    # the next version, with its migration code
                                    # (moltcc_program.py, moltcc_xfgen.py)

Program builds: translation units that contain updatable functions
(MOLT_UPDATABLE, /** DSU_FUNC */ or /// DSU_FUNC, --molt-funcs=FILE,
--molt-updatable=all) are rewritten source-to-source with libclang into a
private temporary directory and compiled from there with the user's flags;
everything else goes to the real compiler unchanged.  Links get libmolt.

The real compiler is $MOLT_CC or `cc`.  The runtime (include/molt.h,
libmolt.so, moltstamp) is found through $MOLT_PREFIX, else through the paths
the CMake-generated launcher passes, else relative to this file (installed
tree or source tree + build/).
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

PROG = "moltcc"


class Fatal(Exception):
    """A one-line error for the user: `moltcc: error: ...`, exit 1."""


def verbose_enabled():
    return os.environ.get("MOLT_VERBOSE", "") not in ("", "0")


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------

# --molt-internal-* come from the CMake-generated launcher (moltcc.cmake).
INTERNAL_OPTS = {"--molt-internal-include", "--molt-internal-libdir",
                 "--molt-internal-moltstamp", "--molt-internal-sanitize"}
MOLT_VALUE_OPTS = {"--molt-target", "--molt-patch-id", "--molt-description",
                   "--molt-funcs", "--molt-updatable", "--molt-from"} | INTERNAL_OPTS
# value options that may be given several times (a list in the result)
MOLT_LIST_OPTS = {"--molt-xf"}
MOLT_FLAG_OPTS = {"--molt-patch", "--molt-keep", "--molt-verbose", "--molt-program"}

# gcc options whose value is the next argument
SEP_VALUE = {"-o", "-I", "-D", "-U", "-include", "-imacros", "-isystem", "-idirafter",
             "-iquote", "-iprefix", "-iwithprefix", "-iwithprefixbefore", "-isysroot",
             "-imultilib", "-MF", "-MT", "-MQ", "-x", "-L", "-l", "-Xlinker",
             "-Xassembler", "-Xpreprocessor", "-u", "-T", "-z", "--param", "-aux-info",
             "-dumpbase", "-dumpbase-ext", "-dumpdir", "-A", "-e", "-B", "--sysroot",
             "-wrapper", "-specs", "-Xclang", "--entry"}
LINK_ONLY_FLAGS = {"-shared", "-static", "-rdynamic", "-pie", "-no-pie", "-s", "-r",
                   "-nostdlib", "-nodefaultlibs", "-nostartfiles", "-static-libgcc",
                   "-shared-libgcc", "-static-pie", "-symbolic"}
LINK_ONLY_VALUE = {"-L", "-l", "-Xlinker", "-T", "-u", "-z", "-e", "--entry"}
DEP_FLAGS = {"-MD", "-MMD", "-MP", "-M", "-MM", "-MG"}
DEP_VALUE = {"-MF", "-MT", "-MQ"}

C_SUFFIXES = {".c": "c", ".i": "cpp-output", ".h": "c-header", ".s": "assembler",
              ".S": "assembler-with-cpp", ".sx": "assembler-with-cpp",
              ".cc": "c++", ".cpp": "c++", ".cxx": "c++", ".C": "c++", ".ii": "c++-cpp-output"}


def split_molt_options(argv):
    """Strips --molt-* options (the real compiler never sees them)."""
    molt = {}
    rest = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--molt-"):
            name, eq, val = a.partition("=")
            if name in MOLT_VALUE_OPTS or name in MOLT_LIST_OPTS:
                if not eq:
                    if i + 1 >= len(argv):
                        raise Fatal("%s needs a value" % name)
                    val = argv[i + 1]
                    i += 1
                if name in MOLT_LIST_OPTS:
                    molt.setdefault(name, []).append(val)
                else:
                    molt[name] = val
            elif name in MOLT_FLAG_OPTS and not eq:
                molt[name] = True
            else:
                raise Fatal("unknown option %s (known: %s)" % (
                    a, ", ".join(sorted(MOLT_FLAG_OPTS | MOLT_LIST_OPTS | MOLT_VALUE_OPTS - INTERNAL_OPTS))))
        else:
            rest.append(a)
        i += 1
    return molt, rest


def expand_response_files(args, depth=0):
    """gcc's @file: arguments read from a file (whitespace separated, quotes
    and backslashes as in a shell)."""
    out = []
    for a in args:
        if a.startswith("@") and len(a) > 1 and os.path.isfile(a[1:]) and depth < 10:
            with open(a[1:], encoding="utf-8", errors="surrogateescape") as f:
                out.extend(expand_response_files(shlex.split(f.read()), depth + 1))
        else:
            out.append(a)
    return out


class Input:
    def __init__(self, index, path, lang, explicit_lang):
        self.index = index
        self.path = path
        self.lang = lang
        self.explicit = explicit_lang   # came from -x


class Command:
    """What a gcc command line asks for."""

    def __init__(self, args):
        self.args = args
        self.inputs = []
        self.flags = set()
        self.output = None
        self.output_index = None
        self.dep_file = None
        self.includes = []     # -I dirs
        self.iquotes = []
        lang = None
        i = 0
        while i < len(args):
            a = args[i]
            if a == "-x" and i + 1 < len(args):
                lang = None if args[i + 1] == "none" else args[i + 1]
                i += 2
                continue
            if a.startswith("-x") and len(a) > 2:
                lang = None if a[2:] == "none" else a[2:]
                i += 1
                continue
            if a in SEP_VALUE:
                val = args[i + 1] if i + 1 < len(args) else None
                if a == "-o":
                    self.output, self.output_index = val, i + 1
                elif a == "-MF":
                    self.dep_file = val
                elif a == "-I" and val:
                    self.includes.append(val)
                elif a == "-iquote" and val:
                    self.iquotes.append(val)
                i += 2
                continue
            if a.startswith("-o") and len(a) > 2:
                self.output, self.output_index = a[2:], None
            elif a.startswith("-MF") and len(a) > 3:
                self.dep_file = a[3:]
            elif a.startswith("-I") and len(a) > 2:
                self.includes.append(a[2:])
            elif a.startswith("-iquote") and len(a) > 7:
                self.iquotes.append(a[7:])
            elif a.startswith(("-Wp,-MD,", "-Wp,-MMD,")):
                self.dep_file = a.split(",", 2)[2]
                self.flags.add("-MD")
            if a.startswith("-") and a != "-":
                self.flags.add(a)
                i += 1
                continue
            ext = os.path.splitext(a)[1]
            self.inputs.append(Input(i, a, lang or C_SUFFIXES.get(ext, "object"), lang is not None))
            i += 1

    def has(self, *flags):
        return any(f in self.flags for f in flags)

    @property
    def mode(self):
        if self.has("-E", "-M", "-MM", "-fsyntax-only", "-###", "--help", "--version",
                    "-dumpversion", "-dumpmachine", "-dumpspecs"):
            return "passthrough"
        if any(f.startswith(("-print-", "--print-", "--help=")) for f in self.flags):
            return "passthrough"
        if self.has("-c"):
            return "compile"
        if self.has("-S"):
            return "compile"
        return "link"

    def c_inputs(self):
        return [x for x in self.inputs if x.lang == "c" and x.path != "-" and os.path.isfile(x.path)]


# ---------------------------------------------------------------------------
# Where molt lives
# ---------------------------------------------------------------------------

SANITIZERS = ("address", "undefined", "thread", "leak")
# DT_NEEDED of a sanitized libmolt -> the -fsanitize= name it needs
_SAN_RUNTIMES = (("libasan.", "address"), ("libubsan.", "undefined"),
                 ("libtsan.", "thread"), ("liblsan.", "leak"))


class Layout:
    def __init__(self, include, libdir, moltstamp, sanitize=None):
        self.include, self.libdir, self.moltstamp = include, libdir, moltstamp
        # list of -fsanitize= names libmolt was built with; None: not known
        # yet (read from libmolt when first needed)
        self._sanitize = sanitize

    def sanitizers(self):
        """The sanitizers libmolt was built with.  A program or shared
        object linked against a sanitized libmolt must be linked with the
        same -fsanitize= flags (the sanitizer runtime has to come first in
        the initial library list), and its code is instrumented too."""
        if self._sanitize is None:
            self._sanitize = detect_sanitizers(self.libdir)
        return self._sanitize

    def san_flags(self):
        """Flags for every compile and link (empty without sanitizers).
        The same as the top-level CMakeLists.txt gives libmolt."""
        san = self.sanitizers()
        if not san:
            return []
        out = ["-fsanitize=" + ",".join(san), "-fno-omit-frame-pointer"]
        if "undefined" in san:
            out.append("-fno-sanitize-recover=undefined")
        return out

    def check_include(self):
        if not os.path.isfile(os.path.join(self.include, "molt.h")):
            raise Fatal("cannot find molt.h in %s (set MOLT_PREFIX to a molt installation)" % self.include)

    def check_lib(self):
        if not any(os.path.exists(os.path.join(self.libdir, n)) for n in ("libmolt.so", "libmolt.a")):
            raise Fatal("cannot find libmolt.so in %s (build the 'molt' target or set MOLT_PREFIX)" % self.libdir)


def parse_sanitize(value):
    names = [n for n in value.replace(" ", "").split(",") if n]
    bad = [n for n in names if n not in SANITIZERS]
    if bad:
        raise Fatal("--molt-internal-sanitize: unknown sanitizer %s (known: %s)"
                    % (bad[0], ", ".join(SANITIZERS)))
    return names


def detect_sanitizers(libdir):
    """Sanitizers of the libmolt in libdir, from its DT_NEEDED entries
    (gcc links a sanitized shared library against libasan/libubsan/libtsan).
    Used when no launcher says it (MOLT_PREFIX, installed tree)."""
    lib = os.path.join(libdir or ".", "libmolt.so")
    if not os.path.exists(lib):
        return []
    try:
        p = subprocess.run(["readelf", "-dW", lib], capture_output=True, text=True,
                           env=dict(os.environ, LC_ALL="C"))
    except OSError:
        return []
    found = []
    for m in re.finditer(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", p.stdout):
        for prefix, name in _SAN_RUNTIMES:
            if m.group(1).startswith(prefix) and name not in found:
                found.append(name)
    return found


def locate(molt):
    prefix = os.environ.get("MOLT_PREFIX")
    if prefix:
        libdir = os.path.join(prefix, "lib")
        for cand in ("lib", "lib64", "lib/x86_64-linux-gnu"):
            if os.path.exists(os.path.join(prefix, cand, "libmolt.so")):
                libdir = os.path.join(prefix, cand)
                break
        return Layout(os.path.join(prefix, "include"), libdir, os.path.join(prefix, "bin", "moltstamp"))
    if "--molt-internal-include" in molt:
        san = molt.get("--molt-internal-sanitize")
        return Layout(molt["--molt-internal-include"], molt.get("--molt-internal-libdir", ""),
                      molt.get("--molt-internal-moltstamp", ""),
                      parse_sanitize(san) if san is not None else None)
    here = os.path.dirname(os.path.realpath(__file__))
    # installed: <prefix>/lib/molt/moltcc/moltcc.py
    pfx = os.path.normpath(os.path.join(here, "..", "..", ".."))
    if os.path.isfile(os.path.join(pfx, "include", "molt.h")) and \
            os.path.basename(os.path.dirname(here)) == "molt":
        return Layout(os.path.join(pfx, "include"), os.path.join(pfx, "lib"),
                      os.path.join(pfx, "bin", "moltstamp"))
    # source tree: <src>/tools/moltcc/moltcc.py, build tree in $MOLT_BUILD_DIR or <src>/build
    src = os.path.normpath(os.path.join(here, "..", ".."))
    build = os.environ.get("MOLT_BUILD_DIR") or os.path.join(src, "build")
    return Layout(os.path.join(src, "include"), os.path.abspath(build),
                  os.path.join(os.path.abspath(build), "bin", "moltstamp"))


# ---------------------------------------------------------------------------
# Running things
# ---------------------------------------------------------------------------

def real_cc():
    cc = os.environ.get("MOLT_CC") or "cc"
    return shlex.split(cc)


def show(cmd):
    if verbose_enabled():
        sys.stderr.write("%s: run: %s\n" % (PROG, " ".join(shlex.quote(c) for c in cmd)))


def run(cmd, capture=False):
    show(cmd)
    try:
        if capture:
            p = subprocess.run(cmd, stdout=None, stderr=subprocess.PIPE)
            return p.returncode, p.stderr
        return subprocess.call(cmd), b""
    except FileNotFoundError:
        raise Fatal("cannot run %s" % cmd[0])


def exec_cc(args):
    cmd = real_cc() + args
    show(cmd)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        raise Fatal("cannot run %s: %s" % (cmd[0], e.strerror))


class Workdir:
    """The build-private temporary directory for generated sources."""

    def __init__(self, keep):
        self.keep = keep
        self.path = None
        self.n = 0

    def subdir(self):
        if self.path is None:
            self.path = tempfile.mkdtemp(prefix="moltcc-")
        self.n += 1
        d = os.path.join(self.path, str(self.n))
        os.mkdir(d)
        return d

    def file(self, name):
        if self.path is None:
            self.path = tempfile.mkdtemp(prefix="moltcc-")
        return os.path.join(self.path, name)

    def finish(self, failed_internal=False):
        if self.path is None:
            return
        if self.keep or failed_internal:
            sys.stderr.write("%s: generated sources kept in %s\n" % (PROG, self.path))
        else:
            shutil.rmtree(self.path, ignore_errors=True)


# ---------------------------------------------------------------------------
# Which files need weaving
# ---------------------------------------------------------------------------

_INCLUDE_RE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*(["<])([^">]+)[">]', re.M)
MARKERS = (b"MOLT_UPDATABLE", b"molt_updatable", b"DSU_FUNC")


def file_has_markers(path, cmd, layout, names, seen=None, depth=0):
    """Cheap textual pre-check (no libclang): does this file, or a project
    header it includes, mention a marker or a --molt-funcs name?"""
    seen = seen if seen is not None else set()
    rp = os.path.realpath(path)
    if rp in seen or depth > 32:
        return False
    seen.add(rp)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    molt_h = os.path.realpath(os.path.join(layout.include, "molt.h"))
    if rp != molt_h:
        if any(m in data for m in MARKERS):
            return True
        for n in names:
            if re.search(rb"\b" + re.escape(n.encode()) + rb"\b", data):
                return True
    here = os.path.dirname(path)
    for m in _INCLUDE_RE.finditer(data):
        quote, name = m.group(1), m.group(2).decode("utf-8", "replace")
        dirs = ([here] + cmd.iquotes if quote == b'"' else []) + cmd.includes
        for d in dirs:
            cand = os.path.join(d or ".", name)
            if os.path.isfile(cand):
                if os.path.realpath(cand) != molt_h and \
                        file_has_markers(cand, cmd, layout, names, seen, depth + 1):
                    return True
                break
    return False


CLANG_KEEP_PREFIX = ("-I", "-D", "-U", "-std=", "-O", "-m", "-isystem", "-idirafter",
                     "-iquote", "-include", "-imacros", "-isysroot", "--sysroot", "-iprefix",
                     "-iwithprefix")
CLANG_KEEP_EXACT = {"-ansi", "-nostdinc", "-funsigned-char", "-fsigned-char", "-fPIC", "-fpic",
                    "-fPIE", "-fpie", "-pthread", "-fgnu89-inline", "-fms-extensions",
                    "-fshort-enums", "-fshort-wchar", "-ffreestanding", "-fno-builtin",
                    "-fno-signed-char", "-fno-unsigned-char", "-fgnu-keywords",
                    "-fno-asm", "-trigraphs", "-fwrapv", "-fopenmp"}
CLANG_VALUE = {"-I", "-D", "-U", "-isystem", "-idirafter", "-iquote", "-include", "-imacros",
               "-isysroot", "--sysroot", "-iprefix", "-iwithprefix", "-iwithprefixbefore"}
_CLANG_BAD_M = re.compile(r"^-m(f?entry|no-red-zone$|cmodel|abi|fpmath|stack|branch|indirect|function|record|nop|regparm|pc|dispatch|tls|vzeroupper|no-)")


def clang_args(cmd, layout):
    """The preprocessor and language options of the gcc command, for
    libclang: the same headers, macros and dialect."""
    out = ["-x", "c"]
    args = cmd.args
    i = 0
    while i < len(args):
        a = args[i]
        if a in CLANG_VALUE and i + 1 < len(args):
            out += [a, args[i + 1]]
            i += 2
            continue
        if a in CLANG_KEEP_EXACT:
            if a == "-fopenmp":
                out.append("-D_OPENMP=201511")
            else:
                out.append(a)
        elif a.startswith(CLANG_KEEP_PREFIX) and a not in SEP_VALUE:
            if a.startswith("-m") and (_CLANG_BAD_M.match(a) or a.startswith("-mtune")):
                pass
            elif a.startswith("-m") and not re.match(r"^-m(32|64|x32|arch=|sse|avx|fma|bmi|popcnt|aes|pclmul|f16c|lzcnt|movbe|rdrnd|rdseed|adx|sha|xsave|mmx|3dnow|crc32)", a):
                pass
            else:
                out.append(a)
        i += 1
    out += ["-I" + layout.include, "-Wno-everything", "-ferror-limit=0"]
    # gcc defines these under -fsanitize=; clang 14 does not: libclang must
    # see the same preprocessor branches as the compile.
    san = layout.sanitizers()
    if "address" in san:
        out.append("-D__SANITIZE_ADDRESS__=1")
    if "thread" in san:
        out.append("-D__SANITIZE_THREAD__=1")
    return out


def read_funcs_file(path, cmd, layout):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise Fatal("cannot read --molt-funcs file %s: %s" % (path, e.strerror))
    if "(" in text:
        import clang.cindex as ci
        idx = ci.Index.create()
        try:
            tu = idx.parse(path, args=clang_args(cmd, layout)[2:] + ["-x", "c-header"])
        except ci.TranslationUnitLoadError:
            raise Fatal("cannot parse --molt-funcs file %s" % path)
        names = set()
        for c in tu.cursor.get_children():
            if c.kind == ci.CursorKind.FUNCTION_DECL and c.location.file \
                    and c.location.file.name == path:
                names.add(c.spelling)
        if not names:
            raise Fatal("--molt-funcs file %s declares no function" % path)
        return names
    names = set()
    for line in text.splitlines():
        line = line.split("#", 1)[0].split("//", 1)[0].strip()
        if line:
            if not re.match(r"^[A-Za-z_]\w*$", line):
                raise Fatal("--molt-funcs file %s: '%s' is not a function name" % (path, line))
            names.add(line)
    return names


# ---------------------------------------------------------------------------
# Program builds
# ---------------------------------------------------------------------------

class Woven:
    def __init__(self, inp, path, names):
        self.inp = inp
        self.path = path          # generated file (same basename)
        self.names = names


def weave_program(inp, cmd, layout, opts, work, report):
    """Returns a Woven, or None when the file has nothing to make updatable."""
    from .unit import Unit, UnitError
    from .weave import ProgramWeaver
    try:
        unit = Unit(os.path.abspath(inp.path), inp.path, clang_args(cmd, layout))
    except UnitError as e:
        report.warn("%s; it is compiled unchanged (nothing in it is updatable)" % e)
        return None
    w = ProgramWeaver(unit, layout.include, report)
    fns = w.select(opts)
    if not fns:
        return None
    text = w.weave(fns)
    d = work.subdir()
    out = os.path.join(d, os.path.basename(inp.path))
    with open(out, "wb") as f:
        f.write(text)
    return Woven(inp, out, [f.name for f in fns])


def strip_lto(args, path):
    """LTO merges files and drops their STT_FILE symbols, so the runtime
    could no longer find a file's statics by file name: files with
    updatable functions are compiled without it."""
    out = [a for a in args if not (a == "-flto" or a.startswith("-flto=") or a == "-ffat-lto-objects")]
    if len(out) != len(args):
        sys.stderr.write("%s: warning: %s: -flto is not used for files with updatable functions "
                         "(patches find statics by file name)\n" % (PROG, path))
    return out


def origin_dir(path):
    return os.path.dirname(path) or "."


def woven_flags(wv):
    """Flags that make a generated file behave like the user's: quoted
    includes resolve from the user's directory first, and debug info names
    the user's directory."""
    d = origin_dir(wv.inp.path)
    return ["-iquote", d], ["-fdebug-prefix-map=%s=%s" % (os.path.dirname(wv.path), d)]


def color_flags(cmd):
    if sys.stderr.isatty() and not any(f.startswith("-fdiagnostics-color") or
                                       f.startswith("-fno-diagnostics-color") for f in cmd.flags):
        return ["-fdiagnostics-color=always"]
    return []


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


def compile_with_fallback(cmd_args, original_args, work, workdesc):
    """Runs the compile of generated sources.  If it fails, the user's own
    sources are compiled as they are: when that fails too, the user sees the
    compiler's messages for their own code; when it succeeds, the failure is
    moltcc's, and says so (never a silently non-updatable build)."""
    rc, err = run(cmd_args, capture=True)
    if rc == 0:
        sys.stderr.buffer.write(err)
        return 0
    rc2, err2 = run(original_args, capture=True)
    if rc2 != 0:
        sys.stderr.buffer.write(err2)
        return rc2
    sys.stderr.buffer.write(err)
    work.keep = True
    raise Fatal("internal error: the generated source of %s does not compile, but the original "
                "does; please report this (generated sources kept in %s)" % (workdesc, work.path))


def program_main(cmd, molt, layout):
    opts_all = molt.get("--molt-updatable", "marked")
    if opts_all not in ("all", "marked"):
        raise Fatal("--molt-updatable must be 'all' or 'marked'")
    report = None
    mode = cmd.mode
    if mode == "passthrough" or not cmd.inputs:
        # -E/-M see the macros (__SANITIZE_ADDRESS__) the compile will see
        extra = ["-I" + layout.include] + layout.san_flags() if cmd.inputs else []
        exec_cc(cmd.args + extra)
    layout.check_include()
    from_funcs = set()
    if "--molt-funcs" in molt:
        from_funcs = read_funcs_file(molt["--molt-funcs"], cmd, layout)
    c_inputs = cmd.c_inputs()
    todo = []
    for x in c_inputs:
        if opts_all == "all" or file_has_markers(x.path, cmd, layout, from_funcs):
            todo.append(x)
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
        exec_cc(cmd.args + inc + link_extra)

    from .weave import Options, Report
    report = Report(verbose_enabled() or bool(molt.get("--molt-verbose")))
    opts = Options(opts_all == "all", from_funcs, report.verbose)
    work = Workdir(bool(molt.get("--molt-keep")))
    try:
        woven = {}
        for x in todo:
            wv = weave_program(x, cmd, layout, opts, work, report)
            for m in report.messages:
                sys.stderr.write(m + "\n")
            report.messages = []
            if wv:
                woven[x.index] = wv
        if not woven:
            work.finish()
            exec_cc(cmd.args + inc + link_extra)
        strict89 = [a for a in cmd.args if a in ("-ansi", "-std=c89", "-std=c90", "-std=iso9899:1990",
                                                 "-std=iso9899:199409")]
        if strict89 and not any(a.startswith("-std=") and a not in strict89 for a in
                                cmd.args[cmd.args.index(strict89[-1]) + 1:]):
            raise Fatal("%s: updatable functions need C99 or GNU C (molt.h uses inline and "
                        "_Atomic), but this compile uses %s" % (
                            ", ".join(w.inp.path for w in woven.values()), strict89[-1]))
        rc = 0
        if mode == "compile":
            rc = _compile_mode(cmd, woven, inc, work)
        else:
            rc = _link_mode(cmd, woven, inc, link_extra, work)
        work.finish()
        return rc
    except BaseException:
        work.finish(failed_internal=work.keep)
        raise


def _drop_inputs(args, inputs):
    skip = set()
    for x in inputs:
        skip.add(x.index)
    out = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-x" and i + 1 < len(args):
            i += 2
            continue
        if a.startswith("-x") and len(a) > 2:
            i += 1
            continue
        if i in skip:
            i += 1
            continue
        if a in SEP_VALUE:
            out += args[i:i + 2]
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def _input_args(x, path=None):
    p = path or x.path
    if x.explicit:
        return ["-x", x.lang, p, "-x", "none"]
    return [p]


def _check_args(args, work):
    """The user's command, writing its outputs into the work directory (the
    check compile must not leave a non-updatable object where make would
    take it for up to date)."""
    out = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-o",) or a in DEP_VALUE:
            i += 2
            continue
        if (a.startswith("-o") and len(a) > 2) or a in DEP_FLAGS or a.startswith(("-Wp,-MD", "-Wp,-MMD")):
            i += 1
            continue
        out.append(a)
        i += 1
    return out + ["-o", work.file("check.out")]


def _compile_mode(cmd, woven, inc, work):
    extra_color = color_flags(cmd)
    if len(cmd.inputs) > 1 and cmd.output:
        # gcc refuses -o with -c/-S and several inputs: let it say so.
        exec_cc(cmd.args + inc)
    if len(cmd.inputs) == 1:
        groups = [(cmd.args, cmd.inputs[0])]
    else:
        # One compiler run per input: the -iquote that makes a generated
        # file find its user's headers must not leak into other files.
        base = _drop_inputs(cmd.args, cmd.inputs)
        groups = [(base + _input_args(x), x) for x in cmd.inputs]
    rc_all = 0
    for args, x in groups:
        wv = woven.get(x.index)
        if wv is None:
            rc, _ = run(real_cc() + args + inc)
            rc_all = rc_all or rc
            continue
        if len(cmd.inputs) == 1:
            new = list(args)
            new[x.index] = wv.path
        else:
            new = list(args[:-len(_input_args(x))]) + _input_args(x, wv.path)
        front, back = woven_flags(wv)
        full = real_cc() + front + strip_lto(new, x.path) + inc + back + extra_color
        check = real_cc() + _check_args(args, work) + inc + extra_color
        rc = compile_with_fallback(full, check, work, x.path)
        if rc == 0:
            for d in dep_candidates(cmd, x):
                fix_dep_file(d, wv.path, x.path)
        rc_all = rc_all or rc
    return rc_all


def _link_mode(cmd, woven, inc, link_extra, work):
    """Generated sources are compiled to private objects first, then the
    user's link line runs with those objects in place of the sources."""
    compile_base = []
    args = cmd.args
    i = 0
    input_idx = {x.index for x in cmd.inputs}
    while i < len(args):
        a = args[i]
        if i in input_idx:
            i += 1
            continue
        if a in ("-o",) or a in LINK_ONLY_VALUE or a == "-x" or a in DEP_VALUE:
            i += 2
            continue
        if a in SEP_VALUE:
            compile_base += args[i:i + 2]
            i += 2
            continue
        if a in LINK_ONLY_FLAGS or a.startswith(("-l", "-L", "-Wl,", "-o", "-x")):
            i += 1
            continue
        if a in DEP_FLAGS or a.startswith(("-Wp,-MD", "-Wp,-MMD")):
            i += 1
            continue
        compile_base.append(a)
        i += 1
    final = list(args)
    for idx, wv in sorted(woven.items(), reverse=True):
        obj = os.path.join(os.path.dirname(wv.path),
                           os.path.splitext(os.path.basename(wv.path))[0] + ".o")
        front, back = woven_flags(wv)
        full = real_cc() + front + strip_lto(compile_base, wv.inp.path) + ["-c", wv.path, "-o", obj] \
            + inc + back + color_flags(cmd)
        orig = real_cc() + compile_base + ["-c", wv.inp.path, "-o", obj + ".orig.o"] + inc
        rc = compile_with_fallback(full, orig, work, wv.inp.path)
        if rc != 0:
            return rc
        final[idx:idx + 1] = ["-x", "none", obj] + (["-x", wv.inp.lang] if wv.inp.explicit else [])
    rc, _ = run(real_cc() + final + inc + link_extra)
    return rc


# ---------------------------------------------------------------------------
# Patch builds
# ---------------------------------------------------------------------------

def patch_main(cmd, molt, layout):
    from .elf import SymbolError, read_symtab
    from .unit import Unit, UnitError
    from .weave import (Options, PatchPlan, PatchWeaver, Report, WeaveError,
                              patch_header_source)
    layout.check_include()
    target = molt.get("--molt-target")
    if not target or target is True:
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
    patch_id = molt.get("--molt-patch-id") or re.sub(r"\.so$", "", os.path.basename(out))
    description = molt.get("--molt-description") or ""
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

    report = Report(verbose_enabled() or bool(molt.get("--molt-verbose")))
    funcs = read_funcs_file(molt["--molt-funcs"], cmd, layout) if "--molt-funcs" in molt else set()
    opts = Options(molt.get("--molt-updatable", "marked") == "all", funcs, report.verbose)
    plan = PatchPlan(symtab, target, opts, report)

    def flush():
        for m in report.messages:
            sys.stderr.write(m + "\n")
        report.messages = []

    units = []
    cargs = clang_args(cmd, layout)
    for x in sources:
        try:
            u = Unit(os.path.abspath(x.path), x.path, cargs)
        except UnitError as e:
            raise Fatal(str(e))
        units.append((x, u, plan.decide(u)))
        flush()
    if not any(getattr(f, "role", None) == "pfn" for _, _, fns in units for f in fns):
        flush()
        raise Fatal("no updatable function of %s in %s" % (target, " ".join(x.path for x in sources)))

    work = Workdir(bool(molt.get("--molt-keep")))
    ok = False
    try:
        # Options for compiling the patch TUs and for linking the patch.
        clean = []
        args = cmd.args
        input_idx = {x.index for x in cmd.inputs}
        i = 0
        while i < len(args):
            a = args[i]
            if i in input_idx:
                i += 1
                continue
            if a in ("-o", "-x") or a in DEP_VALUE:
                i += 2
                continue
            if a in DEP_FLAGS or a in ("-c", "-S", "-E") or a.startswith(("-Wp,-MD", "-Wp,-MMD")):
                i += 1
                continue
            if a in SEP_VALUE:
                clean += args[i:i + 2]
                i += 2
                continue
            clean.append(a)
            i += 1
        compile_opts = []
        i = 0
        while i < len(clean):
            a = clean[i]
            if a in LINK_ONLY_VALUE:
                i += 2
                continue
            if a in LINK_ONLY_FLAGS or a.startswith(("-l", "-L", "-Wl,")):
                i += 1
                continue
            if a in SEP_VALUE:
                compile_opts += clean[i:i + 2]
                i += 2
                continue
            compile_opts.append(a)
            i += 1
        # Patches compile the whole new file but keep only what the new
        # versions need (main and constructors are dropped), so "unused"
        # warnings there are expected, not the user's problem.
        pic = ["-fPIC", "-fvisibility=hidden", "-DMOLT__NO_AUTO_REGISTER",
               "-Wno-unused-function", "-Wno-unused-variable", "-Wno-unused-const-variable"]
        # the same -fsanitize= flags as libmolt (see program_main)
        san = layout.san_flags()
        inc = ["-I" + layout.include] + san
        objs = []
        for x, u, fns in units:
            try:
                text = PatchWeaver(u, layout.include, report, plan).weave(fns)
            except WeaveError as e:
                flush()
                raise Fatal(str(e))
            flush()
            d = work.subdir()
            src = os.path.join(d, os.path.basename(x.path))
            with open(src, "wb") as f:
                f.write(text)
            wv = Woven(x, src, [])
            obj = os.path.splitext(src)[0] + ".o"
            front, back = woven_flags(wv)
            full = real_cc() + front + compile_opts + pic + ["-c", src, "-o", obj] + inc + back + color_flags(cmd)
            orig = real_cc() + compile_opts + pic + ["-c", x.path, "-o", obj + ".orig.o"] + inc
            rc = compile_with_fallback(full, orig, work, x.path)
            if rc != 0:
                return rc
            objs.append(obj)
        hdr = work.file("molt_patch_header.c")
        with open(hdr, "w") as f:
            f.write(patch_header_source(patch_id, description))
        hobj = hdr[:-2] + ".o"
        rc, _ = run(real_cc() + ["-fPIC", "-DMOLT__NO_AUTO_REGISTER", "-c", hdr, "-o", hobj] + inc)
        if rc != 0:
            raise Fatal("internal error: cannot compile the patch header")
        objs.append(hobj)
        rc, _ = run(real_cc() + ["-shared", "-o", out] + objs + [x.path for x in others]
                    + clean + san + ["-Wl,--build-id"])
        if rc != 0:
            return rc
        stamp = layout.moltstamp
        if not stamp or not os.path.isfile(stamp):
            raise Fatal("cannot find moltstamp (%s); build the 'moltstamp' target or set MOLT_PREFIX"
                        % (stamp or "not configured"))
        rc, _ = run([stamp, out, target])
        if rc != 0:
            raise Fatal("moltstamp could not stamp %s with the build-id of %s" % (out, target))
        ok = True
        return 0
    finally:
        if not ok and os.path.exists(out) and os.path.getmtime(out) >= _START:
            try:
                os.unlink(out)
            except OSError:
                pass
        work.finish()


_START = 0.0


def main(argv):
    global _START
    import time
    _START = time.time() - 1
    try:
        molt, rest = split_molt_options(argv)
        if molt.get("--molt-verbose"):
            os.environ["MOLT_VERBOSE"] = "1"
        rest = expand_response_files(rest)
        layout = locate(molt)
        cmd = Command(rest)
        if molt.get("--molt-program"):
            if molt.get("--molt-patch"):
                raise Fatal("--molt-program and --molt-patch cannot be combined")
            for k in ("--molt-target", "--molt-patch-id", "--molt-description", "--molt-funcs",
                      "--molt-updatable"):
                if k in molt:
                    raise Fatal("%s is not meaningful with --molt-program" % k)
            from .image import build as moltcc_program
            try:
                return moltcc_program.main(cmd, molt, layout, sys.modules[__name__])
            except moltcc_program.XfSyntax as e:
                sys.stderr.write("%s\n" % e)
                return 1
        for k in ("--molt-from", "--molt-xf"):
            if k in molt:
                raise Fatal("%s is only meaningful with --molt-program" % k)
        if molt.get("--molt-patch"):
            return patch_main(cmd, molt, layout)
        for k in ("--molt-target", "--molt-patch-id", "--molt-description"):
            if k in molt:
                raise Fatal("%s is only meaningful with --molt-patch" % k)
        return program_main(cmd, molt, layout)
    except Fatal as e:
        sys.stderr.write("%s: error: %s\n" % (PROG, e))
        return 1
    except KeyboardInterrupt:
        return 130

