"""Which functions the user made updatable: the markers in the source
(MOLT_UPDATABLE, PSU's DSU_FUNC tags), --molt-funcs=FILE and
--molt-updatable=all, and the cheap textual test of whether a file needs
libclang at all.  Only read_funcs_file() loads libclang, and only for a
header of declarations."""
import os
import re

from .errors import Fatal

MARKER_MACRO = "MOLT_UPDATABLE"         # molt.h: __attribute__((annotate("molt_updatable")))
MARKER_ANNOTATION = "molt_updatable"
MARKER_TAG = "DSU_FUNC"                 # /** DSU_FUNC */, /// DSU_FUNC
MARKERS = tuple(m.encode() for m in (MARKER_MACRO, MARKER_ANNOTATION, MARKER_TAG))


class Selection:
    """What is asked to be updatable: all = --molt-updatable=all; funcs =
    the names of --molt-funcs; verbose: notes on what is left out."""

    def __init__(self, all_functions=False, funcs=(), verbose=False):
        self.all = all_functions
        self.funcs = set(funcs)
        self.verbose = verbose


def explicitly_marked(fn, sel):
    """Why fn is explicitly updatable (its marker, or --molt-funcs), or None."""
    if fn.marker:
        return fn.marker
    if fn.name in sel.funcs:
        return "--molt-funcs"
    return None


_INCLUDE_RE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*(["<])([^">]+)[">]', re.M)


def file_has_markers(path, cmd, layout, names, seen=None, depth=0):
    """Cheap textual pre-check (no libclang): does this file, or a project
    header it includes, mention a marker or a --molt-funcs name?"""
    seen = seen if seen is not None else set()
    rp = os.path.realpath(path)
    if rp in seen or depth > 32:
        return False
    seen.add(rp)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    molt_h = os.path.realpath(os.path.join(layout.include, "molt.h"))
    if rp.startswith(os.path.realpath(os.path.join(layout.include, "molt")) + os.sep):
        return False  # molt's ABI headers (molt/*.h, included by molt.h)
    if rp != molt_h:
        if any(m in data for m in MARKERS):
            return True
        for n in names:
            if re.search(rb"\b" + re.escape(n.encode()) + rb"\b", data):
                return True
    here = os.path.dirname(path)
    for m in _INCLUDE_RE.finditer(data):
        quote, name = m.group(1), m.group(2).decode("utf-8", "replace")
        dirs = ([here] + cmd.iquotes if quote == b'"' else []) + cmd.includes
        for d in dirs:
            cand = os.path.join(d or ".", name)
            if os.path.isfile(cand):
                if os.path.realpath(cand) != molt_h and \
                        file_has_markers(cand, cmd, layout, names, seen, depth + 1):
                    return True
                break
    return False


def read_funcs_file(path, clang_args):
    """The names of a --molt-funcs file: a header of declarations (read with
    libclang, with the compile's clang_args), or one name per line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise Fatal("cannot read --molt-funcs file %s: %s" % (path, e.strerror))
    if "(" in text:
        import clang.cindex as ci
        idx = ci.Index.create()
        try:
            tu = idx.parse(path, args=clang_args[2:] + ["-x", "c-header"])
        except ci.TranslationUnitLoadError:
            raise Fatal("cannot parse --molt-funcs file %s" % path)
        names = set()
        for c in tu.cursor.get_children():
            if c.kind == ci.CursorKind.FUNCTION_DECL and c.location.file \
                    and c.location.file.name == path:
                names.add(c.spelling)
        if not names:
            raise Fatal("--molt-funcs file %s declares no function" % path)
        return names
    names = set()
    for line in text.splitlines():
        line = line.split("#", 1)[0].split("//", 1)[0].strip()
        if line:
            if not re.match(r"^[A-Za-z_]\w*$", line):
                raise Fatal("--molt-funcs file %s: '%s' is not a function name" % (path, line))
            names.add(line)
    return names
