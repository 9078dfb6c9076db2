"""The patch weaver: one new source rewritten into patch code.

Uses are left exactly as the user wrote them; only declarations change
(notes/patchbuild-design.md §5):

- a variable of the running program (global, file-scope static, static
  local of a replaced function that the program build hoisted): its
  definition becomes a declaration with the complete type (an array's
  bound from libclang's type, the initializer dropped, the preprocessor
  directives inside it kept); every declaration of a static becomes
  `extern T name __asm__("molt.imp.<n>")` (a static local: a block-scope
  extern declaration in place); a global keeps its own name;
- an unchanged function of the program: its definition becomes a
  prototype (none after a prior declaration); a static one is `extern` with
  the asm label on every declaration;
- a replaced function f: its body becomes `static f__molt_p` with a
  `molt__patch_fn` record; f itself stays declared (recursive calls and &f
  reach the program's stable entry, an import like any other);
- new functions and variables and private copies stay as they are;
  `main` and constructors are removed.

The compiler then reaches every object of the program through the patch's
GOT (or a data word, for an address in an initializer); the pipeline lists
the import symbols the compiled object refers to in its molt_imports table
({symbol, name, tu|NULL}), which the runtime binds.  The generated
declarations are wrapped in `#pragma GCC diagnostic` push/ignored/pop so
that the user's warnings (-Wredundant-decls, -Wnested-externs,
-Wmissing-variable-declarations, ...) stay on for the rest of the file.
"""
import re

import clang.cindex as ci

from ..elf import FUNC_SYMTYPES, VAR_SYMTYPES
from ..unit import CK, SC, top_level_token
from ..weave import VERSION_PATCH, Weaver, c_string, export_source_name
from .plan import Import

# Prefix of the import symbols of statics (molt/abi.h MOLT__IMPORT_PREFIX).
IMPORT_PREFIX = "molt.imp."

# Warnings a generated declaration could trigger; unknown ones are skipped
# by both compilers thanks to the first two lines (gcc knows -Wpragmas,
# clang -Wunknown-warning-option).
DECL_WARNINGS = ("-Wpragmas", "-Wunknown-warning-option", "-Wredundant-decls",
                 "-Wnested-externs", "-Wmissing-variable-declarations",
                 "-Wmissing-declarations", "-Wshadow", "-Wunused-variable",
                 "-Wunused-function", "-Wunused-const-variable")
DIAG_PUSH = ("#pragma GCC diagnostic push\n"
             + "".join('#pragma GCC diagnostic ignored "%s"\n' % w for w in DECL_WARNINGS))
DIAG_POP = "#pragma GCC diagnostic pop\n"


class WeaveError(Exception):
    pass


class ImportTable:
    """The import symbols of one patch: a global is its own name, a static
    gets `molt.imp.<n>`, one per (file, name) over the whole patch, so two
    files with statics of the same name can be in one patch."""

    def __init__(self):
        self.statics = {}       # (file key, name) -> Import
        self.by_symbol = {}     # symbol -> Import

    def static(self, key, name, tu, is_func, tls=False):
        k = (key, name)
        imp = self.statics.get(k)
        if imp is None:
            imp = Import(IMPORT_PREFIX + str(len(self.statics) + 1), name, tu, is_func, tls)
            self.statics[k] = imp
            self.by_symbol[imp.symbol] = imp
        return imp

    def global_(self, name, is_func, tls=False):
        imp = self.by_symbol.get(name)
        if imp is None:
            imp = Import(name, name, None, is_func, tls)
            self.by_symbol[name] = imp
        return imp


class PatchWeaver(Weaver):
    def __init__(self, unit, include_dir, report, plan, imports=None, key=None):
        Weaver.__init__(self, unit, include_dir, report)
        self.plan = plan
        self.target = plan.target
        self.table = imports if imports is not None else ImportTable()
        self.key = key or unit.display
        self.pfns = []           # (name, tu or None, impl)
        self.dropped = []        # byte ranges whose code is not compiled
        # file-scope statics the program has no symbol for (new ones, or
        # folded away by the compiler): their definitions stay in the patch
        self.private_statics = []   # (name, line)

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

    # -- what is the program's ------------------------------------------------------
    def program_var(self, v):
        """Import for a variable declaration the running program defines, or
        None (locals, new variables, library variables)."""
        u, t = self.u, self.target
        parent = v.semantic_parent
        if parent is not None and parent.kind == CK.FUNCTION_DECL:
            return None     # static locals: _local_statics
        tls = v.tls_kind != ci.TLSKind.NONE if hasattr(v, "tls_kind") else False
        if v.linkage == ci.LinkageKind.INTERNAL:
            n = t.static_count(u.tu_name, v.spelling, VAR_SYMTYPES)
            if n == 0:
                self._check_renamed(v, v.spelling)
                if v.is_definition():
                    self.private_statics.append((v.spelling, v.location.line))
                return None
            if n > 1:
                self.report.warn("%s: static '%s' exists in several files named %s in the target"
                                 % (u.display, v.spelling, u.tu_name))
            return self.table.static(self.key, v.spelling, u.tu_name, False, tls)
        if t.has_global(v.spelling, VAR_SYMTYPES):
            return self.table.global_(v.spelling, False, tls)
        return None

    def program_static_func(self, c):
        """Import for a static function of this file that the patch reaches
        in the program (unchanged, or replaced: &f and recursive calls), or
        None (private copies, removed functions, static inline functions of
        headers)."""
        role = self.plan.roles.get(c.get_usr())
        if role in ("copy", "removed"):
            return None
        if role is None:
            d = c.get_definition()
            if d is not None and not self.u.in_main(d):
                return None
        if self.target.static_count(self.u.tu_name, c.spelling, FUNC_SYMTYPES):
            return self.table.static(self.key, c.spelling, self.u.tu_name, True)
        return None

    # -- text helpers ----------------------------------------------------------------
    def _line_col(self, off):
        d = self.u.data
        return d.count(b"\n", 0, off) + 1, off - d.rfind(b"\n", 0, off)

    def _at(self, off):
        line, col = self._line_col(off)
        return self.linemark(line) + " " * (col - 1)

    def wrap(self, start, end):
        """Diagnostics of the generated declaration in [start, end) off
        (see DECL_WARNINGS); the code around it keeps lines and columns."""
        self.rw.insert(start, "\n" + DIAG_PUSH + self._at(start))
        self.rw.insert(end, "\n" + DIAG_POP + self._at(end))

    def declarator_end(self, name_off, name, limit):
        """End offset of the declarator whose identifier is at name_off: past
        the brackets that follow the name (`[N]`, `(params)`, the `)` of
        `(*name)`), before an initializer, attributes, an asm label, a
        macro or a directive."""
        end = name_off + len(name.encode())
        depth = 0
        for t in self.u.tokens_in(end, limit):
            sp = t.spelling
            if sp in ("(", "["):
                depth += 1
            elif sp in (")", "]"):
                if depth:
                    depth -= 1
            elif depth == 0:
                break
            end = t.end
        return end

    _DIRECTIVE = re.compile(rb"^[ \t]*#[ \t]*(define|undef|if|ifdef|ifndef|elif|else|endif|pragma)\b")

    def directives_in(self, start, end):
        """The preprocessor directives on lines that start inside [start,
        end): a dropped definition or initializer keeps them (a #define in
        a table is still needed below it)."""
        out = []
        cont = False
        lines = self.u.data[start:end].split(b"\n")
        for i, ln in enumerate(lines):
            if cont or (i > 0 and self._DIRECTIVE.match(ln)):
                out.append(ln.decode("utf-8", "surrogateescape"))
                cont = ln.rstrip(b"\r").endswith(b"\\")
        return out

    def drop(self, start, end, replacement=""):
        """Replaces [start, end) by `replacement`, keeping the directives in
        it and the position of the text after it."""
        directives = self.directives_in(start, end)
        text = replacement
        if directives:
            text += "\n" + "\n".join(directives)
        if directives or "\n" in replacement:
            line, col = self._line_col(end)
            text += self.resume(line, col)
        self.rw.replace(start, end, text)
        self.dropped.append((start, end))

    # -- weaving -----------------------------------------------------------------------
    def weave(self, fns):
        u, rw = self.u, self.rw
        pfns = [fn for fn in fns if getattr(fn, "role", None) == "pfn"]
        for fn in fns:
            role = getattr(fn, "role", None)
            if role == "removed":
                self.drop(fn.ext_start, fn.ext_end)
            elif role == "import":
                self._import_definition(fn)
        self._file_scope_variables()
        self._static_function_declarations()
        for fn in pfns:
            if fn.plain:
                self._pfn_plain(fn)
            else:
                self._pfn_macro(fn)
        end = ["\n", self.include_molt(), self.push_guard(self.wrap_guard)]
        for name, tu, impl in self.pfns:
            end.append("__extension__ static const molt__patch_fn %s__molt_pfn MOLT__SECTION(\"molt_pfns\") = "
                       "{%s, %s, (void *)&%s};\n" % (name, c_string(name),
                                                    c_string(tu) if tu else "NULL", impl))
        end.append(self.pop_guard(self.wrap_guard))
        # an extern function's new version is named `f` for dladdr too
        # (the patch's link defines the version: pipeline.link)
        for name, tu, impl in self.pfns:
            if tu is None:
                end.append(export_source_name(name, impl, VERSION_PATCH))
        rw.insert(len(u.data), "".join(end))
        return rw.render()

    # -- variables ---------------------------------------------------------------------
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
                prev_end = cur[-1].extent.end.offset
                between = self.u.tokens_in(prev_end, s)
                if len(between) == 1 and between[0].spelling == ",":
                    cur.append(c)
                    continue
            cur = [c]
            groups.append(cur)
        return groups

    def _file_scope_variables(self):
        for group in self._var_groups():
            imps = [self.program_var(v) for v in group]
            if not any(imps):
                continue
            names = ", ".join(v.spelling for v in group)
            if not all(imps):
                self.error(group[0], "the declaration of %s declares objects of the running "
                                     "program and others it does not have (optimized away); "
                                     "moltcc cannot make only some of them references: declare "
                                     "them separately" % names)
            self._declaration(group[0].extent.start.offset, self._group_end(group), group, imps)

    def _group_end(self, group):
        e = group[-1].extent.end.offset
        semi = top_level_token(self.u.tokens_in(e, len(self.u.data)), ";")
        return semi.end if semi is not None else e

    def _declaration(self, start, end, vars_, imps, local=False):
        """`[static] T a[] = {...}, b;` -> `extern T a[N] __asm__("molt.imp.1"), b ...;`
        in place (asm labels for statics only), wrapped in DIAG_PUSH/POP."""
        u, rw = self.u, self.rw
        names = ", ".join(v.spelling for v in vars_)
        written = {}
        for v in vars_:
            # The name as written: the name itself, or one identifier that a
            # macro turns into it (dnsmasq: `#define daemon dnsmasq_daemon`
            # then `struct daemon *daemon;`); the declarator is edited around
            # what is written, and the symbol is the name (or its label).
            tok = u.tok_at(v.location.offset)
            if tok is not None and (tok.spelling == v.spelling or (
                    re.fullmatch(r"[A-Za-z_]\w*", tok.spelling)
                    and u.macros_in(tok.start, tok.end))):
                written[v.hash] = tok.spelling
        if u.tok_at(start) is None or len(written) != len(vars_):
            self.error(vars_[0], "the declaration of %s comes from a macro; moltcc cannot make "
                                 "it refer to the running program's object" % names)
        for v, imp in zip(vars_, imps):
            # (a thread-local one too: the pipeline refuses it if the patch uses it)
            if imp.where is None:
                imp.where = "%s:%d" % (u.display, v.location.line)
        self.wrap(start, end)   # first: its text goes before the edits at `start`
        spec = u.tokens_in(start, vars_[0].location.offset)
        storage = [t for t in spec if t.spelling in ("static", "extern")]
        if storage:
            if storage[0].spelling == "static":
                rw.replace(storage[0].start, storage[0].end, "extern")
        elif vars_[0].storage_class == SC.STATIC or local:
            self.error(vars_[0], "the 'static' of %s comes from a macro; moltcc cannot make it "
                                 "refer to the running program's object" % names)
        else:
            rw.insert(start, "extern ")
        for v, imp in zip(vars_, imps):
            name_off = v.location.offset
            vend = v.extent.end.offset
            dend = self.declarator_end(name_off, written[v.hash], vend)
            self._complete_array(v, name_off, dend)
            label = ' __asm__(%s)' % c_string(imp.symbol) if imp.tu else ""
            eq = top_level_token(u.tokens_in(dend, vend), "=")
            if eq is not None:
                if label:
                    rw.insert(dend, label)
                self.drop(eq.start, vend)
            elif label:
                rw.insert(dend, label)

    def _complete_array(self, v, name_off, dend):
        """`T a[] = {1, 2, 3}` -> `T a[3]`: without its initializer the
        declaration keeps the complete type (sizeof, -Wextern-initializer)."""
        d = v.get_definition() or v
        t = d.type
        if t.kind != ci.TypeKind.CONSTANTARRAY:
            return
        toks = self.u.tokens_in(name_off, dend)
        for i, tk in enumerate(toks[:-1]):
            if tk.spelling == "[":
                if toks[i + 1].spelling == "]":
                    self.rw.insert(toks[i + 1].start, str(t.get_array_size()))
                return

    # -- functions ---------------------------------------------------------------------
    def _label(self, imp):
        return ' __asm__(%s)' % c_string(imp.symbol) if imp is not None and imp.tu else ""

    def _static_function_declarations(self):
        """Every prototype of a static function the patch reaches in the
        program: `extern ... __asm__("molt.imp.<n>")` (a `static` one left
        would make the name internal, never defined)."""
        u, rw = self.u, self.rw
        for c in u.top:
            if c.kind != CK.FUNCTION_DECL or c.is_definition():
                continue
            if c.linkage != ci.LinkageKind.INTERNAL:
                continue
            imp = self.program_static_func(c)
            if imp is None:
                continue
            start = c.extent.start.offset
            end = c.extent.end.offset
            if u.is_literal(c.location.offset, c.spelling):
                label_at = self.declarator_end(c.location.offset, c.spelling, end)
            elif [t.spelling for t in u.tokens_in(end - 1, end)] == [")"]:
                # `static HANDLE_FUNC(name);`: the macro writes the whole
                # declarator, the label goes after its invocation
                label_at = end
            else:
                label_at = None
            if u.tok_at(start) is None or label_at is None:
                self.error(c, "the declaration of static function '%s' comes from a macro; "
                              "moltcc cannot make it refer to the running program's function"
                              % c.spelling)
            semi = top_level_token(u.tokens_in(end, len(u.data)), ";")
            self.wrap(start, semi.end if semi is not None else end)
            toks = u.tokens_in(start, c.location.offset)
            st = [t for t in toks if t.spelling == "static"]
            if st:
                rw.replace(st[0].start, st[0].end, "extern")
            else:
                rw.insert(start, "extern ")
            rw.insert(label_at, self._label(imp))

    def _prototype(self, fn, imp):
        """The header of a plain definition as an extern prototype (asm
        label of a static)."""
        text = self.header_variant(fn, fn.name, storage="extern" if fn.static else None,
                                   label_at=self.declarator_end(fn.name_off, fn.name,
                                                                self.header_end(fn)),
                                   label=self._label(imp))
        return text.rstrip()

    def _import_definition(self, fn):
        """The program's unchanged function: its definition becomes a
        prototype (none when a declaration precedes it), directives inside
        it kept."""
        proto = ""
        imp = self.program_static_func(fn.c) if fn.static else None
        if fn.static and imp is None:
            self.error(fn.c, "static function '%s' is used but is neither compiled into the "
                             "patch nor present in the target" % fn.name)
        if not fn.has_prior_decl:
            if fn.plain:
                proto = self._prototype(fn, imp)
            else:
                ret, decl, _, _ = self.macro_signature(fn)
                proto = "%s__typeof__(%s) %s(%s)%s" % ("extern " if fn.static else "", ret,
                                                       fn.name, decl, self._label(imp))
            proto = "\n" + DIAG_PUSH + proto + ";\n" + DIAG_POP
        self.drop(fn.ext_start, fn.ext_end, proto)

    def _local_statics(self, fn):
        """Static locals of a replaced function that the program has (the
        program build hoisted them as molt__<f>__<var>): block-scope
        `extern T var __asm__("molt.imp.<n>");` in place; new ones stay
        the patch's own."""
        u = self.u
        top_names = {c.spelling for c in u.top if c.kind in (CK.VAR_DECL, CK.FUNCTION_DECL)}
        for h in fn.hoists:
            imps = []
            for v, new in h.vars:
                imp = None
                if self.target.static_count(u.tu_name, new, VAR_SYMTYPES):
                    imp = self.table.static(self.key, new, u.tu_name, False,
                                            v.tls_kind != ci.TLSKind.NONE)
                else:
                    self._check_renamed(v, new)
                imps.append(imp)
            if not any(imps):
                continue
            names = ", ".join(v.spelling for v, _ in h.vars)
            if not all(imps):
                self.error(h.stmt, "the declaration of %s in '%s' declares static locals the "
                                   "running program has and others it does not have; declare "
                                   "them separately" % (names, fn.name))
            for v, _ in h.vars:
                if v.spelling in top_names:
                    self.error(v, "static local '%s' of '%s' has the name of a file-scope "
                                  "declaration; moltcc cannot declare it as the running "
                                  "program's object there (rename it)" % (v.spelling, fn.name))
            self._declaration(h.start, h.end, [v for v, _ in h.vars], imps, local=True)

    def _pfn_plain(self, fn):
        u, rw = self.u, self.rw
        impl = fn.name + "__molt_p"
        imp = self.program_static_func(fn.c) if fn.static else None
        if fn.static and imp is None:
            self.error(fn.c, "static function '%s' is not in the target" % fn.name)
        self._local_statics(fn)
        header = self._prototype(fn, imp)
        prefix = self.rename_in_place(fn, impl)
        self.pfns.append((fn.name, u.tu_name if fn.static else None, impl))
        self.func_name_macros(fn)

        def block():
            out = ["\n"]
            if not fn.has_prior_decl:
                out.append(DIAG_PUSH + self.linemark(fn.line) + header + ";\n" + DIAG_POP)
            out.append(self.resume_with_prefix(fn, prefix))
            return "".join(out)

        rw.insert(fn.ext_start, block)

    def _pfn_macro(self, fn):
        u, rw = self.u, self.rw
        impl = fn.name + "__molt_p"
        ret, decl, _, _ = self.macro_signature(fn)
        imp = self.program_static_func(fn.c) if fn.static else None
        self.pfns.append((fn.name, u.tu_name if fn.static else None, impl))
        proto = ""
        if not fn.has_prior_decl:
            proto = DIAG_PUSH + "extern __typeof__(%s) %s(%s)%s;\n" % (
                ret, fn.name, decl, self._label(imp)) + DIAG_POP
        rw.insert(fn.ext_start, "\n" + self.linemark(fn.line) + proto
                  + "static %s %s(%s);\n#define %s %s\n" % (ret, impl, decl, fn.name, impl)
                  + self.linemark(fn.line) + " " * (fn.col - 1))
        rw.insert(fn.ext_end, "\n#undef %s\n" % fn.name
                  + self.linemark(fn.end_line) + " " * (fn.end_col - 1))


def patch_header_source(patch_id, description, provenance="", pinned_reasons=(), imports=()):
    """The patch header (MOLT__PATCH_HEADER: id, description, provenance,
    flags, pinned reasons) and the import table ({symbol, name, tu|NULL} in
    section molt_imports) of the whole patch."""
    out = ["/* generated by moltcc: the patch header, the note moltstamp fills in, the imports */\n",
           "#include <molt.h>\n"]
    reasons = "\n".join(pinned_reasons)
    out.append("MOLT__PATCH_HEADER(%s, %s, %s, %s, %s);\n" % (
        c_string(patch_id), c_string(description), c_string(provenance),
        "MOLT__PATCH_PINNED" if pinned_reasons else "0u", c_string(reasons)))
    for i, imp in enumerate(imports):
        out.append("static const molt__import molt__import_%d MOLT__SECTION(\"molt_imports\") = "
                   "{%s, %s, %s};\n" % (i, c_string(imp.symbol), c_string(imp.name),
                                       c_string(imp.tu) if imp.tu else "NULL"))
    return "".join(out)
