"""The one DWARF reader of moltcc (pyelftools): the types, variables and
functions of a program image or of a relocatable object.

  load_image(path) -> Image: a program image's types, variables and locals,
      its build-id and its `.molt_types` annotations.  `moltcc --molt-program
      --molt-from OLD.so` (image/xfgen.py) reads both versions with it: the
      old image from its file, the new one from the image just linked.
  load_debug(path) -> DebugInfo: a relocatable object's types, defined
      functions (signatures, the types their parameters and locals use) and
      variables of static storage, each with its file:line.  The patch
      builder's checks (patch/typecheck.py) compare two builds of one TU with
      it; decl_locations(path) names items for patch/objdiff.py.  The
      object's .rela.debug_* relocations are applied here, by a fast path
      for x86-64 (_ObjELF).

Type model (Type.kind):
  void, base, enum, struct, union, typedef, pointer, array, func,
  const / volatile / restrict / atomic (qualifiers, `target`).
Named types have a canonical name: 'struct entry', 'union u', 'enum color',
'typedef entry_t', base types their DWARF name ('long unsigned int').  An
anonymous struct/union/enum named by a typedef is 'struct {entry_t}'; one
that is the type of a member is 'struct {parent.member}'; any other
'struct {anon@FILE:OFFSET}'.  Struct, union, enum and typedef types are
shared across compilation units by canonical name (the first complete
definition wins), base types by name, size and encoding.  An enum's target
is its integer type; an array of unknown size (`int a[]`, a VLA) has size 0.
"""
import json
import os
import struct

try:
    from elftools.common.exceptions import ELFError, DWARFError
    from elftools.elf.elffile import ELFFile
    HAVE_ELFTOOLS = True
except ImportError:       # pragma: no cover - reported by load_image() / load_debug()
    HAVE_ELFTOOLS = False

    class ELFError(Exception):
        pass

    class DWARFError(Exception):
        pass


class ImageError(Exception):
    """A one-line user error about an image."""


class DebugError(Exception):
    """A one-line error about the debug information of an object."""


ANNOTATION_SECTION = ".molt_types"

# DW_ATE_* encodings
_ATE = {1: "address", 2: "bool", 3: "complex", 4: "float", 5: "signed",
        6: "signed_char", 7: "unsigned", 8: "unsigned_char", 0x10: "utf"}

_AGGREGATES = {"DW_TAG_structure_type": "struct", "DW_TAG_union_type": "union",
               "DW_TAG_enumeration_type": "enum"}
_QUALIFIERS = {"DW_TAG_const_type": "const", "DW_TAG_volatile_type": "volatile",
               "DW_TAG_restrict_type": "restrict", "DW_TAG_atomic_type": "atomic"}
_TYPE_NAMES = ("DW_TAG_structure_type", "DW_TAG_union_type", "DW_TAG_enumeration_type",
               "DW_TAG_typedef")
_SEE_THROUGH = ("typedef", "const", "volatile", "restrict", "atomic")


class Member:
    __slots__ = ("name", "type", "offset", "bit_size", "bit_offset")

    def __init__(self, name, type_, offset, bit_size=None, bit_offset=None):
        self.name = name              # None for an unnamed (anonymous) member
        self.type = type_
        self.offset = offset          # byte offset (of the storage unit for bit-fields)
        self.bit_size = bit_size      # bit-fields only
        self.bit_offset = bit_offset  # bit-fields: offset in bits from the struct start

    @property
    def is_bitfield(self):
        return self.bit_size is not None


class Type:
    __slots__ = ("kind", "name", "size", "target", "members", "complete", "dims", "encoding",
                 "enumerators", "params", "variadic", "decl", "_sig")

    def __init__(self, kind, name=None, size=None):
        self.kind = kind
        self.name = name              # canonical name (named kinds, base types)
        self.size = size
        self.target = None            # typedef, pointer, qualifiers, array element, func return, enum
        self.members = []             # struct / union: [Member]
        self.complete = True          # struct / union / enum: False for a declaration
        self.dims = []                # array: element counts, None = unknown ([])
        self.encoding = None          # base: signed, unsigned, float, bool, ...
        self.enumerators = []         # enum: [(name, value)]
        self.params = []              # func: parameter types
        self.variadic = False
        self.decl = None              # named kinds: (file, line) where known
        self._sig = None              # patch/typecheck.py's sig(), computed once

    # -- helpers -------------------------------------------------------------
    @property
    def named(self):
        return self.kind in ("struct", "union", "enum", "typedef") and self.name is not None

    def strip(self):
        """Without typedefs and qualifiers."""
        t = self
        while t is not None and t.kind in _SEE_THROUGH:
            t = t.target
        return t if t is not None else VOID

    def unqual(self):
        t = self
        while t is not None and t.kind in ("const", "volatile", "restrict", "atomic"):
            t = t.target
        return t if t is not None else VOID

    def real_size(self):
        """The size, looking through typedefs and qualifiers whose own size
        was not known when they were read (a type cycle)."""
        t = self
        while t is not None and t.size is None and t.kind in _SEE_THROUGH:
            t = t.target
        return None if t is None else t.size

    def is_const(self):
        """The object itself is read-only (const at top level, or an array
        of const elements)."""
        t = self
        while t is not None:
            if t.kind == "const":
                return True
            if t.kind in ("typedef", "volatile", "restrict", "atomic", "array"):
                t = t.target
                continue
            return False
        return False

    def count(self):
        """Number of elements of an array type (product of dims), 1 otherwise;
        None for an array of unknown size."""
        t = self.strip()
        n = 1
        while t.kind == "array":
            for d in t.dims:
                if d is None:
                    return None
                n *= d
            t = t.target.strip()
        return n

    def element(self):
        """The innermost element type of an array type (self if not an array)."""
        t = self.strip()
        while t.kind == "array":
            t = t.target.strip()
        return t

    def display(self):
        """How messages name the type, e.g. 'struct entry', 'int *', 'int [4]'."""
        return describe(self)

    def __repr__(self):
        return "<Type %s %s>" % (self.kind, describe(self))


VOID = Type("void", "void", 0)


def describe(t, depth=0):
    if t is None:
        return "void"
    if depth > 8:
        return "..."
    k = t.kind
    if k in ("base", "void"):
        return t.name
    if k in ("struct", "union", "enum"):
        if t.name.startswith(k + " {") and "." not in t.name:
            return "typedef " + t.name[len(k) + 2:-1]       # struct {foo} -> typedef foo
        return t.name
    if k == "typedef":
        return t.name[len("typedef "):]
    if k in ("const", "volatile", "restrict", "atomic"):
        q = k if k != "atomic" else "_Atomic"
        inner = t.target
        if inner is not None and inner.kind == "array":
            # An array's qualifier is its elements' (C), and DWARF often
            # repeats it on the element type: say it once, on the element.
            elem = inner.target
            spelled = (describe(elem, depth + 1) if elem is not None and elem.kind == k
                       else "%s %s" % (q, describe(elem, depth + 1)))
            return spelled + " " + "".join("[%s]" % ("" if d is None else d) for d in inner.dims)
        if inner is not None and inner.kind == "pointer":
            return describe(inner, depth + 1) + q      # 'char *const'
        return "%s %s" % (q, describe(inner, depth + 1))
    if k == "pointer":
        tt = t.target
        if tt is not None and tt.strip().kind == "func":
            return "function pointer"
        return describe(tt, depth + 1) + " *"
    if k == "array":
        return describe(t.target, depth + 1) + " " + "".join(
            "[%s]" % ("" if d is None else d) for d in t.dims)
    if k == "func":
        return "function"
    return k


# ---------------------------------------------------------------------------
# What an image holds
# ---------------------------------------------------------------------------

class Variable:
    def __init__(self, name, type_, tu, external, cu_name, func=None, tls=False, decl=None):
        self.name = name
        self.type = type_
        self.tu = tu                  # basename of the source file
        self.external = external      # global (not static)
        self.cu_name = cu_name
        self.func = func              # function-scope statics: the function
        self.tls = tls
        self.decl = decl

    @property
    def size(self):
        return self.type.size

    def key(self):
        return (self.name, None if self.external else self.tu)

    def where(self):
        return self.tu


class Local:
    def __init__(self, func, name, type_, tu):
        self.func, self.name, self.type, self.tu = func, name, type_, tu


class Image:
    def __init__(self, path):
        self.path = path
        self.build_id = None
        self.types = {}               # canonical name -> Type (named kinds)
        self.base_types = {}          # (name, size, encoding) -> Type
        self.variables = []           # globals and file-scope statics (definitions)
        self.func_statics = []        # function-scope statics (not migrated)
        self.tls = []                 # thread-local variables (not migrated)
        self.locals = {}              # (func, name) -> [Local]
        self.annotations = None       # parsed .molt_types (None: section missing)
        self.has_dwarf = False
        self.cu_names = []

    def find_var(self, name, tu=None):
        """The variable `name` (tu: the static's source basename).  Globals
        match any tu when tu is None; a static is found by tu, or by name
        alone when only one static has that name."""
        cands = [v for v in self.variables if v.name == name]
        if tu is not None:
            return [v for v in cands if v.tu == tu]
        glob = [v for v in cands if v.external]
        return glob or cands

    def lookup_type(self, name):
        """A type by its C spelling: 'struct x', 'union x', 'enum x', a typedef
        name or 'typedef x', a base type ('int', 'unsigned long'), with
        optional trailing '*'s.  None if unknown."""
        name = " ".join(name.replace("*", " * ").split())
        stars = 0
        while name.endswith("*"):
            stars += 1
            name = name[:-1].strip()
        t = self._lookup_plain(name)
        if t is None:
            return None
        for _ in range(stars):
            p = Type("pointer", None, 8)
            p.target = t
            t = p
        return t

    def _lookup_plain(self, name):
        if name == "void":
            return VOID
        for pre in ("struct ", "union ", "enum "):
            if name.startswith(pre):
                return self.types.get(pre + name[len(pre):].strip())
        if name.startswith("typedef "):
            return self.types.get(name)
        if ("typedef " + name) in self.types:
            return self.types["typedef " + name]
        norm = _BASE_ALIASES.get(name, name)
        for t in self.base_types.values():
            if t.name == norm:
                return t
        return None


# C spellings of base types -> the names gcc writes into DWARF
_BASE_ALIASES = {
    "unsigned": "unsigned int", "signed": "int", "signed int": "int",
    "long": "long int", "unsigned long": "long unsigned int", "long unsigned": "long unsigned int",
    "signed long": "long int", "long long": "long long int",
    "unsigned long long": "long long unsigned int", "short": "short int",
    "unsigned short": "short unsigned int", "bool": "_Bool",
    "unsigned long int": "long unsigned int", "unsigned short int": "short unsigned int",
    "unsigned long long int": "long long unsigned int", "long signed int": "long int",
}


# ---------------------------------------------------------------------------
# What an object holds
# ---------------------------------------------------------------------------

class Function:
    """A function defined in an object (its body is there)."""
    __slots__ = ("name", "decl", "ret", "params", "variadic", "external", "uses", "defined")

    def __init__(self, name):
        self.name = name
        self.decl = None              # (file, line)
        self.ret = VOID
        self.params = []              # [(name, Type)]
        self.variadic = False
        self.external = False
        self.uses = set()             # Types of params, return, locals (inlined code's too)
        self.defined = False


class ObjectVariable:
    """A variable of static storage defined in an object."""
    __slots__ = ("name", "key", "decl", "type", "external", "func")

    def __init__(self, name, key, decl, type_, external, func):
        self.name, self.key, self.decl, self.type = name, key, decl, type_
        self.external, self.func = external, func     # func: function-scope statics


class DebugInfo:
    def __init__(self, path):
        self.path = path
        self.types = {}               # canonical name -> Type (named kinds)
        self.base_types = {}          # (name, size, encoding) -> Type
        self.funcs = {}               # name -> Function (defined functions)
        self.vars = {}                # key -> ObjectVariable (globals, file statics: name;
        #                               function statics: 'f/x')
        self.cu_name = None
        self.comp_dir = None


def _str(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v


# ---------------------------------------------------------------------------
# Reading DIEs
# ---------------------------------------------------------------------------

class _Reader:
    """Converts the DIEs of one file into the Type model, one compilation
    unit after the other (read_cu).  What a CU's top-level variables and
    functions become is the subclass's: variable(die), function(die)."""

    def __init__(self, dwarf, types, base):
        self.dw = dwarf
        self.types = types            # canonical name -> Type, shared by all CUs
        self.base = base              # (name, size, encoding) -> Type

    # -- one CU ---------------------------------------------------------------
    def read_cu(self, cu):
        top = cu.get_top_DIE()
        ta = top.attributes
        self.cu = cu
        self.cu_name = _str(ta["DW_AT_name"].value) if "DW_AT_name" in ta else "?"
        self.comp_dir = _str(ta["DW_AT_comp_dir"].value) if "DW_AT_comp_dir" in ta else None
        self.cu_base = os.path.basename(self.cu_name)
        self.version = cu.header.version
        self.files = None             # the line program's file names, when first needed
        self.by_off = {}              # absolute DIE offset -> Type (this CU)
        self.dies = {d.offset: d for d in cu.iter_DIEs() if d.tag is not None}
        self.anon_names = {}          # offset of an anonymous struct/union/enum -> its typedef
        for d in self.dies.values():
            if d.tag == "DW_TAG_typedef" and "DW_AT_type" in d.attributes and "DW_AT_name" in d.attributes:
                tgt = self.dies.get(self.ref(d))
                if tgt is not None and "DW_AT_name" not in tgt.attributes and tgt.tag in _AGGREGATES:
                    self.anon_names.setdefault(tgt.offset, _str(d.attributes["DW_AT_name"].value))
        self.start_cu()
        for d in top.iter_children():
            tag = d.tag
            if tag == "DW_TAG_variable":
                self.variable(d)
            elif tag == "DW_TAG_subprogram":
                self.function(d)
            elif tag in _TYPE_NAMES:
                # named types even when nothing uses them (xf rules and
                # layout checks name them); anonymous ones get their names
                # from where they are used
                if "DW_AT_name" in d.attributes or d.offset in self.anon_names:
                    self.type_at(d.offset)

    def start_cu(self):
        pass

    def variable(self, die):
        raise NotImplementedError

    def function(self, die):
        raise NotImplementedError

    # -- file:line --------------------------------------------------------------
    def _file_table(self):
        """The CU's file names: relative to the compile directory where they
        are below it, as the compiler was given them otherwise."""
        if self.files is not None:
            return self.files
        self.files = []
        try:
            lp = self.dw.line_program_for_CU(self.cu)
        except Exception:
            lp = None
        if lp is None:
            return self.files
        version = self.version
        dirs = [_str(d) for d in lp["include_directory"]]
        for fe in lp["file_entry"]:
            name = _str(fe.name)
            di = fe.dir_index
            if version >= 5:
                d = dirs[di] if di < len(dirs) else None
            else:
                d = dirs[di - 1] if 0 < di <= len(dirs) else self.comp_dir
            path = name
            if not os.path.isabs(name) and d:
                path = os.path.join(d, name)
            if self.comp_dir and os.path.isabs(path):
                cd = self.comp_dir.rstrip("/") + "/"
                if path.startswith(cd):
                    path = path[len(cd):]
            if not os.path.isabs(name) and d and (d == self.comp_dir or not os.path.isabs(d)) \
                    and os.path.isabs(path):
                path = name
            self.files.append(os.path.normpath(path))
        return self.files

    def decl(self, die):
        """(file, line) of DW_AT_decl_file/DW_AT_decl_line, None without a line."""
        at = die.attributes
        if "DW_AT_decl_line" not in at:
            return None
        files = self._file_table()
        fi = at["DW_AT_decl_file"].value if "DW_AT_decl_file" in at else None
        f = None
        if fi is not None:
            idx = fi if self.version >= 5 else fi - 1
            if 0 <= idx < len(files):
                f = files[idx]
        return (f or self.cu_base, at["DW_AT_decl_line"].value)

    # -- types ------------------------------------------------------------------
    def ref(self, die, attr="DW_AT_type"):
        """The absolute offset of the DIE that attribute `attr` refers to."""
        a = die.attributes.get(attr)
        if a is None:
            return None
        if a.form in ("DW_FORM_ref_addr", "DW_FORM_ref_sig8", "DW_FORM_GNU_ref_alt"):
            return a.value
        return a.value + die.cu.cu_offset

    def type_at(self, off, hint=None):
        if off is None:
            return VOID
        t = self.by_off.get(off)
        if t is not None:
            return t
        die = self.dies.get(off)
        if die is None:
            try:
                die = self.dw.get_DIE_from_refaddr(off)
            except Exception:
                return VOID
        return self.convert(die, hint)

    def convert(self, die, hint=None):
        """The Type of a type DIE.  hint: the name an anonymous struct, union
        or enum gets when no typedef names it ('parent.member')."""
        tag, at = die.tag, die.attributes
        name = _str(at["DW_AT_name"].value) if "DW_AT_name" in at else None
        size = at["DW_AT_byte_size"].value if "DW_AT_byte_size" in at else None
        if tag == "DW_TAG_base_type":
            enc = _ATE.get(at["DW_AT_encoding"].value, "other") if "DW_AT_encoding" in at else "other"
            t = self._base_type(name, size, enc)
        elif tag == "DW_TAG_unspecified_type":
            t = VOID
        elif tag in _AGGREGATES:
            return self._aggregate(die, _AGGREGATES[tag], name, size, hint)
        elif tag == "DW_TAG_typedef":
            canon = "typedef " + (name or "?")
            old = self.types.get(canon)
            if old is not None and old.target is not None and old.target is not VOID:
                self.by_off[die.offset] = old
                return old
            t = old or Type("typedef", canon)
            t.decl = self.decl(die)
            self.by_off[die.offset] = t
            self.types[canon] = t
            t.target = self.type_at(self.ref(die), name)
            t.size = t.target.real_size()
            return t
        elif tag in _QUALIFIERS:
            t = Type(_QUALIFIERS[tag])
            self.by_off[die.offset] = t
            t.target = self.type_at(self.ref(die), hint)
            t.size = t.target.real_size()
            return t
        elif tag in ("DW_TAG_pointer_type", "DW_TAG_reference_type"):
            t = Type("pointer", None, size or 8)
            self.by_off[die.offset] = t
            t.target = self.type_at(self.ref(die))
            return t
        elif tag == "DW_TAG_array_type":
            t = Type("array")
            self.by_off[die.offset] = t
            t.target = self.type_at(self.ref(die), hint)
            for c in die.iter_children():
                if c.tag != "DW_TAG_subrange_type":
                    continue
                ca = c.attributes
                if "DW_AT_count" in ca and isinstance(ca["DW_AT_count"].value, int):
                    t.dims.append(ca["DW_AT_count"].value)
                elif "DW_AT_upper_bound" in ca and isinstance(ca["DW_AT_upper_bound"].value, int):
                    lo = ca["DW_AT_lower_bound"].value if "DW_AT_lower_bound" in ca else 0
                    t.dims.append(ca["DW_AT_upper_bound"].value - lo + 1)
                else:
                    t.dims.append(None)
            if not t.dims:
                t.dims = [None]
            n = 1
            for d in t.dims:
                n = None if d is None or n is None else n * d
            es = t.target.real_size()
            t.size = (n * es) if (n is not None and es is not None) else (size or 0)
            return t
        elif tag == "DW_TAG_subroutine_type":
            t = Type("func")
            self.by_off[die.offset] = t
            t.target = self.type_at(self.ref(die)) if "DW_AT_type" in at else VOID
            for c in die.iter_children():
                if c.tag == "DW_TAG_formal_parameter":
                    t.params.append(self.type_at(self.ref(c)))
                elif c.tag == "DW_TAG_unspecified_parameters":
                    t.variadic = True
            return t
        else:
            # anything else (C++ or exotic): opaque bytes
            t = Type("base", "unsigned char", size or 1)
            t.encoding = "unsigned_char"
        self.by_off[die.offset] = t
        return t

    def _aggregate(self, die, kind, name, size, hint):
        at = die.attributes
        if name:
            canon = "%s %s" % (kind, name)
        else:
            tdname = self.anon_names.get(die.offset) or hint
            canon = "%s {%s}" % (kind, tdname) if tdname else \
                "%s {anon@%s:%x}" % (kind, self.cu_base, die.offset)
        is_decl = bool(at.get("DW_AT_declaration") and at["DW_AT_declaration"].value)
        old = self.types.get(canon)
        if old is not None and (old.complete or is_decl):
            self.by_off[die.offset] = old
            return old
        t = old if old is not None else Type(kind, canon, size)
        t.size = size
        t.complete = not is_decl
        t.decl = self.decl(die) or t.decl
        self.by_off[die.offset] = t
        self.types[canon] = t
        if kind == "enum":
            t.enumerators = [(_str(c.attributes["DW_AT_name"].value),
                              c.attributes["DW_AT_const_value"].value)
                             for c in die.iter_children() if c.tag == "DW_TAG_enumerator"
                             and "DW_AT_const_value" in c.attributes]
            t.target = self.type_at(self.ref(die)) if "DW_AT_type" in at else None
            if t.target is None or t.target.kind != "base":
                t.target = self._int_type(size or 4, any(v < 0 for _, v in t.enumerators))
            return t
        mems = []
        anon_i = 0
        prefix = canon.split(" ", 1)[1]
        for c in die.iter_children():
            if c.tag != "DW_TAG_member":
                continue
            ca = c.attributes
            mname = _str(ca["DW_AT_name"].value) if "DW_AT_name" in ca else None
            sub_hint = "%s.%s" % (prefix, mname or "#%d" % anon_i)
            if mname is None:
                anon_i += 1
            mt = self.type_at(self.ref(c), sub_hint)
            loc = ca.get("DW_AT_data_member_location")
            off = _member_offset(loc.value) if loc is not None else 0
            bsize = ca["DW_AT_bit_size"].value if "DW_AT_bit_size" in ca else None
            boff = None
            if bsize is not None:
                if "DW_AT_data_bit_offset" in ca:
                    boff = ca["DW_AT_data_bit_offset"].value
                elif "DW_AT_bit_offset" in ca:
                    # DWARF 2/3 (big-endian numbering within the storage unit)
                    unit = ca["DW_AT_byte_size"].value if "DW_AT_byte_size" in ca else (mt.real_size() or 4)
                    boff = off * 8 + unit * 8 - ca["DW_AT_bit_offset"].value - bsize
                else:
                    boff = off * 8
                off = boff // 8
            mems.append(Member(mname, mt, off, bsize, boff))
        t.members = mems
        return t

    def _base_type(self, name, size, enc):
        key = (name, size, enc)
        t = self.base.get(key)
        if t is None:
            t = Type("base", name, size)
            t.encoding = enc
            self.base[key] = t
        return t

    def _int_type(self, size, signed):
        if signed:
            nm = {1: "char", 2: "short int", 4: "int", 8: "long int"}.get(size, "int")
        else:
            nm = {1: "unsigned char", 2: "short unsigned int", 4: "unsigned int",
                  8: "long unsigned int"}.get(size, "unsigned int")
        return self._base_type(nm, size, "signed" if signed else "unsigned")


def _member_offset(v):
    if isinstance(v, int):
        return v
    # DWARF 2 location expression: DW_OP_plus_uconst ULEB128
    if isinstance(v, list) and v and v[0] == 0x23:
        n = 0
        shift = 0
        for b in v[1:]:
            n |= (b & 0x7f) << shift
            shift += 7
            if not b & 0x80:
                break
        return n
    return 0


class _ImageReader(_Reader):
    """Variables with a fixed address, thread-local variables and locals of
    the functions of a program image."""

    def __init__(self, image, dwarf):
        super().__init__(dwarf, image.types, image.base_types)
        self.im = image

    def start_cu(self):
        self.im.cu_names.append(self.cu_name)

    def variable(self, d):
        self._variable(d, None)

    def _var_decl(self, d):
        """The DIE with name/type/external: the declaration a definition's
        DW_AT_specification points at, else d itself."""
        if "DW_AT_specification" in d.attributes:
            s = self.dies.get(self.ref(d, "DW_AT_specification"))
            if s is not None:
                return s
        return d

    def _variable(self, d, func):
        at = d.attributes
        if "DW_AT_location" not in at:
            if func is None:
                return      # declaration or optimised away
            loc = []        # a local without a location (optimised): still has a type
        else:
            loc = at["DW_AT_location"].value
            if not isinstance(loc, list):
                if func is None:
                    return
                loc = []    # a location list: a local
        decl = self._var_decl(d)
        da = decl.attributes
        if "DW_AT_name" not in da:
            return
        name = _str(da["DW_AT_name"].value)
        if da.get("DW_AT_artificial") or at.get("DW_AT_artificial"):
            return
        external = bool(da.get("DW_AT_external") and da["DW_AT_external"].value)
        ty = self.type_at(self.ref(decl))
        # DW_OP_addr <8 bytes>: a static address; an expression ending in
        # DW_OP_GNU_push_tls_address / DW_OP_form_tls_address: thread-local
        is_addr = len(loc) == 9 and loc[0] == 0x03
        tls = not is_addr and bool(loc) and loc[-1] in (0xe0, 0x9b)
        line = da["DW_AT_decl_line"].value if "DW_AT_decl_line" in da else None
        tu = self.cu_base
        v = Variable(name, ty, tu, external, self.cu_name, func, tls, (tu, line))
        if tls:
            self.im.tls.append(v)
        elif func is not None:
            if is_addr:
                self.im.func_statics.append(v)
            else:
                self.im.locals.setdefault((func, name), []).append(Local(func, name, ty, tu))
        elif is_addr:
            self.im.variables.append(v)

    def function(self, d):
        at = d.attributes
        if "DW_AT_low_pc" not in at and "DW_AT_ranges" not in at:
            return
        decl = d
        if "DW_AT_specification" in at or "DW_AT_abstract_origin" in at:
            s = self.dies.get(self.ref(d, "DW_AT_specification" if "DW_AT_specification" in at
                                        else "DW_AT_abstract_origin"))
            if s is not None:
                decl = s
        if "DW_AT_name" not in decl.attributes:
            return
        fname = _str(decl.attributes["DW_AT_name"].value)

        def walk(die):
            for c in die.iter_children():
                if c.tag == "DW_TAG_variable":
                    if "DW_AT_abstract_origin" in c.attributes and "DW_AT_name" not in c.attributes:
                        continue
                    self._variable(c, fname)
                elif c.tag == "DW_TAG_lexical_block":
                    walk(c)
        walk(d)


class _ObjectReader(_Reader):
    """Defined functions (signature, the types they use) and variables of
    static storage of a relocatable object, each with its file:line."""

    def __init__(self, info, dwarf):
        super().__init__(dwarf, info.types, info.base_types)
        self.info = info

    def start_cu(self):
        info = self.info
        info.cu_name = info.cu_name or self.cu_name
        info.comp_dir = info.comp_dir or self.comp_dir

    def _origin(self, d):
        """The DIE carrying name/type: through DW_AT_specification and
        DW_AT_abstract_origin."""
        seen = 0
        while seen < 4:
            at = d.attributes
            nxt = None
            for a in ("DW_AT_abstract_origin", "DW_AT_specification"):
                if a in at:
                    nxt = self.dies.get(self.ref(d, a))
                    break
            if nxt is None:
                return d
            d = nxt
            seen += 1
        return d

    def variable(self, d, func=None):
        at = d.attributes
        loc = at.get("DW_AT_location")
        if loc is None:
            return None
        v = loc.value
        # static storage: DW_OP_addr, DW_OP_addrx (DWARF 5), DW_OP_GNU_addr_index;
        # thread-local: ... DW_OP_form_tls_address / DW_OP_GNU_push_tls_address
        if not isinstance(v, list) or not v:
            return None
        if v[0] not in (0x03, 0xa1, 0xfb) and v[-1] not in (0x9b, 0xe0):
            return None
        o = self._origin(d)
        oa = o.attributes
        if "DW_AT_name" not in oa or oa.get("DW_AT_artificial"):
            return None
        name = _str(oa["DW_AT_name"].value)
        ext = bool(oa.get("DW_AT_external") and oa["DW_AT_external"].value)
        ty = self.type_at(self.ref(o))
        key = name if func is None else "%s/%s" % (func, name)
        var = ObjectVariable(name, key, self.decl(o) or self.decl(d), ty, ext, func)
        self.info.vars[key] = var
        return var

    def function(self, d):
        at = d.attributes
        o = self._origin(d)
        oa = o.attributes
        if "DW_AT_name" not in oa:
            return
        name = _str(oa["DW_AT_name"].value)
        defined = "DW_AT_low_pc" in at or "DW_AT_ranges" in at
        if not defined:
            # an abstract instance (inlined everywhere): its static locals
            # live here
            if "DW_AT_inline" in at:
                self._statics_of(d, name)
            return
        f = self.info.funcs.get(name)
        if f is None:
            f = self.info.funcs[name] = Function(name)
        f.defined = True
        f.decl = self.decl(o) or self.decl(d)
        f.external = bool(oa.get("DW_AT_external") and oa["DW_AT_external"].value)
        f.ret = self.type_at(self.ref(o)) if "DW_AT_type" in oa else VOID
        params = []
        variadic = False
        for c in o.iter_children():
            if c.tag == "DW_TAG_formal_parameter":
                ca = c.attributes
                params.append((_str(ca["DW_AT_name"].value) if "DW_AT_name" in ca else None,
                               self.type_at(self.ref(c))))
            elif c.tag == "DW_TAG_unspecified_parameters":
                variadic = True
        f.params, f.variadic = params, variadic
        uses = f.uses
        uses.add(f.ret)
        uses.update(t for _n, t in params)

        def walk(die, own, depth=0):
            for c in die.iter_children():
                tag = c.tag
                if tag in ("DW_TAG_variable", "DW_TAG_formal_parameter"):
                    oc = self._origin(c)
                    if "DW_AT_type" in oc.attributes:
                        uses.add(self.type_at(self.ref(oc)))
                    if tag == "DW_TAG_variable" and own:
                        self.variable(c, name)
                elif tag == "DW_TAG_lexical_block" and depth < 64:
                    walk(c, own, depth + 1)
                elif tag == "DW_TAG_inlined_subroutine" and depth < 64:
                    walk(c, False, depth + 1)
        walk(d, True)
        if o is not d:
            walk(o, True)

    def _statics_of(self, die, fname, depth=0):
        for c in die.iter_children():
            if c.tag == "DW_TAG_variable":
                self.variable(c, fname)
            elif c.tag == "DW_TAG_lexical_block" and depth < 64:
                self._statics_of(c, fname, depth + 1)


# ---------------------------------------------------------------------------
# Program images
# ---------------------------------------------------------------------------

def _build_id(elf):
    for sec in elf.iter_sections():
        if sec.header.sh_type != "SHT_NOTE":
            continue
        for note in sec.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return note["n_desc"]
    return None


def load_image(path, need_annotations=True, skip_cu=None):
    """Reads an image.  ImageError (a one-line message) when it is not an
    ELF file, has no DWARF, or (need_annotations) no .molt_types."""
    if not HAVE_ELFTOOLS:
        raise ImageError("reading program images needs pyelftools (apt-get install python3-pyelftools)")
    im = Image(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ImageError("cannot open %s: %s" % (path, e.strerror))
    with f:
        try:
            elf = ELFFile(f)
        except (ELFError, Exception):
            raise ImageError("%s is not an ELF file (expected a program image built with "
                             "moltcc --molt-program)" % path)
        try:
            im.build_id = _build_id(elf)
        except Exception:
            im.build_id = None
        sec = elf.get_section_by_name(ANNOTATION_SECTION)
        if sec is not None:
            data = sec.data().rstrip(b"\0")
            try:
                im.annotations = json.loads(data.decode("utf-8"))
            except ValueError:
                raise ImageError("%s: section %s is not valid JSON" % (path, ANNOTATION_SECTION))
        elif need_annotations:
            raise ImageError("%s is not a molt program image (no %s section; build it with "
                             "moltcc --molt-program)" % (path, ANNOTATION_SECTION))
        if not elf.has_dwarf_info() or elf.get_section_by_name(".debug_info") is None:
            raise ImageError("%s has no DWARF debug information (stripped?); build the old version "
                             "with moltcc --molt-program and keep it unstripped" % path)
        try:
            dw = elf.get_dwarf_info()
            r = _ImageReader(im, dw)
            for cu in dw.iter_CUs():
                top = cu.get_top_DIE()
                nm = top.attributes.get("DW_AT_name")
                if skip_cu and nm is not None and os.path.basename(_str(nm.value)) == skip_cu:
                    continue      # moltcc's own generated TU
                r.read_cu(cu)
        except (DWARFError, ELFError) as e:
            raise ImageError("%s: cannot read its DWARF: %s" % (path, e))
        im.has_dwarf = True
    return im


# ---------------------------------------------------------------------------
# Relocatable objects: their debug sections relocated quickly
# ---------------------------------------------------------------------------
#
# pyelftools applies .rela.debug_* itself, but finds the relocation section
# of every debug section by parsing every section header with `construct`:
# with -ffunction-sections (thousands of sections) that costs more than
# reading the DWARF.  The object's headers, symbols and .rela.debug_* are
# read here with struct and applied to the section data before pyelftools
# parses it (x86-64 ELF64 little-endian; anything else: pyelftools' own way).

def _raw_debug_relocs(raw):
    """{section name: (section index, [(offset, type, value, addend)])} for
    the relocations of non-allocated sections, plus {name: index} of all
    sections; None when the file is not an x86-64 ELF64 LE relocatable."""
    if raw[:4] != b"\x7fELF" or raw[4] != 2 or raw[5] != 1:
        return None
    (e_type, e_machine, _v, _e, _ph, shoff, _f, _eh, _pe, _pn, shentsize, shnum,
     shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", raw, 16)
    if e_type != 1 or e_machine != 62 or shoff == 0:
        return None
    first = struct.unpack_from("<IIQQQQIIQQ", raw, shoff)
    if shnum == 0:
        shnum = first[5]
    if shstrndx == 0xffff:
        shstrndx = first[6]
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", raw, shoff + i * shentsize) for i in range(shnum)]
    st = hdrs[shstrndx]
    shstr = raw[st[4]:st[4] + st[5]]

    def name(off):
        e = shstr.find(b"\0", off)
        return shstr[off:e].decode("utf-8", "surrogateescape")

    names = {}
    for i, h in enumerate(hdrs):
        names.setdefault(name(h[0]), i)
    symvals = None
    out = {}
    for i, (nm, typ, flags, _a, off, size, link, info, _al, _es) in enumerate(hdrs):
        if typ != 4 or info >= shnum or hdrs[info][2] & 2:      # SHT_RELA of a non-alloc section
            continue
        if symvals is None:
            sh = hdrs[link]
            symvals = [v for (_n, _i, _o, _x, v, _s) in
                       struct.iter_unpack("<IBBHQQ", raw[sh[4]:sh[4] + sh[5]])]
        rel = [(o, inf & 0xffffffff, symvals[inf >> 32] if (inf >> 32) < len(symvals) else 0, a)
               for o, inf, a in struct.iter_unpack("<QQq", raw[off:off + size])]
        out[name(hdrs[info][0])] = (info, rel)
    return out, names


def _apply(data, rel):
    buf = bytearray(data)
    for o, typ, sv, a in rel:
        if typ in (1, 17, 24):                 # R_X86_64_64, DTPOFF64, PC64 (no PC in .o debug)
            struct.pack_into("<Q", buf, o, (sv + a - (o if typ == 24 else 0)) & 0xffffffffffffffff)
        elif typ in (10, 11, 21, 2):           # _32, _32S, DTPOFF32, PC32
            struct.pack_into("<I", buf, o, (sv + a - (o if typ == 2 else 0)) & 0xffffffff)
        elif typ != 0:
            return None                        # unknown: let pyelftools do it
    return bytes(buf)


if HAVE_ELFTOOLS:
    from io import BytesIO

    class _ObjELF(ELFFile):
        """ELFFile whose debug sections are relocated by _apply."""

        def __init__(self, stream, raw):
            super().__init__(stream)
            got = _raw_debug_relocs(raw)
            self._molt_rel = None
            if got is not None:
                self._molt_rel, names = got
                if getattr(self, "_section_name_map", "missing") is None:
                    self._section_name_map = names

        def _read_dwarf_section(self, section, relocate_dwarf_sections):
            if not relocate_dwarf_sections or self._molt_rel is None:
                return super()._read_dwarf_section(section, relocate_dwarf_sections)
            desc = super()._read_dwarf_section(section, False)
            r = self._molt_rel.get(section.name)
            if r is None:
                return desc
            data = _apply(desc.stream.getvalue(), r[1])
            if data is None:
                return super()._read_dwarf_section(section, True)
            return desc._replace(stream=BytesIO(data))


def object_dwarf(path):
    """The DWARFInfo of a relocatable object, its .rela.debug_* applied
    (names and references as in a linked file), or None without DWARF."""
    if not HAVE_ELFTOOLS:
        raise DebugError("reading debug information needs pyelftools (apt-get install python3-pyelftools)")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        elf = _ObjELF(BytesIO(raw), raw)
        if not elf.has_dwarf_info() or elf.get_section_by_name(".debug_info") is None:
            return None
        return elf.get_dwarf_info()
    except (ELFError, DWARFError) as e:
        raise DebugError("%s: cannot read its DWARF: %s" % (path, e))


_cache = {}


def load_debug(path):
    """DebugInfo of an object (cached by path, size, mtime).  DebugError when
    it cannot be read or has no DWARF."""
    if not HAVE_ELFTOOLS:
        raise DebugError("reading debug information needs pyelftools (apt-get install python3-pyelftools)")
    try:
        st = os.stat(path)
    except OSError as e:
        raise DebugError("cannot read %s: %s" % (path, e.strerror))
    k = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    got = _cache.get(k)
    if got is not None:
        return got
    info = DebugInfo(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
            f.seek(0)
            elf = _ObjELF(f, raw)
            if not elf.has_dwarf_info() or elf.get_section_by_name(".debug_info") is None:
                raise DebugError("%s has no DWARF debug information (compile with -g)" % path)
            dw = elf.get_dwarf_info()
            r = _ObjectReader(info, dw)
            for cu in dw.iter_CUs():
                r.read_cu(cu)
    except (ELFError, DWARFError) as e:
        raise DebugError("%s: cannot read its DWARF: %s" % (path, e))
    if len(_cache) > 16:
        _cache.clear()
    _cache[k] = info
    return info


def decl_locations(path):
    """{name: (file, line)} of the functions and file-scope variables defined
    in the object (function-scope statics as 'f/x')."""
    info = load_debug(path)
    out = {}
    for n, v in info.vars.items():
        if v.decl:
            out[n] = v.decl
    for n, f in info.funcs.items():
        if f.decl:
            out[n] = f.decl
    return out
