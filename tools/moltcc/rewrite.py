"""Edit buffer for source-to-source rewriting by byte offsets.

libclang reports byte offsets into the file as it read it, so all edits are
expressed against the original bytes and applied in one pass at the end.
Edits may nest (a removed range can contain edits, e.g. a hoisted
declaration is removed from a body but rendered, with its own renames, at
file scope); partial overlaps are bugs and raise.
"""


class OverlapError(Exception):
    pass


class Rewriter:
    def __init__(self, data: bytes):
        self.data = data
        self._edits = []  # (start, end, seq, text-bytes)
        self._seq = 0

    def replace(self, start: int, end: int, text):
        """`text` may be a callable: it is evaluated at render time, so a
        block can include renderings of other (nested) edits."""
        if isinstance(text, str):
            text = text.encode("utf-8", "surrogateescape")
        assert 0 <= start <= end <= len(self.data), (start, end)
        self._seq += 1
        e = (start, end, self._seq, text)
        self._edits.append(e)
        return e

    def insert(self, pos: int, text):
        return self.replace(pos, pos, text)

    def remove(self, start: int, end: int, keep_newlines=True):
        """Removes [start, end); by default keeps the newlines so that the
        following code stays on its original lines (diagnostics, debug info
        and __LINE__ keep matching the user's file)."""
        if keep_newlines:
            n = self.data.count(b"\n", start, end)
            return self.replace(start, end, b"\n" * n + b" ")
        return self.replace(start, end, b"")

    def render(self, start=0, end=None, skip=()):
        """Returns bytes of [start, end) with the edits inside it applied.
        Edits in `skip` are ignored (used to render a removed range)."""
        if end is None:
            end = len(self.data)
        skip = set(id(e) for e in skip)
        edits = [e for e in self._edits
                 if id(e) not in skip and start <= e[0] and e[1] <= end
                 and not (e[0] == e[1] == end and end != len(self.data))]
        # Insertions before replacements at the same offset, outermost
        # replacement first, then registration order.
        edits.sort(key=lambda e: (e[0], e[1] != e[0], -(e[1] - e[0]), e[2]))
        out = []
        pos = start
        for s, t, _, text in edits:
            if s < pos:
                if t <= pos and not (s == t == pos):
                    continue  # nested in an edit already applied
                if s == t and s == pos:
                    pass
                else:
                    raise OverlapError("overlapping edits at %d..%d (cursor %d)" % (s, t, pos))
            out.append(self.data[pos:s])
            if callable(text):
                text = text()
                if isinstance(text, str):
                    text = text.encode("utf-8", "surrogateescape")
            out.append(text)
            pos = t
        out.append(self.data[pos:end])
        return b"".join(out)
