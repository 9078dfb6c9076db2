"""A hot patch from a fix: what it contains, decided by comparing builds
(issue 10; design: notes/patchbuild-design.md §0, §3-§6).

    rc = build_from_fix(s, prog, fix, builds, extra_objects)

For every affected translation unit (source.TUBuild):

1. three builds as the program build made them -- woven with the record's
   selection (--molt-updatable, --molt-funcs), compiled with the recorded
   compiler and flags plus -ffunction-sections -fdata-sections -g: the
   original, the new version, and the new version "line-remapped" (every
   changed file of the fix with #line directives that keep unchanged
   lines on their original numbers, in a mirror of its own);
2. objdiff.compare_objects: which functions changed, which only moved
   lines, which data changed, what cannot be shipped at all;
   typecheck.check_types: what a hot patch cannot carry (layouts,
   signatures of replaced functions, initial values, main/constructors);
3. a static function whose signature changed is carried as a new private
   function when every reference to it in the original TU is a direct call
   from a function (its address never goes into data or a variable): the
   comparison runs again with it not updatable, which ships every caller;
4. roles (PatchPlan/assign_roles): 'pfn' for the changed updatable
   functions, 'copy' for new functions, changed non-updatable ones and
   functions the shipped code needs that the program does not have,
   'import' for everything else the program has (a reference to the live
   instance), 'removed' for what nothing needs;
5. lifetimes (lifetime.find_escapes): pointers into the patch that may
   outlive it make the patch pinned (reasons file:line);
6. the patch source of each TU that ships something (PatchWeaver),
   compiled with the recorded flags (warnings and -Werror included) plus
   the patch flags, linked with the patch header, stamped.

Every refusal of every TU built is collected and printed together, then
the way forward; nothing is written at -o then.  TUs are built in stages
(Pipeline.stages): a refused stage ends the builds.  The report (stderr, and JSON with
--molt-report FILE) lists what was replaced, new functions, private
copies, line-only changes, notes, pinned reasons and the provenance.
"""
import concurrent.futures
import copy
import json
import os
import re
import subprocess
import sys
import time

import clang.cindex as ci

from .. import gccargs
from ..elf import FUNC_SYMTYPES, VAR_SYMTYPES, rename_debug_names
from ..errors import Fatal
from ..markers import Selection, explicitly_marked
from ..session import Report
from ..toolchain import color_flags
from ..unit import CK, SC
from ..weave import VERSION_PATCH
from .plan import PatchPlan, assign_roles
from .weave import IMPORT_PREFIX, ImportTable, PatchWeaver, WeaveError, patch_header_source
from . import callbacks, ctors
from . import source as fixsource

COMPARE_FLAGS = ["-ffunction-sections", "-fdata-sections", "-g"]
GCC_COMPARE_FLAGS = ["-fno-eliminate-unused-debug-types"]
# The patch reaches the program through its GOT (-fPIC -fno-plt: calls
# too), its own definitions stay inside it (-fvisibility=hidden), and it
# registers nothing at load time.  A patch keeps only what its new versions
# need of a whole file: "unused" warnings about what the generator dropped
# are not the user's (the user's warnings and -Werror stay on otherwise,
# and the generated declarations turn off the few they could trigger).
PATCH_CFLAGS = ["-fPIC", "-fno-plt", "-fvisibility=hidden", "-DMOLT__NO_AUTO_REGISTER",
                "-Wno-unused-function", "-Wno-unused-variable", "-Wno-unused-const-variable"]

# Symbols of the sanitizer runtimes that instrumented code refers to (PROG
# may hold a copy-relocated one): the dynamic loader binds them as usual.
SANITIZER_PREFIXES = ("__asan_", "__tsan_", "__ubsan_", "__lsan_", "__msan_", "__sanitizer_")

WAY_FORWARD = ("a hot patch keeps every live object and every caller as they are: carry an added "
               "field as shadow data (docs/guide.md, \"Adding a field: shadow data\"), or change "
               "layouts, signatures and initial values with a full update (molt update)")

WAY_FORWARD_PLAIN = ("an attach patch keeps every live object and every caller as they are: a "
                     "fix that changes layouts, signatures or initial values needs the fixed "
                     "program started in its place")

_C_LIKE = (".c", ".h", ".inc", ".def", ".tab", ".x")


class BuildFailed(Fatal):
    """Compiler messages were already printed; one line says what failed."""


# ---------------------------------------------------------------------------
# The target
# ---------------------------------------------------------------------------

class Target:
    """PROG's symbols, as the comparison and the roles ask for them.  In a
    plain PROG (plain.PlainSymtab) every function with a symbol is
    replaceable at its address; in a moltcc build, the updatable ones."""

    def __init__(self, symtab, path):
        self.symtab = symtab
        self.path = path

    def updatable(self, tu, name):
        if hasattr(self.symtab, "updatable"):
            return self.symtab.updatable(tu, name)
        return self.symtab.static_count(tu, name + "__molt_v0", FUNC_SYMTYPES) > 0

    def has(self, tu, symbol, is_static):
        if is_static:
            return self.symtab.static_count(tu, symbol) > 0
        return self.symtab.has_global(symbol)

    def has_function(self, tu, name, is_static):
        if is_static:
            return self.symtab.static_count(tu, name, FUNC_SYMTYPES) > 0
        return self.symtab.has_global(name, FUNC_SYMTYPES)

    def has_variable(self, tu, name, is_static):
        if is_static:
            return self.symtab.static_count(tu, name, VAR_SYMTYPES) > 0
        return self.symtab.has_global(name, VAR_SYMTYPES)


_compiler_kind = {}


def is_clang(compiler):
    """Whether the recorded compiler is clang (options differ a little)."""
    key = tuple(compiler)
    if key not in _compiler_kind:
        try:
            p = subprocess.run(list(compiler) + ["--version"], capture_output=True, text=True)
            _compiler_kind[key] = "clang" in (p.stdout + p.stderr).split("\n", 1)[0].lower()
        except OSError:
            _compiler_kind[key] = "clang" in os.path.basename(compiler[0])
    return _compiler_kind[key]


# ---------------------------------------------------------------------------
# One affected translation unit
# ---------------------------------------------------------------------------

class Variant:
    """One build of a TU: its Compile (source.Compile), the libclang Unit
    of its source (woven TUs), the file compiled and the object."""

    def __init__(self, name, comp):
        self.name = name
        self.comp = comp
        self.unit = None
        self.compiled = None        # the file given to the compiler
        self.object = None
        self.error = None           # compiler stderr when it failed


class TU:
    def __init__(self, b):
        self.b = b
        self.rel = b.rel
        self.tu = os.path.basename(b.record.file)
        self.variants = {}          # orig / new / remap -> Variant
        self.comparison = None
        self.check = None
        self.carried = []           # static functions carried as new private functions
        self.refusals = []          # [(where text, message)]
        self.errors = []            # the build of the patch source failed (one line each)
        self.notes = []
        self.roles = {}             # function name -> role
        self.orig_names = None      # functions the original source defines
        self.given = None           # the new source as the user named it (old form)
        self.fns = []
        self.escapes = None
        self.patch_object = None

    def shown(self, text):
        """A message that starts with this TU's source as libclang named it
        (its recorded name) with the file named as the user knows it: as
        given on the command line (the old form), else relative to the
        source root (as in the diff)."""
        name = self.given or self.rel
        for old in (self.b.record.file, self.rel):
            if text.startswith(old + ":"):
                return name + text[len(old):]
        return text


def _words(comp, path):
    return ["-x", comp.lang, path, "-x", "none"] if comp.lang else [path]


def _argv(comp, path, output, front=(), extra=()):
    return comp.compiler + list(front) + comp.flags + list(extra) + gccargs.env_flags() + ["-c"] \
        + _words(comp, path) + ["-o", output]


def _run(s, argv, comp):
    s.tools.show(argv)
    try:
        p = subprocess.run(argv, cwd=comp.cwd, env=comp.environ(), capture_output=True)
    except FileNotFoundError:
        raise Fatal("cannot run %s" % argv[0])
    return p.returncode, p.stderr.decode("utf-8", "replace")


class Pipeline:
    def __init__(self, s, symtab, prog, fix, builds, extra_objects=()):
        self.s = s
        self.symtab = symtab
        self.prog = prog
        # PROG built without moltcc: an attach patch (plain.py); its TUs
        # are parsed but not woven, the patch is resolved here
        self.plain = not prog.recorded
        self.fix = fix
        self.builds = builds
        self.extra_objects = list(extra_objects)
        self.opts = s.options
        self.layout = s.layout
        self.report = s.report
        self.tus = [TU(b) for b in builds]
        for t in self.tus:
            t.given = fix.given.get(t.rel)
        self.started = time.time()
        self.quiet = Report(False)          # the comparison weaves' notes are not the user's
        self.index = None
        self.target = None
        self.refusals = []                  # merged over all TUs: [(where, message)]
        self.pinned = []
        self.import_table = ImportTable()   # the import symbols of the whole patch
        self.address_taken = []
        self.times = {}
        self.remapped = None                # remap_tree(), made once for every stage
        self.callbacks_object = None        # --molt-callbacks FILE.c, compiled
        self.callbacks = []                 # [(kind, name)] of the linked patch
        self.unbuilt = []                   # TUs not built: the fix was refused first

    # -- paths ------------------------------------------------------------------
    def show_path(self, path, t=None):
        """A file of the build as the user knows it: relative to the source
        root when under it (a relative name is taken from t's compile
        directory, as in its DWARF); t's own source as the user gave it."""
        if not path:
            return path
        root = self.fix.root
        for top in [v.comp.mirror for u in self.tus for v in u.variants.values() if v.comp.mirror]:
            if path.startswith(top + "/"):
                path = path[len(top):]
        if t is not None and not os.path.isabs(path):
            path = os.path.normpath(os.path.join(t.b.record.directory, path))
        if os.path.isabs(path) and root != "/" and path.startswith(root + "/"):
            path = path[len(root) + 1:]
        if t is not None and t.given and path == t.rel:
            return t.given
        return path

    def where(self, w, t):
        """'file:line' of a (file, line) of t's builds, else t's file."""
        if not w:
            return t.given or t.rel
        return "%s:%s" % (self.show_path(w[0], t), w[1])

    # -- 1. builds ----------------------------------------------------------------
    def remap_tree(self):
        """The mirror of the line-remapped new sources (every changed C-like
        file of the fix), or None when no line moved."""
        rfix = copy.copy(self.fix)
        rfix.files = {}
        moved = False
        for rel, f in self.fix.files.items():
            g = fixsource.ChangedFile(rel)
            g.orig, g.new = f.orig, f.new
            if f.orig is not None and f.new is not None and f.orig != f.new \
                    and rel.endswith(_C_LIKE):
                text = remap(f.orig, f.new)
                if text != f.new:
                    g.new = text
                    moved = True
            rfix.files[rel] = g
        if not moved:
            return None
        top = os.path.join(os.path.abspath(self.s.work.file("fix")), "remap")
        return fixsource._build_mirror(self.prog, rfix, self.builds, top, "new")

    def weave_variant(self, t, v):
        """Writes the source this variant compiles: woven as the program
        build wove it, or the plain source."""
        b = t.b
        v.compiled = v.comp.source
        if not b.record.woven and not (self.plain and v.name in ("orig", "new")):
            return
        from ..unit import Unit, UnitError
        from ..weave import ProgramWeaver
        if self.index is None:
            import clang.cindex as ci
            self.index = ci.Index.create()
        cargs = gccargs.libclang_args(v.comp.flags, self.layout.include,
                                      self.layout.sanitizers()) + \
            ["-working-directory=" + v.comp.cwd]
        # libclang's -working-directory also changes the process's own
        # directory: the user's relative paths (-o, the target) need it back
        here = os.getcwd()
        try:
            v.unit = Unit(v.comp.source, b.record.file, cargs, self.index)
        except UnitError as e:
            raise Fatal("%s (%s version)" % (e, v.name))
        finally:
            os.chdir(here)
        if not b.record.woven:
            return          # a plain PROG: the roles need the parse, nothing is woven
        sel = Selection(b.record.updatable == "all", b.record.funcs, False)
        w = ProgramWeaver(v.unit, self.layout.include, self.quiet)
        fns = w.select(sel)
        if not fns:
            return
        text = w.weave(fns)
        d = os.path.join(b.objdir, v.name)
        os.makedirs(d, exist_ok=True)
        v.compiled = os.path.join(d, os.path.basename(b.record.abspath))
        with open(v.compiled, "wb") as f:
            f.write(text)

    def compile_variant(self, t, v):
        comp = v.comp
        v.object = os.path.join(t.b.objdir, "%s.o" % v.name)
        front = []
        if v.compiled != comp.source:
            front = ["-iquote", os.path.dirname(comp.source)]
        extra = ["-I" + self.layout.include] + COMPARE_FLAGS
        if not is_clang(comp.compiler):
            extra += GCC_COMPARE_FLAGS
        rc, err = _run(self.s, _argv(comp, v.compiled, v.object, front, extra), comp)
        if rc != 0:
            v.error = err
            v.object = None

    def plain_compiles(self, t, v):
        """(ok, stderr) of the variant's own source compiled as recorded."""
        comp = v.comp
        out = os.path.join(t.b.objdir, "%s-plain.o" % v.name)
        return _run(self.s, _argv(comp, comp.input, out, (), ["-I" + self.layout.include]), comp)

    def stages(self):
        """The TUs to build and check, in stages: the next stage is built
        only when no TU so far was refused.

        A fix of a header reaches every file that reads it (dnsmasq's
        dnsmasq.h: 43 files, three builds each), and one refusal refuses the
        whole fix.  So the files whose own source changed come first, then
        the other readers in stages that double in size (as many as there
        are processors, then twice as many, ...): a refused fix is known
        after a few compiles instead of all of them, and an accepted one
        loses little parallelism.  What a refusal costs is that uses in the
        files not built are not listed (the message says so)."""
        own = [t for t in self.tus if t.b.source_changed]
        others = [t for t in self.tus if not t.b.source_changed]
        stages = [own] if own else []
        size = os.cpu_count() or 2
        while others:
            stages.append(others[:size])
            others = others[size:]
            size *= 2
        return stages

    def build_objects(self, tus):
        if self.remapped is None:
            self.remapped = (self.remap_tree(),)
        rtree = self.remapped[0]
        for t in tus:
            b = t.b
            t.variants["orig"] = Variant("orig", b.orig)
            t.variants["new"] = Variant("new", b.new)
            if rtree is not None:
                flags, inp, lang = fixsource._split_recorded(b.record)
                t.variants["remap"] = Variant("remap", rtree.compile(b.record, flags, inp, lang))
            for v in t.variants.values():
                self.weave_variant(t, v)
        jobs = [(t, v) for t in tus for v in t.variants.values()]
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
            list(ex.map(lambda tv: self.compile_variant(*tv), jobs))
        for t in tus:
            for name in ("orig", "new"):
                v = t.variants[name]
                if v.object is not None:
                    continue
                rc, err = self.plain_compiles(t, v)
                if rc != 0:
                    sys.stderr.write(err)
                    if name == "orig":
                        raise BuildFailed("%s: the original source does not compile with the flags "
                                          "of %s's compile record any more (the compiler's "
                                          "messages are above)" % (t.rel, self.prog.path))
                    raise BuildFailed("%s: the fixed source does not compile (the compiler's "
                                      "messages are above)" % t.rel)
                sys.stderr.write(v.error)
                self.s.work.keep = True
                raise Fatal("internal error: the woven %s version of %s does not compile, but "
                            "the source does; please report this (sources kept in %s)"
                            % (name, t.rel, self.s.work.path))
            r = t.variants.get("remap")
            if r is not None and r.object is None:
                t.notes.append("%s: the line-remapped build failed, so a change of line numbers "
                               "only (__LINE__, assert) counts as a change" % t.rel)

    # -- 2./3. comparison and checks -----------------------------------------------------
    def compare(self, t):
        from .objdiff import compare_objects
        from .typecheck import check_types
        tgt, tu = self.target, t.tu
        o, n = t.variants["orig"].object, t.variants["new"].object
        r = t.variants["remap"].object if "remap" in t.variants else n
        carried = set()
        has = lambda sym, is_static: tgt.has(tu, sym, is_static)     # noqa: E731
        while True:
            upd = lambda name, c=frozenset(carried): tgt.updatable(tu, name) and name not in c  # noqa
            cmp = compare_objects(o, n, r, updatable=upd, target_has=has, tu=tu)
            chk = check_types(o, n, comparison=cmp, target_has=has)
            more = []
            replaced = {f.name: f for f in cmp.replaced}
            for ref in chk.refusals:
                if ref.kind != "signature":
                    continue
                name = ref.name.split(" ", 1)[1]
                item = replaced.get(name)
                if item is None or not item.static or name in carried:
                    continue
                why = self.address_taken_in_orig(t, name)
                if why is None:
                    more.append(name)
                else:
                    t.notes.append("%s: static function '%s' changed its signature and cannot be "
                                   "carried as a new private function: %s" % (t.rel, name, why))
            if not more:
                break
            carried.update(more)
        t.comparison, t.check, t.carried = cmp, chk, sorted(carried)
        for name in t.carried:
            t.notes.append("static function '%s' changed its signature: every reference to it is a "
                           "direct call in %s, so it goes into the patch as a new private "
                           "function, with all its callers" % (name, t.rel))

    def address_taken_in_orig(self, t, name):
        """None if every reference to the static function `name` in the
        original TU is a direct call from a function; else why not."""
        u = t.variants["orig"].unit
        if u is None:
            return "the original was not woven"
        for top in u.top:
            stack = [top]
            bad = self._non_call_refs(u, top, name, stack)
            if bad:
                return bad
        return None

    def _non_call_refs(self, u, c, name, stack):
        if c.kind == CK.DECL_REF_EXPR and c.referenced is not None and \
                c.referenced.kind == CK.FUNCTION_DECL and c.spelling == name:
            j, child = len(stack) - 2, c
            while j >= 0 and stack[j].kind in (CK.UNEXPOSED_EXPR, CK.PAREN_EXPR):
                child, j = stack[j], j - 1
            kids = list(stack[j].get_children()) if j >= 0 else []
            called = j >= 0 and stack[j].kind == CK.CALL_EXPR and kids and kids[0] == child
            if not called or stack[0].kind != CK.FUNCTION_DECL:
                where = "%s:%d" % (u.display, c.location.line)
                if stack[0].kind != CK.FUNCTION_DECL:
                    return "%s: its address is stored in '%s'" % (where, stack[0].spelling)
                return "%s: its address is taken in '%s'" % (where, stack[0].spelling)
        for ch in c.get_children():
            stack.append(ch)
            bad = self._non_call_refs(u, ch, name, stack)
            stack.pop()
            if bad:
                return bad
        return None

    def collect_refusals(self, t):
        for r in t.check.refusals:
            msg = "%s: %s" % (r.name, r.what)
            if r.users:
                msg += "; used by live code: " + _list(r.users)
            t.refusals.append((self.where(r.where, t), msg))

    # -- 4. roles ---------------------------------------------------------------------
    def decide_roles(self, t):
        """The role of every function defined in the new source."""
        cmp = t.comparison
        u = t.variants["new"].unit
        if u is None:
            return
        orig_funcs = t.orig_names = self.orig_names(t)
        replaced = {f.source for f in cmp.replaced}
        private = {f.source for f in cmp.private_copies} | set(t.carried)
        new = {f.source for f in cmp.new_functions} - orig_funcs
        tgt, tu = self.target, t.tu
        want = {}

        def first(fn):
            if fn.name == "main" or fn.ctor:
                return "removed"
            if fn.name in replaced:
                return "pfn"
            if fn.name in private or fn.name in new:
                return "copy"
            if fn.name not in orig_funcs:
                return "copy"           # new in the source (maybe inlined everywhere in new.o)
            if tgt.has_function(tu, fn.name, fn.static):
                return "import" if self.can_drop(u, fn) else "copy"
            return "unneeded"

        fns = [fn for fn in u.functions() if fn.body is not None]
        for fn in fns:
            want[fn.name] = first(fn)
        # What the shipped code needs that the program does not have: a
        # private copy (source level, whatever the compiler inlined).
        by_name = {fn.name: fn for fn in fns}
        todo = [fn for fn in fns if want[fn.name] in ("pfn", "copy")]
        todo += [c for c in u.top if c.kind == CK.VAR_DECL and c.is_definition()
                 and not tgt.has_variable(tu, c.spelling, c.linkage == ci.LinkageKind.INTERNAL)]
        seen = set()
        while todo:
            c = todo.pop()
            cur = c.c if hasattr(c, "c") else c
            if cur.hash in seen:
                continue
            seen.add(cur.hash)
            for d in cur.walk_preorder():
                if d.kind != CK.DECL_REF_EXPR or d.referenced is None or \
                        d.referenced.kind != CK.FUNCTION_DECL:
                    continue
                fn = by_name.get(d.referenced.spelling)
                if fn is not None and want[fn.name] == "unneeded":
                    want[fn.name] = "copy"
                    todo.append(fn)
        for name, role in want.items():
            if role == "unneeded":
                want[name] = "removed" if self.can_drop(u, by_name[name]) else "copy"
        t.roles = want

    @staticmethod
    def orig_names(t):
        """The functions the original source defines (source level)."""
        u = t.variants["orig"].unit
        if u is not None:
            return {c.spelling for c in u.top if c.kind == CK.FUNCTION_DECL and c.is_definition()}
        from .objdiff import source_name
        return {source_name(k) for k in t.comparison.orig_references}

    @staticmethod
    def can_drop(u, fn):
        """Whether the definition can be taken out of the text: its own
        tokens, or a macro expansion that defines nothing else."""
        if u.tok_at(fn.ext_start) is None:
            return False
        for c in u.top:
            if c.hash == fn.c.hash or not c.kind.is_declaration():
                continue        # macro expansions and directives are no definitions
            s, e = c.extent.start.offset, c.extent.end.offset
            if fn.ext_start <= s < fn.ext_end or fn.ext_start < e <= fn.ext_end:
                if c.kind == CK.FUNCTION_DECL and c.canonical.hash != fn.c.canonical.hash:
                    return False
                if c.kind != CK.FUNCTION_DECL:
                    return False
        return True

    def plan_unit(self, t, symtab):
        """PatchPlan with the decided roles; checks what only the source
        shows (a new version the weaver cannot make, static locals of
        private copies)."""
        u = t.variants["new"].unit
        plan = PatchPlan(symtab, self.prog.path, Selection(), self.report)
        fns = assign_roles(plan, u, lambda fn: t.roles.get(fn.name, "removed"))
        orig_names = t.orig_names
        for fn in fns:
            role = getattr(fn, "role", None)
            if role == "pfn" and fn.reason is not None:
                t.refusals.append((t.shown(fn.loc), "'%s' changed, but moltcc cannot make a new version "
                                           "of it: %s" % (fn.name, fn.reason)))
            if role == "copy" and fn.name in orig_names:
                for d in fn.body.walk_preorder():
                    if d.kind == CK.VAR_DECL and d.storage_class == SC.STATIC:
                        t.refusals.append((
                            t.shown("%s:%d" % (u.display, d.location.line)),
                            "static local '%s' of '%s': '%s' changed and is not updatable in %s, "
                            "so its new code is a private copy in the patch, which would start "
                            "with a fresh '%s' while the program's keeps its value (make '%s' "
                            "updatable)" % (d.spelling, fn.name, fn.name, self.prog.path,
                                            d.spelling, fn.name)))
            if role == "copy" and fn.name not in orig_names and explicitly_marked(fn, Selection()):
                self.report.warn("%s: '%s' is marked updatable but %s has no updatable function "
                                 "'%s'; it is compiled into the patch as a private function "
                                 "(a patch cannot add updatable functions)"
                                 % (t.shown(fn.loc), fn.name, self.prog.path, fn.name))
        t.fns = fns
        return plan

    def endless(self, t):
        """Notes for replaced functions that run a loop with no way out: a
        thread already inside one never reaches the new version."""
        u = t.variants["new"].unit
        for fn in t.fns:
            if getattr(fn, "role", None) != "pfn":
                continue
            line = endless_loop(u, fn.body)
            if line:
                t.notes.append("%s: '%s' runs a loop that never exits (line %d): a thread "
                               "already inside it keeps running the old code; only new calls "
                               "run the new one" % (t.shown(fn.loc), fn.name, line))

    def lifetimes(self, t, plan):
        from .lifetime import find_escapes
        u = t.variants["new"].unit
        tgt, tu = self.target, t.tu
        roles = plan.roles
        shipped = [fn for fn in t.fns if getattr(fn, "role", None) in ("pfn", "copy")]
        pfn_names = {fn.name for fn in t.fns if getattr(fn, "role", None) == "pfn"}

        def is_patch_function(c):
            return roles.get(c.get_usr()) == "copy"

        def is_patch_object(v):
            parent = v.semantic_parent
            if parent is not None and parent.kind == CK.FUNCTION_DECL:
                if v.storage_class != SC.STATIC:
                    return False
                if parent.spelling in pfn_names and tgt.has_variable(
                        tu, "molt__%s__%s" % (parent.spelling, v.spelling), True):
                    return False
                return True
            d = v.get_definition()
            if d is None or not u.in_main(d):
                return False
            return not tgt.has_variable(tu, v.spelling, v.linkage == ci.LinkageKind.INTERNAL)

        t.escapes = find_escapes(u, shipped, is_patch_function, is_patch_object,
                                 display=lambda f: self.show_path(f, t))
        for e in t.escapes.pinned + t.escapes.address_taken:
            if e.where[0] == u.display:
                e.where = (t.given or t.rel, e.where[1])

    # -- 6. generation --------------------------------------------------------------
    def weave_patch(self, t, plan):
        u = t.variants["new"].unit
        try:
            weaver = PatchWeaver(u, self.layout.include, self.report, plan, self.import_table,
                                 key=t.rel)
            text = weaver.weave(t.fns)
            t.private_statics = weaver.private_statics
            for imp in self.import_table.statics.values():
                if imp.where and not getattr(imp, "shown", False):
                    imp.where, imp.shown = t.shown(imp.where), True
        except WeaveError as e:
            t.errors.append(t.shown(str(e)))
            return None
        d = os.path.join(t.b.objdir, "patch")
        os.makedirs(d, exist_ok=True)
        src = os.path.join(d, os.path.basename(t.b.record.abspath))
        with open(src, "wb") as f:
            f.write(text)
        return src

    def compile_patch(self, t, src):
        comp = t.b.new
        obj = os.path.splitext(src)[0] + ".o"
        inc = ["-I" + self.layout.include] + self.layout.san_flags()
        argv = _argv(comp, src, obj, ["-iquote", os.path.dirname(comp.source)],
                     inc + PATCH_CFLAGS + ["-fdebug-prefix-map=%s=%s" % (
                         os.path.dirname(src), os.path.dirname(comp.source))]
                     + color_flags(self.s.cmd))
        rc, err = _run(self.s, argv, comp)
        if rc == 0:
            sys.stderr.write(err)
            t.patch_object = obj
            return None
        return err

    # -- the whole run ------------------------------------------------------------------
    def run(self):
        s = self.s
        symtab = self.symtab
        self.target = Target(symtab, self.opts.target)
        self.times["builds"] = self.times["compare"] = 0.0
        stages = self.stages()
        for k, stage in enumerate(stages):
            if any(t.refusals for t in self.tus):
                self.unbuilt = [t for later in stages[k:] for t in later]
                break
            t0 = time.time()
            self.build_objects(stage)
            self.times["builds"] += time.time() - t0
            t0 = time.time()
            for t in stage:
                self.compare(t)
                self.collect_refusals(t)
            if self.plain:
                from .plain import check_inlined
                by_rel = {t.rel: t for t in stage}
                for rel, msg in check_inlined(self.symtab.image, stage):
                    by_rel[rel].refusals.append((rel, msg))
            self.times["compare"] += time.time() - t0
        for t in self.tus:
            if not t.refusals and (t.b.record.woven or self.plain) and self.ships(t):
                self.decide_roles(t)
        # every refusal of every TU, before anything is generated
        plans = {}
        for t in self.tus:
            if t.roles:
                plans[t.rel] = self.plan_unit(t, symtab)
        self.merge_refusals()
        if self.refusals:
            return self.refuse()
        shipping = [t for t in self.tus if t.roles and self.ships(t)]
        if not shipping:
            return self.nothing()
        names = [t.tu for t in shipping]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise Fatal("the fix changes functions of several files named %s (%s); the runtime "
                        "tells statics apart by file name, so they cannot go into one patch: "
                        "build one patch per file (a diff of each)" % (
                            twice[0], ", ".join(t.rel for t in shipping if t.tu == twice[0])))
        for t in shipping:
            self.lifetimes(t, plans[t.rel])
            self.endless(t)
        t0 = time.time()
        sources = {}
        for t in shipping:
            src = self.weave_patch(t, plans[t.rel])
            if src:
                sources[t.rel] = src
        s.flush_report()
        errors = [e for t in shipping for e in t.errors]
        if errors:
            self.write_json("error", errors)
            raise Fatal("\nmoltcc: error: ".join(errors))
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
            results = list(ex.map(lambda t: (t, self.compile_patch(t, sources[t.rel])), shipping))
        for t, err in results:
            if err is None:
                continue
            rc, perr = self.plain_compiles(t, t.variants["new"])
            sys.stderr.write(err)
            self.s.work.keep = True
            raise Fatal("internal error: the generated patch source of %s does not compile, but "
                        "the source does; please report this (sources kept in %s)"
                        % (t.rel, self.s.work.path))
        if self.opts.callbacks:
            comp = shipping[0].b.new
            self.callbacks_object = callbacks.compile_callbacks(
                s, comp, self.opts.callbacks, s.work.file("molt_callbacks.o"), _argv, _run,
                ["-I" + self.layout.include] + self.layout.san_flags() + PATCH_CFLAGS
                + color_flags(self.s.cmd))
        self.times["patch_compile"] = time.time() - t0
        for t in shipping:
            self.note_private_statics(t)
        for t in shipping:
            self.pinned += [e for e in t.escapes.pinned]
            self.address_taken += [e for e in t.escapes.address_taken]
        return s.make_output(s.cmd.output, lambda: self.link([t.patch_object for t in shipping]))

    @staticmethod
    def ships(t):
        """A TU ships something when a function the program calls changed:
        new functions and private copies are reached only from there."""
        return t.comparison is not None and bool(t.comparison.replaced)

    def merge_refusals(self):
        seen = {}
        for t in self.tus:
            for w, msg in t.refusals:
                key = (w, msg.split("; used by live code:", 1)[0])
                if key in seen:
                    continue
                seen[key] = True
                self.refusals.append((w, msg))

    def refuse(self):
        lines = ["%s: %s" % (w, m) for w, m in self.refusals]
        self.write_json("refused", lines)
        self.s.flush_report()
        out = ["moltcc: error: this fix cannot be carried by a hot patch (%d reason%s):"
               % (len(lines), "" if len(lines) == 1 else "s")]
        out += ["moltcc: error: %s" % l for l in lines]
        for t in self.tus:
            for n in t.notes:
                out.append("moltcc: note: %s" % n)
        unbuilt = self.unbuilt
        if unbuilt:
            out.append("moltcc: note: %d more file%s read%s the changed files (%s); not compiled, "
                       "since the fix is refused already, so their uses are not listed"
                       % (len(unbuilt), "" if len(unbuilt) == 1 else "s",
                          "s" if len(unbuilt) == 1 else "", _list([t.rel for t in unbuilt])))
        out.append("moltcc: note: %s" % (WAY_FORWARD_PLAIN if self.plain else WAY_FORWARD))
        sys.stderr.write("\n".join(out) + "\n")
        return 1

    def nothing(self):
        line_only = ["%s (%s)" % (f.name, self.where(f.where, t))
                     for t in self.tus if t.comparison for f in t.comparison.line_only]
        why = []
        if line_only:
            why.append("only line numbers changed in %s" % ", ".join(line_only))
        quiet = [t.rel for t in self.tus if t.comparison and not t.comparison.line_only]
        if quiet:
            why.append("no function of %s changed" % ", ".join(quiet))
        msg = "nothing to patch: the fix changes no code that a hot patch carries (%s)" % \
            "; ".join(why or ["no affected translation unit"])
        self.write_json("nothing", [msg])
        self.s.flush_report()
        raise Fatal(msg)

    def note_private_statics(self, t):
        """A static of the original file that PROG has no symbol for (the
        compiler folded it away: PROG's code never reads it from memory)
        and that the compiled patch uses is the patch's own copy, with the
        same initial value (the comparison checked it): said in a note."""
        from elftools.elf.elffile import ELFFile
        u = t.variants["orig"].unit
        if u is None or not getattr(t, "private_statics", None):
            return
        orig = {c.spelling for c in u.top if c.kind == CK.VAR_DECL}
        with open(t.patch_object, "rb") as f:
            symtab = ELFFile(f).get_section_by_name(".symtab")
            defined = {sym.name for sym in symtab.iter_symbols()
                       if sym["st_shndx"] != "SHN_UNDEF"} if symtab else set()
        for name, line in t.private_statics:
            if name in orig and name in defined:
                t.notes.append("%s:%d: static '%s' is not in %s (the compiler folded it away); "
                               "the patch uses its own copy with the same initial value"
                               % (t.given or t.rel, line, name, self.opts.target))

    def used_imports(self, objects, own_records=()):
        """The imports the compiled patch objects refer to: the asm-labelled
        statics of the weaver's table, and the program's globals (functions
        and variables) that are undefined symbols of the objects.  The
        objects of own_records (the callbacks file) list their own
        MOLT_IMPORT symbols in their molt_imports records."""
        from elftools.elf.elffile import ELFFile
        out, seen = [], set()
        for path in list(objects) + list(own_records):
            with open(path, "rb") as f:
                symtab = ELFFile(f).get_section_by_name(".symtab")
                syms = [(sym.name, sym["st_info"]["type"]) for sym in symtab.iter_symbols()
                        if sym["st_shndx"] == "SHN_UNDEF" and sym.name] if symtab else []
            for name, typ in syms:
                if name in seen or (path in own_records and name.startswith(IMPORT_PREFIX)):
                    continue
                imp = self.import_table.by_symbol.get(name)
                if imp is None and name.startswith(IMPORT_PREFIX):
                    raise Fatal("internal error: %s refers to import symbol %s, which moltcc did "
                                "not make" % (path, name))
                if imp is None:
                    if name.startswith(SANITIZER_PREFIXES):
                        continue            # the sanitizer runtime's (a copy in PROG)
                    if not self.symtab.has_global(name, FUNC_SYMTYPES | VAR_SYMTYPES):
                        continue            # a library's: the dynamic loader binds it
                    imp = self.import_table.global_(name, self.symtab.has_global(name, FUNC_SYMTYPES))
                if typ == "STT_TLS" or imp.tls or self.symtab.has_global(name, {"TLS"}):
                    raise Fatal("%s'%s' is a thread-local variable of %s; patches cannot import "
                                "thread-local variables" % (imp.where + ": " if imp.where else "",
                                                            imp.name, self.opts.target))
                seen.add(name)
                out.append(imp)
        return out

    def link(self, objects):
        s, layout = self.s, self.layout
        out = s.cmd.output
        cc = self.tus[0].b.record.compiler
        opts = self.opts
        patch_id = opts.patch_id or re.sub(r"\.so$", "", os.path.basename(out))
        own = [self.callbacks_object] if self.callbacks_object else []
        hdr = s.work.file("molt_patch_header.c")
        imports = self.used_imports(objects, own)
        with open(hdr, "w") as f:
            f.write(patch_header_source(patch_id, opts.description or "", self.fix.provenance(),
                                        [str(e) for e in self.pinned], imports))
        hobj = hdr[:-2] + ".o"
        inc = ["-I" + layout.include] + layout.san_flags()
        rc, _ = s.tools.run(cc + ["-fPIC", "-DMOLT__NO_AUTO_REGISTER", "-c", hdr, "-o", hobj] + inc)
        if rc != 0:
            raise Fatal("internal error: cannot compile the patch header")
        # The version of the source-name aliases of the new versions
        # (weave.export_source_name): a shared object must define it.
        ver = s.work.file("molt_patch.ver")
        with open(ver, "w") as f:
            f.write("%s { };\n" % VERSION_PATCH)
        # No code of the patch runs at load or unload (ctors.py): no start
        # files, no constructors of the user's, the sanitizers' dropped.
        inputs = ctors.link_inputs(objects + own + [hobj] + self.extra_objects,
                                   os.path.dirname(hobj))
        rc, _ = s.tools.run(cc + ["-shared", "-nostartfiles", "-o", out] + inputs
                            + layout.san_flags() + ["-Wl,--build-id", "-Wl,-z,now",
                                                    "-Wl,--version-script=" + ver])
        if rc != 0:
            return rc
        ctors.check_linked(out)
        # At most one callback of each kind, in the patch's code (the
        # runtime and moltstamp refuse anything else; this names the file).
        self.callbacks = callbacks.check_linked(out, opts.callbacks or out)
        if self.plain:
            # where each new version goes and what each import is, in PROG
            from .plain import add_section, attach_marks
            add_section(s, out, attach_marks(self.symtab.image, out, imports))
        # gdb, addr2line and perf name a new version `f`: its DWARF name and
        # its symbol (nothing reads the patch's symbol table by the
        # generated name; the runtime finds new versions through molt_pfns).
        rename_debug_names(out, ("__molt_p",), (".debug_str", ".strtab"))
        if not self.plain:
            stamp = layout.check_moltstamp()
            rc, _ = s.tools.run([stamp, out, opts.target])
            if rc != 0:
                raise Fatal("moltstamp could not stamp %s with the build-id of %s"
                            % (out, opts.target))
        self.times["total"] = time.time() - self.started
        self.print_report(patch_id)
        self.write_json("ok", [])
        return 0

    # -- the report ----------------------------------------------------------------------
    def items(self):
        """{kind: [dict]} of everything the report lists."""
        out = {k: [] for k in ("replaced", "new_functions", "private_copies", "line_only",
                               "new_data", "not_shipped")}
        for t in self.tus:
            cmp = t.comparison
            if cmp is None:
                continue
            shipped = bool(t.roles) and self.ships(t)
            for key, items in (("replaced", cmp.replaced), ("line_only", cmp.line_only)):
                for f in items:
                    out[key].append({"name": f.name, "file": t.rel, "tu": t.tu, "static": f.static,
                                     "where": self.where(f.where, t), "reason": f.reason})
            for f in cmp.private_copies:
                reason = f.reason
                if f.name in t.carried:
                    reason = "signature changed: a new private function, all its callers replaced"
                out["private_copies"].append({"name": f.name, "file": t.rel, "tu": t.tu,
                                              "static": f.static, "reason": reason,
                                              "where": self.where(f.where, t)})
            from .objdiff import source_name
            orig_funcs = t.orig_names or {source_name(k) for k in cmp.orig_references}
            for f in cmp.new_functions:
                if f.source in orig_funcs:
                    if t.roles.get(f.source) == "copy" and f.name == f.source:
                        out["private_copies"].append({
                            "name": f.name, "file": t.rel, "tu": t.tu, "static": f.static,
                            "where": self.where(f.where, t),
                            "reason": "changed; the running program has no copy of it "
                                      "(inlined there)"})
                    continue        # else a compiler clone of an existing function
                out["new_functions"].append({"name": f.name, "file": t.rel, "tu": t.tu,
                                             "static": f.static,
                                             "where": self.where(f.where, t)})
            for d in cmp.new_data:
                out["new_data"].append({"name": d.name, "file": t.rel, "tu": t.tu,
                                        "where": self.where(d.where, t), "reason": d.reason})
            if not shipped:
                out["not_shipped"].append({"file": t.rel, "because": list(t.b.because)})
        return out

    def notes(self, with_fix=True):
        """The notes of the run (with_fix: also the fix's own, which
        prepare_fix printed already)."""
        out = list(self.fix.notes) if with_fix else []
        for t in self.tus:
            out += t.notes
            if t.comparison is not None:
                out += ["%s: %s" % (t.rel, n) for n in t.comparison.notes
                        if not n.startswith("no line-remapped build")]
            if t.check is not None:
                out += ["%s: %s" % (t.rel, n) for n in t.check.notes]
        return out

    def print_report(self, patch_id):
        it = self.items()

        def names(lst, with_reason=False):
            return ", ".join("%s (%s%s)%s" % (
                d["name"], d["file"], ", static" if d.get("static") else "",
                ": " + d["reason"] if with_reason and d.get("reason") else "") for d in lst)
        lines = ["moltcc: %s: patch '%s' for %s, built from %s" % (
            self.s.cmd.output, patch_id, self.opts.target, self.fix.provenance())]
        lines.append("  replaced (%d): %s" % (len(it["replaced"]), names(it["replaced"]) or "-"))
        if it["new_functions"]:
            lines.append("  new functions (%d): %s" % (len(it["new_functions"]),
                                                       names(it["new_functions"])))
        if it["private_copies"]:
            lines.append("  private copies (%d): %s" % (len(it["private_copies"]),
                                                        names(it["private_copies"], True)))
        if it["line_only"]:
            lines.append("  only line numbers changed, not shipped (%d): %s" % (
                len(it["line_only"]), names(it["line_only"])))
        for d in it["not_shipped"]:
            lines.append("  %s: affected by %s, but none of its code changed" % (
                d["file"], ", ".join(d["because"])))
        shown = 3           # the rest is in --molt-report
        for e in self.pinned[:shown]:
            lines.append("  kept loaded (pinned): %s" % e)
        if len(self.pinned) > shown:
            lines.append("  kept loaded (pinned): ... and %d more reasons%s" % (
                len(self.pinned) - shown, "" if self.opts.report else " (--molt-report FILE lists them)"))
        taken = sorted({e.what for e in self.address_taken})
        if taken:
            lines.append("  new functions whose address is taken: %s" % ", ".join(
                w.split("'")[1] for w in taken))
        if self.callbacks:
            lines.append("  callbacks: %s (%s)" % (", ".join(
                "%s %s" % kn for kn in self.callbacks), self.opts.callbacks))
        for n in self.notes(with_fix=False):
            lines.append("  note: %s" % n)
        sys.stderr.write("\n".join(lines) + "\n")

    def write_json(self, status, messages):
        path = self.opts.report
        if not path:
            return
        it = self.items() if any(t.comparison for t in self.tus) else {}
        data = {
            "status": status,
            "messages": messages,
            "patch": self.s.cmd.output,
            "target": self.opts.target,
            "provenance": self.fix.provenance(),
            "units": [{"file": t.rel, "because": list(t.b.because), "woven": t.b.record.woven,
                       "roles": t.roles, "carried": t.carried,
                       "comparison": t.comparison.to_dict() if t.comparison else None}
                      for t in self.tus],
            "pinned_reasons": [e.to_dict() for e in self.pinned],
            "callbacks": [{"kind": k, "name": n} for k, n in self.callbacks],
            "address_taken": [e.to_dict() for e in self.address_taken],
            "refusals": ["%s: %s" % r for r in self.refusals],
            "notes": self.notes(),
            "seconds": dict(self.times, total=time.time() - self.started),
        }
        data.update(it)
        with open(path, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True, default=str)
            f.write("\n")


_LOOPS = (CK.FOR_STMT, CK.WHILE_STMT, CK.DO_STMT)


def endless_loop(u, body):
    """The line of a loop in `body` that nothing leaves -- `for (;;)`,
    `while (1)`, `do ... while (1)` with no break of its own, no return and
    no goto inside -- or None."""
    for c in body.walk_preorder():
        if c.kind not in _LOOPS or not _always_true(u, c):
            continue
        if not _exits(c, top=True):
            return c.location.line
    return None


def _always_true(u, loop):
    toks = [t.spelling for t in loop.get_tokens()]
    forever = (["while", "(", "1", ")"], ["while", "(", "true", ")"])
    if loop.kind == CK.FOR_STMT:
        depth = 0
        for i, t in enumerate(toks[1:], 1):      # the first ';' of the header
            depth += t in ("(", "[", "{")
            depth -= t in (")", "]", "}")
            if t == ";" and depth == 1:
                return i + 1 < len(toks) and toks[i + 1] == ";"
        return False
    if loop.kind == CK.WHILE_STMT:
        return toks[:4] in forever
    if toks and toks[-1] == ";":
        toks = toks[:-1]
    return toks[-4:] in forever


def _exits(c, top):
    """Whether something inside loop c leaves it: a return or goto anywhere,
    a break that belongs to it (not to an inner loop or switch)."""
    for ch in c.get_children():
        if ch.kind in (CK.RETURN_STMT, CK.GOTO_STMT, CK.INDIRECT_GOTO_STMT):
            return True
        if ch.kind == CK.BREAK_STMT:
            return True
        if ch.kind in _LOOPS + (CK.SWITCH_STMT,):
            if _has(ch, (CK.RETURN_STMT, CK.GOTO_STMT, CK.INDIRECT_GOTO_STMT)):
                return True
            continue
        if _exits(ch, False):
            return True
    return False


def _has(c, kinds):
    return any(d.kind in kinds for d in c.walk_preorder())


def _list(names, limit=8):
    names = list(names)
    if len(names) <= limit:
        return ", ".join(names)
    return "%s and %d more" % (", ".join(names[:limit]), len(names) - limit)


def remap(orig, new):
    """objdiff.remap_source on bytes."""
    from .objdiff import remap_source
    o = orig.decode("utf-8", "surrogateescape")
    n = new.decode("utf-8", "surrogateescape")
    return remap_source(o, n).encode("utf-8", "surrogateescape")


def build_from_fix(s, symtab, prog, fix, builds, extra_objects=()):
    """Builds the patch s.cmd.output from the fix; the exit status."""
    return Pipeline(s, symtab, prog, fix, builds, extra_objects).run()
