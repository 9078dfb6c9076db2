/*
 * The rule language of shadowed updates (src/common/rules.c): what good
 * files parse to, the file:line:col of bad ones, patterns, and a
 * deterministic mutation loop (the runtime parses a client's text inside
 * its host: every input must give 0 or MOLT_EINVAL with a one-line
 * "name:line:col: ..." message, never a crash or an access out of bounds).
 *
 *   test_rules unit
 *   test_rules fuzz [ITERATIONS] [SEED]
 */
#include "common/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond)                                                                      \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);           \
      failures++;                                                                        \
    }                                                                                    \
  } while (0)

static molt__rules rs;

static int parse(const char *text, char *err, size_t errlen) {
  err[0] = '\0';
  return molt__rules_parse("r.rules", text, strlen(text), &rs, err, errlen);
}

/* text must be refused with exactly this message. */
static void bad(const char *text, const char *want) {
  char err[512];
  int rc = parse(text, err, sizeof err);
  if (rc != MOLT_EINVAL || strcmp(err, want) != 0) {
    fprintf(stderr, "for %s\n  want %s\n  got  %d %s\n", text, want, rc, err);
    failures++;
  }
}

static bool match(const char *pattern_rule, const char *buf) {
  char err[512];
  if (parse(pattern_rule, err, sizeof err) != 0 || rs.n != 1) {
    fprintf(stderr, "pattern rule %s: %s\n", pattern_rule, err);
    failures++;
    return false;
  }
  return molt__rule_matches(&rs.r[0], buf, strlen(buf));
}

static void unit(void) {
  char err[512];
  /* a file with comments, blank lines, every part of a rule */
  const char *good =
      "# expected divergences of v2\n"
      "\n"
      "forward recv socket \"INCR *\" rewrite \"NOSUCH\\n\"  # v1 rejects INCR\n"
      "  reverse send \"VALUE ?\\x41*\" tolerate\r\n"
      "forward close drop\n"
      "forward any insert\n"
      "reverse read pipe \"a\\*b\" rewrite \"\"";
  CHECK(parse(good, err, sizeof err) == 0);
  CHECK(err[0] == '\0');
  CHECK(rs.n == 5);
  const molt__rule *r = &rs.r[0];
  CHECK(r->dir == MOLT__RULE_FORWARD && r->call == MOLT__SC_RECV &&
        r->fd_kind == MOLT__FDK_SOCKET && r->action == MOLT__RULE_REWRITE);
  CHECK(r->line == 3 && r->has_pattern && r->pat_len == 6);
  CHECK(r->pat[4] == ' ' && r->pat[5] == MOLT__PAT_STAR);
  CHECK(r->text_len == 7 && memcmp(r->text, "NOSUCH\n", 7) == 0);
  r = &rs.r[1];
  CHECK(r->dir == MOLT__RULE_REVERSE && r->call == MOLT__SC_SEND &&
        r->fd_kind == MOLT__FDK_ANY && r->action == MOLT__RULE_TOLERATE && r->line == 4);
  CHECK(r->pat_len == 9 && r->pat[6] == MOLT__PAT_ONE && r->pat[7] == 'A');
  r = &rs.r[2];
  CHECK(r->call == MOLT__SC_CLOSE && r->action == MOLT__RULE_DROP && !r->has_pattern);
  r = &rs.r[3];
  CHECK(r->call == MOLT__SC_SKIP && r->action == MOLT__RULE_INSERT);
  r = &rs.r[4];
  CHECK(r->fd_kind == MOLT__FDK_PIPE && r->pat_len == 3 && r->pat[1] == '*' &&
        r->text_len == 0 && r->action == MOLT__RULE_REWRITE);
  CHECK(parse("", err, sizeof err) == 0 && rs.n == 0);
  CHECK(parse("# only a comment", err, sizeof err) == 0 && rs.n == 0);

  /* each error at its line and column */
  bad("forward recv \"x\" tolerate\nbackward send tolerate\n",
      "r.rules:2:1: a rule starts with 'forward' or 'reverse', not 'backward'");
  bad("forward reed tolerate",
      "r.rules:1:9: unknown call 'reed' (read, write, recv, send, readv, writev, "
      "recvfrom, sendto, recvmsg, sendmsg, accept, accept4, poll, epoll_wait, close, "
      "socket, open, openat, clock_gettime, gettimeofday, time, getrandom, epoll_create, "
      "epoll_ctl, epoll_pwait, epoll_pwait2 or any)");
  bad("forward recv socket \"x\" rewrit \"y\"",
      "r.rules:1:25: unknown action 'rewrit' (tolerate, drop, insert or rewrite "
      "\"TEXT\")");
  bad("forward recv sokket tolerate",
      "r.rules:1:14: unknown descriptor kind or action 'sokket' (tolerate, drop, insert "
      "or rewrite \"TEXT\")");
  bad("\n\n   forward send \"abc",
      "r.rules:3:17: string not closed before the end of the line");
  bad("forward send \"a\\qb\" tolerate",
      "r.rules:1:16: unknown escape '\\q' (use \\n \\r \\t \\0 \\\\ \\\" \\* \\? \\xHH)");
  bad("forward send \"\\x4\" tolerate", "r.rules:1:15: \\x needs two hex digits");
  bad("forward close \"x\" drop",
      "r.rules:1:15: close has no buffer to match a pattern against (only read, write, "
      "recv, send, readv, writev, recvfrom, sendto, recvmsg, sendmsg or getrandom have)");
  bad("forward poll rewrite \"x\"",
      "r.rules:1:9: rewrite needs a call with a buffer (read, write, recv, send, readv, "
      "writev, recvfrom, sendto, recvmsg, sendmsg or getrandom), not poll");
  bad("forward recv drop", "r.rules:1:9: drop applies to calls the follower can skip "
                           "(write, send, writev, sendto, sendmsg or close), not "
                           "recv");
  bad("forward readv drop", "r.rules:1:9: drop applies to calls the follower can skip "
                            "(write, send, writev, sendto, sendmsg or close), not "
                            "readv");
  /* the vectored and addressed calls are kinds of their own: a rule names
   * writev to match a writev (a rule naming write does not), with patterns
   * on its gathered bytes; drop and rewrite as on write and read */
  CHECK(parse("forward writev socket \"VALUE *\" tolerate\n"
              "forward sendmsg drop\n"
              "reverse recvmsg \"GET *\" rewrite \"PING\\n\"\n"
              "forward write tolerate\n"
              "forward recvfrom insert\n"
              "forward sendto \"x\" tolerate\n"
              "forward readv tolerate\n",
              err, sizeof err) == 0);
  CHECK(rs.n == 7);
  CHECK(rs.r[0].call == MOLT__SC_WRITEV && rs.r[0].fd_kind == MOLT__FDK_SOCKET &&
        rs.r[0].has_pattern && molt__sc_buffer(MOLT__SC_WRITEV) == 2);
  CHECK(rs.r[1].call == MOLT__SC_SENDMSG && rs.r[1].action == MOLT__RULE_DROP);
  CHECK(rs.r[2].call == MOLT__SC_RECVMSG && rs.r[2].dir == MOLT__RULE_REVERSE &&
        rs.r[2].text_len == 5 && molt__sc_buffer(MOLT__SC_RECVMSG) == 1);
  CHECK(rs.r[3].call == MOLT__SC_WRITE && rs.r[3].call != MOLT__SC_WRITEV);
  CHECK(rs.r[4].call == MOLT__SC_RECVFROM && rs.r[5].call == MOLT__SC_SENDTO &&
        rs.r[6].call == MOLT__SC_READV);
  CHECK(strcmp(molt__sc_name(MOLT__SC_SENDMSG), "sendmsg") == 0);
  bad("forward recv rewrite",
      "r.rules:1:21: rewrite needs the replacement: rewrite \"TEXT\"");
  bad("forward recv rewrite \"a*\"", "r.rules:1:22: a replacement has no wildcards "
                                     "(write \\* or \\? for the characters)");
  bad("forward recv",
      "r.rules:1:13: missing action (tolerate, drop, insert or rewrite \"TEXT\")");
  bad("forward recv tolerate tolerate", "r.rules:1:23: unexpected word after the action");
  bad("forward recv tolerate ;", "r.rules:1:23: unexpected ';'");
  bad("forward recv\x01 tolerate", "r.rules:1:13: unexpected byte 0x01");
  bad("\"x\" forward",
      "r.rules:1:1: a rule starts with 'forward' or 'reverse', not a string");
  bad("forward recv toleratetoleratetolerate",
      "r.rules:1:14: word longer than 15 letters");
  {
    char nul[] = "forward recv \"a\0\" tolerate";
    CHECK(molt__rules_parse("r.rules", nul, sizeof nul - 1, &rs, err, sizeof err) ==
              MOLT_EINVAL &&
          strcmp(err, "r.rules:1:16: NUL byte in a string (write \\x00)") == 0);
  }
  /* the bounds */
  static char big[MOLT__RULES_MAX_TEXT * 2];
  memset(big, '#', sizeof big);
  CHECK(molt__rules_parse("r.rules", big, MOLT__RULES_MAX_TEXT, &rs, err, sizeof err) ==
        0);
  CHECK(molt__rules_parse("r.rules", big, MOLT__RULES_MAX_TEXT + 1, &rs, err,
                          sizeof err) == MOLT_EINVAL &&
        strcmp(err, "r.rules: the rule file has 8193 bytes; at most 8192") == 0);
  size_t n = 0;
  for (int i = 0; i <= MOLT__RULES_MAX; i++)
    n += (size_t)snprintf(big + n, sizeof big - n, "forward close drop\n");
  CHECK(parse(big, err, sizeof err) == MOLT_EINVAL &&
        strcmp(err, "r.rules:65:1: more than 64 rules") == 0);
  n = (size_t)snprintf(big, sizeof big, "forward send \"");
  for (int i = 0; i <= MOLT__RULE_MAX_BYTES; i++)
    big[n++] = 'a';
  snprintf(big + n, sizeof big - n, "\" tolerate");
  CHECK(parse(big, err, sizeof err) == MOLT_EINVAL &&
        strcmp(err, "r.rules:1:14: string longer than 256 bytes") == 0);

  /* patterns match the whole buffer */
  CHECK(match("forward recv \"INCR *\" tolerate", "INCR k\n"));
  CHECK(!match("forward recv \"INCR *\" tolerate", "GET INCR k\n"));
  CHECK(match("forward recv \"*INCR*\" tolerate", "GET INCR k\n"));
  CHECK(match("forward recv \"a?c\" tolerate", "abc"));
  CHECK(!match("forward recv \"a?c\" tolerate", "ac"));
  CHECK(match("forward recv \"a*b*c\" tolerate", "aXXbYYbZc"));
  CHECK(!match("forward recv \"a*b*c\" tolerate", "aXXbYYbZ"));
  CHECK(match("forward recv \"a\\*\" tolerate", "a*"));
  CHECK(!match("forward recv \"a\\*\" tolerate", "ab"));
  CHECK(match("forward recv \"\" tolerate", ""));
  CHECK(!match("forward recv \"\" tolerate", "x"));
  CHECK(match("forward recv \"**\" tolerate", ""));
  CHECK(match("forward recv tolerate", "anything"));
}

/* ---- fuzz ---------------------------------------------------------------------*/

static uint64_t rng;
static uint64_t next_rand(void) { /* xorshift64 */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static const char *const seeds[] = {
    "forward recv socket \"INCR *\" rewrite \"NOSUCH\\n\"\n",
    "reverse send \"VALUE ?\\x41*\" tolerate # c\n",
    "forward close drop\nforward any insert\n",
    "reverse read pipe \"a\\*b\" rewrite \"\"\n",
    "forward write file \"\\t\\r\\n\\0\\\\\\\"\" tolerate\n",
    "forward accept4 socket insert\nforward poll tolerate\nforward epoll_wait tolerate\n",
};
static const char *const words[] = {"forward", "reverse",  "recv", "send",   "socket",
                                    "pipe",    "file",     "any",  "drop",   "insert",
                                    "rewrite", "tolerate", "\"",   "\\",     "\n",
                                    "#",       "*",        "\\x",  "\"a*\"", " "};

static void fuzz(long iterations, uint64_t seed) {
  static char buf[MOLT__RULES_MAX_TEXT + 64];
  static char probe[512];
  rng = seed ? seed : 0x9e3779b97f4a7c15ull;
  long ok = 0, refused = 0;
  for (long it = 0; it < iterations; it++) {
    size_t n = 0;
    /* a few seeds spliced, then mutations */
    int parts = 1 + (int)(next_rand() % 4);
    for (int p = 0; p < parts; p++) {
      const char *s = seeds[next_rand() % (sizeof seeds / sizeof seeds[0])];
      size_t l = strlen(s);
      if (n + l < sizeof buf)
        memcpy(buf + n, s, l), n += l;
    }
    int muts = (int)(next_rand() % 8);
    for (int m = 0; m < muts && n > 0; m++) {
      size_t at = next_rand() % n;
      switch (next_rand() % 5) {
      case 0:
        buf[at] = (char)next_rand();
        break;
      case 1: /* delete a run */
      {
        size_t k = 1 + next_rand() % 8;
        if (at + k > n)
          k = n - at;
        memmove(buf + at, buf + at + k, n - at - k);
        n -= k;
        break;
      }
      case 2: /* insert a word */
      {
        const char *w = words[next_rand() % (sizeof words / sizeof words[0])];
        size_t l = strlen(w);
        if (n + l < sizeof buf) {
          memmove(buf + at + l, buf + at, n - at);
          memcpy(buf + at, w, l);
          n += l;
        }
        break;
      }
      case 3: /* repeat a byte many times (long strings, long words) */
      {
        size_t k = next_rand() % 600;
        if (n + k < sizeof buf) {
          memmove(buf + at + k, buf + at, n - at);
          memset(buf + at, buf[at + k < n + k ? at + k : at], k);
          n += k;
        }
        break;
      }
      default:
        buf[at] = "\"\\*?\n# x"[next_rand() % 8];
        break;
      }
    }
    /* the parser gets exactly n bytes: poison what follows */
    buf[n] = (char)0xff;
    char err[512];
    memset(err, 'Z', sizeof err);
    int rc = molt__rules_parse("f.rules", buf, n, &rs, err, sizeof err);
    if (rc == 0) {
      ok++;
      if (rs.n > MOLT__RULES_MAX)
        abort();
      for (uint32_t i = 0; i < rs.n; i++) {
        const molt__rule *r = &rs.r[i];
        if (r->pat_len > MOLT__RULE_MAX_BYTES || r->text_len > MOLT__RULE_MAX_BYTES ||
            r->call >= MOLT__SC_END || r->fd_kind > MOLT__FDK_PIPE ||
            r->action > MOLT__RULE_REWRITE || r->line == 0) {
          fprintf(stderr, "fuzz: rule %u out of bounds after iteration %ld\n", i, it);
          abort();
        }
        size_t pn = next_rand() % sizeof probe;
        for (size_t k = 0; k < pn; k++)
          probe[k] = (char)("INCR VALUE ab*\n"[next_rand() % 15]);
        (void)molt__rule_matches(r, probe, pn);
      }
    } else {
      refused++;
      /* one line "f.rules:L:C: ..." (or the size message) */
      if (rc != MOLT_EINVAL || !memchr(err, '\0', sizeof err) || strchr(err, '\n') ||
          strncmp(err, "f.rules:", 8) != 0) {
        fprintf(stderr, "fuzz: iteration %ld: rc %d, message '%.200s'\n", it, rc, err);
        abort();
      }
      unsigned line = 0, col = 0;
      if (sscanf(err, "f.rules:%u:%u:", &line, &col) == 2 &&
          (line == 0 || col == 0 || line > n + 1 || col > n + 1)) {
        fprintf(stderr, "fuzz: iteration %ld: position out of the text: %s\n", it, err);
        abort();
      }
    }
  }
  printf("fuzz: %ld inputs, %ld parsed, %ld refused\n", iterations, ok, refused);
  /* the loop must exercise both sides */
  CHECK(ok > iterations / 50 && refused > iterations / 50);
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "unit") == 0) {
    unit();
  } else if (argc >= 2 && strcmp(argv[1], "fuzz") == 0) {
    fuzz(argc >= 3 ? atol(argv[2]) : 200000, argc >= 4 ? strtoull(argv[3], NULL, 0) : 0);
  } else {
    fprintf(stderr, "usage: test_rules unit | fuzz [ITERATIONS] [SEED]\n");
    return 2;
  }
  if (failures)
    fprintf(stderr, "%d checks failed\n", failures);
  return failures ? 1 : 0;
}
