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
 */
#include "common/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

int main(int argc, char **argv) {
  long iterations = 200000;
  if (argc > 1) {
    char *end;
    long v = strtol(argv[1], &end, 10);
    if (*end != '\0')
      return replay(argc, argv);
    iterations = v;
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
  for (size_t i = 0; i < npool; i++)
    free(pool[i].data);
  printf("fuzz_protocol: %ld iterations, %zu inputs in pool, %ld kept\n", iterations,
         npool, accepted);
  return 0;
}
#endif
