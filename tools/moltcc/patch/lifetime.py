"""Pointers into a patch that may outlive it (design §6, the builder side).

A superseded or rolled-back patch is unloaded once no thread runs its code.
Its string literals, its new objects and its own functions go with it; a
pointer to any of them that the program kept would dangle.  This module
reads the shipped code of one translation unit (new versions and private
functions, from libclang) and finds every such pointer whose use is not
known to be harmless:

  * a string literal;
  * `&` of an object the patch owns (a new variable, a private static), or
    such an array used as a pointer;
  * a function of the patch (private copy, new function) not called but
    used as a value (its address).

Harmless uses -- the pointer cannot be kept by the time the use is over:
an argument of a call to a function declared in a system header (except
those that keep pointers: atexit, signal, pthread_create, setvbuf, openlog
...) or to a function of the same file whose body uses that parameter only
in harmless ways (checked the same way, through the calls it makes), a
comparison or truth value, a dereference, subscript or member
access, `sizeof`, the initializer of a local array (copied), the value of
an expression statement, and a local variable (or parameter) it is put
into whose every use is harmless in turn.  Anything else (stored, returned, passed to a
function of the program or of the patch, put into an initializer) is a
reason to keep the patch loaded for good: the patch is built *pinned* and
each reason is one line, `file:line: what how (in 'f')`.

Parentheses, casts, `?:` and pointer arithmetic are looked through: they
pass the pointer on.

API
---
find_escapes(unit, functions, is_patch_function, is_patch_object, display=None)
    -> Escapes(pinned=[Escape], address_taken=[Escape])
  functions          the Func objects of unit whose code goes into the patch
  is_patch_function  callable(FUNCTION_DECL cursor) -> bool: compiled into
                     the patch as its own function (not a reference to the
                     program's stable entry)
  is_patch_object    callable(VAR_DECL cursor) -> bool: storage owned by the
                     patch
  display            callable(file name) -> how to show it (default: as is)
Escape: .where (file, line), .what, .how, .function; str() is the reason.
"""
import clang.cindex as ci

from ..unit import CK, SC, in_system_header

# Functions of the C library and POSIX that keep a pointer they are given
# beyond the call: a literal or a patch function passed to them must
# outlive the patch.
POINTER_KEEPERS = frozenset({
    "atexit", "at_quick_exit", "on_exit", "__cxa_atexit",
    "signal", "sigaction", "sigset", "bsd_signal", "sysv_signal",
    "pthread_create", "pthread_atfork", "pthread_key_create", "pthread_setspecific",
    "pthread_cleanup_push", "timer_create", "makecontext", "sigaltstack",
    "setvbuf", "setbuf", "setbuffer", "putenv", "openlog", "strtok", "tsearch", "hsearch",
    "fopencookie", "aio_read", "aio_write", "lio_listio", "aio_fsync",
})

_TRANSPARENT = (CK.UNEXPOSED_EXPR, CK.PAREN_EXPR, CK.CSTYLE_CAST_EXPR)
_COMPARISONS = ("==", "!=", "<", ">", "<=", ">=", "&&", "||")
_ASSIGNMENTS = ("=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=")
_CONDITIONS = (CK.IF_STMT, CK.WHILE_STMT, CK.DO_STMT, CK.FOR_STMT, CK.SWITCH_STMT)


class Escape:
    def __init__(self, where, what, how, function):
        self.where = where            # (file, line)
        self.what = what              # 'string literal "OK"', "patch function 'cb'"
        self.how = how                # 'is assigned', 'is returned', "is passed to 'log'"
        self.function = function      # the shipped function it is in

    def __str__(self):
        return "%s:%d: %s %s (in '%s')" % (self.where[0], self.where[1], self.what, self.how,
                                          self.function)

    __repr__ = __str__

    def to_dict(self):
        return {"file": self.where[0], "line": self.where[1], "what": self.what, "how": self.how,
                "function": self.function, "reason": str(self)}


class Escapes:
    def __init__(self):
        self.pinned = []              # [Escape]: the patch must never be unloaded
        self.address_taken = []       # [Escape]: patch functions used as values

    @property
    def reasons(self):
        return [str(e) for e in self.pinned]


def _short_literal(c):
    toks = [t.spelling for t in c.get_tokens()]
    text = " ".join(toks) if toks else c.spelling
    if len(text) > 40:
        text = text[:37] + '..."'
    return "string literal %s" % text


def _operator(unit, c, lhs):
    """The operator token of a binary operator cursor (the first token of
    the main file after its left operand), or None."""
    toks = unit.tokens_in(lhs.extent.end.offset, c.extent.end.offset)
    if not toks or not (c.location.file and c.location.file.name == unit.path):
        return None
    return toks[0].spelling


def _unary_operator(c):
    toks = [t.spelling for t in c.get_tokens()]
    return toks[0] if toks else None


def _callee_decl(call):
    kids = list(call.get_children())
    if not kids:
        return None
    c = kids[0]
    while c.kind in _TRANSPARENT:
        sub = list(c.get_children())
        if len(sub) != 1:
            break
        c = sub[0]
    if c.kind == CK.DECL_REF_EXPR and c.referenced is not None and \
            c.referenced.kind == CK.FUNCTION_DECL:
        return c.referenced
    return None


def _is_automatic(var):
    parent = var.semantic_parent
    return parent is not None and parent.kind == CK.FUNCTION_DECL and \
        var.storage_class not in (SC.STATIC, SC.EXTERN)


def _is_local_array(var):
    parent = var.semantic_parent
    if parent is None or parent.kind != CK.FUNCTION_DECL:
        return False
    if var.storage_class in (SC.STATIC, SC.EXTERN):
        return False
    return var.type.get_canonical().kind in (ci.TypeKind.CONSTANTARRAY,
                                              ci.TypeKind.INCOMPLETEARRAY,
                                              ci.TypeKind.VARIABLEARRAY)


def find_escapes(unit, functions, is_patch_function, is_patch_object, display=None):
    show = display or (lambda f: f)
    out = Escapes()

    def where(c):
        loc = c.location
        name = loc.file.name if loc.file is not None else unit.path
        return (unit.display if name == unit.path else show(name)), loc.line

    def consumer(stack, i):
        """How the value at stack[i] is used: (safe, how).  stack[0] is the
        function; stack[i-1] the parent of stack[i]."""
        child = stack[i]
        j = i - 1
        while j >= 0:
            p = stack[j]
            if p.kind in _TRANSPARENT:
                child, j = p, j - 1
                continue
            if p.kind == CK.CONDITIONAL_OPERATOR:
                kids = list(p.get_children())
                if kids and kids[0] == child:
                    return True, None           # the condition
                child, j = p, j - 1
                continue
            if p.kind == CK.BINARY_OPERATOR:
                kids = list(p.get_children())
                op = _operator(unit, p, kids[0]) if kids else None
                if op in _COMPARISONS:
                    return True, None
                if op in ("+", "-"):
                    child, j = p, j - 1        # still a pointer into the patch
                    continue
                if op == ",":
                    if kids and kids[0] == child:
                        return True, None       # value discarded
                    child, j = p, j - 1
                    continue
                if op in _ASSIGNMENTS and len(kids) == 2 and kids[1] == child:
                    v = local_pointer(kids[0])
                    if op == "=" and v is not None and not var_escapes(stack[0], v):
                        return True, None       # a local whose every use is harmless
                    return False, "is stored by '%s'" % op
                if op in _ASSIGNMENTS and kids and kids[0] == child:
                    return True, None           # overwritten (its uses are checked)
                return False, "is used by '%s'" % (op or "an operator")
            if p.kind == CK.UNARY_OPERATOR:
                op = _unary_operator(p)
                if op in ("*", "!"):
                    return True, None
                if op == "&":
                    child, j = p, j - 1
                    continue
                return False, "is used by '%s'" % op
            if p.kind in (CK.ARRAY_SUBSCRIPT_EXPR, CK.MEMBER_REF_EXPR, CK.CXX_UNARY_EXPR):
                return True, None
            if p.kind == CK.CALL_EXPR:
                kids = list(p.get_children())
                if kids and kids[0] == child:
                    return True, None           # the callee: a call
                callee = _callee_decl(p)
                if callee is None:
                    return False, "is passed to a call through a pointer"
                system = in_system_header(callee.location) or \
                    callee.spelling.startswith("__builtin")      # _FORTIFY_SOURCE's wrappers
                if system and callee.spelling not in POINTER_KEEPERS:
                    return True, None
                if callee.spelling in POINTER_KEEPERS:
                    return False, "is passed to '%s', which keeps it" % callee.spelling
                arg = [k.hash for k in kids[1:]].index(child.hash) if child.hash in \
                    [k.hash for k in kids[1:]] else None
                if arg is not None and not param_escapes(callee, arg):
                    return True, None
                return False, "is passed to '%s'" % callee.spelling
            if p.kind == CK.VAR_DECL:
                if _is_local_array(p):
                    return True, None           # copied into the local array
                if _is_automatic(p) and not var_escapes(stack[0], p):
                    return True, None           # a local whose every use is harmless
                return False, "initializes '%s'" % p.spelling
            if p.kind == CK.RETURN_STMT:
                return False, "is returned"
            if p.kind in _CONDITIONS:
                return True, None
            if p.kind in (CK.COMPOUND_STMT, CK.CASE_STMT, CK.DEFAULT_STMT, CK.LABEL_STMT):
                return True, None               # an expression statement
            if p.kind == CK.INIT_LIST_EXPR:
                return False, "is put into an initializer"
            return False, "is used as a value"
        return True, None

    escapes_memo = {}

    def param_escapes(callee, index):
        """Whether a function of this file may keep its parameter `index`
        beyond the call (see var_escapes).  A function defined elsewhere
        may keep anything."""
        d = callee.get_definition()
        if d is None or not unit.in_main(d):
            return True
        params = [a for a in d.get_arguments()]
        if index >= len(params):
            return True                         # a variadic argument
        return var_escapes(d, params[index])

    def var_escapes(func, var):
        """Whether the pointer held by a parameter or automatic local `var`
        of `func` may be kept: some use of it in the body is not harmless
        (as above, recursively through the variables and same-file calls it
        reaches).  A cycle counts as harmless (every other use in it is
        checked on its own)."""
        key = (func.hash, var.hash)
        if key in escapes_memo:
            return escapes_memo[key]
        escapes_memo[key] = False               # in progress
        target = var.hash
        body = [ch for ch in func.get_children() if ch.kind == CK.COMPOUND_STMT]
        found = False

        def walk(stack):
            nonlocal found
            c = stack[-1]
            if found:
                return
            if c.kind == CK.DECL_REF_EXPR and c.referenced is not None and \
                    c.referenced.hash == target:
                safe, _ = consumer(stack, len(stack) - 1)
                if not safe:
                    found = True
                    return
            for ch in c.get_children():
                stack.append(ch)
                walk(stack)
                stack.pop()
        for b in body:
            walk([func, b])
        escapes_memo[key] = found
        return found

    def local_pointer(c):
        """The automatic local (or parameter) a cursor names, through casts
        and parentheses, or None."""
        while c.kind in _TRANSPARENT:
            sub = list(c.get_children())
            if len(sub) != 1:
                return None
            c = sub[0]
        if c.kind != CK.DECL_REF_EXPR or c.referenced is None:
            return None
        v = c.referenced
        if v.kind == CK.PARM_DECL:
            return v
        if v.kind == CK.VAR_DECL and _is_automatic(v) and not _is_local_array(v):
            return v
        return None

    def direct_call(stack, i):
        j, child = i - 1, stack[i]
        while j >= 0 and stack[j].kind in (CK.UNEXPOSED_EXPR, CK.PAREN_EXPR):
            child, j = stack[j], j - 1
        if j < 0 or stack[j].kind != CK.CALL_EXPR:
            return False
        kids = list(stack[j].get_children())
        return bool(kids) and kids[0] == child

    def under_address_of(stack, i):
        j = i - 1
        while j >= 0 and stack[j].kind == CK.PAREN_EXPR:
            j -= 1
        return j >= 0 and stack[j].kind == CK.UNARY_OPERATOR and _unary_operator(stack[j]) == "&"

    def visit(fn_name, stack):
        c = stack[-1]
        i = len(stack) - 1
        what = None
        if c.kind == CK.STRING_LITERAL:
            what = _short_literal(c)
        elif c.kind == CK.DECL_REF_EXPR and c.referenced is not None:
            r = c.referenced
            if r.kind == CK.FUNCTION_DECL and is_patch_function(r):
                if not direct_call(stack, i):
                    what = "patch function '%s'" % r.spelling
                    out.address_taken.append(Escape(where(c), what, "is used as a value",
                                                    fn_name))
            elif r.kind == CK.VAR_DECL and is_patch_object(r):
                is_array = r.type.get_canonical().kind in (ci.TypeKind.CONSTANTARRAY,
                                                           ci.TypeKind.INCOMPLETEARRAY)
                if under_address_of(stack, i):
                    what = "the address of the patch's object '%s'" % r.spelling
                elif is_array:
                    what = "the patch's array '%s'" % r.spelling
        elif c.kind == CK.VAR_DECL and c.storage_class == SC.STATIC and not is_patch_object(c):
            return      # the program's static: its initializer is not in the patch
        if what is not None:
            safe, how = consumer(stack, i)
            if not safe:
                out.pinned.append(Escape(where(c), what, how, fn_name))
        for ch in c.get_children():
            stack.append(ch)
            visit(fn_name, stack)
            stack.pop()

    for fn in functions:
        if fn.body is None:
            continue
        visit(fn.name, [fn.c, fn.body])
    seen = set()
    for lst in (out.pinned, out.address_taken):
        uniq = []
        for e in lst:
            k = str(e)
            if k not in seen:
                seen.add(k)
                uniq.append(e)
        lst[:] = uniq
        seen = set()
    return out
