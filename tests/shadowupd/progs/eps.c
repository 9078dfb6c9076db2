/* eps: a small multi-threaded epoll server for shadowed updates
 * (tests/shadowupd).  An acceptor thread waits on its own epoll instance
 * for the listening socket, accepts, and hands each connection to a worker
 * by registering it in that worker's epoll instance (EPOLLONESHOT, armed
 * again after each request), its data a pointer to the connection's own
 * heap struct -- a value that differs between a leader and its follower
 * for connections accepted after the fork (docs/design.md §17, "epoll").
 *
 *   molt run eps.so PORTFILE [WORKERS]
 *
 * Requests, one line each: "SET k v" -> "OK", "GET k" -> "VALUE v" or
 * "NONE", "PING" -> "PONG", "VERSION" -> "VERSION n" (n: 1, or the
 * variant), "EPOLL" -> "EPOLL n same" after registering the connection in
 * an epoll instance made for it (EPOLLOUT), waiting on it once and closing
 * it: n events, "same" if the event's data was the connection's; "DUP" ->
 * "DUP fd" after registering the listening socket and the acceptor's epoll
 * instance with the same data in a new instance fd, all kept open (a shadowed update cannot
 * tell their events apart: it is dropped, or refused); "RAW" -> "RAW n"
 * after an epoll_wait made with syscall(), past the wrappers (a shadowed
 * update's backstop ends the follower there); "NAP" -> "NAP".  Built
 * with -DEPS_VARIANT=N: 1 answers "GET magic" differently; 2 serves alike
 * but allocates its connections from another size class (its pointers
 * differ from the old version's), and sleeps 2 s before it answers "NAP"
 * (a follower's worker that lags behind the others).  With EPS_LEVEL set in the environment
 * the connections are registered level-triggered instead (no
 * EPOLLONESHOT, never modified). */
#define _GNU_SOURCE
#include <errno.h>
#include <molt.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef EPS_VARIANT
#define EPS_VARIANT 0
#endif

#define WORKERS_MAX 8
#define SLOTS 1024

struct conn {
  int fd;
  int worker;
  size_t len;
  char buf[2048]; /* a request line not complete yet */
};

struct listener {
  int fd;
};

struct slot {
  char key[64];
  char val[64];
};

int nworkers;
int acceptor_ep = -1;
int worker_ep[WORKERS_MAX];
struct listener *listener;
struct slot store[SLOTS];
pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_t threads[WORKERS_MAX + 1];
unsigned next_worker;
int level; /* EPS_LEVEL: level-triggered connections */

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

/* "EPOLL": an instance of its own for this connection, made, waited on
 * once and closed. */
static void epoll_probe(struct conn *c, char *reply, size_t len) {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = c}, got[4];
  int n = -1;
  if (ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) == 0)
    n = epoll_wait(ep, got, 4, 1000);
  snprintf(reply, len, "EPOLL %d %s\n", n,
           n == 1 && got[0].data.ptr == c ? "same" : "other");
  if (ep >= 0)
    close(ep);
}

static void execute(struct conn *c, char *line, char *reply, size_t len) {
  char *save = NULL;
  char *cmd = strtok_r(line, " ", &save), *k = strtok_r(NULL, " ", &save),
       *v = strtok_r(NULL, " ", &save);
  char val[64];
  if (cmd && strcmp(cmd, "PING") == 0) {
    snprintf(reply, len, "PONG\n");
  } else if (cmd && strcmp(cmd, "NAP") == 0) {
#if EPS_VARIANT == 2
    struct timespec nap = {2, 0};
    nanosleep(&nap, NULL);
#endif
    snprintf(reply, len, "NAP\n");
  } else if (cmd && strcmp(cmd, "VERSION") == 0) {
    snprintf(reply, len, "VERSION %d\n", EPS_VARIANT ? EPS_VARIANT : 1);
  } else if (cmd && strcmp(cmd, "EPOLL") == 0) {
    epoll_probe(c, reply, len);
  } else if (cmd && strcmp(cmd, "RAW") == 0) {
    struct epoll_event ev;
    long n = syscall(SYS_epoll_wait, acceptor_ep, &ev, 1, 0);
    snprintf(reply, len, "RAW %ld\n", n);
  } else if (cmd && strcmp(cmd, "DUP") == 0) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, listener->fd, &ev);
    epoll_ctl(ep, EPOLL_CTL_ADD, acceptor_ep, &ev);
    snprintf(reply, len, "DUP %d\n", ep);
  } else if (cmd && k && v && strcmp(cmd, "SET") == 0) {
    set(k, v);
    snprintf(reply, len, "OK\n");
  } else if (cmd && k && strcmp(cmd, "GET") == 0) {
#if EPS_VARIANT == 1
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

static void drop(struct conn *c) {
  close(c->fd); /* its registration goes with it */
  free(c);
}

/* Reads what the connection has and answers every complete line; then
 * arms its one-shot registration again.  false: the connection is gone. */
static int serve(struct conn *c) {
  ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
  if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
    return 0;
  if (r > 0)
    c->len += (size_t)r;
  char *nl;
  while ((nl = memchr(c->buf, '\n', c->len))) {
    *nl = '\0';
    char reply[160];
    execute(c, c->buf, reply, sizeof reply);
    size_t n = strlen(reply);
    if (send(c->fd, reply, n, MSG_NOSIGNAL) != (ssize_t)n)
      return 0;
    size_t used = (size_t)(nl + 1 - c->buf);
    memmove(c->buf, nl + 1, c->len - used);
    c->len -= used;
  }
  if (c->len == sizeof c->buf)
    return 0;
  if (level)
    return 1;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, .data.ptr = c};
  return epoll_ctl(worker_ep[c->worker], EPOLL_CTL_MOD, c->fd, &ev) == 0;
}

static void *worker_main(void *arg) {
  int w = (int)(intptr_t)arg;
  struct epoll_event ev[16];
  for (;;) {
    molt_update_point("worker");
    int n = epoll_wait(worker_ep[w], ev, 16, 50);
    for (int i = 0; i < n; i++) {
      struct conn *c = ev[i].data.ptr;
      if (!serve(c))
        drop(c);
    }
  }
  return NULL;
}

static void *acceptor_main(void *arg) {
  (void)arg;
  struct epoll_event ev[4];
  for (;;) {
    molt_update_point("acceptor");
    int n = epoll_wait(acceptor_ep, ev, 4, 50);
    for (int i = 0; i < n; i++) {
      struct listener *l = ev[i].data.ptr;
      int fd;
      while ((fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        /* variant 2: another size class, so other addresses */
        struct conn *c = calloc(1, sizeof *c + (EPS_VARIANT == 2 ? 4096 : 0));
        if (!c) {
          close(fd);
          continue;
        }
        c->fd = fd;
        c->worker = (int)(next_worker++ % (unsigned)nworkers);
        struct epoll_event cev = {.events = EPOLLIN | EPOLLRDHUP |
                                            (level ? 0u : (unsigned)EPOLLONESHOT),
                                  .data.ptr = c};
        if (epoll_ctl(worker_ep[c->worker], EPOLL_CTL_ADD, fd, &cev) != 0)
          drop(c);
      }
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (!molt_is_updating()) {
    if (argc < 2)
      return 2;
    nworkers = argc > 2 ? atoi(argv[2]) : 3;
    if (nworkers < 1 || nworkers > WORKERS_MAX)
      return 2;
    level = getenv("EPS_LEVEL") != NULL;
    listener = calloc(1, sizeof *listener);
    listener->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t alen = sizeof a;
    if (listener->fd < 0 || bind(listener->fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(listener->fd, 64) != 0 ||
        getsockname(listener->fd, (struct sockaddr *)&a, &alen))
      return 3;
    acceptor_ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = listener};
    if (acceptor_ep < 0 || epoll_ctl(acceptor_ep, EPOLL_CTL_ADD, listener->fd, &lev) != 0)
      return 3;
    for (int i = 0; i < nworkers; i++) {
      worker_ep[i] = epoll_create1(EPOLL_CLOEXEC);
      if (worker_ep[i] < 0)
        return 3;
    }
    for (int i = 0; i < nworkers; i++)
      if (pthread_create(&threads[i], NULL, worker_main, (void *)(intptr_t)i) != 0)
        return 4;
    if (pthread_create(&threads[nworkers], NULL, acceptor_main, NULL) != 0)
      return 4;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    FILE *f = fopen(tmp, "w");
    if (!f)
      return 5;
    fprintf(f, "%d\n", ntohs(a.sin_port));
    fclose(f);
    rename(tmp, argv[1]);
  }
  for (;;) {
    molt_update_point("main");
    poll(NULL, 0, 50);
  }
  return 0;
}
