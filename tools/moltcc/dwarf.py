"""Types, variables and locals of a program image, read from its DWARF
(pyelftools), plus the image's build-id and its `.molt_types` annotations.

Used by `moltcc --molt-program --molt-from OLD.so` (image/xfgen.py) for both
versions: the old image from its file, the new one from the image just
linked.

Type model (Type.kind):
  void, base, enum, struct, union, typedef, pointer, array, func,
  const / volatile / restrict / atomic (qualifiers, `target`).
Named types have a canonical name: 'struct entry', 'union u', 'enum color',
'typedef entry_t', base types their C name ('long unsigned int').  An
anonymous struct/union/enum named by a typedef is 'struct {entry_t}'; one
that is the type of a member is 'struct {parent.member}'.  Struct, union,
enum and typedef types are shared across compilation units by canonical
name (the first complete definition wins).
"""
import json
import os

try:
    from elftools.common.exceptions import ELFError, DWARFError
    from elftools.elf.elffile import ELFFile
    HAVE_ELFTOOLS = True
except ImportError:       # pragma: no cover - reported by load_image()
    HAVE_ELFTOOLS = False

    class ELFError(Exception):
        pass

    class DWARFError(Exception):
        pass


class ImageError(Exception):
    """A one-line user error about an image."""


ANNOTATION_SECTION = ".molt_types"

# DW_ATE_* encodings
_ATE = {1: "address", 2: "bool", 3: "complex", 4: "float", 5: "signed",
        6: "signed_char", 7: "unsigned", 8: "unsigned_char", 0x10: "utf"}


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
    def __init__(self, kind, name=None, size=None):
        self.kind = kind
        self.name = name              # canonical name (named kinds, base types)
        self.size = size
        self.target = None            # typedef, pointer, qualifiers, array element, func return
        self.members = []             # struct / union
        self.complete = True          # struct / union / enum: False for a declaration
        self.dims = []                # array: element counts, None = unknown ([])
        self.encoding = None          # base: signed, unsigned, float, bool, ...
        self.enumerators = []         # enum: [(name, value)]
        self.params = []              # func: parameter types
        self.variadic = False
        self.decl = None              # (file, line) where known

    # -- helpers -------------------------------------------------------------
    def strip(self):
        """Without typedefs and qualifiers."""
        t = self
        while t is not None and t.kind in ("typedef", "const", "volatile", "restrict", "atomic"):
            t = t.target
        return t if t is not None else VOID

    def unqual(self):
        t = self
        while t is not None and t.kind in ("const", "volatile", "restrict", "atomic"):
            t = t.target
        return t if t is not None else VOID

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
        return "%s %s" % (k if k != "atomic" else "_Atomic", describe(t.target, depth + 1))
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


def _str(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v


class _Reader:
    """Converts the DIEs of one image into the Type model."""

    def __init__(self, image, dwarf):
        self.im = image
        self.dw = dwarf
        self.by_off = {}              # absolute DIE offset -> Type (this CU)
        self.base = {}                # (name, size, enc) -> Type
        image.base_types = self.base

    def ref(self, die, attr="DW_AT_type"):
        a = die.attributes.get(attr)
        if a is None:
            return None
        if a.form in ("DW_FORM_ref_addr", "DW_FORM_ref_sig8", "DW_FORM_GNU_ref_alt"):
            off = a.value
        else:
            off = a.value + die.cu.cu_offset
        return off

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
        tag = die.tag
        at = die.attributes
        name = _str(at["DW_AT_name"].value) if "DW_AT_name" in at else None
        size = at["DW_AT_byte_size"].value if "DW_AT_byte_size" in at else None
        if tag == "DW_TAG_base_type":
            enc = _ATE.get(at["DW_AT_encoding"].value, "other") if "DW_AT_encoding" in at else "other"
            key = (name, size, enc)
            t = self.base.get(key)
            if t is None:
                t = Type("base", name, size)
                t.encoding = enc
                self.base[key] = t
            self.by_off[die.offset] = t
            return t
        if tag == "DW_TAG_unspecified_type":
            self.by_off[die.offset] = VOID
            return VOID
        if tag in ("DW_TAG_structure_type", "DW_TAG_union_type", "DW_TAG_enumeration_type"):
            kind = {"DW_TAG_structure_type": "struct", "DW_TAG_union_type": "union",
                    "DW_TAG_enumeration_type": "enum"}[tag]
            if name:
                canon = "%s %s" % (kind, name)
            else:
                tdname = self.anon_names.get(die.offset) or hint
                canon = "%s {%s}" % (kind, tdname) if tdname else \
                    "%s {anon@%s:%x}" % (kind, self.cu_base, die.offset)
            decl = bool(at.get("DW_AT_declaration") and at["DW_AT_declaration"].value)
            old = self.im.types.get(canon)
            if old is not None and (old.complete or decl):
                self.by_off[die.offset] = old
                return old
            t = old if old is not None else Type(kind, canon, size)
            t.size = size
            t.complete = not decl
            self.by_off[die.offset] = t
            self.im.types[canon] = t
            if kind == "enum":
                t.target = self.type_at(self.ref(die)) if "DW_AT_type" in at else None
                t.enumerators = [(_str(c.attributes["DW_AT_name"].value),
                                  c.attributes["DW_AT_const_value"].value)
                                 for c in die.iter_children() if c.tag == "DW_TAG_enumerator"
                                 and "DW_AT_const_value" in c.attributes]
                if t.target is None or t.target.kind != "base":
                    t.target = self._int_type(size or 4, any(v < 0 for _, v in t.enumerators))
                return t
            mems = []
            anon_i = 0
            for c in die.iter_children():
                if c.tag != "DW_TAG_member":
                    continue
                ca = c.attributes
                mname = _str(ca["DW_AT_name"].value) if "DW_AT_name" in ca else None
                sub_hint = "%s.%s" % (canon.split(" ", 1)[1], mname or "#%d" % anon_i)
                if mname is None:
                    anon_i += 1
                mt = self.type_at(self.ref(c), sub_hint)
                off = 0
                loc = ca.get("DW_AT_data_member_location")
                if loc is not None:
                    off = _member_offset(loc.value)
                bsize = ca["DW_AT_bit_size"].value if "DW_AT_bit_size" in ca else None
                boff = None
                if bsize is not None:
                    if "DW_AT_data_bit_offset" in ca:
                        boff = ca["DW_AT_data_bit_offset"].value
                    elif "DW_AT_bit_offset" in ca:
                        # DWARF 2/3 (big-endian numbering within the storage unit)
                        unit = ca["DW_AT_byte_size"].value if "DW_AT_byte_size" in ca else (mt.strip().size or 4)
                        boff = off * 8 + unit * 8 - ca["DW_AT_bit_offset"].value - bsize
                    else:
                        boff = off * 8
                    off = boff // 8
                mems.append(Member(mname, mt, off, bsize, boff))
            t.members = mems
            return t
        if tag == "DW_TAG_typedef":
            canon = "typedef " + (name or "?")
            old = self.im.types.get(canon)
            if old is not None and old.target is not None and old.target is not VOID:
                self.by_off[die.offset] = old
                return old
            t = old or Type("typedef", canon)
            self.by_off[die.offset] = t
            self.im.types[canon] = t
            t.target = self.type_at(self.ref(die), name)
            t.size = t.target.size if t.target is not None else None
            return t
        if tag in ("DW_TAG_const_type", "DW_TAG_volatile_type", "DW_TAG_restrict_type",
                   "DW_TAG_atomic_type"):
            t = Type(tag[len("DW_TAG_"):-len("_type")])
            self.by_off[die.offset] = t
            t.target = self.type_at(self.ref(die), hint)
            t.size = t.target.size
            return t
        if tag in ("DW_TAG_pointer_type", "DW_TAG_reference_type"):
            t = Type("pointer", None, size or 8)
            self.by_off[die.offset] = t
            t.target = self.type_at(self.ref(die))
            return t
        if tag == "DW_TAG_array_type":
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
            es = t.target.size
            t.size = (n * es) if (n is not None and es is not None) else (size or 0)
            return t
        if tag == "DW_TAG_subroutine_type":
            t = Type("func")
            self.by_off[die.offset] = t
            t.target = self.type_at(self.ref(die)) if "DW_AT_type" in at else VOID
            for c in die.iter_children():
                if c.tag == "DW_TAG_formal_parameter":
                    t.params.append(self.type_at(self.ref(c)))
                elif c.tag == "DW_TAG_unspecified_parameters":
                    t.variadic = True
            return t
        # anything else (C++ or exotic): opaque bytes
        t = Type("base", "unsigned char", size or 1)
        t.encoding = "unsigned_char"
        self.by_off[die.offset] = t
        return t

    def _int_type(self, size, signed):
        names = {1: "char", 2: "short int", 4: "int", 8: "long int"}
        nm = names.get(size, "int")
        if not signed:
            nm = {1: "unsigned char", 2: "short unsigned int", 4: "unsigned int",
                  8: "long unsigned int"}.get(size, "unsigned int")
        key = (nm, size, "signed" if signed else "unsigned")
        t = self.base.get(key)
        if t is None:
            t = Type("base", nm, size)
            t.encoding = key[2]
            self.base[key] = t
        return t

    def read_cu(self, cu):
        top = cu.get_top_DIE()
        cu_name = _str(top.attributes["DW_AT_name"].value) if "DW_AT_name" in top.attributes else "?"
        lang = top.attributes.get("DW_AT_language")
        self.cu_base = os.path.basename(cu_name)
        self.im.cu_names.append(cu_name)
        self.by_off = {}
        self.dies = {}
        self.anon_names = {}
        for d in cu.iter_DIEs():
            if d.tag is None:
                continue
            self.dies[d.offset] = d
        for d in self.dies.values():
            if d.tag == "DW_TAG_typedef" and "DW_AT_type" in d.attributes and "DW_AT_name" in d.attributes:
                tgt = self.dies.get(self.ref(d))
                if tgt is not None and "DW_AT_name" not in tgt.attributes and tgt.tag in (
                        "DW_TAG_structure_type", "DW_TAG_union_type", "DW_TAG_enumeration_type"):
                    self.anon_names.setdefault(tgt.offset, _str(d.attributes["DW_AT_name"].value))
        tu = self.cu_base
        # declarations by offset, for DW_AT_specification
        for d in top.iter_children():
            if d.tag == "DW_TAG_variable":
                self._variable(d, tu, cu_name, None)
            elif d.tag == "DW_TAG_subprogram":
                self._function(d, tu, cu_name)
            elif d.tag in ("DW_TAG_structure_type", "DW_TAG_union_type",
                           "DW_TAG_enumeration_type", "DW_TAG_typedef"):
                # register named types even when no variable uses them
                # ($oldtype / $newtype / rules may name them); anonymous
                # ones get their names from where they are used
                if "DW_AT_name" in d.attributes or d.offset in self.anon_names:
                    self.type_at(d.offset)
        del lang

    def _var_decl(self, d):
        """The DIE with name/type/external: the declaration a definition's
        DW_AT_specification points at, else d itself."""
        if "DW_AT_specification" in d.attributes:
            s = self.dies.get(self.ref(d, "DW_AT_specification"))
            if s is not None:
                return s
        return d

    def _variable(self, d, tu, cu_name, func):
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
        v = Variable(name, ty, tu, external, cu_name, func, tls, (tu, line))
        if tls:
            self.im.tls.append(v)
        elif func is not None:
            if is_addr:
                self.im.func_statics.append(v)
            else:
                self.im.locals.setdefault((func, name), []).append(Local(func, name, ty, tu))
        elif is_addr:
            self.im.variables.append(v)

    def _function(self, d, tu, cu_name):
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
                    self._variable(c, tu, cu_name, fname)
                elif c.tag == "DW_TAG_lexical_block":
                    walk(c)
        walk(d)


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
            r = _Reader(im, dw)
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
