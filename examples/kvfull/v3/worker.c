/* kvfull v3 workers: a fixed pool of threads, each serving the connections
 * the acceptor gave it.  A worker passes its update point between two
 * batches of requests, never inside one, so every request is answered by
 * exactly one version and a connection survives any number of updates. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kv.h"

struct conn conns[KV_CONNS_MAX];
struct worker workers[KV_WORKERS_MAX];
pthread_t worker_threads[KV_WORKERS_MAX];
int nworkers;
pthread_mutex_t conn_lock = PTHREAD_MUTEX_INITIALIZER;
unsigned long requests_served;

#define POLL_MS 100 /* fallback only: updates wake workers through wakefd */

void wake_worker(int id) {
  uint64_t one = 1;
  if (write(workers[id].wakefd, &one, sizeof one) < 0) {
    /* EAGAIN: already awake */
  }
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

static char *next_word(char **s) {
  char *p = *s;
  while (*p == ' ')
    p++;
  if (!*p)
    return NULL;
  char *w = p;
  while (*p && *p != ' ')
    p++;
  if (*p)
    *p++ = 0;
  *s = p;
  return w;
}

/* Executes one request line; appends the reply to out.  0, or -1 to close. */
static int execute(char *line, char *out, size_t outcap, size_t *outlen) {
  char *rest = line;
  char *cmd = next_word(&rest);
  char *key;
  char val[KV_LINE_MAX];
  size_t room = outcap - *outlen;
  char *o = out + *outlen;
  int n;

  if (!cmd) {
    n = snprintf(o, room, "ERROR empty request\n");
  } else if (!strcmp(cmd, "GET") && (key = next_word(&rest))) {
    if (store_get(key, val, sizeof val) >= 0)
      n = snprintf(o, room, "VALUE %s\n", val);
    else
      n = snprintf(o, room, "NOT_FOUND\n");
  } else if (!strcmp(cmd, "SET") && (key = next_word(&rest))) {
    while (*rest == ' ')
      rest++;
    n = snprintf(o, room, "STORED %ld\n", store_set(key, rest));
  } else if (!strcmp(cmd, "DEL") && (key = next_word(&rest))) {
    n = snprintf(o, room, store_del(key) ? "DELETED\n" : "NOT_FOUND\n");
  } else if (!strcmp(cmd, "REV") && (key = next_word(&rest))) {
    long r = store_rev(key);
    if (r >= 0)
      n = snprintf(o, room, "REV %ld\n", r);
    else
      n = snprintf(o, room, "NOT_FOUND\n");
  } else if (!strcmp(cmd, "INCR") && (key = next_word(&rest))) {
    long v;
    if (store_incr(key, &v) == 0)
      n = snprintf(o, room, "VALUE %ld\n", v);
    else
      n = snprintf(o, room, "ERROR not an integer\n");
  } else if (!strcmp(cmd, "COUNT")) {
    n = snprintf(o, room, "COUNT %zu\n", store_count());
  } else if (!strcmp(cmd, "VERSION")) {
    n = snprintf(o, room, "VERSION %s\n", KV_VERSION);
  } else if (!strcmp(cmd, "STATS")) {
    n = snprintf(o, room, "STATS version=%s entries=%zu served=%lu\n", KV_VERSION,
                 store_count(), __atomic_load_n(&requests_served, __ATOMIC_RELAXED));
  } else if (!strcmp(cmd, "FILL") && (key = next_word(&rest))) {
    n = snprintf(o, room, "FILLED %zu\n", store_fill(strtoul(key, NULL, 10)));
  } else if (!strcmp(cmd, "QUIT")) {
    return -1;
  } else {
    n = snprintf(o, room, "ERROR unknown command\n");
  }
  if (n > 0)
    *outlen += (size_t)n < room ? (size_t)n : room - 1;
  return 0;
}

static void close_conn(struct conn *c) {
  pthread_mutex_lock(&conn_lock);
  close(c->fd);
  c->fd = -1;
  c->rlen = 0;
  pthread_mutex_unlock(&conn_lock);
}

/* Reads what is there and answers every complete request. */
static void serve(struct conn *c, int wid) {
  ssize_t r = recv(c->fd, c->rbuf + c->rlen, sizeof c->rbuf - c->rlen, 0);
  if (r < 0 && (errno == EINTR || errno == EAGAIN))
    return;
  if (r <= 0) {
    close_conn(c);
    return;
  }
  c->rlen += (size_t)r;
  char out[8192];
  size_t outlen = 0;
  size_t start = 0;
  int quit = 0;
  for (size_t i = 0; i < c->rlen; i++) {
    if (c->rbuf[i] != '\n')
      continue;
    c->rbuf[i] = 0;
    if (i > start && c->rbuf[i - 1] == '\r')
      c->rbuf[i - 1] = 0;
    if (outlen + KV_LINE_MAX + 64 > sizeof out) {
      if (write_all(c->fd, out, outlen) < 0) {
        close_conn(c);
        return;
      }
      outlen = 0;
    }
    if (execute(c->rbuf + start, out, sizeof out, &outlen) < 0)
      quit = 1;
    c->served++;
    workers[wid].served++;
    __atomic_add_fetch(&requests_served, 1, __ATOMIC_RELAXED);
    start = i + 1;
    if (quit)
      break;
  }
  if (outlen && write_all(c->fd, out, outlen) < 0)
    quit = 1;
  if (quit) {
    close_conn(c);
    return;
  }
  memmove(c->rbuf, c->rbuf + start, c->rlen - start);
  c->rlen -= start;
  if (c->rlen == sizeof c->rbuf) { /* a line longer than the buffer */
    write_all(c->fd, "ERROR line too long\n", 20);
    close_conn(c);
  }
}

/* Entry function of every worker: after an update it starts again here,
 * in the new version, with the same id. */
void *worker_main(void *arg) {
  int id = (int)(intptr_t)arg;
  struct pollfd pfd[KV_CONNS_MAX + 1];
  int slot[KV_CONNS_MAX + 1];

  if (molt_is_updating())
    workers[id].restarts++;
  while (!atomic_load_explicit(&stopping, memory_order_relaxed)) {
    molt_update_point("worker");
    int n = 0;
    pfd[n].fd = workers[id].wakefd;
    pfd[n].events = POLLIN;
    slot[n++] = -1;
    pthread_mutex_lock(&conn_lock);
    for (int i = 0; i < KV_CONNS_MAX; i++) {
      if (conns[i].fd >= 0 && conns[i].worker == id) {
        pfd[n].fd = conns[i].fd;
        pfd[n].events = POLLIN;
        slot[n++] = i;
      }
    }
    pthread_mutex_unlock(&conn_lock);
    int r = poll(pfd, (nfds_t)n, POLL_MS);
    if (r <= 0)
      continue;
    if (pfd[0].revents) {
      uint64_t v;
      if (read(workers[id].wakefd, &v, sizeof v) < 0) {
        /* EAGAIN: someone else drained it */
      }
    }
    for (int k = 1; k < n; k++)
      if (pfd[k].revents)
        serve(&conns[slot[k]], id);
  }
  return NULL;
}
