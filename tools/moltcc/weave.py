"""Source-to-source weaving: program builds and patch builds.

Program build, for every updatable function f (see molt.h, MOLT__FUNCTION):

    static <header of f renamed f__molt_v0>;              version 0, prototype
    static <header of f renamed f__molt_dispatch>;         dispatch path, prototype
    static molt__fn_desc f__molt_desc ... = {...};         section molt_fns
    MOLT__DIAG_PUSH
    MOLT__ENTRY_ATTRS <original header of f> { MOLT__ENTRY_STUB(f__molt_v0); }
    MOLT__DIAG_POP                                         stable entry
    static __attribute__((used)) <header renamed f__molt_dispatch>
    { enter; call table[index]; leave; }                   dispatch path
    #line <original line>
    static <header renamed f__molt_v0> { original body }   version 0

The stable entry f is a naked, 8-byte aligned function whose whole body is
one `jmp rel32`: to version 0 as built (the descriptor's `direct`), and the
runtime rewrites it to f__molt_dispatch (the descriptor's `dispatch`) while
a patch replaces f.  A variadic f cannot jump to its version 0, which takes
a va_list: its entry jumps to f__molt_dispatch and its descriptor's `direct`
is NULL (always dispatch).

f keeps its name, linkage and address (H5); recursive calls and &f inside
the body keep naming f, so they go through the stable entry.  The body is
not moved, and `#line` directives put every generated line on the line of
the function, so diagnostics and debug info point at the user's source.

Patch build, for every function that is updatable in the target:

    static <header renamed f__molt_p> { new body }
    static const molt__patch_fn f__molt_pfn ... = {"f", tu|NULL, &f__molt_p};

and every reference to an object of the running program becomes
`(*(__typeof__(x) *)molt__imp_x)`, where `static void *molt__imp_x` is filled
by the runtime from a molt__import record before the patch is switched in.
"""
import os
import re

import clang.cindex as ci

from .elf import FUNC_SYMTYPES, VAR_SYMTYPES
from .markers import explicitly_marked
from .rewrite import Rewriter
from .unit import CK, SC

def c_string(s):
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 32:
            out.append("\\%03o" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


_IDENT = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
_COMMENT_OR_STRING = re.compile(rb'/\*.*?\*/|//[^\n]*|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'', re.S)
# Identifiers the generated entry, dispatch path and descriptor use outside
# molt__ names (fields, the attribute names of MOLT__SECTION and
# MOLT__ENTRY_ATTRS, the dispatch path's `used`).
WRAPPER_IDENTS = {"table", "index", "used", "section", "aligned", "naked", "noinline"}

# Attributes the stable entry cannot carry: it keeps the user's header and
# becomes a naked function whose body is one `jmp rel32` at its very first
# byte.  (inline, always_inline, naked, ifunc ... are refused earlier, by
# unit.SKIP_IDENTS.)  Like SKIP_IDENTS this looks at every identifier
# of the header, literal or from a macro, parameter names excepted.
NAKED_CONFLICTS = {
    "target_clones": "target_clones function (its entry would be a resolver, not a jump; "
                     "compilers refuse it on a naked function)",
    "patchable_function_entry": "patchable_function_entry (the padding would come before "
                                "the entry's jump)",
    "interrupt": "interrupt handler (compilers refuse it on a naked function)",
    "disable_tail_calls": "disable_tail_calls function (clang refuses it on a naked function)",
}
NAKED_CONFLICTS.update({"__%s__" % k: v for k, v in list(NAKED_CONFLICTS.items())})


def refuse_naked_conflicts(fn):
    """Sets fn.reason when an attribute of f's header cannot go on the naked
    stable entry (see NAKED_CONFLICTS)."""
    if fn.reason is None:
        for ident in sorted(fn.header_idents):
            if ident in NAKED_CONFLICTS:
                fn.reason = NAKED_CONFLICTS[ident]
                return
_molt_h_cache = {}


def molt_h_identifiers(include_dir):
    """Identifiers that molt.h uses and a user macro could clobber."""
    path = os.path.join(include_dir, "molt.h")
    if path not in _molt_h_cache:
        try:
            with open(path, "rb") as f:
                code = _COMMENT_OR_STRING.sub(b" ", f.read())
            ids = set(m.decode() for m in _IDENT.findall(code))
        except OSError:
            ids = set()
        _molt_h_cache[path] = {i for i in ids if not i.startswith(("molt_", "MOLT_"))}
    return _molt_h_cache[path]


class Weaver:
    """What the program weaver and the patch weaver share: one unit, one
    Rewriter over its bytes, the report, and the molt.h names to guard."""

    def __init__(self, unit, include_dir, report):
        self.u = unit
        self.rw = Rewriter(unit.data)
        self.report = report
        self.include_dir = include_dir
        inc = os.path.realpath(os.path.join(include_dir, "molt.h"))
        user = unit.user_macros(exclude_file=inc)
        self.guard = sorted(user & molt_h_identifiers(include_dir))
        self.wrap_guard = sorted(user & WRAPPER_IDENTS)

    # -- text helpers -------------------------------------------------------
    def file_start(self):
        """Where text can be prepended: after a UTF-8 byte order mark."""
        return 3 if self.u.data.startswith(b"\xef\xbb\xbf") else 0

    def linemark(self, line, delta=0):
        """#line for physical line `line` of the user's file (+delta),
        continuing the user's own #line numbering if it has any."""
        name, pline = self.u.presumed(line)
        if name is None:
            name = c_string(self.u.display)[1:-1]
        return '#line %d "%s"\n' % (max(pline + delta, 1), name)

    def resume(self, line, col):
        """Directive + padding so the next original byte is back at its own
        line and column."""
        return "\n" + self.linemark(line) + " " * max(0, col - 1)

    def resume_with_prefix(self, fn, prefix):
        """Back to the function's own line and column; a `static ` that the
        definition needs goes on the line before, so the columns of the
        definition's own line stay what the user sees in their editor."""
        if prefix and self.u.presumed(fn.line)[1] > 1:
            return self.linemark(fn.line, -1) + prefix.strip() + "\n" + " " * (fn.col - 1)
        return self.linemark(fn.line) + " " * (fn.col - 1) + prefix

    def push_guard(self, names=None):
        names = self.guard if names is None else names
        return "".join('#pragma push_macro("%s")\n#undef %s\n' % (n, n) for n in names)

    def pop_guard(self, names=None):
        names = self.guard if names is None else names
        return "".join('#pragma pop_macro("%s")\n' % n for n in names)

    def include_molt(self):
        return self.push_guard() + "#include <molt.h>\n" + self.pop_guard()

    def header_text(self, fn):
        return self.u.text(fn.ext_start, fn.body_start)

    def empty_parens(self, fn):
        """(start, end) of the inside of `()` right after the name of a
        function without parameters, or None.  `T f()` declares no
        prototype; a generated declaration or definition says `(void)`
        instead, the same type for a definition, so that it passes
        -Wstrict-prototypes and -Wmissing-prototypes.  fn.proto cannot tell:
        libclang reports `T f() {...}` as prototyped after `T f(void);`."""
        if fn.args or fn.variadic or fn.body_start is None:
            return None
        toks = self.u.tokens_in(fn.name_off + len(fn.name.encode()), fn.body_start)
        i = 0
        while i < len(toks) and toks[i].spelling == ")":
            i += 1          # a parenthesized name: `T (f)()`
        if i + 1 < len(toks) and toks[i].spelling == "(" and toks[i + 1].spelling == ")":
            return toks[i].end, toks[i + 1].start
        return None

    def header_variant(self, fn, newname, storage=None, valist=False):
        """The header of a plain function with its name replaced, its literal
        storage-class tokens dropped (then `storage` prepended) and, for a
        variadic function, `...` replaced by a va_list parameter."""
        sub = Rewriter(self.u.data[fn.ext_start:fn.body_start])
        base = fn.ext_start
        sub.replace(fn.name_off - base, fn.name_off - base + len(fn.name.encode()), newname)
        ep = self.empty_parens(fn)
        if ep:
            sub.replace(ep[0] - base, ep[1] - base, "void")
        for t in fn.storage_tokens:
            sub.replace(t.start - base, t.end - base, "")
        for s, e in fn.linkage_attrs:
            sub.replace(s - base, e - base, "")
        if valist and fn.ellipsis is not None:
            sub.replace(fn.ellipsis.start - base, fn.ellipsis.end - base,
                        "__builtin_va_list molt__ap")
            for s, e, text in fn.format_fixes:
                sub.replace(s - base, e - base, text)
        text = sub.render().decode("utf-8", "surrogateescape")
        return (storage + " " if storage else "") + text

    def rename_in_place(self, fn, newname, valist=True):
        """Turns the definition itself into `static <newname>(...)`: keeps a
        literal `static`, turns `extern` into `static`, or prepends it."""
        rw = self.rw
        rw.replace(fn.name_off, fn.name_off + len(fn.name.encode()), newname)
        ep = self.empty_parens(fn)
        if ep:
            rw.replace(ep[0], ep[1], "void")
        for s, e in fn.linkage_attrs:
            rw.replace(s, e, "")
        statics = [t for t in fn.storage_tokens if t.spelling == "static"]
        for t in fn.storage_tokens:
            if t.spelling == "extern":
                rw.replace(t.start, t.end, "static" if not statics else "")
                statics = [t]
        if fn.variadic and valist:
            rw.replace(fn.ellipsis.start, fn.ellipsis.end, "__builtin_va_list molt__ap")
            for s, e, text in fn.format_fixes:
                rw.replace(s, e, text)
            for s, e, ap, last in fn.va_starts:
                # va_start(ap, last) -> va_copy from the wrapper's list; `last`
                # stays mentioned so it does not become an unused parameter.
                rw.replace(s, e, "((void)(%s), __builtin_va_copy(%s, molt__ap))" % (last, ap))
        return "" if statics else "static "

    def literal_ref(self, d):
        """True if the reference cursor d is the identifier token itself in
        the main file (not produced by a macro expansion)."""
        o = d.extent.start.offset
        n = d.spelling.encode()
        return self.u.is_literal(o, d.spelling) and d.extent.end.offset - o == len(n)

    def wrapper_body(self, fn, callee, desc, names):
        cast = "((__typeof__(%s) *)molt__g->table[%s.index])" % (callee, desc)
        if fn.variadic:
            call = "%s(%s)" % (cast, ", ".join(names + ["molt__ap"]))
            start = "__builtin_va_start(molt__ap, %s)" % names[-1]
            if fn.void:
                return ("{\n  __builtin_va_list molt__ap;\n  molt__gen *molt__g = molt__enter();\n"
                        "  %s;\n  __extension__ %s;\n  __builtin_va_end(molt__ap);\n"
                        "  molt__leave(molt__g);\n}\n" % (start, call))
            return ("{\n  __builtin_va_list molt__ap;\n  molt__gen *molt__g = molt__enter();\n"
                    "  __extension__ __auto_type molt__r = (%s, %s);\n"
                    "  __builtin_va_end(molt__ap);\n  molt__leave(molt__g);\n  return molt__r;\n}\n"
                    % (start, call))
        call = "%s(%s)" % (cast, ", ".join(names))
        if fn.void:
            return ("{\n  molt__gen *molt__g = molt__enter();\n  __extension__ %s;\n"
                    "  molt__leave(molt__g);\n}\n" % call)
        return ("{\n  molt__gen *molt__g = molt__enter();\n"
                "  __extension__ __auto_type molt__r = %s;\n"
                "  molt__leave(molt__g);\n  return molt__r;\n}\n" % call)

    def descriptor(self, fn, v0, dispatch):
        """molt__fn_desc of f: entry f, body v0, dispatch path, and the direct
        target v0 -- or NULL for a variadic f, whose version 0 takes a
        va_list, so its entry must always dispatch."""
        direct = "(void *)0" if fn.variadic else "(void *)&%s" % v0
        return ("__extension__ static molt__fn_desc %s__molt_desc MOLT__SECTION(\"molt_fns\") = "
                "{MOLT__DESC_MAGIC, UINT32_MAX, %s, %s, (void *)&%s, (void *)&%s, (void *)&%s, "
                "%s, %d, 0};\n"
                % (fn.name, c_string(fn.name), c_string(self.u.tu_name), fn.name, v0, dispatch,
                   direct, 1 if fn.static else 0))

    def entry_target(self, fn, v0, dispatch):
        """Where the stable entry jumps as built: version 0, or the dispatch
        path for a variadic function."""
        return dispatch if fn.variadic else v0

    def entry_extra_attrs(self, fn):
        """Attributes the stable entry needs besides MOLT__ENTRY_ATTRS, on
        lines of their own.  GCC gives a variadic function the prologue that
        spills the argument registers into its va_list save area even when
        it is naked, unless the stdarg pass (optimizing compiles only) sees
        that nothing reads them: at -O0 and -Og the naked entry of a
        variadic function would start with stores through the caller's frame
        pointer instead of the jump.  clang emits only the jump."""
        if not fn.variadic:
            return ""
        return ("\n#if defined(__GNUC__) && !defined(__clang__)\n"
                "__attribute__((__optimize__(\"O1\")))\n#endif\n")

    def macro_signature(self, fn):
        ret = "__typeof__(%s)" % fn.c.result_type.spelling
        types = ["__typeof__(%s)" % a.type.spelling for a in fn.args]
        names = ["molt__a%d" % i for i in range(len(fn.args))]
        if types:
            decl = ", ".join(types)
            defn = ", ".join("%s %s" % (t, n) for t, n in zip(types, names))
        else:
            # the generated declarations are prototypes (-Wstrict-prototypes);
            # the definition of f keeps what the user wrote
            decl = "void"
            defn = "void" if fn.proto else ""
        return ret, decl, defn, names


class ProgramWeaver(Weaver):
    """Makes the selected functions of one TU updatable."""

    def select(self, sel):
        chosen = []
        for fn in self.u.functions():
            self.u.analyse(fn)
            refuse_naked_conflicts(fn)
            why = explicitly_marked(fn, sel)
            if not why and not (sel.all and fn.body is not None):
                continue
            if fn.reason:
                if why:
                    self.report.warn("%s: '%s' is not made updatable: %s" % (fn.loc, fn.name, fn.reason))
                elif not fn.reason.startswith(("main", "inline", "always_inline", "gnu_inline", "no body")):
                    self.report.note("%s: '%s' is not made updatable: %s" % (fn.loc, fn.name, fn.reason))
                continue
            chosen.append(fn)
        return chosen

    def weave(self, fns):
        # The generated file lives elsewhere: name the user's file from the
        # first line on (diagnostics, __FILE__, "included from").
        self.rw.insert(self.file_start(), self.linemark(1))
        for fn in fns:
            if fn.plain:
                self._plain(fn)
            else:
                self._macro(fn)
            self.report.note("%s: '%s' is updatable%s" % (
                fn.loc, fn.name, "" if fn.plain else " (defined through a macro)"))
        return self.rw.render()

    def _plain(self, fn):
        u, rw = self.u, self.rw
        v0 = fn.name + "__molt_v0"
        dispatch = fn.name + "__molt_dispatch"
        header = self.header_text(fn)
        v0_proto = self.header_variant(fn, v0, storage="static", valist=True)
        # the dispatch path takes f's own parameters, `...` included
        dispatch_header = self.header_variant(fn, dispatch, valist=False)
        blanks = []
        for h in fn.hoists:
            blanks.append(rw.remove(h.start, h.end))
            for v, new in h.vars:
                rw.replace(v.location.offset, v.location.offset + len(v.spelling.encode()), new)
        for d in fn.body.walk_preorder():
            if d.kind == CK.DECL_REF_EXPR and d.referenced is not None:
                new = fn.hoist_map.get(d.referenced.get_usr()) if fn.hoists else None
                if new and self.literal_ref(d):
                    rw.replace(d.extent.start.offset, d.extent.end.offset, new)
        prefix = self.rename_in_place(fn, v0)

        macro_names = sorted(set(fn.macro_refs.values()))
        override = "".join('#pragma push_macro("%s")\n#undef %s\n#define %s %s\n' % (
            n, n, n, [new for v_usr, new in fn.hoist_map.items() if fn.macro_refs.get(v_usr) == n][0])
            for n in macro_names)

        def block():
            out = ["\n", self.include_molt(), self.linemark(fn.line)]
            if not fn.has_prior_decl:
                out.append(header + ";\n")
            out.append(v0_proto + ";\n")
            out.append("static " + dispatch_header + ";\n")
            for h, blank in zip(fn.hoists, blanks):
                out.append(self.linemark(h.line))
                out.append(rw.render(h.start, h.end, skip=[blank]).decode("utf-8", "surrogateescape"))
                out.append("\n")
            out.append(self.linemark(fn.line))
            # The user's header text needs the user's macros, also those
            # named like identifiers of the generated code (`noinline`):
            # those are undefined only around the generated pieces next to
            # it (own lines, so that #pragma can reach them), the others
            # around the whole block.
            guard = [n for n in self.wrap_guard if n not in fn.header_idents]
            hguard = [n for n in self.wrap_guard if n in fn.header_idents]

            def gen(text):
                if not hguard:
                    return text
                return "\n" + self.push_guard(hguard) + text + "\n" + self.pop_guard(hguard)

            out.append(self.push_guard(guard))
            out.append(gen(self.descriptor(fn, v0, dispatch)))
            out.append("MOLT__DIAG_PUSH\n")
            out.append(gen("MOLT__ENTRY_ATTRS") + self.entry_extra_attrs(fn) + " " + header
                       + " { MOLT__ENTRY_STUB(%s); }\n" % self.entry_target(fn, v0, dispatch))
            out.append("MOLT__DIAG_POP\n")
            out.append("static " + gen("__attribute__((used))") + " " + dispatch_header + "\n")
            out.append(gen(self.wrapper_body(fn, v0, fn.name + "__molt_desc",
                                             [a.spelling for a in fn.args])))
            out.append(self.pop_guard(guard))
            out.append(override)
            out.append(self.resume_with_prefix(fn, prefix))
            return "".join(out)

        rw.insert(fn.ext_start, block)
        if macro_names:
            rw.insert(fn.body_end, "\n" + "".join('#pragma pop_macro("%s")\n' % n for n in macro_names)
                      + self.linemark(fn.end_line) + " " * (fn.end_col - 1))

    def _macro(self, fn):
        rw = self.rw
        v0 = fn.name + "__molt_v0"
        dispatch = fn.name + "__molt_dispatch"
        ret, decl, defn, names = self.macro_signature(fn)
        linkage = "static " if fn.static else ""
        rw.insert(fn.ext_start, "\n" + self.include_molt() + self.linemark(fn.line)
                  + "static %s %s(%s);\n" % (ret, v0, decl)
                  + "static %s %s(%s);\n" % (ret, dispatch, decl)
                  + "#define %s %s\n" % (fn.name, v0)
                  + self.linemark(fn.line) + " " * (fn.col - 1))
        after = ["\n#undef %s\n" % fn.name, self.linemark(fn.line)]
        if not fn.has_prior_decl:
            after.append("%s__typeof__(%s) %s;\n" % (linkage, v0, fn.name))
        after.append(self.push_guard(self.wrap_guard))
        after.append(self.descriptor(fn, v0, dispatch))
        after.append("MOLT__DIAG_PUSH\n")
        after.append("MOLT__ENTRY_ATTRS%s %s%s %s(%s) { MOLT__ENTRY_STUB(%s); }\n" % (
            self.entry_extra_attrs(fn), linkage, ret, fn.name, defn,
            self.entry_target(fn, v0, dispatch)))
        after.append("MOLT__DIAG_POP\n")
        after.append("static __attribute__((used)) %s %s(%s)\n" % (ret, dispatch, defn or "void"))
        after.append(self.wrapper_body(fn, v0, fn.name + "__molt_desc", names))
        after.append(self.pop_guard(self.wrap_guard))
        after.append(self.linemark(fn.end_line) + " " * (fn.end_col - 1))
        rw.insert(fn.ext_end, "".join(after))


# ---------------------------------------------------------------------------
# Patch builds
# ---------------------------------------------------------------------------

class Import:
    """One object of the running program that the patch uses: its slot is
    filled by the runtime (molt__import record) before the patch goes in."""

    def __init__(self, symbol, tu, decl_name, is_func, tls=False):
        self.symbol = symbol        # name looked up in the target
        self.tu = tu                # None for globals
        self.decl_name = decl_name  # identifier declared in the patch TU
        self.is_func = is_func
        self.tls = tls

    @property
    def slot(self):
        return "molt__imp_" + self.symbol

    @property
    def expr(self):
        return "(__extension__ (*(__typeof__(%s) *)%s))" % (self.decl_name, self.slot)


class PatchPlan:
    """What every function defined in the patch sources becomes."""

    def __init__(self, target, target_path, sel, report):
        self.target = target
        self.target_path = target_path
        self.sel = sel
        self.report = report
        self.roles = {}          # usr -> 'pfn' | 'copy' | 'removed'
        self.global_roles = {}   # name -> role for external functions

    def target_updatable(self, fn):
        v0 = fn.name + "__molt_v0"
        if fn.static:
            return self.target.static_count(fn.unit.tu_name, v0, FUNC_SYMTYPES) > 0
        return self.target.has_global(fn.name, FUNC_SYMTYPES) and \
            self.target.has_local_anywhere(v0, FUNC_SYMTYPES)

    def decide(self, unit):
        fns = unit.functions()
        for fn in fns:
            unit.analyse(fn)
            refuse_naked_conflicts(fn)
            if fn.body is None:
                continue
            if fn.name == "main" or fn.ctor:
                # Never re-run start-up code inside a live process: main and
                # constructors are not compiled into the patch.
                role = "removed"
                self.report.note("%s: '%s' is not compiled into the patch" % (fn.loc, fn.name))
            else:
                why = explicitly_marked(fn, self.sel)
                in_target = self.target_updatable(fn)
                selected = bool(why) or self.sel.all or in_target
                role = "copy"
                if selected and fn.reason is None and in_target:
                    role = "pfn"
                elif selected and fn.reason is None:
                    if why:
                        self.report.warn(
                            "%s: '%s' is marked updatable but %s has no updatable function '%s'%s; "
                            "it is compiled into the patch as a private copy" % (
                                fn.loc, fn.name, self.target_path, fn.name,
                                " in %s" % unit.tu_name if fn.static else ""))
                elif in_target and fn.reason:
                    self.report.warn("%s: '%s' is updatable in the target but this patch cannot "
                                     "replace it: %s; it is compiled as a private copy" % (
                                         fn.loc, fn.name, fn.reason))
            fn.role = role
            self.roles[fn.usr] = role
            if not fn.static:
                self.global_roles[fn.name] = role
        return fns


class WeaveError(Exception):
    pass


class PatchWeaver(Weaver):
    def __init__(self, unit, include_dir, report, plan):
        Weaver.__init__(self, unit, include_dir, report)
        self.plan = plan
        self.target = plan.target
        self.imports = {}        # slot -> Import
        self.pfns = []           # (name, tu or None, impl)
        self.dropped = []        # byte ranges whose code is not compiled
        self.hoisted = {}        # usr -> (new name, Import or None)

    def error(self, off_or_cursor, msg):
        if isinstance(off_or_cursor, int):
            line = self.u.data.count(b"\n", 0, off_or_cursor) + 1
        else:
            line = off_or_cursor.location.line
        raise WeaveError("%s:%d: %s" % (self.u.display, line, msg))

    def _check_renamed(self, cursor, name):
        """A static the program has only under a compiler-made name (LTO,
        IPA clones) cannot be imported by name; a private copy would
        silently split the state, so this is an error."""
        renamed = self.target.renamed_static(self.u.tu_name, name)
        if renamed:
            self.error(cursor, "static '%s' of %s exists in the target only as '%s' (renamed by "
                               "the compiler, e.g. -flto); the patch cannot reach the live object; "
                               "build the program without LTO" % (name, self.u.tu_name, renamed[0]))

    def dropped_at(self, off):
        return any(s <= off < e for s, e in self.dropped)

    # -- classification of references ---------------------------------------------
    def classify(self, r):
        """Import for a referenced declaration, or None when the reference
        stays as it is (locals, new objects, private copies, libraries)."""
        u, t = self.u, self.target
        if r.kind == CK.VAR_DECL:
            usr = r.get_usr()
            if usr in self.hoisted:
                return self.hoisted[usr][1]
            parent = r.semantic_parent
            local = parent is not None and parent.kind == CK.FUNCTION_DECL
            if local and r.storage_class != SC.EXTERN:
                return None
            tls = r.tls_kind != ci.TLSKind.NONE if hasattr(r, "tls_kind") else False
            if r.linkage == ci.LinkageKind.INTERNAL:
                n = t.static_count(u.tu_name, r.spelling, VAR_SYMTYPES)
                if n == 0:
                    self._check_renamed(r, r.spelling)
                if n > 1:
                    self.report.warn("%s: static '%s' exists in several files named %s in the target"
                                     % (u.display, r.spelling, u.tu_name))
                if n:
                    return Import(r.spelling, u.tu_name, r.spelling, False, tls)
                return None
            if t.has_global(r.spelling, VAR_SYMTYPES):
                return Import(r.spelling, None, r.spelling, False, tls)
            return None
        if r.kind == CK.FUNCTION_DECL:
            name = r.spelling
            if name.startswith("__builtin"):
                return None
            if r.linkage == ci.LinkageKind.INTERNAL:
                role = self.plan.roles.get(r.get_usr())
                if role == "pfn":
                    return Import(name, u.tu_name, name, True)
                if role == "copy":
                    return None
                d = r.get_definition()
                if role is None and d is not None and not self.u.in_main(d):
                    return None  # static (inline) function from a header: compiled in
                if t.static_count(u.tu_name, name, FUNC_SYMTYPES):
                    return Import(name, u.tu_name, name, True)
                return "missing"
            role = self.plan.global_roles.get(name)
            if role == "pfn":
                return Import(name, None, name, True)
            if role == "copy":
                return None
            d = r.get_definition()
            if role is None and d is not None:
                return None  # inline definition from a header
            if t.has_global(name, FUNC_SYMTYPES):
                return Import(name, None, name, True)
            return None
        return None

    # -- weaving -----------------------------------------------------------------------
    def weave(self, fns):
        u, rw = self.u, self.rw
        pfns = [fn for fn in fns if getattr(fn, "role", None) == "pfn"]
        for fn in fns:
            if getattr(fn, "role", None) == "removed":
                rw.remove(fn.ext_start, fn.ext_end)
                self.dropped.append((fn.ext_start, fn.ext_end))

        # Hoisted statics of new versions: imported when the target has them
        # (same name in the program build: molt__<func>__<var>).
        for fn in pfns:
            if not fn.plain:
                continue
            for h in fn.hoists:
                for v, new in h.vars:
                    imp = None
                    if self.target.static_count(u.tu_name, new, VAR_SYMTYPES):
                        imp = Import(new, u.tu_name, new, False,
                                     v.tls_kind != ci.TLSKind.NONE)
                    else:
                        self._check_renamed(v, new)
                    self.hoisted[v.get_usr()] = (new, imp)

        # File-scope declarations of imported variables become `extern`
        # declarations: the definition is the program's.
        self._neutralize_file_scope()

        # References.
        overrides = {}   # top-level cursor hash -> {name: (usrs, replacement)}
        tops = sorted(u.top, key=lambda c: c.extent.start.offset)
        for top in tops:
            if top.kind not in (CK.FUNCTION_DECL, CK.VAR_DECL):
                continue
            ts = top.extent.start.offset
            if self.dropped_at(ts) and top.kind == CK.FUNCTION_DECL:
                continue
            for d in top.walk_preorder():
                if d.kind != CK.DECL_REF_EXPR or d.referenced is None:
                    continue
                if not (d.location.file and d.location.file.name == u.path):
                    continue
                off = d.extent.start.offset
                if self.dropped_at(off):
                    continue
                r = d.referenced
                imp = self.classify(r)
                usr = r.get_usr()
                if imp == "missing":
                    self.error(d, "static function '%s' is used but is neither defined in the patch "
                                  "sources nor present in the target" % r.spelling)
                if imp is None:
                    if usr in self.hoisted:
                        new = self.hoisted[usr][0]
                        repl = new
                    else:
                        continue
                else:
                    if imp.tls:
                        self.error(d, "'%s' is a thread-local variable of the program; patches "
                                      "cannot import thread-local variables" % r.spelling)
                    if top.kind == CK.VAR_DECL and top.storage_class != SC.EXTERN:
                        self.error(d, "the initializer of '%s' refers to '%s' of the running "
                                      "program, which is not a constant in a patch; assign it at "
                                      "run time instead" % (top.spelling, r.spelling))
                    self.imports.setdefault(imp.slot, imp)
                    repl = imp.expr
                if self.literal_ref(d):
                    rw.replace(off, d.extent.end.offset, repl)
                else:
                    ov = overrides.setdefault(top.hash, (top, {}))[1]
                    ov.setdefault(r.spelling, (set(), repl))[0].add(usr)

        for fn in pfns:
            if fn.plain:
                self._pfn_plain(fn, overrides.pop(fn.c.hash, (None, {}))[1])
            else:
                self._pfn_macro(fn, overrides.pop(fn.c.hash, (None, {}))[1])
        for top, names in overrides.values():
            self._override(top, names, top.extent.start.offset, self._construct_end(top), top.extent.start.line)

        self._extern_static_prototypes()

        # Slots first (plain C, nothing to include), records at the end of
        # the file, after everything they point to.
        slots = "".join("static void *%s;\n" % s for s in sorted(self.imports))
        if slots:
            rw.insert(self.file_start(), slots + self.linemark(1))
        end = ["\n", self.include_molt(), self.push_guard(self.wrap_guard)]
        for s in sorted(self.imports):
            imp = self.imports[s]
            end.append("static const molt__import %s__molt_imp MOLT__SECTION(\"molt_imports\") = "
                       "{%s, %s, (void **)&%s};\n" % (
                           imp.symbol, c_string(imp.symbol),
                           c_string(imp.tu) if imp.tu else "NULL", imp.slot))
        for name, tu, impl in self.pfns:
            end.append("__extension__ static const molt__patch_fn %s__molt_pfn MOLT__SECTION(\"molt_pfns\") = "
                       "{%s, %s, (void *)&%s};\n" % (name, c_string(name),
                                                    c_string(tu) if tu else "NULL", impl))
        end.append(self.pop_guard(self.wrap_guard))
        rw.insert(len(u.data), "".join(end))
        return rw.render()

    def _construct_end(self, top):
        e = top.extent.end.offset
        if top.kind == CK.VAR_DECL:
            toks = self.u.tokens_in(e, len(self.u.data))
            depth = 0
            for t in toks:
                if t.spelling in ("(", "[", "{"):
                    depth += 1
                elif t.spelling in (")", "]", "}"):
                    depth -= 1
                elif t.spelling == ";" and depth == 0:
                    return t.end
        return e

    def _override(self, top, names, start, end, line):
        """References produced by macro expansions cannot be rewritten token
        by token: they get `#define x replacement` for the extent of the
        construct, if nothing else in it is spelled x."""
        u, rw = self.u, self.rw
        if u.tok_at(start) is None:
            self.error(top, "cannot rewrite references in '%s': its code comes from a macro"
                       % top.spelling)
        push = []
        for name, (usrs, repl) in sorted(names.items()):
            if u.spelled_elsewhere(top, name, usrs, start, end):
                self.error(top, "'%s' is used through a macro in '%s' and its name is also used "
                                "for something else there; moltcc cannot redirect it to the running "
                                "program" % (name, top.spelling))
            push.append('#pragma push_macro("%s")\n#undef %s\n#define %s %s\n' % (name, name, name, repl))
        col = u.data.rfind(b"\n", 0, start)
        col = start - col
        rw.insert(start, "\n" + "".join(push) + self.linemark(line) + " " * (col - 1))
        eline = u.data.count(b"\n", 0, end) + 1
        ecol = end - u.data.rfind(b"\n", 0, end)
        rw.insert(end, "\n" + "".join('#pragma pop_macro("%s")\n' % n for n in sorted(names))
                  + self.linemark(eline) + " " * (ecol - 1))

    def _pfn_plain(self, fn, macro_names):
        u, rw = self.u, self.rw
        impl = fn.name + "__molt_p"
        blanks = []
        for h in fn.hoists:
            blanks.append(rw.remove(h.start, h.end))
            for v, new in h.vars:
                rw.replace(v.location.offset, v.location.offset + len(v.spelling.encode()), new)
        header = self.header_variant(fn, fn.name, storage="extern")
        prefix = self.rename_in_place(fn, impl)
        self.pfns.append((fn.name, u.tu_name if fn.static else None, impl))
        hoist_texts = []
        for h, blank in zip(fn.hoists, blanks):
            imps = [self.hoisted[v.get_usr()][1] for v, _ in h.vars]
            hoist_texts.append((h, blank, all(imps)))
            if all(imps):
                # The program owns these: keep only an extern declaration (for
                # __typeof__) without the initializers.
                self._neutralize_range(h.start, [v for v, _ in h.vars])

        # Statics referenced through macros: the hoisted name (new) or the
        # import expression, scoped to this body.
        scoped = {}
        for usr, name in fn.macro_refs.items():
            new, imp = self.hoisted[usr]
            scoped[name] = imp.expr if imp else new
            if imp:
                self.imports.setdefault(imp.slot, imp)
        for name, (usrs, repl) in macro_names.items():
            if name in scoped:
                continue
            own = [(fn.name_off, fn.name_off + len(fn.name.encode()))]
            own += [(v.location.offset, v.location.offset + len(v.spelling.encode()))
                    for h in fn.hoists for v, _ in h.vars]
            if u.spelled_elsewhere(fn.c, name, usrs, fn.ext_start, fn.ext_end, skip_ranges=own):
                self.error(fn.c, "'%s' is used through a macro in '%s' and its name is also used "
                                 "for something else there; moltcc cannot redirect it to the "
                                 "running program" % (name, fn.name))
            scoped[name] = repl
        override = "".join('#pragma push_macro("%s")\n#undef %s\n#define %s %s\n' % (n, n, n, r)
                           for n, r in sorted(scoped.items()))

        def block():
            out = ["\n", self.linemark(fn.line)]
            if not fn.has_prior_decl:
                out.append(header + ";\n")
            for h, blank, _ in hoist_texts:
                out.append(self.linemark(h.line))
                out.append(rw.render(h.start, h.end, skip=[blank]).decode("utf-8", "surrogateescape"))
                out.append("\n")
            out.append(override)
            out.append(self.resume_with_prefix(fn, prefix))
            return "".join(out)

        rw.insert(fn.ext_start, block)
        if scoped:
            rw.insert(fn.body_end, "\n" + "".join('#pragma pop_macro("%s")\n' % n for n in sorted(scoped))
                      + self.linemark(fn.end_line) + " " * (fn.end_col - 1))

    def _pfn_macro(self, fn, macro_names):
        u, rw = self.u, self.rw
        impl = fn.name + "__molt_p"
        ret, decl, _, _ = self.macro_signature(fn)
        self.pfns.append((fn.name, u.tu_name if fn.static else None, impl))
        push = []
        for name, (usrs, repl) in sorted(macro_names.items()):
            if u.spelled_elsewhere(fn.c, name, usrs, fn.ext_start, fn.ext_end):
                self.error(fn.c, "'%s' is used through a macro in '%s' and its name is also used "
                                 "for something else there" % (name, fn.name))
            push.append('#pragma push_macro("%s")\n#undef %s\n#define %s %s\n' % (name, name, name, repl))
        proto = "" if fn.has_prior_decl else "extern __typeof__(%s) %s(%s);\n" % (ret, fn.name, decl)
        rw.insert(fn.ext_start, "\n" + self.linemark(fn.line) + proto
                  + "static %s %s(%s);\n#define %s %s\n" % (ret, impl, decl, fn.name, impl)
                  + "".join(push) + self.linemark(fn.line) + " " * (fn.col - 1))
        rw.insert(fn.ext_end, "\n#undef %s\n" % fn.name
                  + "".join('#pragma pop_macro("%s")\n' % n for n in sorted(macro_names))
                  + self.linemark(fn.end_line) + " " * (fn.end_col - 1))

    # -- declarations --------------------------------------------------------------
    def _var_groups(self):
        """File-scope variable declarations of the main file, grouped by
        declaration (`static int a = 1, b;` is one group of two)."""
        groups = []
        cur = None
        for c in self.u.top:
            if c.kind != CK.VAR_DECL:
                cur = None
                continue
            s = c.extent.start.offset
            if cur is not None:
                # later declarators start at their own name, after a comma
                prev_end = cur[-1].extent.end.offset
                between = self.u.tokens_in(prev_end, s)
                if len(between) == 1 and between[0].spelling == ",":
                    cur.append(c)
                    continue
            cur = [c]
            groups.append(cur)
        return groups

    def _neutralize_file_scope(self):
        for group in self._var_groups():
            imps = [self.classify(v) for v in group]
            if not any(isinstance(i, Import) for i in imps):
                continue
            if all(isinstance(i, Import) for i in imps):
                if self._neutralize_range(group[0].extent.start.offset, group):
                    continue
            names = ", ".join(v.spelling for v, i in zip(group, imps) if isinstance(i, Import))
            self.report.note("%s:%d: the definition of %s stays in the patch as an unused copy "
                             "(every use refers to the running program)" % (
                                 self.u.display, group[0].location.line, names))

    def _neutralize_range(self, start, vars_):
        """`static T a = 1, b;` -> `extern T a, b;`.  False if the declaration
        is not literal text (comes from a macro)."""
        u, rw = self.u, self.rw
        first = vars_[0]
        name_off = first.location.offset
        if not all(u.is_literal(v.location.offset, v.spelling) for v in vars_):
            return False
        if u.tok_at(start) is None:
            return False
        spec = u.tokens_in(start, name_off)
        storage = [t for t in spec if t.spelling in ("static", "extern")]
        edits = []
        for v in vars_:
            toks = u.tokens_in(v.location.offset, v.extent.end.offset)
            depth = 0
            for t in toks:
                if t.spelling in ("(", "[", "{"):
                    depth += 1
                elif t.spelling in (")", "]", "}"):
                    depth -= 1
                elif t.spelling == "=" and depth == 0:
                    edits.append((t.start, v.extent.end.offset))
                    break
        for s, e in edits:
            rw.remove(s, e)
            self.dropped.append((s, e))
        if storage:
            if storage[0].spelling == "static":
                rw.replace(storage[0].start, storage[0].end, "extern")
        else:
            rw.insert(start, "extern ")
        return True

    def _extern_static_prototypes(self):
        """`static int f(int);` for a function the patch imports (or replaces)
        would warn 'declared static but never defined': those prototypes only
        serve __typeof__ now, so they become extern declarations."""
        u, rw = self.u, self.rw
        imported = {(i.symbol) for i in self.imports.values() if i.is_func and i.tu}
        replaced = {n for n, tu, _ in self.pfns if tu}
        for c in u.top:
            if c.kind != CK.FUNCTION_DECL or c.is_definition():
                continue
            if c.linkage != ci.LinkageKind.INTERNAL:
                continue
            if c.spelling not in imported and c.spelling not in replaced:
                continue
            toks = u.tokens_in(c.extent.start.offset, c.location.offset)
            st = [t for t in toks if t.spelling == "static"]
            if st:
                rw.replace(st[0].start, st[0].end, "extern")


def patch_header_source(patch_id, description):
    return ("/* generated by moltcc: the patch header and the note moltstamp fills in */\n"
            "#include <molt.h>\n"
            "MOLT_PATCH(%s, %s);\n" % (c_string(patch_id), c_string(description)))
