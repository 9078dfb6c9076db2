"""The gcc command line: what it asks for, and the one splitter of it.

Every mode takes the user's compiler options apart: the compile of a
generated source needs them without the inputs and the output, a link needs
them without the dependency options, libclang needs only the preprocessor
and dialect options.  They all go through split(), so an option whose value
is the next word (`-o FILE`, `-MF FILE`, `-x LANG`) is always one item, and
its value is never taken for an input or an option.
"""
import os
import re
import shlex

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
LINK_ONLY_PREFIX = ("-l", "-L", "-Wl,")
DEP_FLAGS = {"-MD", "-MMD", "-MP", "-M", "-MM", "-MG"}
DEP_VALUE = {"-MF", "-MT", "-MQ"}
DEP_PREFIX = ("-Wp,-MD", "-Wp,-MMD")
STAGE_FLAGS = {"-c", "-S", "-E"}

C_SUFFIXES = {".c": "c", ".i": "cpp-output", ".h": "c-header", ".s": "assembler",
              ".S": "assembler-with-cpp", ".sx": "assembler-with-cpp",
              ".cc": "c++", ".cpp": "c++", ".cxx": "c++", ".C": "c++", ".ii": "c++-cpp-output"}

# What an item of a command line is (Arg.kind), for without().
INPUT = "input"     # a file to compile or link, or -x LANG (the language of the next files)
OUTPUT = "output"   # -o FILE
DEPS = "deps"       # dependency files: -MD, -MMD, -MF FILE, -MT T, -Wp,-MD,FILE ...
LINK = "link"       # for the link step only: -l, -L, -Wl,..., -shared, -Xlinker X ...
STAGE = "stage"     # where the compiler stops: -c, -S, -E
OTHER = "other"     # everything else (-O2, -I DIR, -DX, -g, -fPIC ...)


class Arg:
    """One item of a command line: an option with its value (one word, or
    two when the value is the next word), or an input file."""
    __slots__ = ("index", "words", "kind")

    def __init__(self, index, words, kind):
        self.index = index      # position of the first word in the command line
        self.words = words
        self.kind = kind

    @property
    def option(self):
        return self.words[0]

    @property
    def value(self):
        """The value of an option given as the next word (None if missing)."""
        return self.words[1] if len(self.words) > 1 else None

    @property
    def separate(self):
        """An option whose value is the next word (`-o FILE`, `-x c`)."""
        return self.words[0] in SEP_VALUE


def _kind_of_separate(name):
    if name == "-x":
        return INPUT
    if name == "-o":
        return OUTPUT
    if name in DEP_VALUE:
        return DEPS
    if name in LINK_ONLY_VALUE:
        return LINK
    return OTHER


def _kind_of_word(a):
    if not a.startswith("-") or a == "-" or a.startswith("-x"):
        return INPUT
    if a.startswith("-o"):
        return OUTPUT
    if a in DEP_FLAGS or a.startswith(DEP_PREFIX) or (a[:3] in DEP_VALUE and len(a) > 3):
        return DEPS
    if a in LINK_ONLY_FLAGS or a.startswith(LINK_ONLY_PREFIX):
        return LINK
    if a in STAGE_FLAGS:
        return STAGE
    return OTHER


def split(args):
    """The command line as a list of Arg, in order."""
    out = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in SEP_VALUE:
            words = args[i:i + 2]
            out.append(Arg(i, words, _kind_of_separate(a)))
            i += 2
        else:
            out.append(Arg(i, [a], _kind_of_word(a)))
            i += 1
    return out


def without(args, *kinds):
    """The words of a command line without its items of these kinds."""
    out = []
    for x in split(args):
        if x.kind not in kinds:
            out += x.words
    return out


def env_flags():
    """MOLTCC_FLAGS: compiler options (shell words) appended to every
    compiler command moltcc runs for a program build and to every compile
    of a patch build (e.g. -Wno-error, or what only moltcc builds need)."""
    return shlex.split(os.environ.get("MOLTCC_FLAGS", ""))


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

    def args(self, path=None):
        """The words that name this input (another path in its place) on a
        command line: with its -x when it had one."""
        p = path or self.path
        if self.explicit:
            return ["-x", self.lang, p, "-x", "none"]
        return [p]


class Command:
    """What a gcc command line asks for."""

    def __init__(self, args):
        self.args = args
        self.inputs = []
        self.flags = set()     # the one-word options as given (-c, -O2, -Ifoo, ...)
        self.output = None
        self.output_index = None
        self.dep_file = None
        self.includes = []     # -I dirs
        self.iquotes = []
        lang = None
        for x in split(args):
            a = x.option
            if x.separate:
                val = x.value
                if a == "-x":
                    if val is not None:
                        lang = None if val == "none" else val
                elif a == "-o":
                    self.output, self.output_index = val, x.index + 1
                elif a == "-MF":
                    self.dep_file = val
                elif a == "-I" and val:
                    self.includes.append(val)
                elif a == "-iquote" and val:
                    self.iquotes.append(val)
                continue
            if a.startswith("-x") and len(a) > 2:
                lang = None if a[2:] == "none" else a[2:]
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
                continue
            ext = os.path.splitext(a)[1]
            self.inputs.append(Input(x.index, a, lang or C_SUFFIXES.get(ext, "object"), lang is not None))

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
# libclang's view of the command
# ---------------------------------------------------------------------------

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
_CLANG_GOOD_M = re.compile(r"^-m(32|64|x32|arch=|sse|avx|fma|bmi|popcnt|aes|pclmul|f16c|lzcnt|movbe|rdrnd|rdseed|adx|sha|xsave|mmx|3dnow|crc32)")


def _clang_word(a):
    """The libclang form of a one-word gcc option ([] when libclang does not
    need it)."""
    if a in CLANG_KEEP_EXACT:
        return ["-D_OPENMP=201511"] if a == "-fopenmp" else [a]
    if a.startswith(CLANG_KEEP_PREFIX) and a not in SEP_VALUE:
        if a.startswith("-m") and (_CLANG_BAD_M.match(a) or a.startswith("-mtune")
                                   or not _CLANG_GOOD_M.match(a)):
            return []
        return [a]
    return []


def libclang_args(args, include_dir, sanitizers):
    """The preprocessor and language options of a gcc command line, for
    libclang: the same headers, macros and dialect."""
    out = ["-x", "c"]
    for x in split(args):
        if x.option in CLANG_VALUE and x.value is not None:
            out += x.words
        elif x.option == "-Xpreprocessor" and x.value is not None:
            out += _clang_word(x.value)     # an option for the preprocessor
        elif len(x.words) == 1:
            out += _clang_word(x.option)
    out += ["-I" + include_dir, "-Wno-everything", "-ferror-limit=0"]
    # gcc defines these under -fsanitize=; clang 14 does not: libclang must
    # see the same preprocessor branches as the compile.
    if "address" in sanitizers:
        out.append("-D__SANITIZE_ADDRESS__=1")
    if "thread" in sanitizers:
        out.append("-D__SANITIZE_THREAD__=1")
    return out
