"""Patches for a plainly built program: `molt attach` (issue 13).

    moltcc --molt-patch --molt-target PROG --molt-diff FIX.patch -o fix.so [compile flags]

PROG was built without moltcc (no compile record, no updatable function):
a server from its own build system, already running.  The patch is built
by the same two-version pipeline as a hot patch (pipeline.py), with what a
compile record would have said taken from elsewhere:

- the flags are the command line's, the same for every file; the source
  tree is the current directory (or --molt-source DIR), and the compiles
  run there (relative paths in the flags are relative to it);
- PROG's translation units are its DWARF compilation units (with -g), else
  the file symbols of its symbol table found in the tree by name; what each
  one reads is asked of the compiler (-MM);
- every function PROG has a symbol for is replaceable (updatable): a
  changed function is replaced at its address, a changed function PROG
  has no symbol for (inlined everywhere) is a private copy and its callers
  are replaced, as for a hot patch;
- references to PROG's objects are resolved here, to link-time addresses:
  a global by name, a static by its file's group of the symbol table, a
  static local by its function in PROG's DWARF (a plain build needs -g for
  those), and written with the replaced functions' addresses into the
  patch's `.molt_attach` section with PROG's build-id; `molt attach` adds
  the load bias (src/attach/patch.c describes the section).

With DWARF, PROG is also checked against the rebuild: each file's -O level
(DW_AT_producer) must be the one given, and every function PROG has an
inlined copy of a changed function in must be replaced too (else the flags
differ from PROG's build and the patch would leave old copies running).
"""
import concurrent.futures
import os
import shlex
import subprocess

from .. import gccargs
from ..elf import FUNC_SYMTYPES, VAR_SYMTYPES, SymbolError, Symtab, build_id
from ..errors import Fatal
from ..record import VERSION, Record, sha256_bytes
from .source import Program

SECTION = ".molt_attach"
HOISTED = "molt__"      # unit.py's name of a hoisted static local: molt__<f>__<x>[__<n>]

_TYPES = {"STT_FUNC": "FUNC", "STT_OBJECT": "OBJECT", "STT_NOTYPE": "NOTYPE",
          "STT_TLS": "TLS", "STT_GNU_IFUNC": "IFUNC", "STT_LOOS": "IFUNC",
          "STT_COMMON": "COMMON"}


def has_compile_record(path):
    from ..record import read_records
    try:
        return bool(read_records(path))
    except Fatal:
        return True         # a damaged record: the recorded path reports it


# ---------------------------------------------------------------------------
# PROG as a plain ELF file
# ---------------------------------------------------------------------------

class PlainImage:
    """PROG's symbols with their link-time addresses, its build-id, and
    (read when first asked) the DWARF of some of its files."""

    def __init__(self, path):
        from elftools.elf.elffile import ELFFile
        self.path = path
        try:
            self.build_id = build_id(path)
        except SymbolError as e:
            raise Fatal(str(e))
        self.globals = {}       # name -> (address, type)
        self.groups = {}        # file basename -> [{name: (address, type)}]
        self.cus = None         # [(path, comp_dir, producer, offset)]
        self._dwarf = {}        # file basename -> _CUInfo
        with open(path, "rb") as f:
            elf = ELFFile(f)
            if elf.header.e_machine != "EM_X86_64":
                raise Fatal("%s is not an x86-64 program" % path)
            sym = elf.get_section_by_name(".symtab")
            if sym is None:
                raise Fatal("target %s has no symbol table (stripped?); attach patches are built "
                            "against the unstripped program (the one with -g, or its debug file)"
                            % path)
            self.has_debug = elf.get_section_by_name(".debug_info") is not None
            current = None
            for s in sym.iter_symbols():
                typ = s["st_info"]["type"]
                if typ == "STT_FILE":
                    current = {}
                    self.groups.setdefault(os.path.basename(s.name), []).append(current)
                    continue
                if not s.name or s["st_shndx"] == "SHN_UNDEF" or "@" in s.name:
                    continue
                t = _TYPES.get(typ)
                if t is None:
                    continue
                bind = s["st_info"]["bind"]
                if bind == "STB_LOCAL":
                    if current is not None:
                        current.setdefault(s.name, (s["st_value"], t))
                elif bind in ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE"):
                    self.globals[s.name] = (s["st_value"], t)

    def symtab(self):
        """An elf.Symtab of the same symbols (what the pipeline asks)."""
        st = PlainSymtab(self)
        st.has_symtab = True
        st.globals = {n: t for n, (_, t) in self.globals.items()}
        st._by_base = {b: [(b, {n: t for n, (_, t) in g.items()}) for g in gs]
                       for b, gs in self.groups.items()}
        st.files = {b: [g for _, g in v] for b, v in st._by_base.items()}
        return st

    # -- DWARF --------------------------------------------------------------------
    def compile_units(self):
        """[(source path, comp_dir, producer)] of PROG's DWARF, [] without."""
        if self.cus is None:
            self.cus = []
            if self.has_debug:
                from elftools.elf.elffile import ELFFile
                with open(self.path, "rb") as f:
                    for cu in ELFFile(f).get_dwarf_info().iter_CUs():
                        top = cu.get_top_DIE()
                        a = top.attributes
                        name = _s(a.get("DW_AT_name"))
                        if not name:
                            continue
                        self.cus.append((name, _s(a.get("DW_AT_comp_dir")) or "",
                                         _s(a.get("DW_AT_producer")) or "", cu.cu_offset))
        return self.cus

    def cu_info(self, tu):
        """_CUInfo of the compilation unit(s) of file basename tu (static
        locals, inlined copies), None without DWARF for it."""
        if tu in self._dwarf:
            return self._dwarf[tu]
        offs = [off for name, _, _, off in self.compile_units()
                if os.path.basename(name) == tu]
        info = None
        if offs:
            from elftools.elf.elffile import ELFFile
            info = _CUInfo()
            with open(self.path, "rb") as f:
                dw = ELFFile(f).get_dwarf_info()
                for off in offs:
                    info.read(dw.get_CU_at(off))
        self._dwarf[tu] = info
        return info

    def producers(self, tu):
        return [p for name, _, p, _ in self.compile_units() if os.path.basename(name) == tu]

    # -- addresses -----------------------------------------------------------------
    def static_address(self, tu, name, types):
        """The link-time address of static `name` of file tu, or None; Fatal
        when several files named tu have one."""
        found = [g[name][0] for g in self.groups.get(tu, []) if name in g and g[name][1] in types]
        if len(found) > 1:
            raise Fatal("%s has %d statics '%s' in files named %s; the patch cannot tell them "
                        "apart" % (self.path, len(found), name, tu))
        if found:
            return found[0]
        if name.startswith(HOISTED):
            return self.static_local_address(tu, name)
        return None

    def static_local_address(self, tu, hoisted):
        if not self.has_debug:
            raise Fatal("%s has no debug information: the patch uses a static local variable "
                        "(%s in %s), which a plain build names only in its DWARF; rebuild the "
                        "program with -g (it is not changed otherwise) and restart it once"
                        % (self.path, _show_hoisted(hoisted), tu))
        info = self.cu_info(tu)
        return info.static_locals.get(hoisted) if info else None

    def global_address(self, name):
        v = self.globals.get(name)
        return v[0] if v else None


def _s(v):
    if v is None:
        return None
    x = v.value
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)


def _show_hoisted(name):
    body = name[len(HOISTED):]
    f, _, x = body.partition("__")
    return "'%s' of '%s'" % (x.split("__")[0], f)


class _CUInfo:
    """What one compilation unit's DWARF says: its static locals by the
    name unit.py hoists them to (molt__<f>__<x>, molt__<f>__<x>__2 for the
    second x of f) and, for every function, the functions that hold an
    inlined copy of it."""

    def __init__(self):
        self.static_locals = {}     # hoisted name -> link-time address
        self.inlined_into = {}      # function -> {functions holding an inlined copy}

    def read(self, cu):
        names = {}

        def name_of(die, depth=0):
            if die.offset in names:
                return names[die.offset]
            n = _s(die.attributes.get("DW_AT_name"))
            for ref in ("DW_AT_abstract_origin", "DW_AT_specification"):
                if n is None and ref in die.attributes and depth < 8:
                    try:
                        n = name_of(die.get_DIE_from_attribute(ref), depth + 1)
                    except Exception:
                        n = None
            names[die.offset] = n
            return n

        top = cu.get_top_DIE()
        for sub in top.iter_children():
            if sub.tag != "DW_TAG_subprogram":
                continue
            fname = name_of(sub)
            if not fname:
                continue
            seen = {}
            stack = list(sub.iter_children())
            order = []
            while stack:
                d = stack.pop(0)
                order.append(d)
                if d.tag in ("DW_TAG_lexical_block", "DW_TAG_inlined_subroutine"):
                    stack = list(d.iter_children()) + stack
            for d in order:
                if d.tag == "DW_TAG_inlined_subroutine":
                    callee = name_of(d)
                    if callee and callee != fname:
                        self.inlined_into.setdefault(callee, set()).add(fname)
                    continue
                if d.tag != "DW_TAG_variable" or "DW_AT_location" not in d.attributes:
                    continue
                loc = d.attributes["DW_AT_location"].value
                if not isinstance(loc, list) or len(loc) != 9 or loc[0] != 0x03:
                    continue        # not DW_OP_addr <8 bytes>: not a static
                var = _s(d.attributes.get("DW_AT_name"))
                if not var:
                    continue
                base = "%s%s__%s" % (HOISTED, fname, var)
                k = seen.get(base, 0) + 1
                seen[base] = k
                addr = int.from_bytes(bytes(loc[1:9]), "little")
                self.static_locals[base if k == 1 else "%s__%d" % (base, k)] = addr


class PlainSymtab(Symtab):
    """elf.Symtab of a plain PROG, which also knows its static locals
    (through DWARF) under the names unit.py hoists them to."""

    def __init__(self, image):
        Symtab.__init__(self)
        self.image = image

    def static_count(self, tu, name, types=None):
        n = Symtab.static_count(self, tu, name, types)
        if n or not name.startswith(HOISTED):
            return n
        return 1 if self.image.static_local_address(tu, name) is not None else 0

    def updatable(self, tu, name):
        """Every function PROG has a symbol for can be replaced at its
        address (main never: it does not return to be called again)."""
        if name == "main":
            return False
        return self.static_count(tu, name, FUNC_SYMTYPES) > 0 or \
            self.has_global(name, FUNC_SYMTYPES)


# ---------------------------------------------------------------------------
# PROG's sources: records made from the command line
# ---------------------------------------------------------------------------

_SKIP_DIRS = (".git", ".hg", ".svn", ".pc", "debian")


def _c_files(root):
    """{basename: [absolute paths]} of the .c files under root."""
    out = {}
    for dp, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for fn in files:
            if fn.endswith(".c"):
                out.setdefault(fn, []).append(os.path.join(dp, fn))
    return out


def tu_sources(image, root):
    """The absolute paths of PROG's translation units found under root:
    its DWARF compilation units, else the .c files its symbol table names."""
    out = []
    cus = image.compile_units()
    files = None
    if cus:
        for name, comp_dir, _, _ in cus:
            if not name.endswith(".c"):
                continue
            cands = [os.path.normpath(os.path.join(comp_dir, name))] if comp_dir else []
            if not os.path.isabs(name):
                cands.append(os.path.normpath(os.path.join(root, name)))
            hit = next((c for c in cands if c.startswith(root + "/") and os.path.isfile(c)), None)
            if hit is None:
                files = files if files is not None else _c_files(root)
                tail = [p for p in files.get(os.path.basename(name), [])
                        if p.endswith("/" + name.lstrip("./"))]
                hit = tail[0] if len(tail) == 1 else None
            if hit and hit not in out:
                out.append(hit)
        return out
    files = _c_files(root)
    for base in image.groups:
        for p in files.get(base, []):
            if p not in out:
                out.append(p)
    return out


def _deps(compiler, flags, root, path):
    """The project files the compile of path reads (-MM), absolute."""
    argv = compiler + flags + ["-MM", "-MG", "-MF", "/dev/stdout", path]
    p = subprocess.run(argv, cwd=root, capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip().splitlines()[-1:] or ["the compiler failed"]
    words = shlex.split(p.stdout.replace("\\\n", " "))
    out = []
    for w in words[1:]:
        ab = os.path.normpath(os.path.join(root, w))
        if os.path.isfile(ab) and ab not in out:
            out.append(ab)
    return out, None


class PlainProgram(Program):
    """source.Program for a plain PROG: one record per translation unit
    found in the tree, with the command line's flags; hashes are those of
    the files as they are now (moltcc cannot check that they are what PROG
    was built from: `recorded` is False)."""

    recorded = False

    def __init__(self, path, image, root, compiler, flags, report=None):
        self.image = image
        self.root = root
        tus = tu_sources(image, root)
        if not tus:
            raise Fatal("none of the source files of %s is under %s (its %s names %s); run "
                        "moltcc in the source tree it was built from, or give it with "
                        "--molt-source DIR" % (
                            path, root, "DWARF" if image.compile_units() else "symbol table",
                            ", ".join(sorted({os.path.basename(c[0]) for c in image.cus}
                                             or set(image.groups))[:6]) or "no file"))
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
            deps = list(ex.map(lambda p: _deps(compiler, flags, root, p), tus))
        records = []
        for tu, (dl, error) in zip(tus, deps):
            if dl is None:
                raise Fatal("%s does not compile with the flags given (%s): %s; give the flags "
                            "%s was built with" % (os.path.relpath(tu, root),
                                                   " ".join(flags) or "none", error[0], path))
            rel = os.path.relpath(tu, root)
            hashes = []
            for d in dl:
                with open(d, "rb") as f:
                    hashes.append((d, sha256_bytes(f.read())))
            own = dict(hashes).get(tu)
            if own is None:
                with open(tu, "rb") as f:
                    own = sha256_bytes(f.read())
            records.append(Record({
                "v": VERSION, "directory": root, "file": rel, "abspath": tu,
                "arguments": list(flags) + [rel], "compiler": list(compiler), "sha256": own,
                "deps": [(d, h) for d, h in hashes if d != tu],
                "molt": {"woven": False, "env": {}}}))
        Program.__init__(self, path, report, records)


def optimization(words):
    """The last -O option of a list of words ('-O0' when none)."""
    level = "-O0"
    for w in words:
        if w.startswith("-O"):
            level = "-O1" if w == "-O" else w
    return level


def check_flags(image, flags, tus):
    """Fatal when the flags cannot be PROG's: none given for a program
    without DWARF; an -O level other than the one PROG's DWARF records for
    an affected file."""
    given = optimization(flags)
    bad = []
    for tu in tus:
        for prod in image.producers(tu):
            want = optimization(prod.split())
            if want != given:
                bad.append("%s was compiled with %s (%s's DWARF), the flags given have %s"
                           % (tu, want, image.path, given))
    if bad:
        raise Fatal("%s; give the flags %s was built with" % ("; ".join(bad[:3]), image.path))


def check_inlined(image, tus):
    """Refusals (where, message): PROG's DWARF has an inlined copy of a
    function the patch ships in a function the patch does not replace,
    where the rebuild of the original has none -- the rebuild is not PROG's
    build (other flags or sources), so the comparison cannot be trusted for
    that copy.  (Where the rebuild inlined it too, the comparison saw that
    the holder's code did not change: the copy was specialised, e.g. its
    arguments folded.)"""
    from ..dwarf import DebugError, object_dwarf
    out = []
    for t in tus:
        cmp = t.comparison
        if cmp is None or not image.has_debug:
            continue
        info = image.cu_info(t.tu)
        orig = t.variants["orig"].object
        if info is None or orig is None:
            continue
        ours = _CUInfo()
        try:
            dw = object_dwarf(orig)
        except DebugError:
            dw = None
        for cu in (dw.iter_CUs() if dw else ()):
            ours.read(cu)
        shipped = {f.source for f in cmp.replaced} | {f.source for f in cmp.private_copies}
        for f in list(cmp.replaced) + list(cmp.private_copies):
            holders = info.inlined_into.get(f.source, set()) - shipped \
                - ours.inlined_into.get(f.source, set())
            if holders:
                out.append((t.rel, "'%s' changed, and %s has it inlined into %s, which the "
                                   "rebuild of the original does not: the flags given are not "
                                   "those %s was built with (or its sources differ)"
                            % (f.source, image.path, ", ".join("'%s'" % h for h in
                                                               sorted(holders)), image.path)))
    return out


# ---------------------------------------------------------------------------
# The patch file
# ---------------------------------------------------------------------------

def attach_marks(image, patch, imports):
    """The text of the patch's .molt_attach section: PROG's build-id, each
    new version's address in the patch and the address of the function it
    replaces in PROG, and each import's address in PROG."""
    from elftools.elf.elffile import ELFFile
    lines = ["molt-attach 1", "build-id %s" % image.build_id]
    with open(patch, "rb") as f:
        elf = ELFFile(f)
        sym = elf.get_section_by_name(".symtab")
        group = None
        news = []
        for s in sym.iter_symbols():
            if s["st_info"]["type"] == "STT_FILE":
                group = os.path.basename(s.name)
            elif s["st_info"]["type"] == "STT_FUNC" and s.name.endswith("__molt_p") and \
                    s["st_shndx"] != "SHN_UNDEF":
                news.append((group, s.name[:-len("__molt_p")], s["st_value"]))
    for tu, name, at in news:
        addr = image.static_address(tu, name, FUNC_SYMTYPES) if tu else None
        if addr is None:
            addr = image.global_address(name)
        if addr is None:
            raise Fatal("internal error: %s has no function '%s' (of %s) to replace"
                        % (image.path, name, tu))
        lines.append("replace %s %x %x" % (name, addr, at))
    for imp in imports:
        if imp.tu:
            addr = image.static_address(imp.tu, imp.name, FUNC_SYMTYPES if imp.is_func
                                        else VAR_SYMTYPES)
        else:
            addr = image.global_address(imp.name)
        if addr is None:
            what = _show_hoisted(imp.name) if imp.name.startswith(HOISTED) else "'%s'" % imp.name
            raise Fatal("%s: the patch refers to %s%s, which %s has no address for"
                        % (imp.where or "patch", what, " of %s" % imp.tu if imp.tu else "",
                           image.path))
        lines.append("import %s %x" % (imp.symbol, addr))
    return "\n".join(lines) + "\n"


def add_section(s, path, text):
    note = s.work.file("molt_attach.txt")
    with open(note, "w") as f:
        f.write(text)
    objcopy = os.environ.get("OBJCOPY", "objcopy")
    cp = [objcopy, "--add-section", "%s=%s" % (SECTION, note), path]
    s.tools.show(cp)
    p = subprocess.run(cp, stderr=subprocess.PIPE)
    if p.returncode != 0:
        raise Fatal("objcopy failed: %s" % p.stderr.decode(errors="replace").strip())


def compiler_and_flags(s):
    """(compiler words, flags) of a plain patch build: the real compiler
    and the command line without inputs and -o."""
    flags = gccargs.without(s.cmd.args, gccargs.INPUT, gccargs.OUTPUT)
    return list(s.tools.cc), flags
