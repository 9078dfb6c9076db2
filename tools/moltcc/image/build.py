"""moltcc --molt-program: builds a whole program as a program image for full
updates (docs/full-updates.md).

    moltcc --molt-program -o prog.so SOURCES [cflags] [ldflags]
    moltcc --molt-program --molt-from prog.so --molt-xf v2.xf -o prog2.so SOURCES ...

Every source is compiled with the user's flags plus -g -fPIC
-fno-omit-frame-pointer, the objects are linked -shared with
--wrap=pthread_create, -Bsymbolic and a build-id against libmolt, together
with one generated TU (molt__program.c) that defines `molt__program` and
embeds the image's annotations (read with libclang) as JSON in the section
.molt_types.  With --molt-from the generated TU also carries the migration
code (moltcc_xfgen.py), generated from the DWARF of the old image and of the
new one (linked once without it first: the types and variables do not
depend on it).
"""
import json
import os
import sys

GEN_NAME = "molt__program.c"
ANNOTATION_PREFIX = "molt_"
_ANN_KINDS = ("molt_no_migrate", "molt_ptrarray:", "molt_opaque", "molt_forall:", "molt_var:",
              "molt_inst:")


# ---------------------------------------------------------------------------
# Annotations (libclang)
# ---------------------------------------------------------------------------

def _is_molt_ann(s):
    return any(s == k or (k.endswith(":") and s.startswith(k)) for k in _ANN_KINDS)


def _norm_ann(s):
    """'molt_inst:struct  user *' -> 'molt_inst:struct user *' (the # of a
    macro argument keeps the user's spacing)."""
    if ":" in s:
        k, v = s.split(":", 1)
        return k + ":" + " ".join(v.replace("*", " * ").split()).replace(" *", " *")
    return s


def collect_annotations(sources, cargs, fatal):
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
    import clang.cindex as ci
    try:
        from ..unit import _in_system_header
    except ImportError:      # pragma: no cover
        def _in_system_header(loc):
            return False
    out = {"version": 1, "types": {}, "fields": {}, "vars": [], "locals": []}
    seen_vars = set()
    seen_locals = set()
    idx = ci.Index.create()
    K = ci.CursorKind
    for src in sources:
        try:
            tu = idx.parse(src, args=cargs)
        except ci.TranslationUnitLoadError as e:
            raise fatal("libclang could not parse %s: %s" % (src, e))
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
                    if _in_system_header(loc):
                        continue
                    record_struct(c)
            elif c.kind == K.TYPEDEF_DECL:
                d = c.underlying_typedef_type.get_declaration()
                if d is not None and d.kind in (K.STRUCT_DECL, K.UNION_DECL) and d.is_definition() \
                        and not _in_system_header(loc):
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


# ---------------------------------------------------------------------------
# The generated TU
# ---------------------------------------------------------------------------

def _bytes_initializer(data):
    lines = []
    for i in range(0, len(data), 16):
        lines.append("  " + ", ".join("0x%02x" % b for b in data[i:i + 16]) + ",")
    return "\n".join(lines)


def program_source(ann, from_build_id=None, migration=None):
    """The generated TU of an image: molt__program and .molt_types (plus the
    migration code, already generated, for an update)."""
    data = annotations_json(ann).encode("utf-8") + b"\0"
    out = []
    out.append("/* Generated by moltcc --molt-program (do not edit). */\n")
    if migration is not None:
        out.append(migration)
    else:
        out.append("#include <molt.h>\n")
    out.append("\n/* The image's annotations (JSON), read by a later moltcc --molt-from. */\n")
    out.append("__attribute__((section(\".molt_types\"), used, aligned(1)))\n")
    out.append("static const unsigned char molt__types[%d] = {\n%s\n};\n" % (len(data), _bytes_initializer(data)))
    out.append("\nMOLT_EXTERN const molt__program_info molt__program = {\n")
    out.append("    MOLT__PROGRAM_ABI, 0,\n")
    out.append("    %s,\n" % (('"%s"' % from_build_id) if from_build_id else "NULL"))
    out.append("    %s,\n" % ("migrate" if migration is not None else "NULL"))
    out.append("};\n")
    text = "".join(out)
    if migration is not None:
        from . import xfgen
        text = xfgen.finalize(text)
    return text


# ---------------------------------------------------------------------------
# The build
# ---------------------------------------------------------------------------

def _split_args(mc, cmd):
    """The user's options without inputs and outputs: (compile options,
    link options)."""
    args = cmd.args
    input_idx = {x.index for x in cmd.inputs}
    clean = []
    i = 0
    while i < len(args):
        a = args[i]
        if i in input_idx:
            i += 1
            continue
        if a in ("-o", "-x") or a in mc.DEP_VALUE:
            i += 2
            continue
        if a in mc.DEP_FLAGS or a in ("-c", "-S", "-E", "-shared", "-g0") or \
                a.startswith(("-Wp,-MD", "-Wp,-MMD", "-o")):
            i += 1
            continue
        if a in mc.SEP_VALUE:
            clean += args[i:i + 2]
            i += 2
            continue
        clean.append(a)
        i += 1
    comp, link = [], []
    i = 0
    while i < len(clean):
        a = clean[i]
        if a in mc.LINK_ONLY_VALUE:
            link += clean[i:i + 2]
            i += 2
            continue
        if a in mc.LINK_ONLY_FLAGS or a.startswith(("-l", "-L", "-Wl,")):
            link.append(a)
            i += 1
            continue
        if a in mc.SEP_VALUE:
            comp += clean[i:i + 2]
            i += 2
            continue
        comp.append(a)
        if a.startswith(("-f", "-m", "-pthread", "-O", "-std")):
            link.append(a)
        i += 1
    return comp, link


def main(cmd, molt, layout, mc):
    """Entry point from moltcc.py (mc: the moltcc module, for Fatal, run,
    real_cc, Workdir, clang_args, ...)."""
    Fatal = mc.Fatal
    layout.check_include()
    out = cmd.output
    if not out:
        raise Fatal("--molt-program needs -o IMAGE.so")
    if cmd.mode != "link" or cmd.has("-c", "-S", "-E"):
        raise Fatal("--molt-program builds and links a whole image; it cannot be combined with -c, -S or -E")
    missing = [x.path for x in cmd.inputs if x.lang == "c" and not os.path.isfile(x.path)]
    if missing:
        raise Fatal("%s: no such file" % missing[0])
    sources = [x for x in cmd.inputs if x.lang == "c"]
    others = [x for x in cmd.inputs if x.lang != "c"]
    for x in others:
        if x.lang != "object":
            raise Fatal("%s: only C sources, objects and archives can go into a program image" % x.path)
        if not os.path.isfile(x.path):
            raise Fatal("%s: no such file" % x.path)
    if not sources:
        raise Fatal("--molt-program needs the C sources of the program")
    names = [os.path.basename(x.path) for x in sources]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise Fatal("two sources are named %s; full updates tell statics apart by file name, "
                    "so source file names must be unique in an image" % dups[0])
    if GEN_NAME in names:
        raise Fatal("%s: this file name is reserved for the code moltcc generates" % GEN_NAME)
    xf_files = molt.get("--molt-xf") or []
    from_path = molt.get("--molt-from")
    if xf_files and not from_path:
        raise Fatal("--molt-xf needs --molt-from OLD.so (the image the new version updates)")
    layout.check_lib()

    old = None
    rules = []
    if from_path:
        from .. import dwarf as moltcc_dwarf
        if not os.path.isfile(from_path):
            raise Fatal("--molt-from %s: no such file" % from_path)
        try:
            old = moltcc_dwarf.load_image(from_path, skip_cu=GEN_NAME)
        except moltcc_dwarf.ImageError as e:
            raise Fatal(str(e))
        if not old.build_id:
            raise Fatal("%s has no build-id (link it with -Wl,--build-id, as moltcc --molt-program does)"
                        % from_path)
        rules = _parse_xf(xf_files, mc)

    comp, link = _split_args(mc, cmd)
    san = layout.san_flags()
    inc = ["-I" + layout.include] + san
    dbg = ["-g", "-fPIC", "-fno-omit-frame-pointer"]
    color = mc.color_flags(cmd)
    work = mc.Workdir(bool(molt.get("--molt-keep")))
    ok = False
    try:
        objs = []
        for i, x in enumerate(sources):
            d = work.subdir()
            obj = os.path.join(d, os.path.splitext(os.path.basename(x.path))[0] + ".o")
            args = mc.real_cc() + dbg + mc.strip_lto(comp, x.path) + \
                (["-x", x.lang] if x.explicit else []) + ["-c", x.path, "-o", obj] + inc + color
            rc, _ = mc.run(args)
            if rc != 0:
                return rc
            objs.append(obj)
        cargs = mc.clang_args(cmd, layout)
        ann = collect_annotations([os.path.abspath(x.path) for x in sources], cargs, Fatal)

        link_tail = [x.path for x in others] + link + san + [
            "-L" + layout.libdir, "-lmolt", "-Wl,-rpath," + layout.libdir, "-pthread",
            "-Wl,--wrap=pthread_create", "-Wl,-Bsymbolic", "-Wl,--build-id"]
        gen_dir = work.subdir()
        gen = os.path.join(gen_dir, GEN_NAME)
        gen_obj = gen[:-2] + ".o"
        gen_cc = mc.real_cc() + dbg + [a for a in comp if a.startswith(("-std", "-m", "-f"))
                                       and not a.startswith(("-flto", "-fsanitize"))] + \
            ["-DMOLT__NO_AUTO_REGISTER", "-c", gen, "-o", gen_obj] + inc
        # The migration code runs under the runtime's fault guard: a
        # transformer that dereferences NULL must abort the update, not the
        # process.  UBSan's checks (which abort on the first report in the
        # sanitizer builds) would pre-empt the guard, so this one TU keeps
        # AddressSanitizer but not UBSan.
        if any(a.startswith("-fsanitize=") and "undefined" in a for a in san):
            gen_cc.append("-fno-sanitize=undefined")

        def link_image(src_text, path):
            with open(gen, "w") as f:
                f.write(src_text)
            rc, err = mc.run(gen_cc + color, capture=True)
            if rc != 0:
                sys.stderr.buffer.write(err)
                return rc, True
            sys.stderr.buffer.write(err)
            rc, _ = mc.run(mc.real_cc() + ["-shared", "-o", path] + objs + [gen_obj] + link_tail)
            return rc, False

        if old is None:
            rc, bad = link_image(program_source(ann), out)
            if rc != 0:
                if bad:
                    work.keep = True
                    raise Fatal("internal error: the generated %s does not compile (kept in %s)"
                                % (GEN_NAME, work.path))
                return rc
            ok = True
            return 0

        # An update: link once without migration code, read the new
        # version's DWARF, generate, link again.
        from .. import dwarf as moltcc_dwarf
        from . import xfgen as moltcc_xfgen
        pre = work.file("pre.so")
        rc, bad = link_image(program_source(ann, old.build_id.lower()), pre)
        if rc != 0:
            if bad:
                work.keep = True
                raise Fatal("internal error: the generated %s does not compile (kept in %s)"
                            % (GEN_NAME, work.path))
            return rc
        try:
            new = moltcc_dwarf.load_image(pre, need_annotations=False, skip_cu=GEN_NAME)
        except moltcc_dwarf.ImageError as e:
            raise Fatal("internal error: %s" % e)
        new.annotations = ann
        try:
            gen_result = moltcc_xfgen.generate(old, new, rules, old_name=from_path,
                                               new_name=out)
        except moltcc_xfgen.XfgenError as e:
            for line in e.notes:
                sys.stderr.write("%s: note: %s\n" % (mc.PROG, line))
            sys.stderr.write(e.render(mc.PROG) + "\n")
            return 1
        for line in gen_result.notes:
            sys.stderr.write("%s: note: %s\n" % (mc.PROG, line))
        text = program_source(ann, old.build_id.lower(), gen_result.code)
        rc, bad = link_image(text, out)
        if rc != 0:
            if bad:
                if rules:
                    work.keep = True
                    raise Fatal("the migration code generated from %s does not compile (see the "
                                "errors above; generated source kept in %s)"
                                % (", ".join(xf_files), gen))
                work.keep = True
                raise Fatal("internal error: the generated migration code does not compile "
                            "(kept in %s)" % gen)
            return rc
        ok = True
        return 0
    finally:
        if not ok and os.path.exists(out) and os.path.getmtime(out) >= mc._START:
            try:
                os.unlink(out)
            except OSError:
                pass
        work.finish()


def _parse_xf(paths, mc):
    if not paths:
        return []
    try:
        from . import xf as moltcc_xf
    except ImportError:
        raise mc.Fatal("--molt-xf needs the .xf parser (tools/moltcc/moltcc_xf.py), which is missing")
    rules = []
    for p in paths:
        if not os.path.isfile(p):
            raise mc.Fatal("--molt-xf %s: no such file" % p)
        try:
            rs = moltcc_xf.parse_xf_file(p)
        except moltcc_xf.XfError as e:
            raise XfSyntax(str(e))
        except OSError as e:
            raise mc.Fatal("cannot read %s: %s" % (p, e.strerror))
        rules.extend((r, p) for r in rs)
    return rules


class XfSyntax(Exception):
    """An .xf error, already formatted as FILE:LINE:COL: error: ..."""
