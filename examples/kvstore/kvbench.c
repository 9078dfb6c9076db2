/*
 * kvbench.c — throughput driver for kvstore (the P7 comparison: the server
 * with its whole command layer updatable vs. the plain-gcc build).
 *
 *   kvbench --port N [--conns 8] [--pipeline 32] [--duration 5] [--keys 1000]
 *           [--get-ratio 0.8] [--json]
 *
 * loadgen.py checks every reply but is bound by the Python interpreter long
 * before the server is; this driver only measures.  Each connection runs in
 * its own thread and keeps `pipeline` requests in flight (a mix of GET and
 * SET on its own keys), so the server, not the client, is the bottleneck.
 * Replies are still checked for their kind (VALUE/NOT_FOUND for GET, OK for
 * SET), so a broken server cannot post a good number.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int opt_port = -1, opt_conns = 8, opt_pipeline = 32, opt_keys = 1000;
static double opt_duration = 5.0, opt_get_ratio = 0.8;
static int opt_json;

static atomic_int stop;

struct worker {
  pthread_t th;
  int idx;
  uint64_t requests, errors;
  char err[128];
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* xorshift: cheap, per-thread, good enough for picking keys */
static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static int connect_server(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)opt_port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static int write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  int fd = connect_server();
  if (fd < 0) {
    snprintf(w->err, sizeof w->err, "connect: %s", strerror(errno));
    w->errors++;
    return NULL;
  }
  uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(w->idx + 1);
  size_t cap = (size_t)opt_pipeline * 96 + 64;
  char *out = malloc(cap), *in = malloc(1 << 16);
  char *kinds = malloc((size_t)opt_pipeline); /* 'G' or 'S' per request */
  size_t inlen = 0;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    size_t len = 0;
    for (int i = 0; i < opt_pipeline; i++) {
      unsigned k = (unsigned)(rnd(&seed) % (uint64_t)opt_keys);
      int get = (double)(rnd(&seed) % 1000000) / 1e6 < opt_get_ratio;
      kinds[i] = get ? 'G' : 'S';
      if (get)
        len += (size_t)sprintf(out + len, "GET b%d:%u\n", w->idx, k);
      else
        len += (size_t)sprintf(out + len, "SET b%d:%u value-%u-%llu\n", w->idx, k, k,
                               (unsigned long long)(rnd(&seed) & 0xffff));
    }
    if (write_all(fd, out, len) < 0) {
      snprintf(w->err, sizeof w->err, "send: %s", strerror(errno));
      w->errors++;
      break;
    }
    int got = 0;
    while (got < opt_pipeline) {
      char *nl;
      while (got < opt_pipeline && (nl = memchr(in, '\n', inlen))) {
        size_t l = (size_t)(nl - in) + 1;
        int ok = kinds[got] == 'G'
                     ? (!strncmp(in, "VALUE ", 6) || !strncmp(in, "NOT_FOUND\n", 10))
                     : !strncmp(in, "OK\n", 3);
        if (!ok) {
          if (!w->errors)
            snprintf(w->err, sizeof w->err, "unexpected reply: %.60s", in);
          w->errors++;
        }
        memmove(in, in + l, inlen - l);
        inlen -= l;
        got++;
      }
      if (got == opt_pipeline)
        break;
      if (inlen == 1 << 16) {
        snprintf(w->err, sizeof w->err, "reply line too long");
        w->errors++;
        goto out;
      }
      ssize_t r = recv(fd, in + inlen, (1 << 16) - inlen, 0);
      if (r < 0 && errno == EINTR)
        continue;
      if (r <= 0) {
        snprintf(w->err, sizeof w->err, "recv: %s",
                 r == 0 ? "connection closed" : strerror(errno));
        w->errors++;
        goto out;
      }
      inlen += (size_t)r;
    }
    w->requests += (uint64_t)opt_pipeline;
  }
out:
  close(fd);
  free(out);
  free(in);
  free(kinds);
  return NULL;
}

static void usage(void) {
  fprintf(stderr, "usage: kvbench --port N [--conns 8] [--pipeline 32] "
                  "[--duration 5] [--keys 1000] [--get-ratio 0.8] [--json]\n");
  exit(2);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json")) {
      opt_json = 1;
      continue;
    }
    if (!v)
      usage();
    i++;
    if (!strcmp(a, "--port"))
      opt_port = atoi(v);
    else if (!strcmp(a, "--conns"))
      opt_conns = atoi(v);
    else if (!strcmp(a, "--pipeline"))
      opt_pipeline = atoi(v);
    else if (!strcmp(a, "--duration"))
      opt_duration = atof(v);
    else if (!strcmp(a, "--keys"))
      opt_keys = atoi(v);
    else if (!strcmp(a, "--get-ratio"))
      opt_get_ratio = atof(v);
    else
      usage();
  }
  if (opt_port <= 0 || opt_port > 65535 || opt_conns < 1 || opt_pipeline < 1 ||
      opt_pipeline > 4096 || opt_keys < 1 || opt_duration <= 0)
    usage();

  struct worker *ws = calloc((size_t)opt_conns, sizeof *ws);
  double t0 = now();
  for (int i = 0; i < opt_conns; i++) {
    ws[i].idx = i;
    pthread_create(&ws[i].th, NULL, worker_main, &ws[i]);
  }
  struct timespec d = {.tv_sec = (time_t)opt_duration,
                       .tv_nsec =
                           (long)((opt_duration - (double)(time_t)opt_duration) * 1e9)};
  while (nanosleep(&d, &d) < 0 && errno == EINTR) {
  }
  atomic_store(&stop, 1);
  uint64_t req = 0, err = 0;
  for (int i = 0; i < opt_conns; i++) {
    pthread_join(ws[i].th, NULL);
    req += ws[i].requests;
    err += ws[i].errors;
    if (ws[i].errors)
      fprintf(stderr, "kvbench: connection %d: %s\n", i, ws[i].err);
  }
  double el = now() - t0;
  if (opt_json)
    printf("{\"requests\": %llu, \"errors\": %llu, \"seconds\": %.3f, "
           "\"rps\": %.1f, \"conns\": %d, \"pipeline\": %d}\n",
           (unsigned long long)req, (unsigned long long)err, el, (double)req / el,
           opt_conns, opt_pipeline);
  else
    printf("kvbench: %llu requests in %.2f s: %.0f req/s (%d conns, pipeline "
           "%d), %llu errors\n",
           (unsigned long long)req, el, (double)req / el, opt_conns, opt_pipeline,
           (unsigned long long)err);
  free(ws);
  return err ? 1 : 0;
}
