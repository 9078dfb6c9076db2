/*
 * Fuzz target for the control protocol parsers: frame headers (as request
 * and as response), TSV payloads, and the full receive path over a socket.
 *
 * Two ways to run it:
 *   - libFuzzer (clang):  build with -fsanitize=fuzzer -DMOLT_LIBFUZZER;
 *     see tests/protocol/tests.cmake and docs/protocol.md.
 *   - anywhere else (gcc, CI): the main() below runs a deterministic
 *     mutation loop over seed messages for a fixed number of iterations,
 *     meant to run under ASan/UBSan.  `fuzz_protocol [ITERATIONS]`, or
 *     `fuzz_protocol FILE...` to replay inputs (e.g. a libFuzzer crash).
 *
 * Besides "no crash, no leak, no UB" the target checks properties and
 * traps when one fails: whatever parses re-encodes with the runtime's
 * writer (molt__buf_record) into records that parse to the same fields,
 * and the socket path agrees with the in-memory decoders.
 *
 * The mutation loop then runs the real control server (service/control.c,
 * with a scripted runtime below) against hostile clients, for a fixed
 * number of rounds with a fixed seed: many connections at once (more than
 * the server's slots), each sending a mutated message whole, half of one
 * and holding it, dripping it, or nothing; and, when run as root, a child
 * of another uid (65534) doing the same.  Properties: whatever the server
 * sends is one well-formed response; a complete well-formed status request
 * is answered (or its slot evicted with MOLT_EFULL); the other uid only
 * ever gets MOLT_EPERM; and after every round the owner's status request
 * is answered at once.
 */
#ifndef MOLT_LIBFUZZER
#include "service/service.h"
#else
#include "common/common.h"
#endif

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REQUIRE(c)                                                                       \
  do {                                                                                   \
    if (!(c)) {                                                                          \
      fprintf(stderr, "fuzz_protocol: property failed: %s (line %d)\n", #c, __LINE__);   \
      __builtin_trap();                                                                  \
    }                                                                                    \
  } while (0)

/* Parse, and if that works, check the round trip through the writer. */
static void fuzz_tsv(const char *data, size_t len, size_t max_records) {
  molt__records r;
  char err[256];
  int rc = molt__tsv_parse(data, len, max_records, &r, err, sizeof err);
  if (rc != 0) {
    REQUIRE(rc == MOLT_EPROTO || rc == MOLT_ENOMEM);
    REQUIRE(r.count == 0 && r.recs == NULL);
    return;
  }
  REQUIRE(r.count <= (max_records ? max_records : MOLT__PROTO_MAX_RECORDS));
  molt__buf b;
  molt__buf_init(&b);
  for (size_t i = 0; i < r.count; i++) {
    REQUIRE(r.recs[i].nfields >= 1 && r.recs[i].nfields <= MOLT__PROTO_MAX_FIELDS);
    molt__buf_record(&b, (int)r.recs[i].nfields, r.recs[i].fields);
  }
  if (!b.oom) {
    molt__records r2;
    REQUIRE(molt__tsv_parse(b.data, b.len, max_records, &r2, err, sizeof err) == 0);
    REQUIRE(r2.count == r.count);
    for (size_t i = 0; i < r.count; i++) {
      REQUIRE(r2.recs[i].nfields == r.recs[i].nfields);
      for (size_t f = 0; f < r.recs[i].nfields; f++)
        REQUIRE(strcmp(r2.recs[i].fields[f], r.recs[i].fields[f]) == 0);
    }
    molt__tsv_free(&r2);
  }
  molt__buf_free(&b);
  molt__tsv_free(&r);
}

static void fuzz_frame(const uint8_t *data, size_t size, molt__frame_type type) {
  if (size < MOLT__PROTO_HDR_SIZE)
    return;
  molt__frame_hdr h;
  char err[256];
  int rc = molt__proto_decode_hdr(data, type, &h, err, sizeof err);
  if (rc != 0) {
    REQUIRE(rc == MOLT_EPROTO || rc == MOLT_EVERSION);
    return;
  }
  /* The encoder reproduces the header bytes exactly. */
  unsigned char again[MOLT__PROTO_HDR_SIZE];
  molt__proto_encode_hdr(&h, again);
  REQUIRE(memcmp(again, data, MOLT__PROTO_HDR_SIZE) == 0);
  REQUIRE(h.length <= (type == MOLT__FRAME_REQUEST ? MOLT__PROTO_MAX_REQUEST
                                                   : MOLT__PROTO_MAX_RESPONSE));
  size_t avail = size - MOLT__PROTO_HDR_SIZE;
  size_t n = h.length < avail ? h.length : avail;
  fuzz_tsv((const char *)data + MOLT__PROTO_HDR_SIZE, n,
           type == MOLT__FRAME_REQUEST ? MOLT__PROTO_MAX_RECORDS
                                       : MOLT__PROTO_MAX_RESPONSE_RECORDS);
}

/* The real receive path: bytes arrive on a socket, the writer then shuts
 * down, so a short message is truncated rather than waited for. */
static void fuzz_socket(const uint8_t *data, size_t size) {
  int sv[2];
  if (size > 128 * 1024 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return;
  int sndbuf = 512 * 1024;
  (void)setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  if (molt__proto_write_full(sv[0], data, size, molt__proto_deadline(1000)) == 0) {
    shutdown(sv[0], SHUT_WR);
    molt__frame_hdr h;
    char *payload = NULL, err[256];
    int rc = molt__proto_recv(sv[1], MOLT__FRAME_REQUEST, &h, &payload,
                              molt__proto_deadline(1000), err, sizeof err);
    if (rc == 0) {
      REQUIRE(size >= MOLT__PROTO_HDR_SIZE + h.length);
      REQUIRE(h.length == 0 ||
              memcmp(payload, data + MOLT__PROTO_HDR_SIZE, h.length) == 0);
    } else {
      REQUIRE(payload == NULL);
      REQUIRE(rc == MOLT_EPROTO || rc == MOLT_EVERSION || rc == MOLT_ECONNECT);
      REQUIRE(rc != MOLT_ECONNECT || size == 0);
    }
    free(payload);
  }
  close(sv[0]);
  close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_frame(data, size, MOLT__FRAME_REQUEST);
  fuzz_frame(data, size, MOLT__FRAME_RESPONSE);
  fuzz_tsv((const char *)data, size, MOLT__PROTO_MAX_RECORDS);
  fuzz_tsv((const char *)data, size, 3); /* exercise the record bound */
  fuzz_socket(data, size);
  return 0;
}

#ifndef MOLT_LIBFUZZER
/* ---- deterministic mutation loop (no libFuzzer) ------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) { /* xorshift64*: fixed seed, reproducible */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

static size_t rnd_below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

typedef struct input {
  uint8_t *data;
  size_t len;
} input;

#define MAX_INPUT 70000

static input make_msg(unsigned kind, int status, const char *payload) {
  size_t plen = strlen(payload);
  input in = {malloc(MOLT__PROTO_HDR_SIZE + plen), MOLT__PROTO_HDR_SIZE + plen};
  molt__frame_hdr h = {MOLT__PROTO_MAGIC, MOLT__PROTO_VERSION, (uint16_t)kind, status,
                       (uint32_t)plen};
  molt__proto_encode_hdr(&h, in.data);
  memcpy(in.data + MOLT__PROTO_HDR_SIZE, payload, plen);
  return in;
}

static void mutate(input *in, const input *pool, size_t npool) {
  static const uint8_t special[] = {0,   '\t', '\n', '\\', 't', 'n', 0xff, 0x80,
                                    'M', 'O',  'L',  'T',  1,   2,   4,    0x7f};
  static const uint32_t lengths[] = {
      0, 1, 15, 16, 17, 65535, 65536, 65537, 16777216, 16777217, 0x7fffffff, 0xffffffff};
  uint8_t *d = in->data;
  switch (rnd_below(9)) {
  case 0: /* flip a bit */
    if (in->len)
      d[rnd_below(in->len)] ^= (uint8_t)(1u << rnd_below(8));
    break;
  case 1: /* overwrite with a special byte */
    if (in->len)
      d[rnd_below(in->len)] = special[rnd_below(sizeof special)];
    break;
  case 2: /* insert a special byte */
    if (in->len < MAX_INPUT) {
      size_t at = rnd_below(in->len + 1);
      memmove(d + at + 1, d + at, in->len - at);
      d[at] = special[rnd_below(sizeof special)];
      in->len++;
    }
    break;
  case 3: /* delete a range */
    if (in->len) {
      size_t at = rnd_below(in->len), n = 1 + rnd_below(8);
      if (n > in->len - at)
        n = in->len - at;
      memmove(d + at, d + at + n, in->len - at - n);
      in->len -= n;
    }
    break;
  case 4: /* truncate */
    in->len = rnd_below(in->len + 1);
    break;
  case 5: /* set the header's length field */
    if (in->len >= MOLT__PROTO_HDR_SIZE) {
      uint32_t v = rnd_below(2)
                       ? lengths[rnd_below(sizeof lengths / 4)]
                       : (uint32_t)(in->len - MOLT__PROTO_HDR_SIZE + rnd_below(3) - 1);
      d[12] = (uint8_t)v, d[13] = (uint8_t)(v >> 8), d[14] = (uint8_t)(v >> 16),
      d[15] = (uint8_t)(v >> 24);
    }
    break;
  case 6: /* set version, kind or status */
    if (in->len >= MOLT__PROTO_HDR_SIZE)
      d[4 + 2 * rnd_below(3)] = (uint8_t)rnd_below(8);
    break;
  case 7: /* duplicate a chunk in place */
    if (in->len && in->len < MAX_INPUT / 2) {
      size_t at = rnd_below(in->len), n = 1 + rnd_below(in->len - at);
      memmove(d + at + n, d + at, in->len - at);
      in->len += n;
    }
    break;
  default: /* splice the tail of another input */
    if (npool) {
      const input *o = &pool[rnd_below(npool)];
      size_t at = rnd_below(in->len + 1), from = rnd_below(o->len + 1);
      size_t n = o->len - from;
      if (at + n > MAX_INPUT)
        n = MAX_INPUT - at;
      memcpy(d + at, o->data + from, n);
      in->len = at + n;
    }
  }
}

static int replay(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    FILE *f = fopen(argv[i], "rb");
    if (f == NULL) {
      perror(argv[i]);
      return 2;
    }
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
  }
  printf("fuzz_protocol: replayed %d input(s)\n", argc - 1);
  return 0;
}

/* ---- the control server against hostile clients -------------------------- */

/* What libmolt would provide: a scripted runtime (one thread: the server's). */
uint64_t molt__gen_number_now(void) { return 7; }
void molt__fail_quiet(const char *reason) {
  fprintf(stderr, "fuzz_protocol: %s\n", reason);
  __builtin_trap();
}
void molt__fail(const char *fmt, ...) {
  (void)fmt;
  molt__fail_quiet("lock order violated");
}
static _Atomic unsigned long logged;
void molt__log(molt__event ev, uint64_t gen, const char *patch_id, const char *fmt, ...) {
  (void)ev, (void)gen, (void)patch_id, (void)fmt;
  atomic_fetch_add_explicit(&logged, 1, memory_order_relaxed); /* a counter only */
}
int molt__execute(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  if (req->op == MOLT__OP_STATUS) {
    molt__buf_pair(out, "state", "ok");
    molt__control_status(out);
    return 0;
  }
  if (req->op == MOLT__OP_APPLY && strstr(req->path, "fail")) {
    molt__errmsg(err, errlen, "scripted failure for %.100s", req->path);
    return MOLT_ENOTPATCH;
  }
  const char *f[] = {"echo", molt__op_find(req->op)->name, req->path};
  molt__buf_record(out, 3, f);
  return 0;
}

static int stop_pipe[2];

static void *server_main(void *arg) {
  const molt__fd *l = arg;
  for (;;) {
    struct pollfd p[1 + MOLT__CONTROL_POLLFDS];
    p[0] = (struct pollfd){.fd = stop_pipe[0], .events = POLLIN};
    int timeout = -1;
    molt__control_poll_prepare(l, p + 1, &timeout);
    if (poll(p, 1 + MOLT__CONTROL_POLLFDS, timeout) < 0)
      for (size_t i = 0; i < 1 + MOLT__CONTROL_POLLFDS; i++)
        p[i].revents = 0;
    if (p[0].revents)
      return NULL;
    molt__control_poll_done(l, p + 1);
  }
}

static pid_t server_pid; /* whose name the clients connect to */
static unsigned long connected;

static int connect_server(void) {
  struct sockaddr_un sa;
  socklen_t len = molt__proto_sockaddr(server_pid, &sa);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, len) == 0) {
    connected++;
    return fd;
  }
  if (fd >= 0)
    close(fd);
  return -1;
}

/* Reads whatever the server sent until it closes or `ms` pass; checks it
 * is at most one well-formed response.  Returns its status, 1 for nothing
 * at all (closed or still silent). */
static int read_answer(int fd, int ms) {
  static uint8_t buf[1 << 17];
  size_t n = 0;
  uint64_t deadline = molt__proto_deadline(ms);
  while (n < sizeof buf) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    uint64_t now = molt__proto_deadline(0);
    if (now >= deadline || poll(&p, 1, (int)((deadline - now) / 1000000u) + 1) <= 0)
      break;
    ssize_t k = recv(fd, buf + n, sizeof buf - n, MSG_DONTWAIT);
    if (k <= 0)
      break; /* closed (or reset: the server closed with our bytes unread) */
    n += (size_t)k;
    if (n >= MOLT__PROTO_HDR_SIZE) {
      molt__frame_hdr h;
      char err[256];
      REQUIRE(molt__proto_decode_hdr(buf, MOLT__FRAME_RESPONSE, &h, err, sizeof err) ==
              0);
      if (n >= MOLT__PROTO_HDR_SIZE + h.length) {
        REQUIRE(n == MOLT__PROTO_HDR_SIZE + h.length); /* one response, no more */
        molt__records r;
        REQUIRE(molt__tsv_parse((char *)buf + MOLT__PROTO_HDR_SIZE, h.length,
                                MOLT__PROTO_MAX_RESPONSE_RECORDS, &r, err,
                                sizeof err) == 0);
        REQUIRE(h.status == 0 ||
                (r.count >= 1 && strcmp(r.recs[0].fields[0], "error") == 0));
        molt__tsv_free(&r);
        return h.status;
      }
    }
  }
  /* Nothing, or a response cut short by our deadline or the buffer. */
  return 1;
}

typedef enum { C_WHOLE, C_HALF, C_DRIP, C_SILENT, C_GONE, C_KINDS } client_kind;

typedef struct client {
  int fd;
  client_kind kind;
  input msg;
  size_t sent;
  bool status_request; /* a complete, well-formed status request */
} client;

static bool is_status_request(const input *in) {
  molt__frame_hdr h;
  char err[64];
  return in->len == MOLT__PROTO_HDR_SIZE &&
         molt__proto_decode_hdr(in->data, MOLT__FRAME_REQUEST, &h, err, sizeof err) ==
             0 &&
         h.kind == MOLT__OP_STATUS && h.length == 0;
}

/* One round: up to 48 clients at once (more than the slots), each doing
 * one of the client kinds with a mutated message; then the owner's status.
 * other_uid: only refusals may come back. */
static void server_round(const input *pool, size_t npool, bool other_uid) {
  enum { MAXC = 48 };
  static uint8_t bufs[MAXC][MAX_INPUT + 16];
  client c[MAXC];
  size_t nc = 1 + rnd_below(MAXC);
  for (size_t i = 0; i < nc; i++) {
    const input *seed = &pool[rnd_below(npool)];
    c[i] = (client){.fd = connect_server(), .kind = (client_kind)rnd_below(C_KINDS)};
    c[i].msg = (input){bufs[i], seed->len};
    memcpy(bufs[i], seed->data, seed->len);
    if (rnd_below(3) != 0)
      for (size_t k = 1 + rnd_below(3); k > 0; k--)
        mutate(&c[i].msg, pool, npool);
    c[i].status_request = is_status_request(&c[i].msg);
    if (c[i].fd < 0)
      continue;
    size_t len = c[i].msg.len;
    if (c[i].kind == C_WHOLE) {
      c[i].sent = len;
    } else if (c[i].kind == C_HALF) {
      c[i].sent = len / 2;
    } else if (c[i].kind == C_GONE) {
      close(c[i].fd);
      c[i].fd = -1;
      continue;
    }
    if (c[i].sent > 0)
      (void)send(c[i].fd, c[i].msg.data, c[i].sent, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  /* drippers: a byte each, a few times */
  for (int step = 0; step < 4; step++)
    for (size_t i = 0; i < nc; i++)
      if (c[i].fd >= 0 && c[i].kind == C_DRIP && c[i].sent < c[i].msg.len) {
        (void)send(c[i].fd, c[i].msg.data + c[i].sent, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        c[i].sent++;
      }
  for (size_t i = 0; i < nc; i++) {
    if (c[i].fd < 0)
      continue;
    if (c[i].kind == C_WHOLE) {
      shutdown(c[i].fd, SHUT_WR);
      int st = read_answer(c[i].fd, 2500);
      if (other_uid)
        REQUIRE(st == MOLT_EPERM || st == 1);
      else if (c[i].status_request)
        REQUIRE(st == 0 || st == MOLT_EFULL);
      else if (c[i].msg.len > 0)
        REQUIRE(st <= 0); /* every message that says anything is answered */
    } else {
      /* Whatever came back so far (an eviction, a refusal) is well formed. */
      int st = read_answer(c[i].fd, 0);
      if (other_uid)
        REQUIRE(st == MOLT_EPERM || st == 1);
    }
  }
  for (size_t i = 0; i < nc; i++)
    if (c[i].fd >= 0)
      close(c[i].fd);
}

/* The owner's request gets through at once, whatever the round left. */
static void owner_status(void) {
  int fd = connect_server();
  REQUIRE(fd >= 0);
  unsigned char h[MOLT__PROTO_HDR_SIZE];
  molt__frame_hdr fh = {MOLT__PROTO_MAGIC, MOLT__PROTO_VERSION, MOLT__OP_STATUS, 0, 0};
  molt__proto_encode_hdr(&fh, h);
  REQUIRE(send(fd, h, sizeof h, MSG_NOSIGNAL) == (ssize_t)sizeof h);
  /* 1.5 s: well under the 2 s a held half request may keep a slot. */
  REQUIRE(read_answer(fd, 1500) == 0);
  close(fd);
}

/* rounds of hostile clients against the real server; as root, also from a
 * child of uid 65534. */
static void fuzz_server(const input *pool, size_t npool, long rounds) {
  static molt__fd l;
  char name[108];
  server_pid = getpid();
  REQUIRE(molt__control_listen(&l, name, sizeof name) == 0);
  REQUIRE(pipe(stop_pipe) == 0);
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, server_main, &l) == 0);
  pid_t child = -1;
  if (geteuid() == 0) {
    uint64_t seed = rnd();
    child = fork();
    if (child == 0) {
      /* The other user: its own rounds (the parent's thread is not here;
       * this child only connects, sends and reads). */
      rng_state = seed | 1;
      if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
        _exit(3);
      for (long r = 0; r < rounds; r++)
        server_round(pool, npool, true);
      /* Every round made its connections. */
      _exit(connected >= (unsigned long)rounds ? 0 : 4);
    }
  }
  for (long r = 0; r < rounds; r++) {
    server_round(pool, npool, false);
    owner_status();
  }
  if (child > 0) {
    int ws;
    REQUIRE(waitpid(child, &ws, 0) == child && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  }
  owner_status();
  REQUIRE(write(stop_pipe[1], "x", 1) == 1);
  pthread_join(t, NULL);
  molt__fd_close(&l);
  close(stop_pipe[0]);
  close(stop_pipe[1]);
  REQUIRE(connected >= (unsigned long)rounds);
  printf("fuzz_protocol: %ld server rounds, %lu connections%s, %lu log entries\n", rounds,
         connected, child > 0 ? " (and as many rounds from uid 65534)" : "",
         atomic_load(&logged));
}

int main(int argc, char **argv) {
  long iterations = 200000, rounds = 100;
  if (argc > 1) {
    char *end;
    long v = strtol(argv[1], &end, 10);
    if (*end != '\0')
      return replay(argc, argv);
    iterations = v;
    if (argc > 2)
      rounds = strtol(argv[2], NULL, 10);
  }

  enum { POOL_MAX = 256 };
  input pool[POOL_MAX];
  size_t npool = 0;
  pool[npool++] = make_msg(MOLT__OP_STATUS, 0, "");
  pool[npool++] = make_msg(MOLT__OP_LOG, 0, "");
  pool[npool++] = make_msg(MOLT__OP_APPLY, 0,
                           "path\t/tmp/fix\\t1.so\npolicy\tlocal\n"
                           "timeout_ms\t10000\nfuture\tkey\textra\n");
  pool[npool++] = make_msg(MOLT__OP_ROLLBACK, 0, "policy\tglobal\ntimeout_ms\t-1\n");
  pool[npool++] =
      make_msg(0, MOLT_EBUILDID, "error\tpatch was built for a different program\n");
  pool[npool++] = make_msg(0, 0,
                           "state\tok\npid\t42\ngeneration\t3\nreclaim\tenabled\n"
                           "program\t/usr/bin/srv\tabcdef0123\n"
                           "patch\t1\tfix-1\tdesc with \\\\ and \\n\t/p/f.so\t1\n"
                           "object\tfix-1\t/p/f.so\t1\t2\nlive\t3\t1\tcurrent\t0\n"
                           "function\thandle\tsrv.c\t0\tfix-1\n"
                           "thread\t43\tworker\tgeneration 2\t1\n");
  pool[npool++] = make_msg(0, 0,
                           "log\t1\t1700000000.123456\tstart\t0\t-\truntime "
                           "started\n");
  for (size_t i = 0; i < npool; i++)
    LLVMFuzzerTestOneInput(pool[i].data, pool[i].len);

  uint8_t *work = malloc(MAX_INPUT + 16);
  long accepted = 0;
  for (long it = 0; it < iterations; it++) {
    const input *seed = &pool[rnd_below(npool)];
    input in = {work, seed->len};
    memcpy(work, seed->data, seed->len);
    size_t rounds = 1 + rnd_below(6);
    for (size_t k = 0; k < rounds; k++)
      mutate(&in, pool, npool);
    LLVMFuzzerTestOneInput(in.data, in.len);

    /* Without coverage feedback, "still a well-formed request" is the
     * next best signal of an interesting input: keep some of those so
     * mutations can go deeper than one step from the seeds. */
    molt__frame_hdr h;
    char err[64];
    if (in.len >= MOLT__PROTO_HDR_SIZE &&
        molt__proto_decode_hdr(in.data, MOLT__FRAME_REQUEST, &h, err, sizeof err) == 0 &&
        rnd_below(16) == 0) {
      size_t slot;
      if (npool < POOL_MAX) {
        slot = npool++;
      } else { /* replace a kept input, never a seed */
        slot = 7 + rnd_below(POOL_MAX - 7);
        free(pool[slot].data);
      }
      pool[slot].data = malloc(in.len ? in.len : 1);
      memcpy(pool[slot].data, in.data, in.len);
      pool[slot].len = in.len;
      accepted++;
    }
  }
  free(work);
  fuzz_server(pool, npool, rounds);
  for (size_t i = 0; i < npool; i++)
    free(pool[i].data);
  printf("fuzz_protocol: %ld iterations, %zu inputs in pool, %ld kept\n", iterations,
         npool, accepted);
  return 0;
}
#endif
