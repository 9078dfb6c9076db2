"""Object comparison for patch builds (design: notes/patchbuild-design.md §3).

Compares two (or three) x86-64 ELF relocatable objects of ONE translation
unit -- the original and the new version, optionally a "new, line-remapped"
build -- function by function and data object by data object, and says what
a hot patch has to carry.  The objects are built with `-ffunction-sections
-fdata-sections -g -c` (woven by moltcc or plain C; gcc or clang; any -O;
-fPIC or not).  Only the Python standard library is used for the ELF part;
file:line of items comes from DWARF through moltcc.dwarf (pyelftools).

API
---
compare_objects(orig_o, new_o, remapped_o=None, updatable=None,
                target_has=None, tu=None, locate=True) -> Comparison

  updatable   which functions are updatable in the running program: a set of
              source-level names or a callable(name) -> bool.  Default: the
              functions that have a version-0 body `f__molt_v0` in orig_o.
  target_has  callable(symbol, is_static) -> bool: does the running program
              have this symbol (orig symbol names: `table`, `x.1`,
              `helper.part.0`, `f__molt_v0`).  Default: "orig_o has it".
  tu          the translation unit's name for identities and messages
              (default: the STT_FILE symbol of orig_o, e.g. "conn.c").

Comparison (all lists sorted by name; every item has .name, .tu, .symbol,
.section and .where = (file, line) or None, and str() gives one line):

  changed        FuncItem: in both builds, different code (or made different
                 by propagation: .reason says which, .via the changed callee
                 chain); .updatable (in the program) or not
  replaced       the changed functions that are updatable: shipped as new
                 versions (main, constructors ... are in unshippable instead)
  private_copies changed non-updatable functions the patch carries as its
                 own copies (callers are changed too), plus non-updatable
                 statics that shipped code calls and the program lacks;
                 .source is the C function (clones `helper.constprop.0` ->
                 'helper'); clones of a replaced function are not listed
  new_functions  only in new (shipped as private functions)
  removed_functions
  line_only      FuncItem: differ between orig and new but not between orig
                 and remapped (only __LINE__ moved): reported, not shipped
  changed_data   DataItem: in both builds and in the program, content
                 (size, bytes, relocation targets) changed; .users are the
                 orig functions that refer to it
  new_data       DataItem: only in new (or not in the program)
  removed_data, line_only_data
  unshippable    Unshippable(name, kind, chain, reason): main, a constructor
                 or destructor, a non-updatable function with external
                 linkage, or a live data object holding the address of a
                 changed non-updatable function; .chain is the path of
                 references that led there ('main', 'banner')
  references, orig_references
                 {function: [functions and data it refers to]} in the new and
                 the original build (logical names; an entry `f` counts as f)
  notes          strings
  shipped_functions()  names of replaced + private + new functions
  summary(), to_dict()

Identity of a function
----------------------
An updatable `f` of a woven TU is its body `f__molt_v0` (reported as "f");
the stable entries in `.text.molt_entries`, the dispatch paths
`f__molt_dispatch`, the descriptors in `molt_fns` and `molt__module_ctor`
are generated and not compared.  Other functions go by symbol name.  Local
symbols with compiler suffixes -- `.part.N .isra.N .constprop.N
.lto_priv.N`, numbered static locals `x.N`, `.cold` -- are correlated between
two builds by (base name, suffix kind): by name when the name has no
number, else by who refers to them and by content, then by order.  A
`.cold` piece is part of its parent function.

Fingerprints
------------
A function's fingerprint is its bytes with every relocated field zeroed,
plus its relocations as (offset, type, target key).  Target keys do not
depend on how the assembler named or placed things:
  * a defined function or variable: its (correlated) name + offset;
  * an undefined symbol: its name + addend;
  * a mergeable string section (`.rodata.str1.1`, `.rodata.<fn>.str1.1`,
    `.L.str.N`, `.LC0`): the string(s) at the target;
  * a mergeable constant pool (`.rodata.cstN`): the N bytes at the target;
  * compiler-generated named data (CSWTCH.N, __func__.N,
    __PRETTY_FUNCTION__.N, switch.table.*, __const.*, .compoundliteral ...)
    and anonymous data reached through a section symbol (jump tables,
    relative lookup tables, -O0 string literals in .rodata): the
    fingerprint of that data, recursively (cycles guarded).
The target of a PC-relative reference from code is symbol + addend + 4 +
(size of an immediate after the displacement, read from the instruction's
opcode); when the opcode is not recognised, every candidate target (4 bytes
wide) goes into the key, so a wrong guess can only report a false change.
A PC-relative field inside data (relative jump/lookup tables) is relative to
the start of the table.

Propagation (design §3): a changed function that is not updatable cannot be
replaced in place; every function that refers to it (calls it or takes its
address, directly or through tables), transitively through non-updatable
static functions, is changed too, up to updatable ones.  The chain ends in
`unshippable` when it reaches main, a constructor/destructor, a
non-updatable function with external linkage, or an existing data object
(the live object keeps the old address).

Also here: remap_source(orig_text, new_text) -> new text with `#line N`
directives so that every unchanged line keeps its original number (the
input of the "new, line-remapped" build).
"""
import bisect
import difflib
import hashlib
import os
import re
import struct

__all__ = ["compare_objects", "remap_source", "ObjectError", "Comparison",
           "FuncItem", "DataItem", "Unshippable", "load_object"]


class ObjectError(Exception):
    """A one-line error about an object file (not ELF, not x86-64 ...)."""


# ---------------------------------------------------------------------------
# Minimal ELF64 (x86-64, little-endian, ET_REL) reader
# ---------------------------------------------------------------------------

SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 2, 3, 4, 8, 9
SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY = 14, 15, 16
SHT_SYMTAB_SHNDX = 18
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR, SHF_MERGE, SHF_STRINGS = 1, 2, 4, 0x10, 0x20
SHF_TLS = 0x400
SHN_UNDEF, SHN_ABS, SHN_COMMON, SHN_XINDEX = 0, 0xfff1, 0xfff2, 0xffff
STT_NOTYPE, STT_OBJECT, STT_FUNC, STT_SECTION, STT_FILE, STT_COMMON, STT_TLS = 0, 1, 2, 3, 4, 5, 6
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2

# x86-64 relocation types
R_64, R_PC32, R_GOT32, R_PLT32, R_GOTPCREL, R_32, R_32S = 1, 2, 3, 4, 9, 10, 11
R_TLSGD, R_TLSLD, R_DTPOFF32, R_GOTTPOFF, R_TPOFF32, R_PC64 = 19, 20, 21, 22, 23, 24
R_GOTOFF64, R_GOTPC32, R_DTPOFF64, R_TPOFF64, R_SIZE32, R_SIZE64 = 25, 26, 17, 18, 32, 33
R_GOTPC32_TLSDESC, R_GOTPCRELX, R_REX_GOTPCRELX = 34, 41, 42
_PCREL = {R_PC32, R_PLT32, R_GOTPCREL, R_TLSGD, R_TLSLD, R_GOTTPOFF, R_GOTPC32,
          R_GOTPC32_TLSDESC, R_GOTPCRELX, R_REX_GOTPCRELX}
_FIELD8 = {R_64, R_PC64, R_GOTOFF64, R_DTPOFF64, R_TPOFF64, R_SIZE64, 16}


class Section:
    __slots__ = ("idx", "name", "type", "flags", "offset", "size", "link", "info",
                 "entsize", "_elf", "_data", "relocs", "_roffs", "units", "_starts",
                 "anchors", "_anchor_list", "_maxlen", "_regions")

    def __init__(self, elf, idx, name, typ, flags, offset, size, link, info, entsize):
        self._elf = elf
        self.idx, self.name, self.type, self.flags = idx, name, typ, flags
        self.offset, self.size, self.link, self.info, self.entsize = offset, size, link, info, entsize
        self._data = None
        self.relocs = []          # [(offset, type, symidx, addend)] sorted by offset
        self._roffs = None
        self.units = []           # named units, sorted by start
        self._starts = None
        self.anchors = set()      # offsets targeted by relocations (region split points)
        self._anchor_list = None
        self._maxlen = 0
        self._regions = {}

    @property
    def data(self):
        if self._data is None:
            if self.type == SHT_NOBITS:
                self._data = b""
            else:
                self._data = self._elf.raw[self.offset:self.offset + self.size]
        return self._data

    def has(self, f):
        return bool(self.flags & f)

    def rel_offsets(self):
        if self._roffs is None:
            self._roffs = [r[0] for r in self.relocs]
        return self._roffs

    def relocs_in(self, lo, hi):
        offs = self.rel_offsets()
        return self.relocs[bisect.bisect_left(offs, lo):bisect.bisect_left(offs, hi)]

    @property
    def klass(self):
        """What kind of memory, for fingerprints (never the section's name)."""
        if self.has(SHF_TLS):
            return "t"
        if self.has(SHF_EXECINSTR):
            return "x"
        if self.type == SHT_NOBITS:
            return "b"
        return "w" if self.has(SHF_WRITE) else "r"

    @property
    def is_strings(self):
        return self.has(SHF_MERGE) and self.has(SHF_STRINGS)

    @property
    def is_consts(self):
        return self.has(SHF_MERGE) and not self.has(SHF_STRINGS) and self.entsize > 0


class Symbol:
    __slots__ = ("idx", "name", "value", "size", "type", "bind", "shndx", "xindex", "unit")

    def __init__(self, idx, name, value, size, typ, bind, shndx):
        self.idx, self.name, self.value, self.size = idx, name, value, size
        self.type, self.bind, self.shndx = typ, bind, shndx
        self.xindex = False           # shndx came from SHT_SYMTAB_SHNDX
        self.unit = None

    @property
    def defined(self):
        return self.xindex or (self.shndx not in (SHN_UNDEF, SHN_ABS, SHN_COMMON)
                               and self.shndx < 0xff00)

    def __repr__(self):
        return "<Symbol %s>" % self.name


class Elf:
    """Sections, symbols and relocations of allocated sections of one
    relocatable x86-64 object (debug sections are not parsed here)."""

    def __init__(self, path):
        self.path = path
        try:
            with open(path, "rb") as f:
                self.raw = f.read()
        except OSError as e:
            raise ObjectError("cannot read %s: %s" % (path, e.strerror))
        raw = self.raw
        if raw[:4] != b"\x7fELF":
            raise ObjectError("%s is not an ELF object" % path)
        if raw[4] != 2 or raw[5] != 1:
            raise ObjectError("%s is not a 64-bit little-endian ELF object" % path)
        (e_type, e_machine, _ver, _entry, _phoff, e_shoff, _flags, _ehsize, _phentsize,
         _phnum, e_shentsize, e_shnum, e_shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", raw, 16)
        if e_type != 1:
            raise ObjectError("%s is not a relocatable object (compile with -c)" % path)
        if e_machine != 62:
            raise ObjectError("%s is not an x86-64 object" % path)
        if e_shoff == 0:
            raise ObjectError("%s has no section headers" % path)
        first = struct.unpack_from("<IIQQQQIIQQ", raw, e_shoff)
        if e_shnum == 0:
            e_shnum = first[5]
        if e_shstrndx == SHN_XINDEX:
            e_shstrndx = first[6]
        hdrs = [struct.unpack_from("<IIQQQQIIQQ", raw, e_shoff + i * e_shentsize)
                for i in range(e_shnum)]
        sh = hdrs[e_shstrndx]
        shstr = raw[sh[4]:sh[4] + sh[5]]

        def cstr(tab, off):
            end = tab.find(b"\0", off)
            return tab[off:end if end >= 0 else len(tab)].decode("utf-8", "surrogateescape")

        self.sections = []
        for i, (name, typ, flags, _addr, off, size, link, info, _align, entsize) in enumerate(hdrs):
            self.sections.append(Section(self, i, cstr(shstr, name), typ, flags, off, size,
                                         link, info, entsize))
        symtab = [s for s in self.sections if s.type == SHT_SYMTAB]
        self.symbols = []
        if symtab:
            st = symtab[0]
            strtab = self.sections[st.link].data
            xindex = None
            for s in self.sections:
                if s.type == SHT_SYMTAB_SHNDX and s.link == st.idx:
                    xindex = struct.unpack_from("<%dI" % (s.size // 4), raw, s.offset)
            for i, (name, info, _other, shndx, value, size) in enumerate(
                    struct.iter_unpack("<IBBHQQ", st.data)):
                sym = Symbol(i, cstr(strtab, name), value, size, info & 0xf, info >> 4, shndx)
                if shndx == SHN_XINDEX and xindex is not None:
                    sym.shndx = xindex[i]             # a section index >= 0xff00
                    sym.xindex = True
                self.symbols.append(sym)
        for s in self.sections:
            if s.type == SHT_REL:
                raise ObjectError("%s uses REL relocations (not x86-64 ELF as gcc/clang write it)" % path)
            if s.type != SHT_RELA or s.info >= len(self.sections):
                continue
            tgt = self.sections[s.info]
            if not tgt.has(SHF_ALLOC):
                continue          # .rela.debug_*: DWARF is read by pyelftools
            rel = [(o, inf & 0xffffffff, inf >> 32, a) for o, inf, a in struct.iter_unpack("<QQq", s.data)]
            rel.sort(key=lambda r: r[0])
            tgt.relocs = rel

    def section_of(self, sym):
        shndx = sym.shndx
        if sym.xindex:
            return self.sections[shndx] if shndx < len(self.sections) else None
        if shndx in (SHN_UNDEF, SHN_ABS, SHN_COMMON) or shndx >= 0xff00:
            return None
        return self.sections[shndx] if shndx < len(self.sections) else None

    def file_name(self):
        for s in self.symbols:
            if s.type == STT_FILE and s.name:
                return s.name
        return None


# ---------------------------------------------------------------------------
# Instruction tails: bytes after a PC-relative displacement
# ---------------------------------------------------------------------------

# one-byte opcodes with a ModRM byte and no immediate
_OP_NOIMM = set(range(0x00, 0x04)) | set(range(0x08, 0x0c)) | set(range(0x10, 0x14)) | \
    set(range(0x18, 0x1c)) | set(range(0x20, 0x24)) | set(range(0x28, 0x2c)) | \
    set(range(0x30, 0x34)) | set(range(0x38, 0x3c)) | {0x63} | set(range(0x84, 0x90)) | \
    set(range(0xd0, 0xd4)) | set(range(0xd8, 0xe0)) | {0xfe, 0xff}
_OP_IMM8 = {0x6b, 0x80, 0x83, 0xc0, 0xc1, 0xc6}
_OP_IMM32 = {0x69, 0x81, 0xc7}            # imm16 with an operand-size prefix
# two-byte (0F xx) opcodes with a ModRM byte
_OP0F_IMM8 = {0x70, 0x71, 0x72, 0x73, 0xa4, 0xac, 0xba, 0xc2, 0xc4, 0xc5, 0xc6}
_OP0F_NOIMM = {0x00, 0x01, 0x02, 0x03, 0x0d} | set(range(0x10, 0x18)) | set(range(0x18, 0x20)) | \
    set(range(0x28, 0x30)) | set(range(0x40, 0x50)) | set(range(0x50, 0x70)) | \
    {0x74, 0x75, 0x76} | set(range(0x78, 0x80)) | set(range(0x90, 0xa0)) | \
    {0xa3, 0xa5, 0xab, 0xad, 0xaf} | set(range(0xb0, 0xb8)) | set(range(0xbb, 0xc2)) | \
    {0xc3, 0xc7} | set(range(0xd0, 0x100))


def _insn_tail(code, r):
    """Bytes of the instruction after the 4-byte field at `r` (an immediate),
    or None when the instruction is not recognised."""
    if r >= 1 and code[r - 1] in (0xe8, 0xe9):
        return 0                          # call / jmp rel32
    if r >= 2 and code[r - 2] == 0x0f and 0x80 <= code[r - 1] <= 0x8f:
        return 0                          # jcc rel32
    if r < 2 or (code[r - 1] & 0xc7) != 0x05:
        return None                       # not a RIP-relative ModRM
    reg = (code[r - 1] >> 3) & 7
    op = code[r - 2]
    # VEX / EVEX encoded: map from the prefix
    if r >= 4 and code[r - 4] == 0xc5:
        return 1 if op in _OP0F_IMM8 else 0 if op in _OP0F_NOIMM else None
    if r >= 5 and code[r - 5] == 0xc4:
        m = code[r - 4] & 0x1f
        return {1: 1 if op in _OP0F_IMM8 else 0, 2: 0, 3: 1}.get(m)
    if r >= 6 and code[r - 6] == 0x62:
        return {1: 1 if op in _OP0F_IMM8 else 0, 2: 0, 3: 1}.get(code[r - 5] & 3)
    if r >= 4 and code[r - 4] == 0x0f and code[r - 3] == 0x38:
        return 0
    if r >= 4 and code[r - 4] == 0x0f and code[r - 3] == 0x3a:
        return 1
    if r >= 3 and code[r - 3] == 0x0f:
        if op in _OP0F_IMM8:
            return 1
        if op in _OP0F_NOIMM:
            return 0
        return None
    pfx66 = r >= 3 and (code[r - 3] == 0x66 or (0x40 <= code[r - 3] <= 0x4f and r >= 4
                                                 and code[r - 4] == 0x66))
    if op in _OP_NOIMM:
        return 0
    if op in _OP_IMM8:
        return 1
    if op in _OP_IMM32:
        return 2 if pfx66 else 4
    if op == 0xf6:
        return 1 if reg in (0, 1) else 0
    if op == 0xf7:
        return (2 if pfx66 else 4) if reg in (0, 1) else 0
    return None


# ---------------------------------------------------------------------------
# Units: functions, data objects, compiler artifacts, anonymous regions
# ---------------------------------------------------------------------------

# Compiler-generated named data that belongs to the code using it: compared
# by content, never an identity of its own.
_ARTIFACT_RE = re.compile(
    r"^(?:\..*"                                         # .L.str, .Lswitch.table, .compoundliteral
    r"|(?:CSWTCH|C|__func__|__FUNCTION__|__PRETTY_FUNCTION__|__compound_literal"
    r"|compound_literal)\.\d+"
    r"|switch\.table\..*|reltable\..*|__const\..*|.*\.compoundliteral(?:\.\d+)?)$")
# The constructors and destructors sanitizers and coverage add to every
# object (gcc: _sub_I_00099_0, clang: asan.module_ctor): not the user's code;
# they change whenever the object's globals do.
_INSTRUMENTATION_RE = re.compile(r"^(_sub_[ID]_\d+_\d+|[a-z]+\.module_[cd]tor)$")
_CLONE_KINDS = ("cold", "part", "isra", "constprop", "lto_priv", "localalias", "clone",
                "specialized")
MOLT_SECTIONS = ("molt_fns", "molt_pfns", "molt_imports", ".molt")


def _split_name(name):
    """'foo.constprop.0.isra.1' -> ('foo', ('constprop', 'isra'), (0, 1))."""
    toks = name.split(".")
    kind = tuple(t for t in toks[1:] if not t.isdigit())
    nums = tuple(int(t) for t in toks[1:] if t.isdigit())
    return toks[0], kind, nums


def logical_name(sym_name):
    """How reports name a function symbol: 'f__molt_v0' -> 'f',
    'f__molt_v0.part.0' -> 'f.part.0'."""
    base, dot, rest = sym_name.partition(".")
    if base.endswith("__molt_v0"):
        base = base[:-len("__molt_v0")]
    return base + dot + rest


def source_name(sym_name):
    """The C function a symbol comes from: 'f__molt_v0.part.0' -> 'f'."""
    base = sym_name.lstrip("+").split(".", 1)[0]
    if base.endswith("__molt_v0"):
        base = base[:-len("__molt_v0")]
    return base


class Unit:
    __slots__ = ("kind", "sec", "start", "end", "syms", "name", "static", "targets",
                 "numbered", "group", "cold_of", "colds", "generated", "ctor")

    def __init__(self, kind, sec, start, end, syms=()):
        self.kind = kind              # func, data, art, region
        self.sec, self.start, self.end = sec, start, end
        self.syms = list(syms)
        self.name = None
        self.static = True
        self.targets = None           # [(rel_off, type, target)]
        self.numbered = False
        self.group = None
        self.cold_of = None           # parent unit of a .cold piece
        self.colds = []
        self.generated = False        # molt's own: entries, dispatch, descriptors
        self.ctor = None              # 'constructor' / 'destructor'

    def __repr__(self):
        return "<%s %s %s+%x>" % (self.kind, self.name, self.sec.name, self.start)


class ObjModel:
    """One object file turned into units with resolved relocation targets."""

    def __init__(self, path):
        self.elf = Elf(path)
        self.path = path
        self.units = []
        self.by_name = {}
        self._build_units()
        self._compute_anchors()
        self._resolve_all()
        self._mark_ctors()

    # -- units -------------------------------------------------------------
    def _build_units(self):
        elf = self.elf
        pending = {}
        for s in elf.symbols:
            if s.type in (STT_SECTION, STT_FILE) or not s.name:
                continue
            if "@" in s.name:
                continue    # a versioned alias (f@MOLT_0, weave.export_source_name) of a unit
            sec = elf.section_of(s)
            if sec is None or not sec.has(SHF_ALLOC):
                continue
            is_label = s.name.startswith(".L") or (s.type == STT_NOTYPE and s.bind == STB_LOCAL)
            if sec.has(SHF_MERGE) and (is_label or s.name.startswith(".")):
                continue                        # a string / constant label
            if is_label:
                continue
            if sec.has(SHF_EXECINSTR) or s.type == STT_FUNC:
                kind = "func"
            elif s.bind == STB_LOCAL and _ARTIFACT_RE.match(s.name):
                kind = "art"
            else:
                kind = "data"
            key = (sec.idx, s.value, s.size, kind)
            u = pending.get(key)
            if u is None:
                u = pending[key] = Unit(kind, sec, s.value, s.value + s.size)
            u.syms.append(s)
            s.unit = u
        for u in pending.values():
            # primary name: a global one, else the first
            glob = [s for s in u.syms if s.bind != STB_LOCAL]
            prim = glob[0] if glob else u.syms[0]
            u.name = prim.name
            u.static = not glob
            base, kind, nums = _split_name(u.name)
            u.numbered = bool(nums) and u.static
            u.group = (u.kind, base, kind)
            self.units.append(u)
            u.sec.units.append(u)
        # size-0 functions (assembler ones): up to the next unit or the section end
        for sec in elf.sections:
            if not sec.units:
                continue
            sec.units.sort(key=lambda u: (u.start, u.end))
            for i, u in enumerate(sec.units):
                if u.end == u.start and u.kind == "func":
                    nxt = [v.start for v in sec.units[i + 1:] if v.start > u.start]
                    u.end = nxt[0] if nxt else sec.size
            sec._starts = [u.start for u in sec.units]
            sec._maxlen = max(u.end - u.start for u in sec.units)
        names = {}
        for u in self.units:
            names.setdefault(u.name, []).append(u)
        for n, us in names.items():
            if len(us) > 1:       # the same local name twice: make identities unique
                for i, u in enumerate(us[1:], 1):
                    u.name = "%s#%d" % (n, i)
        self.by_name = {u.name: u for u in self.units}
        for u in self.units:
            sn = u.sec.name
            if u.kind == "func":
                if sn == ".text.molt_entries" or u.name.endswith("__molt_dispatch") \
                        or u.name.startswith("molt__") or _INSTRUMENTATION_RE.match(u.name):
                    u.generated = True
            elif u.name.endswith("__molt_desc") or sn in MOLT_SECTIONS or sn.startswith(".molt"):
                u.generated = True
            if u.kind == "func" and ".cold" in u.name:
                parent = self.by_name.get(u.name.split(".cold", 1)[0])
                if parent is not None and parent.kind == "func":
                    u.cold_of = parent
                    parent.colds.append(u)

    def unit_at(self, sec, off):
        """The named unit of `sec` containing offset `off` (or starting
        there); the largest one when units overlap."""
        units = sec.units
        if not units:
            return None
        i = bisect.bisect_right(sec._starts, off) - 1
        best = None
        while i >= 0:
            u = units[i]
            if off - u.start > sec._maxlen:
                break
            if u.start <= off < u.end or u.start == off:
                if best is None or (u.end - u.start) > (best.end - best.start):
                    best = u
            i -= 1
        return best

    def region_at(self, sec, off):
        """The anonymous piece of `sec` around `off` (not covered by a named
        unit): from the closest split point at or before `off` to the next
        one.  Split points are the ends and starts of named units and the
        offsets that some relocation targets for sure (compilers refer to
        their anonymous constants -- string literals, float constants,
        jump tables, array initialisers -- at their start; two constants are
        never parts of one another)."""
        lo, hi = 0, sec.size
        if sec.units:
            i = bisect.bisect_right(sec._starts, off) - 1
            if i >= 0:
                ends = [u.end for u in sec.units[max(0, i - 8):i + 1] if u.end <= off]
                lo = max(ends) if ends else 0
            if i + 1 < len(sec.units):
                hi = sec.units[i + 1].start
        if sec._anchor_list is None:
            sec._anchor_list = sorted(sec.anchors)
        anchors = sec._anchor_list

        def splits(a):
            return True

        j = bisect.bisect_right(anchors, off) - 1
        while j >= 0 and anchors[j] > lo:
            if splits(anchors[j]):
                lo = anchors[j]
                break
            j -= 1
        j = bisect.bisect_right(anchors, off)
        while j < len(anchors) and anchors[j] < hi:
            if splits(anchors[j]):
                hi = anchors[j]
                break
            j += 1
        if hi <= lo:
            hi = lo
        key = (lo, hi)
        u = sec._regions.get(key)
        if u is None:
            u = sec._regions[key] = Unit("region", sec, lo, hi)
            u.name = "%s+%#x" % (sec.name, lo)
            u.targets = [self._target(u, r) for r in sec.relocs_in(lo, hi)]
        return u

    # -- relocation targets ----------------------------------------------
    def _offset(self, unit, r, sym):
        """(target offset in the symbol's section, width of uncertainty)."""
        off, typ, _si, add = r
        base = sym.value + add
        if typ in _PCREL or typ == R_PC64:
            if unit.sec.has(SHF_EXECINSTR) and typ != R_PC64:
                k = _insn_tail(unit.sec.data, off)
                if k is None:
                    return base + 4, 4
                return base + 4 + k, 0
            # a PC-relative field in data: relative to the start of the table
            return base - (off - unit.start), 0
        return base, 0

    def _compute_anchors(self):
        for u in self.units:
            for r in u.sec.relocs_in(u.start, u.end):
                sym = self.elf.symbols[r[2]]
                if sym.unit is not None:
                    continue
                sec = self.elf.section_of(sym)
                if sec is None:
                    continue
                t, w = self._offset(u, r, sym)
                if w == 0:
                    sec.anchors.add(t)
        # relocations of anonymous data (jump tables) target code; code is
        # split by function symbols already

    def _target(self, unit, r):
        off, typ, si, add = r
        sym = self.elf.symbols[si]
        rel = off - unit.start
        if sym.unit is not None:
            # the same key as a section symbol + offset would give
            t, _w = self._offset(unit, r, sym)
            return (rel, typ, ("u", sym.unit, t - sym.unit.start))
        sec = self.elf.section_of(sym)
        if sec is None:
            if sym.shndx == SHN_ABS:
                return (rel, typ, ("abs", sym.name, sym.value + add))
            return (rel, typ, ("ext", sym.name, add))
        t, w = self._offset(unit, r, sym)
        return (rel, typ, self._resolve(sec, t, w, (t - (sym.value + add))))

    def _resolve(self, sec, t, w, adj):
        """Key material for offset t (+ up to w bytes of uncertainty) of
        section sec; adj: what was added to symbol+addend to get t."""
        if sec.is_strings:
            data = sec.data
            start = data.rfind(b"\0", 0, t) + 1 if t > 0 else 0
            if t >= len(data):
                return ("str", (), t - len(data), adj)
            strs = []
            p = start
            while True:
                e = data.find(b"\0", p)
                e = len(data) if e < 0 else e
                strs.append(bytes(data[p:e]))
                if e + 1 > t + w or e + 1 >= len(data):
                    break
                p = e + 1
            return ("str", tuple(strs), t - start, adj)
        if sec.is_consts:
            n = sec.entsize
            data = sec.data
            first = (t // n) * n
            ents = []
            e = first
            while e <= t + w and e < len(data):
                ents.append(bytes(data[e:e + n]))
                e += n
            return ("cst", n, tuple(ents), t - first, adj)
        hits = []
        # a target outside the section (an instruction misread, or a
        # pointer before/after an object): the closest byte names it
        p = min(max(t, 0), max(sec.size - 1, 0))
        while True:
            u = self.unit_at(sec, p)
            if u is None and p == sec.size and p > 0:
                u = self.unit_at(sec, p - 1)       # one past the end
            if u is None:
                u = self.region_at(sec, min(p, max(sec.size - 1, 0)))
            hits.append((u, t - u.start))
            if w == 0 or u.end > t + w or u.end <= p:
                break
            p = u.end
        if len(hits) == 1:
            return ("u", hits[0][0], hits[0][1])
        return ("multi", tuple(("u", u, o) for u, o in hits))

    def _resolve_all(self):
        for u in self.units:
            u.targets = [self._target(u, r) for r in u.sec.relocs_in(u.start, u.end)]

    def _mark_ctors(self):
        for sec in self.elf.sections:
            n = sec.name
            if sec.type in (SHT_INIT_ARRAY, SHT_PREINIT_ARRAY) or n.startswith((".init_array", ".ctors", ".preinit_array")):
                what = "constructor"
            elif sec.type == SHT_FINI_ARRAY or n.startswith((".fini_array", ".dtors")):
                what = "destructor"
            else:
                continue
            for r in sec.relocs:
                sym = self.elf.symbols[r[2]]
                if sym.unit is not None:
                    tu = sym.unit
                else:
                    s2 = self.elf.section_of(sym)
                    tu = self.unit_at(s2, sym.value + r[3]) if s2 is not None else None
                if tu is not None and tu.kind == "func":
                    tu.ctor = what

    # -- references between units ----------------------------------------
    def referenced_units(self, u, seen=None):
        """Named func/data units that u refers to, directly or through
        artifacts and anonymous data."""
        out = set()
        seen = set() if seen is None else seen
        stack = [u]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            for _rel, _typ, t in x.targets or ():
                for tt in (t[1] if t[0] == "multi" else (t,)):
                    if tt[0] != "u":
                        continue
                    v = tt[1]
                    if v.kind in ("func", "data"):
                        if v is not u:
                            out.add(v.cold_of or v)
                    else:
                        if v.targets is None:
                            v.targets = [self._target(v, r) for r in v.sec.relocs_in(v.start, v.end)]
                        stack.append(v)
        return out


# ---------------------------------------------------------------------------
# Fingerprints
# ---------------------------------------------------------------------------

class Fingerprinter:
    """Fingerprints of the units of one model, naming named units through
    `canon(unit) -> str` (the correlated identity)."""

    def __init__(self, model, canon):
        self.m = model
        self.canon = canon
        self.memo = {}

    def key(self, t, stack):
        tag = t[0]
        if tag == "u":
            u = t[1]
            if u.kind in ("func", "data"):
                return ("s", self.canon(u), t[2])
            return ("a", self.fp(u, stack), t[2])
        if tag == "multi":
            return ("m",) + tuple(self.key(x, stack) for x in t[1])
        return t

    def fp(self, u, stack=None):
        got = self.memo.get(u)
        if got is not None:
            return got
        stack = [] if stack is None else stack
        if u in stack:
            return ("cycle", len(stack) - stack.index(u))
        stack.append(u)
        h = hashlib.blake2b(digest_size=16)
        sec = u.sec
        data = b""
        if sec.type != SHT_NOBITS:
            data = bytearray(sec.data[u.start:u.end])
            for r in sec.relocs_in(u.start, u.end):
                o = r[0] - u.start
                width = 8 if r[1] in _FIELD8 else 4
                data[o:o + width] = b"\xff" * min(width, len(data) - o)
            if u.kind == "region":
                # an anonymous piece runs to the next piece: its alignment
                # padding is not part of the constant (the code that reads
                # the constant fixes how many bytes it reads)
                data = data.rstrip(b"\0")
        size = len(data) if u.kind == "region" else u.end - u.start
        h.update(("%s %s %d\n" % (u.kind, sec.klass, size)).encode())
        h.update(bytes(data))
        if u.targets is None:
            u.targets = [self.m._target(u, r) for r in sec.relocs_in(u.start, u.end)]
        for rel, typ, t in u.targets:
            h.update(repr((rel, typ, self.key(t, stack))).encode("utf-8", "surrogateescape"))
        stack.pop()
        d = h.digest()
        self.memo[u] = d
        return d

    def full(self, u):
        """A function with its .cold pieces."""
        if not u.colds:
            return self.fp(u)
        h = hashlib.blake2b(digest_size=16)
        h.update(self.fp(u))
        for c in sorted(u.colds, key=lambda c: c.name):
            h.update(self.fp(c))
        return h.digest()


# ---------------------------------------------------------------------------
# Correlation of two builds
# ---------------------------------------------------------------------------

def _prelim_canon(u):
    if u.numbered:
        return "%s.#%s" % (u.group[1], ".".join(u.group[2]))
    return u.name


def _referrers(model):
    """unit -> frozenset of prelim names of the named units referring to it."""
    refs = {}
    for u in model.units:
        if u.kind not in ("func", "data"):
            continue
        owner = _prelim_canon(u.cold_of or u)
        for v in model.referenced_units(u):
            refs.setdefault(v, set()).add(owner)
    return {k: frozenset(v) for k, v in refs.items()}


def correlate(orig, new):
    """canon(unit of new) -> orig name (or '+name' when new has no match)."""
    mapping = {}
    onames = {u.name: u for u in orig.units if u.kind in ("func", "data")}
    ogroups, ngroups = {}, {}
    for u in orig.units:
        if u.kind in ("func", "data") and u.numbered:
            ogroups.setdefault(u.group, []).append(u)
    for u in new.units:
        if u.kind not in ("func", "data"):
            continue
        if not u.numbered:
            o = onames.get(u.name)
            mapping[u] = u.name if (o is not None and not o.numbered) else (
                u.name if o is None else "+" + u.name)
        else:
            ngroups.setdefault(u.group, []).append(u)
    if ngroups:
        ofp = Fingerprinter(orig, _prelim_canon)
        nfp = Fingerprinter(new, _prelim_canon)
        oref = _referrers(orig)
        nref = _referrers(new)
        for g, nus in ngroups.items():
            ous = list(ogroups.get(g, []))
            nus = sorted(nus, key=lambda u: _split_name(u.name)[2])
            ous.sort(key=lambda u: _split_name(u.name)[2])
            if len(ous) == 1 and len(nus) == 1:
                mapping[nus[0]] = ous[0].name
                continue
            osig = {o: (oref.get(o, frozenset()), ofp.full(o)) for o in ous}
            nsig = {n: (nref.get(n, frozenset()), nfp.full(n)) for n in nus}
            left = list(nus)
            for test in (lambda a, b: a == b,                  # same referrers and content
                         lambda a, b: a[0] == b[0] and a[0],   # same referrers
                         lambda a, b: a[1] == b[1],            # same content
                         lambda a, b: True):                   # order
                rest = []
                for n in left:
                    for o in ous:
                        if test(nsig[n], osig[o]):
                            mapping[n] = o.name
                            ous.remove(o)
                            break
                    else:
                        rest.append(n)
                left = rest
            for n in left:
                mapping[n] = "+" + n.name
    return mapping


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------

def _loc(tu, where):
    """'t.c:12' (where the item is declared), else the TU's name."""
    return "%s:%s" % where if where else tu


class FuncItem:
    def __init__(self, name, tu, symbol, section, static, updatable, reason, where=None,
                 via=(), colds=()):
        self.name = name              # 'compute', 'helper.part.0'
        self.source = source_name(symbol)
        self.tu = tu
        self.symbol = symbol          # symbol in new (orig for removed)
        self.section = section
        self.static = static
        self.updatable = updatable
        self.private = not updatable
        self.reason = reason
        self.where = where
        self.via = tuple(via)         # propagation: the changed callee chain
        self.colds = tuple(colds)
        self.ctor = None

    @property
    def key(self):
        return (self.name, self.tu if self.static else None)

    def __str__(self):
        return "%s%s (%s, %s): %s" % ("static " if self.static else "", self.name,
                                       _loc(self.tu, self.where), self.section, self.reason)

    __repr__ = __str__

    def to_dict(self):
        return {k: getattr(self, k) for k in ("name", "source", "tu", "symbol", "section", "static",
                                               "updatable", "reason", "where", "via", "colds")}


class DataItem:
    def __init__(self, name, tu, symbol, section, static, reason, size_old=None, size_new=None,
                 users=(), where=None):
        self.name = name
        self.tu = tu
        self.symbol = symbol
        self.section = section
        self.static = static
        self.reason = reason
        self.size_old, self.size_new = size_old, size_new
        self.users = tuple(users)
        self.where = where

    @property
    def key(self):
        return (self.name, self.tu if self.static else None)

    def __str__(self):
        s = "%s%s (%s, %s): %s" % ("static " if self.static else "", self.name,
                                   _loc(self.tu, self.where), self.section, self.reason)
        if self.users:
            s += "; used by " + ", ".join(self.users)
        return s

    __repr__ = __str__

    def to_dict(self):
        return {k: getattr(self, k) for k in ("name", "tu", "symbol", "section", "static", "reason",
                                               "size_old", "size_new", "users", "where")}


class Unshippable:
    def __init__(self, name, tu, kind, chain, reason, where=None):
        self.name = name              # the function (or data object) that cannot be shipped
        self.tu = tu
        self.kind = kind              # main, constructor, destructor, external, data
        self.chain = tuple(chain)     # [name, ..., changed callee]
        self.reason = reason
        self.where = where

    def __str__(self):
        return "%s (%s): %s" % (self.name, _loc(self.tu, self.where), self.reason)

    __repr__ = __str__

    def to_dict(self):
        return {k: getattr(self, k) for k in ("name", "tu", "kind", "chain", "reason", "where")}


class Comparison:
    def __init__(self, tu):
        self.tu = tu
        self.changed = []
        self.new_functions = []
        self.removed_functions = []
        self.line_only = []
        self.changed_data = []
        self.new_data = []
        self.removed_data = []
        self.line_only_data = []
        self.unshippable = []
        self.notes = []
        self.references = {}          # function -> names it refers to (new build)
        self.orig_references = {}     # the same in the original build

    @property
    def replaced(self):
        stuck = {u.name for u in self.unshippable}
        return [f for f in self.changed if f.updatable and f.name not in stuck]

    @property
    def private_copies(self):
        """Changed non-updatable functions the patch carries as its own
        copies (and non-updatable statics shipped code needs that the
        program lacks).  Compiler clones (.part/.isra/.constprop) of a
        replaced function come with its new version and are not listed."""
        stuck = {u.name for u in self.unshippable}
        whole = {f.source for f in self.replaced} | {f.source for f in self.new_functions}
        return [f for f in self.changed if not f.updatable and f.name not in stuck
                and not (f.name != f.source and f.source in whole)] + \
            getattr(self, "_extra_private", [])

    def shipped_functions(self):
        return sorted({f.name for f in self.replaced} | {f.name for f in self.private_copies}
                      | {f.name for f in self.new_functions})

    def summary(self):
        out = []
        for title, items in (("replaced", self.replaced), ("private copies", self.private_copies),
                             ("new functions", self.new_functions),
                             ("removed functions", self.removed_functions),
                             ("line numbers only", self.line_only),
                             ("changed data", self.changed_data), ("new data", self.new_data),
                             ("removed data", self.removed_data),
                             ("data, line numbers only", self.line_only_data),
                             ("cannot be shipped", self.unshippable)):
            for it in items:
                out.append("%s: %s" % (title, it))
        out.extend("note: " + n for n in self.notes)
        return "\n".join(out)

    def to_dict(self):
        return {"tu": self.tu,
                "replaced": [f.to_dict() for f in self.replaced],
                "private_copies": [f.to_dict() for f in self.private_copies],
                "new_functions": [f.to_dict() for f in self.new_functions],
                "removed_functions": [f.to_dict() for f in self.removed_functions],
                "line_only": [f.to_dict() for f in self.line_only],
                "changed_data": [d.to_dict() for d in self.changed_data],
                "new_data": [d.to_dict() for d in self.new_data],
                "removed_data": [d.to_dict() for d in self.removed_data],
                "line_only_data": [d.to_dict() for d in self.line_only_data],
                "unshippable": [u.to_dict() for u in self.unshippable],
                "notes": list(self.notes)}


# ---------------------------------------------------------------------------
# compare_objects
# ---------------------------------------------------------------------------

_model_cache = {}


def load_object(path):
    """The parsed model of an object (cached by path, size and mtime)."""
    st = os.stat(path)
    k = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    m = _model_cache.get(k)
    if m is None:
        if len(_model_cache) > 16:
            _model_cache.clear()
        m = _model_cache[k] = ObjModel(path)
    return m


class _Side:
    """One build correlated against orig: identity -> unit, fingerprints."""

    def __init__(self, model, canon_map=None):
        self.m = model
        if canon_map is None:
            self.canon = lambda u: u.name
        else:
            self.canon = lambda u, cm=canon_map: cm.get(u, u.name)
        self.fp = Fingerprinter(model, self.canon)
        self.funcs = {}     # identity (canon name) -> unit
        self.data = {}
        for u in model.units:
            if u.generated or u.cold_of is not None:
                continue
            if u.kind == "func":
                self.funcs[self.canon(u)] = u
            elif u.kind == "data":
                self.data[self.canon(u)] = u


def _default_updatable(orig):
    return {u.name[:-len("__molt_v0")] for u in orig.units
            if u.kind == "func" and u.name.endswith("__molt_v0")}


def compare_objects(orig_o, new_o, remapped_o=None, updatable=None, target_has=None, tu=None,
                    locate=True):
    orig = load_object(orig_o)
    new = load_object(new_o)
    rem = load_object(remapped_o) if remapped_o else None
    tu = tu or orig.elf.file_name() or os.path.basename(orig_o)
    if updatable is None:
        updatable = _default_updatable(orig)
    is_updatable = updatable if callable(updatable) else (lambda n, s=frozenset(updatable): n in s)
    if target_has is None:
        onames = {s.name for s in orig.elf.symbols if s.defined}
        target_has = lambda name, is_static, s=onames: name in s   # noqa: E731

    res = Comparison(tu)
    res.orig_path, res.new_path, res.remapped_path = orig_o, new_o, remapped_o
    O = _Side(orig)
    N = _Side(new, correlate(orig, new))
    R = _Side(rem, correlate(orig, rem)) if rem is not None else None

    where_new, where_orig = ({}, {})
    if locate:
        try:
            from ..dwarf import decl_locations
            where_new = decl_locations(new_o)
            where_orig = decl_locations(orig_o)
        except Exception as e:              # pragma: no cover - DWARF problems are not fatal here
            res.notes.append("no file:line for items: %s" % e)

    def where(symname, prefer_new=True):
        base = symname.lstrip("+").split(".", 1)[0]
        tables = (where_new, where_orig) if prefer_new else (where_orig, where_new)
        for t in tables:
            if base in t:
                return t[base]
        return None

    def func_item(ident, u, reason, side_new=True):
        sym = ident.lstrip("+") if side_new else ident
        name = logical_name(sym)
        src = source_name(sym)
        static = u.static
        if u.name.endswith("__molt_v0"):
            entry = (new if side_new else orig).by_name.get(src)
            if entry is not None:
                static = entry.static
        it = FuncItem(name, tu, u.name, u.sec.name, static,
                      is_updatable(src) and not u.numbered and "." not in sym, reason,
                      where(u.name, side_new), colds=[c.name for c in u.colds])
        it.ctor = u.ctor
        return it

    # -- functions --------------------------------------------------------
    direct = {}          # ident -> FuncItem (changed in new vs orig)
    for ident, nu in N.funcs.items():
        ou = O.funcs.get(ident)
        if ou is None:
            res.new_functions.append(func_item(ident, nu, "new function"))
            continue
        if O.fp.full(ou) == N.fp.full(nu):
            continue
        if R is not None:
            ru = R.funcs.get(ident)
            if ru is not None and O.fp.full(ou) == R.fp.full(ru):
                res.line_only.append(func_item(ident, nu, "only line numbers changed (__LINE__ / assert)"))
                continue
        cold_only = bool(ou.colds or nu.colds) and O.fp.fp(ou) == N.fp.fp(nu)
        direct[ident] = func_item(ident, nu, "code changed in its .cold part" if cold_only else "code changed")
    for ident, ou in O.funcs.items():
        if ident not in N.funcs:
            res.removed_functions.append(func_item(ident, ou, "removed", side_new=False))

    # references by identity (for propagation and messages); a stable
    # entry `f` counts as f
    def references(side, model):
        refs = {}
        for ident, u in list(side.funcs.items()) + list(side.data.items()):
            out = set()
            for part in [u] + u.colds:
                for v in model.referenced_units(part):
                    if v is u or (v.generated and v.sec.name != ".text.molt_entries"):
                        continue
                    out.add(side.canon(v))
            refs[ident] = out
        return refs

    refs = references(N, new)
    referrers = {}
    for ident, out in refs.items():
        for v in out:
            referrers.setdefault(v, set()).add(ident)

    def by_name(refs, side):
        return {logical_name(k.lstrip("+")): sorted({logical_name(x.lstrip("+")) for x in v})
                for k, v in refs.items() if k in side.funcs}
    res.references = by_name(refs, N)
    res.orig_references = by_name(references(O, orig), O)

    # -- propagation --------------------------------------------------------
    changed = dict(direct)
    newf = {("+" + f.symbol if ("+" + f.symbol) in N.funcs else f.symbol): f for f in res.new_functions}

    def blocked(ident, item):
        """Why a changed function cannot be shipped at all, or None."""
        u = N.funcs.get(ident)
        if item.name == "main" or source_name(item.symbol) == "main":
            return "main", "main changed; main never runs again in a live process"
        if u is not None and u.ctor:
            return u.ctor, "%s changed; a %s never runs again in a live process" % (u.ctor, u.ctor)
        if not item.updatable and not item.static:
            return "external", ("not updatable and has external linkage: other files call the "
                                "running copy")
        return None

    work = [i for i, it in changed.items() if not it.updatable]
    seen_chain = {i: (changed[i].name,) for i in work}
    unship = {}
    for ident, it in changed.items():
        b = blocked(ident, it)
        if b:
            unship[ident] = Unshippable(it.name, tu, b[0], (it.name,), b[1], it.where)
    while work:
        g = work.pop()
        gitem = changed[g]
        chain = seen_chain[g]
        for r in sorted(referrers.get(g, ())):
            if r in N.data:
                if r in O.data and target_has(O.data[r].name, O.data[r].static):
                    nm = r.lstrip("+")
                    if nm not in unship:
                        unship[nm] = Unshippable(
                            nm, tu, "data", (nm,) + chain,
                            "the live object '%s' holds the address of %s, which changed and is "
                            "not updatable (%s)" % (nm, chain[-1], " <- ".join(reversed(chain))),
                            None)
                continue
            if r not in N.funcs or r in newf:
                continue
            if r in changed:
                continue
            ru = N.funcs[r]
            rit = func_item(r, ru, "refers to %s, which changed and is not updatable" % gitem.name)
            rit.via = chain
            changed[r] = rit
            seen_chain[r] = (rit.name,) + chain
            b = blocked(r, rit)
            if b:
                unship[r] = Unshippable(rit.name, tu, b[0], seen_chain[r],
                                        "%s; it refers to %s (%s)" % (
                                            b[1], chain[0], " -> ".join(seen_chain[r])), rit.where)
                continue
            if not rit.updatable:
                work.append(r)
    res.changed = [it for i, it in changed.items()]
    res.unshippable = list(unship.values())

    # non-updatable statics the shipped code needs that the program lacks
    extra = {}
    todo = [i for i, it in changed.items()] + list(newf)
    done = set()
    while todo:
        i = todo.pop()
        if i in done:
            continue
        done.add(i)
        for v in refs.get(i, ()):
            if v not in N.funcs or v in changed or v in newf or v in extra:
                continue
            vu = N.funcs[v]
            vname = v.lstrip("+")
            if not vu.static or is_updatable(source_name(vname)) and "." not in vname:
                continue
            if target_has(vname if not v.startswith("+") else vu.name, True):
                continue
            extra[v] = func_item(v, vu, "not in the running program (inlined or dropped there); "
                                        "shipped code calls it")
            todo.append(v)
    res._extra_private = list(extra.values())

    # -- data ---------------------------------------------------------------
    users_orig = {}
    for ident, refs_o in res.orig_references.items():
        for v in refs_o:
            users_orig.setdefault(v, set()).add(ident)

    def data_item(ident, u, reason, old=None, side_new=True):
        nm = ident.lstrip("+")
        return DataItem(nm, tu, u.name, u.sec.name, u.static, reason,
                        None if old is None else old.end - old.start, u.end - u.start,
                        sorted(users_orig.get(nm, ())), where(u.name, side_new))

    for ident, nu in N.data.items():
        ou = O.data.get(ident)
        if ou is None or not target_has(ou.name, ou.static):
            res.new_data.append(data_item(ident, nu, "new" if ou is None else
                                          "not in the running program: the patch has its own"))
            continue
        if O.fp.fp(ou) == N.fp.fp(nu):
            continue
        if R is not None:
            ru = R.data.get(ident)
            if ru is not None and O.fp.fp(ou) == R.fp.fp(ru):
                res.line_only_data.append(data_item(ident, nu, "only line numbers changed", ou))
                continue
        ok, nk = ou.sec.klass, nu.sec.klass
        if (ou.end - ou.start) != (nu.end - nu.start):
            why = "size changed %d -> %d bytes" % (ou.end - ou.start, nu.end - nu.start)
        elif "r" in (ok, nk) and ok != nk:
            why = "moved from %s to %s memory (const changed)" % (_KLASS[ok], _KLASS[nk])
        elif "t" in (ok, nk) and ok != nk:
            why = "thread-local storage changed"
        else:
            why = "initial value changed"
        res.changed_data.append(data_item(ident, nu, why, ou))
    for ident, ou in O.data.items():
        if ident not in N.data:
            res.removed_data.append(data_item(ident, ou, "removed", side_new=False))
    # -fcommon tentative definitions: only a size
    ocom = {s.name: s.size for s in orig.elf.symbols if s.shndx == SHN_COMMON and not s.xindex}
    for s in new.elf.symbols:
        if s.shndx != SHN_COMMON or s.xindex:
            continue
        if s.name not in ocom:
            if s.name not in N.data:
                res.new_data.append(DataItem(s.name, tu, s.name, "COMMON", False, "new", None, s.size,
                                             (), where(s.name)))
        elif ocom[s.name] != s.size:
            res.changed_data.append(DataItem(s.name, tu, s.name, "COMMON", False,
                                             "size changed %d -> %d bytes" % (ocom[s.name], s.size),
                                             ocom[s.name], s.size,
                                             sorted(users_orig.get(s.name, ())), where(s.name)))

    for lst in (res.changed, res.new_functions, res.removed_functions, res.line_only,
                res.changed_data, res.new_data, res.removed_data, res.line_only_data,
                res.unshippable, res._extra_private):
        lst.sort(key=lambda x: x.name)
    for f in res.new_functions:
        if f.ctor:
            res.notes.append("new %s %s (%s) will not run in the live process" % (
                f.ctor, f.name, _loc(tu, f.where)))
    if R is None:
        res.notes.append("no line-remapped build: a change of line numbers only (__LINE__, "
                         "assert) counts as a change")
    return res


_KLASS = {"x": "code", "w": "writable", "r": "read-only", "b": "zero-initialised", "t": "thread-local"}


# ---------------------------------------------------------------------------
# The "new, line-remapped" source
# ---------------------------------------------------------------------------

def _comment_state(line, in_comment):
    """Whether a /* comment is still open after `line` (strings, character
    constants and // comments understood)."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if in_comment:
            j = line.find("*/", i)
            if j < 0:
                return True
            in_comment = False
            i = j + 2
            continue
        if c == "/" and line.startswith("/*", i):
            in_comment = True
            i += 2
        elif c == "/" and line.startswith("//", i):
            return False
        elif c in "\"'":
            j = i + 1
            while j < n and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return in_comment


def remap_source(orig_text, new_text):
    """new_text with `#line N` directives (no file name) so that every line
    that the change did not touch keeps its line number of orig_text; only
    the changed lines themselves are numbered differently.  A directive is
    put only where the numbering would differ, never after a line that ends
    in a backslash (continued line) or inside a /* comment: then it goes
    before the next line of the unchanged block where it can."""
    a = orig_text.splitlines(keepends=True)
    b = new_text.splitlines(keepends=True)
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    out = []
    cur = 1                   # the number the next line of `out` gets
    in_comment = False
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        for k in range(j2 - j1):
            line = b[j1 + k]
            if tag == "equal" and cur != i1 + k + 1:
                prev = out[-1] if out else "\n"
                if not in_comment and not prev.rstrip("\r\n").endswith("\\"):
                    if not prev.endswith(("\n", "\r")):
                        out.append("\n")
                    out.append("#line %d\n" % (i1 + k + 1))
                    cur = i1 + k + 1
            out.append(line)
            cur += 1
            in_comment = _comment_state(line, in_comment)
    return "".join(out)
