"""What a hot patch cannot carry, read from the DWARF of two builds of one
translation unit (design: notes/patchbuild-design.md §4).

A hot patch replaces code and leaves every existing object of the running
program as it is.  So the patch is refused (with ALL reasons, each naming
the file:line, what changed in words, and the live code that uses it) when
the new build disagrees with the original about something live data or
live code depends on:

  * a named type present in both builds -- struct, union, enum, typedef,
    anonymous struct/union/enum through its typedef -- whose size, member
    offsets, member types (compared by name and size with typedefs and
    qualifiers looked through), bit-fields or enumerator values changed
    (also: a member or enumerator removed).  Added enumerators that change
    no existing value are allowed and reported as notes.  A changed type
    that nothing of this TU uses (no function, parameter, local or variable
    of either build reaches it) is only a note: the TUs that use it refuse.
  * a function replaced in place (updatable, shipped) that exists in the
    original whose parameter types or return type changed (the live callers
    pass the old arguments);
  * an existing global or static, including function-local statics (gcc
    `x.N`, moltcc's hoisted `molt__<f>__<v>`), whose type changed;
  * from the object comparison (objdiff.compare_objects, passed as
    `comparison`): an existing object whose initial value changed, and
    changes that cannot be shipped (main, constructors, destructors,
    non-updatable external functions, addresses kept in live data).

"Live code that uses it": the functions of the original build whose
parameters, locals or return value reach the type (through pointers,
arrays, typedefs, qualifiers and members of other types), and the
variables whose type reaches it.

API
---
check_types(orig_o, new_o, shipped_functions=(), comparison=None,
            target_has=None) -> TypeCheck
    shipped_functions: names of the functions the patch replaces in place
    (logical names as compare_objects reports them: 'f' for a woven f's
    body); default: comparison.replaced.  Their signatures must not change
    (private copies and new functions are called by shipped code only).
    target_has(symbol, is_static) -> bool: whether the program has a
    variable (default: every variable of orig exists).
TypeCheck.refusals -> [Refusal(kind, name, where, what, users, shipped_users)],
TypeCheck.notes -> [str], TypeCheck.ok, TypeCheck.report() -> lines.
str(Refusal) is one line, e.g.
    "struct conn (conn.h:12): field 'len' changed type int -> long; field
     'buf' moved from offset 8 to 16; size 24 -> 32; used by live code:
     conn_read, conn_write"

decl_locations(obj) -> {name: (file, line)} for the functions and
variables defined in an object (objdiff uses it for messages).

Only the standard library and pyelftools (which applies the .rela.debug_*
relocations of relocatable objects).
"""
import os
import struct

try:
    from elftools.elf.elffile import ELFFile
    from elftools.common.exceptions import ELFError, DWARFError
    HAVE_ELFTOOLS = True
except ImportError:       # pragma: no cover
    HAVE_ELFTOOLS = False

    class ELFError(Exception):
        pass

    class DWARFError(Exception):
        pass

__all__ = ["check_types", "decl_locations", "load_debug", "DebugError", "TypeCheck", "Refusal",
           "WAY_FORWARD"]

WAY_FORWARD = ("a hot patch keeps every live object as it is: carry an added field as shadow "
               "data (docs/guide.md, \"Shadow data\"), or change layouts and initial values "
               "with a full update (molt update)")


class DebugError(Exception):
    """A one-line error about the debug information of an object."""


def _s(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


# ---------------------------------------------------------------------------
# Type model
# ---------------------------------------------------------------------------

class T:
    """A DWARF type.  kind: base, void, struct, union, enum, typedef, pointer,
    array, func, const, volatile, restrict, atomic."""
    __slots__ = ("kind", "name", "size", "target", "members", "complete", "dims", "enumerators",
                 "params", "variadic", "decl", "_sig", "_disp")

    def __init__(self, kind, name=None, size=None):
        self.kind, self.name, self.size = kind, name, size
        self.target = None
        self.members = []           # [Member]
        self.complete = True
        self.dims = []
        self.enumerators = []       # [(name, value)]
        self.params = []
        self.variadic = False
        self.decl = None            # (file, line)
        self._sig = None
        self._disp = None

    @property
    def named(self):
        return self.kind in ("struct", "union", "enum", "typedef") and self.name is not None

    def strip(self):
        t = self
        while t is not None and t.kind in ("typedef", "const", "volatile", "restrict", "atomic"):
            t = t.target
        return t if t is not None else VOID

    def real_size(self):
        t = self
        while t is not None and t.size is None and t.kind in ("typedef", "const", "volatile",
                                                              "restrict", "atomic"):
            t = t.target
        return None if t is None else t.size


VOID = T("void", "void", 0)


class Member:
    __slots__ = ("name", "type", "offset", "bit_size", "bit_offset")

    def __init__(self, name, type_, offset, bit_size, bit_offset):
        self.name, self.type, self.offset = name, type_, offset
        self.bit_size, self.bit_offset = bit_size, bit_offset


def display(t, depth=0):
    """C spelling for messages: 'int', 'struct conn *', 'char [16]',
    'size_t', 'int (*)(int)'."""
    if t is None:
        return "void"
    if depth > 12:
        return "..."
    k = t.kind
    if k in ("base", "void"):
        return _C_NAMES.get(t.name, t.name)
    if k in ("struct", "union", "enum"):
        if t.name.startswith(k + " {"):
            inner = t.name[len(k) + 2:-1]
            return inner if "." not in inner and not inner.startswith("anon@") else "%s {...}" % k
        return t.name
    if k == "typedef":
        return t.name
    if k in ("const", "volatile", "restrict", "atomic"):
        q = "_Atomic" if k == "atomic" else k
        inner = t.target
        if inner is not None and inner.kind == "pointer":
            return display(inner, depth + 1) + " " + q
        return q + " " + display(inner, depth + 1)
    if k == "pointer":
        tt = t.target
        if tt is not None and tt.strip().kind == "func":
            f = tt.strip()
            return "%s (*)(%s)" % (display(f.target, depth + 1), _params_display(f, depth + 1))
        s = display(tt, depth + 1)
        return s + ("*" if s.endswith("*") else " *")
    if k == "array":
        return display(t.target, depth + 1) + " " + "".join(
            "[%s]" % ("" if d is None else d) for d in t.dims)
    if k == "func":
        return "%s (%s)" % (display(t.target, depth + 1), _params_display(t, depth + 1))
    return k


# base type names as C programmers write them (gcc and clang spell some
# differently in DWARF: 'long int' / 'long')
_C_NAMES = {"long int": "long", "long unsigned int": "unsigned long", "short int": "short",
            "short unsigned int": "unsigned short", "long long int": "long long",
            "long long unsigned int": "unsigned long long", "unsigned": "unsigned int",
            "signed char": "signed char", "_Bool": "_Bool"}


def display_resolved(t):
    """display(t), plus what a typedef names when that differs: 'len_t (long)'."""
    d = display(t)
    s = display(t.strip()) if t is not None else "void"
    return d if s == d else "%s (%s)" % (d, s)


def _params_display(f, depth=0):
    ps = [display(p, depth) for p in f.params]
    if f.variadic:
        ps.append("...")
    return ", ".join(ps) if ps else "void"


def sig(t, depth=0):
    """Structural spelling with typedefs and qualifiers looked through at
    every level: equal sig = same layout-relevant type (named aggregates
    by name)."""
    if t is None:
        return "void"
    if t._sig is not None:
        return t._sig
    if depth > 12:
        return "..."
    s = t.strip()
    k = s.kind
    if k in ("base", "void"):
        out = "%s/%s" % (_C_NAMES.get(s.name, s.name), s.size)
    elif k in ("struct", "union", "enum"):
        out = s.name
    elif k == "pointer":
        out = sig(s.target, depth + 1) + "*"
    elif k == "array":
        out = "%s[%s]" % (sig(s.target, depth + 1), ",".join("" if d is None else str(d) for d in s.dims))
    elif k == "func":
        out = "fn(%s%s)->%s" % (",".join(sig(p, depth + 1) for p in s.params),
                                ",..." if s.variadic else "", sig(s.target, depth + 1))
    else:
        out = k
    t._sig = out
    return out


# ---------------------------------------------------------------------------
# Reading one object
# ---------------------------------------------------------------------------

class Func:
    __slots__ = ("name", "decl", "ret", "params", "variadic", "external", "uses", "defined")

    def __init__(self, name):
        self.name = name
        self.decl = None
        self.ret = VOID
        self.params = []            # [(name, T)]
        self.variadic = False
        self.external = False
        self.uses = set()           # T nodes of params, return, locals
        self.defined = False


class Var:
    __slots__ = ("name", "key", "decl", "type", "external", "func")

    def __init__(self, name, key, decl, type_, external, func):
        self.name, self.key, self.decl, self.type = name, key, decl, type_
        self.external, self.func = external, func


class DebugInfo:
    def __init__(self, path):
        self.path = path
        self.types = {}             # canonical name -> T (named kinds)
        self.funcs = {}             # name -> Func (defined functions)
        self.vars = {}              # key -> Var (globals, file statics: name; function statics: 'f/x')
        self.cu_name = None
        self.comp_dir = None


class _Reader:
    def __init__(self, info, dwarf, cu):
        self.info = info
        self.dw = dwarf
        self.cu = cu
        self.by_off = {}
        self.dies = {}
        self.anon_names = {}
        top = cu.get_top_DIE()
        ta = top.attributes
        self.cu_name = _s(ta["DW_AT_name"].value) if "DW_AT_name" in ta else "?"
        self.comp_dir = _s(ta["DW_AT_comp_dir"].value) if "DW_AT_comp_dir" in ta else None
        self.cu_base = os.path.basename(self.cu_name)
        self.version = cu.header.version
        self.files = None
        self.top = top

    # -- file names ---------------------------------------------------------
    def _file_table(self):
        if self.files is not None:
            return self.files
        self.files = []
        try:
            lp = self.dw.line_program_for_CU(self.cu)
        except Exception:
            lp = None
        if lp is None:
            return self.files
        dirs = [_s(d) for d in lp["include_directory"]]
        for fe in lp["file_entry"]:
            name = _s(fe.name)
            di = fe.dir_index
            if self.version >= 5:
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

    # -- types --------------------------------------------------------------
    def ref(self, die, attr="DW_AT_type"):
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
        tag, at = die.tag, die.attributes
        name = _s(at["DW_AT_name"].value) if "DW_AT_name" in at else None
        size = at["DW_AT_byte_size"].value if "DW_AT_byte_size" in at else None
        types = self.info.types
        if tag == "DW_TAG_base_type":
            t = T("base", name, size)
        elif tag == "DW_TAG_unspecified_type":
            t = VOID
        elif tag in ("DW_TAG_structure_type", "DW_TAG_union_type", "DW_TAG_enumeration_type"):
            kind = {"DW_TAG_structure_type": "struct", "DW_TAG_union_type": "union",
                    "DW_TAG_enumeration_type": "enum"}[tag]
            if name:
                canon = "%s %s" % (kind, name)
            else:
                tdname = self.anon_names.get(die.offset) or hint
                canon = "%s {%s}" % (kind, tdname) if tdname else \
                    "%s {anon@%s:%x}" % (kind, self.cu_base, die.offset)
            is_decl = bool(at.get("DW_AT_declaration") and at["DW_AT_declaration"].value)
            old = types.get(canon)
            if old is not None and (old.complete or is_decl):
                self.by_off[die.offset] = old
                return old
            t = old if old is not None else T(kind, canon, size)
            t.size = size
            t.complete = not is_decl
            t.decl = self.decl(die) or t.decl
            self.by_off[die.offset] = t
            types[canon] = t
            if kind == "enum":
                t.enumerators = [(_s(c.attributes["DW_AT_name"].value),
                                  c.attributes["DW_AT_const_value"].value)
                                 for c in die.iter_children() if c.tag == "DW_TAG_enumerator"
                                 and "DW_AT_const_value" in c.attributes]
                t.target = self.type_at(self.ref(die)) if "DW_AT_type" in at else None
                return t
            anon_i = 0
            mems = []
            for c in die.iter_children():
                if c.tag != "DW_TAG_member":
                    continue
                ca = c.attributes
                mname = _s(ca["DW_AT_name"].value) if "DW_AT_name" in ca else None
                sub = "%s.%s" % (canon.split(" ", 1)[1], mname or "#%d" % anon_i)
                if mname is None:
                    anon_i += 1
                mt = self.type_at(self.ref(c), sub)
                loc = ca.get("DW_AT_data_member_location")
                off = _member_offset(loc.value) if loc is not None else 0
                bsize = ca["DW_AT_bit_size"].value if "DW_AT_bit_size" in ca else None
                boff = None
                if bsize is not None:
                    if "DW_AT_data_bit_offset" in ca:
                        boff = ca["DW_AT_data_bit_offset"].value
                    elif "DW_AT_bit_offset" in ca:
                        unit = ca["DW_AT_byte_size"].value if "DW_AT_byte_size" in ca else (mt.real_size() or 4)
                        boff = off * 8 + unit * 8 - ca["DW_AT_bit_offset"].value - bsize
                    else:
                        boff = off * 8
                    off = boff // 8
                mems.append(Member(mname, mt, off, bsize, boff))
            t.members = mems
            return t
        elif tag == "DW_TAG_typedef":
            canon = name or "?"
            old = types.get("typedef " + canon)
            if old is not None and old.target is not None:
                self.by_off[die.offset] = old
                return old
            t = old or T("typedef", canon)
            t.decl = self.decl(die)
            self.by_off[die.offset] = t
            types["typedef " + canon] = t
            t.target = self.type_at(self.ref(die), name)
            t.size = t.target.real_size() if t.target is not None else None
            return t
        elif tag in ("DW_TAG_const_type", "DW_TAG_volatile_type", "DW_TAG_restrict_type",
                     "DW_TAG_atomic_type"):
            t = T(tag[len("DW_TAG_"):-len("_type")])
            self.by_off[die.offset] = t
            t.target = self.type_at(self.ref(die), hint)
            t.size = t.target.real_size()
            return t
        elif tag in ("DW_TAG_pointer_type", "DW_TAG_reference_type"):
            t = T("pointer", None, size or 8)
            self.by_off[die.offset] = t
            t.target = self.type_at(self.ref(die))
            return t
        elif tag == "DW_TAG_array_type":
            t = T("array")
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
                n = None if (d is None or n is None) else n * d
            es = t.target.real_size()
            t.size = n * es if (n is not None and es is not None) else size
            return t
        elif tag == "DW_TAG_subroutine_type":
            t = T("func")
            self.by_off[die.offset] = t
            t.target = self.type_at(self.ref(die)) if "DW_AT_type" in at else VOID
            for c in die.iter_children():
                if c.tag == "DW_TAG_formal_parameter":
                    t.params.append(self.type_at(self.ref(c)))
                elif c.tag == "DW_TAG_unspecified_parameters":
                    t.variadic = True
            return t
        else:
            t = T("base", name or tag, size)
        self.by_off[die.offset] = t
        return t

    # -- the CU -------------------------------------------------------------
    def read(self):
        info = self.info
        info.cu_name = info.cu_name or self.cu_name
        info.comp_dir = info.comp_dir or self.comp_dir
        for d in self.cu.iter_DIEs():
            if d.tag is not None:
                self.dies[d.offset] = d
        for d in self.dies.values():
            if d.tag == "DW_TAG_typedef" and "DW_AT_type" in d.attributes and "DW_AT_name" in d.attributes:
                tgt = self.dies.get(self.ref(d))
                if tgt is not None and "DW_AT_name" not in tgt.attributes and tgt.tag in (
                        "DW_TAG_structure_type", "DW_TAG_union_type", "DW_TAG_enumeration_type"):
                    self.anon_names.setdefault(tgt.offset, _s(d.attributes["DW_AT_name"].value))
        for d in self.top.iter_children():
            tag = d.tag
            if tag in ("DW_TAG_structure_type", "DW_TAG_union_type", "DW_TAG_enumeration_type",
                       "DW_TAG_typedef"):
                if "DW_AT_name" in d.attributes or d.offset in self.anon_names:
                    self.type_at(d.offset)
            elif tag == "DW_TAG_variable":
                self._variable(d, None)
            elif tag == "DW_TAG_subprogram":
                self._function(d)

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

    def _variable(self, d, func):
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
        name = _s(oa["DW_AT_name"].value)
        ext = bool(oa.get("DW_AT_external") and oa["DW_AT_external"].value)
        ty = self.type_at(self.ref(o))
        key = name if func is None else "%s/%s" % (func, name)
        var = Var(name, key, self.decl(o) or self.decl(d), ty, ext, func)
        self.info.vars[key] = var
        return var

    def _function(self, d):
        at = d.attributes
        o = self._origin(d)
        oa = o.attributes
        if "DW_AT_name" not in oa:
            return
        name = _s(oa["DW_AT_name"].value)
        defined = "DW_AT_low_pc" in at or "DW_AT_ranges" in at
        if not defined:
            # an abstract instance (inlined everywhere): its static locals
            # live here
            if "DW_AT_inline" in at:
                self._statics_of(d, name)
            return
        f = self.info.funcs.get(name)
        if f is None:
            f = self.info.funcs[name] = Func(name)
        f.defined = True
        f.decl = self.decl(o) or self.decl(d)
        f.external = bool(oa.get("DW_AT_external") and oa["DW_AT_external"].value)
        f.ret = self.type_at(self.ref(o)) if "DW_AT_type" in oa else VOID
        params = []
        variadic = False
        for c in o.iter_children():
            if c.tag == "DW_TAG_formal_parameter":
                ca = c.attributes
                params.append((_s(ca["DW_AT_name"].value) if "DW_AT_name" in ca else None,
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
                        self._variable(c, name)
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
                self._variable(c, fname)
            elif c.tag == "DW_TAG_lexical_block" and depth < 64:
                self._statics_of(c, fname, depth + 1)


def _member_offset(v):
    if isinstance(v, int):
        return v
    if isinstance(v, list) and v and v[0] == 0x23:      # DW_OP_plus_uconst ULEB128
        n = shift = 0
        for b in v[1:]:
            n |= (b & 0x7f) << shift
            shift += 7
            if not b & 0x80:
                break
        return n
    return 0


# ---------------------------------------------------------------------------
# Relocating the debug sections of a relocatable object quickly
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
            for cu in dw.iter_CUs():
                _Reader(info, dw, cu).read()
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


# ---------------------------------------------------------------------------
# Reachability: which named types a function or variable reaches
# ---------------------------------------------------------------------------

def _named_refs(t, out, depth=0):
    """The named types t mentions directly (through unnamed pointers, arrays,
    qualifiers, function types; a named type stops the walk)."""
    while t is not None and depth < 32:
        if t.named:
            out.add(t.name if t.kind != "typedef" else "typedef " + t.name)
            return
        k = t.kind
        if k == "func":
            for p in t.params:
                _named_refs(p, out, depth + 1)
        elif k in ("struct", "union"):          # anonymous, no typedef
            for m in t.members:
                _named_refs(m.type, out, depth + 1)
            return
        t = t.target
        depth += 1


def _canon_of(t):
    return t.name if t.kind != "typedef" else "typedef " + t.name


def _type_graph(info):
    """canonical name -> set of canonical names it mentions."""
    g = {}
    for cname, t in info.types.items():
        out = set()
        if t.kind in ("struct", "union"):
            for m in t.members:
                _named_refs(m.type, out)
        elif t.kind == "typedef" or t.kind == "enum":
            _named_refs(t.target, out)
        out.discard(cname)
        g[cname] = out
    return g


def _reaching(graph, targets):
    """Every type name from which one of `targets` is reachable (targets included)."""
    rev = {}
    for a, bs in graph.items():
        for b in bs:
            rev.setdefault(b, set()).add(a)
    seen = set(targets)
    work = list(targets)
    while work:
        x = work.pop()
        for y in rev.get(x, ()):
            if y not in seen:
                seen.add(y)
                work.append(y)
    return seen


def _func_refs(f):
    out = set()
    for t in f.uses:
        _named_refs(t, out)
    return out


def _logical(name):
    """'f__molt_v0' -> 'f'; generated functions -> None."""
    if name.endswith("__molt_dispatch") or name.startswith("molt__"):
        return None
    if name.endswith("__molt_v0"):
        return name[:-len("__molt_v0")]
    return name


def _var_display(v):
    n = v.name
    if v.func is not None:
        return "static local '%s' of %s" % (n, _logical(v.func) or v.func)
    if n.startswith("molt__") and "__" in n[6:]:
        f, _, x = n[6:].rpartition("__")
        if f and x:
            return "static local '%s' of %s (%s)" % (x, f, n)
    return n


def _is_generated_var(v):
    return v.name.endswith("__molt_desc") or v.name in ("molt__fns_start", "molt__fns_stop")


# ---------------------------------------------------------------------------
# Comparing two builds
# ---------------------------------------------------------------------------

class Refusal:
    def __init__(self, kind, name, where, what, users=(), shipped_users=()):
        self.kind = kind              # type, signature, variable, initializer, main, constructor,
        #                               destructor, external, data
        self.name = name              # 'struct conn', 'scale', 'counter'
        self.where = where            # (file, line) or None
        self.what = what              # words
        self.users = tuple(users)     # live code of this TU that uses it
        self.shipped_users = tuple(shipped_users)

    def __str__(self):
        w = " (%s:%s)" % self.where if self.where else ""
        s = "%s%s: %s" % (self.name, w, self.what)
        if self.users:
            s += "; used by live code: " + _list(self.users)
        return s

    __repr__ = __str__

    def to_dict(self):
        return {"kind": self.kind, "name": self.name, "where": self.where, "what": self.what,
                "users": list(self.users), "shipped_users": list(self.shipped_users),
                "message": str(self)}


def _list(names, limit=8):
    names = list(names)
    if len(names) <= limit:
        return ", ".join(names)
    return "%s and %d more" % (", ".join(names[:limit]), len(names) - limit)


class TypeCheck:
    def __init__(self):
        self.refusals = []
        self.notes = []

    @property
    def ok(self):
        return not self.refusals

    def report(self, prefix="moltcc: error: "):
        lines = [prefix + str(r) for r in self.refusals]
        if self.refusals:
            lines.append(prefix + WAY_FORWARD)
        return lines


def _member_label(m, i):
    return "'%s'" % m.name if m.name else "unnamed member #%d" % i


def _bits(m):
    return "bits %d..%d" % (m.bit_offset, m.bit_offset + m.bit_size - 1)


def _layout_changes(a, b):
    """Words for what changed between two versions of a named type; [] when
    the layout is the same.  Second result: notes (added enumerators)."""
    ch, notes = [], []
    if a.kind != b.kind:
        return ["changed from %s to %s" % (a.kind, b.kind)], notes
    if a.kind == "enum":
        old = dict(a.enumerators)
        new = dict(b.enumerators)
        added = [(n, v) for n, v in b.enumerators if n not in old]
        for n, v in a.enumerators:
            if n not in new:
                same = [x for x, w in added if w == v]
                if len(same) == 1:        # renamed, same value: the program cannot tell
                    notes.append("enumerator %s renamed to %s (= %d)" % (n, same[0], v))
                    added = [(x, w) for x, w in added if x != same[0]]
                else:
                    ch.append("enumerator %s (= %d) removed" % (n, v))
            elif new[n] != v:
                ch.append("enumerator %s changed value %d -> %d" % (n, v, new[n]))
        if added and not ch:
            notes.append("enumerators added: %s (no existing value changed)" % ", ".join(
                "%s = %d" % nv for nv in added))
        elif added:
            ch.append("enumerators added: %s" % ", ".join("%s = %d" % nv for nv in added))
        if a.size != b.size:
            ch.append("size %s -> %s" % (a.size, b.size))
        return ch, notes
    if a.kind == "typedef":
        # a typedef of a struct whose layout changed names the same struct:
        # the struct is reported itself
        if sig(a.target) != sig(b.target):
            ch.append("now names %s instead of %s%s" % (
                display_resolved(b.target), display_resolved(a.target),
                "" if a.real_size() == b.real_size() else
                " (size %s -> %s)" % (a.real_size(), b.real_size())))
        return ch, notes
    if not (a.complete and b.complete):
        return ch, notes
    amem = _keyed_members(a.members)
    bmem = _keyed_members(b.members)

    def shape(m):
        return (m.offset, sig(m.type), m.type.real_size(), m.bit_size, m.bit_offset)

    # a field renamed in place (same offset, type, bits) changes no layout
    gone = {k: v for k, v in amem.items() if k not in bmem}
    came = {k: v for k, v in bmem.items() if k not in amem}
    for k, (i, m) in list(gone.items()):
        same = [k2 for k2, (j, n) in came.items() if shape(n) == shape(m)]
        if len(same) == 1:
            notes.append("field %s renamed to %s" % (_member_label(m, i),
                                                     _member_label(came[same[0]][1], came[same[0]][0])))
            bmem = dict(bmem)
            amem = dict(amem)
            amem[same[0]] = amem.pop(k)
            del came[same[0]]
    changed, moved, removed = [], [], []
    for k, (i, m) in amem.items():
        lab = _member_label(m, i)
        n = bmem.get(k)
        if n is None:
            removed.append("field %s (%s) removed" % (lab, display(m.type)))
            continue
        n = n[1]
        parts = []
        if sig(m.type) != sig(n.type) or m.type.real_size() != n.type.real_size():
            parts.append("changed type %s -> %s" % (display_resolved(m.type), display_resolved(n.type)))
        if m.bit_size is not None or n.bit_size is not None:
            if m.bit_size != n.bit_size:
                parts.append("changed width %s -> %s bits" % (m.bit_size or "(not a bit-field)",
                                                              n.bit_size or "(not a bit-field)"))
            if m.bit_offset != n.bit_offset and m.bit_size is not None and n.bit_size is not None:
                if parts:
                    parts.append("moved from %s to %s" % (_bits(m), _bits(n)))
                else:
                    moved.append((lab, "bits", m.bit_offset, n.bit_offset, m.bit_size, n.bit_size))
        if m.offset != n.offset and not (m.bit_size is not None and n.bit_size is not None):
            if parts:
                parts.append("moved from offset %d to %d" % (m.offset, n.offset))
            else:
                moved.append((lab, "offset", m.offset, n.offset, None, None))
        if parts:
            changed.append("field %s %s" % (lab, " and ".join(parts)))
    added = []
    for k, (i, n) in bmem.items():
        if k not in amem:
            where = ("bits %d..%d" % (n.bit_offset, n.bit_offset + n.bit_size - 1)
                     if n.bit_size is not None else "offset %d" % n.offset)
            added.append("field %s (%s) added at %s" % (_member_label(n, i), display(n.type), where))
    ch = changed + added + removed + _moves(moved)
    if a.size != b.size:
        ch.append("size %s -> %s" % (a.size, b.size))
    return ch, notes


def _moves(moved):
    """Fields that only moved: runs of 3 or more moved by the same distance
    are one phrase ('fields 'a' .. 'z' (20) moved by 8 bytes')."""
    out = []
    i = 0
    while i < len(moved):
        lab, unit, old, new = moved[i][:4]
        j = i
        while j + 1 < len(moved) and moved[j + 1][1] == unit and \
                moved[j + 1][3] - moved[j + 1][2] == new - old:
            j += 1
        if j - i >= 2:
            d = new - old
            out.append("fields %s .. %s (%d) moved by %s%d %s" % (
                lab, moved[j][0], j - i + 1, "+" if d > 0 else "", d,
                "bytes" if unit == "offset" else "bits"))
        else:
            for lab2, unit2, o2, n2, s2, t2 in moved[i:j + 1]:
                if unit2 == "offset":
                    out.append("field %s moved from offset %d to %d" % (lab2, o2, n2))
                else:
                    out.append("field %s moved from bits %d..%d to bits %d..%d" % (
                        lab2, o2, o2 + s2 - 1, n2, n2 + t2 - 1))
        i = j + 1
    return out


def _keyed_members(ms):
    out = {}
    anon = 0
    for i, m in enumerate(ms):
        if m.name:
            out[m.name] = (i, m)
        else:
            out["#%d" % anon] = (i, m)
            anon += 1
    return out


def _type_label(t):
    if t.kind == "typedef":
        return "typedef " + t.name
    if t.name.startswith(t.kind + " {"):
        inner = t.name[len(t.kind) + 2:-1]
        if inner.startswith("anon@"):
            return "anonymous %s" % t.kind
        if "." not in inner:
            return "%s (anonymous %s)" % (inner, t.kind)
        return "anonymous %s of member %s" % (t.kind, inner)
    return t.name


def _params_sig(f):
    return [sig(t) for _n, t in f.params], f.variadic


def _params_words(f):
    ps = [display_resolved(t) for _n, t in f.params]
    if f.variadic:
        ps.append("...")
    return "(%s)" % (", ".join(ps) if ps else "void")


def _find_func(info, name):
    """The DWARF function for a logical name: the woven body f__molt_v0, else f."""
    return info.funcs.get(name + "__molt_v0") or info.funcs.get(name)


def check_types(orig_o, new_o, shipped_functions=(), comparison=None, target_has=None):
    old = load_debug(orig_o)
    new = load_debug(new_o)
    res = TypeCheck()
    # signatures matter for functions replaced in place (live callers go
    # through the stable entry); a private copy is called by shipped code only
    shipped = set(shipped_functions or ())
    if comparison is not None and not shipped:
        shipped = {f.name for f in comparison.replaced}
    using = shipped | (set(comparison.shipped_functions()) if comparison is not None else set())

    ogr = _type_graph(old)
    ngr = _type_graph(new)

    # live users (orig) and shipped users (new) of every type, lazily
    ofuncs = {}
    for n, f in old.funcs.items():
        ln = _logical(n)
        if ln is None:
            continue
        ofuncs.setdefault(ln, set()).update(_func_refs(f))
    nfuncs = {}
    for n, f in new.funcs.items():
        ln = _logical(n)
        if ln is None:
            continue
        nfuncs.setdefault(ln, set()).update(_func_refs(f))
    ovars = {}
    for k, v in old.vars.items():
        if _is_generated_var(v):
            continue
        s = set()
        _named_refs(v.type, s)
        ovars[k] = s
    nvars = {}
    for k, v in new.vars.items():
        if _is_generated_var(v):
            continue
        s = set()
        _named_refs(v.type, s)
        nvars[k] = s

    # -- named types --------------------------------------------------------
    changed_types = []
    for cname, a in old.types.items():
        b = new.types.get(cname)
        if b is None:
            continue
        if cname.startswith(("struct molt__", "typedef molt__", "union molt__", "enum molt__")):
            continue
        ch, notes = _layout_changes(a, b)
        for n in notes:
            res.notes.append("%s%s: %s" % (_type_label(a), " (%s:%s)" % b.decl if b.decl else "", n))
        if ch:
            changed_types.append((cname, a, b, ch))
    for cname, a, b, ch in sorted(changed_types, key=lambda x: x[0]):
        oreach = _reaching(ogr, {cname})
        nreach = _reaching(ngr, {cname})
        users = sorted(f for f, refs in ofuncs.items() if refs & oreach)
        data_users = sorted(_var_display(old.vars[k]) for k, refs in ovars.items() if refs & oreach)
        susers = sorted(f for f, refs in nfuncs.items() if refs & nreach and f in using)
        any_new = any(refs & nreach for refs in nfuncs.values()) or \
            any(refs & nreach for refs in nvars.values())
        what = "; ".join(ch)
        if not users and not data_users and not any_new:
            res.notes.append("%s%s changed (%s) but no code or data of this file uses it" % (
                _type_label(a), " (%s:%s)" % a.decl if a.decl else "", what))
            continue
        allu = users + ["data: " + d for d in data_users]
        if not allu and susers:
            allu = ["(no live code of this file; the patch's %s use it)" % _list(susers)]
        res.refusals.append(Refusal("type", _type_label(a), b.decl or a.decl, what, allu, susers))

    # types that the original had only as a declaration
    for cname, b in new.types.items():
        a = old.types.get(cname)
        if a is not None and not a.complete and b.complete and b.kind in ("struct", "union"):
            res.notes.append("%s: the original build has no definition of it, so its layout "
                             "could not be checked" % _type_label(b))

    # -- signatures of shipped functions ------------------------------------
    for name in sorted(shipped):
        if "." in name:
            continue            # compiler clones have no signature of their own
        of = _find_func(old, name)
        nf = _find_func(new, name)
        if of is None or nf is None:
            continue
        parts = []
        if _params_sig(of) != _params_sig(nf):
            parts.append("parameters changed %s -> %s" % (_params_words(of), _params_words(nf)))
        if sig(of.ret) != sig(nf.ret):
            parts.append("return type changed %s -> %s" % (display_resolved(of.ret),
                                                            display_resolved(nf.ret)))
        if parts:
            callers = sorted(c for c, refs in (comparison.orig_references.items()
                                               if comparison else ()) if name in refs and c != name)
            what = "; ".join(parts) + "; live callers pass the old arguments and expect the old result"
            res.refusals.append(Refusal("signature", "function " + name, nf.decl or of.decl, what,
                                        callers))

    # -- variables ------------------------------------------------------------
    for key, v in sorted(old.vars.items()):
        if _is_generated_var(v):
            continue
        w = new.vars.get(key)
        if w is None:
            continue
        if target_has is not None and not target_has(v.name, not v.external):
            continue
        if sig(v.type) != sig(w.type) or v.type.real_size() != w.type.real_size():
            what = "type changed %s -> %s" % (display_resolved(v.type), display_resolved(w.type))
            if v.type.real_size() != w.type.real_size():
                what += " (size %s -> %s)" % (v.type.real_size(), w.type.real_size())
            what += "; the live object keeps its old type"
            users = []
            if comparison is not None:
                users = sorted(c for c, refs in comparison.orig_references.items() if v.name in refs)
            res.refusals.append(Refusal("variable", _var_display(v), w.decl or v.decl, what, users))

    # -- from the object comparison -------------------------------------------
    if comparison is not None:
        typed = {r.name for r in res.refusals if r.kind == "variable"}
        for d in comparison.changed_data:
            v = old.vars.get(d.name)
            label = _var_display(v) if v is not None else d.name
            if label in typed:
                continue
            where = d.where or (v.decl if v is not None else None)
            what = d.reason if d.reason.startswith("initial value") else \
                "initial value changed: %s" % d.reason
            res.refusals.append(Refusal("initializer", label, where,
                                        what + "; the live object keeps its old contents", d.users))
        for u in comparison.unshippable:
            res.refusals.append(Refusal(u.kind, u.name, u.where, u.reason, ()))
    return res
