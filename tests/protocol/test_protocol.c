/*
 * Unit tests of the control protocol codec (src/runtime/protocol.c):
 * header round trips and validation, TSV parsing and escaping, every class
 * of malformed input, and the deadline-bounded I/O helpers on socketpairs.
 * SIGPIPE is deliberately left at its default: a write to a closed peer
 * that forgot MSG_NOSIGNAL kills the test.
 */
#include "../harness/check.h"
#include "common/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK_EQ(a, b)                                                                   \
  do {                                                                                   \
    long long a_ = (long long)(a), b_ = (long long)(b);                                  \
    if (a_ != b_) {                                                                      \
      fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %lld, %s == %lld\n", __FILE__,      \
              __LINE__, #a, a_, #b, b_);                                                 \
      failures++;                                                                        \
    }                                                                                    \
  } while (0)

#define CHECK_STR(a, b)                                                                  \
  do {                                                                                   \
    const char *a_ = (a), *b_ = (b);                                                     \
    if (strcmp(a_, b_) != 0) {                                                           \
      fprintf(stderr, "%s:%d: CHECK_STR failed: %s == \"%s\", expected \"%s\"\n",        \
              __FILE__, __LINE__, #a, a_, b_);                                           \
      failures++;                                                                        \
    }                                                                                    \
  } while (0)

static void hdr_bytes(unsigned char *b, uint32_t magic, uint16_t version, uint16_t kind,
                      int32_t status, uint32_t len) {
  molt__frame_hdr h = {magic, version, kind, status, len};
  molt__proto_encode_hdr(&h, b);
}

static int decode(molt__frame_type t, uint32_t magic, uint16_t version, uint16_t kind,
                  int32_t status, uint32_t len) {
  unsigned char b[MOLT__PROTO_HDR_SIZE];
  hdr_bytes(b, magic, version, kind, status, len);
  molt__frame_hdr h;
  char err[256] = "";
  int rc = molt__proto_decode_hdr(b, t, &h, err, sizeof err);
  if (rc != 0)
    CHECK(err[0] != '\0'); /* every rejection says why */
  return rc;
}

static void test_header(void) {
  unsigned char b[MOLT__PROTO_HDR_SIZE];
  hdr_bytes(b, MOLT__PROTO_MAGIC, 1, MOLT__OP_APPLY, 0, 1234);
  /* The wire layout, byte by byte: "MOLT", version 1, op, status, length. */
  CHECK(memcmp(b, "MOLT", 4) == 0);
  CHECK(b[4] == 1 && b[5] == 0);
  CHECK(b[6] == MOLT__OP_APPLY && b[7] == 0);
  CHECK(b[8] == 0 && b[9] == 0 && b[10] == 0 && b[11] == 0);
  CHECK(b[12] == (1234 & 0xff) && b[13] == (1234 >> 8) && b[14] == 0 && b[15] == 0);

  molt__frame_hdr h;
  char err[256];
  CHECK_EQ(molt__proto_decode_hdr(b, MOLT__FRAME_REQUEST, &h, err, sizeof err), 0);
  CHECK_EQ(h.magic, MOLT__PROTO_MAGIC);
  CHECK_EQ(h.version, 1);
  CHECK_EQ(h.kind, MOLT__OP_APPLY);
  CHECK_EQ(h.status, 0);
  CHECK_EQ(h.length, 1234);

  /* Negative statuses survive the trip (two's complement on the wire). */
  for (int code = MOLT__ERRNO_MIN; code <= 0; code++) {
    hdr_bytes(b, MOLT__PROTO_MAGIC, 1, 0, code, 7);
    CHECK_EQ(molt__proto_decode_hdr(b, MOLT__FRAME_RESPONSE, &h, err, sizeof err), 0);
    CHECK_EQ(h.status, code);
  }
  hdr_bytes(b, MOLT__PROTO_MAGIC, 1, 0, INT32_MIN, 0);
  CHECK_EQ(molt__proto_decode_hdr(b, MOLT__FRAME_RESPONSE, &h, err, sizeof err), 0);
  CHECK_EQ(h.status, INT32_MIN);
  /* Every op is accepted in a request; the names exist. */
  for (unsigned op = MOLT__OP_STATUS; op <= MOLT__OP_LOG; op++) {
    CHECK_EQ(decode(MOLT__FRAME_REQUEST, MOLT__PROTO_MAGIC, 1, (uint16_t)op, 0, 0), 0);
    CHECK(molt__op_find(op) != NULL && molt__op_find(op)->name != NULL);
  }
}

static void test_header_malformed(void) {
  const molt__frame_type RQ = MOLT__FRAME_REQUEST, RS = MOLT__FRAME_RESPONSE;
  const uint32_t M = MOLT__PROTO_MAGIC;
  /* bad magic, also when everything else is wrong too */
  CHECK_EQ(decode(RQ, 0x4d4f4c54u, 1, 1, 0, 0), MOLT_EPROTO);
  CHECK_EQ(decode(RQ, 0, 0, 0, 0, 0), MOLT_EPROTO);
  CHECK_EQ(decode(RS, M ^ 1, 1, 0, 0, 0), MOLT_EPROTO);
  CHECK_EQ(decode(RQ, 0xffffffffu, 2, 99, 5, 0xffffffffu), MOLT_EPROTO);
  /* bad version: EVERSION, even with a future op */
  CHECK_EQ(decode(RQ, M, 0, 1, 0, 0), MOLT_EVERSION);
  CHECK_EQ(decode(RQ, M, 2, 1, 0, 0), MOLT_EVERSION);
  CHECK_EQ(decode(RQ, M, 2, 77, 0, 0), MOLT_EVERSION);
  CHECK_EQ(decode(RS, M, 0xffff, 0, 0, 0), MOLT_EVERSION);
  /* bad op */
  CHECK_EQ(decode(RQ, M, 1, 0, 0, 0), MOLT_EPROTO);
  CHECK_EQ(decode(RQ, M, 1, MOLT__OP_END, 0, 0), MOLT_EPROTO);
  CHECK_EQ(decode(RQ, M, 1, 0xffff, 0, 0), MOLT_EPROTO);
  /* request with a status, response with a kind or a positive status */
  CHECK_EQ(decode(RQ, M, 1, 1, -1, 0), MOLT_EPROTO);
  CHECK_EQ(decode(RS, M, 1, 1, 0, 0), MOLT_EPROTO);
  CHECK_EQ(decode(RS, M, 1, 0, 1, 0), MOLT_EPROTO);
  /* lengths: at the limit fine, one past it or huge rejected */
  CHECK_EQ(decode(RQ, M, 1, 1, 0, MOLT__PROTO_MAX_REQUEST), 0);
  CHECK_EQ(decode(RQ, M, 1, 1, 0, MOLT__PROTO_MAX_REQUEST + 1), MOLT_EPROTO);
  CHECK_EQ(decode(RQ, M, 1, 1, 0, 0xffffffffu), MOLT_EPROTO);
  CHECK_EQ(decode(RS, M, 1, 0, 0, MOLT__PROTO_MAX_RESPONSE), 0);
  CHECK_EQ(decode(RS, M, 1, 0, 0, MOLT__PROTO_MAX_RESPONSE + 1), MOLT_EPROTO);
  CHECK_EQ(decode(RS, M, 1, 0, 0, 0xffffffffu), MOLT_EPROTO);
}

static int parse(const char *s, size_t len, size_t max, molt__records *r) {
  char err[256] = "";
  int rc = molt__tsv_parse(s, len, max, r, err, sizeof err);
  if (rc != 0) {
    CHECK(err[0] != '\0');
    CHECK(r->count == 0 && r->recs == NULL && r->text == NULL);
  }
  return rc;
}

#define PARSE(lit, r) parse((lit), sizeof(lit) - 1, 0, (r))

static void test_tsv_roundtrip(void) {
  static const char *const nasty[] = {
      "",   "plain", "tab\there", "new\nline",  "back\\slash", "\\t",     "\\\\n\t\n\\",
      "\t", "\n",    "\\",        "trailing\\", "ünïcödé ✓",   "a\tb\tc", "\x01\x7f\xff"};
  const size_t n = sizeof nasty / sizeof nasty[0];

  /* Written by the runtime's writer, read by our parser: identical. */
  molt__buf b;
  molt__buf_init(&b);
  for (size_t i = 0; i < n; i++) {
    const char *f[3] = {"key", nasty[i], nasty[(i + 3) % n]};
    molt__buf_record(&b, 3, f);
  }
  molt__buf_record(&b, 1, (const char *const[]){"single"});
  CHECK(!b.oom);
  molt__records r;
  CHECK_EQ(parse(b.data, b.len, 0, &r), 0);
  CHECK_EQ(r.count, n + 1);
  for (size_t i = 0; i < n && i < r.count; i++) {
    CHECK_EQ(r.recs[i].nfields, 3);
    CHECK_STR(r.recs[i].fields[0], "key");
    CHECK_STR(r.recs[i].fields[1], nasty[i]);
    CHECK_STR(r.recs[i].fields[2], nasty[(i + 3) % n]);
  }
  CHECK_EQ(r.recs[n].nfields, 1);
  CHECK_STR(molt__tsv_field(&r.recs[n], 0), "single");
  CHECK_STR(molt__tsv_field(&r.recs[n], 1), ""); /* absent field */
  CHECK_STR(molt__tsv_field(NULL, 0), "");
  molt__tsv_free(&r);
  molt__tsv_free(&r); /* idempotent */

  /* molt__tsv_escape produces what molt__buf_record produces. */
  for (size_t i = 0; i < n; i++) {
    molt__buf a, c;
    molt__buf_init(&a);
    molt__buf_init(&c);
    molt__tsv_escape(&a, nasty[i], strlen(nasty[i]));
    molt__buf_add(&a, "\n", 1);
    molt__buf_record(&c, 1, &nasty[i]);
    CHECK_EQ(a.len, c.len);
    CHECK(a.len == c.len && memcmp(a.data, c.data, a.len) == 0);
    /* and unescape inverts it */
    long k = molt__tsv_unescape(a.data, a.len - 1);
    CHECK_EQ(k, (long)strlen(nasty[i]));
    CHECK(k >= 0 && memcmp(a.data, nasty[i], (size_t)k) == 0);
    molt__buf_free(&a);
    molt__buf_free(&c);
  }
  molt__buf_free(&b);
}

static void test_tsv_shapes(void) {
  molt__records r;
  /* empty payload: no records */
  CHECK_EQ(parse("", 0, 0, &r), 0);
  CHECK_EQ(r.count, 0);
  CHECK(molt__tsv_find(&r, "x") == NULL);
  molt__tsv_free(&r);
  CHECK_EQ(parse(NULL, 0, 0, &r), 0);
  /* empty line: one empty field; empty fields around tabs are kept */
  CHECK_EQ(PARSE("\n\t\na\t\t\n", &r), 0);
  CHECK_EQ(r.count, 3);
  CHECK_EQ(r.recs[0].nfields, 1);
  CHECK_STR(r.recs[0].fields[0], "");
  CHECK_EQ(r.recs[1].nfields, 2);
  CHECK_EQ(r.recs[2].nfields, 3);
  CHECK_STR(r.recs[2].fields[0], "a");
  CHECK_STR(r.recs[2].fields[2], "");
  molt__tsv_free(&r);
  /* find returns the first match */
  CHECK_EQ(PARSE("policy\tlocal\npath\t/a\npolicy\tglobal\n", &r), 0);
  CHECK_STR(molt__tsv_field(molt__tsv_find(&r, "policy"), 1), "local");
  CHECK_STR(molt__tsv_field(molt__tsv_find(&r, "path"), 1), "/a");
  CHECK(molt__tsv_find(&r, "pat") == NULL);
  molt__tsv_free(&r);
  /* exactly MAX_FIELDS fields is fine */
  molt__buf b;
  molt__buf_init(&b);
  for (unsigned i = 0; i < MOLT__PROTO_MAX_FIELDS; i++)
    molt__buf_add(&b, i ? "\tf" : "f", i ? 2 : 1);
  molt__buf_add(&b, "\n", 1);
  CHECK_EQ(parse(b.data, b.len, 0, &r), 0);
  CHECK_EQ(r.recs[0].nfields, MOLT__PROTO_MAX_FIELDS);
  molt__tsv_free(&r);
  /* one more is not */
  b.len--;
  molt__buf_add(&b, "\tx\n", 3);
  CHECK_EQ(parse(b.data, b.len, 0, &r), MOLT_EPROTO);
  molt__buf_free(&b);
  /* record bound: default 4096, and the caller's */
  molt__buf_init(&b);
  for (unsigned i = 0; i < MOLT__PROTO_MAX_RECORDS; i++)
    molt__buf_add(&b, "r\n", 2);
  CHECK_EQ(parse(b.data, b.len, 0, &r), 0);
  CHECK_EQ(r.count, MOLT__PROTO_MAX_RECORDS);
  molt__tsv_free(&r);
  molt__buf_add(&b, "r\n", 2);
  CHECK_EQ(parse(b.data, b.len, 0, &r), MOLT_EPROTO);
  CHECK_EQ(parse(b.data, b.len, MOLT__PROTO_MAX_RECORDS + 1, &r), 0);
  molt__tsv_free(&r);
  CHECK_EQ(parse(b.data, b.len, 3, &r), MOLT_EPROTO);
  molt__buf_free(&b);
}

static void test_tsv_malformed(void) {
  molt__records r;
  /* unterminated record */
  CHECK_EQ(PARSE("a", &r), MOLT_EPROTO);
  CHECK_EQ(PARSE("a\tb\nc\td", &r), MOLT_EPROTO);
  CHECK_EQ(PARSE("a\t", &r), MOLT_EPROTO);
  /* embedded NUL, anywhere */
  CHECK_EQ(PARSE("a\0b\n", &r), MOLT_EPROTO);
  CHECK_EQ(PARSE("\0\n", &r), MOLT_EPROTO);
  CHECK_EQ(PARSE("ab\n\0", &r), MOLT_EPROTO);
  /* bad escapes */
  CHECK_EQ(PARSE("a\\x\n", &r), MOLT_EPROTO);
  CHECK_EQ(PARSE("a\\\n", &r), MOLT_EPROTO);    /* backslash before newline */
  CHECK_EQ(PARSE("a\\\tb\n", &r), MOLT_EPROTO); /* backslash before tab */
  CHECK_EQ(PARSE("ok\n\\0\n", &r), MOLT_EPROTO);
  CHECK_EQ(PARSE("\\r\n", &r), MOLT_EPROTO);
  /* but escaped backslashes next to separators are fine */
  CHECK_EQ(PARSE("a\\\\\t\\\\\n", &r), 0);
  CHECK_STR(r.recs[0].fields[0], "a\\");
  CHECK_STR(r.recs[0].fields[1], "\\");
  molt__tsv_free(&r);
  /* too many fields, many times over */
  char many[1000];
  memset(many, '\t', sizeof many);
  many[sizeof many - 1] = '\n';
  CHECK_EQ(parse(many, sizeof many, 0, &r), MOLT_EPROTO);

  /* unescape directly */
  char s1[] = "a\\tb\\nc\\\\d";
  CHECK_EQ(molt__tsv_unescape(s1, strlen(s1)), 7);
  CHECK(memcmp(s1, "a\tb\nc\\d", 7) == 0 && s1[7] == '\0');
  char s2[] = "x\\";
  CHECK_EQ(molt__tsv_unescape(s2, 2), MOLT_EPROTO);
  char s3[] = "x\\q";
  CHECK_EQ(molt__tsv_unescape(s3, 3), MOLT_EPROTO);
  char s4[] = "plain";
  CHECK_EQ(molt__tsv_unescape(s4, 5), 5);
  CHECK_EQ(molt__tsv_unescape(s4, 0), 0);
}

/* ---- I/O -------------------------------------------------------------- */

static void pair(int sv[2]) {
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    perror("socketpair");
    exit(2);
  }
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void test_io(void) {
  int sv[2];
  char err[256];
  molt__frame_hdr h;
  char *payload;

  /* round trip of a full message */
  pair(sv);
  molt__buf b;
  molt__buf_init(&b);
  molt__buf_record(&b, 2, (const char *const[]){"path", "/x/y.so"});
  molt__frame_hdr out = {MOLT__PROTO_MAGIC, 1, MOLT__OP_APPLY, 0, (uint32_t)b.len};
  CHECK_EQ(molt__proto_send(sv[0], &out, b.data, molt__proto_deadline(1000)), 0);
  CHECK_EQ(molt__proto_recv(sv[1], MOLT__FRAME_REQUEST, &h, &payload,
                            molt__proto_deadline(1000), err, sizeof err),
           0);
  CHECK_EQ(h.kind, MOLT__OP_APPLY);
  CHECK_EQ(h.length, b.len);
  CHECK(payload != NULL && memcmp(payload, b.data, b.len) == 0 && payload[b.len] == '\0');
  free(payload);
  /* empty payload: NULL */
  out.length = 0;
  out.kind = MOLT__OP_STATUS;
  CHECK_EQ(molt__proto_send(sv[0], &out, NULL, molt__proto_deadline(1000)), 0);
  CHECK_EQ(molt__proto_recv(sv[1], MOLT__FRAME_REQUEST, &h, &payload,
                            molt__proto_deadline(1000), err, sizeof err),
           0);
  CHECK(payload == NULL);
  /* a big response (1 MiB) through a small socket buffer: needs both
   * sides to make progress, so the writer runs in a child */
  molt__buf_free(&b);
  molt__buf_init(&b);
  for (int i = 0; i < 65536; i++)
    molt__buf_add(&b, "0123456789abcde\n", 16);
  pid_t child = fork();
  if (child == 0) {
    molt__frame_hdr big = {MOLT__PROTO_MAGIC, 1, 0, -9, (uint32_t)b.len};
    _exit(molt__proto_send(sv[0], &big, b.data, molt__proto_deadline(5000)) == 0 ? 0 : 1);
  }
  CHECK_EQ(molt__proto_recv(sv[1], MOLT__FRAME_RESPONSE, &h, &payload,
                            molt__proto_deadline(5000), err, sizeof err),
           0);
  CHECK_EQ(h.status, -9);
  CHECK(payload != NULL && h.length == b.len && memcmp(payload, b.data, b.len) == 0);
  free(payload);
  int ws;
  waitpid(child, &ws, 0);
  CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  molt__buf_free(&b);
  close(sv[0]);
  close(sv[1]);

  /* peer closes without a byte: ECONNECT */
  pair(sv);
  close(sv[0]);
  CHECK_EQ(molt__proto_recv(sv[1], MOLT__FRAME_REQUEST, &h, &payload,
                            molt__proto_deadline(1000), err, sizeof err),
           MOLT_ECONNECT);
  CHECK(payload == NULL);
  close(sv[1]);

  /* truncated header */
  pair(sv);
  unsigned char hb[MOLT__PROTO_HDR_SIZE];
  hdr_bytes(hb, MOLT__PROTO_MAGIC, 1, 1, 0, 10);
  CHECK_EQ(write(sv[0], hb, 9), 9);
  close(sv[0]);
  CHECK_EQ(molt__proto_recv(sv[1], MOLT__FRAME_REQUEST, &h, &payload,
                            molt__proto_deadline(1000), err, sizeof err),
           MOLT_EPROTO);
  CHECK(strstr(err, "truncated header") != NULL);
  close(sv[1]);

  /* truncated payload */
  pair(sv);
  CHECK_EQ(write(sv[0], hb, sizeof hb), (ssize_t)sizeof hb);
  CHECK_EQ(write(sv[0], "abc", 3), 3);
  close(sv[0]);
  CHECK_EQ(molt__proto_recv(sv[1], MOLT__FRAME_REQUEST, &h, &payload,
                            molt__proto_deadline(1000), err, sizeof err),
           MOLT_EPROTO);
  CHECK(strstr(err, "truncated payload (3 of 10") != NULL);
  CHECK(payload == NULL);
  close(sv[1]);

  /* bad magic / version / huge length on the wire: rejected before any
   * payload is read or allocated */
  pair(sv);
  hdr_bytes(hb, MOLT__PROTO_MAGIC, 1, 1, 0, 0xfffffff0u);
  CHECK_EQ(write(sv[0], hb, sizeof hb), (ssize_t)sizeof hb);
  CHECK_EQ(molt__proto_recv(sv[1], MOLT__FRAME_REQUEST, &h, &payload,
                            molt__proto_deadline(1000), err, sizeof err),
           MOLT_EPROTO);
  hdr_bytes(hb, MOLT__PROTO_MAGIC, 3, 1, 0, 0);
  CHECK_EQ(write(sv[0], hb, sizeof hb), (ssize_t)sizeof hb);
  CHECK_EQ(molt__proto_recv(sv[1], MOLT__FRAME_REQUEST, &h, &payload,
                            molt__proto_deadline(1000), err, sizeof err),
           MOLT_EVERSION);
  CHECK_EQ(h.version, 3);
  CHECK_EQ(write(sv[0], "GET / HTTP/1.0\r\n", 16), 16);
  CHECK_EQ(molt__proto_recv(sv[1], MOLT__FRAME_REQUEST, &h, &payload,
                            molt__proto_deadline(1000), err, sizeof err),
           MOLT_EPROTO);
  close(sv[0]);
  close(sv[1]);

  /* silent peer: the deadline holds (200 ms, allow generous slack) */
  pair(sv);
  uint64_t t0 = now_ms();
  CHECK_EQ(molt__proto_recv(sv[1], MOLT__FRAME_REQUEST, &h, &payload,
                            molt__proto_deadline(200), err, sizeof err),
           MOLT_ETIMEDOUT);
  uint64_t dt = now_ms() - t0;
  CHECK(dt >= 190 && dt < 1500);
  /* a deadline already in the past fails at once, without data */
  CHECK_EQ(molt__proto_read_full(sv[1], hb, 1, molt__proto_deadline(0), NULL),
           MOLT_ETIMEDOUT);
  /* writer against a full buffer: times out instead of blocking */
  char junk[65536];
  memset(junk, 'x', sizeof junk);
  int rc = 0;
  t0 = now_ms();
  for (int i = 0; i < 1000 && rc == 0; i++)
    rc = molt__proto_write_full(sv[0], junk, sizeof junk, molt__proto_deadline(100));
  CHECK_EQ(rc, MOLT_ETIMEDOUT);
  CHECK(now_ms() - t0 < 3000);
  close(sv[0]);
  close(sv[1]);

  /* writing to a vanished peer: an error, not SIGPIPE */
  pair(sv);
  close(sv[1]);
  CHECK_EQ(molt__proto_write_full(sv[0], "x", 1, molt__proto_deadline(100)), MOLT_EIO);
  CHECK(errno == EPIPE);
  close(sv[0]);

  /* not a socket: EIO, not a hang */
  int p[2];
  CHECK_EQ(pipe(p), 0);
  CHECK_EQ(molt__proto_read_full(p[0], hb, 1, molt__proto_deadline(100), NULL), MOLT_EIO);
  close(p[0]);
  close(p[1]);
}

static void test_sockaddr(void) {
  struct sockaddr_un sa;
  socklen_t len = molt__proto_sockaddr(1234, &sa);
  CHECK_EQ(sa.sun_family, AF_UNIX);
  CHECK_EQ(sa.sun_path[0], 0);
  CHECK(memcmp(sa.sun_path + 1, "molt.1234", 9) == 0);
  CHECK_EQ(len, offsetof(struct sockaddr_un, sun_path) + 10);
  len = molt__proto_sockaddr(2147483647, &sa);
  CHECK(memcmp(sa.sun_path + 1, "molt.2147483647", 15) == 0);
  CHECK_EQ(len, offsetof(struct sockaddr_un, sun_path) + 16);
}

/* The shadow request's retries: encoded only when asked for (so that a
 * request without them is what older runtimes read), decoded back, out of
 * range or malformed values refused with the reason. */
static void test_request_retries(void) {
  static molt__request req, got;
  memset(&req, 0, sizeof req);
  req.op = MOLT__OP_SHADOW;
  snprintf(req.path, sizeof req.path, "/x/new.so");
  req.timeout_ms = 5000;
  req.retry_delay_ms = 250;
  char err[256];
  molt__records r;
  for (int retries = 0; retries <= 3; retries += 3) {
    req.retries = retries;
    molt__buf b;
    molt__buf_init(&b);
    molt__request_encode(&req, &b);
    CHECK((strstr(b.data, "retries\t") != NULL) == (retries > 0));
    CHECK((strstr(b.data, "retry_delay_ms\t250\n") != NULL) == (retries > 0));
    CHECK_EQ(parse(b.data, b.len, 0, &r), 0);
    CHECK_EQ(molt__request_decode(MOLT__OP_SHADOW, &r, &got, err, sizeof err), 0);
    CHECK_EQ(got.retries, retries);
    CHECK_EQ(got.retry_delay_ms, retries > 0 ? 250 : -1); /* -1: the default */
    CHECK_EQ(got.timeout_ms, 5000);
    molt__tsv_free(&r);
    molt__buf_free(&b);
  }
  static const struct {
    const char *text;
    int rc;
    const char *why;
  } bad[] = {
      {"path\t/x\nretries\t-1\n", MOLT_EINVAL,
       "retries -1 is out of range: give 0 to 100"},
      {"path\t/x\nretries\t101\n", MOLT_EINVAL, "retries 101 is out of range"},
      {"path\t/x\nretries\tmany\n", MOLT_EPROTO, "retries 'many' is not an integer"},
      {"path\t/x\nretries\t1\nretry_delay_ms\t-5\n", MOLT_EINVAL,
       "retry_delay_ms -5 is out of range: give 0 to 3600000"},
      {"path\t/x\nretries\t1\nretry_delay_ms\t3600001\n", MOLT_EINVAL,
       "retry_delay_ms 3600001 is out of range"},
      {"path\t/x\nretry_delay_ms\t1.5\n", MOLT_EPROTO,
       "retry_delay_ms '1.5' is not an integer"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_EQ(parse(bad[i].text, strlen(bad[i].text), 0, &r), 0);
    err[0] = '\0';
    CHECK_EQ(molt__request_decode(MOLT__OP_SHADOW, &r, &got, err, sizeof err), bad[i].rc);
    CHECK(strstr(err, bad[i].why) != NULL);
    molt__tsv_free(&r);
  }
  /* Operations without retries ignore the records. */
  const char *upd = "path\t/x\nretries\t-1\n";
  CHECK_EQ(parse(upd, strlen(upd), 0, &r), 0);
  CHECK_EQ(molt__request_decode(MOLT__OP_UPDATE, &r, &got, err, sizeof err), 0);
  CHECK_EQ(got.retries, 0);
  molt__tsv_free(&r);
}

int main(void) {
  test_header();
  test_header_malformed();
  test_tsv_roundtrip();
  test_tsv_shapes();
  test_tsv_malformed();
  test_io();
  test_sockaddr();
  test_request_retries();
  if (failures) {
    fprintf(stderr, "test_protocol: %d check(s) failed\n", failures);
    return 1;
  }
  printf("test_protocol: all checks passed\n");
  return 0;
}
