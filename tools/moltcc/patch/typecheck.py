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

The debug information of both builds is read by moltcc.dwarf
(load_debug); decl_locations and DebugError are dwarf's too.
"""
from ..dwarf import DebugError, decl_locations, load_debug

__all__ = ["check_types", "decl_locations", "load_debug", "DebugError", "TypeCheck", "Refusal",
           "WAY_FORWARD"]

WAY_FORWARD = ("a hot patch keeps every live object as it is: carry an added field as shadow "
               "data (docs/guide.md, \"Shadow data\"), or change layouts and initial values "
               "with a full update (molt update)")


# ---------------------------------------------------------------------------
# Types in messages
# ---------------------------------------------------------------------------

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
        return t.name[len("typedef "):]
    if k in ("const", "volatile", "restrict", "atomic"):
        inner = t.target
        if inner is not None and inner.kind == "array":
            # C qualifies an array's elements, not the array; DWARF often
            # says it twice (on the array and on its element type).
            elem = inner.target
            spelled = (display(elem, depth + 1) if elem is not None and elem.kind == k
                       else _qualified(k, elem, depth + 1))
            return spelled + " " + "".join("[%s]" % ("" if d is None else d) for d in inner.dims)
        return _qualified(k, inner, depth + 1)
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


def _qualified(k, t, depth):
    """t under qualifier k: 'const int', 'char *const'."""
    q = "_Atomic" if k == "atomic" else k
    if t is not None and t.kind == "pointer":
        return display(t, depth) + q
    return q + " " + display(t, depth)


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
    elif k in ("struct", "union", "enum") and "{anon@" in (s.name or ""):
        # An anonymous aggregate with no typedef is named by where its DIE
        # sits in its build, which any change earlier in the file moves:
        # compare it by its layout instead (members, offsets, widths, size;
        # enumerators and their values).
        if k == "enum":
            out = "enum{%s}/%s" % (",".join("%s=%s" % e for e in s.enumerators), s.size)
        else:
            out = "%s{%s}/%s" % (k, ";".join(
                "%s@%s%s:%s" % (m.name or "", m.offset,
                                "/%s+%s" % (m.bit_offset, m.bit_size) if m.is_bitfield else "",
                                sig(m.type, depth + 1)) for m in s.members), s.size)
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
# Reachability: which named types a function or variable reaches
# ---------------------------------------------------------------------------

def _named_refs(t, out, depth=0):
    """The named types t mentions directly (through unnamed pointers, arrays,
    qualifiers, function types; a named type stops the walk)."""
    while t is not None and depth < 32:
        if t.named:
            out.add(t.name)
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


def _type_users(info):
    """({logical function name: the named types its parameters, return value
    and locals mention}, {variable key: the named types its type mentions})
    of one build, without moltcc's generated functions and variables."""
    funcs = {}
    for n, f in info.funcs.items():
        ln = _logical(n)
        if ln is not None:
            funcs.setdefault(ln, set()).update(_func_refs(f))
    variables = {}
    for k, v in info.vars.items():
        if not _is_generated_var(v):
            refs = set()
            _named_refs(v.type, refs)
            variables[k] = refs
    return funcs, variables


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
        return t.name
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

    # live users (orig) and shipped users (new) of every type
    ofuncs, ovars = _type_users(old)
    nfuncs, nvars = _type_users(new)

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
