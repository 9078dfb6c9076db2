/* kvsload PORT CONNS SECONDS -- load for tests/shadowupd/progs/kvs.c: CONNS
 * threads, one connection each, "SET k v" then "GET k" back to back on
 * keys of their own, every reply checked; prints "requests N seconds S
 * errors E" and exits 1 if there were errors. */
#define _GNU_SOURCE
#include <arpa/inet.h>
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

static int port;
static double seconds;

struct arg {
  int id;
  unsigned long requests, errors;
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One request, one reply line compared with want. */
static int ask(int fd, const char *req, const char *want) {
  char line[256];
  size_t n = 0;
  if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req))
    return -1;
  while (n == 0 || line[n - 1] != '\n') {
    ssize_t r = recv(fd, line + n, sizeof line - 1 - n, 0);
    if (r <= 0)
      return -1;
    n += (size_t)r;
  }
  line[n] = '\0';
  return strcmp(line, want) == 0 ? 0 : 1;
}

static void *run(void *p) {
  struct arg *a = p;
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in s = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  s.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&s, sizeof s) != 0) {
    a->errors++;
    return NULL;
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  double end = now() + seconds;
  for (unsigned long i = 0; now() < end; i++) {
    char req[96], want[96];
    snprintf(req, sizeof req, "SET b%d-%lu v%lu\n", a->id, i % 64, i);
    int rc = ask(fd, req, "OK\n");
    if (rc == 0) {
      snprintf(req, sizeof req, "GET b%d-%lu\n", a->id, i % 64);
      snprintf(want, sizeof want, "VALUE v%lu\n", i);
      rc = ask(fd, req, want);
    }
    if (rc < 0) {
      a->errors++;
      break;
    }
    a->errors += (unsigned long)rc;
    a->requests += 2;
  }
  close(fd);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 4)
    return 2;
  port = atoi(argv[1]);
  int conns = atoi(argv[2]);
  seconds = atof(argv[3]);
  if (conns < 1 || conns > 64)
    return 2;
  pthread_t th[64];
  struct arg a[64] = {{0}};
  double t0 = now();
  for (int i = 0; i < conns; i++) {
    a[i].id = i;
    pthread_create(&th[i], NULL, run, &a[i]);
  }
  unsigned long req = 0, err = 0;
  for (int i = 0; i < conns; i++) {
    pthread_join(th[i], NULL);
    req += a[i].requests;
    err += a[i].errors;
  }
  printf("requests %lu seconds %.6f errors %lu\n", req, now() - t0, err);
  return err ? 1 : 0;
}
