"""The molt annotations of an image's sources (MOLT_NO_MIGRATE,
MOLT_PTRARRAY, MOLT_FORALL/VAR/INST, molt_migrate_local ...), read with
libclang and embedded as JSON in the image's .molt_types section, where a
later `--molt-from` build reads them back (dwarf.load_image).
"""
import json
import os

import clang.cindex as ci

from ..errors import Fatal
from ..unit import in_system_header

_ANN_KINDS = ("molt_no_migrate", "molt_ptrarray:", "molt_opaque", "molt_forall:", "molt_var:",
              "molt_inst:")


def _is_molt_ann(s):
    return any(s == k or (k.endswith(":") and s.startswith(k)) for k in _ANN_KINDS)


def _norm_ann(s):
    """'molt_inst:struct  user *' -> 'molt_inst:struct user *' (the # of a
    macro argument keeps the user's spacing)."""
    if ":" in s:
        k, v = s.split(":", 1)
        return k + ":" + " ".join(v.replace("*", " * ").split()).replace(" *", " *")
    return s


def collect_annotations(sources, cargs):
    """Reads the molt annotations of every source with libclang.  Returns the
    JSON-able dict embedded in .molt_types:

      {"version": 1,
       "types":  {"struct list": ["molt_forall:t"]},
       "fields": {"struct list": {"val": ["molt_var:t"], "next": ["molt_inst:t"]}},
       "vars":   [{"name": "users", "tu": null, "file": "kv.c", "line": 7,
                   "annotations": ["molt_inst:struct user"]}],
       "locals": [{"func": "worker", "var": "count", "file": "kv.c", "line": 12}]}

    Anonymous structs are named as in the DWARF reader: 'struct {typedef}'
    or 'struct {parent.field}'.
    """
    out = {"version": 1, "types": {}, "fields": {}, "vars": [], "locals": []}
    seen_vars = set()
    seen_locals = set()
    idx = ci.Index.create()
    K = ci.CursorKind
    for src in sources:
        try:
            tu = idx.parse(src, args=cargs)
        except ci.TranslationUnitLoadError as e:
            raise Fatal("libclang could not parse %s: %s" % (src, e))
        base = os.path.basename(src)
        anon = {}      # cursor hash -> canonical name of an anonymous struct/union/enum

        def agg_name(c):
            kind = {K.STRUCT_DECL: "struct", K.UNION_DECL: "union", K.ENUM_DECL: "enum"}.get(c.kind)
            if kind is None:
                return None
            if c.spelling and not c.is_anonymous() and "(" not in c.spelling:
                return "%s %s" % (kind, c.spelling)
            return anon.get(c.hash)

        def anns(c):
            return [_norm_ann(a.spelling) for a in c.get_children()
                    if a.kind == K.ANNOTATE_ATTR and _is_molt_ann(a.spelling)]

        # pass 1: names of anonymous aggregates (typedefs, member types)
        def name_anon(c, depth=0):
            for ch in c.get_children():
                if ch.kind == K.TYPEDEF_DECL:
                    d = ch.underlying_typedef_type.get_declaration()
                    if d is not None and d.kind in (K.STRUCT_DECL, K.UNION_DECL, K.ENUM_DECL) \
                            and (not d.spelling or d.is_anonymous() or "(" in d.spelling):
                        kind = {K.STRUCT_DECL: "struct", K.UNION_DECL: "union",
                                K.ENUM_DECL: "enum"}[d.kind]
                        anon.setdefault(d.hash, "%s {%s}" % (kind, ch.spelling))
                elif ch.kind in (K.STRUCT_DECL, K.UNION_DECL) and depth < 16:
                    pn = agg_name(ch)
                    if pn:
                        i = 0
                        for f in ch.get_children():
                            if f.kind in (K.STRUCT_DECL, K.UNION_DECL) and \
                                    (not f.spelling or f.is_anonymous() or "(" in f.spelling):
                                # the type of a named member, or an unnamed member
                                fld = _member_of(ch, f)
                                kind = "struct" if f.kind == K.STRUCT_DECL else "union"
                                if fld is None:
                                    anon.setdefault(f.hash, "%s {%s.#%d}" % (kind, pn.split(" ", 1)[1], i))
                                    i += 1
                                else:
                                    anon.setdefault(f.hash, "%s {%s.%s}" % (kind, pn.split(" ", 1)[1], fld))
                    name_anon(ch, depth + 1)

        def _member_of(parent, rec):
            for f in parent.get_children():
                if f.kind == K.FIELD_DECL:
                    d = f.type.get_declaration()
                    if d is not None and d.hash == rec.hash:
                        return f.spelling
                    # arrays / pointers of the anonymous type
                    t = f.type
                    for _ in range(4):
                        if t.kind in (ci.TypeKind.POINTER,):
                            t = t.get_pointee()
                        elif t.kind in (ci.TypeKind.CONSTANTARRAY, ci.TypeKind.INCOMPLETEARRAY):
                            t = t.element_type
                        else:
                            break
                        d = t.get_declaration()
                        if d is not None and d.hash == rec.hash:
                            return f.spelling
            return None

        name_anon(tu.cursor)

        def record_struct(c):
            name = agg_name(c)
            if not name:
                return
            a = anns(c)
            if a:
                lst = out["types"].setdefault(name, [])
                for x in a:
                    if x not in lst:
                        lst.append(x)
            for f in c.get_children():
                if f.kind == K.FIELD_DECL:
                    fa = anns(f)
                    if fa:
                        out["fields"].setdefault(name, {})[f.spelling] = fa
                elif f.kind in (K.STRUCT_DECL, K.UNION_DECL):
                    record_struct(f)

        def walk_body(c, func):
            for ch in c.get_children():
                if ch.kind == K.CALL_EXPR and ch.spelling == "molt_migrate_local":
                    args = list(ch.get_arguments())
                    if len(args) >= 2:
                        lit = _string_literal(args[1])
                        if lit is not None:
                            key = (func, lit)
                            if key not in seen_locals:
                                seen_locals.add(key)
                                out["locals"].append({"func": func, "var": lit, "file": base,
                                                      "line": ch.location.line})
                walk_body(ch, func)

        def _string_literal(c):
            if c.kind == K.STRING_LITERAL:
                s = c.spelling
                if len(s) >= 2 and s[0] == '"' and s[-1] == '"':
                    return s[1:-1]
                return None
            for ch in c.get_children():
                r = _string_literal(ch)
                if r is not None:
                    return r
            return None

        for c in tu.cursor.get_children():
            loc = c.location
            if loc.file is None:
                continue
            if c.kind in (K.STRUCT_DECL, K.UNION_DECL):
                if c.is_definition():
                    if in_system_header(loc):
                        continue
                    record_struct(c)
            elif c.kind == K.TYPEDEF_DECL:
                d = c.underlying_typedef_type.get_declaration()
                if d is not None and d.kind in (K.STRUCT_DECL, K.UNION_DECL) and d.is_definition() \
                        and not in_system_header(loc):
                    record_struct(d)
            elif c.kind == K.VAR_DECL:
                a = anns(c)
                if a:
                    static = c.storage_class == ci.StorageClass.STATIC
                    key = (c.spelling, base if static else None)
                    if key not in seen_vars:
                        seen_vars.add(key)
                        out["vars"].append({"name": c.spelling, "tu": base if static else None,
                                            "file": base, "line": loc.line, "annotations": a})
            elif c.kind == K.FUNCTION_DECL and c.is_definition() and loc.file.name == src:
                walk_body(c, c.spelling)
    return out


def annotations_json(ann):
    return json.dumps(ann, sort_keys=True, separators=(",", ":"))
