"""Unified diffs: read them and apply them in memory (no patch(1)).

    d = parse(data, "fix.patch")          # Diff: .files, each a FileDiff
    new = apply(old_bytes, d.files[0], "src/x.c", "fix.patch")

What is read: `diff -u` / `diff -ruN` output (timestamps after a tab, an
epoch timestamp for a file that is created or removed), `git diff` /
`git format-patch` (diff --git, index, new/deleted file mode, /dev/null,
quoted names), quilt and DEP-3 patches (free text before the first file),
several files and hunks, `\\ No newline at end of file`.  Everything is
bytes: CRLF lines and any encoding stay as they are.  Binary changes,
renames and copies are refused, each with its own message.

Hunks apply with exact context (no fuzz); a hunk may have moved: the
search goes outward from the line it names (shifted by what the hunks
before it moved), as patch(1) does without fuzz.
"""
import re

from ..errors import Fatal


class DiffError(Fatal):
    """The diff cannot be read, or holds a change a hot patch cannot carry."""


class ApplyError(Fatal):
    """A hunk does not apply (the message names the diff, the file, the
    hunk and the line)."""


class Hunk:
    __slots__ = ("old_start", "old_count", "new_start", "new_count", "lines", "number",
                 "line_no")

    def __init__(self, old_start, old_count, new_start, new_count, number, line_no):
        self.old_start, self.old_count = old_start, old_count
        self.new_start, self.new_count = new_start, new_count
        self.lines = []          # [(b" " | b"-" | b"+", line with its end)]
        self.number = number     # 1-based, within its file
        self.line_no = line_no   # of the @@ line in the diff

    def old(self):
        return [t for op, t in self.lines if op in (b" ", b"-")]

    def new(self):
        return [t for op, t in self.lines if op in (b" ", b"+")]


class FileDiff:
    """The change of one file.  Names are as the diff writes them (before
    stripping); None stands for /dev/null."""

    def __init__(self, line_no, git):
        self.line_no = line_no
        self.git = git
        self.old_name = None
        self.new_name = None
        self.creates = False      # the file does not exist before
        self.deletes = False      # ... or after
        self.hunks = []

    def names(self):
        """The names that may identify the file in the tree, the preferred
        first (the old one, unless the file is created)."""
        out = []
        for n in ((self.new_name, self.old_name) if self.creates else
                  (self.old_name, self.new_name)):
            if n is not None and n not in out:
                out.append(n)
        return out


class Diff:
    def __init__(self, name, files, preamble):
        self.name = name          # for messages (the file as given)
        self.files = files
        self.preamble = preamble  # the free text before the first file


def split_lines(data):
    """Lines with their ends; only b"\\n" ends a line (a lone CR is
    content, as for patch(1))."""
    if not data:
        return []
    out = data.split(b"\n")
    last = out.pop()
    out = [l + b"\n" for l in out]
    if last:
        out.append(last)
    return out


_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_TIMESTAMP = re.compile(rb"\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?( [+-]\d{4})?$")
_EPOCH = re.compile(rb"\t(1970-01-01 00:00:00|1969-12-31 \d\d:00:00)(\.0+)?( [+-]\d{4})?$")
_GIT_HEADER = ("old mode ", "new mode ", "deleted file mode ", "new file mode ", "similarity index ",
               "dissimilarity index ", "rename from ", "rename to ", "copy from ", "copy to ",
               "index ", "Binary files ", "GIT binary patch")


def _unquote(s):
    """A C-quoted name as git writes it ("a/caf\\303\\251.c") -> bytes."""
    out = bytearray()
    i = 1
    esc = {ord("n"): 10, ord("t"): 9, ord('"'): 34, ord("\\"): 92, ord("a"): 7, ord("b"): 8,
           ord("f"): 12, ord("r"): 13, ord("v"): 11}
    while i < len(s):
        c = s[i]
        if c == ord('"'):
            return bytes(out), s[i + 1:]
        if c == ord("\\") and i + 1 < len(s):
            n = s[i + 1]
            if 48 <= n <= 55:
                m = re.match(rb"[0-7]{1,3}", s[i + 1:])
                out.append(int(m.group(0), 8) & 0xFF)
                i += 1 + len(m.group(0))
                continue
            out.append(esc.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    raise ValueError("unterminated quoted name")


def _decode(b):
    return b.decode("utf-8", "surrogateescape")


def _header_name(rest):
    """The file name of a ---/+++ line (without the marker); None for
    /dev/null.  Returns (name, epoch timestamp?)."""
    rest = rest.rstrip(b"\r\n")
    epoch = bool(_EPOCH.search(rest))
    if rest.startswith(b'"'):
        name, _ = _unquote(rest)
    elif b"\t" in rest:
        name = rest.split(b"\t", 1)[0]
    else:
        name = _TIMESTAMP.sub(b"", rest).rstrip()
    if name == b"/dev/null":
        return None, epoch
    return _decode(name), epoch


def _git_names(rest):
    """The two names of a `diff --git A B` line (None, None if they cannot
    be told apart)."""
    rest = rest.rstrip(b"\r\n")
    try:
        if rest.startswith(b'"'):
            a, tail = _unquote(rest)
            tail = tail.lstrip(b" ")
            b = _unquote(tail)[0] if tail.startswith(b'"') else tail
            return _decode(a), _decode(b)
        if rest.endswith(b'"'):
            k = rest.index(b' "')
            return _decode(rest[:k]), _decode(_unquote(rest[k + 1:])[0])
    except ValueError:
        return None, None
    spaces = [m.start() for m in re.finditer(rb" ", rest)]
    for k in spaces:
        a, b = rest[:k], rest[k + 1:]
        if a.split(b"/", 1)[-1] == b.split(b"/", 1)[-1]:
            return _decode(a), _decode(b)
    if len(spaces) == 1:
        return _decode(rest[:spaces[0]]), _decode(rest[spaces[0] + 1:])
    return None, None


def parse(data, name):
    """The Diff in data (bytes).  Raises DiffError for what is not a
    unified diff or cannot be carried."""
    lines = split_lines(data)
    files = []
    preamble = []
    i = 0
    n = len(lines)

    def where(k):
        return "%s:%d" % (name, k + 1)

    while i < n:
        line = lines[i]
        text = line.rstrip(b"\r\n")
        if text.startswith(b"diff --git "):
            fd = FileDiff(i + 1, True)
            fd.old_name, fd.new_name = _git_names(text[len(b"diff --git "):])
            i += 1
            while i < n:
                t = lines[i].rstrip(b"\r\n")
                s = _decode(t)
                if not s.startswith(_GIT_HEADER):
                    break
                if s.startswith(("Binary files ", "GIT binary patch")):
                    raise DiffError("%s: %s: a binary change cannot be built into a hot patch"
                                    % (where(i), fd.new_name or fd.old_name))
                if s.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
                    raise DiffError("%s: %s: renamed or copied files cannot be built into a hot "
                                    "patch (the fix must change files in place)"
                                    % (where(i), fd.old_name or fd.new_name))
                if s.startswith("new file mode "):
                    fd.creates = True
                elif s.startswith("deleted file mode "):
                    fd.deletes = True
                i += 1
            if i + 1 < n and lines[i].startswith(b"--- ") and lines[i + 1].startswith(b"+++ "):
                old, _ = _header_name(lines[i][4:])
                new, _ = _header_name(lines[i + 1][4:])
                fd.creates = fd.creates or old is None
                fd.deletes = fd.deletes or new is None
                fd.old_name = old if old is not None else fd.old_name
                fd.new_name = new if new is not None else fd.new_name
                i += 2
            if fd.old_name is None and fd.new_name is None:
                raise DiffError("%s: cannot read the file names of this diff --git line"
                                % where(fd.line_no - 1))
            i = _read_hunks(lines, i, fd, name)
            files.append(fd)
            continue
        if text.startswith(b"--- ") and i + 1 < n and lines[i + 1].startswith(b"+++ "):
            fd = FileDiff(i + 1, False)
            fd.old_name, old_epoch = _header_name(line[4:])
            fd.new_name, new_epoch = _header_name(lines[i + 1][4:])
            i = _read_hunks(lines, i + 2, fd, name)
            if not fd.hunks:
                raise DiffError("%s: no hunk after the file header" % where(fd.line_no - 1))
            # diff -N writes a missing file with the epoch as its time
            fd.creates = fd.old_name is None or (
                old_epoch and all(h.old_count == 0 for h in fd.hunks))
            fd.deletes = fd.new_name is None or (
                new_epoch and all(h.new_count == 0 for h in fd.hunks))
            if fd.old_name is None and fd.new_name is None:
                raise DiffError("%s: both file names are /dev/null" % where(fd.line_no - 1))
            files.append(fd)
            continue
        s = _decode(text)
        if s.startswith("Binary files ") and s.endswith(" differ"):
            raise DiffError("%s: a binary change cannot be built into a hot patch (%s)"
                            % (where(i), s))
        if s.startswith("Only in ") and files:
            raise DiffError("%s: '%s': this diff leaves out a created or removed file "
                            "(make it with diff -ruN)" % (where(i), s))
        if text.startswith(b"@@ "):
            raise DiffError("%s: a hunk without a file header (---/+++ lines)" % where(i))
        if not files:
            preamble.append(line)
        i += 1
    if not files:
        raise DiffError("%s: not a unified diff (no ---/+++ file header)" % name)
    return Diff(name, files, b"".join(preamble))


def _read_hunks(lines, i, fd, name):
    n = len(lines)
    while i < n and lines[i].startswith(b"@@ "):
        m = _HUNK.match(lines[i])
        if not m:
            raise DiffError("%s:%d: malformed hunk header" % (name, i + 1))
        os_, oc, ns, nc = (int(m.group(1)), int(m.group(2) or 1),
                           int(m.group(3)), int(m.group(4) or 1))
        h = Hunk(os_, oc, ns, nc, len(fd.hunks) + 1, i + 1)
        i += 1
        old_left, new_left = oc, nc
        while old_left > 0 or new_left > 0:
            if i >= n:
                raise DiffError("%s: hunk %d of %s ends early (the diff is truncated)"
                                % (name, h.number, fd.new_name or fd.old_name))
            line = lines[i]
            op = line[:1]
            if op == b"\\":
                _no_newline(h, name, i)
                i += 1
                continue
            if line in (b"\n", b"\r\n"):
                op, body = b" ", line      # an empty context line whose space was lost
            elif op in (b" ", b"-", b"+"):
                body = line[1:]
            else:
                raise DiffError("%s:%d: hunk %d of %s has %d old and %d new lines fewer than "
                                "its header says" % (name, i + 1, h.number,
                                                     fd.new_name or fd.old_name, old_left,
                                                     new_left))
            if op != b"+":
                old_left -= 1
            if op != b"-":
                new_left -= 1
            if old_left < 0 or new_left < 0:
                raise DiffError("%s:%d: hunk %d of %s has more lines than its header says"
                                % (name, i + 1, h.number, fd.new_name or fd.old_name))
            h.lines.append((op, body))
            i += 1
        while i < n and lines[i].startswith(b"\\"):
            _no_newline(h, name, i)
            i += 1
        fd.hunks.append(h)
    return i


def _no_newline(h, name, i):
    """`\\ No newline at end of file` (in any language): the line before
    it has no line end."""
    if not h.lines:
        raise DiffError("%s:%d: '\\' line before any line of the hunk" % (name, i + 1))
    op, body = h.lines[-1]
    if body.endswith(b"\n"):
        h.lines[-1] = (op, body[:-1])


# ---------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------

def strip_path(name, p):
    """name without its first p components, as patch -pN (runs of slashes
    count as one); None if it has fewer, or leaves the tree (.., an
    absolute path)."""
    rest = name
    for _ in range(p):
        k = rest.find("/")
        if k < 0:
            return None
        rest = rest[k:].lstrip("/")
    parts = [c for c in rest.split("/") if c not in ("", ".")]
    if not parts or name.startswith("/") and p == 0 or ".." in parts:
        return None
    return "/".join(parts)


def max_strip(fd):
    return max(n.count("/") for n in fd.names()) if fd.names() else 0


# ---------------------------------------------------------------------------
# Applying
# ---------------------------------------------------------------------------

def _find(lines, old, expected, lowest):
    """Where old starts in lines: at expected or the nearest position
    around it (not before lowest); None if nowhere."""
    count = len(old)
    last = len(lines) - count
    if count == 0:
        return expected if lowest <= expected <= len(lines) else None
    if last < lowest:
        return None
    for d in range(0, max(expected - lowest, last - expected) + 1):
        for pos in ((expected,) if d == 0 else (expected - d, expected + d)):
            if lowest <= pos <= last and lines[pos:pos + count] == old:
                return pos
    return None


def _show(line):
    s = line.rstrip(b"\n").decode("utf-8", "replace")
    return repr(s if len(s) <= 60 else s[:57] + "...")


def apply(text, fd, rel, diff_name, reverse=False):
    """The content after applying fd (or undoing it, reverse) to text
    (bytes, None: the file does not exist).  Raises ApplyError."""
    creates, deletes = (fd.deletes, fd.creates) if reverse else (fd.creates, fd.deletes)
    if creates:
        if text is not None:
            raise ApplyError("%s: %s already exists, and the fix creates it" % (diff_name, rel))
        lines = []
    else:
        if text is None:
            raise ApplyError("%s: %s does not exist, and the fix changes it" % (diff_name, rel))
        lines = split_lines(text)
    offset = 0
    lowest = 0
    for h in fd.hunks:
        old, new = (h.new(), h.old()) if reverse else (h.old(), h.new())
        start = h.new_start if reverse else h.old_start
        stated = start - 1 if old else start        # index of the first old line
        expected = stated + offset
        pos = _find(lines, old, expected, lowest)
        if pos is None:
            raise ApplyError("%s: hunk %d of %s does not apply at line %d%s (the tree differs "
                             "from the one the fix was made for)"
                             % (diff_name, h.number, rel, max(expected, 0) + 1,
                                _first_difference(lines, old, expected)))
        lines[pos:pos + len(old)] = new
        offset = pos - stated + len(new) - len(old)
        lowest = pos + len(new)
    if deletes:
        if lines:
            raise ApplyError("%s: %s still has %d lines after the fix removes it"
                             % (diff_name, rel, len(lines)))
        return None
    return b"".join(lines)


def _first_difference(lines, old, at):
    """`: line N is '...', the fix expects '...'` at the stated place."""
    if at < 0:
        return ""
    for k, want in enumerate(old):
        if at + k >= len(lines):
            return ": the file ends at line %d, the fix expects %s" % (len(lines), _show(want))
        if lines[at + k] != want:
            return ": line %d is %s, the fix expects %s" % (at + k + 1, _show(lines[at + k]),
                                                             _show(want))
    return ""
