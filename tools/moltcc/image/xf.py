"""Parser of .xf files: state transformers in Kitsune's xfgen notation.

A .xf file tells the full-update generator (xfgen.py) how to carry
state from the running version of a program to the new one where copying
by name is not enough.  This module only reads the file: it returns the
rules with their C bodies as text, and finds the $-specials in a body so
the generator can substitute them.  It has no dependencies beyond the
standard library and raises nothing but XfError on any text.

Grammar
-------
::

    file   := rule*
    rule   := 'INIT' ref [':'] body                 # new variable / field / type
            | ref '->' ref [ [':'] body ]           # transformer, or rename without body
    ref    := IDENT ['@' FILENAME]                  # variable; name@file.c is a static
            | ('struct'|'union'|'enum') IDENT ['.' IDENT]   # type, or field of it
            | 'typedef' IDENT ['.' IDENT]
    body   := '{' C text with balanced braces '}'
    arrow  := '->' | '→' (U+2192)

Tokens may be separated by whitespace and comments ('struct list .cid' and
'counter @ stats.c' are fine).  Outside bodies the comments are '#' and '//'
to the end of the line and '/* ... */'.  Inside a body everything is C: '#'
starts a preprocessor line, and braces inside string literals, character
constants and C comments do not count.

Examples (Kitsune's)::

    INIT get_count: { $out = $oldsym(op_count); }
    mapping -> mapping: { copy($out, $in, "}"); }
    typedef data -> typedef data: { $out = (long) $in; }
    INIT struct list .cid { $out = -1; }
    INIT struct s.x: { $out = $base.y; }
    old_name -> new_name                    # rename, migrated by the type rules
    struct s.old_f -> struct s.new_f        # field rename
    counter@stats.c -> counter@stats.c: { $out = $in * 2; }

Meaning and checks
------------------
* IDENT is an ASCII C identifier ([A-Za-z_][A-Za-z0-9_]*) that is not a C
  keyword.  'INIT' is a keyword only at the start of a rule: a variable
  named INIT can still be written 'INIT -> INIT' or 'INIT@file.c ...'.
* FILENAME is the basename of the C source file that defines a static
  ([A-Za-z0-9_.+-]+, no directory).  '@FILE' is for variables only; types
  are matched by name.
* Fields are one level deep ('struct s.a.b' is refused; write a rule for
  the type of 'a'), and enums have no fields.
* The two sides of '->' are of the same kind: variable -> variable,
  type -> type (any tags: 'struct a -> typedef a_t' is allowed) or
  field -> field.
* INIT may name a variable, a field or a whole type; it needs a body.
  A ':' must be followed by a body.
* Two rules for the same target (same kind, name, file and field) are an
  error, reported at the second one's target with the line of the first.
  Several rules may share a source.

Specials (in bodies)
--------------------
=================  ==========  ==============================================
special            arguments   available
=================  ==========  ==============================================
$out               none        every body (new variable / object / field)
$in                none        '->' rules only (old variable / object / field)
$base              none        field rules only (INIT struct s.f, and
                               struct s.a -> struct s.b): the OLD object
$oldsym(v)         a variable  every body (v or v@file.c; an lvalue)
$newsym(v)         a variable  every body
$oldtype(T)        a type      every body (struct/union/enum/typedef T)
$newtype(T)        a type      every body
$xform(T1, T2)     two types   every body (a const molt__xf_type *)
=================  ==========  ==============================================

Specials inside string literals, character constants and comments of a body
are left alone.  Arguments go in parentheses, which may follow the name
after whitespace ('$oldsym (x)'); parentheses inside an argument must be
balanced and a top-level ',' separates arguments.  A special without
arguments followed by '(' is refused: to call a function pointer write
'($in)(...)'.  A '$' right after an identifier character ('a$in') is
refused, since GNU C would read it as part of the identifier.
parse_xf() checks every body this way, so a file it accepts never makes
scan_specials() fail.

Positions
---------
Lines and columns are 1-based; a line ends at '\\n' and columns count
characters (code points; a tab is one column).  A UTF-8 byte order mark at
the start of the text is ignored.  Body offsets (Special.start/end) are
indices into Rule.body.  Every error is an XfError whose str() is
'PATH:LINE:COL: error: MESSAGE'; the first error stops the parse.
"""
import bisect
import difflib
import os
import re
from dataclasses import dataclass
from typing import Optional

__all__ = ["XfError", "Ref", "Rule", "Special", "parse_xf", "parse_xf_file",
           "scan_specials", "parse_ref", "substitute", "SPECIALS"]


class XfError(Exception):
    """An error in a .xf file: str(e) == 'PATH:LINE:COL: error: MESSAGE'."""

    def __init__(self, path, line, col, msg):
        self.path = path
        self.line = line
        self.col = col
        self.msg = msg
        super().__init__("%s:%d:%d: error: %s" % (path, line, col, msg))

    def __reduce__(self):
        return (XfError, (self.path, self.line, self.col, self.msg))


@dataclass
class Ref:
    """Something a rule names: a variable, a type or a field of a type."""
    kind: str                  # 'var' | 'type' | 'field'
    name: str                  # var: identifier; type/field: the canonical type name,
                               #   'struct foo' | 'union foo' | 'enum foo' | 'typedef foo'
    tu: Optional[str]          # var only: basename of a static's source file, else None
    field: Optional[str]       # field only: the field name
    line: int
    col: int

    @property
    def key(self):
        """What identifies the entity, without its position."""
        return (self.kind, self.name, self.tu, self.field)

    def __str__(self):
        if self.kind == "var":
            return self.name + ("@" + self.tu if self.tu else "")
        if self.kind == "field":
            return "%s.%s" % (self.name, self.field)
        return self.name


@dataclass
class Rule:
    """One rule: 'init' (INIT T { }), 'xform' (a -> b { }) or 'rename' (a -> b)."""
    kind: str
    source: Optional[Ref]      # None for 'init'
    target: Ref
    body: Optional[str]        # exact text between the outer braces; None for 'rename'
    body_line: int             # position of the first character after '{' (0 without body)
    body_col: int
    line: int                  # position of the rule's first token
    col: int


@dataclass
class Special:
    """A $-special found in a body."""
    name: str                  # a key of SPECIALS: 'in' 'out' 'base' 'oldsym' 'newsym'
                               #   'oldtype' 'newtype' 'xform'
    args: list                 # raw argument texts, stripped
    start: int                 # body[start:end] is the whole special, e.g. '$xform(struct a, b_t)'
    end: int
    line: int                  # position of the '$' in the .xf file
    col: int


# name -> number of arguments
SPECIALS = {"in": 0, "out": 0, "base": 0, "oldsym": 1, "newsym": 1,
            "oldtype": 1, "newtype": 1, "xform": 2}

_TAGS = ("struct", "union", "enum", "typedef")

_BASE_TYPES = frozenset("""
    char short int long float double void signed unsigned _Bool bool _Complex
    _Imaginary _BitInt __int128 _Float16 _Float32 _Float64 _Float128
    _Decimal32 _Decimal64 _Decimal128""".split())

_C_KEYWORDS = frozenset("""
    auto break case const continue default do else enum extern for goto if
    inline register restrict return sizeof static struct switch typedef union
    volatile while _Alignas _Alignof _Atomic _Generic _Noreturn _Static_assert
    _Thread_local alignas alignof constexpr false nullptr static_assert
    thread_local true typeof typeof_unqual asm __asm__ __asm __attribute__
    __typeof__ __typeof __extension__ __restrict __restrict__ __inline
    __inline__ __const __volatile__ __signed__ __label__ __auto_type
    __builtin_va_list __alignof__""".split()) | _BASE_TYPES

_WS = " \t\r\n\f\v"
_WS_RE = re.compile(r"[ \t\r\n\f\v]+")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER_RE = re.compile(r"[0-9][A-Za-z0-9_.]*")
_FILENAME_RE = re.compile(r"(?:[A-Za-z0-9_.+]|-(?!>))+")
_IDENT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_PPNUM_CHARS = _IDENT_CHARS | {"."}
_ARROWS_LOOKALIKE = "\u2212\u2013\u2014\u2010\u2011\u2012\u2015\ufe63\uff0d"  # minus, dashes
_C_INTEREST_RE = re.compile(r"[{}\"'/$]")
_ARG_INTEREST_RE = re.compile(r"[()\"'/,]")
_LIT_RE = {'"': re.compile(r'[\\"\n]'), "'": re.compile(r"[\\'\n]")}
_TYPE_HINT = "'struct T', 'union T', 'enum T' or 'typedef T'"


def _char_desc(c):
    """A character for a message: 'x', or U+XXXX for invisible ones."""
    o = ord(c)
    if o < 0x20 or o == 0x7F:
        return "control character U+%04X" % o
    if o < 0x80:
        return "'%s'" % c
    if 0xD800 <= o <= 0xDFFF or not c.isprintable():
        return "character U+%04X" % o
    return "'%s' (U+%04X)" % (c, o)


class _Src:
    """A piece of text with its position in the .xf file: index -> line:col."""

    def __init__(self, text, path, line0=1, col0=1):
        self.text = text
        self.path = path
        self.line0 = line0
        self.col0 = col0
        self._nls = None

    def linecol(self, i):
        if self._nls is None:
            self._nls = [m.start() for m in re.finditer("\n", self.text)]
        k = bisect.bisect_left(self._nls, i)
        if k == 0:
            return self.line0, self.col0 + i
        return self.line0 + k, i - self._nls[k - 1]

    def error(self, i, msg):
        line, col = self.linecol(i)
        return XfError(self.path, line, col, msg)


class _Tok:
    __slots__ = ("kind", "text", "start", "end")

    def __init__(self, kind, text, start, end):
        self.kind = kind          # 'ident' 'number' 'arrow' ':' '.' '@' '{' '}' 'other' 'eof'
        self.text = text
        self.start = start
        self.end = end

    def desc(self):
        if self.kind == "eof":
            return "end of file"
        if self.kind == "other":
            return _char_desc(self.text)
        return "'%s'" % self.text


# ---------------------------------------------------------------------------
# C text: literals, comments, bodies
# ---------------------------------------------------------------------------

def _skip_literal(src, j):
    """Index after the string literal / character constant opening at j."""
    text = src.text
    q = text[j]
    pat = _LIT_RE[q]
    i = j + 1
    while True:
        m = pat.search(text, i)
        if m is None or m.group() == "\n":
            what = "string literal" if q == '"' else "character constant"
            raise src.error(j, "unterminated %s (missing closing %s on this line)" % (what, q))
        if m.group() == q:
            return m.end()
        # backslash: skip the escaped character (a '\\\r\n' splice: both)
        i = m.end() + 1
        if text.startswith("\r\n", m.end()):
            i += 1


def _skip_c_literal_or_comment(src, text, j, default):
    """Where scanning C text resumes when text[j] may open a string or
    character literal or a comment: the index after it, or `default` when
    nothing opens at j (a lone '/', or a C23 digit separator)."""
    c = text[j]
    if c == '"' or (c == "'" and not _is_digit_separator(text, j)):
        return _skip_literal(src, j)
    if c == "/":
        nxt = text[j + 1:j + 2]
        if nxt == "*":
            k = text.find("*/", j + 2)
            if k < 0:
                raise src.error(j, "unterminated comment: '/*' without '*/'")
            return k + 2
        if nxt == "/":
            return _skip_line_comment(text, j)
    return default


def _skip_line_comment(text, j):
    """Index of the '\\n' ending the // comment at j (backslash-newline continues it)."""
    while True:
        k = text.find("\n", j)
        if k < 0:
            return len(text)
        e = k - 1
        if e >= 0 and text[e] == "\r":
            e -= 1
        if e >= 0 and text[e] == "\\":
            j = k + 1
            continue
        return k


def _is_digit_separator(text, j):
    """Is the "'" at j a C23 digit separator (1'000'000)?"""
    k = j
    while k > 0 and text[k - 1] in _PPNUM_CHARS:
        k -= 1
    if k == j:
        return False
    c = text[k]
    if c == ".":
        return k + 1 < j and text[k + 1].isdigit() and text[k + 1].isascii()
    return c.isdigit() and c.isascii()


def _code_chars(src, i, interest):
    """(index, character) of each character of C text from i that the
    regular expression `interest` finds outside literals and comments
    (interest must also find '"', "'" and '/', which open them)."""
    text = src.text
    while True:
        m = interest.search(text, i)
        if m is None:
            return
        j = m.start()
        c = text[j]
        i = j + 1
        if c in "\"'/":
            i = _skip_c_literal_or_comment(src, text, j, i)
        else:
            yield j, c


def _scan_c(src, i, open_brace):
    """Scans C text from i, skipping literals and comments.

    With open_brace (the index of a '{'), stops at the '}' that balances it
    and returns its index; otherwise scans to the end and returns len(text).
    Also returns the indexes of the '$' characters found in code."""
    text = src.text
    depth = 1
    dollars = []
    for j, c in _code_chars(src, i, _C_INTEREST_RE):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and open_brace is not None:
                return j, dollars
        elif c == "$":
            dollars.append(j)
    if open_brace is not None:
        raise src.error(open_brace, "unterminated body: no '}' closes this '{'")
    return len(text), dollars


# ---------------------------------------------------------------------------
# Tokens outside bodies
# ---------------------------------------------------------------------------

class _Lexer:
    def __init__(self, src, hash_comments=True):
        self.src = src
        self.text = src.text
        self.hash_comments = hash_comments

    def skip_trivia(self, i):
        text = self.text
        n = len(text)
        while i < n:
            c = text[i]
            if c in _WS:
                i = _WS_RE.match(text, i).end()
            elif c == "#" and self.hash_comments:
                k = text.find("\n", i)
                i = n if k < 0 else k + 1
            elif c == "/" and text.startswith("//", i):
                k = text.find("\n", i)
                i = n if k < 0 else k + 1
            elif c == "/" and text.startswith("/*", i):
                k = text.find("*/", i + 2)
                if k < 0:
                    raise self.src.error(i, "unterminated comment: '/*' without '*/'")
                i = k + 2
            else:
                break
        return i

    def token(self, i):
        """The token at i (after trivia)."""
        text = self.text
        i = self.skip_trivia(i)
        if i >= len(text):
            return _Tok("eof", "", i, i)
        c = text[i]
        if c in _IDENT_CHARS and not c.isdigit():
            end = _IDENT_RE.match(text, i).end()
            if end < len(text) and not text[end].isascii() and (
                    text[end].isalnum() or text[end] == "_" or text[end].isidentifier()):
                raise self.src.error(end, "non-ASCII character %s in identifier: identifiers "
                                          "must be ASCII C identifiers" % _char_desc(text[end]))
            return _Tok("ident", text[i:end], i, end)
        if c.isdigit() and c.isascii():
            end = _NUMBER_RE.match(text, i).end()
            return _Tok("number", text[i:end], i, end)
        if c == "-" and text.startswith("->", i):
            return _Tok("arrow", "->", i, i + 2)
        if c == "\u2192":
            return _Tok("arrow", c, i, i + 1)
        if c in ":.@{}":
            return _Tok(c, c, i, i + 1)
        if c in _ARROWS_LOOKALIKE and text.startswith(">", i + 1):
            raise self.src.error(i, "%s is not a minus sign: write the arrow as '->' (or '\u2192')"
                                 % _char_desc(c))
        if c == "\x00":
            raise self.src.error(i, "NUL character in the file")
        if not c.isascii():
            if c.isalnum() or c.isidentifier():
                raise self.src.error(i, "non-ASCII character %s in identifier: identifiers "
                                        "must be ASCII C identifiers" % _char_desc(c))
            raise self.src.error(i, "unexpected non-ASCII character %s outside a body"
                                 % _char_desc(c))
        if ord(c) < 0x20 or ord(c) == 0x7F:
            raise self.src.error(i, "unexpected %s" % _char_desc(c))
        return _Tok("other", c, i, i + 1)

    def filename(self, i):
        """The FILENAME token after '@' (at i, after trivia)."""
        text = self.text
        i = self.skip_trivia(i)
        m = _FILENAME_RE.match(text, i)
        end = m.end() if m else i
        nxt = text[end] if end < len(text) else ""
        if nxt in ("/", "\\"):
            raise self.src.error(i, "'@' takes the basename of the static's source file "
                                    "(e.g. 'counter@stats.c'), not a path")
        if nxt and not nxt.isascii() and (nxt.isalnum() or nxt.isidentifier()):
            raise self.src.error(end, "non-ASCII character %s in a file name: write the "
                                      "file name in ASCII" % _char_desc(nxt))
        if end == i:
            found = self.token(i).desc() if i < len(text) else "end of file"
            raise self.src.error(i, "expected the source file of the static after '@' "
                                    "(e.g. 'counter@stats.c'), found %s" % found)
        name = text[i:end]
        if name in (".", ".."):
            raise self.src.error(i, "'%s' is not a source file name" % name)
        return _Tok("filename", name, i, end)


# ---------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------

class _Parser:
    def __init__(self, src, hash_comments=True):
        self.src = src
        self.lex = _Lexer(src, hash_comments)
        self.pos = 0

    def peek(self):
        return self.lex.token(self.pos)

    def take(self):
        t = self.lex.token(self.pos)
        self.pos = t.end
        return t

    def err(self, tok_or_index, msg):
        i = tok_or_index.start if isinstance(tok_or_index, _Tok) else tok_or_index
        return self.src.error(i, msg)

    def check_ident(self, t, what):
        if t.text in _C_KEYWORDS:
            raise self.err(t, "'%s' is a C keyword, not %s" % (t.text, what))

    def ref(self, expect="any", context=""):
        """ref := IDENT ['@' FILENAME] | TAG IDENT ['.' IDENT].

        expect: 'any' (var, type or field), 'var', or 'type' (not a field)."""
        t = self.peek()
        line, col = self.src.linecol(t.start)
        where = (" " + context) if context else ""
        if t.kind != "ident":
            if expect == "type":
                wanted = "a type (%s)" % _TYPE_HINT
            elif expect == "var":
                wanted = "a variable name"
            else:
                wanted = "a variable or a type (%s)" % _TYPE_HINT
            raise self.err(t, "expected %s%s, found %s" % (wanted, where, t.desc()))
        if t.text in _TAGS:
            tag = t.text
            if expect == "var":
                raise self.err(t, "expected a variable%s, found the type tag '%s'" % (where, tag))
            self.take()
            n = self.peek()
            if n.kind != "ident":
                if n.kind == "{":
                    raise self.err(n, "expected the name of the %s after '%s', found '{': "
                                      "anonymous types cannot be named in .xf rules" % (tag, tag))
                raise self.err(n, "expected the name of the %s after '%s', found %s"
                               % (tag, tag, n.desc()))
            if n.text in _TAGS:
                raise self.err(n, "expected the name of the %s after '%s', found the type tag "
                                  "'%s'" % (tag, tag, n.text))
            self.check_ident(n, "a type name")
            self.take()
            name = "%s %s" % (tag, n.text)
            look = self.peek()
            if look.kind == ".":
                if tag == "enum":
                    raise self.err(look, "enums have no fields: '%s' cannot be followed by '.'"
                                   % name)
                self.take()
                f = self.peek()
                if f.kind != "ident":
                    raise self.err(f, "expected a field name after '%s.', found %s"
                                   % (name, f.desc()))
                self.check_ident(f, "a field name")
                self.take()
                if expect == "type":
                    raise self.err(t, "expected a type (%s)%s, found the field '%s.%s': only a "
                                      "whole type is allowed here"
                                   % (_TYPE_HINT, where, name, f.text))
                again = self.peek()
                if again.kind == ".":
                    raise self.err(again, "nested fields ('%s.%s.…') are not supported: write a "
                                          "rule for the type of '%s' instead"
                                   % (name, f.text, f.text))
                if again.kind == "@":
                    raise self.err(again, "'@FILE' names the source file of a static variable; "
                                          "fields and types are matched by name")
                return Ref("field", name, None, f.text, line, col)
            if look.kind == "@":
                raise self.err(look, "'@FILE' names the source file of a static variable; "
                                     "types are matched by name")
            return Ref("type", name, None, None, line, col)
        # a variable
        if expect == "type":
            if t.text in _BASE_TYPES:
                raise self.err(t, "expected a type (%s)%s, found the basic type '%s': name the "
                                  "typedef or struct that uses it" % (_TYPE_HINT, where, t.text))
            raise self.err(t, "expected a type (%s)%s, found '%s' (write 'typedef %s' for a "
                              "typedef name)" % (_TYPE_HINT, where, t.text, t.text))
        if t.text in _BASE_TYPES:
            raise self.err(t, "'%s' is a C keyword, not a variable name; types are written %s"
                           % (t.text, _TYPE_HINT))
        self.check_ident(t, "a variable name")
        self.take()
        tu = None
        look = self.peek()
        if look.kind == "@":
            self.take()
            ft = self.lex.filename(self.pos)
            self.pos = ft.end
            tu = ft.text
            look = self.peek()
        if look.kind == ".":
            raise self.err(look, "a field is named through its type ('struct %s.…', "
                                 "'union %s.…' or 'typedef %s.…'), not a variable"
                           % (t.text, t.text, t.text))
        return Ref("var", t.text, tu, None, line, col)

    def body(self, lbrace):
        """Reads the body whose '{' token is lbrace: (text, line, col)."""
        end, _ = _scan_c(self.src, lbrace.end, lbrace.start)
        self.pos = end + 1
        line, col = self.src.linecol(lbrace.end)
        return self.src.text[lbrace.end:end], line, col

    def rule(self):
        t = self.peek()
        line, col = self.src.linecol(t.start)
        if t.kind == "ident" and t.text == "INIT":
            after = self.lex.token(t.end)
            if after.kind not in ("arrow", "@"):
                self.take()
                if after.kind == "eof":
                    raise self.err(after, "expected what to initialise after 'INIT' (a variable, "
                                          "a field 'struct s.f' or a type), found end of file")
                target = self.ref(context="after 'INIT'")
                nxt = self.take()
                if nxt.kind == ":":
                    colon = nxt
                    nxt = self.take()
                    if nxt.kind != "{":
                        raise self.err(nxt, "expected '{' after ':' to start the body of "
                                            "'INIT %s', found %s" % (target, nxt.desc()))
                elif nxt.kind == "arrow":
                    raise self.err(nxt, "an INIT rule has no source: write 'SOURCE -> %s: "
                                        "{ ... }' without 'INIT', or 'INIT %s: { ... }'"
                                   % (target, target))
                elif nxt.kind != "{":
                    raise self.err(nxt, "expected ':' or '{' to start the body of 'INIT %s' "
                                        "(an INIT rule needs a body), found %s"
                                   % (target, nxt.desc()))
                text, bl, bc = self.body(nxt)
                return Rule("init", None, target, text, bl, bc, line, col)
        if t.kind != "ident":
            if t.kind == "}":
                raise self.err(t, "unexpected '}' outside a body (one '}' too many in the "
                                  "body above?)")
            if t.kind in ("{", ":"):
                raise self.err(t, "expected a rule ('INIT TARGET { ... }' or 'SOURCE -> TARGET'), "
                                  "found %s: a body must follow 'INIT x' or 'a -> b'" % t.desc())
            hint = " (rules are not terminated by ';')" if t.text == ";" else ""
            raise self.err(t, "expected a rule ('INIT TARGET { ... }' or 'SOURCE -> TARGET'), "
                              "found %s%s" % (t.desc(), hint))
        source = self.ref(context="at the start of a rule")
        arrow = self.peek()
        if arrow.kind != "arrow":
            hint = ""
            if arrow.kind in ("{", ":"):
                hint = " (a rule without source is written 'INIT %s { ... }')" % source
            elif (source.kind == "var" and source.name.upper() == "INIT"
                  and source.name != "INIT"):
                hint = " (did you mean 'INIT'?)"
            elif source.kind == "var" and arrow.kind == "ident" and source.tu is None:
                close = difflib.get_close_matches(source.name, _TAGS, n=1, cutoff=0.7)
                if close:
                    hint = " (did you mean '%s'?)" % close[0]
            elif arrow.kind == "other" and arrow.text in "-=<>~":
                hint = " (the arrow is '->')"
            raise self.err(arrow, "expected '->' after '%s', found %s%s"
                           % (source, arrow.desc(), hint))
        self.take()
        target = self.ref(context="after '->'")
        if source.kind != target.kind:
            kinds = {"var": "a variable", "type": "a type", "field": "a field"}
            raise self.src.error(self._index_of(target),
                                 "'->' maps %s ('%s') to %s ('%s'): both sides must be variables, "
                                 "both types or both fields"
                                 % (kinds[source.kind], source, kinds[target.kind], target))
        nxt = self.peek()
        if nxt.kind == ":":
            self.take()
            nxt = self.take()
            if nxt.kind != "{":
                raise self.err(nxt, "expected '{' after ':' to start the body of '%s -> %s', "
                                    "found %s (a rename has no ':')" % (source, target, nxt.desc()))
            text, bl, bc = self.body(nxt)
            return Rule("xform", source, target, text, bl, bc, line, col)
        if nxt.kind == "{":
            self.take()
            text, bl, bc = self.body(nxt)
            return Rule("xform", source, target, text, bl, bc, line, col)
        return Rule("rename", source, target, None, 0, 0, line, col)

    def _index_of(self, ref):
        """Index in the text of a ref's line:col (for errors after the fact)."""
        src = self.src
        if ref.line == src.line0:
            return ref.col - src.col0
        src.linecol(0)
        return src._nls[ref.line - src.line0 - 1] + ref.col

    def file(self):
        rules = []
        seen = {}
        while self.peek().kind != "eof":
            r = self.rule()
            first = seen.get(r.target.key)
            if first is not None:
                raise self.src.error(
                    self._index_of(r.target),
                    "duplicate rule for '%s': the first is at line %d (one rule per target)"
                    % (r.target, first.line))
            seen[r.target.key] = r
            rules.append(r)
        return rules


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------

def _check_text(src):
    text = src.text
    k = text.find("\x00")
    if k >= 0:
        raise src.error(k, "NUL character in the file")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise src.error(e.start, "invalid character U+%04X (a lone surrogate)"
                        % ord(text[e.start])) from None


def parse_xf(text, path="<xf>"):
    """Parses the text of a .xf file: the list of its rules, in order.

    Checks the specials of every body too (see scan_specials).  Raises
    XfError for any error.  text may also be bytes (UTF-8)."""
    path = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    if isinstance(text, (bytes, bytearray)):
        text = _decode(bytes(text), path)
    if not isinstance(text, str):
        raise TypeError("parse_xf: text must be str, not %s" % type(text).__name__)
    if text.startswith("\ufeff"):
        text = text[1:]
    src = _Src(text, path)
    _check_text(src)
    rules = _Parser(src).file()
    for r in rules:
        scan_specials(r, path)
    return rules


def _decode(data, path):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise XfError(path, 1, 1, "the file is not valid UTF-8 (byte 0x%02x on line %d)"
                      % (data[e.start], line)) from None


def parse_xf_file(path):
    """Reads (UTF-8) and parses a .xf file.  An unreadable or undecodable file
    is an XfError at 1:1."""
    spath = os.fspath(path)
    if isinstance(spath, bytes):
        spath = os.fsdecode(spath)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise XfError(spath, 1, 1, "cannot read the file: %s" % (e.strerror or e)) from None
    except ValueError as e:   # e.g. a path with a NUL byte
        raise XfError(spath, 1, 1, "cannot read the file: %s" % e) from None
    return parse_xf(_decode(data, spath), spath)


def parse_ref(text, path="<xf>", line=1, col=1, expect="any"):
    """Parses one reference ('counter@stats.c', 'struct s.f', 'typedef t')
    written at line:col of path.  expect: 'any', 'var' or 'type'."""
    if text.startswith("\ufeff"):
        text = text[1:]
    src = _Src(text, path, line, col)
    _check_text(src)
    p = _Parser(src)
    r = p.ref(expect)
    t = p.peek()
    if t.kind != "eof":
        raise p.err(t, "unexpected %s after '%s'" % (t.desc(), r))
    return r


def _find_args(src, open_paren, name):
    """Arguments of a special whose '(' is at open_paren: ([(start, end)], index after ')')."""
    depth = 1
    args = []
    a = open_paren + 1
    for j, c in _code_chars(src, a, _ARG_INTEREST_RE):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append((a, j))
                return args, j + 1
        elif c == "," and depth == 1:
            args.append((a, j))
            a = j + 1
    raise src.error(open_paren, "unbalanced parentheses: no ')' closes the '(' of '$%s'" % name)


def scan_specials(rule, path="<xf>"):
    """The $-specials of a rule's body, in order ([] without body).

    Raises XfError (at the position in the .xf file) for: a '$' that starts
    no special or follows an identifier character, an unknown $name, '$in',
    '$out' or '$base' followed by '(', a missing '(' or unbalanced
    parentheses, a wrong number of arguments or an empty one, an argument
    that is not a variable ($oldsym/$newsym) or not a whole type
    ($oldtype/$newtype/$xform), '$in' in an INIT rule, and '$base' outside
    a field rule.  Unterminated literals or comments in the body are
    errors too."""
    if rule.body is None:
        return []
    src = _Src(rule.body, path, rule.body_line, rule.body_col)
    _check_text(src)
    text = src.text
    _, dollars = _scan_c(src, 0, None)
    out = []
    skip_until = 0
    for d in dollars:
        if d < skip_until:
            continue
        if d > 0 and (text[d - 1] in _IDENT_CHARS or text[d - 1] == "$"):
            raise src.error(d, "'$' right after an identifier character: a special must start "
                               "its own token (GNU C would read '%s$' as one identifier)"
                            % text[max(0, d - 1)])
        m = _IDENT_RE.match(text, d + 1)
        if m is None:
            raise src.error(d, "'$' must start a special: %s"
                            % ", ".join("$" + s for s in SPECIALS))
        name = m.group()
        if name not in SPECIALS:
            close = difflib.get_close_matches(name, list(SPECIALS), n=1)
            hint = (" (did you mean '$%s'?)" % close[0]) if close else ""
            raise src.error(d, "unknown special '$%s'%s; the specials are %s"
                            % (name, hint, ", ".join("$" + s for s in SPECIALS)))
        nargs = SPECIALS[name]
        j = m.end()
        k = j
        while k < len(text) and text[k] in _WS:
            k += 1
        has_paren = k < len(text) and text[k] == "("
        args = []
        if nargs == 0:
            if has_paren:
                raise src.error(k, "'$%s' takes no arguments (to call through it, write "
                                   "'($%s)(...)')" % (name, name))
            end = j
        else:
            if not has_paren:
                example = {"oldsym": "$oldsym(counter)", "newsym": "$newsym(counter)",
                           "oldtype": "$oldtype(struct s)", "newtype": "$newtype(struct s)",
                           "xform": "$xform(struct a, struct b)"}[name]
                raise src.error(d, "'$%s' needs %s in parentheses, e.g. '%s'"
                                % (name, "an argument" if nargs == 1 else "%d arguments" % nargs,
                                   example))
            spans, end = _find_args(src, k, name)
            if len(spans) != nargs:
                raise src.error(d, "'$%s' takes %d argument%s, found %d"
                                % (name, nargs, "" if nargs == 1 else "s", len(spans)))
            for a, b in spans:
                raw = text[a:b]
                lead = len(raw) - len(raw.lstrip(_WS))
                arg = raw.strip(_WS)
                line, col = src.linecol(a + lead)
                if not arg:
                    what = "a variable" if name in ("oldsym", "newsym") else "a type"
                    raise src.error(a + lead if a + lead < b else b,
                                    "empty argument of '$%s': expected %s" % (name, what))
                expect = "var" if name in ("oldsym", "newsym") else "type"
                sub = _Src(arg, path, line, col)
                p = _Parser(sub, hash_comments=False)
                r = p.ref(expect, context="in '$%s(...)'" % name)
                t = p.peek()
                if t.kind != "eof":
                    raise p.err(t, "unexpected %s after '%s' in '$%s(...)'"
                                % (t.desc(), r, name))
                args.append(arg)
        if name == "in" and rule.kind == "init":
            hint = ""
            if rule.target.kind == "field":
                hint = "; '$base' is the old object that contains the field"
            raise src.error(d, "'$in' is not available in an INIT rule: there is no old value%s"
                            % hint)
        if name == "base" and rule.target.kind != "field":
            raise src.error(d, "'$base' is only available in field rules ('INIT struct s.f' or "
                               "'struct s.a -> struct s.b'): it is the old object that contains "
                               "the field")
        line, col = src.linecol(d)
        out.append(Special(name, args, d, end, line, col))
        skip_until = end
    return out


def substitute(body, specials, replace):
    """body with each special replaced by replace(special) (a str)."""
    parts = []
    last = 0
    for s in sorted(specials, key=lambda s: s.start):
        parts.append(body[last:s.start])
        parts.append(replace(s))
        last = s.end
    parts.append(body[last:])
    return "".join(parts)
