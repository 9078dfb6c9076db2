"""Fuzzing the .xf parser: mutated valid files (byte flips, truncation,
insertion of random tokens, deletions, deep nesting) must either parse or
raise XfError -- never anything else -- with a position inside the text.
When they parse, the results must be consistent with the text.  Fixed
seeds, a few thousand iterations, a few seconds."""
import random

import pytest

from moltcc.image import xf
from moltcc.image.xf import XfError

SEEDS = [
    """\
# Kitsune's examples
INIT get_count: { $out = $oldsym(op_count); }
mapping -> mapping: {
  if ($in) { for (int i = 0; i < 3; i++) { puts("}"); } }  /* } { */
}
typedef data -> typedef data: { $out = (long) $in; }
INIT struct list .cid { $out = -1 }
INIT struct s.x: { $out = $base.y }
old_name -> new_name   // a rename
struct s.old_f -> struct s.new_f
counter@stats.c -> counter@stats.c: { $out = $in * 2; }
""",
    """\
/* statics and types */
struct entry -> struct entry: {
  $out->key = $in->key;
  MOLT_XF_INVOKE($xform(struct val, typedef val_t), &$in->v, &$out->v);
  $out->next = MOLT_XF_PTR($in->next, $xform(struct entry, struct entry));
}
table@kv.c \u2192 table@kv.c { $newsym(table_size) = $oldsym(table_size@kv.c); }
INIT typedef cfg_t.flags: { $out = $base.verbose ? 1 : 0; }
struct cfg.a -> struct cfg.b { $out = $in + $base.c; char c = '}'; }
union u -> union u
enum color -> enum color: { switch ($in) { case RED: $out = CRIMSON; break; default: $out = $in; } }
INIT fresh { $out = sizeof($newtype(struct entry)) - sizeof($oldtype(struct entry)); }
""",
    "a -> b\nINIT c {}\r\nstruct d -> struct d\n",
]

TOKENS = ["{", "}", "(", ")", "$", "$in", "$out", "$base", "$xform(", "$oldsym(", "$newtype(",
          '"', "'", "/*", "*/", "//", "#", "->", "\u2192", "\u2014>", "@", ".", ":", ",", "INIT",
          "struct", "union", "enum", "typedef", "int", "\n", "\r\n", "\\", "\\\n", "\x00", "\t",
          "\u00e9", "\ud800", "\ufeff", "1'000", "u8\"", "x@a.c", "struct s.f", " ", ";"]


def nested(rnd):
    d = rnd.randint(1, 4000)
    return rnd.choice([
        "{" * d + "}" * d, "{" * d, "}" * d, "(" * d, ")" * d,
        "$oldsym(" + "(" * d + "x" + ")" * d + ")", "$xform(" * d, "struct " * d,
        "/*" * d, '"' * d, "'{'" * d, "INIT x {" * d, "a -> " * d, "." * d, "@" * d,
        "$in" * d, "\n" * d,
    ])


def mutate_text(rnd, text):
    s = text
    for _ in range(rnd.randint(1, 4)):
        op = rnd.random()
        n = len(s)
        if op < 0.25 and n:                       # replace a character
            i = rnd.randrange(n)
            c = chr(rnd.randrange(0, 0x3000)) if rnd.random() < 0.15 else chr(rnd.randrange(128))
            s = s[:i] + c + s[i + 1:]
        elif op < 0.4:                            # truncate
            s = s[:rnd.randrange(n + 1)]
        elif op < 0.7:                            # insert a token
            i = rnd.randrange(n + 1)
            s = s[:i] + rnd.choice(TOKENS) + s[i:]
        elif op < 0.85 and n:                     # delete a span
            i = rnd.randrange(n)
            s = s[:i] + s[i + rnd.randint(1, 12):]
        elif op < 0.95:                           # deep nesting
            i = rnd.randrange(n + 1)
            s = s[:i] + nested(rnd) + s[i:]
        else:                                     # duplicate a span
            i = rnd.randrange(n + 1)
            j = min(n, i + rnd.randint(1, 60))
            s = s[:j] + s[i:j] + s[j:]
    return s


def mutate_bytes(rnd, data):
    b = bytearray(data)
    for _ in range(rnd.randint(1, 6)):
        op = rnd.random()
        if op < 0.6 and b:                        # flip bits of a byte
            i = rnd.randrange(len(b))
            b[i] ^= (1 << rnd.randrange(8)) if rnd.random() < 0.7 else rnd.randrange(1, 256)
        elif op < 0.75:                           # truncate
            del b[rnd.randrange(len(b) + 1):]
        else:                                     # insert random bytes
            i = rnd.randrange(len(b) + 1)
            b[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 4)))
    return bytes(b)


def char_at(text, line, col):
    """The character at line:col of text (1-based, lines end at '\\n')."""
    lines = text.split("\n")
    assert 1 <= line <= len(lines)
    assert 1 <= col <= len(lines[line - 1]) + 1
    return lines[line - 1][col - 1:col]


def check(text, path="fuzz.xf"):
    """Parses text; asserts the outcome is consistent.  'ok' or 'error'."""
    try:
        rules = xf.parse_xf(text, path)
    except XfError as e:
        assert str(e) == "%s:%d:%d: error: %s" % (path, e.line, e.col, e.msg)
        plain = text[1:] if isinstance(text, str) and text.startswith("\ufeff") else text
        if isinstance(plain, str):
            char_at(plain, e.line, e.col)
        return "error"
    if text.startswith("\ufeff"):
        text = text[1:]
    seen = set()
    for r in rules:
        assert r.kind in ("init", "xform", "rename")
        assert (r.source is None) == (r.kind == "init")
        assert (r.body is None) == (r.kind == "rename")
        assert r.target.key not in seen
        seen.add(r.target.key)
        for ref in (r.source, r.target):
            if ref is None:
                continue
            assert ref.kind in ("var", "type", "field")
            first = ref.name.split(" ")[0]
            assert char_at(text, ref.line, ref.col) == first[0]
        if r.kind == "init":
            assert text.split("\n")[r.line - 1][r.col - 1:r.col + 3] == "INIT"
        if r.body is not None:
            lines = text.split("\n")
            line = lines[r.body_line - 1]
            assert line[r.body_col - 2] == "{"
            specials = xf.scan_specials(r, path)
            # substituting every special by its own text gives the body back
            assert xf.substitute(r.body, specials, lambda s: r.body[s.start:s.end]) == r.body
            for s in specials:
                assert s.name in xf.SPECIALS and len(s.args) == xf.SPECIALS[s.name]
                assert r.body[s.start:s.end].startswith("$" + s.name)
                assert char_at(text, s.line, s.col) == "$"
    return "ok"


def run(seed, iterations, make):
    rnd = random.Random(seed)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(iterations):
        sample = make(rnd)
        try:
            outcomes[check(sample)] += 1
        except XfError:
            raise
        except Exception as e:           # anything else is a parser bug
            pytest.fail("%s: %r on input %r" % (type(e).__name__, e, sample[:2000]))
    return outcomes


def test_seeds_parse():
    for s in SEEDS:
        assert check(s) == "ok"


def test_fuzz_text_mutations():
    out = run(20240611, 6000, lambda rnd: mutate_text(rnd, rnd.choice(SEEDS)))
    # both outcomes happen: the mutations are neither all fatal nor all harmless
    assert out["ok"] > 100 and out["error"] > 2000, out


def test_fuzz_byte_flips():
    encoded = [s.encode("utf-8") for s in SEEDS]
    rnd0 = random.Random(7)

    def make(rnd):
        data = mutate_bytes(rnd, rnd.choice(encoded))
        # half through parse_xf(bytes) (UTF-8 errors are XfError at 1:1), half as
        # text with the undecodable bytes as lone surrogates
        if rnd0.random() < 0.5:
            return data.decode("utf-8", "surrogateescape")
        return data
    rnd = random.Random(99)
    counts = {"ok": 0, "error": 0}
    for _ in range(4000):
        sample = make(rnd)
        try:
            if isinstance(sample, bytes):
                try:
                    xf.parse_xf(sample, "fuzz.xf")
                    counts["ok"] += 1
                except XfError as e:
                    assert str(e).startswith("fuzz.xf:%d:%d: error: " % (e.line, e.col))
                    counts["error"] += 1
            else:
                counts[check(sample)] += 1
        except XfError:
            raise
        except Exception as e:
            pytest.fail("%s: %r on input %r" % (type(e).__name__, e, sample[:2000]))
    assert counts["ok"] > 40 and counts["error"] > 400, counts


def test_fuzz_random_token_soup():
    def make(rnd):
        return "".join(rnd.choice(TOKENS + ["a", "b", "x", "-", ">", "{ $out = 1; }", "a -> b "])
                       for _ in range(rnd.randint(0, 40)))
    out = run(31337, 3000, make)
    assert out["error"] > 0, out


def test_fuzz_files(tmp_path):
    """parse_xf_file on mutated bytes: only XfError, with the file's path."""
    rnd = random.Random(5)
    p = tmp_path / "m.xf"
    for _ in range(200):
        p.write_bytes(mutate_bytes(rnd, rnd.choice(SEEDS).encode("utf-8")))
        try:
            xf.parse_xf_file(str(p))
        except XfError as e:
            assert str(e).startswith("%s:%d:%d: error: " % (p, e.line, e.col))
