/*
 * molt — the command-line client of the molt control protocol.
 *
 *   molt ps | status | apply | rollback | update | run | log | help | --version
 *
 * The CLI is a thin client: it turns a command line into one request on
 * the target's abstract socket "\0molt.<pid>" (docs/protocol.md), waits for
 * the response and presents it as an aligned table or as JSON.  Every
 * failure is ONE line on stderr of the form
 *     molt: <what failed>: <why>; <what to do>
 * and an exit code from the table below (also in `molt help` and molt(1)).
 * Whatever the outcome, the target keeps running: the CLI only talks.
 */
#include "common/common.h" /* first: it keeps molt.h's runtime constructor out */

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum {
  EXIT_OK = 0,
  EXIT_FAILED = 1,  /* the target refused or failed; it runs unchanged */
  EXIT_USAGE = 2,   /* bad command line, missing local file */
  EXIT_CONNECT = 3, /* no such molt process, cannot connect, not permitted */
  EXIT_PROTO = 4    /* malformed or incompatible protocol messages */
};

#define DEFAULT_TIMEOUT_MS 10000
#define CLIENT_SLACK_MS 5000 /* client waits request timeout + this */
#define PS_TIMEOUT_MS 3000

static const char usage_text[] =
    "usage: molt <command> [arguments]\n"
    "\n"
    "commands:\n"
    "  molt ps                          list molt processes: PID USER COMMAND\n"
    "                                   GENERATION STATE\n"
    "  molt status <pid> [--json]       generation, patches, functions, threads\n"
    "  molt apply <pid> <patch.so> [--policy immediate|local|global]\n"
    "             [--timeout SEC]       apply a hot patch (default: immediate,\n"
    "                                   10 s)\n"
    "  molt rollback <pid> [--policy P] [--timeout SEC]\n"
    "                                   return to the previous generation\n"
    "  molt run <image.so> [args...]    run a program image (built with\n"
    "                                   'moltcc --molt-program') in this process\n"
    "  molt update <pid> <image.so> [--timeout SEC] [--check-interior]\n"
    "                                   full update: replace the running program\n"
    "                                   image, migrate its state and restart its\n"
    "                                   threads in the new version (default 10 s)\n"
    "  molt log <pid> [--json]          the process's update log\n"
    "  molt help                        this text\n"
    "  molt --version                   version of molt and of its protocol\n"
    "\n"
    "exit status:\n"
    "  0  success\n"
    "  1  the process refused or failed the operation (it keeps running\n"
    "     unchanged)\n"
    "  2  usage error (bad arguments, patch or image file not found)\n"
    "  3  no such molt process, cannot connect, not permitted, or no answer\n"
    "     in time\n"
    "  4  protocol error (malformed or incompatible messages)\n"
    "\n"
    "Only the process's owner and root may control it.  See molt(1).\n";

/* ---- output helpers ---------------------------------------------------- */

/* Replaces control characters by '?' so text that came from the target (or
 * from a file name) cannot move the cursor or fake lines on a terminal. */
static void sanitize(char *s) {
  for (unsigned char *p = (unsigned char *)s; *p != '\0'; p++)
    if (*p < 0x20 || *p == 0x7f)
      *p = '?';
}

/* Prints "molt: <formatted>" as one sanitized line; returns code. */
__attribute__((format(printf, 2, 3))) static int fail(int code,
                                                      const char *fmt, ...) {
  char line[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  sanitize(line);
  fprintf(stderr, "molt: %s\n", line);
  return code;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL) {
    fail(EXIT_FAILED, "out of memory; free some memory and retry");
    exit(EXIT_FAILED);
  }
  return p;
}

static void *xrealloc(void *p, size_t n) {
  p = realloc(p, n ? n : 1);
  if (p == NULL) {
    fail(EXIT_FAILED, "out of memory; free some memory and retry");
    exit(EXIT_FAILED);
  }
  return p;
}

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(xmalloc(n), s, n);
}

/* Columns a string occupies: UTF-8 continuation bytes take none.  (Wide
 * CJK characters are rare in the names shown here; they would merely
 * misalign a row.) */
static size_t display_width(const char *s) {
  size_t w = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    w += (*p & 0xc0) != 0x80;
  return w;
}

/* An aligned table: the first row is the header.  Cells are copied and
 * sanitized when added. */
typedef struct table {
  size_t ncols, nrows, cap;
  char **cells;
} table;

static void table_add(table *t, const char *const *row) {
  if (t->nrows == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 16;
    t->cells = xrealloc(t->cells, t->cap * t->ncols * sizeof *t->cells);
  }
  for (size_t c = 0; c < t->ncols; c++) {
    char *s = xstrdup(row[c] != NULL ? row[c] : "");
    sanitize(s);
    t->cells[t->nrows * t->ncols + c] = s;
  }
  t->nrows++;
}

static void table_init(table *t, size_t ncols, const char *const *header) {
  memset(t, 0, sizeof *t);
  t->ncols = ncols;
  table_add(t, header);
}

static void table_print(table *t, const char *indent) {
  size_t *w = xmalloc(t->ncols * sizeof *w);
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

/* ---- JSON ---------------------------------------------------------------- */

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

/* A JSON string.  Output is always valid UTF-8: bytes that are not (file
 * names may be anything) become U+FFFD. */
static void json_str(const char *s) {
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
      if (n == 0) {
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

/* True if s is a JSON number we are willing to pass through verbatim:
 * -?(0|[1-9][0-9]*)(\.[0-9]+)?  */
static bool is_json_number(const char *s) {
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

/* A number field from the protocol, or null if it is not one: the JSON
 * schema stays stable even if a peer sends garbage. */
static void json_num(const char *s) {
  if (is_json_number(s))
    fputs(s, stdout);
  else
    fputs("null", stdout);
}

static void json_key(const char *k) {
  json_str(k);
  fputs(": ", stdout);
}

/* ---- command-line parsing -------------------------------------------- */

typedef struct opts {
  const char *cmd;
  const char *pos[3];
  int npos;
  bool json;
  const char *policy; /* NULL: not given */
  int timeout_ms;     /* -1: not given */
  bool check_interior;
} opts;

static bool parse_pid(const char *s, pid_t *out) {
  if (*s < '1' || *s > '9')
    return false;
  long v = 0;
  for (; *s; s++) {
    if (!isdigit((unsigned char)*s))
      return false;
    v = v * 10 + (*s - '0');
    if (v > INT_MAX) /* pid_t is int on Linux */
      return false;
  }
  *out = (pid_t)v;
  return true;
}

/* SEC as a positive decimal number of seconds (fractions allowed), at most
 * one day; returns milliseconds rounded up, or -1. */
static int parse_timeout(const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || errno != 0 || !isfinite(v) || v <= 0 ||
      v > 86400)
    return -1;
  double ms = v * 1000.0;
  int r = (int)ms; /* round up by hand: no libm for one ceil() */
  return r < ms ? r + 1 : r;
}

static bool valid_policy(const char *p) {
  return strcmp(p, "immediate") == 0 || strcmp(p, "local") == 0 ||
         strcmp(p, "global") == 0;
}

/* Parses the words after the command.  Options may come anywhere; "--"
 * ends them.  Returns 0 or EXIT_USAGE (having printed why). */
static int parse_args(int argc, char **argv, opts *o) {
  bool more_opts = true;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (more_opts && strcmp(a, "--") == 0) {
      more_opts = false;
      continue;
    }
    if (more_opts && a[0] == '-' && a[1] != '\0') {
      const char *val = NULL;
      size_t klen = strcspn(a, "=");
      bool want_val = strncmp(a, "--policy", klen) == 0 && klen == 8;
      want_val |= strncmp(a, "--timeout", klen) == 0 && klen == 9;
      if (want_val) {
        if (a[klen] == '=')
          val = a + klen + 1;
        else if (i + 1 < argc)
          val = argv[++i];
        else
          return fail(EXIT_USAGE, "%s: option %s needs a value; see 'molt help'",
                      o->cmd, a);
      }
      if (strcmp(a, "--json") == 0) {
        o->json = true;
      } else if (strcmp(a, "--check-interior") == 0) {
        o->check_interior = true;
      } else if (klen == 8 && strncmp(a, "--policy", 8) == 0) {
        if (!valid_policy(val))
          return fail(EXIT_USAGE,
                      "%s: unknown policy '%s'; use immediate, local or global",
                      o->cmd, val);
        o->policy = val;
      } else if (klen == 9 && strncmp(a, "--timeout", 9) == 0) {
        o->timeout_ms = parse_timeout(val);
        if (o->timeout_ms < 0)
          return fail(EXIT_USAGE,
                      "%s: invalid timeout '%s'; give a number of seconds "
                      "greater than 0 and at most 86400",
                      o->cmd, val);
      } else {
        return fail(EXIT_USAGE, "%s: unknown option '%s'; see 'molt help'",
                    o->cmd, a);
      }
      continue;
    }
    if (o->npos == 3)
      return fail(EXIT_USAGE, "%s: unexpected argument '%s'; see 'molt help'",
                  o->cmd, a);
    o->pos[o->npos++] = a;
  }
  return 0;
}

/* ---- talking to a process ---------------------------------------------- */

typedef struct reply {
  int status;          /* the response status: 0 or MOLT_E* */
  char *payload;
  molt__records recs;
} reply;

static void reply_free(reply *r) {
  free(r->payload);
  molt__tsv_free(&r->recs);
  memset(r, 0, sizeof *r);
}

/*
 * Sends one request to pid and waits up to timeout_ms for the response.
 * Returns 0 with *r filled (r->status tells whether the target succeeded)
 * or, without printing anything:
 *   MOLT_ENOTMOLT  nobody listens on molt.<pid>
 *   MOLT_ECONNECT  cannot connect, impostor, connection closed
 *   MOLT_ETIMEDOUT no (complete) answer in time
 *   MOLT_EPROTO / MOLT_EVERSION  malformed or incompatible response
 *   MOLT_ENOMEM
 * with a one-line reason in err.
 */
static int call(pid_t pid, unsigned op, const molt__buf *body, int timeout_ms,
                reply *r, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  uint64_t deadline = molt__proto_deadline(timeout_ms);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    molt__errmsg(err, errlen, "cannot create a socket: %s", strerror(errno));
    return MOLT_ECONNECT;
  }
  /* connect() on a Unix socket blocks only while the listener's backlog is
   * full; SO_SNDTIMEO bounds that wait (Linux honours it for connect). */
  struct timeval tv = {.tv_sec = timeout_ms / 1000,
                       .tv_usec = (timeout_ms % 1000) * 1000};
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_un sa;
  socklen_t salen = molt__proto_sockaddr(pid, &sa);
  if (connect(fd, (struct sockaddr *)&sa, salen) < 0) {
    int e = errno;
    close(fd);
    if (e == ECONNREFUSED || e == ENOENT) {
      molt__errmsg(err, errlen, "nothing listens on socket molt.%ld",
                   (long)pid);
      return MOLT_ENOTMOLT;
    }
    if (e == EAGAIN || e == EWOULDBLOCK || e == EINPROGRESS) {
      molt__errmsg(err, errlen,
                   "the process does not accept control connections (its "
                   "queue is full)");
      return MOLT_ETIMEDOUT;
    }
    molt__errmsg(err, errlen, "cannot connect to socket molt.%ld: %s",
                 (long)pid, strerror(e));
    return MOLT_ECONNECT;
  }

  /* Anyone can bind an abstract name, so the name proves nothing: the
   * kernel's record of who listens does. */
  struct ucred cred;
  socklen_t clen = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 ||
      clen != sizeof cred) {
    close(fd);
    molt__errmsg(err, errlen,
                 "cannot verify who serves socket molt.%ld: %s", (long)pid,
                 strerror(errno));
    return MOLT_ECONNECT;
  }
  if (cred.pid != pid) {
    close(fd);
    molt__errmsg(err, errlen,
                 "refusing to talk to pid %ld: socket molt.%ld is served by "
                 "pid %ld",
                 (long)pid, (long)pid, (long)cred.pid);
    return MOLT_ECONNECT;
  }

  molt__frame_hdr h = {.magic = MOLT__PROTO_MAGIC,
                       .version = MOLT__PROTO_VERSION,
                       .kind = (uint16_t)op,
                       .status = 0,
                       .length = body != NULL ? (uint32_t)body->len : 0};
  int send_rc = molt__proto_send(fd, &h, body != NULL ? body->data : NULL,
                                 deadline);
  int send_errno = errno;
  /* Even if sending failed, the process may have answered before closing
   * (a refusal, say): read whatever it said. */
  char why[512] = "";
  int rc = molt__proto_recv(fd, MOLT__FRAME_RESPONSE, &h, &r->payload,
                            deadline, why, sizeof why);
  close(fd);
  if (rc == MOLT_ECONNECT || (rc != 0 && send_rc == MOLT_EIO)) {
    if (send_rc == MOLT_EIO)
      molt__errmsg(err, errlen, "sending the request failed: %s",
                   strerror(send_errno));
    else
      molt__errmsg(err, errlen,
                   "the process closed the connection without answering");
    return MOLT_ECONNECT;
  }
  if (rc == MOLT_ETIMEDOUT) {
    molt__errmsg(err, errlen, "no answer within %d.%03d s", timeout_ms / 1000,
                 timeout_ms % 1000);
    return rc;
  }
  if (rc == MOLT_EIO) {
    molt__errmsg(err, errlen, "%s", why);
    return MOLT_ECONNECT;
  }
  if (rc != 0) {
    molt__errmsg(err, errlen, "malformed response: %s", why);
    return rc;
  }
  rc = molt__tsv_parse(r->payload, h.length, MOLT__PROTO_MAX_RESPONSE_RECORDS,
                       &r->recs, why, sizeof why);
  if (rc != 0) {
    molt__errmsg(err, errlen, "malformed response: %s", why);
    free(r->payload);
    r->payload = NULL;
    return rc;
  }
  r->status = h.status;
  return 0;
}

static int exit_code_of_call_error(int rc) {
  switch (rc) {
  case MOLT_EPROTO:
  case MOLT_EVERSION:
    return EXIT_PROTO;
  case MOLT_ENOMEM:
    return EXIT_FAILED;
  default:
    return EXIT_CONNECT;
  }
}

static int exit_code_of_status(int status) {
  switch (status) {
  case 0:
    return EXIT_OK;
  case MOLT_EPERM:
    return EXIT_CONNECT;
  case MOLT_EPROTO:
  case MOLT_EVERSION:
    return EXIT_PROTO;
  default:
    return EXIT_FAILED;
  }
}

static void read_comm(pid_t pid, char *buf, size_t len) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/comm", (long)pid);
  snprintf(buf, len, "?");
  FILE *f = fopen(path, "re");
  if (f == NULL)
    return;
  if (fgets(buf, (int)len, f) != NULL)
    buf[strcspn(buf, "\n")] = '\0';
  fclose(f);
}

/* Reports a failed call() as one line; returns the exit code. */
static int report_call_error(const char *what, pid_t pid, int rc,
                             const char *err) {
  if (rc == MOLT_ENOTMOLT) {
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%ld", (long)pid);
    if (stat(path, &st) < 0 && errno == ENOENT)
      return fail(EXIT_CONNECT,
                  "%s: no such process %ld; check the pid with 'molt ps'",
                  what, (long)pid);
    char comm[64];
    read_comm(pid, comm, sizeof comm);
    return fail(EXIT_CONNECT,
                "%s: process %ld (%s) is not a molt process or has no control "
                "channel; only programs linked with libmolt (built with "
                "moltcc) can be controlled, and only from their network "
                "namespace: 'molt ps' lists them",
                what, (long)pid, comm);
  }
  const char *todo;
  switch (rc) {
  case MOLT_ETIMEDOUT:
    todo = "the process may be busy or stuck; the operation may or may not "
           "have taken effect, check with 'molt status'";
    break;
  case MOLT_EPROTO:
  case MOLT_EVERSION:
    todo = "use a molt CLI from the same molt release as the process's "
           "libmolt";
    break;
  case MOLT_ECONNECT:
    if (strstr(err, "refusing to talk") != NULL) {
      todo = "another process took the name of the socket; find it with "
             "'ss -xlp' and stop it";
      break;
    }
    todo = "check that the process is still running with 'molt ps'";
    break;
  default:
    todo = "retry";
  }
  return fail(exit_code_of_call_error(rc), "%s: %s; %s", what, err, todo);
}

/* What to do about an error reported by the target. */
static const char *advice(int status) {
  switch (status) {
  case MOLT_EINVAL: return "check the command line with 'molt help'";
  case MOLT_ENOMEM: return "the process is short of memory; retry later";
  case MOLT_ENOENT:
    return "check that the patch file exists and the process can read it";
  case MOLT_EPERM: return "run molt as the process's owner or as root";
  case MOLT_EUNSAFE:
    return "make the patch owned by the process owner or root and not "
           "writable by others (chown, chmod go-w)";
  case MOLT_ENOTPATCH: return "build patches with 'moltcc --molt-patch'";
  case MOLT_ECORRUPT: return "rebuild the patch";
  case MOLT_EBUILDID:
    return "rebuild it with --molt-target pointing at the running binary";
  case MOLT_EABI:
    return "rebuild the patch with the moltcc of the process's molt release";
  case MOLT_ENOSYM:
  case MOLT_EAMBIGUOUS:
    return "rebuild the patch from the sources of the running program";
  case MOLT_ENOFUNC:
    return "only functions built as updatable can be patched; make it "
           "updatable and restart the program once";
  case MOLT_EDLOPEN: return "check the patch's dependencies with ldd";
  case MOLT_EBUSY:
    return "wait until old calls return ('molt status' shows them) and retry";
  case MOLT_ENOHISTORY: return "no patch is applied, nothing to undo";
  case MOLT_ETIMEDOUT:
    return "retry with a longer --timeout or another --policy; 'molt status' "
           "shows which threads are busy";
  case MOLT_EREFUSING:
    return "see 'molt status' and 'molt log'; restart the process when "
           "convenient";
  case MOLT_EPROTO:
  case MOLT_EVERSION:
    return "use a molt CLI from the same molt release as the process's "
           "libmolt";
  case MOLT_EPOLICY: return "use --policy immediate, local or global";
  case MOLT_ENOTSUP: return "see 'molt help'";
  case MOLT_ENOTPROGRAM:
    return "build program images with 'moltcc --molt-program'";
  case MOLT_ENOPROGRAM:
    return "start the program with 'molt run <image.so>' to update it as a "
           "whole";
  case MOLT_EXFORM:
    return "the old version goes on unchanged; fix the migration rules (.xf) "
           "and rebuild the new image";
  default: return "see 'molt log' for details";
  }
}

/* Reports a response with a non-zero status; returns the exit code. */
static int report_status_error(const char *what, const reply *r) {
  const char *why = molt__tsv_field(molt__tsv_find(&r->recs, "error"), 1);
  if (why[0] == '\0')
    why = molt_strerror(r->status);
  /* The runtime may already say what to do ("<why>; <what to do>"): it
   * knows better than a generic hint, and one hint is enough. */
  if (strstr(why, "; ") != NULL)
    return fail(exit_code_of_status(r->status), "%s: %s", what, why);
  return fail(exit_code_of_status(r->status), "%s: %s; %s", what, why,
              advice(r->status));
}

/* Runs a request that needs no arguments and a successful answer: returns
 * 0, or the exit code after printing the failure. */
static int request(const char *what, pid_t pid, unsigned op,
                   const molt__buf *body, int timeout_ms, reply *r) {
  char err[1024];
  int rc = call(pid, op, body, timeout_ms, r, err, sizeof err);
  if (rc != 0)
    return report_call_error(what, pid, rc, err);
  if (r->status != 0) {
    int code = report_status_error(what, r);
    reply_free(r);
    return code;
  }
  return 0;
}

static void kv(molt__buf *b, const char *k, const char *v) {
  const char *f[2] = {k, v};
  molt__buf_record(b, 2, f);
}

/* ---- molt status ---------------------------------------------------------- */

static const char *F(const molt__record *rec, size_t i) {
  return molt__tsv_field(rec, i);
}

static bool is(const molt__record *rec, const char *key) {
  return strcmp(rec->fields[0], key) == 0;
}

static size_t count(const molt__records *rs, const char *key) {
  size_t n = 0;
  for (size_t i = 0; i < rs->count; i++)
    n += is(&rs->recs[i], key);
  return n;
}

/* Prints the records with key as a JSON array of objects whose members are
 * fields 1..n of each record, under the given names and types ('s' string,
 * 'n' number, 'b' boolean from 0/1, 't' thread view, 'v' "-" -> null). */
static void json_array(const molt__records *rs, const char *name,
                       const char *key, const char *const *names,
                       const char *types, bool last) {
  printf("  ");
  json_key(name);
  putchar('[');
  size_t n = 0;
  for (size_t i = 0; i < rs->count; i++) {
    const molt__record *rec = &rs->recs[i];
    if (!is(rec, key))
      continue;
    printf(n++ ? ",\n    {" : "\n    {");
    for (size_t k = 0; names[k] != NULL; k++) {
      const char *v = F(rec, k + 1);
      if (k)
        fputs(", ", stdout);
      if (types[k] == 't') {
        /* "global" or "generation N" */
        bool global = strcmp(v, "global") == 0;
        json_key("view");
        json_str(global ? "global" : "local");
        fputs(", ", stdout);
        json_key("generation");
        if (!global && strncmp(v, "generation ", 11) == 0)
          json_num(v + 11);
        else
          fputs("null", stdout);
        continue;
      }
      json_key(names[k]);
      switch (types[k]) {
      case 'n': json_num(v); break;
      case 'b': fputs(strcmp(v, "1") == 0 ? "true" : "false", stdout); break;
      case 'e':
        if (v[0] == '\0')
          fputs("null", stdout);
        else
          json_str(v);
        break;
      case 'v':
        if (strcmp(v, "-") == 0)
          fputs("null", stdout);
        else
          json_str(v);
        break;
      default: json_str(v);
      }
    }
    putchar('}');
  }
  printf(n ? "\n  ]%s\n" : "]%s\n", last ? "" : ",");
}

static void status_json(pid_t pid, const molt__records *rs) {
  const molt__record *st = molt__tsv_find(rs, "state");
  const molt__record *p = molt__tsv_find(rs, "pid");
  const molt__record *g = molt__tsv_find(rs, "generation");
  const molt__record *rc = molt__tsv_find(rs, "reclaim");
  printf("{\n  ");
  json_key("pid");
  if (p != NULL && is_json_number(F(p, 1)))
    fputs(F(p, 1), stdout);
  else
    printf("%ld", (long)pid);
  printf(",\n  ");
  json_key("state");
  json_str(st != NULL ? F(st, 1) : "unknown");
  printf(",\n  ");
  json_key("refusing_reason");
  if (st != NULL && strcmp(F(st, 1), "refusing") == 0)
    json_str(F(st, 2));
  else
    fputs("null", stdout);
  printf(",\n  ");
  json_key("generation");
  json_num(g != NULL ? F(g, 1) : "");
  printf(",\n  ");
  json_key("reclaim");
  fputs(rc == NULL ? "null"
                   : strcmp(F(rc, 1), "enabled") == 0 ? "true" : "false",
        stdout);
  printf(",\n");
  json_array(rs, "programs", "program",
             (const char *const[]){"path", "build_id", NULL}, "ss", false);
  json_array(rs, "patches", "patch",
             (const char *const[]){"position", "id", "description", "path",
                                   "generation", NULL},
             "nsssn", false);
  json_array(rs, "objects", "object",
             (const char *const[]){"id", "path", "generation", "refs", NULL},
             "ssnn", false);
  json_array(rs, "live_generations", "live",
             (const char *const[]){"generation", "slot", "state",
                                   "active_calls", NULL},
             "nnsn", false);
  json_array(rs, "functions", "function",
             (const char *const[]){"name", "tu", "static", "version", "entry", NULL},
             "ssbss", false);
  json_array(rs, "threads", "thread",
             (const char *const[]){"tid", "name", "view", "active_calls",
                                   NULL},
             "nstn", false);
  /* Full updates: the program image (null unless started by molt run). */
  const molt__record *im = molt__tsv_find(rs, "image");
  printf("  ");
  json_key("image");
  if (im != NULL) {
    putchar('{');
    json_key("path");
    json_str(F(im, 1));
    fputs(", ", stdout);
    json_key("build_id");
    json_str(F(im, 2));
    fputs(", ", stdout);
    json_key("full_updates");
    json_num(F(im, 3));
    fputs(", ", stdout);
    json_key("unloading");
    if (F(im, 4)[0] != '\0')
      json_str(F(im, 4));
    else
      fputs("null", stdout);
    putchar('}');
  } else {
    fputs("null", stdout);
  }
  printf(",\n");
  json_array(rs, "program_threads", "program_thread",
             (const char *const[]){"tid", "entry", "tu", "updating",
                                   "from_point", NULL},
             "nssbe", true);
  printf("}\n");
}

/* One table of the human status: the records with `key`, fields 1..n in
 * the column order given by `order` (field numbers). */
static void status_section(const molt__records *rs, const char *title,
                           const char *key, size_t ncols,
                           const char *const *header, const int *order) {
  size_t n = count(rs, key);
  printf("\n%s", title);
  if (n == 0) {
    printf(": none\n");
    return;
  }
  printf(" (%zu)\n", n);
  table t;
  table_init(&t, ncols, header);
  const char *row[8];
  for (size_t i = 0; i < rs->count; i++) {
    const molt__record *rec = &rs->recs[i];
    if (!is(rec, key))
      continue;
    for (size_t c = 0; c < ncols; c++) {
      const char *v = F(rec, (size_t)order[c]);
      /* function: static 0/1 reads better as yes/no */
      if (strcmp(key, "function") == 0 && order[c] == 3)
        v = strcmp(v, "1") == 0 ? "yes" : "no";
      if (strcmp(key, "program_thread") == 0 && order[c] == 4)
        v = strcmp(v, "1") == 0 ? "yes" : "no";
      row[c] = v;
    }
    table_add(&t, row);
  }
  table_print(&t, "  ");
}

static void status_human(pid_t pid, const molt__records *rs) {
  const molt__record *st = molt__tsv_find(rs, "state");
  const molt__record *g = molt__tsv_find(rs, "generation");
  const molt__record *rc = molt__tsv_find(rs, "reclaim");
  char comm[64];
  read_comm(pid, comm, sizeof comm);
  sanitize(comm);
  char state[1024];
  if (st != NULL && strcmp(F(st, 1), "refusing") == 0)
    snprintf(state, sizeof state, "REFUSING updates: %s", F(st, 2));
  else
    snprintf(state, sizeof state, "%s", st != NULL ? F(st, 1) : "unknown");
  sanitize(state);
  char gen[32], recl[32];
  snprintf(gen, sizeof gen, "%s", g != NULL ? F(g, 1) : "?");
  snprintf(recl, sizeof recl, "%s", rc != NULL ? F(rc, 1) : "?");
  sanitize(gen);
  sanitize(recl);
  printf("process     %ld (%s)\n", (long)pid, comm);
  printf("state       %s\n", state);
  printf("generation  %s\n", gen);
  printf("reclaim     %s\n", recl);

  status_section(rs, "programs", "program", 2,
                 (const char *const[]){"PATH", "BUILD-ID"},
                 (const int[]){1, 2});
  status_section(rs, "patches, bottom first", "patch", 5,
                 (const char *const[]){"#", "ID", "GENERATION", "PATH",
                                       "DESCRIPTION"},
                 (const int[]){1, 2, 5, 4, 3});
  status_section(rs, "loaded patch objects", "object", 4,
                 (const char *const[]){"ID", "LOADED-IN", "REFS", "PATH"},
                 (const int[]){1, 3, 4, 2});
  status_section(rs, "live generations", "live", 4,
                 (const char *const[]){"GENERATION", "SLOT", "STATE",
                                       "ACTIVE-CALLS"},
                 (const int[]){1, 2, 3, 4});
  status_section(rs, "updatable functions", "function", 5,
                 (const char *const[]){"NAME", "FILE", "STATIC", "VERSION", "ENTRY"},
                 (const int[]){1, 2, 3, 4, 5});
  status_section(rs, "threads", "thread", 4,
                 (const char *const[]){"TID", "NAME", "RUNS", "ACTIVE-CALLS"},
                 (const int[]){1, 2, 3, 4});
  const molt__record *im = molt__tsv_find(rs, "image");
  if (im != NULL) {
    char line[8192];
    snprintf(line, sizeof line, "%s (build-id %s, %s full update%s%s%s)",
             F(im, 1), F(im, 2), F(im, 3), strcmp(F(im, 3), "1") == 0 ? "" : "s",
             F(im, 4)[0] ? "; old image still loaded: " : "", F(im, 4));
    sanitize(line);
    printf("\nprogram image  %s\n", line);
    status_section(rs, "program threads", "program_thread", 5,
                   (const char *const[]){"TID", "ENTRY", "FILE", "UPDATING",
                                         "FROM-POINT"},
                   (const int[]){1, 2, 3, 4, 5});
  }
}

static int cmd_status(const opts *o, pid_t pid) {
  char what[64];
  snprintf(what, sizeof what, "status %ld", (long)pid);
  reply r;
  int code = request(what, pid, MOLT__OP_STATUS, NULL,
                     DEFAULT_TIMEOUT_MS + CLIENT_SLACK_MS, &r);
  if (code != 0)
    return code;
  if (o->json)
    status_json(pid, &r.recs);
  else
    status_human(pid, &r.recs);
  reply_free(&r);
  return EXIT_OK;
}

/* ---- molt log ----------------------------------------------------------- */

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

static int cmd_log(const opts *o, pid_t pid) {
  char what[64];
  snprintf(what, sizeof what, "log %ld", (long)pid);
  reply r;
  int code = request(what, pid, MOLT__OP_LOG, NULL,
                     DEFAULT_TIMEOUT_MS + CLIENT_SLACK_MS, &r);
  if (code != 0)
    return code;
  if (o->json) {
    size_t n = 0;
    putchar('[');
    for (size_t i = 0; i < r.recs.count; i++) {
      const molt__record *rec = &r.recs.recs[i];
      if (!is(rec, "log"))
        continue;
      fputs(n++ ? ",\n  {" : "\n  {", stdout);
      json_key("seq");
      json_num(F(rec, 1));
      fputs(", ", stdout);
      json_key("time");
      json_num(F(rec, 2));
      fputs(", ", stdout);
      json_key("event");
      json_str(F(rec, 3));
      fputs(", ", stdout);
      json_key("generation");
      json_num(F(rec, 4));
      fputs(", ", stdout);
      json_key("patch");
      if (strcmp(F(rec, 5), "-") == 0 || F(rec, 5)[0] == '\0')
        fputs("null", stdout);
      else
        json_str(F(rec, 5));
      fputs(", ", stdout);
      json_key("message");
      json_str(F(rec, 6));
      putchar('}');
    }
    fputs(n ? "\n]\n" : "]\n", stdout);
  } else {
    table t;
    table_init(&t, 6,
               (const char *const[]){"SEQ", "TIME", "EVENT", "GENERATION",
                                     "PATCH", "MESSAGE"});
    for (size_t i = 0; i < r.recs.count; i++) {
      const molt__record *rec = &r.recs.recs[i];
      if (!is(rec, "log"))
        continue;
      char tbuf[64];
      format_time(F(rec, 2), tbuf, sizeof tbuf);
      table_add(&t, (const char *const[]){F(rec, 1), tbuf, F(rec, 3),
                                          F(rec, 4), F(rec, 5), F(rec, 6)});
    }
    table_print(&t, "");
  }
  reply_free(&r);
  return EXIT_OK;
}

/* ---- molt apply / rollback ------------------------------------------------ */

static int update(const opts *o, pid_t pid, const char *what, unsigned op,
                  const char *path) {
  molt__buf body;
  molt__buf_init(&body);
  if (path != NULL)
    kv(&body, "path", path);
  if (op == MOLT__OP_UPDATE)
    kv(&body, "check_interior", o->check_interior ? "1" : "0");
  else
    kv(&body, "policy", o->policy != NULL ? o->policy : "immediate");
  int timeout_ms = o->timeout_ms >= 0 ? o->timeout_ms : DEFAULT_TIMEOUT_MS;
  char tbuf[16];
  snprintf(tbuf, sizeof tbuf, "%d", timeout_ms);
  kv(&body, "timeout_ms", tbuf);
  if (body.oom) {
    molt__buf_free(&body);
    return fail(EXIT_FAILED, "%s: out of memory; retry", what);
  }
  if (body.len > MOLT__PROTO_MAX_REQUEST) {
    molt__buf_free(&body);
    return fail(EXIT_USAGE, "%s: the file path is too long; use a shorter "
                            "path", what);
  }
  reply r;
  int code = request(what, pid, op, &body, timeout_ms + CLIENT_SLACK_MS, &r);
  molt__buf_free(&body);
  if (code != 0)
    return code;
  const molt__record *g = molt__tsv_find(&r.recs, "generation");
  const molt__record *m = molt__tsv_find(&r.recs, "message");
  char line[4096];
  if (op == MOLT__OP_APPLY)
    snprintf(line, sizeof line, "applied %s to %ld", path, (long)pid);
  else if (op == MOLT__OP_UPDATE)
    snprintf(line, sizeof line, "updated %ld to %s", (long)pid, path);
  else
    snprintf(line, sizeof line, "rolled back %ld", (long)pid);
  size_t n = strlen(line);
  if (g != NULL)
    snprintf(line + n, sizeof line - n, ": now at generation %s", F(g, 1));
  n = strlen(line);
  if (m != NULL && F(m, 1)[0] != '\0')
    snprintf(line + n, sizeof line - n, " (%s)", F(m, 1));
  sanitize(line);
  puts(line);
  reply_free(&r);
  return EXIT_OK;
}

/* apply and update: send an absolute, symlink-free path (the process
 * resolves it in its own working directory and mount namespace view), and
 * fail here, clearly, if there is no such file.  `kind` names the file in
 * messages, `built_by` says how to make one. */
static int send_file_op(const opts *o, pid_t pid, const char *what, molt__op op,
                        const char *kind, const char *built_by) {
  const char *arg = o->pos[1];
  struct stat st;
  if (stat(arg, &st) < 0)
    return fail(EXIT_USAGE, "%s: %s; check the path of the %s", what,
                strerror(errno), kind);
  if (!S_ISREG(st.st_mode))
    return fail(EXIT_USAGE, "%s: not a regular file; give the .so file built by '%s'",
                what, built_by);
  char *abs = realpath(arg, NULL);
  if (abs == NULL)
    return fail(EXIT_USAGE, "%s: cannot resolve the path: %s; check the path",
                what, strerror(errno));
  int code = update(o, pid, what, op, abs);
  free(abs);
  return code;
}

static int cmd_apply(const opts *o, pid_t pid) {
  char what[PATH_MAX + 64];
  snprintf(what, sizeof what, "apply %s to %ld", o->pos[1], (long)pid);
  return send_file_op(o, pid, what, MOLT__OP_APPLY, "patch file",
                      "moltcc --molt-patch");
}

static int cmd_update(const opts *o, pid_t pid) {
  char what[PATH_MAX + 64];
  snprintf(what, sizeof what, "update %ld to %s", (long)pid, o->pos[1]);
  return send_file_op(o, pid, what, MOLT__OP_UPDATE, "program image",
                      "moltcc --molt-program --molt-from <running image>");
}

/* molt run: exec the driver (bin/molt-run next to this executable, else
 * molt-run on PATH), so that the program keeps the PID the user sees.  The
 * words after the image are the program's, never molt's options. */
static int cmd_run(int argc, char **argv) {
  if (argc < 3)
    return fail(EXIT_USAGE, "run: missing arguments; usage: molt run "
                            "<image.so> [args...]");
  const char *image = argv[2];
  int first = 2;
  if (strcmp(image, "--") == 0) {
    if (argc < 4)
      return fail(EXIT_USAGE, "run: missing arguments; usage: molt run "
                              "<image.so> [args...]");
    image = argv[3];
    first = 3;
  }
  struct stat st;
  if (stat(image, &st) < 0)
    return fail(EXIT_USAGE, "run %s: %s; check the path of the program image",
                image, strerror(errno));
  if (!S_ISREG(st.st_mode))
    return fail(EXIT_USAGE,
                "run %s: not a regular file; give the .so file built by "
                "'moltcc --molt-program'",
                image);
  char *abs = realpath(image, NULL);
  if (abs == NULL)
    return fail(EXIT_USAGE, "run %s: cannot resolve the path: %s", image,
                strerror(errno));
  /* argv of the driver: molt-run <image> <program args...> */
  int n = argc - first;
  char **av = xmalloc(((size_t)n + 2) * sizeof *av);
  av[0] = "molt-run";
  av[1] = abs;
  for (int i = 1; i < n; i++)
    av[i + 1] = argv[first + i];
  av[n + 1] = NULL;

  char self[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len > 0) {
    self[len] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL && (size_t)(slash - self) + sizeof "/molt-run" <= sizeof self) {
      strcpy(slash + 1, "molt-run");
      if (access(self, X_OK) == 0) {
        execv(self, av);
        int e = errno;
        free(av);
        free(abs);
        return fail(127, "run %s: cannot execute %s: %s; check the molt "
                         "installation", image, self, strerror(e));
      }
    }
  }
  execvp("molt-run", av);
  int e = errno;
  free(av);
  free(abs);
  return fail(127, "run %s: cannot execute molt-run: %s; install molt-run next "
                   "to molt or on PATH", image, strerror(e));
}

static int cmd_rollback(const opts *o, pid_t pid) {
  char what[64];
  snprintf(what, sizeof what, "rollback %ld", (long)pid);
  return update(o, pid, what, MOLT__OP_ROLLBACK, NULL);
}

/* ---- molt ps ---------------------------------------------------------------- */

static int cmp_pid(const void *a, const void *b) {
  pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
  return (x > y) - (x < y);
}

/* Collects the pids of "@molt.<pid>" sockets in /proc/net/unix (which shows
 * an abstract name with '@' for its leading NUL).  Sorted, deduplicated
 * (accepted connections show the listener's name too). */
static int find_molt_pids(pid_t **out, size_t *n) {
  *out = NULL;
  *n = 0;
  FILE *f = fopen("/proc/net/unix", "re");
  if (f == NULL)
    return -errno;
  char line[1024];
  size_t cap = 0;
  bool first = true;
  while (fgets(line, sizeof line, f) != NULL) {
    if (first) { /* header */
      first = false;
      continue;
    }
    /* Num RefCount Protocol Flags Type St Inode Path */
    char *save = NULL, *tok = strtok_r(line, " \t\n", &save);
    for (int i = 0; tok != NULL && i < 7; i++)
      tok = strtok_r(NULL, " \t\n", &save);
    static const char prefix[] = "@" MOLT__PROTO_NAME_PREFIX;
    if (tok == NULL || strncmp(tok, prefix, sizeof prefix - 1) != 0)
      continue;
    pid_t pid;
    if (!parse_pid(tok + sizeof prefix - 1, &pid))
      continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      *out = xrealloc(*out, cap * sizeof **out);
    }
    (*out)[(*n)++] = pid;
  }
  fclose(f);
  if (*n > 0) {
    qsort(*out, *n, sizeof **out, cmp_pid);
    size_t w = 1;
    for (size_t r = 1; r < *n; r++)
      if ((*out)[r] != (*out)[w - 1])
        (*out)[w++] = (*out)[r];
    *n = w;
  }
  return 0;
}

static int cmd_ps(void) {
  pid_t *pids;
  size_t n;
  int e = find_molt_pids(&pids, &n);
  if (e < 0)
    return fail(EXIT_CONNECT,
                "ps: cannot read /proc/net/unix: %s; molt ps needs /proc "
                "mounted",
                strerror(-e));
  table t;
  table_init(&t, 5,
             (const char *const[]){"PID", "USER", "COMMAND", "GENERATION",
                                   "STATE"});
  uid_t me = geteuid();
  for (size_t i = 0; i < n; i++) {
    pid_t pid = pids[i];
    char path[64], pidbuf[16], user[64], comm[64], gen[32], state[32];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%ld", (long)pid);
    if (stat(path, &st) < 0)
      continue; /* exited since we read the socket table */
    snprintf(pidbuf, sizeof pidbuf, "%ld", (long)pid);
    struct passwd pw, *pwp = NULL;
    char pwbuf[1024];
    if (getpwuid_r(st.st_uid, &pw, pwbuf, sizeof pwbuf, &pwp) == 0 &&
        pwp != NULL)
      snprintf(user, sizeof user, "%s", pw.pw_name);
    else
      snprintf(user, sizeof user, "%u", (unsigned)st.st_uid);
    read_comm(pid, comm, sizeof comm);
    snprintf(gen, sizeof gen, "-");
    snprintf(state, sizeof state, "-");
    /* /proc/<pid> belongs to the process's effective uid.  Do not knock on
     * the doors of other users' processes: it would only be refused and
     * fill their logs with refusals. */
    if (me == 0 || st.st_uid == me) {
      reply r;
      char err[512];
      int rc = call(pid, MOLT__OP_STATUS, NULL, PS_TIMEOUT_MS, &r, err,
                    sizeof err);
      if (rc == 0 && r.status == 0) {
        const molt__record *g = molt__tsv_find(&r.recs, "generation");
        const molt__record *s = molt__tsv_find(&r.recs, "state");
        snprintf(gen, sizeof gen, "%s", g != NULL ? F(g, 1) : "?");
        snprintf(state, sizeof state, "%s", s != NULL ? F(s, 1) : "?");
      } else if (rc == 0 && r.status != MOLT_EPERM) {
        snprintf(state, sizeof state, "error");
      } else if (rc == MOLT_ETIMEDOUT) {
        snprintf(state, sizeof state, "busy");
      } else if (rc == MOLT_ECONNECT && strstr(err, "refusing") != NULL) {
        snprintf(state, sizeof state, "impostor");
      } else if (rc == MOLT_EPROTO || rc == MOLT_EVERSION) {
        snprintf(state, sizeof state, "incompatible");
      } else if (rc != 0) {
        snprintf(state, sizeof state, "gone");
      }
      if (rc == 0)
        reply_free(&r);
    }
    table_add(&t, (const char *const[]){pidbuf, user, comm, gen, state});
  }
  table_print(&t, "");
  free(pids);
  return EXIT_OK;
}

/* ---- main ------------------------------------------------------------------- */

int main(int argc, char **argv) {
  if (argc < 2)
    return fail(EXIT_USAGE, "no command given; run 'molt help' for usage");
  const char *cmd = argv[1];
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 ||
      strcmp(cmd, "-h") == 0) {
    fputs(usage_text, stdout);
    return EXIT_OK;
  }
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
    printf("molt %s (control protocol %u)\n", MOLT_VERSION_STRING,
           MOLT__PROTO_VERSION);
    return EXIT_OK;
  }

  /* Everything after the image belongs to the program. */
  if (strcmp(cmd, "run") == 0)
    return cmd_run(argc, argv);

  static const struct {
    const char *name;
    int npos;        /* positional arguments, pid included */
    bool json, update;
  } cmds[] = {
      {"ps", 0, false, false},     {"status", 1, true, false},
      {"apply", 2, false, true},   {"rollback", 1, false, true},
      {"log", 1, true, false},     {"update", 2, false, true},
  };
  int c = -1;
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (strcmp(cmd, cmds[i].name) == 0)
      c = (int)i;
  if (c < 0) {
    if (strcmp(cmd, "promote") == 0 || strcmp(cmd, "attach") == 0)
      return fail(EXIT_USAGE,
                  "%s: not supported by this version of molt; see 'molt help'",
                  cmd);
    return fail(EXIT_USAGE, "unknown command '%s'; run 'molt help' for usage",
                cmd);
  }

  opts o = {.cmd = cmd, .timeout_ms = -1};
  int code = parse_args(argc, argv, &o);
  if (code != 0)
    return code;
  if (o.json && !cmds[c].json)
    return fail(EXIT_USAGE, "%s: --json is not supported here; see 'molt help'",
                cmd);
  if ((o.policy != NULL || o.timeout_ms >= 0) && !cmds[c].update)
    return fail(EXIT_USAGE,
                "%s: --policy and --timeout apply only to apply, rollback and "
                "update; see 'molt help'",
                cmd);
  bool is_update = strcmp(cmd, "update") == 0;
  if (o.policy != NULL && is_update)
    return fail(EXIT_USAGE,
                "update: --policy does not apply to full updates (they always "
                "wait at the update points); see 'molt help'");
  if (o.check_interior && !is_update)
    return fail(EXIT_USAGE,
                "%s: --check-interior applies only to update; see 'molt help'",
                cmd);
  if (o.npos != cmds[c].npos) {
    static const char *const synopsis[] = {
        "molt ps", "molt status <pid> [--json]",
        "molt apply <pid> <patch.so> [--policy P] [--timeout SEC]",
        "molt rollback <pid> [--policy P] [--timeout SEC]",
        "molt log <pid> [--json]",
        "molt update <pid> <image.so> [--timeout SEC] [--check-interior]"};
    return fail(EXIT_USAGE, "%s: %s arguments; usage: %s", cmd,
                o.npos < cmds[c].npos ? "missing" : "too many", synopsis[c]);
  }
  if (c == 0)
    return cmd_ps();

  pid_t pid;
  if (!parse_pid(o.pos[0], &pid))
    return fail(EXIT_USAGE,
                "%s: '%s' is not a process id; give the numeric pid shown by "
                "'molt ps'",
                cmd, o.pos[0]);
  switch (c) {
  case 1: return cmd_status(&o, pid);
  case 2: return cmd_apply(&o, pid);
  case 3: return cmd_rollback(&o, pid);
  case 5: return cmd_update(&o, pid);
  default: return cmd_log(&o, pid);
  }
}
