/*
 * kv_net.c — one client connection: split the input into lines, hand each
 * line to the command layer, buffer the replies and write them out.
 *
 * Sockets are non-blocking and serviced by the worker pool of kvstore.c
 * (epoll, EPOLLONESHOT): at most one worker services a connection at a time,
 * so a connection needs no lock.  A worker never blocks on one client: when
 * the client does not read its replies fast enough, the connection waits for
 * EPOLLOUT and stops reading more requests (back-pressure) until the pending
 * output is written.
 *
 * Not updatable: this code holds per-connection state across requests, and
 * keeping it out of the command layer means connections survive any patch.
 */
#include "kv.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* Input buffer: one maximal line, its "\r\n", and the terminating NUL. */
#define IN_CAP (KV_MAX_LINE + 3)
/* Stop executing requests while this much output is waiting. */
#define OUT_HIGH_WATER (256 * 1024)
/* Reads per service call, so one busy client cannot hog a worker. */
#define READS_PER_TURN 8

struct kv_conn {
  /*
   * Held by the worker servicing the connection, from before its first
   * access until after it re-armed the fd.  EPOLLONESHOT already makes
   * workers take turns, and epoll orders one turn before the next, so the
   * lock is never contended (the next worker can at most wait for the
   * previous one to get from epoll_ctl to the unlock).  It is here because
   * it states the hand-off in terms every race checker understands:
   * ThreadSanitizer (gcc 12) models epoll_ctl(ADD) but not (MOD).
   */
  pthread_mutex_t lock;
  int fd;
  int closing; /* no more input: close once the output is written */
  struct kv_session sess;
  size_t inlen;
  size_t outoff; /* bytes of out already written */
  struct kv_out out;
  char in[IN_CAP];
};

void kv_out_append(struct kv_out *out, const void *p, size_t n) {
  if (out->oom)
    return;
  if (out->len + n > out->cap) {
    size_t cap = out->cap ? out->cap : 4096;
    while (cap < out->len + n)
      cap *= 2;
    char *d = realloc(out->data, cap);
    if (!d) {
      out->oom = 1;
      return;
    }
    out->data = d;
    out->cap = cap;
  }
  memcpy(out->data + out->len, p, n);
  out->len += n;
}

struct kv_conn *kv_conn_new(int fd, struct kv_store *store, unsigned long id) {
  struct kv_conn *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  pthread_mutex_init(&c->lock, NULL);
  c->fd = fd;
  c->sess.store = store;
  c->sess.id = id;
  return c;
}

void kv_conn_free(struct kv_conn *c) {
  if (!c)
    return;
  close(c->fd);
  pthread_mutex_destroy(&c->lock);
  free(c->out.data);
  free(c);
}

/* Writes as much pending output as the socket takes.  Returns 1 when all of
 * it is written, 0 when some remains, -1 on a socket error. */
static int flush_out(struct kv_conn *c) {
  while (c->outoff < c->out.len) {
    ssize_t n = send(c->fd, c->out.data + c->outoff, c->out.len - c->outoff,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c->outoff += (size_t)n;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return 0;
    } else {
      return -1;
    }
  }
  c->outoff = c->out.len = 0;
  /* A burst (a huge pipelined batch) may have grown the buffer a lot; do not
   * keep that memory for the life of the connection. */
  if (c->out.cap > 4 * OUT_HIGH_WATER) {
    free(c->out.data);
    c->out.data = NULL;
    c->out.cap = 0;
  }
  return 1;
}

/* Executes every complete line in the input buffer, stopping early when the
 * output passes the high-water mark or a command asks to close. */
static void run_lines(struct kv_conn *c) {
  size_t start = 0;
  while (!c->closing && c->out.len - c->outoff < OUT_HIGH_WATER) {
    char *nl = memchr(c->in + start, '\n', c->inlen - start);
    if (!nl)
      break;
    size_t len = (size_t)(nl - (c->in + start));
    char *line = c->in + start;
    start += len + 1;
    if (len > 0 && line[len - 1] == '\r')
      len--;
    line[len] = '\0';
    if (kv_dispatch(&c->sess, line, len, &c->out) != 0)
      c->closing = 1;
  }
  memmove(c->in, c->in + start, c->inlen - start);
  c->inlen -= start;
  /* A full buffer without a newline can never become a valid request. */
  if (!c->closing && c->inlen >= IN_CAP - 1 && !memchr(c->in, '\n', c->inlen)) {
    kv_format_reply(&c->out, "ERROR", "line too long", 13);
    c->closing = 1;
  }
}

static unsigned service(struct kv_conn *c);

int kv_conn_service(struct kv_conn *c, int epfd) {
  pthread_mutex_lock(&c->lock);
  unsigned want = service(c);
  if (want) {
    struct epoll_event ev = {.events = want | EPOLLONESHOT, .data.ptr = c};
    if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0) {
      pthread_mutex_unlock(&c->lock);
      return 0;
    }
  }
  /* Finished (or cannot be re-armed).  EPOLLONESHOT: no other worker holds
   * an event for c, and after EPOLL_CTL_DEL none can get one. */
  epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
  pthread_mutex_unlock(&c->lock);
  kv_conn_free(c);
  return 1;
}

static unsigned service(struct kv_conn *c) {
  for (int turn = 0;; turn++) {
    int f = flush_out(c);
    if (f < 0 || c->out.oom)
      return 0;
    if (f == 0)
      return EPOLLOUT; /* back-pressure: read nothing until written */
    if (c->closing)
      return 0;
    /* Lines left over from a turn cut short by the high-water mark. */
    if (memchr(c->in, '\n', c->inlen)) {
      run_lines(c);
      continue;
    }
    if (turn >= READS_PER_TURN)
      return EPOLLIN; /* level-triggered: fires again at once if data waits */
    ssize_t n = recv(c->fd, c->in + c->inlen, IN_CAP - 1 - c->inlen, MSG_DONTWAIT);
    if (n > 0) {
      c->inlen += (size_t)n;
      run_lines(c);
    } else if (n == 0) {
      /* Peer closed its side: answer what we have (a last line without a
       * newline is dropped, as the protocol requires one), then close. */
      c->closing = 1;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return EPOLLIN;
    } else {
      return 0;
    }
  }
}
