"""Parsing one translation unit with libclang and analysing its functions.

Everything here is read-only: it answers "which functions are defined in the
main file, where exactly are their tokens, can they be rewritten safely".
The rewriting itself lives in weave.py and patch/weave.py.

Offsets are byte offsets into the main file.  For code that comes from a
macro expansion libclang reports the expansion location (the macro
invocation in the main file), which is exactly what a source-to-source
rewrite can touch.
"""
import os
import re

import clang.cindex as ci

from .markers import MARKER_ANNOTATION, MARKER_MACRO, MARKER_TAG

CK = ci.CursorKind
TK = ci.TypeKind
SC = ci.StorageClass


# Identifiers that, when found in a function's header (directly or through a
# macro), make it non-updatable:
#  - inline functions have no stable identity (and are not what PSU wraps);
#  - noreturn functions never leave, so their version would stay pinned;
#  - constructors/destructors run before/after the runtime is active;
#  - weak definitions can be interposed, so the descriptor's entry might not
#    be the function that callers reach;
#  - naked/ifunc/returns_twice change the calling convention itself.
SKIP_IDENTS = {
    "inline": "inline function", "__inline": "inline function",
    "__inline__": "inline function",
    "always_inline": "always_inline function", "__always_inline__": "always_inline function",
    "gnu_inline": "gnu_inline function", "__gnu_inline__": "gnu_inline function",
    "_Noreturn": "noreturn function (its call never returns, so its version could never be reclaimed)",
    "noreturn": "noreturn function (its call never returns, so its version could never be reclaimed)",
    "__noreturn__": "noreturn function (its call never returns, so its version could never be reclaimed)",
    "constructor": "constructor (runs before the runtime is ready)",
    "__constructor__": "constructor (runs before the runtime is ready)",
    "destructor": "destructor", "__destructor__": "destructor",
    "weak": "weak definition (can be interposed)", "__weak__": "weak definition (can be interposed)",
    "naked": "naked function", "__naked__": "naked function",
    "ifunc": "ifunc", "__ifunc__": "ifunc",
    "returns_twice": "returns_twice function", "__returns_twice__": "returns_twice function",
}
CTOR_IDENTS = {"constructor", "__constructor__", "destructor", "__destructor__"}

# Attributes that describe the symbol (visibility, aliases): they belong to
# the stable entry, which keeps the original header; version 0 and patch
# versions are static, where they are meaningless or warned about.
LINKAGE_ATTRS = {"visibility", "__visibility__", "externally_visible",
                 "__externally_visible__", "alias", "__alias__", "weakref", "__weakref__",
                 "dllexport", "__dllexport__", "dllimport", "__dllimport__", "symver",
                 "__symver__"}
ATTRIBUTE_WORDS = LINKAGE_ATTRS | {"__attribute__", "__attribute", "default", "hidden",
                                   "protected", "internal", "used", "__used__", "unused",
                                   "__unused__", "noinline", "__noinline__"}

# Clang errors inside a body that gcc accepts and that do not affect what
# moltcc needs from the AST (nested functions are a GNU extension clang
# does not implement; the body is copied verbatim, so gcc still sees them).
TOLERATED_BODY_ERRORS = ("function definition is not allowed here",)

_BAD_TYPE_SPELLING = re.compile(r"\((unnamed|anonymous)|<|__attribute__|\bstruct \(|\bunion \(|\benum \(")


class UnitError(Exception):
    pass


def in_system_header(loc):
    """clang_Location_isInSystemHeader (not wrapped by the 14 bindings)."""
    fn = getattr(in_system_header, "fn", None)
    if fn is None:
        import ctypes
        fn = ci.conf.lib.clang_Location_isInSystemHeader
        fn.argtypes = [ci.SourceLocation]
        fn.restype = ctypes.c_int
        in_system_header.fn = fn
    return bool(fn(loc))


def file_location(loc):
    """clang_getFileLocation: (file name or None, byte offset).  For a token
    that comes from a macro argument this is where the argument is written
    (the extent of such a reference is the macro's expansion point); for a
    token of a macro's replacement list it is the expansion point."""
    fn = getattr(file_location, "fn", None)
    if fn is None:
        import ctypes
        fn = ci.conf.lib.clang_getFileLocation
        fn.argtypes = [ci.SourceLocation, ctypes.POINTER(ci.c_object_p),
                       ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                       ctypes.POINTER(ctypes.c_uint)]
        fn.restype = None
        file_location.fn = fn
        file_location.ctypes = ctypes
    ctypes = file_location.ctypes
    f = ci.c_object_p()
    line, col, off = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
    fn(loc, ctypes.byref(f), ctypes.byref(line), ctypes.byref(col), ctypes.byref(off))
    if not f:
        return None, off.value
    return ci.File(f).name, off.value


class Token:
    __slots__ = ("start", "end", "spelling", "kind")

    def __init__(self, start, end, spelling, kind):
        self.start, self.end, self.spelling, self.kind = start, end, spelling, kind


OPEN_BRACKETS = ("(", "[", "{")
CLOSE_BRACKETS = (")", "]", "}")


def closing_bracket(toks, i, opens=("(",), closes=(")",)):
    """toks[i] opens a bracket: (the index of the token that closes it, or
    len(toks) if none does; the indexes of the commas directly inside)."""
    depth = 0
    commas = []
    for j in range(i, len(toks)):
        sp = toks[j].spelling
        if sp in opens:
            depth += 1
        elif sp in closes:
            depth -= 1
            if depth == 0:
                return j, commas
        elif sp == "," and depth == 1:
            commas.append(j)
    return len(toks), commas


def top_level_token(toks, spelling):
    """The first token spelled `spelling` outside any bracket, or None."""
    depth = 0
    for t in toks:
        if t.spelling in OPEN_BRACKETS:
            depth += 1
        elif t.spelling in CLOSE_BRACKETS:
            depth -= 1
        elif t.spelling == spelling and depth == 0:
            return t
    return None


class Hoist:
    """A `static` declaration statement inside a function body that moves to
    file scope (all of its declarators are static locals)."""

    def __init__(self, stmt, start, end, vars_):
        self.stmt = stmt
        self.start, self.end = start, end
        self.vars = vars_          # [(VarDecl cursor, new name)]
        self.line = stmt.extent.start.line


class Func:
    """A function definition of the main file and what moltcc knows about it."""

    def __init__(self, unit, c):
        self.unit = unit
        self.c = c
        self.name = c.spelling
        self.usr = c.get_usr()
        self.static = c.linkage == ci.LinkageKind.INTERNAL
        self.ext_start = c.extent.start.offset
        self.ext_end = c.extent.end.offset
        self.line = c.extent.start.line
        self.col = c.extent.start.column
        self.name_off = c.location.offset
        body = [ch for ch in c.get_children() if ch.kind == CK.COMPOUND_STMT]
        self.body = body[-1] if body else None
        self.body_start = self.body.extent.start.offset if self.body else None
        self.body_end = self.body.extent.end.offset if self.body else None
        self.end_line = c.extent.end.line
        self.end_col = c.extent.end.column
        self.args = list(c.get_arguments())
        self.proto = c.type.kind == TK.FUNCTIONPROTO
        self.variadic = self.proto and c.type.is_function_variadic()
        self.void = c.result_type.get_canonical().kind == TK.VOID
        self.plain = False
        self.reason = None          # why it cannot be updatable (None: it can)
        self.marker = None          # how it was marked updatable
        self.header_idents = set()
        self.hoists = []            # [Hoist] (plain path only)
        self.macro_refs = {}        # hoisted var USR -> name, referenced through macros
        self.va_starts = []         # [(start, end, ap-text)]
        self.storage_tokens = []    # literal `static`/`extern` tokens in the header
        self.ellipsis = None        # Token of `...`
        self.has_prior_decl = False
        self.ctor = False
        self.linkage_attrs = []     # [(start, end)] to drop from static copies
        self.format_fixes = []      # [(start, end, text)] for va_list versions

    @property
    def loc(self):
        return "%s:%d" % (self.unit.display, self.line)


class Unit:
    def __init__(self, path, display, clang_args, index=None):
        self.path = path              # what libclang parsed (the user's file)
        self.display = display        # as the user named it (diagnostics, #line)
        self.tu_name = os.path.basename(display)
        with open(path, "rb") as f:
            self.data = f.read()
        index = index or ci.Index.create()
        try:
            self.tu = index.parse(
                path, args=clang_args,
                options=ci.TranslationUnit.PARSE_DETAILED_PROCESSING_RECORD)
        except ci.TranslationUnitLoadError as e:
            raise UnitError("libclang could not parse %s: %s" % (display, e))
        self._index_line_directives()
        self._index_tokens()
        self._index_diagnostics()
        self._index_macros()
        self.top = [c for c in self.tu.cursor.get_children() if self.in_main(c)]
        self._decls = None
        self._files = {}

    # -- basic queries -------------------------------------------------------
    def in_main(self, c):
        f = c.location.file
        return f is not None and f.name == self.path

    def text(self, start, end):
        return self.data[start:end].decode("utf-8", "surrogateescape")

    def tok_at(self, off):
        i = self._tok_by_start.get(off)
        return None if i is None else self.tokens[i]

    def tok_index(self, off):
        return self._tok_by_start.get(off)

    def tokens_in(self, start, end):
        """Literal tokens of the main file within [start, end)."""
        import bisect
        i = bisect.bisect_left(self._tok_starts, start)
        out = []
        while i < len(self.tokens) and self.tokens[i].start < end:
            if self.tokens[i].end <= end:
                out.append(self.tokens[i])
            i += 1
        return out

    def is_literal(self, off, name):
        t = self.tok_at(off)
        return t is not None and t.spelling == name

    def errors_in(self, start, end):
        return [(o, m) for o, m in self.errors if start <= o < end]

    def macros_in(self, start, end):
        return [m for m in self.macro_insts if m[0] < end and m[1] > start]

    # -- user #line directives ------------------------------------------------------
    _LINE_DIR = re.compile(rb'^[ \t]*#[ \t]*(?:line[ \t]+)?(\d+)(?:[ \t]+"((?:[^"\\\n]|\\.)*)")?',
                           re.M)

    def _index_line_directives(self):
        """Generated files (bison, flex, ...) carry their own #line
        directives; moltcc's directives must continue their numbering, not
        the physical lines of the .c file."""
        self.line_dirs = []
        for m in self._LINE_DIR.finditer(self.data):
            phys = self.data.count(b"\n", 0, m.start()) + 1
            name = m.group(2).decode("utf-8", "surrogateescape") if m.group(2) is not None else None
            self.line_dirs.append((phys, int(m.group(1)), name))

    def presumed(self, line):
        """(C string literal of the file name or None, line) that the
        compiler attributes to physical line `line`."""
        cur = None
        for d in self.line_dirs:
            if d[0] < line:
                cur = d if d[2] is not None or cur is None else (d[0], d[1], cur[2])
            else:
                break
        if cur is None:
            return None, line
        return cur[2], cur[1] + (line - cur[0] - 1)

    # -- indexes ---------------------------------------------------------------
    def _index_tokens(self):
        self.tokens = []
        for t in self.tu.get_tokens(extent=self.tu.cursor.extent):
            if t.kind == ci.TokenKind.COMMENT:
                continue
            self.tokens.append(Token(t.extent.start.offset, t.extent.end.offset,
                                     t.spelling, t.kind))
        self._tok_starts = [t.start for t in self.tokens]
        self._tok_by_start = {t.start: i for i, t in enumerate(self.tokens)}

    def _index_diagnostics(self):
        self.errors = []
        self.fatal = []
        for d in self.tu.diagnostics:
            if d.severity < ci.Diagnostic.Error:
                continue
            f = d.location.file
            if f is not None and f.name == self.path:
                self.errors.append((d.location.offset, d.spelling))
            else:
                self.fatal.append("%s:%s: %s" % (f.name if f else "?", d.location.line, d.spelling))

    def _index_macros(self):
        self.macro_insts = []       # (start, end, name) in the main file
        self.macro_defs = {}        # name -> [cursor]
        for c in self.tu.cursor.get_children():
            if c.kind == CK.MACRO_DEFINITION:
                self.macro_defs.setdefault(c.spelling, []).append(c)
            elif c.kind == CK.MACRO_INSTANTIATION and self.in_main(c):
                self.macro_insts.append((c.extent.start.offset, c.extent.end.offset, c.spelling))

    def user_macros(self, exclude_file=None):
        """Names defined as macros by user code (not system headers, not the
        compiler, not `exclude_file`)."""
        out = set()
        for name, defs in self.macro_defs.items():
            for c in defs:
                f = c.location.file
                if f is None or in_system_header(c.location):
                    continue
                if exclude_file and os.path.realpath(f.name) == exclude_file:
                    continue
                out.add(name)
        return out

    def macro_idents(self, name, depth=0, seen=None):
        """Identifiers a macro can expand to (a superset: arguments are not
        substituted).  Used to see attributes hidden behind macros."""
        seen = seen if seen is not None else set()
        if name in seen or depth > 8:
            return set()
        seen.add(name)
        out = set()
        for c in self.macro_defs.get(name, []):
            toks = list(c.get_tokens())
            for t in toks[1:]:
                if t.kind in (ci.TokenKind.IDENTIFIER, ci.TokenKind.KEYWORD):
                    out.add(t.spelling)
                    if t.spelling in self.macro_defs:
                        out |= self.macro_idents(t.spelling, depth + 1, seen)
        return out

    # -- functions ---------------------------------------------------------------
    def functions(self):
        return [Func(self, c) for c in self.top
                if c.kind == CK.FUNCTION_DECL and c.is_definition()]

    def tagged(self, fn):
        """PSU's tag: /** DSU_FUNC */ or /// DSU_FUNC right before the
        definition or before any prototype of the function (a header).
        Checked on the text: clang would attach a doc comment that precedes
        a macro-generated function to the next ordinary declaration."""
        if MARKER_TAG in self.preceding_comment(fn.ext_start):
            return True
        if self._decls is None:
            self._decls = {}
            for c in self.tu.cursor.get_children():
                if c.kind == CK.FUNCTION_DECL and c.location.file is not None:
                    self._decls.setdefault(c.spelling, []).append(c)
        for d in self._decls.get(fn.name, []):
            if d.get_usr() != fn.usr:
                continue
            name = d.location.file.name
            data = self.data if name == self.path else self._file_data(name)
            if data and MARKER_TAG in self.preceding_comment(d.extent.start.offset, data):
                return True
        return False

    def _file_data(self, name):
        if name not in self._files:
            try:
                with open(name, "rb") as f:
                    self._files[name] = f.read()
            except OSError:
                self._files[name] = b""
        return self._files[name]

    def preceding_comment(self, off, data=None):
        """The comment that ends right before `off` (only whitespace between),
        or ''.  Covers /* */ blocks and runs of // lines."""
        d = self.data if data is None else data
        i = off
        while i > 0 and d[i - 1:i] in (b" ", b"\t", b"\n", b"\r", b"\f", b"\v"):
            i -= 1
        if d[max(0, i - 2):i] == b"*/":
            j = d.rfind(b"/*", 0, i - 2)
            return d[j:i].decode("utf-8", "replace") if j >= 0 else ""
        # a run of // comment lines ending at i
        lines = []
        end = i
        while end > 0:
            ls = d.rfind(b"\n", 0, end) + 1
            line = d[ls:end].strip()
            if line.startswith(b"//"):
                lines.append(line.decode("utf-8", "replace"))
                end = ls - 1 if ls > 0 else 0
                if ls == 0:
                    break
            else:
                break
        return "\n".join(reversed(lines))

    def analyse(self, fn, need_hoist=True):
        """Fills fn.plain / fn.reason / markers / rewrite points."""
        u = self
        c = fn.c
        if fn.body is None:
            fn.reason = "no body"
            return
        # markers
        if any(ch.kind == CK.ANNOTATE_ATTR and ch.spelling == MARKER_ANNOTATION
               for ch in c.get_children()):
            fn.marker = "MOLT_UPDATABLE"
        elif any(m[2] == MARKER_MACRO and fn.ext_start <= m[0] < fn.body_start
                 for m in u.macro_insts):
            fn.marker = "MOLT_UPDATABLE"
        elif self.tagged(fn):
            fn.marker = "DSU_FUNC"

        # prior declaration (a prototype before the definition)
        canon = c.canonical
        fn.has_prior_decl = not (canon.location.file is not None
                                 and canon.location.file.name == u.path
                                 and canon.extent.start.offset == fn.ext_start)

        # header identifiers (literal + through macros), without parameter
        # names (`int weak` is not an attribute) ...
        header_toks = u.tokens_in(fn.ext_start, fn.body_start)
        params = [(a.extent.start.offset, a.extent.end.offset) for a in fn.args
                  if a.location.file is not None and a.location.file.name == u.path]
        idents = set()
        for t in header_toks:
            if t.kind in (ci.TokenKind.IDENTIFIER, ci.TokenKind.KEYWORD):
                if t.kind == ci.TokenKind.IDENTIFIER and any(s <= t.start < e for s, e in params) \
                        and t.spelling not in u.macro_defs:
                    continue
                idents.add(t.spelling)
                if t.spelling in u.macro_defs:
                    idents |= u.macro_idents(t.spelling)
        # ... plus attributes inherited from prototypes elsewhere (a header's
        # `void die(int) __attribute__((noreturn));`).
        for ch in c.get_children():
            if ch.kind.is_attribute() and ch.kind != CK.ANNOTATE_ATTR:
                for t in ch.get_tokens():
                    idents.add(t.spelling)
                    if t.spelling in u.macro_defs:
                        idents |= u.macro_idents(t.spelling)
        fn.header_idents = idents
        fn.ctor = bool(idents & CTOR_IDENTS)

        if fn.name == "main":
            fn.reason = "main is never updatable"
            return
        # noreturn can come from any prototype; clang keeps it in the type.
        if c.type.spelling.endswith("__attribute__((noreturn))"):
            idents.add("noreturn")
        for ident, why in SKIP_IDENTS.items():
            if ident in idents:
                fn.reason = why
                return
        if fn.name in u.macro_defs:
            fn.reason = "its name is also a macro"
            return
        if c.mangled_name and c.mangled_name != fn.name:
            fn.reason = "it has an asm label (symbol %s)" % c.mangled_name
            return

        # K&R definitions: the parameter declarations follow the ')'.
        if (fn.args and not fn.proto) or self._is_knr(fn):
            fn.reason = "old-style (K&R) definition; give it a prototype"
            return

        errs = u.errors_in(fn.ext_start, fn.ext_end)
        bad = [m for o, m in errs
               if not (fn.body_start <= o < fn.body_end and m.startswith(TOLERATED_BODY_ERRORS))]
        if bad:
            fn.reason = "libclang cannot parse it (%s)" % bad[0]
            return

        fn.plain = self._is_plain(fn)
        if fn.plain:
            self._analyse_plain(fn, need_hoist)
        else:
            self._analyse_macro(fn)

    def _is_knr(self, fn):
        """K&R definitions declare their parameters between the ')' and the
        body: only they have a ';' there."""
        if not fn.args:
            return False
        return any(t.spelling == ";" for t in self.tokens_in(fn.name_off, fn.body_start))

    def _is_plain(self, fn):
        u = self
        if not u.is_literal(fn.name_off, fn.name):
            return False
        if u.tok_at(fn.ext_start) is None:
            return False
        bt = u.tok_at(fn.body_start)
        if bt is None or bt.spelling != "{":
            return False
        et = u.tokens_in(fn.body_end - 1, fn.body_end)
        if not et or et[-1].spelling != "}":
            return False
        for s, e, _ in u.macros_in(fn.ext_start, fn.ext_end):
            in_header = s >= fn.ext_start and e <= fn.body_start and (e <= fn.name_off or s > fn.name_off)
            in_body = s > fn.body_start and e < fn.body_end
            if not (in_header or in_body):
                return False
        return True

    # -- plain functions ---------------------------------------------------------
    def _analyse_plain(self, fn, need_hoist):
        u = self
        header_toks = u.tokens_in(fn.ext_start, fn.body_start)
        depth = 0
        for t in header_toks:
            if t.spelling in ("(", "["):
                depth += 1
            elif t.spelling in (")", "]"):
                depth -= 1
            elif depth == 0 and t.spelling in ("static", "extern"):
                fn.storage_tokens.append(t)
            elif depth == 1 and t.spelling == "..." and t.start > fn.name_off:
                fn.ellipsis = t
        self._find_linkage_attrs(fn, header_toks)
        if fn.c.storage_class in (SC.STATIC, SC.EXTERN) and not fn.storage_tokens:
            fn.reason = "its storage class comes from a macro"
            return
        if fn.variadic and fn.ellipsis is None:
            fn.reason = "its '...' comes from a macro"
            return
        for a in fn.args:
            if not a.spelling:
                fn.reason = "a parameter has no name"
                return
        if fn.variadic:
            self._find_format_attrs(fn, header_toks)
            if fn.reason:
                return
            self._find_va_starts(fn)
            if fn.reason:
                return
        self._find_hoists(fn)

    def _find_linkage_attrs(self, fn, toks):
        i = 0
        while i < len(toks):
            t = toks[i]
            if t.spelling in ("__attribute__", "__attribute") and i + 1 < len(toks) \
                    and toks[i + 1].spelling == "(":
                j, _ = closing_bracket(toks, i + 1)
                words = {x.spelling for x in toks[i + 1:j]} - {"(", ")"}
                if j < len(toks) and words & LINKAGE_ATTRS:
                    fn.linkage_attrs.append((t.start, toks[j].end))
                i = j + 1
                continue
            if t.kind == ci.TokenKind.IDENTIFIER and t.start != fn.name_off \
                    and t.spelling in self.macro_defs:
                words = self.macro_idents(t.spelling)
                if words & LINKAGE_ATTRS and words <= ATTRIBUTE_WORDS:
                    fn.linkage_attrs.append((t.start, t.end))
            i += 1

    FORMAT_WORDS = ATTRIBUTE_WORDS | {"format", "__format__", "printf", "__printf__",
                                      "gnu_printf", "scanf", "__scanf__", "gnu_scanf",
                                      "strftime", "strfmon"}

    def _find_format_attrs(self, fn, toks):
        """format(printf, M, N) checks the `...` of a variadic function; the
        versions take a va_list instead, which GCC spells N = 0."""
        for i, t in enumerate(toks):
            if t.spelling in ("format", "__format__") and i + 1 < len(toks) \
                    and toks[i + 1].spelling == "(":
                j, commas = closing_bracket(toks, i + 1)
                if j == len(toks):
                    continue
                if commas and commas[-1] + 1 < j:
                    fn.format_fixes.append((toks[commas[-1] + 1].start, toks[j - 1].end, "0"))
            elif t.kind == ci.TokenKind.IDENTIFIER and t.start != fn.name_off \
                    and t.spelling in self.macro_defs:
                words = self.macro_idents(t.spelling)
                if words & {"format", "__format__"}:
                    if words <= self.FORMAT_WORDS:
                        fn.format_fixes.append((t.start, t.end, ""))
                    else:
                        fn.reason = "its format attribute comes from macro %s" % t.spelling
                        return

    def _find_va_starts(self, fn):
        u = self
        toks = u.tokens_in(fn.body_start, fn.body_end)
        found = []
        k = 0
        while k < len(toks):
            t = toks[k]
            if t.spelling in ("va_start", "__builtin_va_start") and k + 1 < len(toks) \
                    and toks[k + 1].spelling == "(":
                j, commas = closing_bracket(toks, k + 1, OPEN_BRACKETS, CLOSE_BRACKETS)
                if j >= len(toks) or not commas:
                    fn.reason = "cannot rewrite its va_start"
                    return
                comma = commas[0]
                ap = u.text(toks[k + 2].start, toks[comma].start).strip()
                last = u.text(toks[comma + 1].start, toks[j].start).strip()
                found.append((t.start, toks[j].end, ap, last))
                k = j + 1
                continue
            k += 1
        n_ast = 0
        for d in fn.body.walk_preorder():
            if d.kind == CK.CALL_EXPR and d.spelling == "__builtin_va_start":
                n_ast += 1
        if n_ast != len(found):
            fn.reason = "va_start is used through a macro"
            return
        fn.va_starts = found

    def _find_hoists(self, fn):
        u = self
        fstart, fend = fn.ext_start, fn.ext_end
        used = {}
        hoist_usrs = {}
        stmts = []
        for d in fn.body.walk_preorder():
            if d.kind != CK.DECL_STMT:
                continue
            kids = list(d.get_children())
            statics = [k for k in kids if k.kind == CK.VAR_DECL and k.storage_class == SC.STATIC]
            if not statics:
                continue
            stmts.append((d, kids, statics))
        for d, kids, statics in stmts:
            s, e = d.extent.start.offset, d.extent.end.offset
            for k in kids:
                if k.kind == CK.VAR_DECL and k.storage_class != SC.STATIC:
                    fn.reason = "mixed static declaration"
                    return
                if k.kind in (CK.STRUCT_DECL, CK.UNION_DECL, CK.ENUM_DECL) and k.spelling:
                    fn.reason = "local static '%s' declares a type local to the function" % statics[0].spelling
                    return
            if not (u.tok_at(s) and u.tokens_in(e - 1, e)):
                fn.reason = "a function-local static comes from a macro"
                return
            for ms, me, _ in u.macros_in(s, e):
                if not (ms >= s and me <= e):
                    fn.reason = "a function-local static comes from a macro"
                    return
            vars_ = []
            for v in statics:
                if not u.is_literal(v.location.offset, v.spelling):
                    fn.reason = "a function-local static comes from a macro"
                    return
                for ms, me, _ in u.macros_in(s, e):
                    if ms <= v.location.offset < me:
                        fn.reason = "a function-local static comes from a macro"
                        return
                base = "molt__%s__%s" % (fn.name, v.spelling)
                n = used.get(base, 0) + 1
                used[base] = n
                new = base if n == 1 else "%s__%d" % (base, n)
                vars_.append((v, new))
                hoist_usrs[v.get_usr()] = new
            fn.hoists.append(Hoist(d, s, e, vars_))
        # A hoisted declaration must not depend on anything local to the
        # function (parameters, locals, local types or enumerators).
        for h in fn.hoists:
            for d in h.stmt.walk_preorder():
                if d.kind not in (CK.DECL_REF_EXPR, CK.TYPE_REF, CK.MEMBER_REF_EXPR):
                    continue
                r = d.referenced
                if r is None or r.location.file is None or r.location.file.name != u.path:
                    continue
                ro = r.extent.start.offset
                if not (fstart <= ro < fend):
                    continue
                if r.get_usr() in hoist_usrs:
                    continue
                if h.start <= ro < h.end:
                    continue  # e.g. fields of an anonymous struct declared here
                fn.reason = "local static '%s' depends on '%s', local to the function" % (
                    h.vars[0][0].spelling, r.spelling)
                return
        fn.hoist_map = hoist_usrs
        # References through macros cannot be renamed token by token: they
        # get a scoped `#define old new` around the body, which is only safe
        # if nothing else in the function is spelled like the variable.
        for d in fn.body.walk_preorder():
            if d.kind == CK.DECL_REF_EXPR:
                r = d.referenced
                if r is not None and r.get_usr() in hoist_usrs:
                    if not (u.is_literal(d.extent.start.offset, d.spelling)
                            and d.extent.end.offset - d.extent.start.offset == len(d.spelling.encode())):
                        fn.macro_refs[r.get_usr()] = r.spelling
        for usr, name in fn.macro_refs.items():
            if self.spelled_elsewhere(fn.body, name, {usr}, fn.body_start, fn.body_end,
                                      skip_ranges=[(h.start, h.end) for h in fn.hoists]):
                fn.reason = ("local static '%s' is used through a macro and its name is "
                             "also used for something else in the function" % name)
                return

    def spelled_elsewhere(self, root, name, ok_usrs, start, end, skip_ranges=()):
        """True if, within root, `name` names something other than the
        declarations in ok_usrs (a local, a member, a label...), or appears as
        a literal token that is not a reference to them."""
        ok_refs = set()
        for d in root.walk_preorder():
            sp = d.spelling
            if d.kind == CK.DECL_REF_EXPR and d.referenced is not None \
                    and d.referenced.get_usr() in ok_usrs:
                o = d.extent.start.offset
                if self.is_literal(o, name):
                    ok_refs.add(o)
                o = self.arg_spelling(d, name)
                if o is not None:
                    ok_refs.add(o)
                continue
            if d.kind.is_declaration() and d.get_usr() in ok_usrs:
                continue
            if sp == name and (d.kind.is_declaration() or d.kind in (
                    CK.MEMBER_REF_EXPR, CK.MEMBER_REF, CK.LABEL_REF, CK.DECL_REF_EXPR,
                    CK.LABEL_STMT, CK.TYPE_REF)):
                return True
        for t in self.tokens_in(start, end):
            if t.spelling == name and t.start not in ok_refs:
                if any(s <= t.start < e for s, e in skip_ranges):
                    continue
                if self.in_directive(t.start):
                    continue  # a macro body: exactly what the override redirects
                return True
        return False

    def arg_spelling(self, d, name):
        """Offset of the literal token `name` in the main file where the
        reference d is written inside a macro argument (its extent is the
        macro's expansion point), or None.  A reference from a macro's
        replacement list has no such token (its file location is the
        expansion point, or a #define line: refused)."""
        f, o = file_location(d.location)
        if f != self.path or not self.is_literal(o, name) or self.in_directive(o):
            return None
        return o

    def in_directive(self, off):
        """True if `off` is on a preprocessor directive line (including its
        backslash-continued lines)."""
        d = self.data
        ls = d.rfind(b"\n", 0, off) + 1
        while ls > 1 and d[ls - 2:ls - 1] == b"\\":
            ls = d.rfind(b"\n", 0, ls - 1) + 1
        return d[ls:off].lstrip(b" \t").startswith(b"#")

    # -- functions whose definition comes from a macro ----------------------------
    def _analyse_macro(self, fn):
        """A function whose name, header or body comes from a macro
        expansion is rewritten around the expansion: `#define f f__molt_v0`
        before it, `#undef f` after it, and a wrapper generated from the
        function's type.  That is only sound if the expansion does not refer
        to f itself (it would reach version 0 directly)."""
        u = self
        if u.tok_at(fn.ext_start) is None or not u.tokens_in(fn.ext_end - 1, fn.ext_end):
            fn.reason = "defined through a macro in a way moltcc cannot rewrite"
            return
        if fn.variadic:
            fn.reason = "variadic function defined through a macro"
            return
        for d in fn.body.walk_preorder():
            if d.kind == CK.VAR_DECL and d.storage_class == SC.STATIC:
                fn.reason = "function-local static in a function defined through a macro"
                return
        for d in self._cursors_in_range(fn.ext_start, fn.ext_end):
            if d.kind == CK.DECL_REF_EXPR and d.referenced is not None \
                    and d.referenced.get_usr() == fn.usr:
                fn.reason = "defined through a macro and refers to itself"
                return
        types = [fn.c.result_type] + [a.type for a in fn.args]
        for t in types:
            if _BAD_TYPE_SPELLING.search(t.spelling):
                fn.reason = "defined through a macro with a type moltcc cannot spell (%s)" % t.spelling
                return

    def _cursors_in_range(self, start, end):
        for top in self.top:
            s, e = top.extent.start.offset, top.extent.end.offset
            if e <= start or s >= end:
                continue
            for d in top.walk_preorder():
                if d.location.file is not None and d.location.file.name == self.path \
                        and start <= d.location.offset < end:
                    yield d

    def main_cursors(self):
        for top in self.top:
            for d in top.walk_preorder():
                yield d
