/*
 * Tests of the control server (src/runtime/control.c) against a fake
 * runtime: molt__execute and molt__log are defined here, so the real
 * control.c + protocol.c run without the rest of libmolt.
 *
 *   test_control            run the server tests (a thread plays the
 *                           runtime thread; the main thread is the client)
 *   test_control --serve    be a fake molt process for the CLI tests
 *                           (tests/cli/test_cli_fake.py): prints
 *                           "ready <pid>" and serves until killed
 *   test_control --squat PID
 *                           bind the name molt.PID (not ours) and serve it,
 *                           to test that the CLI refuses an impostor
 *
 * Fake runtime semantics (see fake_execute): apply pushes a patch and bumps
 * the generation, unless the patch's file name contains "buildid" (fails
 * with MOLT_EBUILDID), "unsafe" (fails with MOLT_EUNSAFE and a message that
 * carries its own advice), "breakme" (enters the refusing state) or "hang"
 * (sleeps 8 s, then succeeds); rollback pops; status and log report the
 * state in the records documented in docs/protocol.md.
 */
#include "service/service.h"
#include "../harness/check.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- what libmolt would provide -------------------------------------- */

static uint64_t generation;
/* The scripted runtime has one thread of updates: no lock needed. */
uint64_t molt__gen_number_now(void) { return generation; }

/* The lock-order check of the real locks (base/lock.c, used by base/fd.c)
 * reports here: for this test, an order violation is a failure. */
void molt__fail_quiet(const char *reason) {
  fprintf(stderr, "test_control: %s\n", reason);
  exit(3);
}
void molt__fail(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  molt__fail_quiet(msg);
}

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct log_entry {
  unsigned seq;
  double time;
  molt__event ev;
  uint64_t gen;
  char patch[64];
  char msg[512];
} log_entry;

#define LOG_MAX 256
static log_entry fake_log[LOG_MAX];
static unsigned fake_log_n;

static const char *event_name(molt__event ev) {
  static const char *const names[] = {"start",   "load",   "switch", "rollback", "unload",
                                      "reclaim", "refuse", "denied", "fail",     "info"};
  return (unsigned)ev < sizeof names / sizeof names[0] ? names[ev] : "?";
}

void molt__log(molt__event ev, uint64_t gen, const char *patch_id, const char *fmt, ...) {
  pthread_mutex_lock(&fake_lock);
  log_entry *e = &fake_log[fake_log_n % LOG_MAX];
  e->seq = ++fake_log_n;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  e->time = (double)ts.tv_sec + ts.tv_nsec / 1e9;
  e->ev = ev;
  e->gen = gen;
  snprintf(e->patch, sizeof e->patch, "%s", patch_id && *patch_id ? patch_id : "-");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  pthread_mutex_unlock(&fake_lock);
}

static unsigned log_count(molt__event ev) {
  unsigned n = 0;
  pthread_mutex_lock(&fake_lock);
  for (unsigned i = 0; i < fake_log_n && i < LOG_MAX; i++)
    n += fake_log[i].ev == ev;
  pthread_mutex_unlock(&fake_lock);
  return n;
}

/* ---- fake runtime state ------------------------------------------------ */

typedef struct patch {
  char id[64], path[4096];
  char file[48]; /* device:inode of the descriptor the request brought */
  uint64_t gen;
} patch;

static patch stack[64];
static unsigned depth;
static char refusing[256];

/* knobs for the unit tests */
static size_t fake_log_bytes;  /* LOG: pad the response to this size */
static bool fake_oom;          /* mark the response buffer as truncated */
static molt__request last_req; /* what the server built */

static void rec(molt__buf *out, int n, ...) {
  const char *f[16];
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n; i++)
    f[i] = va_arg(ap, const char *);
  va_end(ap);
  molt__buf_record(out, n, f);
}

static void fake_status(molt__buf *out) {
  char buf[8][64];
  if (refusing[0])
    rec(out, 3, "state", "refusing", refusing);
  else
    rec(out, 2, "state", "ok");
  snprintf(buf[0], 64, "%ld", (long)getpid());
  rec(out, 2, "pid", buf[0]);
  snprintf(buf[1], 64, "%llu", (unsigned long long)generation);
  rec(out, 2, "generation", buf[1]);
  rec(out, 2, "reclaim", "enabled");
  rec(out, 3, "program", "/srv/bin/kv server", "0123456789abcdef0123");
  for (unsigned i = 0; i < depth; i++) {
    snprintf(buf[2], 64, "%u", i + 1);
    snprintf(buf[3], 64, "%llu", (unsigned long long)stack[i].gen);
    char desc[128];
    snprintf(desc, sizeof desc, "patch\t\"%.60s\"", stack[i].id);
    rec(out, 11, "patch", buf[2], stack[i].id, desc, stack[i].path, buf[3], "", "", "",
        stack[i].file, "");
    rec(out, 5, "object", stack[i].id, stack[i].path, buf[3], "1");
  }
  rec(out, 5, "live", buf[1], "0", "current", "2");
  rec(out, 6, "function", "handle_get", "kv.c", "0", depth ? stack[depth - 1].id : "base",
      depth ? "dispatch" : "direct");
  rec(out, 6, "function", "parse\tline", "proto.c", "1", "base", "direct");
  rec(out, 5, "thread", "4242", "worker-1", "global", "1");
  rec(out, 5, "thread", "4243", "w\x1b[31mred", "generation 3", "0");
  /* With a patch applied: worker-1 has been inside version 0 of
   * handle_get for 100 s (longer than the CLI's threshold). */
  if (depth) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(buf[4], 64, "%llu", (unsigned long long)(now.tv_sec - 100) * 1000000000ull);
    rec(out, 8, "old", "handle_get", "kv.c", "0", "4242", "worker-1", "0", buf[4]);
  }
  rec(out, 2, "oldscan", "1");
  molt__control_status(out); /* the real server's refusal counts */
}

static void fake_logdump(molt__buf *out) {
  pthread_mutex_lock(&fake_lock);
  unsigned first = fake_log_n > LOG_MAX ? fake_log_n - LOG_MAX : 0;
  for (unsigned s = first; s < fake_log_n; s++) {
    const log_entry *e = &fake_log[s % LOG_MAX];
    char seq[32], t[64], g[32];
    snprintf(seq, sizeof seq, "%u", e->seq);
    snprintf(t, sizeof t, "%.6f", e->time);
    snprintf(g, sizeof g, "%llu", (unsigned long long)e->gen);
    rec(out, 7, "log", seq, t, event_name(e->ev), g, e->patch, e->msg);
  }
  pthread_mutex_unlock(&fake_lock);
  /* padding for the size tests: valid records, ignored by clients */
  static const char pad[] = "pad\t0123456789012345678901234567890123456789\n";
  while (out->len + sizeof pad - 1 <= fake_log_bytes && !out->oom)
    molt__buf_add(out, pad, sizeof pad - 1);
}

static const char *policy_name(molt_policy_t p) {
  return p == MOLT_POLICY_LOCAL    ? "local"
         : p == MOLT_POLICY_GLOBAL ? "global"
                                   : "immediate";
}

int molt__execute(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  last_req = *req;
  char g[32];
  int rc = 0;
  switch (req->op) {
  case MOLT__OP_STATUS:
    fake_status(out);
    break;
  case MOLT__OP_LOG:
    fake_logdump(out);
    break;
  case MOLT__OP_APPLY: {
    const char *base = strrchr(req->path, '/');
    base = base ? base + 1 : req->path;
    if (strstr(base, "echo") != NULL) { /* unit tests: show the request */
      char t[32];
      snprintf(t, sizeof t, "%d", req->timeout_ms);
      rec(out, 4, "echo", req->path, policy_name(req->policy), t);
      break;
    }
    if (refusing[0]) {
      molt__errmsg(err, errlen, "%s: %s", molt_strerror(MOLT_EREFUSING), refusing);
      rc = MOLT_EREFUSING;
      break;
    }
    if (strstr(base, "buildid") != NULL) {
      molt__errmsg(err, errlen, "%s", molt_strerror(MOLT_EBUILDID));
      rec(out, 2, "detail", "patch target 1111, program 2222");
      molt__log(MOLT__EV_REFUSE, generation, NULL, "%s: build-id mismatch", req->path);
      rc = MOLT_EBUILDID;
      break;
    }
    if (strstr(base, "unsafe") != NULL) { /* a message with its own advice */
      molt__errmsg(err, errlen, "%s is writable by others; run chmod o-w on it",
                   req->path);
      rc = MOLT_EUNSAFE;
      break;
    }
    if (strstr(base, "breakme") != NULL) {
      snprintf(refusing, sizeof refusing, "simulated internal failure");
      molt__log(MOLT__EV_FAIL, generation, NULL, "%s", refusing);
      molt__errmsg(err, errlen, "%s", molt_strerror(MOLT_EINTERNAL));
      rc = MOLT_EINTERNAL;
      break;
    }
    if (strstr(base, "hang") != NULL)
      sleep(8);
    if (depth == sizeof stack / sizeof stack[0]) {
      rc = MOLT_EBUSY;
      break;
    }
    patch *p = &stack[depth++];
    snprintf(p->id, sizeof p->id, "%.*s", (int)strcspn(base, "."), base);
    snprintf(p->path, sizeof p->path, "%s", req->path);
    /* What the CLI passed (SCM_RIGHTS), as the real runtime reads it. */
    struct stat st;
    if (req->has_fd && fstat(req->fd, &st) == 0)
      snprintf(p->file, sizeof p->file, "%ju:%ju", (uintmax_t)st.st_dev,
               (uintmax_t)st.st_ino);
    else
      snprintf(p->file, sizeof p->file, "none");
    p->gen = ++generation;
    molt__log(MOLT__EV_LOAD, generation, p->id, "loaded %s", p->path);
    molt__log(MOLT__EV_SWITCH, generation, p->id, "generation %llu (%s)",
              (unsigned long long)generation, policy_name(req->policy));
    snprintf(g, sizeof g, "%llu", (unsigned long long)generation);
    rec(out, 2, "generation", g);
    rec(out, 2, "message", "switched");
    /* a patch named loop*.so "finds" a thread still inside version 0 */
    if (strncmp(base, "loop", 4) == 0)
      rec(out, 2, "warning",
          "thread 4242 (worker-1) is still running version 0 of handle_get");
    break;
  }
  case MOLT__OP_UPDATE:
  case MOLT__OP_SHADOW:
  case MOLT__OP_PROMOTE:
  case MOLT__OP_COMMIT: { /* echoes the request */
    char t[32];
    snprintf(t, sizeof t, "%d", req->timeout_ms);
    rec(out, 4, "echo", req->path, req->check_interior ? "1" : "0", t);
    break;
  }
  case MOLT__OP_ROLLBACK:
    if (depth == 0) {
      rc = MOLT_ENOHISTORY;
      break;
    }
    depth--;
    ++generation;
    molt__log(MOLT__EV_ROLLBACK, generation, stack[depth].id, "rolled back %s",
              stack[depth].id);
    snprintf(g, sizeof g, "%llu", (unsigned long long)generation);
    rec(out, 2, "generation", g);
    rec(out, 2, "message", "rolled back");
    break;
  }
  if (fake_oom)
    out->oom = true;
  return rc;
}

/* ---- the "runtime thread" ---------------------------------------------- */

static int stop_pipe[2];

/* The runtime loop's part of it (service/runtime.c): the stop pipe, then
 * the control server's entries. */
static void serve_loop(const molt__fd *lfd) {
  for (;;) {
    struct pollfd p[1 + MOLT__CONTROL_POLLFDS];
    p[0] = (struct pollfd){.fd = stop_pipe[0], .events = POLLIN};
    int timeout = -1;
    molt__control_poll_prepare(lfd, p + 1, &timeout);
    if (poll(p, 1 + MOLT__CONTROL_POLLFDS, timeout) < 0)
      for (size_t i = 0; i < 1 + MOLT__CONTROL_POLLFDS; i++)
        p[i].revents = 0;
    if (p[0].revents)
      return;
    molt__control_poll_done(lfd, p + 1);
  }
}

static void *server_thread(void *arg) {
  serve_loop(arg);
  return NULL;
}

/* ---- client helpers ---------------------------------------------------- */

static uint64_t now_ms(void) { return now_ns() / 1000000; }

static int connect_self(void) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa;
  socklen_t len = molt__proto_sockaddr(getpid(), &sa);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, len) < 0) {
    perror("connect");
    exit(2);
  }
  return fd;
}

typedef struct resp {
  int rc; /* of receiving/parsing */
  molt__frame_hdr h;
  molt__records recs;
} resp;

static resp get_response(int fd) {
  resp r;
  char *payload, err[256];
  memset(&r, 0, sizeof r);
  r.rc = molt__proto_recv(fd, MOLT__FRAME_RESPONSE, &r.h, &payload,
                          molt__proto_deadline(10000), err, sizeof err);
  if (r.rc == 0) {
    r.rc = molt__tsv_parse(payload, r.h.length, MOLT__PROTO_MAX_RESPONSE_RECORDS, &r.recs,
                           err, sizeof err);
    free(payload);
  }
  if (r.rc != 0)
    fprintf(stderr, "  (response: %s)\n", err);
  return r;
}

/* Sends raw bytes as a request (optionally half-closing), returns the
 * response. */
static resp raw_call(const void *raw, size_t len, bool shut) {
  int fd = connect_self();
  CHECK(molt__proto_write_full(fd, raw, len, molt__proto_deadline(5000)) == 0);
  if (shut)
    shutdown(fd, SHUT_WR);
  resp r = get_response(fd);
  close(fd);
  return r;
}

static resp call_op(unsigned op, const char *payload) {
  molt__buf b;
  molt__buf_init(&b);
  unsigned char hdr[MOLT__PROTO_HDR_SIZE];
  molt__frame_hdr h = {MOLT__PROTO_MAGIC, 1, (uint16_t)op, 0, (uint32_t)strlen(payload)};
  molt__proto_encode_hdr(&h, hdr);
  molt__buf_add(&b, hdr, sizeof hdr);
  molt__buf_add(&b, payload, strlen(payload));
  resp r = raw_call(b.data, b.len, false);
  molt__buf_free(&b);
  return r;
}

static const char *field(const resp *r, const char *key, size_t i) {
  return molt__tsv_field(molt__tsv_find(&r->recs, key), i);
}

/* The response failed with `code` and its first record says why. */
static bool is_error(const resp *r, int code, const char *substr) {
  bool ok = r->rc == 0 && r->h.status == code && r->recs.count >= 1 &&
            strcmp(r->recs.recs[0].fields[0], "error") == 0 &&
            strstr(molt__tsv_field(&r->recs.recs[0], 1), substr) != NULL;
  if (!ok)
    fprintf(stderr,
            "  expected error %d containing '%s', got rc %d status %d "
            "'%s'\n",
            code, substr, r->rc, (int)r->h.status, field(r, "error", 1));
  return ok;
}

static void hdr(unsigned char *b, uint32_t magic, uint16_t ver, uint16_t kind, int32_t st,
                uint32_t len) {
  molt__frame_hdr h = {magic, ver, kind, st, len};
  molt__proto_encode_hdr(&h, b);
}

/* ---- tests ---------------------------------------------------------------- */

static void test_requests(void) {
  resp r = call_op(MOLT__OP_STATUS, "");
  CHECK(r.rc == 0 && r.h.status == 0);
  CHECK(strcmp(field(&r, "state", 1), "ok") == 0);
  CHECK(strcmp(field(&r, "function", 1), "handle_get") == 0);
  molt__tsv_free(&r.recs);

  r = call_op(MOLT__OP_LOG, "");
  CHECK(r.rc == 0 && r.h.status == 0);
  molt__tsv_free(&r.recs);

  /* all fields parsed; unknown keys and extra fields ignored */
  r = call_op(MOLT__OP_APPLY,
              "future\tthing\nPATH\t/not/this\npath\t/p/echo\\tx.so\textra\n"
              "policy\tlocal\ntimeout_ms\t1234\n");
  CHECK(r.rc == 0 && r.h.status == 0);
  CHECK(strcmp(field(&r, "echo", 1), "/p/echo\tx.so") == 0);
  CHECK(strcmp(field(&r, "echo", 2), "local") == 0);
  CHECK(strcmp(field(&r, "echo", 3), "1234") == 0);
  molt__tsv_free(&r.recs);
  /* defaults */
  r = call_op(MOLT__OP_APPLY, "path\t/echo.so\n");
  CHECK(strcmp(field(&r, "echo", 2), "immediate") == 0);
  CHECK(strcmp(field(&r, "echo", 3), "-1") == 0);
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_APPLY, "path\t/echo.so\npolicy\tglobal\ntimeout_ms\t-7\n");
  CHECK(strcmp(field(&r, "echo", 2), "global") == 0);
  CHECK(strcmp(field(&r, "echo", 3), "-1") == 0);
  molt__tsv_free(&r.recs);

  /* request errors */
  r = call_op(MOLT__OP_APPLY, "policy\tlocal\n");
  CHECK(is_error(&r, MOLT_EPROTO, "without a path"));
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_APPLY, "path\trelative/x.so\n");
  CHECK(is_error(&r, MOLT_EINVAL, "not absolute"));
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_APPLY, "path\t/x.so\npolicy\tsometimes\n");
  CHECK(is_error(&r, MOLT_EPOLICY, "sometimes"));
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_ROLLBACK, "policy\t\n");
  CHECK(is_error(&r, MOLT_EPOLICY, "unknown update policy"));
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_APPLY, "path\t/x.so\ntimeout_ms\t12x\n");
  CHECK(is_error(&r, MOLT_EPROTO, "not an integer"));
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_APPLY, "path\t/x.so\ntimeout_ms\t99999999999\n");
  CHECK(is_error(&r, MOLT_EPROTO, "not an integer"));
  molt__tsv_free(&r.recs);
  /* update: path, timeout_ms, check_interior; policy is ignored */
  r = call_op(MOLT__OP_UPDATE,
              "path\t/v2.so\ncheck_interior\t1\ntimeout_ms\t500\npolicy\tbogus\n");
  CHECK(r.rc == 0 && r.h.status == 0);
  CHECK(strcmp(field(&r, "echo", 1), "/v2.so") == 0);
  CHECK(strcmp(field(&r, "echo", 2), "1") == 0);
  CHECK(strcmp(field(&r, "echo", 3), "500") == 0);
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_UPDATE, "path\t/v2.so\n");
  CHECK(strcmp(field(&r, "echo", 2), "0") == 0);
  CHECK(strcmp(field(&r, "echo", 3), "-1") == 0);
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_UPDATE, "timeout_ms\t5\n");
  CHECK(is_error(&r, MOLT_EPROTO, "update request without a path"));
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_UPDATE, "path\tv2.so\n");
  CHECK(is_error(&r, MOLT_EINVAL, "image path 'v2.so' is not absolute"));
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_UPDATE, "path\t/v2.so\ncheck_interior\tyes\n");
  CHECK(is_error(&r, MOLT_EPROTO, "check_interior"));
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_UPDATE, "path\t/v2.so\ntimeout_ms\t1e3\n");
  CHECK(is_error(&r, MOLT_EPROTO, "not an integer"));
  molt__tsv_free(&r.recs);

  char longpath[5000] = "path\t/";
  memset(longpath + 6, 'a', 4200);
  strcpy(longpath + 4206, "\n");
  r = call_op(MOLT__OP_APPLY, longpath);
  CHECK(is_error(&r, MOLT_EINVAL, "longer than"));
  molt__tsv_free(&r.recs);

  /* execute failure: error record first, then the runtime's records */
  r = call_op(MOLT__OP_APPLY, "path\t/p/buildid.so\n");
  CHECK(is_error(&r, MOLT_EBUILDID, "build-id mismatch"));
  CHECK(r.recs.count == 2 && strcmp(r.recs.recs[1].fields[0], "detail") == 0);
  molt__tsv_free(&r.recs);

  /* rollback with nothing applied: the message comes from the table */
  r = call_op(MOLT__OP_ROLLBACK, "");
  CHECK(is_error(&r, MOLT_ENOHISTORY, "nothing to roll back"));
  molt__tsv_free(&r.recs);

  /* successful apply and rollback */
  r = call_op(MOLT__OP_APPLY, "path\t/p/fix1.so\npolicy\timmediate\n");
  CHECK(r.rc == 0 && r.h.status == 0 && strcmp(field(&r, "generation", 1), "1") == 0);
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_ROLLBACK, "policy\tlocal\ntimeout_ms\t50\n");
  CHECK(r.rc == 0 && r.h.status == 0 && strcmp(field(&r, "generation", 1), "2") == 0);
  CHECK(last_req.op == MOLT__OP_ROLLBACK && last_req.policy == MOLT_POLICY_LOCAL &&
        last_req.timeout_ms == 50);
  molt__tsv_free(&r.recs);
}

static void test_malformed(void) {
  unsigned char b[MOLT__PROTO_HDR_SIZE + 64];
  resp r;

  hdr(b, 0x12345678, 1, 1, 0, 0);
  r = raw_call(b, 16, false);
  CHECK(is_error(&r, MOLT_EPROTO, "bad magic"));
  molt__tsv_free(&r.recs);

  hdr(b, MOLT__PROTO_MAGIC, 2, 1, 0, 0);
  r = raw_call(b, 16, false);
  CHECK(is_error(&r, MOLT_EVERSION, "version 2"));
  CHECK(r.h.version == MOLT__PROTO_VERSION);
  molt__tsv_free(&r.recs);

  hdr(b, MOLT__PROTO_MAGIC, 1, 9, 0, 0);
  r = raw_call(b, 16, false);
  CHECK(is_error(&r, MOLT_EPROTO, "unknown request op 9"));
  molt__tsv_free(&r.recs);

  hdr(b, MOLT__PROTO_MAGIC, 1, 1, 0, 0xffffffffu);
  r = raw_call(b, 16, false);
  CHECK(is_error(&r, MOLT_EPROTO, "exceeds"));
  molt__tsv_free(&r.recs);

  hdr(b, MOLT__PROTO_MAGIC, 1, 2, 0, 40);
  memcpy(b + 16, "path\t/x", 7);
  r = raw_call(b, 23, true);
  CHECK(is_error(&r, MOLT_EPROTO, "truncated payload"));
  molt__tsv_free(&r.recs);

  r = raw_call(b, 7, true);
  CHECK(is_error(&r, MOLT_EPROTO, "truncated header"));
  molt__tsv_free(&r.recs);

  hdr(b, MOLT__PROTO_MAGIC, 1, 2, 0, 9);
  memcpy(b + 16, "path\t/\0x\n", 9);
  r = raw_call(b, 25, false);
  CHECK(is_error(&r, MOLT_EPROTO, "NUL"));
  molt__tsv_free(&r.recs);

  hdr(b, MOLT__PROTO_MAGIC, 1, 2, 0, 7);
  memcpy(b + 16, "path\t/x", 7);
  r = raw_call(b, 23, false);
  CHECK(is_error(&r, MOLT_EPROTO, "newline"));
  molt__tsv_free(&r.recs);

  hdr(b, MOLT__PROTO_MAGIC, 1, 2, 0, 9);
  memcpy(b + 16, "path\t/\\x\n", 9);
  r = raw_call(b, 25, false);
  CHECK(is_error(&r, MOLT_EPROTO, "bad escape"));
  molt__tsv_free(&r.recs);
}

static void test_hostile_clients(void) {
  /* connect and close at once: nothing logged, server fine */
  unsigned before = log_count(MOLT__EV_INFO);
  close(connect_self());
  resp r = call_op(MOLT__OP_STATUS, "");
  CHECK(r.rc == 0 && r.h.status == 0);
  molt__tsv_free(&r.recs);
  CHECK(log_count(MOLT__EV_INFO) == before);

  /* request sent, answer never read: no SIGPIPE (default disposition
   * here), the server goes on */
  for (int i = 0; i < 20; i++) {
    int fd = connect_self();
    unsigned char b[16];
    hdr(b, MOLT__PROTO_MAGIC, 1, MOLT__OP_LOG, 0, 0);
    CHECK(write(fd, b, 16) == 16);
    close(fd);
  }

  /* silent client: answered (EPROTO) after the 2 s server deadline */
  uint64_t t0 = now_ms();
  int fd = connect_self();
  r = get_response(fd);
  uint64_t dt = now_ms() - t0;
  close(fd);
  CHECK(is_error(&r, MOLT_EPROTO, "no complete request"));
  CHECK(dt >= 1800 && dt < 3500);
  molt__tsv_free(&r.recs);
  CHECK(log_count(MOLT__EV_INFO) > before); /* that one is logged */

  /* dripping client: one byte every 300 ms cannot stretch the deadline */
  t0 = now_ms();
  fd = connect_self();
  unsigned char b[16];
  hdr(b, MOLT__PROTO_MAGIC, 1, MOLT__OP_STATUS, 0, 0);
  for (int i = 0; i < 16; i++) {
    if (send(fd, b + i, 1, MSG_NOSIGNAL) != 1)
      break;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 300) > 0) /* the server answered: stop dripping */
      break;
  }
  r = get_response(fd);
  dt = now_ms() - t0;
  close(fd);
  CHECK(is_error(&r, MOLT_EPROTO, "no complete request"));
  CHECK(dt < 3500);
  molt__tsv_free(&r.recs);

  /* and the server still serves */
  r = call_op(MOLT__OP_STATUS, "");
  CHECK(r.rc == 0 && r.h.status == 0);
  molt__tsv_free(&r.recs);
}

typedef struct conc_arg {
  int ok;
} conc_arg;

static void *conc_client(void *p) {
  conc_arg *a = p;
  for (int i = 0; i < 10; i++) {
    resp r = call_op(MOLT__OP_STATUS, "");
    a->ok += r.rc == 0 && r.h.status == 0;
    molt__tsv_free(&r.recs);
  }
  return NULL;
}

static void test_sizes_and_concurrency(void) {
  /* a 4 MiB log arrives whole */
  fake_log_bytes = 4u << 20;
  resp r = call_op(MOLT__OP_LOG, "");
  CHECK(r.rc == 0 && r.h.status == 0 && r.h.length >= (4u << 20) - 64);
  molt__tsv_free(&r.recs);
  /* over 16 MiB: refused cleanly, not truncated */
  fake_log_bytes = MOLT__PROTO_MAX_RESPONSE + 100;
  r = call_op(MOLT__OP_LOG, "");
  CHECK(is_error(&r, MOLT_ENOTSUP, "exceeds the protocol limit"));
  molt__tsv_free(&r.recs);
  fake_log_bytes = 0;

  /* out of memory while reporting: status fails, apply keeps its status */
  fake_oom = true;
  r = call_op(MOLT__OP_STATUS, "");
  CHECK(is_error(&r, MOLT_ENOMEM, "out of memory"));
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_APPLY, "path\t/p/oomfix.so\n");
  CHECK(r.rc == 0 && r.h.status == 0 && r.h.length == 0);
  molt__tsv_free(&r.recs);
  r = call_op(MOLT__OP_APPLY, "path\t/p/buildid.so\n");
  CHECK(is_error(&r, MOLT_EBUILDID, "build-id"));
  CHECK(r.recs.count == 1); /* the truncated records were dropped */
  molt__tsv_free(&r.recs);
  fake_oom = false;

  /* many clients at once (more than the backlog) */
  pthread_t t[24];
  conc_arg a[24];
  for (int i = 0; i < 24; i++) {
    a[i].ok = 0;
    pthread_create(&t[i], NULL, conc_client, &a[i]);
  }
  int ok = 0;
  for (int i = 0; i < 24; i++) {
    pthread_join(t[i], NULL);
    ok += a[i].ok;
  }
  CHECK(ok == 240);
}

static void test_second_listener(void) {
  /* our name is taken (by us): a second listener fails cleanly */
  /* our name is taken (by us): a second listener takes a fallback name
   * "molt.<pid>.<random>" instead */
  molt__fd l;
  char name[108], want[64];
  int rc = molt__control_listen(&l, name, sizeof name);
  snprintf(want, sizeof want, "molt.%d.", (int)getpid());
  CHECK(rc == 0 && l.fd >= 0 && strncmp(name, want, strlen(want)) == 0 &&
        strlen(name) == strlen(want) + 16);
  /* connectable under that name */
  struct sockaddr_un sa;
  socklen_t len = molt__proto_sockaddr_named(name, &sa);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&sa, len) == 0);
  close(fd);
  CHECK(molt__fd_close(&l));
}

/* Another uid is refused, the refusal is logged, the message is the one
 * the CLI shows.  Needs root (to become uid 1000). */
static void test_denied(void) {
  if (geteuid() != 0) {
    printf("test_control: not root, skipping the uid check\n");
    return;
  }
  unsigned before = log_count(MOLT__EV_DENIED);
  uint64_t gen_before = generation;
  memset(&last_req, 0, sizeof last_req);
  struct sockaddr_un sa;
  socklen_t salen = molt__proto_sockaddr(getpid(), &sa);
  unsigned char req[MOLT__PROTO_HDR_SIZE];
  hdr(req, MOLT__PROTO_MAGIC, 1, MOLT__OP_ROLLBACK, 0, 0);
  int pfd[2];
  CHECK(pipe(pfd) == 0);
  pid_t child = fork();
  if (child == 0) {
    /* Raw system calls only: this child of a threaded process must not
     * touch locks (malloc, stdio) another thread may have held. */
    close(pfd[0]);
    if (setresgid(1000, 1000, 1000) != 0 || setresuid(1000, 1000, 1000) != 0)
      _exit(3);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, salen) < 0)
      _exit(4);
    /* Refused at accept, before anything is read: the send may find the
     * connection closed already; the refusal is readable all the same. */
    (void)send(fd, req, sizeof req, MSG_NOSIGNAL);
    static unsigned char buf[4096];
    size_t n = 0;
    ssize_t k;
    while (n < sizeof buf && (k = recv(fd, buf + n, sizeof buf - n, 0)) > 0)
      n += (size_t)k;
    if (write(pfd[1], buf, n) != (ssize_t)n)
      _exit(6);
    _exit(0);
  }
  close(pfd[1]);
  static char buf[4096];
  size_t n = 0;
  ssize_t k;
  while (n < sizeof buf && (k = read(pfd[0], buf + n, sizeof buf - n)) > 0)
    n += (size_t)k;
  close(pfd[0]);
  int ws;
  waitpid(child, &ws, 0);
  CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  molt__frame_hdr h;
  char err[256];
  CHECK(n >= 16 && molt__proto_decode_hdr((unsigned char *)buf, MOLT__FRAME_RESPONSE, &h,
                                          err, sizeof err) == 0);
  CHECK(h.status == MOLT_EPERM);
  CHECK(n == 16 + h.length);
  buf[n < sizeof buf ? n : sizeof buf - 1] = '\0';
  CHECK(strstr(buf + 16, "error\tuid 1000 is not allowed to control this "
                         "process (owner uid 0)\n") == buf + 16);
  CHECK(log_count(MOLT__EV_DENIED) == before + 1);
  /* nothing was executed */
  CHECK(generation == gen_before && last_req.op == 0);
}

/* More admitted clients holding half a request than there are slots: a
 * new request evicts the oldest of them (told so) and is served at once;
 * those past their deadline are answered and closed. */
static void test_slots(void) {
  enum { N = MOLT__CONTROL_SLOTS + 8 };
  int fds[N];
  unsigned char b[16];
  hdr(b, MOLT__PROTO_MAGIC, 1, MOLT__OP_STATUS, 0, 0);
  for (int i = 0; i < N; i++) {
    fds[i] = connect_self();
    CHECK(send(fds[i], b, 8, MSG_NOSIGNAL) == 8);
  }
  uint64_t t0 = now_ms();
  resp r = call_op(MOLT__OP_STATUS, "");
  CHECK(r.rc == 0 && r.h.status == 0);
  CHECK(now_ms() - t0 < 1500); /* not after the holders' 2 s deadline */
  molt__tsv_free(&r.recs);
  /* The oldest were evicted with a reason. */
  r = get_response(fds[0]);
  CHECK(is_error(&r, MOLT_EFULL, "too many control connections"));
  molt__tsv_free(&r.recs);
  /* A holder that completes its request in time is served. */
  CHECK(send(fds[N - 1], b + 8, 8, MSG_NOSIGNAL) == 8);
  r = get_response(fds[N - 1]);
  CHECK(r.rc == 0 && r.h.status == 0 && strcmp(field(&r, "state", 1), "ok") == 0);
  molt__tsv_free(&r.recs);
  for (int i = 0; i < N; i++)
    close(fds[i]);
}

/* 100 connections of another uid, each holding half a request, do not
 * hold the server: each is refused at accept (counted, logged once), and
 * the owner's request is served at once.  Needs root. */
static void test_denied_many(void) {
  if (geteuid() != 0) {
    printf("test_control: not root, skipping the other-uid holders\n");
    return;
  }
  unsigned before = log_count(MOLT__EV_DENIED);
  struct sockaddr_un sa;
  socklen_t salen = molt__proto_sockaddr(getpid(), &sa);
  unsigned char half[8];
  memcpy(half, "MOLT\1\0\1\0", 8);
  int ready[2], hold[2];
  CHECK(pipe(ready) == 0 && pipe(hold) == 0);
  pid_t child = fork();
  if (child == 0) {
    /* Raw system calls only (a child of a threaded process). */
    close(ready[0]);
    close(hold[1]);
    if (setresgid(1000, 1000, 1000) != 0 || setresuid(1000, 1000, 1000) != 0)
      _exit(3);
    static int socks[100];
    for (int i = 0; i < 100; i++) {
      socks[i] = socket(AF_UNIX, SOCK_STREAM, 0);
      if (socks[i] < 0 || connect(socks[i], (struct sockaddr *)&sa, salen) < 0)
        _exit(4);
      (void)send(socks[i], half, sizeof half, MSG_NOSIGNAL);
    }
    if (write(ready[1], "r", 1) != 1)
      _exit(5);
    char c;
    (void)read(hold[0], &c, 1); /* held until the parent closes hold[1] */
    _exit(0);
  }
  close(ready[1]);
  close(hold[0]);
  char c = 0;
  CHECK(read(ready[0], &c, 1) == 1 && c == 'r');
  uint64_t t0 = now_ms();
  resp r = call_op(MOLT__OP_STATUS, "");
  CHECK(r.rc == 0 && r.h.status == 0);
  CHECK(now_ms() - t0 < 1500);
  /* counted one by one, and shown by status */
  const molt__record *d = molt__tsv_find(&r.recs, "denied");
  CHECK(d != NULL && strcmp(molt__tsv_field(d, 1), "1000") == 0 &&
        atoi(molt__tsv_field(d, 2)) >= 100);
  molt__tsv_free(&r.recs);
  close(hold[1]);
  close(ready[0]);
  int ws;
  waitpid(child, &ws, 0);
  CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  /* not one log entry each: uid 1000 was logged before (test_denied) */
  CHECK(log_count(MOLT__EV_DENIED) == before);
}

/* ---- fake process modes ------------------------------------------------- */

static int serve_forever(const molt__fd *lfd) {
  printf("ready %ld\n", (long)getpid());
  fflush(stdout);
  molt__log(MOLT__EV_START, 0, NULL, "runtime started (fake)");
  if (pipe(stop_pipe) != 0)
    return 2;
  serve_loop(lfd); /* until killed */
  return 0;
}

static int squat(pid_t victim) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  struct sockaddr_un sa;
  socklen_t len = molt__proto_sockaddr(victim, &sa);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, len) < 0 || listen(fd, 4) < 0) {
    perror("squat");
    return 2;
  }
  molt__fd l;
  if (molt__fd_keep(&l, fd) != 0)
    return 2;
  return serve_forever(&l);
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--serve") == 0) {
    molt__fd l;
    char name[108];
    int rc = molt__control_listen(&l, name, sizeof name);
    if (rc < 0) {
      fprintf(stderr, "listen: %s\n", molt_strerror(rc));
      return 2;
    }
    return serve_forever(&l);
  }
  if (argc == 3 && strcmp(argv[1], "--squat") == 0)
    return squat((pid_t)atol(argv[2]));

  static molt__fd L;
  char lname[108];
  CHECK(molt__control_listen(&L, lname, sizeof lname) == 0);
  char want[64];
  snprintf(want, sizeof want, "molt.%d", (int)getpid());
  CHECK(strcmp(lname, want) == 0);
  int lfd = L.fd;
  if (lfd < 0)
    return 1;
  /* CLOEXEC and non-blocking, as promised */
  int fl = fcntl(lfd, F_GETFD);
  CHECK(fl >= 0 && (fl & FD_CLOEXEC));
  CHECK((fcntl(lfd, F_GETFL) & O_NONBLOCK) != 0);
  /* out of the small numbers the host uses (base/fd.c): from 7/8 of
   * min(RLIMIT_NOFILE, 1024) */
  struct rlimit rl;
  CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
  rlim_t top = rl.rlim_cur < 1024 ? rl.rlim_cur : 1024;
  CHECK((rlim_t)lfd >= top - top / 8 && (rlim_t)lfd < top);
  /* serve with nothing pending: returns at once */
  uint64_t t0 = now_ms();
  struct pollfd none[MOLT__CONTROL_POLLFDS];
  int timeout = -1;
  molt__control_poll_prepare(&L, none, &timeout);
  CHECK(none[0].fd == L.fd && timeout == -1);
  for (size_t i = 0; i < MOLT__CONTROL_POLLFDS; i++)
    none[i].revents = 0;
  molt__control_poll_done(&L, none);
  CHECK(now_ms() - t0 < 500);

  CHECK(pipe(stop_pipe) == 0);
  pthread_t th;
  pthread_create(&th, NULL, server_thread, &L);

  test_requests();
  test_malformed();
  test_hostile_clients();
  test_sizes_and_concurrency();
  test_second_listener();
  test_denied();
  test_denied_many();
  test_slots();

  CHECK(write(stop_pipe[1], "x", 1) == 1);
  pthread_join(th, NULL);
  CHECK(molt__fd_close(&L));
  /* the name is gone with the socket */
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa;
  socklen_t len = molt__proto_sockaddr(getpid(), &sa);
  CHECK(connect(fd, (struct sockaddr *)&sa, len) < 0 && errno == ECONNREFUSED);
  close(fd);

  if (failures) {
    fprintf(stderr, "test_control: %d check(s) failed\n", failures);
    return 1;
  }
  printf("test_control: all checks passed\n");
  return 0;
}
