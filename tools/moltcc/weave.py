"""Source-to-source weaving: what program builds and patch builds share
(Weaver: #line marks, molt.h guards, headers renamed, wrappers,
descriptors), and the program weaver.  The patch weaver is patch/weave.py.

Program build, for every updatable function f (see molt.h, MOLT__FUNCTION):

    static <header of f renamed f__molt_v0>;              version 0, prototype
    static <header of f renamed f__molt_dispatch>;         dispatch path, prototype
    static molt__fn_desc f__molt_desc ... = {...};         section molt_fns
    MOLT__DIAG_PUSH
    MOLT__ENTRY_ATTRS <original header of f> { MOLT__ENTRY_STUB(f__molt_v0); }
    MOLT__DIAG_POP                                         stable entry
    static __attribute__((used)) <header renamed f__molt_dispatch>
    { enter; call table[index]; leave; }                   dispatch path
    __asm__(".symver ... f@MOLT_0 / f@MOLT_DISPATCH")      source-name aliases
                                                           (extern f, non-PIC)
    #line <original line>
    static <header renamed f__molt_v0> { original body }   version 0

Tools see f under its own name: __func__ and friends are macros naming f
inside the renamed body; the hidden-version aliases make dladdr and
backtrace_symbols print f (export_source_name); after the compile,
build.py renames f__molt_v0 and f__molt_dispatch to f in the object's
DWARF (elf.rename_debug_names).

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

"""
import glob
import os
import re

from .markers import explicitly_marked
from .rewrite import Rewriter
from .unit import CK

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
# The parameter that replaces `...` in version 0 of a variadic function (and
# in its new versions): a body that never calls va_start leaves it unused,
# and the user's -Wextra must not hear about a parameter they did not write.
VA_PARAM = "__builtin_va_list molt__ap __attribute__((__unused__))"
# Predefined identifiers that would name a renamed body.
FUNC_NAME_IDENTS = ("__func__", "__FUNCTION__", "__PRETTY_FUNCTION__")

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


# Version names of the exported source-name symbols (export_source_name):
# a hidden (non-default) version, so that only tools that look up by
# address -- dladdr, backtrace_symbols -- see them; a lookup by name
# (dlsym, the dynamic linker) never binds `f` to them.
VERSION_BODY = "MOLT_0"
VERSION_DISPATCH = "MOLT_DISPATCH"
VERSION_PATCH = "MOLT_PATCH"


def export_source_name(name, symbol, version):
    """A file-scope asm statement that gives the local function `symbol`
    (a renamed body) a global alias `name@version` of the same address and
    size: in .dynsym (with -rdynamic, as for any global) dladdr and
    backtrace_symbols then name an address inside it `name`, as in a plain
    build.  The alias is made through a helper symbol that `.symver ...,
    remove` takes out again, so `symbol` itself stays local (the patch
    builder reads the program's symbol table by those names)."""
    helper = "%s__molt_x" % symbol
    return ('__asm__(".globl %s\\n\\t.set %s, %s\\n\\t.symver %s, %s@%s, remove");\n'
            % (helper, helper, symbol, helper, name, version))


def debug_names(fns, suffixes):
    """{generated name: source name} of the renamed functions of fns, for
    elf.rename_debug_names."""
    return {fn.name + s: fn.name for fn in fns for s in suffixes}


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
    """Identifiers that molt.h (and the ABI headers it includes, molt/*.h)
    use and a user macro could clobber."""
    path = os.path.join(include_dir, "molt.h")
    if path not in _molt_h_cache:
        ids = set()
        for h in [path] + sorted(glob.glob(os.path.join(include_dir, "molt", "*.h"))):
            try:
                with open(h, "rb") as f:
                    code = _COMMENT_OR_STRING.sub(b" ", f.read())
                ids |= set(m.decode() for m in _IDENT.findall(code))
            except OSError:
                pass
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

    def func_name_macros(self, fn):
        """Inside a renamed body (f__molt_v0, f__molt_p), __func__ (and gcc's
        __FUNCTION__, __PRETTY_FUNCTION__) still name the function as the
        user wrote it."""
        u, rw = self.u, self.rw
        if fn.body_start is None or not (u.is_literal(fn.body_start, "{")
                                         and u.is_literal(fn.body_end - 1, "}")):
            return
        push = "".join('#pragma push_macro("%s")\n#undef %s\n#define %s %s\n'
                       % (n, n, n, c_string(fn.name)) for n in FUNC_NAME_IDENTS)
        pop = "".join('#pragma pop_macro("%s")\n' % n for n in FUNC_NAME_IDENTS)
        for off, text in ((fn.body_start + 1, push), (fn.body_end - 1, pop)):
            line = u.data.count(b"\n", 0, off) + 1
            col = off - u.data.rfind(b"\n", 0, off)
            rw.insert(off, "\n" + text + self.linemark(line) + " " * (col - 1))

    def push_guard(self, names=None):
        names = self.guard if names is None else names
        return "".join('#pragma push_macro("%s")\n#undef %s\n' % (n, n) for n in names)

    def pop_guard(self, names=None):
        names = self.guard if names is None else names
        return "".join('#pragma pop_macro("%s")\n' % n for n in names)

    def include_molt(self):
        return self.push_guard() + "#include <molt.h>\n" + self.pop_guard()

    _DIRECTIVE_LINE = re.compile(rb"\n[ \t]*#")

    def header_end(self, fn):
        """Where the header of a plain definition ends for the declarations
        generated from it: before the body, or before the first directive
        line after the parameter list -- a head written with #if/#else (nginx's
        ngx_log_error_core) has `#endif` (or `#else`, the other branch, and
        `#endif`) between its parameters and its body; the generated copies
        of the header are inside the active branch, the directives stay in
        place before the body."""
        # Directives inside the parameter list (nginx's
        # ngx_ssl_get_cached_session: `#if ...\n const\n#endif` before a
        # parameter) are part of the one header and are copied with it; only
        # a directive after the list closes starts another branch.
        after = fn.name_off
        depth = 0
        for t in self.u.tokens_in(fn.name_off, fn.body_start):
            if t.spelling == "(":
                depth += 1
            elif t.spelling == ")":
                depth -= 1
                if depth == 0:
                    after = t.end
                    break
        m = self._DIRECTIVE_LINE.search(self.u.data, after, fn.body_start)
        return m.start() + 1 if m else fn.body_start

    def header_text(self, fn):
        return self.u.text(fn.ext_start, self.header_end(fn))

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

    def header_variant(self, fn, newname, storage=None, valist=False, label_at=None, label=""):
        """The header of a plain function with its name replaced, its literal
        storage-class tokens dropped (then `storage` prepended), for a
        variadic function `...` replaced by a va_list parameter, and `label`
        (an asm label) inserted at offset label_at (the declarator's end)."""
        sub = Rewriter(self.u.data[fn.ext_start:self.header_end(fn)])
        base = fn.ext_start
        if label:
            sub.insert(label_at - base, label)
        sub.replace(fn.name_off - base, fn.name_off - base + len(fn.name.encode()), newname)
        ep = self.empty_parens(fn)
        if ep:
            sub.replace(ep[0] - base, ep[1] - base, "void")
        for t in fn.storage_tokens:
            sub.replace(t.start - base, t.end - base, "")
        for s, e in fn.linkage_attrs:
            sub.replace(s - base, e - base, "")
        if valist and fn.ellipsis is not None:
            sub.replace(fn.ellipsis.start - base, fn.ellipsis.end - base, VA_PARAM)
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
            rw.replace(fn.ellipsis.start, fn.ellipsis.end, VA_PARAM)
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
    """Makes the selected functions of one TU updatable.

    export_names: give each extern function's version 0 and dispatch path
    the global alias `f@MOLT_0` / `f@MOLT_DISPATCH` (export_source_name).
    Only for objects that go into an executable: the linker makes the
    version definitions of an executable itself, but refuses a shared
    object whose version script does not define them (build.py decides)."""

    export_names = False

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

    def exports(self, fn, v0, dispatch):
        """The source-name aliases of an extern f (statics are not in a
        plain build's dynamic symbol table either)."""
        if not self.export_names or fn.static:
            return ""
        return (export_source_name(fn.name, v0, VERSION_BODY)
                + export_source_name(fn.name, dispatch, VERSION_DISPATCH))

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
        self.func_name_macros(fn)

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
            out.append(self.exports(fn, v0, dispatch))
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
        after.append(self.exports(fn, v0, dispatch))
        after.append(self.linemark(fn.end_line) + " " * (fn.end_col - 1))
        rw.insert(fn.ext_end, "".join(after))
