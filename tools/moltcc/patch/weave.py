"""The patch weaver: one new source rewritten into patch code.

For every function that is updatable in the target:

    static <header renamed f__molt_p> { new body }
    static const molt__patch_fn f__molt_pfn ... = {"f", tu|NULL, &f__molt_p};

and every reference to an object of the running program becomes
`(*(__typeof__(x) *)molt__imp_x)`, where `static void *molt__imp_x` holds the
address of the patch's import symbol for x (molt/abi.h, ABI 4): the runtime
binds that symbol's data-word relocation from the molt__import record before
the patch is switched in.
"""
import re

import clang.cindex as ci

from ..elf import FUNC_SYMTYPES, VAR_SYMTYPES
from ..unit import CK, SC, top_level_token
from ..weave import Weaver, c_string
from .plan import Import


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
            elif getattr(fn, "role", None) == "import":
                self._import_definition(fn)

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
        slots = "".join("extern char %s__sym[] __asm__(%s);\nstatic void *%s = %s__sym;\n" % (
            s, c_string(self.imports[s].import_symbol), s, s) for s in sorted(self.imports))
        if slots:
            rw.insert(self.file_start(), slots + self.linemark(1))
        end = ["\n", self.include_molt(), self.push_guard(self.wrap_guard)]
        for s in sorted(self.imports):
            imp = self.imports[s]
            end.append("static const molt__import %s__molt_imp MOLT__SECTION(\"molt_imports\") = "
                       "{%s, %s, %s};\n" % (
                           imp.symbol, c_string(imp.import_symbol), c_string(imp.symbol),
                           c_string(imp.tu) if imp.tu else "NULL"))
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
            semi = top_level_token(self.u.tokens_in(e, len(self.u.data)), ";")
            if semi is not None:
                return semi.end
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
            eq = top_level_token(u.tokens_in(v.location.offset, v.extent.end.offset), "=")
            if eq is not None:
                edits.append((eq.start, v.extent.end.offset))
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
        imported |= {r.spelling for r in self.u.top if r.kind == CK.FUNCTION_DECL
                     and self.plan.roles.get(r.get_usr()) == "import"}
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


    # -- role 'import' (patch from a fix: patch/pipeline.py) ------------------------
    _DIRECTIVE = re.compile(rb"^[ \t]*#[ \t]*(define|undef|if|ifdef|ifndef|elif|else|endif)\b")

    def _import_definition(self, fn):
        """The program's unchanged function: its definition becomes a
        prototype (none when a declaration precedes it, so -Wredundant-decls
        stays quiet), for __typeof__ in the import expressions that replace
        every reference.  Macro definitions and conditionals inside it are
        kept; the text after it stays on its own lines."""
        u, rw = self.u, self.rw
        proto = ""
        if not fn.has_prior_decl:
            if fn.plain:
                proto = self.header_variant(fn, fn.name, storage="extern" if fn.static else None)
            else:
                ret, decl, _, _ = self.macro_signature(fn)
                proto = "%s__typeof__(%s) %s(%s)" % ("extern " if fn.static else "", ret,
                                                     fn.name, decl)
            proto += ";"
        directives = []
        cont = False
        lines = u.data[fn.ext_start:fn.ext_end].split(b"\n")
        for i, ln in enumerate(lines):
            if cont or (i > 0 and self._DIRECTIVE.match(ln)):
                directives.append(ln.decode("utf-8", "surrogateescape"))
                cont = ln.rstrip(b"\r").endswith(b"\\")
        text = proto
        if directives:
            text += "\n" + "\n".join(directives)
        rw.replace(fn.ext_start, fn.ext_end, text + self.resume(fn.end_line, fn.end_col))
        self.dropped.append((fn.ext_start, fn.ext_end))


def patch_header_source(patch_id, description):
    return ("/* generated by moltcc: the patch header and the note moltstamp fills in */\n"
            "#include <molt.h>\n"
            "MOLT_PATCH(%s, %s);\n" % (c_string(patch_id), c_string(description)))
