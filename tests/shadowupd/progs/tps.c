/* tps: a thread-per-connection TCP key-value server for shadowed updates
 * (tests/shadowupd, docs/design.md §17 "Threads started after the fork").
 * The main thread accepts; each connection gets a thread of its own,
 * started with pthread_create (detached) and ended when the client hangs
 * up -- as tinyproxy serves its clients -- so a shadowed update under load
 * follows threads started and ended all the time after its fork.
 *
 *   molt run tps.so PORTFILE [ignored]
 *
 * Requests, one line each: "SET k v" -> "OK", "GET k" -> "VALUE v" or
 * "NONE", "PING" -> "PONG", "VERSION" -> "VERSION n" (n: 1, or the
 * variant), "LIB" -> "LIB rc" after starting (and joining) a thread past
 * the program's pthread_create wrapper, as a library starts one of its
 * own (__real_pthread_create: a shadowed update does not follow it).  Built
 * with -DTPS_VARIANT=N: 1 answers "GET magic" differently; 2 serves each
 * connection in the main thread, starting no thread; 3 serves alike but
 * answers VERSION 3. */
#define _GNU_SOURCE
#include <errno.h>
#include <molt.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef TPS_VARIANT
#define TPS_VARIANT 0
#endif

#define SLOTS 1024

struct slot {
  char key[64];
  char val[64];
};

int listen_fd = -1;
struct slot store[SLOTS];
pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned hash(const char *s) {
  unsigned h = 5381;
  while (*s)
    h = h * 33 + (unsigned char)*s++;
  return h % SLOTS;
}

static void set(const char *k, const char *v) {
  pthread_mutex_lock(&store_lock);
  unsigned h = hash(k);
  for (unsigned i = 0; i < SLOTS; i++) {
    struct slot *s = &store[(h + i) % SLOTS];
    if (!s->key[0] || strcmp(s->key, k) == 0) {
      snprintf(s->key, sizeof s->key, "%s", k);
      snprintf(s->val, sizeof s->val, "%s", v);
      break;
    }
  }
  pthread_mutex_unlock(&store_lock);
}

static int get(const char *k, char *out, size_t len) {
  int found = 0;
  pthread_mutex_lock(&store_lock);
  unsigned h = hash(k);
  for (unsigned i = 0; i < SLOTS; i++) {
    struct slot *s = &store[(h + i) % SLOTS];
    if (!s->key[0])
      break;
    if (strcmp(s->key, k) == 0) {
      snprintf(out, len, "%s", s->val);
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&store_lock);
  return found;
}

/* The real pthread_create, past the image's --wrap (molt/program.h). */
int __real_pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *),
                          void *arg);

static void *lib_main(void *arg) { return arg; }

static void execute(char *line, char *reply, size_t len) {
  char *save = NULL;
  char *cmd = strtok_r(line, " ", &save), *k = strtok_r(NULL, " ", &save),
       *v = strtok_r(NULL, " ", &save);
  char val[64];
  if (cmd && strcmp(cmd, "PING") == 0) {
    snprintf(reply, len, "PONG\n");
  } else if (cmd && strcmp(cmd, "VERSION") == 0) {
    snprintf(reply, len, "VERSION %d\n", TPS_VARIANT ? TPS_VARIANT : 1);
  } else if (cmd && strcmp(cmd, "LIB") == 0) {
    pthread_t th;
    int rc = __real_pthread_create(&th, NULL, lib_main, NULL);
    if (rc == 0)
      pthread_join(th, NULL);
    snprintf(reply, len, "LIB %d\n", rc);
  } else if (cmd && k && v && strcmp(cmd, "SET") == 0) {
    set(k, v);
    snprintf(reply, len, "OK\n");
  } else if (cmd && k && strcmp(cmd, "GET") == 0) {
#if TPS_VARIANT == 1
    if (strcmp(k, "magic") == 0) {
      snprintf(reply, len, "VALUE changed-by-v2\n");
      return;
    }
#endif
    if (get(k, val, sizeof val))
      snprintf(reply, len, "VALUE %s\n", val);
    else
      snprintf(reply, len, "NONE\n");
  } else {
    snprintf(reply, len, "ERROR\n");
  }
}

/* A connection's thread: serves it to its end.  Its argument is the
 * descriptor, so that a full update (or a shadowed update's follower)
 * restarts it on the same connection. */
void *conn_main(void *arg) {
  int fd = (int)(intptr_t)arg;
  char buf[2048];
  size_t len = 0;
  for (;;) {
    molt_update_point("conn");
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0)
      continue;
    ssize_t r = recv(fd, buf + len, sizeof buf - len, 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
      continue;
    if (r <= 0)
      break;
    len += (size_t)r;
    char *nl;
    int bad = 0;
    while (!bad && (nl = memchr(buf, '\n', len))) {
      *nl = '\0';
      char reply[160];
      execute(buf, reply, sizeof reply);
      size_t n = strlen(reply);
      bad = send(fd, reply, n, MSG_NOSIGNAL) != (ssize_t)n;
      size_t used = (size_t)(nl + 1 - buf);
      memmove(buf, nl + 1, len - used);
      len -= used;
    }
    if (bad || len == sizeof buf)
      break;
  }
  close(fd);
  return NULL;
}

int main(int argc, char **argv) {
  if (!molt_is_updating()) {
    if (argc < 2)
      return 2;
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t alen = sizeof a;
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(listen_fd, 128) != 0 ||
        getsockname(listen_fd, (struct sockaddr *)&a, &alen))
      return 3;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    FILE *f = fopen(tmp, "w");
    if (!f)
      return 5;
    fprintf(f, "%d\n", ntohs(a.sin_port));
    fclose(f);
    rename(tmp, argv[1]);
  }
  pthread_attr_t detached;
  pthread_attr_init(&detached);
  pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
  for (;;) {
    molt_update_point("main");
    struct pollfd p = {listen_fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0)
      continue;
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
      continue;
#if TPS_VARIANT == 2
    conn_main((void *)(intptr_t)fd);
#else
    pthread_t th;
    if (pthread_create(&th, &detached, conn_main, (void *)(intptr_t)fd) != 0)
      close(fd);
#endif
  }
  return 0;
}
