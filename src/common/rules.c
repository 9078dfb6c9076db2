/* The rule language of shadowed updates (common.h; docs/design.md §17 has
 * the grammar and what each action does).  One rule a line:
 *
 *   forward recv socket "INCR *" rewrite "NOSUCH\n"   # a comment
 *
 * A hand-written scanner and parser over the text as bytes: no allocation,
 * no recursion, every bound checked, so that the runtime can run it on a
 * client's text inside its host.  The first error is reported as
 * name:line:col (both from 1, columns in bytes) and parsing stops. */
#include "common/common.h"

#include <stdio.h>
#include <string.h>

_Static_assert(sizeof(((molt__request *)0)->rules) == MOLT__RULES_MAX_TEXT,
               "a request carries a whole rule file");

/* ---- names ---------------------------------------------------------------*/

static const char *const call_names[] = {"any",
#define MOLT__SC_NAME(NAME, name, buffer) #name,
                                         MOLT__SHADOW_CALLS(MOLT__SC_NAME)
#undef MOLT__SC_NAME
};

static const int call_buffers[] = {0,
#define MOLT__SC_BUF(NAME, name, buffer) buffer,
                                   MOLT__SHADOW_CALLS(MOLT__SC_BUF)
#undef MOLT__SC_BUF
};

const char *molt__sc_name(unsigned kind) {
  return kind < MOLT__SC_END ? call_names[kind] : "?";
}

int molt__sc_buffer(unsigned kind) {
  return kind < MOLT__SC_END ? call_buffers[kind] : 0;
}

/* The names of the call kinds whose buffer is `buffer` (-1: every kind,
 * 3: an input's or an output's), "a, b or c", with `last` after them if
 * given ("any"); the lists in messages follow the table (MOLT__SHADOW_CALLS). */
static void call_list(char *out, size_t len, int buffer, const char *last) {
  const char *names[MOLT__SC_END + 1];
  size_t n = 0, w = 0;
  for (unsigned k = MOLT__SC_SKIP + 1; k < MOLT__SC_END; k++) {
    int b = molt__sc_buffer(k);
    if (buffer < 0 || b == buffer || (buffer == 3 && b != 0))
      names[n++] = molt__sc_name(k);
  }
  if (last)
    names[n++] = last;
  out[0] = '\0';
  for (size_t i = 0; i < n && w < len; i++)
    w += (size_t)snprintf(out + w, len - w, "%s%s",
                          i == 0       ? ""
                          : i + 1 == n ? " or "
                                       : ", ",
                          names[i]);
}

static const char *const fd_kind_names[] = {"any", "socket", "file", "pipe"};

const char *molt__fd_kind_name(unsigned k) {
  return k <= MOLT__FDK_PIPE ? fd_kind_names[k] : "?";
}

static const char *const action_names[] = {"tolerate", "drop", "insert", "rewrite"};

/* ---- the scanner -----------------------------------------------------------*/

typedef enum { TOK_END, TOK_WORD, TOK_STRING } tok_kind;

typedef struct scan {
  const char *name;
  const char *p, *end;
  unsigned line, col; /* of p */
  char *err;
  size_t errlen;
  bool failed;
} scan;

typedef struct tok {
  tok_kind kind;
  unsigned line, col;
  char word[16]; /* TOK_WORD, NUL-terminated (longer words are refused) */
  /* TOK_STRING: its bytes, and for each whether it is a wildcard. */
  uint16_t elems[MOLT__RULE_MAX_BYTES];
  uint16_t n;
} tok;

static bool fail_at(scan *s, unsigned line, unsigned col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool fail_at(scan *s, unsigned line, unsigned col, const char *fmt, ...) {
  if (s->failed)
    return false;
  s->failed = true;
  char what[512]; /* the longest: a list of every call kind */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  molt__errmsg(s->err, s->errlen, "%.200s:%u:%u: %s", s->name, line, col, what);
  return false;
}

static void advance(scan *s) {
  s->p++;
  s->col++;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* A quoted string from s->p (at its '"'): its elements into t. */
static bool scan_string(scan *s, tok *t) {
  advance(s);
  t->n = 0;
  for (;;) {
    if (s->p == s->end || *s->p == '\n')
      return fail_at(s, t->line, t->col, "string not closed before the end of the line");
    unsigned line = s->line, col = s->col;
    unsigned char c = (unsigned char)*s->p;
    uint16_t e;
    if (c == '"') {
      advance(s);
      return true;
    }
    if (c == '\0')
      return fail_at(s, line, col, "NUL byte in a string (write \\x00)");
    if (c == '\\') {
      advance(s);
      if (s->p == s->end || *s->p == '\n')
        return fail_at(s, line, col, "backslash at the end of the line");
      char x = *s->p;
      switch (x) {
      case 'n':
        e = '\n';
        break;
      case 'r':
        e = '\r';
        break;
      case 't':
        e = '\t';
        break;
      case '0':
        e = 0;
        break;
      case '\\':
      case '"':
      case '*':
      case '?':
        e = (unsigned char)x;
        break;
      case 'x': {
        int hi = s->end - s->p > 2 ? hexval(s->p[1]) : -1;
        int lo = hi >= 0 ? hexval(s->p[2]) : -1;
        if (lo < 0)
          return fail_at(s, line, col, "\\x needs two hex digits");
        e = (uint16_t)(hi * 16 + lo);
        advance(s);
        advance(s);
        break;
      }
      default:
        return fail_at(s, line, col,
                       "unknown escape '\\%c' (use \\n \\r \\t \\0 \\\\ \\\" \\* \\? "
                       "\\xHH)",
                       x >= 0x20 && x < 0x7f ? x : '?');
      }
    } else if (c == '*') {
      e = MOLT__PAT_STAR;
    } else if (c == '?') {
      e = MOLT__PAT_ONE;
    } else {
      e = c;
    }
    advance(s);
    if (t->n == MOLT__RULE_MAX_BYTES)
      return fail_at(s, t->line, t->col, "string longer than %d bytes",
                     MOLT__RULE_MAX_BYTES);
    t->elems[t->n++] = e;
  }
}

/* The next token of the current line (TOK_END at its end or at '#'). */
static bool next(scan *s, tok *t) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\r'))
    advance(s);
  t->line = s->line;
  t->col = s->col;
  if (s->p == s->end || *s->p == '\n' || *s->p == '#') {
    t->kind = TOK_END;
    return true;
  }
  char c = *s->p;
  if (c == '"') {
    t->kind = TOK_STRING;
    return scan_string(s, t);
  }
  if ((c >= 'a' && c <= 'z') || c == '_' || (c >= '0' && c <= '9')) {
    size_t n = 0;
    while (s->p < s->end && ((*s->p >= 'a' && *s->p <= 'z') || *s->p == '_' ||
                             (*s->p >= '0' && *s->p <= '9'))) {
      if (n + 1 < sizeof t->word)
        t->word[n] = *s->p;
      n++;
      advance(s);
    }
    if (n + 1 > sizeof t->word)
      return fail_at(s, t->line, t->col, "word longer than %zu letters",
                     sizeof t->word - 1);
    t->word[n] = '\0';
    t->kind = TOK_WORD;
    return true;
  }
  if (c == '\0')
    return fail_at(s, t->line, t->col, "NUL byte in the rule file");
  if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7f)
    return fail_at(s, t->line, t->col, "unexpected '%c'", c);
  return fail_at(s, t->line, t->col, "unexpected byte 0x%02x", (unsigned char)c);
}

/* Skips to the start of the next line. */
static void next_line(scan *s) {
  while (s->p < s->end && *s->p != '\n')
    s->p++;
  if (s->p < s->end)
    s->p++;
  s->line++;
  s->col = 1;
}

static int find(const char *const *names, size_t n, const char *w) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(names[i], w) == 0)
      return (int)i;
  return -1;
}

#define NAMES(a) (a), sizeof(a) / sizeof((a)[0])

/* ---- the parser --------------------------------------------------------------*/

/* One rule from the line's first token t (a word).  false: s failed. */
static bool parse_rule(scan *s, tok *t, molt__rule *r) {
  memset(r, 0, sizeof *r);
  r->line = (uint16_t)t->line;
  if (strcmp(t->word, "forward") == 0)
    r->dir = MOLT__RULE_FORWARD;
  else if (strcmp(t->word, "reverse") == 0)
    r->dir = MOLT__RULE_REVERSE;
  else
    return fail_at(s, t->line, t->col,
                   "a rule starts with 'forward' or 'reverse', not '%s'", t->word);

  if (!next(s, t))
    return false;
  char list[512];
  if (t->kind != TOK_WORD) {
    call_list(list, sizeof list, -1, "any");
    return fail_at(s, t->line, t->col, "expected a call (%s)", list);
  }
  int call = find(NAMES(call_names), t->word);
  if (call < 0) {
    call_list(list, sizeof list, -1, "any");
    return fail_at(s, t->line, t->col, "unknown call '%s' (%s)", t->word, list);
  }
  r->call = (uint8_t)call;
  unsigned call_line = t->line, call_col = t->col;

  if (!next(s, t))
    return false;
  int fdk = t->kind == TOK_WORD ? find(NAMES(fd_kind_names), t->word) : -1;
  if (fdk >= 0) {
    r->fd_kind = (uint8_t)fdk;
    if (!next(s, t))
      return false;
  }

  if (t->kind == TOK_STRING) {
    if (!molt__sc_buffer(r->call)) {
      call_list(list, sizeof list, 3, NULL);
      return fail_at(s, t->line, t->col,
                     "%s has no buffer to match a pattern against (only %s have)",
                     molt__sc_name(r->call), list);
    }
    r->has_pattern = true;
    r->pat_len = t->n;
    memcpy(r->pat, t->elems, t->n * sizeof t->elems[0]);
    if (!next(s, t))
      return false;
  }

  if (t->kind != TOK_WORD)
    return fail_at(
        s, t->line, t->col,
        t->kind == TOK_END
            ? "missing action (tolerate, drop, insert or rewrite \"TEXT\")"
            : "expected an action (tolerate, drop, insert or rewrite \"TEXT\")");
  int action = find(NAMES(action_names), t->word);
  if (action < 0)
    return fail_at(s, t->line, t->col,
                   "unknown %s '%s' (tolerate, drop, insert or rewrite \"TEXT\")",
                   fdk < 0 && !r->has_pattern ? "descriptor kind or action" : "action",
                   t->word);
  r->action = (uint8_t)action;
  if (r->action == MOLT__RULE_REWRITE && !molt__sc_buffer(r->call)) {
    call_list(list, sizeof list, 3, NULL);
    return fail_at(s, call_line, call_col,
                   "rewrite needs a call with a buffer (%s), not %s", list,
                   molt__sc_name(r->call));
  }
  if (r->action == MOLT__RULE_DROP && molt__sc_buffer(r->call) != 2 &&
      r->call != MOLT__SC_CLOSE) {
    call_list(list, sizeof list, 2, "close");
    return fail_at(s, call_line, call_col,
                   "drop applies to calls the follower can skip (%s), not %s", list,
                   molt__sc_name(r->call));
  }

  if (!next(s, t))
    return false;
  if (r->action == MOLT__RULE_REWRITE) {
    if (t->kind != TOK_STRING)
      return fail_at(s, t->line, t->col,
                     "rewrite needs the replacement: rewrite \"TEXT\"");
    for (uint16_t i = 0; i < t->n; i++) {
      if (t->elems[i] > 255)
        return fail_at(s, t->line, t->col,
                       "a replacement has no wildcards (write \\* or \\? for the "
                       "characters)");
      r->text[i] = (char)t->elems[i];
    }
    r->text_len = t->n;
    if (!next(s, t))
      return false;
  }
  if (t->kind != TOK_END)
    return fail_at(s, t->line, t->col, "unexpected %s after the action",
                   t->kind == TOK_STRING ? "string" : "word");
  return true;
}

int molt__rules_parse(const char *name, const char *text, size_t len, molt__rules *out,
                      char *err, size_t errlen) {
  out->n = 0;
  if (len > MOLT__RULES_MAX_TEXT) {
    molt__errmsg(err, errlen, "%.200s: the rule file has %zu bytes; at most %d", name,
                 len, MOLT__RULES_MAX_TEXT);
    return MOLT_EINVAL;
  }
  scan s = {name, text, text + len, 1, 1, err, errlen, false};
  tok t; /* ~540 bytes: fine on any stack that runs this */
  while (s.p < s.end) {
    if (!next(&s, &t))
      return MOLT_EINVAL;
    if (t.kind == TOK_STRING) {
      fail_at(&s, t.line, t.col,
              "a rule starts with 'forward' or 'reverse', not a string");
      return MOLT_EINVAL;
    }
    if (t.kind == TOK_WORD) {
      if (out->n == MOLT__RULES_MAX) {
        fail_at(&s, t.line, t.col, "more than %d rules", MOLT__RULES_MAX);
        return MOLT_EINVAL;
      }
      if (!parse_rule(&s, &t, &out->r[out->n]))
        return MOLT_EINVAL;
      out->n++;
    }
    next_line(&s);
  }
  return 0;
}

/* ---- patterns ------------------------------------------------------------------*/

bool molt__rule_matches(const molt__rule *r, const void *buf, size_t n) {
  if (!r->has_pattern)
    return true;
  const unsigned char *b = buf;
  const uint16_t *p = r->pat;
  size_t np = r->pat_len, i = 0, j = 0;
  /* Greedy with one backtrack point: the last star and where its run
   * began; linear in n for each star, no recursion. */
  size_t star = (size_t)-1, mark = 0;
  while (i < n) {
    if (j < np && p[j] == MOLT__PAT_STAR) {
      star = j++;
      mark = i;
    } else if (j < np && (p[j] == MOLT__PAT_ONE || p[j] == b[i])) {
      i++;
      j++;
    } else if (star != (size_t)-1) {
      j = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (j < np && p[j] == MOLT__PAT_STAR)
    j++;
  return j == np;
}
