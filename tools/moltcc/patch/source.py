"""A fix, as the sources PROG was built from and their new version.

    prog = Program(path)                          # PROG's compile records
    fix = fix_from_diffs(prog, [("fix.patch", data)], strip=None, source=None)
    fix = fix_from_trees(prog, old_dir, [new_file_or_tree, ...])   # --molt-orig
    fix = fix_from_new_files(prog, ["new/x.c", ...])                # the old form
    units = affected_units(prog, fix)             # [Affected], or Refusal
    builds = prepare_builds(prog, fix, units, workdir)              # [TUBuild]

Source root.  The diff's paths are relative to a directory of the tree PROG
was built from: the recorded root (Fix.root) is the directory R such that
the stripped paths of the diff's files are recorded files under R (a TU
source or a header one read), with the smallest strip level that finds one
(as patch(1)), and, between roots, the one most files agree on, then the
deepest.  `--molt-source DIR` says where that tree is now (Fix.source);
paths in records, mirrors, __FILE__ and debug info stay those of R.

Verification.  Every file a rebuild needs (the changed ones, and the
source and deps of every affected TU) must have the sha256 of PROG's
record.  A changed file that does not may already have the fix (or its
first k diffs of a series): undone, it must match; then the undone text is
the original.  Anything else is refused: moltcc cannot rebuild what PROG
was built from.

Builds.  For each affected TU a TUBuild holds the recorded compile for
the original and the new sources (Compile: cwd, compiler, flags without
-o/-MD/LTO, environment).  It runs in the real tree when the tree holds
exactly that version; otherwise in a mirror: <workdir>/<variant>/<absolute
path> of every file the compile read (new variant: plus the C-like files
of their directories and of the include directories), the changed files
written over them, the compile run from the mirrored directory, absolute
path arguments under the root and the build directories pointed into the
mirror, and `-ffile-prefix-map=<mirror>=` (plus the user's own maps moved
into the mirror) so that __FILE__ and debug info name the original paths:
an unchanged function compiles to the same bytes in both.
"""
import hashlib
import os
import re
import shutil
import subprocess

from .. import gccargs
from ..errors import Fatal
from ..record import ENV_VARS, read_records, records_by_source, sha256_bytes
from . import diff as difflib


class Refusal(Fatal):
    """One or more reasons why the fix cannot be built, one line each."""

    def __init__(self, items):
        self.items = list(items)
        super().__init__(self.items[0] if self.items else "")

    def __str__(self):
        # the driver prints "moltcc: error: " before the first line
        return "\nmoltcc: error: ".join(self.items)


# Files whose change never affects a build (a fix from upstream often
# carries them); a changed file that no recorded compile reads is refused
# unless it is one of these.
_DOC_NAME = re.compile(r"^(readme|news|changelog|changes|authors|thanks|todo|copying|install|"
                       r"history|contributors)([._-].*)?$", re.I)
_DOC_EXT = (".md", ".rst", ".html", ".htm", ".texi", ".txt", ".adoc", ".pod", ".1", ".2", ".3",
            ".4", ".5", ".6", ".7", ".8", ".9", ".man")
_C_EXT = (".c", ".h", ".inc", ".def", ".tab", ".x")


def is_documentation(rel):
    base = os.path.basename(rel)
    if base.lower() in ("cmakelists.txt",) or base.lower().endswith(".cmake"):
        return False
    return bool(_DOC_NAME.match(base)) or base.lower().endswith(_DOC_EXT) \
        or rel.startswith("debian/changelog")


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise Fatal("%s is a directory" % path)
    except OSError as e:
        raise Fatal("cannot read %s: %s" % (path, e.strerror))


def _under(path, root):
    return root == "/" or path == root or path.startswith(root + "/")


def _rel(path, root):
    return path[len(root):].lstrip("/") if root != "/" else path.lstrip("/")


# ---------------------------------------------------------------------------
# The program's records
# ---------------------------------------------------------------------------

class Program:
    """PROG's compile records: what each TU read, with hashes.  `recorded`:
    the hashes are those PROG was built from (plain.PlainProgram: False,
    they are the tree's as it is, so nothing can be checked against them)."""

    recorded = True

    def __init__(self, path, report=None, records=None):
        self.path = path
        recs = records if records is not None else read_records(path)
        if not recs:
            raise Fatal("%s has no compile record: rebuild it with this moltcc (make CC=moltcc); "
                        "moltcc builds patches from the sources and flags it recorded"
                        % path)
        self.by_source = records_by_source(recs, report)
        self.units = list(self.by_source.values())
        self.hashes = {}        # abspath -> set of sha256 (a file may have changed mid-build)
        self.readers = {}       # abspath -> [Record] that read it (its source or a dep)
        for r in self.units:
            for p, h in r.hashes().items():
                self.hashes.setdefault(p, set()).add(h)
                self.readers.setdefault(p, []).append(r)
        self._by_base = {}
        for p in self.hashes:
            self._by_base.setdefault(os.path.basename(p), []).append(p)

    def roots_of(self, rel):
        """The directories R with R/rel a recorded file."""
        out = []
        for p in self._by_base.get(os.path.basename(rel), ()):
            if p == "/" + rel:
                out.append("/")
            elif p.endswith("/" + rel):
                out.append(p[:-len(rel) - 1])
        return out

    def common_dir(self):
        return os.path.commonpath([r.abspath for r in self.units])


# ---------------------------------------------------------------------------
# The fix: changed files
# ---------------------------------------------------------------------------

class ChangedFile:
    """One file of the fix: its original and new content (None: absent)."""

    def __init__(self, rel):
        self.rel = rel
        self.orig = None
        self.new = None
        self.patches = []           # [(diff name, FileDiff)] in series order
        self.already = 0            # how many of them the tree already had

    @property
    def changed(self):
        return self.orig != self.new


class Fix:
    def __init__(self, root, source, how):
        self.root = root            # the recorded source root (paths of PROG's build)
        self.source = source        # where that tree is now
        self.files = {}             # rel -> ChangedFile
        self.strips = {}            # diff name -> strip level used
        self.notes = []
        self.how = how              # provenance: what the fix was made from
        self.given = {}             # rel -> the new file as the user named it (old form)

    def abspath(self, rel):
        return os.path.join(self.root, rel) if self.root != "/" else "/" + rel

    def phys(self, abspath):
        """Where a file of PROG's build is now (--molt-source moves the root)."""
        if self.source != self.root and _under(abspath, self.root):
            return os.path.join(self.source, _rel(abspath, self.root))
        return abspath

    def changed(self):
        return {rel: f for rel, f in self.files.items() if f.changed}

    def provenance(self):
        return "%s; files: %s" % (self.how, " ".join(sorted(self.changed())))


def _strip_candidates(fd, p):
    out = []
    for n in fd.names():
        s = difflib.strip_path(n, p)
        if s is not None and s not in out:
            out.append(s)
    return out


def _vote_root(prog, diff, p):
    """{root: number of the diff's files found under it} at strip p."""
    votes = {}
    for fd in diff.files:
        found = set()
        for rel in _strip_candidates(fd, p):
            found.update(prog.roots_of(rel))
        for r in found:
            votes[r] = votes.get(r, 0) + 1
    return votes


def find_root(prog, diffs, strip=None):
    """The recorded root the diffs' paths are relative to (see the module
    doc), or a Fatal naming the files that were looked for."""
    total = {}
    for d in diffs:
        top = max(difflib.max_strip(fd) for fd in d.files)
        for p in ([strip] if strip is not None else range(0, top + 1)):
            votes = _vote_root(prog, d, p)
            if votes:
                for r, v in votes.items():
                    total[r] = total.get(r, 0) + v
                break
    if not total:
        names = sorted({n for d in diffs for fd in d.files for n in fd.names()})
        raise Fatal("none of the files of %s is a source or header %s was built from (%s; "
                    "tried %s; its sources are under %s)"
                    % (", ".join(d.name for d in diffs), prog.path, ", ".join(names[:6]),
                       "-p%d" % strip if strip is not None else "every strip level",
                       prog.common_dir()))
    return max(total, key=lambda r: (total[r], len(r)))


def _choose_strip(prog, fix, d, state, strip):
    """The strip level of diff d with the root known: the smallest at which
    every file it changes (not creates) exists (recorded, on disk, or made
    by an earlier diff of the series); a given one is checked the same way."""
    def exists(rel):
        if rel in state:
            return state[rel] is not None
        ab = fix.abspath(rel)
        return ab in prog.hashes or os.path.isfile(fix.phys(ab))

    def dir_exists(rel):
        d = os.path.dirname(rel)
        return not d or any(k.startswith(d + "/") for k, v in state.items() if v is not None) \
            or os.path.isdir(fix.phys(fix.abspath(d)))

    def missing(p):
        """The first file of d not found at strip p, or None.  Missing
        documentation does not count (a release tarball may lack NEWS)."""
        for fd in d.files:
            rels = _strip_candidates(fd, p)
            if not any(dir_exists(r) if fd.creates else exists(r) for r in rels) and \
                    not (rels and all(is_documentation(r) for r in rels)):
                return fd.names()[0]
        return None

    if strip is not None:
        m = missing(strip)
        if m is not None:
            raise Fatal("%s: with -p%d, %s is not a file of %s" % (d.name, strip, m, fix.source))
        return strip
    top = max(difflib.max_strip(fd) for fd in d.files)
    for p in range(0, top + 1):
        if missing(p) is None:
            return p
    raise Fatal("%s: %s is not a file of %s at any strip level (-p0 to -p%d)"
                % (d.name, missing(top), fix.source, top))


def _pick_rel(prog, fix, fd, p, state):
    """The tree path of fd at strip p: the first of its names that PROG was
    built from, or else made by an earlier diff, or else on disk (in the
    order of FileDiff.names())."""
    rels = _strip_candidates(fd, p)
    if not rels:
        raise Fatal("%s has fewer than %d leading directories (-p%d)" % (fd.names()[0], p, p))
    for found in (lambda r: fix.abspath(r) in prog.hashes, lambda r: r in state,
                  lambda r: os.path.isfile(fix.phys(fix.abspath(r)))):
        for r in rels:
            if found(r):
                return r
    return rels[0]


def fix_from_diffs(prog, diffs, strip=None, source=None):
    """diffs: [(name, bytes)] applied in order.  Returns the Fix."""
    parsed = [difflib.parse(data, name) for name, data in diffs]
    root = find_root(prog, parsed, strip)
    src = os.path.abspath(source) if source else root
    how = "; ".join("diff %s sha256:%s" % (os.path.basename(n), hashlib.sha256(d).hexdigest())
                    for n, d in diffs)
    fix = Fix(root, src, how)
    state = {}          # rel -> content after the diffs so far (forward, not yet verified)
    for d in parsed:
        p = _choose_strip(prog, fix, d, state, strip)
        fix.strips[d.name] = p
        for fd in d.files:
            rel = _pick_rel(prog, fix, fd, p, state)
            f = fix.files.get(rel)
            if f is None:
                f = fix.files[rel] = ChangedFile(rel)
            f.patches.append((d.name, fd))
            state[rel] = None if fd.deletes else b""
    for rel, f in fix.files.items():
        try:
            _resolve(prog, fix, f)
        except difflib.ApplyError as e:
            # documentation a release tarball may not even have
            if fix.abspath(rel) in prog.hashes or not is_documentation(rel):
                raise
            f.orig = f.new = _read(fix.phys(fix.abspath(rel)))
            fix.notes.append("%s is left out: the fix does not apply to it (%s), and no compile "
                             "of %s reads it" % (rel, e, os.path.basename(prog.path)))
    return fix


def _forward(f, text):
    for name, fd in f.patches:
        text = difflib.apply(text, fd, f.rel, name)
    return text


def _resolve(prog, fix, f):
    """Sets f.orig and f.new from the file on disk: as it is (the fix not
    applied), or with the first k of its patches undone (the tree already
    has them).  A recorded file must come out with its recorded hash."""
    ab = fix.abspath(f.rel)
    disk = _read(fix.phys(ab))
    recorded = prog.hashes.get(ab) if prog.recorded else None
    first_error = None
    for k in range(0, len(f.patches) + 1):
        try:
            text = _undo(f, disk, k)
        except difflib.ApplyError:
            break
        if recorded is not None and (text is None or sha256_bytes(text) not in recorded):
            continue
        try:
            new = _forward(f, text)
        except difflib.ApplyError as e:
            first_error = first_error or e
            continue
        f.orig, f.new, f.already = text, new, k
        if k:
            fix.notes.append("%s already has %s (%s); its original is that undone"
                             % (f.rel, "the fix" if k == len(f.patches) else
                                "the first %d diffs of the fix" % k,
                                ", ".join(os.path.basename(n) for n, _ in f.patches[:k])))
        return
    if recorded is not None:
        if disk is None:
            raise Fatal("%s is missing from %s (%s's compile record names it); moltcc needs "
                        "the sources %s was built from (--molt-source DIR)"
                        % (f.rel, fix.source, prog.path, prog.path))
        if first_error is not None:
            raise first_error
        raise Fatal("%s changed since %s was built (its sha256 differs from %s's compile "
                    "record, with or without the fix); moltcc needs the sources %s was built "
                    "from (--molt-source DIR)" % (f.rel, prog.path, os.path.basename(prog.path),
                                                  prog.path))
    if disk is None and not prog.recorded:
        raise Fatal("%s is missing from %s; moltcc needs the sources %s was built from (run it "
                    "in that tree, or give it with --molt-source DIR)"
                    % (f.rel, fix.source, prog.path))
    raise first_error or Fatal("%s: the fix does not apply" % f.rel)


def _undo(f, disk, k):
    """disk with the first k patches of f undone (the last of them first)."""
    text = disk
    for name, fd in reversed(f.patches[:k]):
        text = difflib.apply(text, fd, f.rel, name, reverse=True)
    return text


def _walk_files(top):
    out = {}
    for dp, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in (".git", ".hg", ".svn", ".pc"))
        for fn in files:
            full = os.path.join(dp, fn)
            if os.path.isfile(full) and not os.path.islink(full):
                out[os.path.relpath(full, top)] = full
    return out


def fix_from_trees(prog, old, news, source=None):
    """--molt-orig OLD NEW...: OLD is the tree PROG was built from (or a
    copy of it); each NEW is a directory (compared file by file, same
    relative paths) or a file (paired with the file of OLD at the longest
    tail of its path that exists there)."""
    old = os.path.abspath(old)
    if not os.path.isdir(old):
        raise Fatal("--molt-orig %s: not a directory (the original source tree)" % old)
    pairs = {}           # rel (under OLD) -> new content
    notes = []
    for n in news:
        if os.path.isdir(n):
            ofiles, nfiles = _walk_files(old), _walk_files(n)
            for rel, full in nfiles.items():
                o = ofiles.get(rel)
                data = _read(full)
                if o is None or _read(o) != data:
                    pairs[rel] = data
            gone = sorted(set(ofiles) - set(nfiles))
            if gone:
                notes.append("%d files of %s are not in %s; they are left as they are (%s%s)"
                             % (len(gone), old, n, ", ".join(gone[:3]),
                                ", ..." if len(gone) > 3 else ""))
        elif os.path.isfile(n):
            parts = os.path.abspath(n).split("/")[1:]
            rel = None
            for k in range(len(parts)):
                cand = "/".join(parts[k:])
                if os.path.isfile(os.path.join(old, cand)):
                    rel = cand
                    break
            if rel is None:
                raise Fatal("--molt-orig: %s has no counterpart in %s (no file there has the "
                            "same path, or the same tail of it)" % (n, old))
            pairs[rel] = _read(n)
        else:
            raise Fatal("%s: no such file or directory" % n)
    if not pairs:
        raise Fatal("--molt-orig: the new files are the same as those of %s" % old)
    votes = {}
    for rel in pairs:
        for r in prog.roots_of(rel):
            votes[r] = votes.get(r, 0) + 1
    if not votes:
        raise Fatal("none of the changed files (%s) is a source or header %s was built from "
                    "(its sources are under %s)" % (", ".join(sorted(pairs)[:6]), prog.path,
                                                    prog.common_dir()))
    root = max(votes, key=lambda r: (votes[r], len(r)))
    fix = Fix(root, old if source is None else os.path.abspath(source), "files")
    fix.notes += notes
    for rel, data in sorted(pairs.items()):
        f = fix.files[rel] = ChangedFile(rel)
        ab = fix.abspath(rel)
        f.orig = _read(fix.phys(ab))
        f.new = data
        recorded = prog.hashes.get(ab)
        if recorded is not None and (f.orig is None or sha256_bytes(f.orig) not in recorded):
            raise Fatal("%s changed since %s was built (its sha256 differs from %s's compile "
                        "record); moltcc needs the sources %s was built from as the original"
                        % (os.path.join(fix.source, rel), prog.path,
                           os.path.basename(prog.path), prog.path))
    fix.how = "tree %s and %s" % (old, " ".join(news))
    return fix


def fix_from_new_files(prog, news):
    """The old form (`moltcc --molt-patch --molt-target PROG new/x.c ...`):
    each file is the new version of the recorded file with the longest
    common tail of path (src/x.c, then x.c), which must be unique; the
    originals are the recorded files, as they are on disk now."""
    pairs = {}
    for n in news:
        full = os.path.abspath(n)
        parts = full.split("/")[1:]
        match = None
        for k in range(len(parts)):
            tail = "/".join(parts[k:])
            found = sorted({r + "/" + tail if r != "/" else "/" + tail
                            for r in prog.roots_of(tail)})
            if len(found) == 1:
                match = found[0]
                break
            if len(found) > 1:
                raise Fatal("%s could be the new version of %s; give the fix as --molt-diff or "
                            "--molt-orig" % (n, " or ".join(found)))
        if match is None:
            raise Fatal("%s is not the new version of a file %s was built from (no recorded "
                        "file has its name)" % (n, prog.path))
        if os.path.realpath(full) == os.path.realpath(match):
            raise Fatal("%s is the file %s was built from, not a new version of it; give the "
                        "fix as --molt-diff, or the new file elsewhere" % (n, prog.path))
        pairs[match] = (full, n)
    root = os.path.commonpath([os.path.dirname(m) for m in pairs])
    fix = Fix(root, root, "files")
    for ab, (full, given) in sorted(pairs.items()):
        rel = _rel(ab, root)
        fix.given[rel] = given
        f = fix.files[rel] = ChangedFile(rel)
        f.orig, f.new = _read(ab), _read(full)
        if f.orig is None or sha256_bytes(f.orig) not in prog.hashes[ab]:
            raise Fatal("%s changed since %s was built (its sha256 differs from %s's compile "
                        "record); moltcc needs the original beside the new version"
                        % (ab, prog.path, os.path.basename(prog.path)))
    fix.how = "new files %s" % " ".join(news)
    return fix


# ---------------------------------------------------------------------------
# Affected translation units
# ---------------------------------------------------------------------------

class Affected:
    def __init__(self, record, rel, because):
        self.record = record
        self.rel = rel              # of its source, under Fix.root
        self.because = because      # the changed files (rel) that make it affected
        self.source_changed = rel in because


def affected_units(prog, fix):
    """The recorded TUs a rebuild must cover, in record order.  Refuses
    (all reasons at once): a changed file no compile reads (unless it is
    documentation), a new .c file, a removed TU source, a TU whose source
    changed but that has no updatable function."""
    changed = fix.changed()
    refuse = []
    out = {}
    for rel, f in sorted(changed.items()):
        ab = fix.abspath(rel)
        readers = prog.readers.get(ab, [])
        if not readers:
            if f.orig is None:
                if rel.endswith(".c"):
                    refuse.append("%s: new source files cannot be added by a hot patch yet"
                                  % rel)
                # a new header: read by the new version of a changed file
                continue
            if f.new is None:
                fix.notes.append("%s is removed by the fix; no compile of %s read it"
                                 % (rel, prog.path))
                continue
            if is_documentation(rel):
                fix.notes.append("%s is not read by any compile of %s; its change is left out"
                                 % (rel, os.path.basename(prog.path)))
                continue
            refuse.append("%s: changed by the fix, but no compile of %s reads it (a file of "
                          "another program or a build input moltcc cannot follow)"
                          % (rel, prog.path))
            continue
        for r in readers:
            a = out.get(r.abspath)
            if a is None:
                a = out[r.abspath] = Affected(r, _rel(r.abspath, fix.root)
                                              if _under(r.abspath, fix.root) else r.abspath, [])
            a.because.append(rel)
    units = [a for r in prog.units for a in [out.get(r.abspath)] if a]
    for a in units:
        a.source_changed = a.rel in a.because
        if a.source_changed and changed[a.rel].new is None:
            refuse.append("%s: the fix removes this source file of %s; a hot patch cannot "
                          "remove a translation unit" % (a.rel, prog.path))
        elif a.source_changed and not a.record.woven and prog.recorded:
            refuse.append("%s: changed by the fix, but it was compiled without updatable "
                          "functions (nothing in it can be replaced; build %s with "
                          "--molt-updatable=all or mark its functions)" % (a.rel, prog.path))
    if refuse:
        raise Refusal(refuse)
    return units


# ---------------------------------------------------------------------------
# Compiles: the recorded command, in the real tree or a mirror
# ---------------------------------------------------------------------------

PATH_OPTIONS = ("-I", "-iquote", "-isystem", "-idirafter", "-include", "-imacros")
INCLUDE_DIR_OPTIONS = ("-I", "-iquote", "-isystem", "-idirafter")
PREFIX_MAPS = ("-ffile-prefix-map=", "-fdebug-prefix-map=", "-fmacro-prefix-map=",
               "-fprofile-prefix-map=")
_DROP = re.compile(r"^(-flto(=.*)?|-fno-lto|-ffat-lto-objects|-fno-fat-lto-objects|"
                   r"-fuse-linker-plugin|-save-temps(=.*)?)$")


class Compile:
    """A recorded compile, ready to run for one variant of the sources.

    cwd       the directory to run it in (the recorded one, or its mirror)
    compiler  the real compiler's words, as recorded
    flags     the recorded options without input, -o, -c/-S/-E, dependency
              options, LTO and -save-temps; paths pointed into the mirror
              and prefix maps added when in a mirror
    source    the file to read (or weave) for this variant: absolute path
    input     the source as the command line names it (relative to cwd, or
              absolute)
    lang      the -x language given with the input, or None
    tree      "real" or "mirror"; mirror: the mirror's top directory
    env       the recorded gcc environment variables (others of ENV_VARS unset)
    """

    def __init__(self, cwd, compiler, flags, source, input, lang, tree, mirror, env):
        self.cwd, self.compiler, self.flags = cwd, compiler, flags
        self.source, self.input, self.lang = source, input, lang
        self.tree, self.mirror, self.env = tree, mirror, env

    def argv(self, source=None, output=None, extra=()):
        """compiler + flags + extra + -c SOURCE [-o OUTPUT]; source replaces
        the recorded input (e.g. a woven copy), output is added as -o."""
        src = source or self.input
        words = ["-x", self.lang, src, "-x", "none"] if self.lang else [src]
        return self.compiler + self.flags + list(extra) + ["-c"] + words + \
            (["-o", output] if output else [])

    def environ(self, base=None):
        env = dict(os.environ if base is None else base)
        for k in ENV_VARS:
            env.pop(k, None)
        env.update(self.env)
        return env

    def run(self, output, source=None, extra=()):
        """Runs the compile; (exit status, stderr text)."""
        p = subprocess.run(self.argv(source, output, extra), cwd=self.cwd, env=self.environ(),
                           capture_output=True)
        return p.returncode, p.stderr.decode("utf-8", "replace")


class TUBuild:
    """One affected TU, ready to be built as PROG was and as the fix makes it.

    record      its compile record (record.Record)
    rel         its source, relative to the recorded root (absolute if outside)
    abspath     its source as recorded (absolute)
    woven       whether PROG's build made functions of it updatable
    because     the changed files (rel) that make it affected
    source_changed  whether its own source is one of them
    orig_text, new_text   the TU source, before and after the fix (bytes)
    orig, new   Compile of each variant
    objdir      a directory of its own for objects; orig_object, new_object
                suggested paths in it
    """

    def __init__(self, a, orig_text, new_text, orig, new, objdir):
        self.record = a.record
        self.rel = a.rel
        self.abspath = a.record.abspath
        self.woven = a.record.woven
        self.because = a.because
        self.source_changed = a.source_changed
        self.orig_text, self.new_text = orig_text, new_text
        self.orig, self.new = orig, new
        self.objdir = objdir
        self.orig_object = os.path.join(objdir, "orig.o")
        self.new_object = os.path.join(objdir, "new.o")


def _split_recorded(record):
    """(flags, input, lang) of a recorded compile: its arguments without
    the input, output, stage, dependency, LTO and -save-temps options."""
    cmd = gccargs.Command(record.arguments)
    inputs = [x for x in cmd.inputs if x.lang == "c"]
    if len(inputs) != 1:
        raise Fatal("%s: its compile record names %d C inputs, not one"
                    % (record.file, len(inputs)))
    flags = []
    for x in gccargs.split(record.arguments):
        if x.kind in (gccargs.INPUT, gccargs.OUTPUT, gccargs.DEPS, gccargs.STAGE):
            continue
        if len(x.words) == 1 and _DROP.match(x.option):
            continue
        flags += x.words
    return flags, inputs[0].path, inputs[0].lang if inputs[0].explicit else None


def _path_option(x):
    """(option, path, joined) of a path-valued option item, else None."""
    if x.option in PATH_OPTIONS and x.value is not None:
        return x.option, x.value, False
    if len(x.words) == 1:
        for o in PATH_OPTIONS:
            if x.option.startswith(o) and len(x.option) > len(o) and o not in ("-include",
                                                                             "-imacros"):
                return o, x.option[len(o):], True
    return None


def include_dirs(record):
    """The absolute include directories (-I, -iquote, -isystem, -idirafter)
    of a recorded compile."""
    out = []
    for x in gccargs.split(record.arguments):
        po = _path_option(x)
        if po and po[0] in INCLUDE_DIR_OPTIONS:
            out.append(os.path.normpath(os.path.join(record.directory, po[1])))
    return out


class Tree:
    """Where a variant's compiles run: the real tree (top None) or a mirror
    at top, with the prefixes whose paths are pointed into it."""

    def __init__(self, top, prefixes):
        self.top = top
        self.prefixes = prefixes

    def at(self, abspath):
        return abspath if self.top is None else self.top + abspath

    def compile(self, record, flags, input, lang):
        if self.top is None:
            cwd = record.directory
            source = record.abspath
            out_flags = flags
        else:
            cwd = self.at(record.directory)
            source = self.at(record.abspath)
            out_flags = self._rewrite(flags)
            if os.path.isabs(input) and any(_under(input, p) for p in self.prefixes):
                input = self.at(os.path.normpath(input))
        return Compile(cwd, record.compiler, out_flags, source, input, lang,
                       "real" if self.top is None else "mirror", self.top, record.env)

    def _inside(self, path):
        return os.path.isabs(path) and any(_under(os.path.normpath(path), p)
                                           for p in self.prefixes)

    def _rewrite(self, flags):
        out = []
        maps = []
        for x in gccargs.split(flags):
            po = _path_option(x)
            if po and self._inside(po[1]):
                o, p, joined = po
                new = self.at(os.path.normpath(p))
                out += [o + new] if joined else [o, new]
                continue
            if len(x.words) == 1 and x.option.startswith(PREFIX_MAPS):
                opt, _, val = x.option.partition("=")
                old, eq, new = val.partition("=")
                if eq and os.path.isabs(old):
                    maps.append("%s=%s=%s" % (opt, self.top + os.path.normpath(old), new))
            out += x.words
        # gcc uses the last matching map: the mirror's own first, then the
        # user's maps moved into the mirror, which win for their paths
        return out + ["-ffile-prefix-map=%s=" % self.top] + maps


def _copy(src, dst, data=None):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if data is not None:
        with open(dst, "wb") as f:
            f.write(data)
    else:
        shutil.copyfile(src, dst)


def _verify_units(prog, fix, units):
    """Every file an affected TU's compile read must be as recorded (the
    changed ones in their original version)."""
    if not prog.recorded:
        return
    refuse = []
    for a in units:
        for ab, h in a.record.hashes().items():
            rel = _rel(ab, fix.root) if _under(ab, fix.root) else None
            if rel is not None and rel in fix.files:
                data = fix.files[rel].orig
            else:
                data = _read(fix.phys(ab))
            name = rel or ab
            if data is None:
                refuse.append("%s (read by the compile of %s) is missing; moltcc needs the "
                              "sources %s was built from (--molt-source DIR)"
                              % (name, a.rel, prog.path))
            elif sha256_bytes(data) != h:
                refuse.append("%s changed since %s was built (its sha256 differs from the "
                              "compile record of %s); moltcc needs the sources %s was built "
                              "from (--molt-source DIR)" % (name, prog.path, a.rel, prog.path))
    if refuse:
        raise Refusal(sorted(set(refuse), key=refuse.index))


def _tree_holds(prog, fix, variant):
    """Whether the real tree is exactly this variant of the changed files
    (and is where PROG was built)."""
    if os.path.realpath(fix.source) != os.path.realpath(fix.root):
        return False
    for rel, f in fix.files.items():
        want = f.orig if variant == "orig" else f.new
        if _read(fix.phys(fix.abspath(rel))) != want:
            return False
    return True


def _build_mirror(prog, fix, units, top, variant):
    """Writes the mirror of one variant; returns its Tree."""
    prefixes = [fix.root]
    for a in units:
        d = os.path.normpath(a.record.directory)
        if not any(_under(d, p) for p in prefixes):
            prefixes.append(d)
    files = {}              # abspath -> content (None: copy from the tree)
    dirs = set()
    for a in units:
        r = a.record
        dirs.add(r.directory)
        for ab in r.hashes():
            files[ab] = None
        for d in include_dirs(r):
            if any(_under(d, p) for p in prefixes):
                dirs.add(d)
    if variant == "new":
        # the new version may include files the original did not read
        scan = {os.path.dirname(ab) for ab in files} | dirs
        scan |= {os.path.dirname(fix.abspath(rel)) for rel in fix.files}
        for d in scan:
            pd = fix.phys(d)
            if not any(_under(d, p) for p in prefixes) or not os.path.isdir(pd):
                continue
            for fn in os.listdir(pd):
                ab = os.path.join(d, fn)
                if fn.endswith(_C_EXT) and ab not in files and os.path.isfile(os.path.join(pd, fn)):
                    files[ab] = None
    for rel, f in fix.files.items():
        ab = fix.abspath(rel)
        data = f.orig if variant == "orig" else f.new
        if data is None:
            files.pop(ab, None)
        else:
            files[ab] = data
    for d in dirs:
        os.makedirs(top + d, exist_ok=True)
    for ab, data in files.items():
        src = fix.phys(ab)
        if data is None and not os.path.isfile(src):
            continue
        _copy(src, top + ab, data)
    return Tree(top, prefixes)


def prepare_builds(prog, fix, units, workdir, force_mirror=False):
    """[TUBuild] for the affected units (see the module doc).  Verifies
    every file their compiles read; mirrors go to workdir/orig and
    workdir/new when needed (force_mirror: always)."""
    _verify_units(prog, fix, units)
    trees = {}
    for variant in ("orig", "new"):
        if not force_mirror and _tree_holds(prog, fix, variant):
            trees[variant] = Tree(None, [])
        else:
            trees[variant] = _build_mirror(prog, fix, units, os.path.join(
                os.path.abspath(workdir), variant), variant)
    out = []
    for n, a in enumerate(units, 1):
        flags, input, lang = _split_recorded(a.record)
        f = fix.files.get(a.rel)
        if f is not None:
            orig_text, new_text = f.orig, f.new
        else:
            orig_text = new_text = _read(fix.phys(a.record.abspath))
        objdir = os.path.join(os.path.abspath(workdir), "tu-%d-%s" % (
            n, os.path.splitext(os.path.basename(a.record.abspath))[0]))
        os.makedirs(objdir, exist_ok=True)
        out.append(TUBuild(a, orig_text, new_text,
                           trees["orig"].compile(a.record, flags, input, lang),
                           trees["new"].compile(a.record, flags, input, lang), objdir))
    return out


# ---------------------------------------------------------------------------
# From the command line
# ---------------------------------------------------------------------------

def fix_from_options(s, prog):
    """The Fix of a --molt-patch command with --molt-diff or --molt-orig."""
    opts = s.options
    if opts.diff and opts.orig is not None:
        raise Fatal("--molt-diff and --molt-orig are two ways to give a fix; use one")
    if opts.diff:
        if s.cmd.inputs:
            raise Fatal("with --molt-diff, moltcc takes no source files (got %s); the fix's "
                        "files are found in %s's compile record" % (s.cmd.inputs[0].path,
                                                                     opts.target))
        diffs = []
        for name in opts.diff:
            data = _read(name)
            if data is None:
                raise Fatal("--molt-diff %s: no such file" % name)
            diffs.append((name, data))
        return fix_from_diffs(prog, diffs, opts.strip, opts.source)
    news = [x.path for x in s.cmd.inputs]
    if not news:
        raise Fatal("--molt-orig %s needs the new files or the new tree after it" % opts.orig)
    return fix_from_trees(prog, opts.orig, news, opts.source)
