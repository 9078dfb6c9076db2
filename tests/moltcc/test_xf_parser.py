"""The .xf parser (tools/moltcc/image/xf.py): every construct of Kitsune's
xfgen notation, the $-specials with their offsets, and every error with its
exact line:column.  Pure Python: no build tree needed."""
import pickle

import pytest

from moltcc.image import xf
from moltcc.image.xf import (Ref, Rule, Special, XfError, parse_xf, parse_xf_file,
                             scan_specials)


def V(name, line, col, tu=None):
    return Ref("var", name, tu, None, line, col)


def T(name, line, col):
    return Ref("type", name, None, None, line, col)


def F(name, field, line, col):
    return Ref("field", name, None, field, line, col)


def err(text, path="t.xf"):
    """(line, col, msg) of the error parse_xf raises for text."""
    with pytest.raises(XfError) as ei:
        parse_xf(text, path)
    e = ei.value
    assert str(e) == "%s:%d:%d: error: %s" % (path, e.line, e.col, e.msg)
    assert e.path == path
    return e.line, e.col, e.msg


def specials(text, i=0):
    rules = parse_xf(text, "t.xf")
    return rules[i], scan_specials(rules[i], "t.xf")


# ---------------------------------------------------------------------------
# Constructs
# ---------------------------------------------------------------------------

KITSUNE = """\
# Kitsune's examples
INIT get_count: { $out = $oldsym(op_count); }
mapping -> mapping: {
  if ($in) { for (int i = 0; i < 3; i++) { puts("}"); } }
}
typedef data -> typedef data: { $out = (long) $in; }
INIT struct list .cid { $out = -1 }
INIT struct s.x: { $out = $base.y }
old_name -> new_name
struct s.old_f -> struct s.new_f
counter@stats.c -> counter@stats.c: { $out = $in * 2; }
"""


def test_kitsune_examples():
    rules = parse_xf(KITSUNE, "k.xf")
    assert rules == [
        Rule("init", None, V("get_count", 2, 6), " $out = $oldsym(op_count); ", 2, 18, 2, 1),
        Rule("xform", V("mapping", 3, 1), V("mapping", 3, 12),
             '\n  if ($in) { for (int i = 0; i < 3; i++) { puts("}"); } }\n', 3, 22, 3, 1),
        Rule("xform", T("typedef data", 6, 1), T("typedef data", 6, 17),
             " $out = (long) $in; ", 6, 32, 6, 1),
        Rule("init", None, F("struct list", "cid", 7, 6), " $out = -1 ", 7, 24, 7, 1),
        Rule("init", None, F("struct s", "x", 8, 6), " $out = $base.y ", 8, 19, 8, 1),
        Rule("rename", V("old_name", 9, 1), V("new_name", 9, 13), None, 0, 0, 9, 1),
        Rule("rename", F("struct s", "old_f", 10, 1), F("struct s", "new_f", 10, 19),
             None, 0, 0, 10, 1),
        Rule("xform", V("counter", 11, 1, "stats.c"), V("counter", 11, 20, "stats.c"),
             " $out = $in * 2; ", 11, 38, 11, 1),
    ]


def test_type_kinds_and_tags():
    rules = parse_xf("struct a -> struct b\nunion u -> union u\nenum e -> enum e: { $out = $in; }\n"
                     "struct old -> typedef new_t\nINIT struct fresh { $out = 0; }\n"
                     "INIT union u.f: {}\nINIT typedef t.f {}\ntypedef t.a -> typedef t.b\n")
    assert [(r.kind, r.source and r.source.key, r.target.key) for r in rules] == [
        ("rename", ("type", "struct a", None, None), ("type", "struct b", None, None)),
        ("rename", ("type", "union u", None, None), ("type", "union u", None, None)),
        ("xform", ("type", "enum e", None, None), ("type", "enum e", None, None)),
        ("rename", ("type", "struct old", None, None), ("type", "typedef new_t", None, None)),
        ("init", None, ("type", "struct fresh", None, None)),
        ("init", None, ("field", "union u", None, "f")),
        ("init", None, ("field", "typedef t", None, "f")),
        ("rename", ("field", "typedef t", None, "a"), ("field", "typedef t", None, "b")),
    ]
    assert rules[5].body == "" and rules[6].body == ""


def test_colon_is_optional_and_arrows():
    a = parse_xf("x -> y: { 1; }")[0]
    b = parse_xf("x -> y { 1; }")[0]
    c = parse_xf("x \u2192 y { 1; }")[0]
    d = parse_xf("x->y{ 1; }")[0]
    for r in (a, b, c, d):
        assert (r.kind, str(r.source), str(r.target), r.body) == ("xform", "x", "y", " 1; ")
    assert c.target.col == 5 and c.body_col == 8


def test_whitespace_and_comments_between_tokens():
    text = ("// leading comment\n"
            "struct /* c */ list\n"
            "   .  # the field\n"
            "  cid -> struct list . id2   /* multi\n"
            "line */ : // c\n"
            "{ $out = $in; }\n"
            "counter @ stats.c -> counter@ stats.c\n")
    r1, r2 = parse_xf(text)
    assert r1.source == F("struct list", "cid", 2, 1)
    assert r1.target == F("struct list", "id2", 4, 10)
    assert (r1.body, r1.body_line, r1.body_col) == (" $out = $in; ", 6, 2)
    assert r2.source == V("counter", 7, 1, "stats.c")
    assert r2.target == V("counter", 7, 22, "stats.c")


def test_empty_and_comment_only_files():
    assert parse_xf("") == []
    assert parse_xf("  \n\t\n") == []
    assert parse_xf("# only\n// comments\n/* here\n */\n") == []
    assert parse_xf("# no newline at the end") == []


def test_statics_file_names():
    rules = parse_xf("a@stats.c -> a@stats-2.c\nb@x_y+z.c -> b\nc -> c@util.cc\n")
    assert [(str(r.source), str(r.target)) for r in rules] == [
        ("a@stats.c", "a@stats-2.c"), ("b@x_y+z.c", "b"), ("c", "c@util.cc")]
    assert rules[0].source.tu == "stats.c" and rules[0].target.tu == "stats-2.c"
    assert rules[1].target.tu is None
    # the file name stops at '->' even without spaces
    r = parse_xf("a@stats.c->a@stats.c")[0]
    assert r.source.tu == "stats.c" and r.target == V("a", 1, 12, "stats.c")


def test_static_and_global_are_different_targets():
    rules = parse_xf("x -> x\nx@a.c -> x@a.c\nx@b.c -> x@b.c\n")
    assert [r.target.key for r in rules] == [
        ("var", "x", None, None), ("var", "x", "a.c", None), ("var", "x", "b.c", None)]


def test_same_source_several_targets_is_fine():
    rules = parse_xf("old -> a\nold -> b\nstruct s -> struct s\nINIT struct s.f {}\n")
    assert len(rules) == 4


def test_init_as_a_variable_name():
    rules = parse_xf("INIT -> INIT\nINIT@a.c -> x: { $out = $in; }\nINIT y {}\n")
    assert [(r.kind, str(r.source), str(r.target)) for r in rules] == [
        ("rename", "INIT", "INIT"), ("xform", "INIT@a.c", "x"), ("init", "None", "y")]


def test_rules_on_one_line():
    rules = parse_xf("a -> b c -> d INIT e {} f -> g { }")
    assert [(r.kind, str(r.target), r.col) for r in rules] == [
        ("rename", "b", 1), ("rename", "d", 8), ("init", "e", 15), ("xform", "g", 25)]


def test_body_is_exact_text():
    body = ("\n"
            "  /* } { */ // } {\n"
            "  char c = '}', d = '{', e = '\\'', f = '\\\\';\n"
            "  const char *s = \"}\\\"}\", *t = \"{\\\\\";\n"
            "  // a continued line comment \\\n"
            "  } still the comment {\n"
            "  #define BRACE '{'\n"
            "  int n = 1'000'000;  /* C23 digit separators */\n"
            "  { { {} } }\n"
            "  const char *u = u8\"}\", *w = L\"{\";  char16_t q = u'}';\n")
    text = "INIT x {" + body + "}\n# after\nINIT y {}"
    rules = parse_xf(text)
    assert rules[0].body == body
    assert (rules[0].body_line, rules[0].body_col) == (1, 9)
    assert rules[1].target == V("y", 13, 6)


def test_string_line_continuation_in_body():
    body = ' s = "a}\\\nb}"; '
    assert parse_xf("INIT x {" + body + "}")[0].body == body


def test_crlf_and_bom():
    text = "\ufeffa -> b\r\nINIT c {\r\n $out = 1;\r\n}\r\n"
    r1, r2 = parse_xf(text)
    assert r1.source == V("a", 1, 1)
    assert r2.target == V("c", 2, 6)
    assert r2.body == "\r\n $out = 1;\r\n"
    assert err("\ufeffa b") == (1, 3, "expected '->' after 'a', found 'b'")


def test_non_ascii_in_bodies_and_comments_is_fine():
    rules = parse_xf("# café\nINIT x { puts(\"naïve → ok\"); /* ü */ }\n/* ß */")
    assert rules[0].body == ' puts("naïve → ok"); /* ü */ '


def test_bytes_input():
    assert parse_xf(b"a -> b")[0].target == V("b", 1, 6)
    assert err(b"a -> b\n\xff") == (1, 1, "the file is not valid UTF-8 (byte 0xff on line 2)")


def test_deep_nesting_in_body():
    depth = 50000
    body = "{" * depth + "}" * depth
    assert parse_xf("INIT x {" + body + "}")[0].body == body
    assert err("INIT x {" + "{" * depth + "}" * (depth - 1)) == (
        1, 8, "unterminated body: no '}' closes this '{'")


def test_parse_xf_file(tmp_path):
    p = tmp_path / "v2.xf"
    p.write_bytes(KITSUNE.encode())
    assert parse_xf_file(str(p)) == parse_xf(KITSUNE)
    assert parse_xf_file(p)[0].target.name == "get_count"      # os.PathLike too
    q = tmp_path / "bad.xf"
    q.write_bytes(b"INIT x {\xc3\x28}\n")
    with pytest.raises(XfError) as ei:
        parse_xf_file(str(q))
    assert str(ei.value) == "%s:1:1: error: the file is not valid UTF-8 (byte 0xc3 on line 1)" % q
    with pytest.raises(XfError) as ei:
        parse_xf_file(str(tmp_path / "missing.xf"))
    assert (ei.value.line, ei.value.col) == (1, 1)
    assert "cannot read the file: No such file or directory" in ei.value.msg
    with pytest.raises(XfError) as ei:
        parse_xf_file(str(tmp_path))
    assert "cannot read the file" in ei.value.msg
    r = tmp_path / "err.xf"
    r.write_text("a -> b\nc d\n")
    with pytest.raises(XfError) as ei:
        parse_xf_file(str(r))
    assert str(ei.value) == "%s:2:3: error: expected '->' after 'c', found 'd'" % r


def test_xferror_attributes_and_pickle():
    e = XfError("a.xf", 3, 7, "boom")
    assert (e.path, e.line, e.col, e.msg, str(e)) == ("a.xf", 3, 7, "boom", "a.xf:3:7: error: boom")
    f = pickle.loads(pickle.dumps(e))
    assert (f.path, f.line, f.col, f.msg, str(f)) == ("a.xf", 3, 7, "boom", "a.xf:3:7: error: boom")


def test_ref_helpers():
    assert xf.parse_ref("counter@stats.c") == V("counter", 1, 1, "stats.c")
    assert xf.parse_ref(" struct  s . f", line=4, col=10) == F("struct s", "f", 4, 11)
    assert str(xf.parse_ref("struct s .f")) == "struct s.f"
    assert str(xf.parse_ref("typedef t")) == "typedef t"
    assert xf.parse_ref("x@a.c").key == ("var", "x", "a.c", None)
    with pytest.raises(XfError) as ei:
        xf.parse_ref("struct s.f", "p.xf", 2, 5, expect="type")
    assert (ei.value.line, ei.value.col) == (2, 5)
    with pytest.raises(XfError) as ei:
        xf.parse_ref("a b", "p.xf", 2, 5)
    assert (ei.value.line, ei.value.col, ei.value.msg) == (2, 7, "unexpected 'b' after 'a'")


# ---------------------------------------------------------------------------
# Specials
# ---------------------------------------------------------------------------

def test_specials_offsets_and_substitution():
    text = ("struct a -> struct a: {\n"
            "  $out->n = $in->n + $oldsym(counter@stats.c);\n"
            "  $newsym(total) += sizeof($oldtype(struct a)) - sizeof($newtype (typedef b_t));\n"
            "  MOLT_XF_INVOKE($xform( struct a ,\n   typedef b ), &$in->x, &$out->x);\n"
            "}\n")
    rule, sp = specials(text)
    assert [(s.name, s.args, s.line, s.col) for s in sp] == [
        ("out", [], 2, 3), ("in", [], 2, 13), ("oldsym", ["counter@stats.c"], 2, 22),
        ("newsym", ["total"], 3, 3), ("oldtype", ["struct a"], 3, 28),
        ("newtype", ["typedef b_t"], 3, 57), ("xform", ["struct a", "typedef b"], 4, 18),
        ("in", [], 5, 18), ("out", [], 5, 27)]
    assert [rule.body[s.start:s.end] for s in sp] == [
        "$out", "$in", "$oldsym(counter@stats.c)", "$newsym(total)", "$oldtype(struct a)",
        "$newtype (typedef b_t)", "$xform( struct a ,\n   typedef b )", "$in", "$out"]

    def repl(s):
        if s.name == "oldsym":
            return "OLD_%s" % xf.parse_ref(s.args[0]).name
        if s.name == "newsym":
            return "NEW_%s" % s.args[0]
        return {"in": "(*old)", "out": "(*new)", "oldtype": "struct a__v0",
                "newtype": "b_t", "xform": "&XF_a_b"}[s.name]
    assert xf.substitute(rule.body, sp, repl) == (
        "\n"
        "  (*new)->n = (*old)->n + OLD_counter;\n"
        "  NEW_total += sizeof(struct a__v0) - sizeof(b_t);\n"
        "  MOLT_XF_INVOKE(&XF_a_b, &(*old)->x, &(*new)->x);\n")


def test_specials_positions_after_first_line():
    rule, sp = specials("\n\n  INIT x:\n{ a = 1;\n\tb = $oldsym(y); }")
    assert (rule.body_line, rule.body_col) == (4, 2)
    assert [(s.line, s.col, s.start) for s in sp] == [(5, 6, 13)]


def test_specials_in_literals_and_comments_are_text():
    body = (' puts("$in costs $5"); c = \'$\'; /* $foo */ // $bar(\n'
            ' $out = 1; ')
    rule, sp = specials("INIT x {" + body + "}")
    assert [(s.name, s.start) for s in sp] == [("out", body.index("$out"))]


def test_specials_argument_parentheses_and_comments():
    rule, sp = specials("INIT x { $oldsym(/* the ) old */ a /*,*/) = 1; }")
    assert sp[0].args == ["/* the ) old */ a /*,*/"]
    assert rule.body[sp[0].start:sp[0].end] == "$oldsym(/* the ) old */ a /*,*/)"


def test_specials_allowed_per_rule_kind():
    # $base in field rules (INIT and ->), $in in every -> rule, $out everywhere
    text = ("INIT struct s.f { $out = $base.g + $oldsym(v); }\n"
            "struct s.a -> struct s.b: { $out = $in + $base.c; }\n"
            "struct t -> struct t { $out.x = $in.x; }\n"
            "v -> v { $out = $in; }\n"
            "INIT w { $out = $newsym(v); }\n"
            "INIT struct n { $out.x = 0; }\n"
            "a -> b\n")
    rules = parse_xf(text)
    assert [[s.name for s in scan_specials(r, "t.xf")] for r in rules] == [
        ["out", "base", "oldsym"], ["out", "in", "base"], ["out", "in"], ["out", "in"],
        ["out", "newsym"], ["out"], []]


def test_scan_specials_on_a_hand_made_rule():
    r = Rule("xform", V("a", 1, 1), V("a", 1, 6), "$out = $in;", 7, 3, 7, 1)
    sp = scan_specials(r, "h.xf")
    assert sp == [Special("out", [], 0, 4, 7, 3), Special("in", [], 7, 10, 7, 10)]
    bad = Rule("init", None, V("a", 1, 1), "\n  $in", 7, 3, 7, 1)
    with pytest.raises(XfError) as ei:
        scan_specials(bad, "h.xf")
    assert str(ei.value).startswith("h.xf:8:3: error: '$in' is not available in an INIT rule")


# ---------------------------------------------------------------------------
# Errors, each at its exact line:col
# ---------------------------------------------------------------------------

SYNTAX_ERRORS = [
    # unexpected tokens / end of file, with what was expected
    ("a", (1, 2, "expected '->' after 'a', found end of file")),
    ("a ->", (1, 5, "expected a variable or a type ('struct T', 'union T', 'enum T' or "
                    "'typedef T') after '->', found end of file")),
    ("a -> {", (1, 6, "expected a variable or a type ('struct T', 'union T', 'enum T' or "
                      "'typedef T') after '->', found '{'")),
    ("a b", (1, 3, "expected '->' after 'a', found 'b'")),
    ("a\n  { }", (2, 3, "expected '->' after 'a', found '{' (a rule without source is written "
                        "'INIT a { ... }')")),
    ("init x {}", (1, 6, "expected '->' after 'init', found 'x' (did you mean 'INIT'?)")),
    ("-> b", (1, 1, "expected a rule ('INIT TARGET { ... }' or 'SOURCE -> TARGET'), found '->'")),
    ("x -> y\n 12 -> z", (2, 2, "expected a rule ('INIT TARGET { ... }' or 'SOURCE -> TARGET'), "
                                "found '12'")),
    ("{ }", (1, 1, "expected a rule ('INIT TARGET { ... }' or 'SOURCE -> TARGET'), found '{': "
                   "a body must follow 'INIT x' or 'a -> b'")),
    ("a -> b\n}", (2, 1, "unexpected '}' outside a body (one '}' too many in the body above?)")),
    ('"a" -> b', (1, 1, "expected a rule ('INIT TARGET { ... }' or 'SOURCE -> TARGET'), "
                        "found '\"'")),
    ("a -> b;", (1, 7, "expected a rule ('INIT TARGET { ... }' or 'SOURCE -> TARGET'), "
                       "found ';' (rules are not terminated by ';')")),
    ("stuct s -> stuct s", (1, 7, "expected '->' after 'stuct', found 's' (did you mean "
                                  "'struct'?)")),
    ("a => b", (1, 3, "expected '->' after 'a', found '=' (the arrow is '->')")),
    ("a - > b", (1, 3, "expected '->' after 'a', found '-' (the arrow is '->')")),
    ("INIT", (1, 5, "expected what to initialise after 'INIT' (a variable, a field 'struct s.f' "
                    "or a type), found end of file")),
    ("INIT :", (1, 6, "expected a variable or a type ('struct T', 'union T', 'enum T' or "
                      "'typedef T') after 'INIT', found ':'")),
    ("INIT x", (1, 7, "expected ':' or '{' to start the body of 'INIT x' (an INIT rule needs a "
                      "body), found end of file")),
    ("INIT x\ny -> z", (2, 1, "expected ':' or '{' to start the body of 'INIT x' (an INIT rule "
                              "needs a body), found 'y'")),
    ("INIT x:", (1, 8, "expected '{' after ':' to start the body of 'INIT x', found end of file")),
    ("INIT x: y", (1, 9, "expected '{' after ':' to start the body of 'INIT x', found 'y'")),
    ("INIT a -> b {}", (1, 8, "an INIT rule has no source: write 'SOURCE -> a: { ... }' without "
                              "'INIT', or 'INIT a: { ... }'")),
    ("a -> b:", (1, 8, "expected '{' after ':' to start the body of 'a -> b', found end of file "
                       "(a rename has no ':')")),
    ("a -> b: c -> d", (1, 9, "expected '{' after ':' to start the body of 'a -> b', found 'c' "
                              "(a rename has no ':')")),
    ("a -> b::{}", (1, 8, "expected '{' after ':' to start the body of 'a -> b', found ':' "
                          "(a rename has no ':')")),
    # types, fields, empty identifiers
    ("struct", (1, 7, "expected the name of the struct after 'struct', found end of file")),
    ("struct -> x", (1, 8, "expected the name of the struct after 'struct', found '->'")),
    ("union { } -> x", (1, 7, "expected the name of the union after 'union', found '{': "
                              "anonymous types cannot be named in .xf rules")),
    ("struct struct s", (1, 8, "expected the name of the struct after 'struct', found the type "
                               "tag 'struct'")),
    ("struct .x -> struct .x", (1, 8, "expected the name of the struct after 'struct', "
                                      "found '.'")),
    ("struct s. -> struct s.y", (1, 11, "expected a field name after 'struct s.', found '->'")),
    ("INIT struct s.", (1, 15, "expected a field name after 'struct s.', found end of file")),
    ("struct s.1 -> x", (1, 10, "expected a field name after 'struct s.', found '1'")),
    ("enum e.x -> enum e.y", (1, 7, "enums have no fields: 'enum e' cannot be followed by '.'")),
    ("struct s.a.b -> struct s.c", (1, 11, "nested fields ('struct s.a.…') are not supported: "
                                           "write a rule for the type of 'a' instead")),
    ("list.cid -> list.cid", (1, 5, "a field is named through its type ('struct list.…', "
                                    "'union list.…' or 'typedef list.…'), not a variable")),
    ("int -> long", (1, 1, "'int' is a C keyword, not a variable name; types are written "
                           "'struct T', 'union T', 'enum T' or 'typedef T'")),
    ("x -> static", (1, 6, "'static' is a C keyword, not a variable name")),
    ("struct int -> struct x", (1, 8, "'int' is a C keyword, not a type name")),
    ("INIT struct s.for {}", (1, 15, "'for' is a C keyword, not a field name")),
    # kinds
    ("a -> struct s", (1, 6, "'->' maps a variable ('a') to a type ('struct s'): both sides must "
                             "be variables, both types or both fields")),
    ("struct s ->\n\n   struct s.f", (3, 4, "'->' maps a type ('struct s') to a field "
                                            "('struct s.f'): both sides must be variables, both "
                                            "types or both fields")),
    ("typedef t.f -> g@a.c", (1, 16, "'->' maps a field ('typedef t.f') to a variable ('g@a.c'): "
                                     "both sides must be variables, both types or both fields")),
    # @FILE
    ("struct s@a.c -> struct s", (1, 9, "'@FILE' names the source file of a static variable; "
                                        "types are matched by name")),
    ("struct s.f@a.c -> struct s.f", (1, 11, "'@FILE' names the source file of a static "
                                             "variable; fields and types are matched by name")),
    ("x@ -> y", (1, 4, "expected the source file of the static after '@' "
                       "(e.g. 'counter@stats.c'), found '->'")),
    ("x@", (1, 3, "expected the source file of the static after '@' (e.g. 'counter@stats.c'), "
                  "found end of file")),
    ("x@src/a.c -> y", (1, 3, "'@' takes the basename of the static's source file "
                              "(e.g. 'counter@stats.c'), not a path")),
    ("x -> y@..", (1, 8, "'..' is not a source file name")),
    ("x@a.c@b.c -> y", (1, 6, "expected '->' after 'x@a.c', found '@'")),
    # characters
    ("café -> b", (1, 4, "non-ASCII character 'é' (U+00E9) in identifier: identifiers must be "
                         "ASCII C identifiers")),
    ("a -> struct ñu", (1, 13, "non-ASCII character 'ñ' (U+00F1) in identifier: identifiers "
                               "must be ASCII C identifiers")),
    ("x@stätš.c -> y", (1, 5, "non-ASCII character 'ä' (U+00E4) in a file name: write the file "
                              "name in ASCII")),
    ("a\u2026 -> b", (1, 2, "unexpected non-ASCII character '\u2026' (U+2026) outside a body")),
    ("a \u2014> b", (1, 3, "'\u2014' (U+2014) is not a minus sign: write the arrow as '->' "
                           "(or '\u2192')")),
    ("a -> b\x01", (1, 7, "unexpected control character U+0001")),
    ("a -> b\n\x00", (2, 1, "NUL character in the file")),
    ("INIT x { a = '\x00'; }", (1, 15, "NUL character in the file")),
    ("# \x00\n", (1, 3, "NUL character in the file")),
    ("a -> b # \ud800", (1, 10, "invalid character U+D800 (a lone surrogate)")),
    # unterminated things
    ("INIT x {\n  $out = 1;\n", (1, 8, "unterminated body: no '}' closes this '{'")),
    ("INIT x { {}", (1, 8, "unterminated body: no '}' closes this '{'")),
    ("INIT x {\n  s = \"}; }\n", (2, 7, "unterminated string literal (missing closing \" on "
                                        "this line)")),
    ("INIT x { c = '}; }", (1, 14, "unterminated character constant (missing closing ' on this "
                                   "line)")),
    ("INIT x { s = \"abc\\", (1, 14, "unterminated string literal (missing closing \" on this "
                                     "line)")),
    ("INIT x { /* } */ /* }", (1, 18, "unterminated comment: '/*' without '*/'")),
    ("INIT x { // }\n", (1, 8, "unterminated body: no '}' closes this '{'")),
    ("a -> b\n  /* abc\n", (2, 3, "unterminated comment: '/*' without '*/'")),
    ("a -> b /*/", (1, 8, "unterminated comment: '/*' without '*/'")),
]


@pytest.mark.parametrize("text,expected", SYNTAX_ERRORS, ids=[repr(t) for t, _ in SYNTAX_ERRORS])
def test_syntax_errors(text, expected):
    assert err(text) == expected


DUPLICATES = [
    ("a -> b\nc -> b", (2, 6, "duplicate rule for 'b': the first is at line 1 (one rule per "
                              "target)")),
    ("INIT b {}\n\n  a -> b { $out = $in; }", (3, 8, "duplicate rule for 'b': the first is at "
                                                     "line 1 (one rule per target)")),
    ("x@s.c -> x@s.c\n# c\ny -> x@s.c", (3, 6, "duplicate rule for 'x@s.c': the first is at "
                                               "line 1 (one rule per target)")),
    ("struct a -> struct b\nINIT struct b {}", (2, 6, "duplicate rule for 'struct b': the first "
                                                      "is at line 1 (one rule per target)")),
    ("INIT struct s .f {}\nstruct s.g -> struct s. f",
     (2, 15, "duplicate rule for 'struct s.f': the first is at line 1 (one rule per target)")),
]


@pytest.mark.parametrize("text,expected", DUPLICATES, ids=[repr(t) for t, _ in DUPLICATES])
def test_duplicate_targets(text, expected):
    assert err(text) == expected


SPECIAL_ERRORS = [
    ("INIT x { $foo }", (1, 10, "unknown special '$foo'; the specials are $in, $out, $base, "
                                "$oldsym, $newsym, $oldtype, $newtype, $xform")),
    ("INIT x {\n  $oldsim(a) }", (2, 3, "unknown special '$oldsim' (did you mean '$oldsym'?); "
                                        "the specials are $in, $out, $base, $oldsym, $newsym, "
                                        "$oldtype, $newtype, $xform")),
    ("INIT x { $ out }", (1, 10, "'$' must start a special: $in, $out, $base, $oldsym, $newsym, "
                                 "$oldtype, $newtype, $xform")),
    ("INIT x { $1 }", (1, 10, "'$' must start a special: $in, $out, $base, $oldsym, $newsym, "
                              "$oldtype, $newtype, $xform")),
    ("INIT x { $$out }", (1, 10, "'$' must start a special: $in, $out, $base, $oldsym, $newsym, "
                                 "$oldtype, $newtype, $xform")),
    ("INIT x { a$out }", (1, 11, "'$' right after an identifier character: a special must start "
                                 "its own token (GNU C would read 'a$' as one identifier)")),
    ("a -> a { $in(1) }", (1, 13, "'$in' takes no arguments (to call through it, write "
                                  "'($in)(...)')")),
    ("a -> a { $out\n  (1) }", (2, 3, "'$out' takes no arguments (to call through it, write "
                                      "'($out)(...)')")),
    ("INIT x { $oldsym }", (1, 10, "'$oldsym' needs an argument in parentheses, e.g. "
                                   "'$oldsym(counter)'")),
    ("INIT x { $xform = 0; }", (1, 10, "'$xform' needs 2 arguments in parentheses, e.g. "
                                       "'$xform(struct a, struct b)'")),
    ("INIT x { $oldsym(a }", (1, 17, "unbalanced parentheses: no ')' closes the '(' of "
                                     "'$oldsym'")),
    ("INIT x { $oldsym(f(a) }", (1, 17, "unbalanced parentheses: no ')' closes the '(' of "
                                        "'$oldsym'")),
    ("INIT x { $oldsym(\")\") }", (1, 18, "expected a variable name in '$oldsym(...)', "
                                          "found '\"'")),
    ("INIT x { $oldsym((a)) }", (1, 18, "expected a variable name in '$oldsym(...)', "
                                        "found '('")),
    ("INIT x { $xform(struct a) }", (1, 10, "'$xform' takes 2 arguments, found 1")),
    ("INIT x { $oldsym(a, b) }", (1, 10, "'$oldsym' takes 1 argument, found 2")),
    ("INIT x { $newtype(struct a, struct b, struct c) }", (1, 10, "'$newtype' takes 1 argument, "
                                                                  "found 3")),
    ("INIT x { $oldsym() }", (1, 18, "empty argument of '$oldsym': expected a variable")),
    ("INIT x { $oldsym(  ) }", (1, 20, "empty argument of '$oldsym': expected a variable")),
    ("INIT x { $xform(struct a, ) }", (1, 27, "empty argument of '$xform': expected a type")),
    ("INIT x { $xform(, struct a) }", (1, 17, "empty argument of '$xform': expected a type")),
    ("INIT x { $oldsym(struct s) }", (1, 18, "expected a variable in '$oldsym(...)', found the "
                                             "type tag 'struct'")),
    ("INIT x { $newsym(a.b) }", (1, 19, "a field is named through its type ('struct a.…', "
                                        "'union a.…' or 'typedef a.…'), not a variable")),
    ("INIT x { $oldsym(a b) }", (1, 20, "unexpected 'b' after 'a' in '$oldsym(...)'")),
    ("INIT x { $oldsym(a@) }", (1, 20, "expected the source file of the static after '@' "
                                       "(e.g. 'counter@stats.c'), found end of file")),
    ("INIT x { $oldtype(foo) }", (1, 19, "expected a type ('struct T', 'union T', 'enum T' or "
                                         "'typedef T') in '$oldtype(...)', found 'foo' (write "
                                         "'typedef foo' for a typedef name)")),
    ("INIT x { $oldtype(int) }", (1, 19, "expected a type ('struct T', 'union T', 'enum T' or "
                                         "'typedef T') in '$oldtype(...)', found the basic type "
                                         "'int': name the typedef or struct that uses it")),
    ("INIT x {\n $xform(struct a,\n    struct s . f) }",
     (3, 5, "expected a type ('struct T', 'union T', 'enum T' or 'typedef T') in "
            "'$xform(...)', found the field 'struct s.f': only a whole type is allowed here")),
    ("INIT x { $oldtype(struct s x) }", (1, 28, "unexpected 'x' after 'struct s' in "
                                                "'$oldtype(...)'")),
    ("INIT x { $oldtype(struct s@a.c) }", (1, 27, "'@FILE' names the source file of a static "
                                                  "variable; types are matched by name")),
    ("INIT x { $oldtype(struct s # c\n) }", (1, 28, "unexpected '#' after 'struct s' in "
                                                    "'$oldtype(...)'")),
    ("INIT x { $oldsym(caf\u00e9) }", (1, 21, "non-ASCII character '\u00e9' (U+00E9) in "
                                              "identifier: identifiers must be ASCII C "
                                              "identifiers")),
    # where $in and $base exist
    ("INIT x { $out = $in; }", (1, 17, "'$in' is not available in an INIT rule: there is no old "
                                       "value")),
    ("INIT struct s { $out.a = $in.a; }", (1, 26, "'$in' is not available in an INIT rule: there "
                                                  "is no old value")),
    ("INIT struct s.f {\n  $out = $in; }", (2, 10, "'$in' is not available in an INIT rule: "
                                                   "there is no old value; '$base' is the old "
                                                   "object that contains the field")),
    ("INIT x { $out = $base; }", (1, 17, "'$base' is only available in field rules "
                                         "('INIT struct s.f' or 'struct s.a -> struct s.b'): it "
                                         "is the old object that contains the field")),
    ("a -> b { $base }", (1, 10, "'$base' is only available in field rules ('INIT struct s.f' or "
                                 "'struct s.a -> struct s.b'): it is the old object that "
                                 "contains the field")),
    ("struct a -> struct b { $base }", (1, 24, "'$base' is only available in field rules "
                                               "('INIT struct s.f' or 'struct s.a -> struct s.b'):"
                                               " it is the old object that contains the field")),
    ("INIT struct s { $base }", (1, 17, "'$base' is only available in field rules ('INIT struct "
                                        "s.f' or 'struct s.a -> struct s.b'): it is the old "
                                        "object that contains the field")),
]


@pytest.mark.parametrize("text,expected", SPECIAL_ERRORS, ids=[repr(t) for t, _ in SPECIAL_ERRORS])
def test_special_errors(text, expected):
    assert err(text) == expected


@pytest.mark.parametrize("text,expected", SPECIAL_ERRORS, ids=[repr(t) for t, _ in SPECIAL_ERRORS])
def test_scan_specials_reports_the_same(text, expected):
    """parse_xf checks the bodies through scan_specials: calling it on the
    same rule (built without the check) gives the same error."""
    src = xf._Src(text, "t.xf")
    rule = xf._Parser(src).rule()
    with pytest.raises(XfError) as ei:
        scan_specials(rule, "t.xf")
    assert (ei.value.line, ei.value.col, ei.value.msg) == expected


def test_error_is_the_first_one():
    text = "a -> b\nc d\ne f\n"
    assert err(text)[:2] == (2, 3)


def test_only_xferror_on_odd_inputs():
    for text in ["\x7f", "\t\v\f", "->->", "@", "INIT INIT", "INIT INIT {}", "struct s. .",
                 "$", "{" * 10000, "(" * 10000, "INIT x {" + "$oldsym(" * 5000 + "}",
                 "INIT x { $oldsym(" + "(" * 5000 + ") }", "/" * 100, "'", "\\", "\r" * 5]:
        try:
            parse_xf(text)
        except XfError:
            pass
