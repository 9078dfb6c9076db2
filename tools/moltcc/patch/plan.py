"""What each function of the patch sources becomes (PatchPlan), decided
from the target's symbol table (elf.Symtab): a new version of an updatable
function ('pfn'), a private copy ('copy'), or left out ('removed': main and
constructors); and Import, an object of the live program the patch
reaches.
"""
from ..elf import FUNC_SYMTYPES
from ..markers import explicitly_marked
from ..weave import refuse_naked_conflicts


class Import:
    """One object of the running program that the patch uses: `symbol` is
    the undefined symbol of the patch that stands for it (a global's own
    name, `molt.imp.<n>` for a static), bound by the runtime to `name` in
    the program (in file `tu` for a static) before the patch goes in."""

    def __init__(self, symbol, name, tu, is_func, tls=False):
        self.symbol = symbol
        self.name = name
        self.tu = tu                # None for globals
        self.is_func = is_func
        self.tls = tls
        self.where = None           # FILE:LINE of its declaration in the patch source


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


# ---------------------------------------------------------------------------
# Roles decided by the patch pipeline (patch/pipeline.py, a patch from a fix)
# ---------------------------------------------------------------------------

ROLES = ("pfn", "copy", "import", "removed")


def assign_roles(plan, unit, role_of):
    """Like PatchPlan.decide, but every function's role comes from the
    pipeline: role_of(fn) -> 'pfn' (changed, replaced in place), 'copy'
    (compiled into the patch: new, private copy), 'import' (the program's
    unchanged function: its definition becomes a prototype and references
    reach the program's instance) or 'removed' (left out, nothing uses it).
    Returns the unit's functions, each analysed, with .role set."""
    fns = unit.functions()
    for fn in fns:
        unit.analyse(fn)
        refuse_naked_conflicts(fn)
        if fn.body is None:
            continue
        role = role_of(fn)
        assert role in ROLES, role
        fn.role = role
        plan.roles[fn.usr] = role
        if not fn.static:
            plan.global_roles[fn.name] = role
    return fns
