"""The migration code of a full update (docs/full-updates.md, "The generated
code"): compares the old and the new image (dwarf.py), checks that every
change the migrated state reaches is covered by the .xf rules, and writes the
C of `static void migrate(molt__xf_ctx *cx)` with one molt__xf_type and one
function per (old type, new type) pair.

Both versions' types are re-declared: `struct molt_o_entry` /
`struct molt_n_entry` (packed, aligned, explicit padding, _Static_assert on
sizes and member offsets); an enum becomes a typedef of its integer type
(`molt_o_enum_color`) and its enumerators `molt_o_RED` / `molt_n_RED` (the
new version's also plain `RED` where that is unambiguous); typedefs are
`molt_o_NAME` / `molt_n_NAME`.
"""
import re

from ..dwarf import Type, VOID, describe
from . import GEN_NAME, xf
RESYNC = "#line MOLT_RESYNC"


class XfgenError(Exception):
    """lines: the message.  located: already `file:line:col: error: ...`
    lines (printed as they are); else the first line gets `moltcc: error:`."""

    def __init__(self, lines, located=False, notes=()):
        if isinstance(lines, str):
            lines = [lines]
        super().__init__("\n".join(lines))
        self.lines = list(lines)
        self.located = located
        self.notes = list(notes)

    def render(self, prog):
        if self.located:
            return "\n".join(self.lines)
        return "%s: error: %s" % (prog, "\n".join(self.lines))


class Result:
    def __init__(self, code, notes):
        self.code = code
        self.notes = notes


def finalize(text):
    """Replaces the resync markers after rule bodies by #line directives
    pointing back into the generated file."""
    out = []
    for i, line in enumerate(text.split("\n")):
        if line.strip() == RESYNC:
            line = '#line %d "%s"' % (i + 2, GEN_NAME)
        out.append(line)
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Annotations
# ---------------------------------------------------------------------------

class Ann:
    """The annotations of one image (its .molt_types JSON)."""

    def __init__(self, data):
        data = data or {}
        self.types = data.get("types", {})
        self.fields = data.get("fields", {})
        self.vars = data.get("vars", [])
        self.locals = data.get("locals", [])

    def field(self, struct, name):
        return self.fields.get(struct, {}).get(name, [])

    def forall(self, struct):
        return [a.split(":", 1)[1] for a in self.types.get(struct, []) if a.startswith("molt_forall:")]

    def var(self, name, tu):
        for v in self.vars:
            if v["name"] == name and (v.get("tu") is None or tu is None or v.get("tu") == tu):
                return v.get("annotations", [])
        return []


def _ann_get(anns, kind):
    for a in anns:
        if a == kind or a.startswith(kind + ":"):
            return a.split(":", 1)[1] if ":" in a else True
    return None


# ---------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------

def type_names(t):
    """The names a rule may use for type t: typedefs on the way down and the
    canonical name of what they name ('typedef foo' for 'struct {foo}')."""
    names = []
    n = 0
    while t is not None and n < 32:
        n += 1
        if t.kind == "typedef":
            names.append(t.name)
            t = t.target
        elif t.kind in ("const", "volatile", "restrict", "atomic"):
            t = t.target
        else:
            if t.name:
                names.append(t.name)
                m = re.match(r"^(struct|union|enum) \{(\w+)\}$", t.name)
                if m:
                    names.append("typedef " + m.group(2))
            break
    return names


class Rules:
    def __init__(self, rules, old, new):
        self.old, self.new = old, new
        self.errors = []
        self.var_rules = {}       # new Variable -> (rule, path, old Variable)
        self.init_vars = {}       # new Variable -> (rule, path)
        self.type_rules = []      # (old names, new names, rule, path)
        self.field_rules = {}     # (new struct canon, new field) -> (old field, rule, path)
        self.init_fields = {}     # (new struct canon, field) -> (rule, path)
        self.init_types = {}      # new struct canon -> (rule, path): runs after the fields
        for rule, path in rules:
            self._add(rule, path)

    def err(self, path, ref, msg):
        self.errors.append("%s:%d:%d: error: %s" % (path, ref.line, ref.col, msg))

    def _var(self, im, ref, path, which):
        vs = im.find_var(ref.name, ref.tu)
        if not vs:
            fs = [v for v in im.func_statics if v.name == ref.name]
            extra = ""
            if fs:
                extra = " (%s() has a function-scope static of that name; those are not migrated)" % fs[0].func
            self.err(path, ref, "no variable '%s%s' in the %s version%s" % (
                ref.name, "@" + ref.tu if ref.tu else "", which, extra))
            return None
        if len(vs) > 1:
            self.err(path, ref, "'%s' is ambiguous in the %s version (%s): write name@file.c" % (
                ref.name, which, ", ".join("%s@%s" % (v.name, v.tu) for v in vs)))
            return None
        return vs[0]

    def _type(self, im, ref, path, which):
        t = im.lookup_type(ref.name)
        if t is None or (t.strip().kind in ("struct", "union", "enum") and not t.strip().complete
                         and ref.kind == "field"):
            self.err(path, ref, "no type '%s' in the %s version" % (ref.name, which))
            return None
        return t

    def _field(self, im, ref, path, which):
        t = self._type(im, ref, path, which)
        if t is None:
            return None, None
        s = t.strip()
        if s.kind not in ("struct", "union"):
            self.err(path, ref, "'%s' is not a struct or union in the %s version" % (ref.name, which))
            return None, None
        if not any(m.name == ref.field for m in s.members):
            self.err(path, ref, "%s has no field '%s' in the %s version" % (ref.name, ref.field, which))
            return None, None
        return s, ref.field

    def _add(self, rule, path):
        tgt = rule.target
        if rule.kind == "init":
            if tgt.kind == "var":
                v = self._var(self.new, tgt, path, "new")
                if v is not None:
                    self.init_vars[v] = (rule, path)
            elif tgt.kind == "field":
                s, f = self._field(self.new, tgt, path, "new")
                if s is not None:
                    self.init_fields[(s.name, f)] = (rule, path)
            else:
                t = self._type(self.new, tgt, path, "new")
                if t is not None:
                    if t.strip().kind not in ("struct", "union"):
                        self.err(path, tgt, "INIT of a whole type needs a struct or union")
                    else:
                        self.init_types[t.strip().name] = (rule, path)
            return
        src = rule.source
        if src.kind != tgt.kind:
            self.err(path, tgt, "a rule maps a %s to a %s" % (src.kind, tgt.kind))
            return
        if src.kind == "var":
            vo = self._var(self.old, src, path, "old")
            vn = self._var(self.new, tgt, path, "new")
            if vo is not None and vn is not None:
                self.var_rules[vn] = (rule, path, vo)
        elif src.kind == "type":
            to = self._type(self.old, src, path, "old")
            tn = self._type(self.new, tgt, path, "new")
            if to is not None and tn is not None:
                self.type_rules.append((set(type_names(to)) | {src.name},
                                        set(type_names(tn)) | {tgt.name}, rule, path))
        elif src.kind == "field":
            so, fo = self._field(self.old, src, path, "old")
            sn, fn = self._field(self.new, tgt, path, "new")
            if so is not None and sn is not None:
                self.field_rules[(sn.name, fn)] = (so.name, fo, rule, path)

    def type_rule(self, to, tn):
        no, nn = set(type_names(to)), set(type_names(tn))
        for so, sn, rule, path in self.type_rules:
            if so & no and sn & nn:
                return (rule, path)
        return None

    def covers_struct(self, sname):
        return sname in self.init_types or any(k[0] == sname for k in self.init_fields) or \
            any(k[0] == sname for k in self.field_rules)


# ---------------------------------------------------------------------------
# C declarations of one version's types
# ---------------------------------------------------------------------------

_BASE_C = {"complex float": "_Complex float", "complex double": "_Complex double",
           "complex long double": "_Complex long double", "__int128 unsigned": "unsigned __int128"}


def _ident(s):
    return re.sub(r"[^A-Za-z0-9_]", "_", s).strip("_") or "anon"


def ptr_to(t):
    p = Type("pointer", None, 8)
    p.target = t
    return p


def _align(t, depth=0):
    t = t.strip()
    if depth > 32:
        return 1
    if t.kind in ("base", "pointer"):
        return max(1, min(t.size or 1, 16))
    if t.kind == "enum":
        return max(1, min(t.size or 4, 8))
    if t.kind == "array":
        return _align(t.target, depth + 1)
    if t.kind in ("struct", "union"):
        a = 1
        for m in t.members:
            if not m.is_bitfield:
                a = max(a, _align(m.type, depth + 1))
            else:
                a = max(a, min(m.type.strip().size or 1, 8))
        size = t.size or 0
        while a > 1 and size % a:
            a //= 2
        return a
    return 1


class Decls:
    def __init__(self, im, prefix, which):
        self.im = im
        self.p = prefix               # molt_o_ / molt_n_
        self.which = which            # "old" / "new"
        self.names = {}               # id(type) -> C tag / name
        self.used = set()
        self.defs = []                # struct/union types needing a definition, in order
        self.def_set = set()
        self.fwd = []
        self.fwd_set = set()
        self.enums = []
        self.enum_set = set()
        self.typedefs = []
        self.typedef_set = set()

    # -- names -----------------------------------------------------------------
    def tag(self, t):
        n = self.names.get(id(t))
        if n is None:
            k = t.name.split(" ", 1)[1] if t.name and " " in t.name else (t.name or "anon")
            base = self.p + ("enum_" if t.kind == "enum" else "") + _ident(k)
            n = base
            i = 1
            while n in self.used:
                i += 1
                n = "%s_%d" % (base, i)
            self.used.add(n)
            self.names[id(t)] = n
        return n

    def spec(self, t):
        """The type specifier of a stripped, non-derived type."""
        if t.kind == "void":
            return "void"
        if t.kind == "base":
            return _BASE_C.get(t.name, t.name)
        if t.kind in ("struct", "union"):
            self.need_fwd(t)
            return "%s %s" % (t.kind, self.tag(t))
        if t.kind == "enum":
            self.need_enum(t)
            return self.tag(t)
        return "unsigned char"

    def decl(self, t, inner=""):
        """A declaration of `inner` with type t (qualifiers and typedefs
        dropped; function pointers become `void (*)(void)`)."""
        t = t.strip()
        if t.kind == "pointer":
            tt = (t.target or VOID).strip()
            if tt.kind == "func":
                return "void (*%s)(void)" % inner
            inner2 = "*" + inner
            if tt.kind == "array":
                inner2 = "(" + inner2 + ")"
            return self.decl(tt, inner2)
        if t.kind == "array":
            dims = "".join("[%d]" % (d if d is not None else 0) for d in t.dims)
            return self.decl(t.target, inner + dims)
        if t.kind == "func":
            return "void (*%s)(void)" % inner
        s = self.spec(t)
        return s + (" " + inner if inner else "")

    def cast_ptr(self, t, const=False):
        """`T *` for a cast (pointer to t); `T const *` when const."""
        t = t.strip()
        if const and t.kind not in ("array", "func"):
            return self.decl(t, "const *")
        return self.decl(ptr_to(t), "")

    # -- what to emit ------------------------------------------------------------
    def need_fwd(self, t):
        if id(t) not in self.fwd_set:
            self.fwd_set.add(id(t))
            self.fwd.append(t)

    def need_enum(self, t):
        if id(t) not in self.enum_set:
            self.enum_set.add(id(t))
            self.enums.append(t)

    def need(self, t, depth=0):
        """Makes sure t can be used by value (definitions of the structs it
        contains)."""
        t = t.strip()
        if depth > 64:
            return
        if t.kind == "array":
            self.need(t.target, depth + 1)
        elif t.kind == "pointer":
            tt = (t.target or VOID).strip()
            if tt.kind in ("struct", "union"):
                self.need_fwd(tt)
            elif tt.kind not in ("func",):
                self.need(tt, depth + 1)
        elif t.kind in ("struct", "union"):
            self.need_fwd(t)
            if id(t) in self.def_set or not t.complete:
                return
            self.def_set.add(id(t))
            for m in t.members:
                self.need(m.type, depth + 1)
            self.defs.append(t)      # after its by-value members: dependency order
        elif t.kind == "enum":
            self.need_enum(t)

    def need_typedef(self, t):
        if t.kind == "typedef" and id(t) not in self.typedef_set:
            self.typedef_set.add(id(t))
            self.need(t.strip())
            self.typedefs.append(t)

    def typedef_name(self, t):
        return self.p + _ident(t.name[len("typedef "):])

    def type_c(self, name):
        """$oldtype(T) / $newtype(T): the C spelling, or None."""
        t = self.im.lookup_type(name)
        if t is None:
            return None
        stars = 0
        while t.kind == "pointer" and t.name is None and t.target is not None and \
                not (t.target.strip().kind == "func"):
            stars += 1
            t = t.target
            if stars > 8:
                break
        if t.kind == "typedef":
            self.need_typedef(t)
            return self.typedef_name(t) + " *" * stars
        self.need(t)
        return self.decl(t, "") + " *" * stars

    # -- output ------------------------------------------------------------------
    def emit(self, enum_plain):
        out = ["/* ---- the %s version's types ---- */" % self.which]
        for t in self.fwd:
            out.append("%s %s;" % (t.kind, self.tag(t)))
        for t in self.enums:
            base = t.target if t.target is not None and t.target.kind == "base" else None
            ut = _BASE_C.get(base.name, base.name) if base else "int"
            out.append("typedef %s %s; /* %s */" % (ut, self.tag(t), t.name))
            consts = ["%s%s = %d" % (self.p, n, v) for n, v in t.enumerators
                      if -2 ** 31 <= v < 2 ** 31]
            if consts:
                out.append("enum { %s };" % ", ".join(consts))
            if enum_plain:
                plain = ["%s = %d" % (n, v) for n, v in t.enumerators
                         if -2 ** 31 <= v < 2 ** 31 and n in enum_plain]
                if plain:
                    out.append("enum { %s };" % ", ".join(plain))
        for t in self.defs:
            out.extend(self._definition(t))
        for t in self.typedefs:
            out.append("typedef %s;" % self.decl(t.target, self.typedef_name(t)))
        return out

    def _definition(self, t):
        tag = self.tag(t)
        a = _align(t)
        lines = ["%s __attribute__((packed, aligned(%d))) %s { /* %s */" % (t.kind, a, tag, t.name)]
        asserts = []
        size = t.size or 0
        pad = [0]

        def padbytes(n):
            if n > 0:
                lines.append("    unsigned char molt_pad%d[%d];" % (pad[0], n))
                pad[0] += 1

        def padbits(n):
            while n > 0:
                k = min(n, 32)
                lines.append("    unsigned int : %d;" % k)
                n -= k

        anon = 0
        if t.kind == "union":
            for m in t.members:
                nm = m.name
                if nm is None:
                    nm = "molt_anon%d" % anon
                    anon += 1
                if m.is_bitfield:
                    lines.append("    struct __attribute__((packed)) { %s; } %s;" % (
                        self._bitfield(m, nm, m.bit_offset), nm + "_bits"))
                    continue
                lines.append("    %s;" % self.decl(m.type, nm))
            if size:
                lines.append("    unsigned char molt_size[%d];" % size)
        else:
            cur = 0
            for m in sorted(t.members, key=lambda m: (m.bit_offset if m.is_bitfield else m.offset * 8)):
                nm = m.name
                if nm is None:
                    nm = "molt_anon%d" % anon
                    anon += 1
                if m.is_bitfield:
                    start = m.bit_offset
                    if start > cur:
                        gap = start - cur
                        if cur % 8:
                            k = min(gap, 8 - cur % 8)
                            padbits(k)
                            cur += k
                            gap -= k
                        padbytes(gap // 8)
                        cur += (gap // 8) * 8
                        padbits(gap % 8)
                        cur += gap % 8
                    lines.append("    %s;" % self._bitfield(m, nm, start))
                    cur = start + m.bit_size
                else:
                    start = m.offset * 8
                    if start > cur:
                        if cur % 8:
                            k = 8 - cur % 8
                            padbits(k)
                            cur += k
                        padbytes((start - cur) // 8)
                    cur = start
                    lines.append("    %s;" % self.decl(m.type, nm))
                    msize = m.type.strip().size or 0
                    cur = start + msize * 8
                    asserts.append("_Static_assert(__builtin_offsetof(%s %s, %s) == %d, "
                                   "\"%s (%s): offset of %s\");" % (t.kind, tag, nm, m.offset,
                                                                   t.name, self.which, nm))
            if size * 8 > cur:
                if cur % 8:
                    k = 8 - cur % 8
                    padbits(k)
                    cur += k
                padbytes(size - cur // 8)
        lines.append("};")
        lines.append("_Static_assert(sizeof(%s %s) == %d, \"%s (%s): size\");" % (
            t.kind, tag, size, t.name, self.which))
        return lines + asserts

    def _bitfield(self, m, nm, start):
        bt = m.type.strip()
        if bt.kind == "enum":
            bt = bt.target if bt.target is not None else bt
        spec = _BASE_C.get(bt.name, bt.name) if bt.kind == "base" else "unsigned int"
        # a bit-field must fit its declared type's width: widen if needed
        if bt.kind == "base" and (bt.size or 4) * 8 < m.bit_size:
            spec = "unsigned long long"
        return "%s %s : %d" % (spec, nm, m.bit_size)


# ---------------------------------------------------------------------------
# Type pairs
# ---------------------------------------------------------------------------

ARITH = ("base", "enum")


class Pair:
    def __init__(self, pid, old, new, binding, rule, ptr_ann):
        self.id = pid
        self.old, self.new = old, new        # stripped types
        self.binding = binding               # ((var, old type, new type), ...) or ()
        self.rule = rule                     # (rule, path) of a type rule, or None
        self.ptr_ann = ptr_ann               # pointer pairs: (opaque, count literal)
        self.kind = None
        self.changed = False
        self.traverse = False
        self.diffs = []                      # own differences (struct/union/enum)
        self.entries = []                    # struct: (old member, new member, pair or None)
        self.elem = None                     # array: element pair
        self.pointee = None                  # pointer: (pair or None, binding)
        self.name = None
        self.emitted = False
        self.var_diff = None
        self.gen = None                      # set while generating code

    @property
    def c_name(self):
        if self.gen is not None:
            self.gen.ref(self)
        return "molt_xf_t%d" % self.id

    @property
    def fn_name(self):
        if self.gen is not None:
            self.gen.ref(self)
        return "molt_xf_f%d" % self.id

    def has_fn(self):
        return self.kind == "rule" or self.changed or self.traverse


def same_arith(a, b):
    if a.kind == "enum" or b.kind == "enum":
        ua = a.target if a.kind == "enum" else a
        ub = b.target if b.kind == "enum" else b
        if (ua.size, _signed(ua)) != (ub.size, _signed(ub)):
            return False
        if a.kind == "enum" and b.kind == "enum":
            vo = dict(a.enumerators)
            return all(vo.get(n, v) == v for n, v in b.enumerators)
        return True
    return a.size == b.size and a.encoding == b.encoding and \
        (a.name == b.name or a.encoding not in ("float", "complex"))


def _signed(t):
    return t.encoding in ("signed", "signed_char") if t is not None and t.kind == "base" else True


class Generator:
    def __init__(self, old, new, rules, old_name, new_name):
        self.old, self.new = old, new
        self.old_name, self.new_name = old_name, new_name
        self.rules = Rules(rules, old, new)
        self.oa = Ann(old.annotations)
        self.na = Ann(new.annotations)
        self.od = Decls(old, "molt_o_", "old")
        self.nd = Decls(new, "molt_n_", "new")
        self.pairs = {}
        self.order = []
        self.errors = []
        self.notes = []
        self.tracking = None      # self while generating code: pairs used get emitted
        self.emit = []
        self.emit_set = set()

    def ref(self, p):
        if id(p) not in self.emit_set:
            self.emit_set.add(id(p))
            self.emit.append(p)

    # -- pairs ---------------------------------------------------------------------
    def pair(self, to, tn, binding=(), ptr_ann=None):
        rule = self.rules.type_rule(to, tn)
        ro, rn = to.strip(), tn.strip()
        if not (ro.kind == "struct" and self.oa.forall(ro.name)):
            binding = ()
        if ro.kind != "pointer":
            ptr_ann = None
        key = (id(ro), id(rn), tuple((v, id(a), id(b)) for v, a, b in binding), ptr_ann,
               id(rule[0]) if rule else None)
        p = self.pairs.get(key)
        if p is not None:
            return p
        p = Pair(len(self.order) + 1, ro, rn, binding, rule, ptr_ann)
        p.gen = self.tracking
        self.pairs[key] = p
        self.order.append(p)
        self._analyse(p)
        return p

    def _analyse(self, p):
        ro, rn = p.old, p.new
        name = describe(ro) if describe(ro) == describe(rn) else "%s -> %s" % (describe(ro), describe(rn))
        if p.binding:
            name += "<%s>" % ", ".join(describe(a) for _, a, _ in p.binding)
        p.name = name
        if p.rule is not None and p.rule[0].body is not None:
            p.kind = "rule"
            p.changed = True
            p.traverse = True
            self.od.need(ro)
            self.nd.need(rn)
            return
        if ro.kind in ARITH and rn.kind in ARITH:
            p.kind = "arith"
            p.changed = not same_arith(ro, rn)
            if ro.kind == "enum" and rn.kind == "enum":
                vo = dict(ro.enumerators)
                for n, v in rn.enumerators:
                    if n in vo and vo[n] != v:
                        p.diffs.append("enumerator '%s' %d -> %d" % (n, vo[n], v))
            return
        if ro.kind == "void" and rn.kind == "void":
            p.kind = "arith"
            return
        if ro.kind == rn.kind and ro.kind in ("struct", "union"):
            anon_o = "{" in (ro.name or "")
            anon_n = "{" in (rn.name or "")
            if ro.name == rn.name or p.rule is not None or (anon_o and anon_n):
                if not ro.complete or not rn.complete:
                    p.kind = "opaque"
                    return
                self.od.need(ro)
                self.nd.need(rn)
                p.kind = ro.kind
                self._analyse_struct(p)
                return
        if ro.kind == "pointer" and rn.kind == "pointer":
            p.kind = "pointer"
            opaque = p.ptr_ann[0] if p.ptr_ann else False
            p.traverse = not opaque
            return
        if ro.kind == "array" and rn.kind == "array":
            p.kind = "array"
            p.elem = self.pair(ro.element(), rn.element(), p.binding)
            co, cn = ro.count(), rn.count()
            p.changed = p.elem.changed or co != cn or ro.dims[1:] != rn.dims[1:]
            p.traverse = p.elem.traverse
            if p.elem.kind == "incompatible":
                p.kind = "incompatible"
            return
        p.kind = "incompatible"
        p.changed = True

    def _members(self, t):
        out = {}
        anon = 0
        for m in t.members:
            if m.name is None:
                out["#%d" % anon] = m
                anon += 1
            else:
                out[m.name] = m
        return out

    def _ptr_slots(self, t, off, path, out, depth=0):
        """Appends (offset, pointer type, member path) for every pointer
        held at a fixed offset in a value of type t (through structs, unions
        and arrays; bit-fields hold none)."""
        t = t.strip()
        if depth > 16 or len(out) > 1024:
            return
        if t.kind == "pointer":
            out.append((off, t, path))
        elif t.kind in ("struct", "union") and t.complete:
            for m in t.members:
                if not m.is_bitfield:
                    self._ptr_slots(m.type, off + (m.offset or 0),
                                    path + "." + (m.name or "?"), out, depth + 1)
        elif t.kind == "array":
            e = t.element()
            es = e.size or 0
            sub = []
            self._ptr_slots(e, 0, path + "[]", sub, depth + 1)
            if sub and es:
                for i in range(min(t.count() or 0, 256)):
                    for o, pt, pp in sub:
                        out.append((off + i * es + o, pt, pp))

    _COUNT_TOK = re.compile(r"\s+|(?P<id>[A-Za-z_]\w*)|(?P<num>0[xX][0-9a-fA-F]+[uUlL]*|\d+[uUlL]*)"
                            r"|(?P<op><<|>>|->|[-+*/%()&|^~.?:])")

    def count_expr(self, count, struct, what):
        """The C expression (size_t) of MOLT_PTRARRAY(count) on `what`:
        an integer, or an expression over fields of the struct holding the
        pointer (struct: its old type, or None for a variable), variables
        of the old version (members of a struct variable too: 'settings.n')
        and integer literals.  (expr, None) or (None, error)."""
        count = str(count).strip()
        if count.isdigit():
            return count, None
        members = {m.name for m in struct.members if m.name} if struct is not None else set()
        out, pos, prev = [], 0, None
        while pos < len(count):
            m = self._COUNT_TOK.match(count, pos)
            if m is None:
                return None, "MOLT_PTRARRAY(%s) on %s: cannot read '%s'" % (count, what, count[pos:])
            pos = m.end()
            tok = m.group(0)
            if m.group("id"):
                if prev in (".", "->"):
                    out.append(tok)             # a member of what came before
                elif tok in members:
                    out.append("in->" + tok)
                else:
                    vs = self.old.find_var(tok)
                    if len(vs) != 1:
                        return None, ("MOLT_PTRARRAY(%s) on %s: '%s' is %s" % (
                            count, what, tok, "ambiguous (statics of several files)" if vs else
                            ("neither a field of %s nor a variable of the old version" % describe(struct)
                             if struct is not None else "no variable of the old version")))
                    v = vs[0]
                    self.od.need(v.type)
                    out.append("(*(%s)%s)" % (self.od.cast_ptr(v.type, True), self._sym("old", v)))
                prev = "id"
            elif m.group("num") or m.group("op"):
                out.append(tok)
                prev = tok if m.group("op") else "num"
        if not out:
            return None, "MOLT_PTRARRAY() on %s: no count" % what
        return "(size_t)(%s)" % " ".join(out), None

    def _union_slots(self, u):
        """The pointer-sized words of union u that hold a pointer in some
        member: [(offset, [(member path, pointer type)])], sorted."""
        cache = getattr(self, "_uslots", None)
        if cache is None:
            cache = self._uslots = {}
        if id(u) in cache:
            return cache[id(u)]
        cache[id(u)] = []      # a union that contains itself through a pointer
        found = []
        self._ptr_slots(u, 0, "", found)
        by_off = {}
        for off, pt, path in found:
            if off % 8 == 0 and off + 8 <= (u.size or 0):
                by_off.setdefault(off, []).append((path.lstrip("."), pt))
        out = sorted(by_off.items())
        cache[id(u)] = out
        return out

    def _union_problems(self, p):
        """Union members that point to a type whose representation
        changed: the pointer cannot be migrated without knowing that it is
        the live member, so the build is refused, naming it."""
        errs = []
        for off, members in self._union_slots(p.old):
            for path, pt in members:
                po = (pt.target or VOID).strip()
                if po.kind not in ("struct", "union") or not po.name or "{" in po.name:
                    continue
                pn = self.new.lookup_type(po.name)
                if pn is None:
                    continue
                pn = pn.strip()
                if pn.kind != po.kind or not pn.complete or not po.complete:
                    continue
                q = self.pair(po, pn)
                if q.changed and p.rule is None:
                    errs.append("%s: member '%s' points to %s, which changed; which member of "
                                "the union is live cannot be decided: add a rule '%s -> %s: "
                                "{ ... }' that migrates it" % (
                                    describe(p.old), path, describe(po), p.old.name,
                                    p.new.name))
        return errs

    def _analyse_struct(self, p):
        ro, rn = p.old, p.new
        om = self._members(ro)
        nm = self._members(rn)
        used = set()
        changed = (ro.size != rn.size) or len(om) != len(nm)
        traverse = False
        nested_changed = False
        for key, mn in nm.items():
            src = key
            fr = self.rules.field_rules.get((rn.name, mn.name)) if mn.name else None
            if fr is not None:
                src = fr[1]
            mo = om.get(src)
            if mo is None:
                changed = True
                p.entries.append((None, mn, None, key))
                if mn.name:
                    p.diffs.append("field '%s' added" % mn.name)
                continue
            used.add(src)
            mp = self._member_pair(ro, mo, rn, mn, p.binding)
            p.entries.append((mo, mn, mp, key))
            if mp.traverse:
                traverse = True
            if mp.changed:
                changed = True
            if mo.offset != mn.offset or mo.bit_offset != mn.bit_offset or src != key:
                changed = True
            d = self._field_diff(mo, mn, mp, key)
            if d:
                p.diffs.append(d)
            elif mp.changed and mp.kind in ("struct", "union", "array", "rule"):
                nested_changed = True
        for key, mo in om.items():
            if key not in used:
                changed = True
                p.diffs.append("field '%s' removed" % (mo.name or key))
        if changed and not p.diffs and not nested_changed:
            p.diffs.append("layout changed (fields moved)")
        if p.kind == "union" and changed and not p.diffs:
            p.diffs.append("layout changed")
        p.changed = changed
        if p.kind == "struct":
            p.traverse = traverse
        else:
            # A union with a pointer in some member: which member is live is
            # unknown, so the words that hold a pointer in any member are
            # redirected untyped (functions and variables of the old image
            # by name, migrated objects through the map), see _union_slots.
            p.traverse = bool(self._union_slots(ro))

    def _member_pair(self, so, mo, sn, mn, binding):
        anns = self.oa.field(so.name, mo.name) if mo.name else []
        if not anns and mn.name:
            anns = self.na.field(sn.name, mn.name)
        ptr_ann = None
        if mo.type.strip().kind == "pointer":
            ptr_ann = (bool(_ann_get(anns, "molt_opaque")), None, None)
        return self.pair(mo.type, mn.type, binding, ptr_ann)

    def _field_diff(self, mo, mn, mp, key):
        nm = mn.name or key
        if mo.is_bitfield != mn.is_bitfield or (mo.bit_size != mn.bit_size):
            return "field '%s' %s%s -> %s%s" % (
                nm, describe(mo.type), ":%d" % mo.bit_size if mo.bit_size else "",
                describe(mn.type), ":%d" % mn.bit_size if mn.bit_size else "")
        d = self._type_diff(mo.type, mn.type, mp)
        if d:
            return "field '%s' %s" % (nm, d)
        return None

    def _type_diff(self, to, tn, p):
        """'A -> B' when the value's own representation changed (not when a
        struct it contains changed: that struct reports itself)."""
        if p.kind == "incompatible" or (p.kind == "arith" and p.changed and not p.diffs):
            return "%s -> %s" % (describe(to), describe(tn))
        if p.kind == "array":
            ro, rn = to.strip(), tn.strip()
            if ro.count() != rn.count() or ro.dims[1:] != rn.dims[1:] or \
                    (p.elem.kind == "arith" and p.elem.changed):
                return "%s -> %s" % (describe(to), describe(tn))
        if p.kind == "pointer":
            po, pn = to.strip().target.strip(), tn.strip().target.strip()
            if not self._pointee_compatible(po, pn):
                return "%s -> %s" % (describe(to), describe(tn))
        return None

    def _pointee_compatible(self, po, pn):
        if po.kind != pn.kind:
            return po.kind in ARITH and pn.kind in ARITH
        if po.kind in ("struct", "union", "enum"):
            return po.name == pn.name or self.rules.type_rule(po, pn) is not None or \
                ("{" in po.name and "{" in pn.name)
        if po.kind == "base":
            return same_arith(po, pn)
        if po.kind == "pointer":
            return self._pointee_compatible(po.target.strip(), pn.target.strip())
        if po.kind == "array":
            return po.dims == pn.dims and self._pointee_compatible(po.element(), pn.element())
        return True

    # -- pointees --------------------------------------------------------------------
    def pointee(self, to, tn, anns, binding):
        """(pair or None, count literal or field name) for a pointer of type
        to -> tn with annotations anns (of the old side)."""
        count = _ann_get(anns, "molt_ptrarray")
        if count is True:
            count = None
        if _ann_get(anns, "molt_opaque"):
            return None, count, True
        po = (to.strip().target or VOID)
        pn = (tn.strip().target or VOID)
        so, sn = po.strip(), pn.strip()
        if so.kind == "func" or sn.kind == "func":
            return None, count, False
        if so.kind == "void" or sn.kind == "void":
            var = _ann_get(anns, "molt_var")
            if var and var is not True:
                for v, a, b in binding:
                    if v == var:
                        return self.pair(a, b, ()), count, False
            return None, count, False
        if not self._pointee_compatible(so, sn):
            return None, count, False
        if so.kind in ("struct", "union") and (not so.complete or not sn.complete):
            return None, count, False
        if so.kind == "base" and so.size == 1 and sn.kind == "base" and sn.size == 1:
            return None, count, False          # strings and bytes
        if so.kind in ARITH and sn.kind in ARITH and same_arith(so, sn):
            return None, count, False
        b2 = ()
        inst = _ann_get(anns, "molt_inst")
        if inst and inst is not True and so.kind == "struct":
            fa = self.oa.forall(so.name)
            if fa:
                bound = None
                for v, a, b in binding:
                    if v == inst:
                        bound = (a, b)
                if bound is None:
                    a = self.old.lookup_type(inst)
                    b = self.new.lookup_type(inst)
                    if a is None or b is None:
                        self.errors.append("MOLT_INST(%s): no type '%s' in the %s version" % (
                            inst, inst, "old" if a is None else "new"))
                        return None, count, False
                    bound = (a, b)
                b2 = ((fa[0], bound[0], bound[1]),)
        return self.pair(po, pn, b2), count, False

    # -- reachability and completeness ----------------------------------------------
    def expand(self, p, seen, found, var_ann=None):
        """Visits every pair reachable from p; found collects uncovered pairs
        with differences."""
        if id(p) in seen:
            return
        seen.add(id(p))
        if p.diffs and p.kind != "rule" and p.rule is None and not self.rules.covers_struct(p.new.name):
            found.append(p)
        if p.kind in ("struct",):
            covered = p not in found
            for mo, mn, mp, key in p.entries:
                if mp is None:
                    continue
                if covered and mp.kind == "incompatible" and mn.name and \
                        (p.new.name, mn.name) not in self.rules.init_fields and \
                        (self.rules.field_rules.get((p.new.name, mn.name), (0, 0, None))[2] is None
                         or self.rules.field_rules[(p.new.name, mn.name)][2].body is None):
                    self.errors.append("%s: field '%s' %s -> %s cannot be converted; add a field "
                                       "rule with a body ('%s.%s -> %s.%s: { ... }') or an INIT rule"
                                       % (describe(p.new), mn.name, describe(mo.type),
                                          describe(mn.type), p.old.name, mo.name, p.new.name,
                                          mn.name))
                if mp.kind == "pointer":
                    anns = self.oa.field(p.old.name, mo.name) if mo.name else []
                    if not anns and mn.name:
                        anns = self.na.field(p.new.name, mn.name)
                    pp, count, _ = self.pointee(mo.type, mn.type, anns, p.binding)
                    what = "%s.%s" % (p.old.name, mo.name)
                    if count is not None:
                        _, err = self.count_expr(count, p.old, what)
                        if err:
                            self.errors.append(err)
                    else:
                        self._check_extent(mo.type, pp, anns, what)
                    if pp is not None:
                        self.expand(pp, seen, found)
                else:
                    self.expand(mp, seen, found)
        elif p.kind == "union":
            self.errors.extend(self._union_problems(p))
            for mo, mn, mp, key in p.entries:
                if mp is not None and mp.kind != "pointer":
                    self.expand(mp, seen, found)
        elif p.kind == "array":
            self.expand(p.elem, seen, found)
        elif p.kind == "pointer":
            pp, _, _ = self.pointee(p.old, p.new, list(var_ann or []) + self._ptr_ann_list(p), p.binding)
            if pp is not None:
                self.expand(pp, seen, found)

    def _check_extent(self, t, pp, anns, what):
        """A pointer to pointers to a type whose representation changed,
        without MOLT_PTRARRAY: if it addresses an array (a hash table's
        buckets, a table of connections), only its first element would be
        migrated and the rest left pointing to old objects that are freed.
        Its extent is unknown, so the build is refused, naming it."""
        if pp is None or pp.kind != "pointer" or _ann_get(anns, "molt_opaque"):
            return
        inner = (pp.old.target or VOID).strip()
        inner_n = (pp.new.target or VOID).strip()
        if inner.kind not in ("struct", "union") or inner_n.kind != inner.kind:
            return
        if not inner.complete or not inner_n.complete:
            return
        q = self.pair(inner, inner_n)
        if q.changed:
            self.errors.append(
                "%s (%s) points to pointers to %s, which changed, and its extent is unknown: "
                "if it is an array only its first element would be migrated; annotate it "
                "MOLT_PTRARRAY(count) (an expression over fields and variables), or "
                "MOLT_PTRARRAY(1) for a single pointer" % (what, describe(t), describe(inner)))

    def _ptr_ann_list(self, p):
        out = []
        if p.ptr_ann:
            if p.ptr_ann[0]:
                out.append("molt_opaque")
            if p.ptr_ann[1]:
                out.append("molt_ptrarray:%s" % p.ptr_ann[1])
            if p.ptr_ann[2]:
                out.append("molt_inst:%s" % p.ptr_ann[2])
        return out

    # -- variables ---------------------------------------------------------------------
    def plan(self):
        r = self.rules
        roots = []       # (new var, old var or None, pair or None, count, rule)
        missing = []
        problems = []
        for vn in self.new.variables:
            if vn.name.startswith("molt__") or vn.name.startswith("__") or vn.tu == GEN_NAME:
                continue
            if vn.type.is_const():
                continue
            anns_n = self.na.var(vn.name, None if vn.external else vn.tu)
            if _ann_get(anns_n, "molt_no_migrate"):
                if vn in r.init_vars:
                    roots.append((vn, None, None, 0, ("init",) + r.init_vars[vn]))
                continue
            rule = r.var_rules.get(vn)
            if rule is not None:
                vo = rule[2]
            else:
                cands = [v for v in self.old.variables if v.name == vn.name and
                         v.external == vn.external and (vn.external or v.tu == vn.tu)]
                if not cands:
                    cands = [v for v in self.old.variables if v.name == vn.name and v.tu == vn.tu]
                vo = cands[0] if cands else None
            if vo is None:
                if vn in r.init_vars:
                    roots.append((vn, None, None, 0, ("init",) + r.init_vars[vn]))
                continue
            anns_o = self.oa.var(vo.name, None if vo.external else vo.tu) or anns_n
            to, tn = vo.type, vn.type
            ro, rn = to.strip(), tn.strip()
            count = 1
            if ro.kind == "array" and rn.kind == "array" and ro.dims[1:] == rn.dims[1:] \
                    and ro.count() is not None and rn.count() is not None:
                p = self.pair(ro.element(), rn.element(), self._inst_binding(anns_o, ro.element()),
                              self._var_ptr_ann(anns_o, ro.element()))
                count = min(ro.count(), rn.count())
                vdiff = None
                if ro.count() != rn.count():
                    vdiff = "type %s -> %s" % (describe(to), describe(tn))
                else:
                    d = self._type_diff(ro.element(), rn.element(), p)
                    vdiff = ("type %s -> %s" % (describe(to), describe(tn))) if d else None
            else:
                p = self.pair(to, tn, self._inst_binding(anns_o, ro),
                              self._var_ptr_ann(anns_o, ro))
                d = self._type_diff(to, tn, p)
                vdiff = ("type %s" % d) if d else None
            if rule is not None and rule[0].body is not None:
                roots.append((vn, vo, p, count, ("var",) + rule[:2]))
                continue
            if p.kind == "pointer" and _ann_get(anns_o, "molt_ptrarray") is None:
                pp, _, _ = self.pointee(p.old, p.new, list(anns_o or []) + self._ptr_ann_list(p),
                                        p.binding)
                self._check_extent(vo.type, pp, anns_o, "variable '%s'" % vo.name)
            seen, found = set(), []
            self.expand(p, seen, found, anns_o)
            lines = []
            if vdiff and ((rule is None and p.rule is None) or p.kind == "incompatible"):
                lines.append(vdiff + ("" if rule is None else
                                      " (a rule without a body cannot convert it)"))
            for q in found:
                lines.append("%s changed: %s" % (describe(q.new) if q.old.name == q.new.name
                                                 else q.name, "; ".join(q.diffs)))
            if lines:
                problems.append("  %s: variable '%s' (%s): %s" % (
                    vn.tu, vn.name, describe(tn), "; ".join(lines)))
            if p.kind == "incompatible" and (rule is None or rule[0].body is None) and p.rule is None:
                pass        # reported above through vdiff
            roots.append((vn, vo, p, count, ("default", rule)))
        self.roots = roots
        self.problems = problems

    def _var_ptr_ann(self, anns, t):
        if t.strip().kind != "pointer":
            return None
        c = _ann_get(anns, "molt_ptrarray")
        if c is not None and c is not True and not str(c).isdigit():
            _, err = self.count_expr(c, None, "a variable")
            if err:
                self.errors.append(err)
                c = None
        inst = _ann_get(anns, "molt_inst")
        return (bool(_ann_get(anns, "molt_opaque")), c if c is not True else None,
                inst if inst is not True else None)

    def _inst_binding(self, anns, t):
        inst = _ann_get(anns, "molt_inst")
        s = t.strip()
        while s.kind in ("pointer", "array"):
            s = (s.target or VOID).strip()
        if not inst or inst is True or s.kind != "struct":
            return ()
        fa = self.oa.forall(s.name)
        if not fa:
            return ()
        a, b = self.old.lookup_type(inst), self.new.lookup_type(inst)
        if a is None or b is None:
            self.errors.append("MOLT_INST(%s): no type '%s' in the %s version" % (
                inst, inst, "old" if a is None else "new"))
            return ()
        return ((fa[0], a, b),)

    def plan_locals(self):
        self.local_roots = []
        old_sites = {(l["func"], l["var"]) for l in self.oa.locals}
        for site in self.na.locals:
            key = (site["func"], site["var"])
            lo = self.old.locals.get(key)
            ln = self.new.locals.get(key)
            if not lo or not ln:
                continue
            if key not in old_sites and self.old.annotations is not None:
                continue
            p = self.pair(lo[0].type, ln[0].type)
            seen, found = set(), []
            self.expand(p, seen, found)
            lines = []
            if p.kind == "incompatible":
                # arithmetic changes are converted; there is no rule syntax for locals
                lines.append("type %s -> %s" % (describe(lo[0].type), describe(ln[0].type)))
            for q in found:
                lines.append("%s changed: %s" % (describe(q.new), "; ".join(q.diffs)))
            if lines:
                self.problems.append("  %s: local '%s' of %s() (%s): %s" % (
                    site.get("file", "?"), key[1], key[0], describe(ln[0].type), "; ".join(lines)))
            self.local_roots.append((key, p))

    # -- code ----------------------------------------------------------------------------
    def generate(self):
        if self.rules.errors:
            raise XfgenError(self.rules.errors, located=True)
        self.plan()
        self.plan_locals()
        for v in self.new.func_statics:
            if not v.name.startswith("__"):
                self.notes.append("not migrated (function-scope static, keeps its initializer): "
                                  "%s: %s(): '%s'" % (v.tu, v.func, v.name))
        for v in self.new.tls:
            self.notes.append("not migrated (thread-local, keeps its initializer): %s: '%s'"
                              % (v.tu, v.name))
        if self.errors:
            raise XfgenError(sorted(set(self.errors)), notes=self.notes)
        if self.problems:
            raise XfgenError(
                ["the state of %s cannot be migrated from %s without transformers:" % (
                    _short(self.new_name), _short(self.old_name))] + self.problems +
                ["  add a rule such as 'struct T -> struct T' (fields copied by name), INIT rules "
                 "for the new fields, or a variable rule"], notes=self.notes)
        self.code_errors = []
        self.tracking = self
        for p in self.order:
            p.gen = self
        mig = self._migrate()
        # pair functions use more pairs (members, pointees, $xform): loop
        fns = []
        i = 0
        while i < len(self.emit):
            p = self.emit[i]
            i += 1
            fns.append(self._pair_code(p))
        if self.code_errors:
            raise XfgenError(self.code_errors, located=True)
        nn = {}
        for t in self.nd.enums:
            for n, _ in t.enumerators:
                nn[n] = nn.get(n, 0) + 1
        plain = {n for n, c in nn.items() if c == 1}
        head = [
            "#include <stddef.h>",
            "#include <stdint.h>",
            "#include <stdio.h>",
            "#include <stdlib.h>",
            "#include <string.h>",
            "#include <molt.h>",
            "#include <molt/program.h>",
            "",
            "/* Migration code generated by moltcc from %s (old) to %s (new). */" % (
                _short(self.old_name), _short(self.new_name)),
            "#define MOLT_XF_INVOKE(xf, in, out) molt_xf_invoke(cx, (xf), (in), (out))",
            "#define XF_INVOKE MOLT_XF_INVOKE",
            "#define MOLT_XF_PTR(p, xf) molt__xf_ptr(cx, (p), (xf), 1)",
            "#define MOLT_XF_FREE_OLD(p) molt__xf_free_old(cx, (p))",
            "#define MOLT_XF_STORE(slot, v) molt__xf_store_old(cx, (slot), (v))",
            "/* Memory a rule body allocates is the migration's until the update commits:",
            " * an abort frees it.  free() of old data waits for the commit. */",
            "#undef malloc",
            "#undef calloc",
            "#undef realloc",
            "#undef strdup",
            "#undef strndup",
            "#undef free",
            "#define malloc(n) molt__xf_malloc(cx, (n))",
            "#define calloc(n, size) molt__xf_calloc(cx, (n), (size))",
            "#define realloc(p, n) molt__xf_realloc(cx, (p), (n))",
            "#define strdup(s) molt__xf_strdup(cx, (s))",
            "#define strndup(s, n) molt__xf_strndup(cx, (s), (n))",
            "#define free(p) molt__xf_free(cx, (p))",
            "",
        ]
        head += self.od.emit(set())
        head.append("")
        head += self.nd.emit(plain)
        head.append("")
        head += [
            "/* Helpers. */",
            "__attribute__((unused)) static void *molt_xf_ld(const void *slot)",
            "{",
            "    void *v;",
            "    memcpy(&v, slot, sizeof v);",
            "    return v;",
            "}",
            "__attribute__((unused)) static void molt_xf_st(void *slot, void *v)",
            "{",
            "    memcpy(slot, &v, sizeof v);",
            "}",
            "/* Stores a redirected pointer: in place (undo-logged) when the object is",
            " * fixed where it is, directly into a new object otherwise. */",
            "__attribute__((unused)) static void molt_xf_store(molt__xf_ctx *cx, const void *in, "
            "void *out, void *slot, void *v)",
            "{",
            "    if (in == (const void *)out)",
            "        molt__xf_setp(cx, slot, v);",
            "    else",
            "        memcpy(slot, &v, sizeof v);",
            "}",
            "__attribute__((unused)) static void molt_xf_invoke(molt__xf_ctx *cx, "
            "const molt__xf_type *t, const void *in, void *out)",
            "{",
            "    if (!(t->flags & MOLT__XF_CHANGED) && in != (const void *)out)",
            "        memcpy(out, in, t->old_size < t->new_size ? t->old_size : t->new_size);",
            "    if (t->fn)",
            "        t->fn(cx, in, out);",
            "}",
            "",
            "/* One descriptor per (old type, new type) pair. */",
        ]
        for p in self.emit:
            if p.has_fn():
                head.append("static void %s(molt__xf_ctx *cx, const void *in_, void *out_);" % p.fn_name)
        for p in self.emit:
            head.append("static const molt__xf_type %s;" % p.c_name)
        out = head + [""]
        for lines in fns:
            out += lines
        out += mig
        return Result("\n".join(out) + "\n", self.notes)

    def _desc(self, p):
        flags = []
        if p.changed or p.kind == "rule":
            flags.append("MOLT__XF_CHANGED")
        if p.traverse:
            flags.append("MOLT__XF_TRAVERSE")
        so = p.old.size if p.old.kind != "void" else 0
        sn = p.new.size if p.new.kind != "void" else 0
        return "__attribute__((unused)) static const molt__xf_type %s = {\"%s\", %d, %d, %s, %s};" % (
            p.c_name, _cstr(p.name), so or 0, sn or 0, p.fn_name if p.has_fn() else "NULL",
            " | ".join(flags) if flags else "0")

    def _pair_code(self, p):
        lines = ["/* %s: %s%s */" % (p.name, "changed" if p.changed else "unchanged",
                                    ", with pointers" if p.traverse else "")]
        if p.has_fn():
            lines += self._fn(p)
        lines.append(self._desc(p))
        lines.append("")
        return lines

    def _unit(self, t):
        t = t.strip()
        return t.element() if t.kind == "array" else t

    def _fn(self, p):
        od, nd = self.od, self.nd
        L = ["static void %s(molt__xf_ctx *cx, const void *in_, void *out_)" % p.fn_name, "{"]
        uo, un = self._unit(p.old), self._unit(p.new)
        if p.kind == "rule":
            if p.old.kind == "array" or p.new.kind == "array":
                L.append("    %s = (%s)(void *)(size_t)in_;" % (od.decl(ptr_to(p.old), "in"), od.cast_ptr(p.old)))
            else:
                L.append("    %s = (%s)in_;" % (od.decl(p.old, "const *in"), od.cast_ptr(p.old, True)))
            L.append("    %s = (%s)out_;" % (nd.decl(ptr_to(p.new), "out"), nd.cast_ptr(p.new)))
            L.append("    (void)cx; (void)in; (void)out;")
            rule, path = p.rule
            L += self._body(rule, path, {"in": "(*in)", "out": "(*out)"}, "type rule")
            L.append("}")
            return L
        L.append("    %s = (%s)in_;" % (od.decl(uo, "const *in"), od.cast_ptr(uo, True)))
        L.append("    %s = (%s)out_;" % (nd.decl(un, "*out"), nd.cast_ptr(un)))
        L.append("    (void)cx; (void)in; (void)out;")
        body = []
        if p.kind == "arith":
            body.append("*out = *in;")
        elif p.kind == "array":
            n = min(p.old.count() or 0, p.new.count() or 0)
            body.append("for (size_t i = 0; i < %d; i++) {" % n)
            body += ["    " + s for s in self._conv("in[i]", "out[i]", p.elem, [], None, None, p.changed)]
            body.append("}")
        elif p.kind == "pointer":
            body += self._ptr_store("*in", "*out", p.old, p.new, self._ptr_ann_list(p), p.binding,
                                    None, p.changed, slot="out")
        elif p.kind in ("struct", "union"):
            body += self._struct_body(p)
        elif p.kind == "incompatible":
            body.append("/* %s: not convertible; a rule is needed */" % p.name)
        L += ["    " + s for s in body]
        L.append("}")
        return L

    def _struct_body(self, p):
        out = []
        if p.kind == "union":
            if p.changed:
                n = min(p.old.size or 0, p.new.size or 0)
                out.append("/* a union is copied as bytes (the active member is unknown) */")
                out.append("memcpy(out, in, %d);" % n)
            new_offs = {off for off, _ in self._union_slots(p.new)}
            for off, members in self._union_slots(p.old):
                if p.changed and off not in new_offs:
                    continue
                field = "%s.%s" % (p.old.name, "|".join(sorted({m for m, _ in members})))
                out.append("/* +%d: a pointer in %s: redirected untyped (function pointers "
                           "by name) */" % (off, ", ".join(sorted({m for m, _ in members}))))
                out.append("molt_xf_store(cx, in_, out_, (char *)out + %d, molt__xf_fptr(cx, "
                           "molt_xf_ld((const char *)in + %d), NULL, 1, \"%s\"));" % (
                               off, off, _cstr(field)))
            return out
        fresh = p.changed
        for mo, mn, mp, key in p.entries:
            nn = mn.name or self._anon_name(p.new, mn)
            init = self.rules.init_fields.get((p.new.name, mn.name)) if mn.name else None
            fr = self.rules.field_rules.get((p.new.name, mn.name)) if mn.name else None
            if fresh and init is not None:
                out.append("/* field %s: INIT rule */" % nn)
                out += self._body(init[0], init[1], {"out": "(out->%s)" % nn, "base": "(*in)"},
                                  "INIT rule")
                continue
            if mo is None:
                if fresh:
                    out.append("/* field %s: new, left zero (or the variable's initializer) */" % nn)
                continue
            on = mo.name or self._anon_name(p.old, mo)
            if fresh and fr is not None and fr[2].body is not None:
                out.append("/* field %s <- %s: field rule */" % (nn, on))
                out += self._body(fr[2], fr[3], {"in": "(in->%s)" % on, "out": "(out->%s)" % nn,
                                                 "base": "(*in)"}, "field rule")
                continue
            if not fresh and not mp.traverse:
                continue
            anns = self.oa.field(p.old.name, mo.name) if mo.name else []
            if not anns and mn.name:
                anns = self.na.field(p.new.name, mn.name)
            if fresh:
                do_, dn_ = describe(mo.type), describe(mn.type)
                out.append("/* field %s%s: %s */" % (nn, "" if on == nn else " <- " + on,
                                                     do_ if do_ == dn_ else do_ + " -> " + dn_))
            if mp.kind == "incompatible":
                out.append("/* not convertible: left zero */")
                continue
            out += self._conv("in->%s" % on, "out->%s" % nn, mp, anns, p, mo, fresh,
                              bitfield=mo.is_bitfield or mn.is_bitfield)
        ti = self.rules.init_types.get(p.new.name)
        if fresh and ti is not None:
            out.append("/* INIT rule of %s */" % describe(p.new))
            out += self._body(ti[0], ti[1], {"out": "(*out)"}, "INIT rule")
        return out

    def _anon_name(self, t, m):
        i = 0
        for x in t.members:
            if x.name is None:
                if x is m:
                    return "molt_anon%d" % i
                i += 1
        return "molt_anon?"

    def _conv(self, src, dst, p, anns, parent, mo, fresh, bitfield=False):
        """Statements converting the old value `src` into `dst`.  fresh: dst
        is in a new object (the bytes were not copied)."""
        if p.kind == "arith":
            return ["%s = %s;" % (dst, src)] if fresh else []
        if p.kind == "opaque":
            return ["memcpy(&%s, &%s, sizeof %s);" % (dst, src, dst)] if fresh else []
        if p.kind == "pointer":
            field = None
            if parent is not None and mo is not None and mo.name:
                field = "%s.%s" % (parent.old.name, mo.name)
            return self._ptr_store(src, dst, p.old, p.new, anns, parent.binding if parent else (),
                                   parent, fresh, field=field)
        if p.kind in ("struct", "union", "rule"):
            if p.changed or p.kind == "rule":
                return ["%s(cx, &%s, &%s);" % (p.fn_name, src, dst)]
            out = []
            if fresh:
                out.append("memcpy(&%s, &%s, sizeof %s);" % (dst, src, dst))
            if p.traverse:
                out.append("%s(cx, &%s, &%s);" % (p.fn_name, src, dst))
            return out
        if p.kind == "array":
            if not p.changed and not p.traverse:
                return ["memcpy(&%s, &%s, sizeof %s);" % (dst, src, dst)] if fresh else []
            n = min(p.old.count() or 0, p.new.count() or 0)
            eo, en = p.old.element(), p.new.element()
            idx = "i%d" % (len(src) % 97)
            so = "((%s)(const void *)&%s)[%s]" % (self.od.cast_ptr(eo, True), src, idx)
            sn = "((%s)(void *)&%s)[%s]" % (self.nd.cast_ptr(en), dst, idx)
            inner = self._conv(so, sn, p.elem, anns if p.elem.kind == "pointer" else [], parent,
                               mo, fresh)
            if not inner:
                return []
            return ["for (size_t %s = 0; %s < %d; %s++) {" % (idx, idx, n, idx)] + \
                ["    " + s for s in inner] + ["}"]
        return ["/* %s: not converted */" % p.name]

    def _ptr_store(self, src, dst, to, tn, anns, binding, parent, fresh, slot=None, field=None):
        pp, count, opaque = self.pointee(to, tn, anns, binding)
        fnptr = (to.strip().target or VOID).strip().kind == "func"
        if opaque:
            if fresh:
                return ["memcpy(&%s, &%s, sizeof %s);" % (dst, src, dst)]
            return []
        cnt = "1"
        if count is not None:
            expr, err = self.count_expr(count, parent.old if parent is not None else None,
                                        field or "a variable")
            if err:
                self.code_errors.append("moltcc: error: " + err)
            else:
                cnt = expr
        t = "&%s" % pp.c_name if pp is not None else "NULL"
        if field is not None:
            # the field is named in messages about a pointer that is not followed
            val = "molt__xf_fptr(cx, molt_xf_ld(&%s), %s, %s, \"%s\")" % (src, t, cnt, _cstr(field))
        else:
            val = "molt__xf_ptr(cx, molt_xf_ld(&%s), %s, %s)" % (src, t, cnt)
        if fresh:
            return ["molt_xf_st(&%s, %s);" % (dst, val)]
        target = slot if slot is not None else "&%s" % dst
        return ["molt_xf_store(cx, in_, out_, %s, %s);" % (target, val)]

    # -- rule bodies ---------------------------------------------------------------------
    def _body(self, rule, path, subst, what):
        """The rule's body with its specials substituted, between #line
        directives so that compiler errors point into the .xf file."""
        text = rule.body or ""
        try:
            specials = xf.scan_specials(rule, path)
        except Exception as e:      # XfError
            self.code_errors.append(str(e))
            return []
        for sp in sorted(specials, key=lambda s: s.start, reverse=True):
            rep = self._special(sp, subst, path, what)
            if rep is None:
                continue
            text = text[:sp.start] + rep + text[sp.end:]
        out = ["{", '#line %d "%s"' % (rule.body_line, path)]
        first = " " * max(0, rule.body_col - 1)
        out.append(first + text)
        out.append(RESYNC)
        out.append("}")
        return out

    def _special(self, sp, subst, path, what):
        def err(msg):
            self.code_errors.append("%s:%d:%d: error: %s" % (path, sp.line, sp.col, msg))
            return None
        n = sp.name
        if n in ("in", "out", "base"):
            if n not in subst:
                return err("$%s is not available in a %s" % (n, what))
            return subst[n]
        if n in ("oldsym", "newsym"):
            if len(sp.args) != 1:
                return err("$%s takes one variable name" % n)
            a = sp.args[0].strip()
            name, _, tu = a.partition("@")
            im = self.old if n == "oldsym" else self.new
            d = self.od if n == "oldsym" else self.nd
            vs = im.find_var(name, tu or None)
            if not vs:
                return err("no variable '%s' in the %s version" % (a, "old" if n == "oldsym" else "new"))
            if len(vs) > 1:
                return err("'%s' is ambiguous: write name@file.c" % a)
            v = vs[0]
            d.need(v.type)
            return "(*(%s)molt__xf_%s(cx, \"%s\", %s))" % (
                d.cast_ptr(v.type), n, v.name, "NULL" if v.external else '"%s"' % v.tu)
        if n in ("oldtype", "newtype"):
            if len(sp.args) != 1:
                return err("$%s takes one type" % n)
            d = self.od if n == "oldtype" else self.nd
            c = d.type_c(sp.args[0].strip())
            if c is None:
                return err("no type '%s' in the %s version" % (sp.args[0].strip(),
                                                               "old" if n == "oldtype" else "new"))
            return c
        if n == "xform":
            if len(sp.args) != 2:
                return err("$xform takes two types: $xform(old type, new type)")
            a = self.old.lookup_type(sp.args[0].strip())
            b = self.new.lookup_type(sp.args[1].strip())
            if a is None:
                return err("no type '%s' in the old version" % sp.args[0].strip())
            if b is None:
                return err("no type '%s' in the new version" % sp.args[1].strip())
            p = self.pair(a, b)
            return "(&%s)" % p.c_name
        return err("unknown special $%s" % n)

    # -- migrate() -------------------------------------------------------------------------
    def _sym(self, which, v):
        return "molt__xf_%ssym(cx, \"%s\", %s)" % (which, v.name, "NULL" if v.external
                                                  else '"%s"' % v.tu)

    def _migrate(self):
        self.code_errors = getattr(self, "code_errors", [])
        L = ["/* ---- migrate ---- */", "static void migrate(molt__xf_ctx *cx)", "{"]
        later = []
        inits = []
        for vn, vo, p, count, how in self.roots:
            if how[0] == "init":
                inits.append((vn, how[1], how[2]))
                continue
            if how[0] == "var":
                rule, path = how[1], how[2]
                later.append((vn, vo, p, count, rule, path))
                continue
            L.append("    /* %s: %s (%s)%s */" % (vn.tu, vn.name, describe(vn.type),
                                                  "" if vo.name == vn.name else " <- " + vo.name))
            L.append("    molt__xf_var(cx, %s,\n                 %s, &%s, %d);" % (
                self._sym("old", vo), self._sym("new", vn), p.c_name, count))
        for vn, vo, p, count, rule, path in later:
            self.od.need(vo.type)
            self.nd.need(vn.type)
            L.append("    /* %s: %s <- %s: variable rule */" % (vn.tu, vn.name, vo.name))
            L.append("    {")
            L.append("        %s = %s;" % (self.od.decl(ptr_to(vo.type), "molt_in"), self._sym("old", vo)))
            L.append("        %s = %s;" % (self.nd.decl(ptr_to(vn.type), "molt_out"), self._sym("new", vn)))
            if p is not None and p.kind != "incompatible":
                L.append("        molt__xf_map_var(cx, molt_in, molt_out, &%s, %d);" % (p.c_name, count))
            L.append("        molt__xf_rule(cx, \"%s\");" % _cstr(
                "variable rule %s -> %s (%s)" % (vo.name, vn.name, vn.tu)))
            L += ["        " + s if not s.startswith("#") else s
                  for s in self._body(rule, path, {"in": "(*molt_in)", "out": "(*molt_out)"},
                                      "variable rule")]
            L.append("        molt__xf_rule(cx, NULL);")
            L.append("    }")
        for key, p in self.local_roots:
            L.append("    molt__xf_local(cx, \"%s\", \"%s\", &%s);" % (key[0], key[1], p.c_name))
        L.append("    molt__xf_run(cx);")
        for vn, rule, path in inits:
            self.nd.need(vn.type)
            L.append("    /* %s: %s: INIT rule */" % (vn.tu, vn.name))
            L.append("    {")
            L.append("        %s = %s;" % (self.nd.decl(ptr_to(vn.type), "molt_out"), self._sym("new", vn)))
            L.append("        molt__xf_rule(cx, \"%s\");" % _cstr("INIT rule for %s (%s)" % (vn.name, vn.tu)))
            L += ["        " + s if not s.startswith("#") else s
                  for s in self._body(rule, path, {"out": "(*molt_out)"}, "INIT rule")]
            L.append("        molt__xf_rule(cx, NULL);")
            L.append("    }")
        if inits:
            L.append("    molt__xf_run(cx);")
        L.append("}")
        return L


def _cstr(s):
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _short(p):
    import os
    b = os.path.basename(p)
    return b[:-3] if b.endswith(".so") else b


def generate(old, new, rules, old_name="old", new_name="new"):
    """rules: [(Rule, xf path)].  Returns a Result (code, notes) or raises
    XfgenError."""
    return Generator(old, new, rules, old_name, new_name).generate()
