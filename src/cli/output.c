/* The one output module of the CLI: aligned tables and JSON.  A command
 * describes the protocol's records once (cli_view: the JSON members and the
 * table columns of each field), and both forms come from that description;
 * JSON is written only through the writer below. */
#include "cli/cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *cli_field_of(const molt__record *rec, size_t i) {
  return molt__tsv_field(rec, i);
}

static bool is(const molt__record *rec, const char *key) {
  return strcmp(rec->fields[0], key) == 0;
}

size_t cli_count(const molt__records *rs, const char *key) {
  size_t n = 0;
  for (size_t i = 0; i < rs->count; i++)
    n += is(&rs->recs[i], key);
  return n;
}

/* ---- tables ---------------------------------------------------------------- */

/* Columns a string occupies: UTF-8 continuation bytes take none.  (Wide
 * CJK characters are rare in the names shown here; they would merely
 * misalign a row.) */
static size_t display_width(const char *s) {
  size_t w = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    w += (*p & 0xc0) != 0x80;
  return w;
}

void cli_table_add(cli_table *t, const char *const *row) {
  if (t->nrows == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 16;
    t->cells = cli_xrealloc(t->cells, t->cap * t->ncols * sizeof *t->cells);
  }
  for (size_t c = 0; c < t->ncols; c++) {
    char *s = cli_xstrdup(row[c] != NULL ? row[c] : "");
    cli_sanitize(s);
    t->cells[t->nrows * t->ncols + c] = s;
  }
  t->nrows++;
}

void cli_table_init(cli_table *t, size_t ncols, const char *const *header) {
  memset(t, 0, sizeof *t);
  t->ncols = ncols;
  cli_table_add(t, header);
}

void cli_table_print(cli_table *t, const char *indent) {
  size_t *w = cli_xmalloc(t->ncols * sizeof *w);
  for (size_t c = 0; c < t->ncols; c++) {
    w[c] = 0;
    for (size_t r = 0; r < t->nrows; r++) {
      size_t x = display_width(t->cells[r * t->ncols + c]);
      if (x > w[c])
        w[c] = x;
    }
  }
  for (size_t r = 0; r < t->nrows; r++) {
    fputs(indent, stdout);
    for (size_t c = 0; c < t->ncols; c++) {
      const char *s = t->cells[r * t->ncols + c];
      fputs(s, stdout);
      if (c + 1 < t->ncols) /* no trailing blanks after the last column */
        printf("%*s", (int)(w[c] - display_width(s) + 2), "");
    }
    putchar('\n');
  }
  free(w);
  for (size_t i = 0; i < t->nrows * t->ncols; i++)
    free(t->cells[i]);
  free(t->cells);
  memset(t, 0, sizeof *t);
}

/* "1700000000.123456" -> "2023-11-14 22:13:20.123456" in local time. */
static void format_time(const char *s, char *buf, size_t len) {
  char *end;
  errno = 0;
  long long secs = strtoll(s, &end, 10);
  if (end == s || errno != 0 || (*end != '\0' && *end != '.')) {
    snprintf(buf, len, "%s", s);
    return;
  }
  time_t t = (time_t)secs;
  struct tm tm;
  if (localtime_r(&t, &tm) == NULL) {
    snprintf(buf, len, "%s", s);
    return;
  }
  char base[32];
  strftime(base, sizeof base, "%Y-%m-%d %H:%M:%S", &tm);
  snprintf(buf, len, "%s%.7s", base, end); /* ".123456" */
}

void cli_table_records(const molt__records *rs, const cli_view *v, const char *indent) {
  size_t ncols = 0;
  while (v->columns[ncols].header)
    ncols++;
  const char *header[16];
  for (size_t c = 0; c < ncols; c++)
    header[c] = v->columns[c].header;
  cli_table t;
  cli_table_init(&t, ncols, header);
  for (size_t i = 0; i < rs->count; i++) {
    const molt__record *rec = &rs->recs[i];
    if (!is(rec, v->key))
      continue;
    const char *row[16];
    char times[16][64];
    for (size_t c = 0; c < ncols; c++) {
      const char *f = cli_field_of(rec, (size_t)v->columns[c].index);
      switch (v->columns[c].show) {
      case CLI_YESNO:
        f = strcmp(f, "1") == 0 ? "yes" : "no";
        break;
      case CLI_TIME:
        format_time(f, times[c], sizeof times[c]);
        f = times[c];
        break;
      case CLI_AS_IS:
        break;
      }
      row[c] = f;
    }
    cli_table_add(&t, row);
  }
  cli_table_print(&t, indent);
}

/* ---- JSON --------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at p (1..4), or 0 if invalid
 * (overlong forms, surrogates and code points past U+10FFFF included). */
static int utf8_len(const unsigned char *p) {
  unsigned c = p[0];
  if (c < 0x80)
    return 1;
  int n;
  unsigned min, cp;
  if ((c & 0xe0) == 0xc0)
    n = 2, min = 0x80, cp = c & 0x1f;
  else if ((c & 0xf0) == 0xe0)
    n = 3, min = 0x800, cp = c & 0x0f;
  else if ((c & 0xf8) == 0xf0)
    n = 4, min = 0x10000, cp = c & 0x07;
  else
    return 0;
  for (int i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80)
      return 0; /* also stops at the terminating NUL */
    cp = cp << 6 | (p[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

/* True if s is a JSON number we are willing to pass through verbatim:
 * -?(0|[1-9][0-9]*)(\.[0-9]+)?  */
bool cli_is_number(const char *s) {
  if (*s == '-')
    s++;
  if (*s == '0')
    s++;
  else if (*s >= '1' && *s <= '9')
    while (isdigit((unsigned char)*s))
      s++;
  else
    return false;
  if (*s == '.') {
    s++;
    if (!isdigit((unsigned char)*s))
      return false;
    while (isdigit((unsigned char)*s))
      s++;
  }
  return *s == '\0';
}

/* Before a member or an element of the innermost container: its separator,
 * and a line of its own unless the container is compact.  A value after a
 * key is not a new member. */
static void separate(cli_json *j) {
  if (j->after_key) {
    j->after_key = false;
    return;
  }
  if (j->depth == 0)
    return;
  int d = j->depth - 1;
  if (j->compact[d]) {
    if (!j->empty[d])
      fputs(", ", stdout);
  } else {
    fputs(j->empty[d] ? "\n" : ",\n", stdout);
    printf("%*s", 2 * j->depth, "");
  }
  j->empty[d] = false;
}

static void open_container(cli_json *j, char open, char close, bool compact) {
  separate(j);
  putchar(open);
  j->close[j->depth] = close;
  /* Inside a compact container everything is compact. */
  j->compact[j->depth] = compact || (j->depth > 0 && j->compact[j->depth - 1]);
  j->empty[j->depth] = true;
  j->depth++;
}

void cli_json_object(cli_json *j, bool compact) { open_container(j, '{', '}', compact); }
void cli_json_array(cli_json *j, bool compact) { open_container(j, '[', ']', compact); }

void cli_json_end(cli_json *j) {
  int d = --j->depth;
  if (!j->empty[d] && !j->compact[d]) {
    putchar('\n');
    printf("%*s", 2 * d, "");
  }
  putchar(j->close[d]);
}

static void write_string(const char *s) {
  putchar('"');
  const unsigned char *p = (const unsigned char *)s;
  while (*p != '\0') {
    unsigned c = *p;
    if (c == '"' || c == '\\') {
      printf("\\%c", c);
      p++;
    } else if (c == '\n') {
      fputs("\\n", stdout);
      p++;
    } else if (c == '\t') {
      fputs("\\t", stdout);
      p++;
    } else if (c < 0x20 || c == 0x7f) {
      printf("\\u%04x", c);
      p++;
    } else {
      int n = utf8_len(p);
      if (n == 0) { /* file names may be anything: U+FFFD */
        fputs("\xef\xbf\xbd", stdout);
        p++;
      } else {
        fwrite(p, 1, (size_t)n, stdout);
        p += n;
      }
    }
  }
  putchar('"');
}

void cli_json_key(cli_json *j, const char *key) {
  separate(j);
  write_string(key);
  fputs(": ", stdout);
  j->after_key = true;
}

void cli_json_str(cli_json *j, const char *s) {
  separate(j);
  write_string(s);
}

void cli_json_num(cli_json *j, const char *s) {
  separate(j);
  /* A number field from the protocol, or null if it is not one: the JSON
   * schema stays stable even if a peer sends garbage. */
  fputs(cli_is_number(s) ? s : "null", stdout);
}

void cli_json_bool(cli_json *j, bool b) {
  separate(j);
  fputs(b ? "true" : "false", stdout);
}

void cli_json_null(cli_json *j) {
  separate(j);
  fputs("null", stdout);
}

void cli_json_field(cli_json *j, const molt__record *rec, const cli_field *f) {
  const char *v = cli_field_of(rec, (size_t)f->index);
  if (f->type == CLI_VIEW) { /* "global" or "generation N" */
    bool global = strcmp(v, "global") == 0;
    cli_json_key(j, "view");
    cli_json_str(j, global ? "global" : "local");
    cli_json_key(j, "generation");
    if (!global && strncmp(v, "generation ", 11) == 0)
      cli_json_num(j, v + 11);
    else
      cli_json_null(j);
    return;
  }
  cli_json_key(j, f->json);
  switch (f->type) {
  case CLI_NUM:
    cli_json_num(j, v);
    break;
  case CLI_BOOL:
    cli_json_bool(j, strcmp(v, "1") == 0);
    break;
  case CLI_OPT:
    if (v[0] == '\0')
      cli_json_null(j);
    else
      cli_json_str(j, v);
    break;
  case CLI_PATCH:
    if (v[0] == '\0' || strcmp(v, "-") == 0)
      cli_json_null(j);
    else
      cli_json_str(j, v);
    break;
  default:
    cli_json_str(j, v);
  }
}

void cli_json_records(cli_json *j, const molt__records *rs, const cli_view *v) {
  if (v->json)
    cli_json_key(j, v->json);
  cli_json_array(j, false);
  for (size_t i = 0; i < rs->count; i++) {
    const molt__record *rec = &rs->recs[i];
    if (!is(rec, v->key))
      continue;
    cli_json_object(j, true);
    for (const cli_field *f = v->fields; f->json; f++)
      cli_json_field(j, rec, f);
    cli_json_end(j);
  }
  cli_json_end(j);
}

void cli_json_done(cli_json *j) {
  (void)j;
  putchar('\n');
}
