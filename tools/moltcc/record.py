"""The compile record: what moltcc compiled, from where, with which flags.

Every C translation unit that a program build compiles (woven or passed
through, compile or link mode, programs and shared objects) leaves one
JSON line in the non-allocated ELF section `.molt.build` of its object
(build.py writes it after a successful compile).  The linker concatenates
the sections of all objects, archive members included, so the linked
program carries the records of everything it was built from; `strip`
(GNU, all modes) keeps the section, `llvm-strip --strip-all` drops it.
The LTO plugin keeps only the IR of LTO objects: a moltcc link copies their
records into its output (lto_object_records; not for archive members).

    {"v": 1, "directory": cwd, "file": source as given, "abspath": ...,
     "output": object as given (link mode: the linked file),
     "arguments": the user's compiler arguments for this TU (response files
                  expanded, --molt-* removed, nothing moltcc adds),
     "compiler": the real compiler's words,
     "molt": {"updatable": "all"|"marked", "funcs": [...], "woven": bool,
              "env": {gcc's environment variables that were set}},
     "sha256": of the source, "deps": [[absolute path, sha256], ...]}

deps are the project headers the compile read (the compiler's own
dependency output, `-MMD` style: no system headers, nothing of molt's).
`moltcc --molt-show-build PROG` prints the records as a
compile_commands.json array.

Nothing here loads libclang or pyelftools: the ELF reading is the little
this needs (section headers, `ar` members).
"""
import hashlib
import json
import os
import re
import stat
import struct
import subprocess
import tempfile

from . import gccargs
from .errors import Fatal

SECTION = ".molt.build"
VERSION = 1
# gcc reads these from the environment; a rebuild needs the same values.
ENV_VARS = ("CPATH", "C_INCLUDE_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH",
            "SOURCE_DATE_EPOCH")


class RecordError(Fatal):
    pass


# ---------------------------------------------------------------------------
# The record
# ---------------------------------------------------------------------------

class Record:
    """One compile of one C translation unit (a parsed JSON line)."""

    def __init__(self, data):
        if not isinstance(data, dict) or data.get("v") != VERSION:
            raise RecordError("unknown compile record version %r" % (
                data.get("v") if isinstance(data, dict) else data))
        self.data = data

    directory = property(lambda self: self.data["directory"])
    file = property(lambda self: self.data["file"])
    abspath = property(lambda self: self.data["abspath"])
    output = property(lambda self: self.data.get("output"))
    arguments = property(lambda self: list(self.data["arguments"]))
    compiler = property(lambda self: list(self.data["compiler"]))
    sha256 = property(lambda self: self.data["sha256"])
    woven = property(lambda self: bool(self.data["molt"].get("woven")))
    updatable = property(lambda self: self.data["molt"].get("updatable", "marked"))
    funcs = property(lambda self: list(self.data["molt"].get("funcs", [])))
    env = property(lambda self: dict(self.data["molt"].get("env", {})))

    @property
    def deps(self):
        """[(absolute path, sha256)] of the headers the compile read."""
        return [(p, h) for p, h in self.data.get("deps", [])]

    def hashes(self):
        """{absolute path: sha256} of everything the compile read from the
        project: the source and its deps."""
        out = dict(self.deps)
        out[self.abspath] = self.sha256
        return out

    def line(self):
        return (json.dumps(self.data, separators=(",", ":"), sort_keys=False) + "\n").encode("ascii")

    def compile_command(self):
        """The compile_commands.json entry (arguments with the compiler
        first), plus molt's own keys."""
        out = {"directory": self.directory, "file": self.file,
               "arguments": self.compiler + self.arguments}
        if self.output:
            out["output"] = self.output
        for k, v in self.data.items():
            if k not in out and k != "arguments":
                out[k] = v
        return out


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def norm_abs(path, cwd):
    """An absolute, normalized path (a `..` after a symlinked directory is
    resolved on the file system, not textually)."""
    p = os.path.join(cwd, path)
    n = os.path.normpath(p)
    if ".." in p.split(os.sep):
        try:
            if not os.path.samefile(n, p):
                return os.path.realpath(p)
        except OSError:
            pass
    return n


def make_record(compiler, arguments, source, output, cwd, deps, woven, updatable, funcs):
    """The record of one successful compile.  deps: absolute paths of the
    headers it read (already filtered)."""
    abspath = norm_abs(source, cwd)
    seen = set()
    dep_list = []
    for d in deps:
        if d == abspath or d in seen or not os.path.isfile(d):
            continue
        seen.add(d)
        dep_list.append([d, sha256_file(d)])
    molt = {"updatable": updatable, "funcs": sorted(funcs), "woven": bool(woven)}
    env = {k: os.environ[k] for k in ENV_VARS if k in os.environ}
    if env:
        molt["env"] = env
    return Record({"v": VERSION, "directory": cwd, "file": source, "abspath": abspath,
                   "output": output, "arguments": list(arguments), "compiler": list(compiler),
                   "molt": molt, "sha256": sha256_file(source), "deps": dep_list})


# ---------------------------------------------------------------------------
# Dependencies: the compiler's -MD/-MMD output
# ---------------------------------------------------------------------------

def parse_dep_file(data):
    """The prerequisites of a make rule file written by -MD/-MMD (all rules;
    -MP's phony rules have none).  Paths as the compiler wrote them."""
    text = data.decode("utf-8", "surrogateescape")
    text = re.sub(r"\\\r?\n", " ", text)
    out = []
    for line in text.splitlines():
        # the first ':' that ends the targets (not a drive letter; escaped
        # ':' does not occur in gcc's output on Linux)
        m = re.search(r"(?<!\\):(\s|$)", line)
        if not m:
            continue
        rest = line[m.end():]
        word = []
        i = 0
        while i < len(rest):
            c = rest[i]
            if c == "\\" and i + 1 < len(rest) and rest[i + 1] in " #\\":
                word.append(rest[i + 1])
                i += 2
                continue
            if c == "$" and rest[i + 1:i + 2] == "$":
                word.append("$")
                i += 2
                continue
            if c in " \t":
                if word:
                    out.append("".join(word))
                    word = []
            else:
                word.append(c)
            i += 1
        if word:
            out.append("".join(word))
    return out


# Options that change the system include directories.
_SYSDIR_SEP = {"-isystem", "-idirafter", "-isysroot", "--sysroot", "-iprefix", "-iwithprefix",
               "-B", "-specs", "-target", "--target"}
_SYSDIR_PREFIX = ("-isystem", "-idirafter", "-isysroot", "--sysroot=", "-iprefix",
                  "-iwithprefix", "-B", "-specs=", "--target=", "-m")
_SYSDIR_EXACT = {"-nostdinc", "-nostdinc++"}


def system_include_dirs(compiler, args):
    """The system include directories of this compiler for these options
    (what -MMD leaves out): `cc -E -v` with only the options that move
    them.  Cached per user in $TMPDIR/moltcc-<uid>/ (a build asks it once
    per distinct set of options, not once per file)."""
    words = []
    for x in gccargs.split(args):
        a = x.option
        if a in _SYSDIR_SEP and x.value is not None:
            words += x.words
        elif len(x.words) == 1 and (a in _SYSDIR_EXACT or (a.startswith(_SYSDIR_PREFIX)
                                                            and a not in gccargs.SEP_VALUE)):
            if a.startswith("-m") and not re.match(r"-m(32|64|x32|16|abi=)", a):
                continue
            words.append(a)
    key_src = [list(compiler), words]
    try:
        import shutil
        exe = shutil.which(compiler[-1]) or compiler[-1]
        st = os.stat(exe)
        key_src.append([exe, st.st_mtime_ns, st.st_size])
    except OSError:
        pass
    key = sha256_bytes(json.dumps(key_src).encode())[:32]
    cache = _cache_dir()
    path = os.path.join(cache, "sysdirs-" + key + ".json") if cache else None
    if path:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            pass
    try:
        p = subprocess.run(list(compiler) + words + ["-E", "-v", "-x", "c", os.devnull, "-o", os.devnull],
                           capture_output=True, env=dict(os.environ, LC_ALL="C"))
    except OSError:
        return []
    dirs = []
    inside = False
    for line in p.stderr.decode("utf-8", "surrogateescape").splitlines():
        if line.startswith("#include <...> search starts here:"):
            inside = True
        elif line.startswith("End of search list."):
            inside = False
        elif inside and line.startswith(" "):
            d = line.strip()
            d = re.sub(r" \(framework directory\)$", "", d)
            dirs.append(os.path.normpath(d))
    if path and p.returncode == 0:
        tmp = "%s.%d.tmp" % (path, os.getpid())
        try:
            with open(tmp, "w") as f:
                json.dump(dirs, f)
            os.replace(tmp, path)
        except OSError:
            pass
    return dirs


def _cache_dir():
    """$TMPDIR/moltcc-<uid>, private to this user (None if it cannot be
    made so: then nothing is cached)."""
    d = os.path.join(tempfile.gettempdir(), "moltcc-%d" % os.getuid())
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(d)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return d


def under(path, dirs):
    """Whether path is one of dirs or inside one of them."""
    for d in dirs:
        if path == d or path.startswith(d.rstrip("/") + "/"):
            return True
    return False


class Deps:
    """How one compile tells moltcc what it read, without touching the
    user's own dependency files: with no -MD/-MMD on the user's command,
    `-MMD -MF <private file>` is added (flags); otherwise the user's file is
    read after the compile, and, for -MD, the system headers are left
    out."""

    def __init__(self, compiler, args, private_file, candidates):
        """args: the user's arguments of this compile; candidates: where the
        user's dependency file may be (build.dep_candidates)."""
        self.compiler = compiler
        self.args = args
        mode = None
        for x in gccargs.split(args):
            a = x.option
            if a in ("-MD", "-MMD"):
                mode = a
            elif a.startswith("-Wp,-MD,"):
                mode = "-MD"
            elif a.startswith("-Wp,-MMD,"):
                mode = "-MMD"
        self.user_mode = mode
        if mode is None:
            self.files = [private_file]
            self.flags = ["-MMD", "-MF", private_file]
        else:
            self.files = list(candidates)
            self.flags = []

    def read(self, cwd, exclude_dirs):
        """Absolute paths of the project headers the compile read (None if
        the dependency output cannot be found)."""
        for f in self.files:
            try:
                with open(f, "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            paths = [norm_abs(p, cwd) for p in parse_dep_file(data)]
            excl = list(exclude_dirs)
            if self.user_mode == "-MD":
                excl += system_include_dirs(self.compiler, self.args)
            return [p for p in paths if not under(p, excl)]
        return None


def preprocess_deps(tools, compile_args, input_args, private_file, cwd, exclude_dirs):
    """The deps of a C input of a link command that is compiled by the link
    itself: the compiler's -MM output (a preprocessing run)."""
    rc, _ = tools.run(tools.cc + compile_args + ["-MM", "-MF", private_file] + input_args,
                      capture=True)
    if rc != 0:
        return None
    d = Deps(tools.cc, compile_args, private_file, [])
    return d.read(cwd, exclude_dirs)


# ---------------------------------------------------------------------------
# Reading ELF sections and archives
# ---------------------------------------------------------------------------

class ElfError(Exception):
    pass


def elf_sections(data):
    """[(name, sh_type, sh_flags, offset, size)] of an ELF file's sections."""
    return _sections(lambda off, n: data[off:off + n])


def file_sections(f):
    """elf_sections of an open file, reading only the headers."""
    def read(off, n):
        f.seek(off)
        return f.read(n)
    return _sections(read)


def _sections(read):
    head = read(0, 64)
    if head[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    cls, enc = head[4], head[5]
    if cls not in (1, 2) or enc not in (1, 2):
        raise ElfError("unknown ELF class or data encoding")
    e = "<" if enc == 1 else ">"
    try:
        if cls == 2:
            shoff, = struct.unpack_from(e + "Q", head, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", head, 0x3A)
            fmt = e + "IIQQQQIIQQ"
        else:
            shoff, = struct.unpack_from(e + "I", head, 0x20)
            shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", head, 0x2E)
            fmt = e + "IIIIIIIIII"
        if shoff == 0:
            return []
        first = struct.unpack_from(fmt, read(shoff, struct.calcsize(fmt)))
        if shnum == 0:
            shnum = first[5]             # SHN_UNDEF's sh_size holds the count
        if shstrndx == 0xFFFF:
            shstrndx = first[6]          # ... and sh_link the string table
        table = read(shoff, shnum * shentsize)
        raw = [struct.unpack_from(fmt, table, i * shentsize) for i in range(shnum)]
        strtab = raw[shstrndx]
        names = read(strtab[4], strtab[5])
        out = []
        for sh in raw:
            end = names.index(b"\0", sh[0])
            out.append((names[sh[0]:end].decode("utf-8", "surrogateescape"),
                        sh[1], sh[2], sh[4], sh[5]))
        return out
    except (struct.error, IndexError, ValueError):
        raise ElfError("truncated or corrupt ELF section headers")


def lto_object_records(path):
    """The records of an LTO object (gcc -flto, not fat or fat): the
    linker plugin keeps only its IR, so the link that uses it must carry
    its records over.  [] for anything else."""
    try:
        with open(path, "rb") as f:
            secs = file_sections(f)
            if not any(n.startswith(".gnu.lto_") for n, *_ in secs):
                return []
            blob = b""
            for n, typ, _, off, size in secs:
                if n == SECTION and typ != SHT_NOBITS:
                    f.seek(off)
                    blob += f.read(size)
    except (OSError, ElfError):
        return []
    return _split_lines(blob, path)


SHT_NOBITS = 8


def elf_section_data(data, name):
    """The concatenated contents of every section called `name`."""
    out = b""
    for n, typ, _, off, size in elf_sections(data):
        if n == name and typ != SHT_NOBITS:
            out += data[off:off + size]
    return out


def archive_members(data):
    """[(member name, bytes)] of a `!<arch>` archive (GNU and BSD names;
    the symbol and long-name tables are left out; thin archives: none)."""
    if not data.startswith(b"!<arch>\n"):
        return []
    out = []
    pos = 8
    longnames = b""
    while pos + 60 <= len(data):
        hdr = data[pos:pos + 60]
        name = hdr[:16].rstrip(b" ")
        try:
            size = int(hdr[48:58].strip() or b"0")
        except ValueError:
            break
        body = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name in (b"/", b"/SYM64/", b"__.SYMDEF", b"__.SYMDEF SORTED"):
            continue
        if name == b"//":
            longnames = body
            continue
        if name.startswith(b"#1/"):              # BSD: the name starts the body
            n = int(name[3:])
            name, body = body[:n].rstrip(b"\0"), body[n:]
        elif name.startswith(b"/") and name[1:].isdigit():
            off = int(name[1:])
            end = longnames.find(b"/\n", off)
            name = longnames[off:end if end >= 0 else None]
        else:
            name = name.rstrip(b"/")
        out.append((name.decode("utf-8", "surrogateescape"), body))
    return out


def _split_lines(blob, where):
    out = []
    for line in blob.split(b"\n"):
        line = line.strip(b"\0 \t\r")
        if not line:
            continue
        try:
            out.append(Record(json.loads(line.decode("utf-8", "surrogateescape"))))
        except (ValueError, KeyError, TypeError) as e:
            raise RecordError("%s: a corrupt compile record in %s (%s)" % (where, SECTION, e))
    return out


def read_records(path):
    """The compile records of a linked program, shared object, object or
    archive, in link order."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise RecordError("cannot read %s: %s" % (path, e.strerror))
    if data.startswith(b"!<arch>\n"):
        out = []
        for name, body in archive_members(data):
            try:
                out += _split_lines(elf_section_data(body, SECTION), "%s(%s)" % (path, name))
            except ElfError:
                continue
        return out
    try:
        return _split_lines(elf_section_data(data, SECTION), path)
    except ElfError as e:
        raise RecordError("%s: %s" % (path, e))


def records_by_source(records, report=None):
    """{abspath: Record}: a TU compiled more than once into one binary
    keeps its last record (with a note)."""
    out = {}
    for r in records:
        if r.abspath in out and out[r.abspath].data != r.data and report is not None:
            report.warn("%s was compiled more than once into the program; its last compile "
                        "record is used" % r.file)
        out[r.abspath] = r
    return out


# ---------------------------------------------------------------------------
# Writing records into objects
# ---------------------------------------------------------------------------

def _asm_lines(blob):
    """Assembler text that puts blob into the record section of a .s file."""
    out = ['\t.pushsection %s,"",%%progbits' % SECTION]
    for line in blob.split(b"\n"):
        if not line:
            continue
        esc = line.decode("ascii").replace("\\", "\\\\").replace('"', '\\"')
        out.append('\t.ascii "%s\\n"' % esc)
    out.append("\t.popsection")
    return ("\n".join(out) + "\n").encode("ascii")


def embed(path, records, tools, tmpdir, asm=False):
    """Adds the records to `path`: an ELF object, program or shared object
    (objcopy; appended to a section that is already there), or assembler
    output (asm, -S: directives appended).  Returns an error string, or
    None."""
    blob = b"".join(r.line() for r in records)
    if not blob or path == "-":
        return None                     # -o -: written to standard output
    try:
        st = os.stat(path)
    except OSError as e:
        return "cannot read %s: %s" % (path, e.strerror)
    if not stat.S_ISREG(st.st_mode):
        return None                     # -o /dev/null: nothing to keep it in
    if asm:
        with open(path, "ab") as f:
            f.write(b"\n" + _asm_lines(blob))
        return None
    with open(path, "rb") as f:
        data = f.read()
    try:
        old = elf_section_data(data, SECTION)
        present = any(n == SECTION for n, *_ in elf_sections(data))
    except ElfError as e:
        return "%s: %s" % (path, e)
    fd, rec = tempfile.mkstemp(prefix="record-", suffix=".json", dir=tmpdir)
    with os.fdopen(fd, "wb") as f:
        f.write(old + blob)
    how = "--update-section" if present else "--add-section"
    cmd = [os.environ.get("MOLT_OBJCOPY") or "objcopy", how, "%s=%s" % (SECTION, rec), path]
    tools.show(cmd)
    try:
        p = subprocess.run(cmd, capture_output=True)
    except OSError as e:
        return "cannot run %s: %s" % (cmd[0], e.strerror)
    finally:
        os.unlink(rec)
    if p.returncode != 0:
        err = p.stderr.decode("utf-8", "replace").strip().splitlines()
        return "%s: %s" % (cmd[0], err[-1] if err else "exit status %d" % p.returncode)
    return None


def compile_commands(records):
    """The JSON text of a compile_commands.json array."""
    return json.dumps([r.compile_command() for r in records], indent=2) + "\n"
