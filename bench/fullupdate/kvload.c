/* kvload -- load and probes for kvfull (bench/fullupdate).  Plain C, never
 * built with moltcc: it is the client.
 *
 *   kvload tput PORT CONNS SECONDS KEYS
 *       CONNS threads, one connection each, request/response back to back
 *       (90% GET fill:<i>, 10% SET) for SECONDS; prints
 *       "requests N seconds S errors E".
 *   kvload watch PORT VERSION TIMEOUT
 *       one connection sending VERSION back to back; prints "ready" once
 *       connected, then, when the first "VERSION <VERSION>" arrives,
 *       "first NS sent NS maxgap NS requests N" (CLOCK_MONOTONIC
 *       nanoseconds: the reply's arrival, when that request was sent, and
 *       the longest wait for one reply) and exits 0; exits 1 on timeout.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    perror("kvload: connect");
    exit(2);
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

struct conn {
  int fd;
  char buf[4096];
  size_t len;
};

/* One reply line (without '\n') into line; -1 if the connection closed. */
static int read_line(struct conn *c, char *line, size_t cap) {
  for (;;) {
    char *nl = memchr(c->buf, '\n', c->len);
    if (nl) {
      size_t n = (size_t)(nl - c->buf);
      size_t k = n < cap - 1 ? n : cap - 1;
      memcpy(line, c->buf, k);
      line[k] = 0;
      memmove(c->buf, nl + 1, c->len - n - 1);
      c->len -= n + 1;
      return 0;
    }
    ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    c->len += (size_t)r;
  }
}

static int send_all(int fd, const char *p, size_t n) {
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

struct tput_arg {
  int port, keys;
  uint64_t end_ns;
  unsigned long requests, errors;
  unsigned seed;
};

static void *tput_thread(void *p) {
  struct tput_arg *a = p;
  struct conn c = {.fd = connect_to(a->port)};
  char req[96], line[256];
  while (now_ns() < a->end_ns) {
    int k = (int)(rand_r(&a->seed) % (unsigned)a->keys);
    int n;
    int is_set = rand_r(&a->seed) % 10 == 0;
    if (is_set)
      n = snprintf(req, sizeof req, "SET fill:%d value-%d\n", k, k);
    else
      n = snprintf(req, sizeof req, "GET fill:%d\n", k);
    if (send_all(c.fd, req, (size_t)n) < 0 || read_line(&c, line, sizeof line) < 0) {
      a->errors++;
      break;
    }
    if (is_set ? strncmp(line, "STORED", 6) != 0 : strncmp(line, "VALUE value-", 12) != 0)
      a->errors++;
    a->requests++;
  }
  close(c.fd);
  return NULL;
}

static int tput(int port, int conns, double seconds, int keys) {
  pthread_t th[64];
  struct tput_arg args[64];
  if (conns < 1 || conns > 64)
    return 2;
  uint64_t t0 = now_ns();
  for (int i = 0; i < conns; i++) {
    args[i] = (struct tput_arg){port, keys, t0 + (uint64_t)(seconds * 1e9),
                                0,    0,    (unsigned)(i * 7919 + 1)};
    pthread_create(&th[i], NULL, tput_thread, &args[i]);
  }
  unsigned long req = 0, err = 0;
  for (int i = 0; i < conns; i++) {
    pthread_join(th[i], NULL);
    req += args[i].requests;
    err += args[i].errors;
  }
  printf("requests %lu seconds %.6f errors %lu\n", req, (double)(now_ns() - t0) / 1e9,
         err);
  return err ? 1 : 0;
}

static int watch(int port, const char *version, double timeout) {
  struct conn c = {.fd = connect_to(port)};
  char want[64], line[256];
  snprintf(want, sizeof want, "VERSION %s", version);
  printf("ready\n");
  fflush(stdout);
  uint64_t end = now_ns() + (uint64_t)(timeout * 1e9), maxgap = 0;
  unsigned long n = 0;
  while (now_ns() < end) {
    uint64_t sent = now_ns();
    if (send_all(c.fd, "VERSION\n", 8) < 0 || read_line(&c, line, sizeof line) < 0) {
      fprintf(stderr, "kvload: connection lost\n");
      return 2;
    }
    uint64_t got = now_ns();
    n++;
    if (got - sent > maxgap)
      maxgap = got - sent;
    if (strcmp(line, want) == 0) {
      printf("first %llu sent %llu maxgap %llu requests %lu\n", (unsigned long long)got,
             (unsigned long long)sent, (unsigned long long)maxgap, n);
      return 0;
    }
  }
  fprintf(stderr, "kvload: no '%s' within %.1f s\n", want, timeout);
  return 1;
}

int main(int argc, char **argv) {
  if (argc == 6 && !strcmp(argv[1], "tput"))
    return tput(atoi(argv[2]), atoi(argv[3]), atof(argv[4]), atoi(argv[5]));
  if (argc == 5 && !strcmp(argv[1], "watch"))
    return watch(atoi(argv[2]), argv[3], atof(argv[4]));
  fprintf(stderr,
          "usage: kvload tput PORT CONNS SECONDS KEYS | watch PORT VERSION TIMEOUT\n");
  return 2;
}
