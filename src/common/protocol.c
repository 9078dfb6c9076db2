/*
 * protocol.c -- the control protocol (see protocol.h, docs/protocol.md): the
 * table of operations, requests, framing and the TSV codec.
 *
 * Everything that parses bytes from the other side of the socket lives here
 * so it can be unit-tested and fuzzed on its own (tests/protocol/).  The
 * parser trusts nothing: every length is checked against a bound before it
 * is used, and memory use is proportional to the input, which the callers
 * have already bounded (64 KiB requests, 16 MiB responses).
 */
#include "common/common.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- operations ------------------------------------------------------------ */

static const molt__op_info ops[] = {
#define MOLT__OP_INFO(NAME, name, code, flags, modes, file, summary)                     \
  {MOLT__OP_##NAME, #name, (flags), (modes), (file), (summary)},
    MOLT__OPS(MOLT__OP_INFO)
#undef MOLT__OP_INFO
};

const molt__op_info *molt__op_find(unsigned op) {
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    if ((unsigned)ops[i].op == op)
      return &ops[i];
  return NULL;
}

const molt__op_info *molt__op_all(size_t *n) {
  *n = sizeof ops / sizeof ops[0];
  return ops;
}

/* ---- requests ---------------------------------------------------------------- */

const char *molt__policy_name(molt_policy_t p) {
  switch (p) {
  case MOLT_POLICY_IMMEDIATE:
    return "immediate";
  case MOLT_POLICY_LOCAL:
    return "local";
  case MOLT_POLICY_GLOBAL:
    return "global";
  }
  return NULL;
}

bool molt__policy_parse(const char *s, molt_policy_t *out) {
  static const molt_policy_t all[] = {MOLT_POLICY_IMMEDIATE, MOLT_POLICY_LOCAL,
                                      MOLT_POLICY_GLOBAL};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (strcmp(s, molt__policy_name(all[i])) == 0) {
      *out = all[i];
      return true;
    }
  return false;
}

void molt__request_encode(const molt__request *req, molt__buf *out) {
  const molt__op_info *oi = molt__op_find(req->op);
  if (!oi)
    return;
  if (oi->file)
    molt__buf_pair(out, "path", req->path);
  if (oi->flags & MOLT__OPF_INTERIOR)
    molt__buf_pair(out, "check_interior", req->check_interior ? "1" : "0");
  if (oi->flags & MOLT__OPF_POLICY) {
    const char *p = molt__policy_name(req->policy);
    molt__buf_pair(out, "policy", p ? p : "?");
  }
  if (oi->flags & MOLT__OPF_TIMEOUT) {
    char t[16];
    snprintf(t, sizeof t, "%d", req->timeout_ms < 0 ? -1 : req->timeout_ms);
    molt__buf_pair(out, "timeout_ms", t);
  }
  if ((oi->flags & MOLT__OPF_CALLBACKS) && req->callback_timeout_ms > 0) {
    char t[16];
    snprintf(t, sizeof t, "%d", req->callback_timeout_ms);
    molt__buf_pair(out, "callback_timeout_ms", t);
  }
  if ((oi->flags & MOLT__OPF_RULES) && req->rules_len > 0) {
    molt__buf_pair(out, "rules_name", req->rules_name);
    /* by hand: the text is counted, not NUL-terminated */
    molt__buf_add(out, "rules\t", 6);
    molt__tsv_escape(out, req->rules,
                     req->rules_len < sizeof req->rules ? req->rules_len
                                                        : sizeof req->rules);
    molt__buf_add(out, "\n", 1);
  }
  if ((oi->flags & MOLT__OPF_RETRIES) && req->retries > 0) {
    char t[16];
    snprintf(t, sizeof t, "%d", req->retries);
    molt__buf_pair(out, "retries", t);
    if (req->retry_delay_ms >= 0) {
      snprintf(t, sizeof t, "%d", req->retry_delay_ms);
      molt__buf_pair(out, "retry_delay_ms", t);
    }
  }
}

/* Parses a decimal int field (optional leading '-').  false if it is not
 * one or does not fit. */
static bool parse_int(const char *s, int *out) {
  bool neg = *s == '-';
  if (neg)
    s++;
  if (*s == '\0')
    return false;
  long long v = 0;
  for (; *s != '\0'; s++) {
    if (*s < '0' || *s > '9')
      return false;
    v = v * 10 + (*s - '0');
    if (v > (long long)INT32_MAX + 1)
      return false;
  }
  if (neg)
    v = -v;
  if (v < INT32_MIN || v > INT32_MAX)
    return false;
  *out = (int)v;
  return true;
}

int molt__request_decode(unsigned op, const molt__records *recs, molt__request *req,
                         char *err, size_t errlen) {
  memset(req, 0, sizeof *req);
  req->op = (molt__op)op;
  req->policy = MOLT_POLICY_IMMEDIATE;
  req->timeout_ms = -1; /* the runtime's default */
  req->retry_delay_ms = -1;
  const molt__op_info *oi = molt__op_find(op);
  if (!oi)
    return 0;

  /* An update has no policy: it always waits at the update points. */
  const molt__record *r =
      oi->flags & MOLT__OPF_POLICY ? molt__tsv_find(recs, "policy") : NULL;
  if (r != NULL && !molt__policy_parse(molt__tsv_field(r, 1), &req->policy)) {
    molt__errmsg(err, errlen,
                 "unknown update policy '%.40s' (use immediate, local or global)",
                 molt__tsv_field(r, 1));
    return MOLT_EPOLICY;
  }
  r = oi->flags & MOLT__OPF_TIMEOUT ? molt__tsv_find(recs, "timeout_ms") : NULL;
  if (r != NULL) {
    int t;
    if (!parse_int(molt__tsv_field(r, 1), &t)) {
      molt__errmsg(err, errlen, "timeout_ms '%.40s' is not an integer",
                   molt__tsv_field(r, 1));
      return MOLT_EPROTO;
    }
    req->timeout_ms = t < 0 ? -1 : t;
  }
  r = oi->flags & MOLT__OPF_CALLBACKS ? molt__tsv_find(recs, "callback_timeout_ms")
                                      : NULL;
  if (r != NULL) {
    int t;
    if (!parse_int(molt__tsv_field(r, 1), &t)) {
      molt__errmsg(err, errlen, "callback_timeout_ms '%.40s' is not an integer",
                   molt__tsv_field(r, 1));
      return MOLT_EPROTO;
    }
    req->callback_timeout_ms = t > 0 ? t : 0;
  }
  r = oi->flags & MOLT__OPF_INTERIOR ? molt__tsv_find(recs, "check_interior") : NULL;
  if (r != NULL) {
    const char *v = molt__tsv_field(r, 1);
    if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0) {
      molt__errmsg(err, errlen, "check_interior '%.40s' is not 0 or 1", v);
      return MOLT_EPROTO;
    }
    req->check_interior = v[0] == '1';
  }
  r = oi->flags & MOLT__OPF_RETRIES ? molt__tsv_find(recs, "retries") : NULL;
  if (r != NULL) {
    int n;
    if (!parse_int(molt__tsv_field(r, 1), &n)) {
      molt__errmsg(err, errlen, "retries '%.40s' is not an integer",
                   molt__tsv_field(r, 1));
      return MOLT_EPROTO;
    }
    if (n < 0 || n > MOLT__MAX_RETRIES) {
      molt__errmsg(err, errlen, "retries %d is out of range: give 0 to %d", n,
                   MOLT__MAX_RETRIES);
      return MOLT_EINVAL;
    }
    req->retries = n;
  }
  r = oi->flags & MOLT__OPF_RETRIES ? molt__tsv_find(recs, "retry_delay_ms") : NULL;
  if (r != NULL) {
    int ms;
    if (!parse_int(molt__tsv_field(r, 1), &ms)) {
      molt__errmsg(err, errlen, "retry_delay_ms '%.40s' is not an integer",
                   molt__tsv_field(r, 1));
      return MOLT_EPROTO;
    }
    if (ms < 0 || ms > MOLT__MAX_RETRY_DELAY_MS) {
      molt__errmsg(err, errlen, "retry_delay_ms %d is out of range: give 0 to %d", ms,
                   MOLT__MAX_RETRY_DELAY_MS);
      return MOLT_EINVAL;
    }
    req->retry_delay_ms = ms;
  }
  r = oi->flags & MOLT__OPF_RULES ? molt__tsv_find(recs, "rules") : NULL;
  if (r != NULL) {
    const char *text = molt__tsv_field(r, 1);
    size_t n = strlen(text);
    if (n > sizeof req->rules) {
      molt__errmsg(err, errlen, "the rules have %zu bytes; at most %zu", n,
                   sizeof req->rules);
      return MOLT_EINVAL;
    }
    memcpy(req->rules, text, n);
    req->rules_len = n;
    const molt__record *nr = molt__tsv_find(recs, "rules_name");
    snprintf(req->rules_name, sizeof req->rules_name, "%s",
             nr ? molt__tsv_field(nr, 1) : "rules");
  }
  if (!oi->file)
    return 0;
  r = molt__tsv_find(recs, "path");
  if (r == NULL) {
    molt__errmsg(err, errlen, "%s request without a path record", oi->name);
    return MOLT_EPROTO;
  }
  const char *path = molt__tsv_field(r, 1);
  /* The process's working directory is not the client's, so a relative
   * path would name some other file: the CLI always sends realpath(). */
  if (path[0] != '/') {
    molt__errmsg(err, errlen, "%s path '%.200s' is not absolute", oi->file, path);
    return MOLT_EINVAL;
  }
  size_t n = strlen(path);
  if (n >= sizeof req->path) {
    molt__errmsg(err, errlen, "%s path is longer than %zu bytes", oi->file,
                 sizeof req->path - 1);
    return MOLT_EINVAL;
  }
  memcpy(req->path, path, n + 1);
  return 0;
}

/* ---- header ------------------------------------------------------------ */

static void put16(unsigned char *p, uint16_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
}

static void put32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
  p[2] = (unsigned char)(v >> 16);
  p[3] = (unsigned char)(v >> 24);
}

static uint16_t get16(const unsigned char *p) {
  return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static uint32_t get32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

void molt__proto_encode_hdr(const molt__frame_hdr *h,
                            unsigned char out[MOLT__PROTO_HDR_SIZE]) {
  put32(out, h->magic);
  put16(out + 4, h->version);
  put16(out + 6, h->kind);
  /* Two's complement by definition of the wire format; the conversion of a
   * negative int32_t to uint32_t is well defined (modulo 2^32). */
  put32(out + 8, (uint32_t)h->status);
  put32(out + 12, h->length);
}

int molt__proto_decode_hdr(const unsigned char in[MOLT__PROTO_HDR_SIZE],
                           molt__frame_type type, molt__frame_hdr *h, char *err,
                           size_t errlen) {
  h->magic = get32(in);
  h->version = get16(in + 4);
  h->kind = get16(in + 6);
  uint32_t st = get32(in + 8);
  /* Converting back without implementation-defined behaviour. */
  h->status = st <= INT32_MAX ? (int32_t)st : -(int32_t)(~st) - 1;
  h->length = get32(in + 12);

  if (h->magic != MOLT__PROTO_MAGIC) {
    molt__errmsg(err, errlen, "bad magic 0x%08x (not a molt control message)",
                 (unsigned)h->magic);
    return MOLT_EPROTO;
  }
  if (h->version != MOLT__PROTO_VERSION) {
    molt__errmsg(err, errlen,
                 "peer speaks control protocol version %u, this side speaks "
                 "version %u",
                 (unsigned)h->version, MOLT__PROTO_VERSION);
    return MOLT_EVERSION;
  }
  if (type == MOLT__FRAME_REQUEST) {
    if (molt__op_find(h->kind) == NULL) {
      molt__errmsg(err, errlen, "unknown request op %u", (unsigned)h->kind);
      return MOLT_EPROTO;
    }
    if (h->status != 0) {
      molt__errmsg(err, errlen, "request carries status %d (must be 0)", (int)h->status);
      return MOLT_EPROTO;
    }
    if (h->length > MOLT__PROTO_MAX_REQUEST) {
      molt__errmsg(err, errlen, "request payload of %u bytes exceeds the limit of %u",
                   (unsigned)h->length, MOLT__PROTO_MAX_REQUEST);
      return MOLT_EPROTO;
    }
  } else {
    if (h->kind != 0) {
      molt__errmsg(err, errlen, "response has kind %u (must be 0)", (unsigned)h->kind);
      return MOLT_EPROTO;
    }
    /* Any negative status is accepted: a newer runtime may know codes this
     * CLI does not; molt_strerror() then says "unknown error". */
    if (h->status > 0) {
      molt__errmsg(err, errlen, "response carries positive status %d", (int)h->status);
      return MOLT_EPROTO;
    }
    if (h->length > MOLT__PROTO_MAX_RESPONSE) {
      molt__errmsg(err, errlen, "response payload of %u bytes exceeds the limit of %u",
                   (unsigned)h->length, MOLT__PROTO_MAX_RESPONSE);
      return MOLT_EPROTO;
    }
  }
  return 0;
}

/* ---- TSV ----------------------------------------------------------------- */

void molt__tsv_escape(molt__buf *b, const char *s, size_t n) {
  size_t run = 0; /* start of the pending run of bytes that need no escape */
  for (size_t i = 0; i < n; i++) {
    const char *rep = NULL;
    switch (s[i]) {
    case '\\':
      rep = "\\\\";
      break;
    case '\t':
      rep = "\\t";
      break;
    case '\n':
      rep = "\\n";
      break;
    default:
      continue;
    }
    molt__buf_add(b, s + run, i - run);
    molt__buf_add(b, rep, 2);
    run = i + 1;
  }
  molt__buf_add(b, s + run, n - run);
}

long molt__tsv_unescape(char *s, size_t n) {
  size_t w = 0;
  for (size_t r = 0; r < n; r++) {
    char c = s[r];
    if (c == '\\') {
      if (r + 1 >= n)
        return MOLT_EPROTO; /* lone backslash at the end of the field */
      switch (s[++r]) {
      case '\\':
        c = '\\';
        break;
      case 't':
        c = '\t';
        break;
      case 'n':
        c = '\n';
        break;
      default:
        return MOLT_EPROTO;
      }
    }
    s[w++] = c;
  }
  /* w < n whenever an escape was seen; otherwise s[n] is the caller's
   * business (the parser always leaves room for a terminator there). */
  if (w < n)
    s[w] = '\0';
  return (long)w;
}

void molt__tsv_free(molt__records *r) {
  if (r == NULL)
    return;
  free(r->recs);
  free(r->fieldv);
  free(r->text);
  memset(r, 0, sizeof *r);
}

int molt__tsv_parse(const char *data, size_t len, size_t max_records, molt__records *out,
                    char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (max_records == 0)
    max_records = MOLT__PROTO_MAX_RECORDS;
  if (len == 0)
    return 0;
  if (data == NULL) {
    molt__errmsg(err, errlen, "payload missing");
    return MOLT_EPROTO;
  }

  /* Pass 1: validate the shape and count, so pass 2 allocates exactly and
   * cannot fail half-way through. */
  size_t nrec = 0, nfields = 0, fields_here = 1;
  for (size_t i = 0; i < len; i++) {
    char c = data[i];
    if (c == '\0') {
      molt__errmsg(err, errlen, "NUL byte in payload at offset %zu", i);
      return MOLT_EPROTO;
    }
    if (c == '\t') {
      if (++fields_here > MOLT__PROTO_MAX_FIELDS) {
        molt__errmsg(err, errlen, "record %zu has more than %u fields", nrec + 1,
                     MOLT__PROTO_MAX_FIELDS);
        return MOLT_EPROTO;
      }
    } else if (c == '\n') {
      if (++nrec > max_records) {
        molt__errmsg(err, errlen, "more than %zu records", max_records);
        return MOLT_EPROTO;
      }
      nfields += fields_here;
      fields_here = 1;
    }
  }
  if (data[len - 1] != '\n') {
    molt__errmsg(err, errlen, "last record is not terminated by a newline");
    return MOLT_EPROTO;
  }

  /* len < 16 MiB + 1 and nfields <= len, so none of these overflow. */
  char *text = malloc(len + 1);
  const char **fieldv = malloc(nfields * sizeof *fieldv);
  molt__record *recs = malloc(nrec * sizeof *recs);
  if (text == NULL || fieldv == NULL || recs == NULL) {
    free(text);
    free(fieldv);
    free(recs);
    molt__errmsg(err, errlen, "out of memory parsing %zu bytes", len);
    return MOLT_ENOMEM;
  }
  memcpy(text, data, len);
  text[len] = '\0';

  /* Pass 2: split in place.  Each field is cut at its separator (replaced
   * by NUL) and unescaped in place; unescaping only shrinks, so it never
   * writes past the separator. */
  size_t r = 0, f = 0;
  char *start = text;
  recs[0].fields = fieldv;
  recs[0].nfields = 0;
  for (size_t i = 0; i < len; i++) {
    if (text[i] != '\t' && text[i] != '\n')
      continue;
    bool eol = text[i] == '\n';
    text[i] = '\0';
    size_t flen = (size_t)(text + i - start);
    if (molt__tsv_unescape(start, flen) < 0) {
      molt__errmsg(err, errlen, "bad escape in record %zu field %zu", r + 1,
                   recs[r].nfields + 1);
      free(text);
      free(fieldv);
      free(recs);
      return MOLT_EPROTO;
    }
    fieldv[f++] = start;
    recs[r].nfields++;
    start = text + i + 1;
    if (eol && ++r < nrec) {
      recs[r].fields = fieldv + f;
      recs[r].nfields = 0;
    }
  }
  out->recs = recs;
  out->count = nrec;
  out->text = text;
  out->fieldv = fieldv;
  return 0;
}

const molt__record *molt__tsv_find(const molt__records *r, const char *key) {
  for (size_t i = 0; i < r->count; i++)
    if (strcmp(r->recs[i].fields[0], key) == 0)
      return &r->recs[i];
  return NULL;
}

const char *molt__tsv_field(const molt__record *rec, size_t i) {
  return rec != NULL && i < rec->nfields ? rec->fields[i] : "";
}

/* ---- I/O ------------------------------------------------------------------ */

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t molt__proto_deadline(int64_t ms) {
  if (ms < 0)
    return UINT64_MAX; /* no deadline */
  return mono_ns() + (uint64_t)ms * 1000000u;
}

/* Waits until fd is ready for `events` or the deadline passes.  Returns 0
 * (ready, or an error condition that the next recv/send will report),
 * MOLT_ETIMEDOUT, or MOLT_EIO if poll itself fails. */
static int wait_fd(int fd, short events, uint64_t deadline_ns) {
  for (;;) {
    int ms = -1;
    if (deadline_ns != UINT64_MAX) {
      uint64_t now = mono_ns();
      if (now >= deadline_ns)
        return MOLT_ETIMEDOUT;
      uint64_t left = (deadline_ns - now + 999999u) / 1000000u; /* round up */
      ms = left > INT_MAX ? INT_MAX : (int)left;
    }
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, ms);
    if (n > 0)
      return 0;
    if (n < 0 && errno != EINTR)
      return MOLT_EIO; /* errno says why */
  }
}

/* Whether the guard (if any) lets us touch fd. */
static bool guard_ok(const molt__io_guard *g) {
  if (g == NULL || g->ours(g->arg))
    return true;
  errno = EBADF;
  return false;
}

/* What it takes and closes: protocol.h. */
ssize_t molt__proto_recv_passing(int fd, void *buf, size_t n, int *passed, bool *extra) {
  if (passed == NULL)
    return recv(fd, buf, n, MSG_DONTWAIT);
  union {
    struct cmsghdr h;
    char space[CMSG_SPACE(4 * sizeof(int))];
  } ctl;
  struct iovec iov = {.iov_base = buf, .iov_len = n};
  struct msghdr m = {.msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = ctl.space,
                     .msg_controllen = sizeof ctl.space};
  ssize_t k = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (k < 0)
    return k;
  if (m.msg_flags & MSG_CTRUNC)
    *extra = true; /* the kernel closed what did not fit */
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c != NULL; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    size_t nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < nfds; i++) {
      int got;
      memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
      if (*passed < 0) {
        *passed = got;
      } else {
        close(got);
        *extra = true;
      }
    }
  }
  return k;
}

static int read_full(int fd, void *buf, size_t n, uint64_t deadline_ns, size_t *got,
                     const molt__io_guard *guard) {
  size_t done = 0;
  int rc = 0;
  while (done < n) {
    if (!guard_ok(guard)) {
      rc = MOLT_EIO;
      break;
    }
    /* MSG_DONTWAIT: a blocking recv could outlive the deadline. */
    ssize_t k = recv(fd, (char *)buf + done, n - done, MSG_DONTWAIT);
    if (k > 0) {
      done += (size_t)k;
      continue;
    }
    if (k == 0) {
      rc = MOLT_EPROTO; /* end of stream */
      break;
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      rc = MOLT_EIO;
      break;
    }
    if ((rc = wait_fd(fd, POLLIN, deadline_ns)) != 0)
      break;
  }
  if (got != NULL)
    *got = done;
  return rc;
}

int molt__proto_read_full(int fd, void *buf, size_t n, uint64_t deadline_ns,
                          size_t *got) {
  return read_full(fd, buf, n, deadline_ns, got, NULL);
}

int molt__proto_write_full_guarded(int fd, const void *buf, size_t n,
                                   uint64_t deadline_ns, const molt__io_guard *guard) {
  size_t done = 0;
  while (done < n) {
    if (!guard_ok(guard))
      return MOLT_EIO;
    /* MSG_NOSIGNAL: a client that went away must not kill the host process
     * with SIGPIPE; MSG_DONTWAIT: the deadline rules, not the socket. */
    ssize_t k = send(fd, (const char *)buf + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k >= 0) {
      done += (size_t)k;
      continue;
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return MOLT_EIO;
    int rc = wait_fd(fd, POLLOUT, deadline_ns);
    if (rc != 0)
      return rc;
  }
  return 0;
}

int molt__proto_write_full(int fd, const void *buf, size_t n, uint64_t deadline_ns) {
  return molt__proto_write_full_guarded(fd, buf, n, deadline_ns, NULL);
}

int molt__proto_send(int fd, const molt__frame_hdr *h, const void *payload,
                     uint64_t deadline_ns) {
  return molt__proto_send_fd(fd, h, payload, deadline_ns, -1);
}

int molt__proto_send_fd(int fd, const molt__frame_hdr *h, const void *payload,
                        uint64_t deadline_ns, int pass) {
  unsigned char hdr[MOLT__PROTO_HDR_SIZE];
  molt__proto_encode_hdr(h, hdr);
  size_t sent = 0;
  if (pass >= 0) {
    /* The descriptor rides on the header's first byte(s) (SCM_RIGHTS). */
    union {
      struct cmsghdr h;
      char space[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = hdr, .iov_len = sizeof hdr};
    struct msghdr m = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = ctl.space,
                       .msg_controllen = sizeof ctl.space};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &pass, sizeof pass);
    ssize_t k;
    do
      k = sendmsg(fd, &m, MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    if (k < 0)
      return errno == EAGAIN || errno == EWOULDBLOCK ? MOLT_ETIMEDOUT : MOLT_EIO;
    sent = (size_t)k;
  }
  int rc = molt__proto_write_full(fd, hdr + sent, sizeof hdr - sent, deadline_ns);
  if (rc == 0 && h->length > 0)
    rc = molt__proto_write_full(fd, payload, h->length, deadline_ns);
  return rc;
}

int molt__proto_recv(int fd, molt__frame_type type, molt__frame_hdr *h, char **payload,
                     uint64_t deadline_ns, char *err, size_t errlen) {
  return molt__proto_recv_guarded(fd, type, h, payload, deadline_ns, err, errlen, NULL);
}

static int recv_frame(int fd, molt__frame_type type, molt__frame_hdr *h, char **payload,
                      uint64_t deadline_ns, char *err, size_t errlen,
                      const molt__io_guard *guard);

int molt__proto_recv_guarded(int fd, molt__frame_type type, molt__frame_hdr *h,
                             char **payload, uint64_t deadline_ns, char *err,
                             size_t errlen, const molt__io_guard *guard) {
  int rc = recv_frame(fd, type, h, payload, deadline_ns, err, errlen, guard);
  if (rc != 0) {
    free(*payload);
    *payload = NULL;
  }
  return rc;
}

static int recv_frame(int fd, molt__frame_type type, molt__frame_hdr *h, char **payload,
                      uint64_t deadline_ns, char *err, size_t errlen,
                      const molt__io_guard *guard) {
  unsigned char hdr[MOLT__PROTO_HDR_SIZE];
  size_t got = 0;
  *payload = NULL;
  memset(h, 0, sizeof *h);
  int rc = read_full(fd, hdr, sizeof hdr, deadline_ns, &got, guard);
  if (rc == MOLT_EPROTO) {
    if (got == 0) {
      molt__errmsg(err, errlen, "connection closed before a message arrived");
      return MOLT_ECONNECT;
    }
    molt__errmsg(err, errlen, "truncated header (%zu of %u bytes)", got,
                 MOLT__PROTO_HDR_SIZE);
    return rc;
  }
  if (rc == MOLT_ETIMEDOUT) {
    molt__errmsg(err, errlen, "timed out waiting for a message");
    return rc;
  }
  if (rc != 0) {
    molt__errmsg(err, errlen, "receive failed: %s", strerror(errno));
    return rc;
  }
  rc = molt__proto_decode_hdr(hdr, type, h, err, errlen);
  if (rc != 0)
    return rc;
  if (h->length == 0)
    return 0;
  char *p = malloc((size_t)h->length + 1);
  if (p == NULL) {
    molt__errmsg(err, errlen, "out of memory for a %u-byte payload", (unsigned)h->length);
    return MOLT_ENOMEM;
  }
  rc = read_full(fd, p, h->length, deadline_ns, &got, guard);
  if (rc != 0) {
    if (rc == MOLT_EPROTO)
      molt__errmsg(err, errlen, "truncated payload (%zu of %u bytes)", got,
                   (unsigned)h->length);
    else if (rc == MOLT_ETIMEDOUT)
      molt__errmsg(err, errlen, "timed out receiving the payload (%zu of %u bytes)", got,
                   (unsigned)h->length);
    else
      molt__errmsg(err, errlen, "receive failed: %s", strerror(errno));
    free(p);
    return rc;
  }
  p[h->length] = '\0';
  *payload = p;
  return 0;
}

/* ---- addressing ------------------------------------------------------------ */

void molt__proto_socket_name(pid_t pid, const char *suffix, char *buf, size_t len) {
  if (suffix != NULL)
    snprintf(buf, len, MOLT__PROTO_NAME_PREFIX "%ld.%s", (long)pid, suffix);
  else
    snprintf(buf, len, MOLT__PROTO_NAME_PREFIX "%ld", (long)pid);
}

socklen_t molt__proto_sockaddr_named(const char *name, struct sockaddr_un *sa) {
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  /* sun_path[0] == '\0' selects the abstract namespace: no file, no
   * permissions on a directory, and the name disappears with the socket. */
  size_t n = strnlen(name, sizeof sa->sun_path - 1);
  memcpy(sa->sun_path + 1, name, n);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

socklen_t molt__proto_sockaddr(pid_t pid, struct sockaddr_un *sa) {
  char name[sizeof sa->sun_path];
  molt__proto_socket_name(pid, NULL, name, sizeof name);
  return molt__proto_sockaddr_named(name, sa);
}
