/* The calls a shadowed update covers (shadow.h, MOLT__SHADOW_CALLS).
 *
 * Program images are linked with --wrap for each of them (moltcc
 * --molt-program), so the image's own calls land here; calls made inside
 * libc or other libraries do not (docs/design.md §17 lists what is and is
 * not covered).  Outside a shadowed update, and on threads that are not
 * followed, each wrapper is the plain call after one relaxed flag test.
 *
 * Leader: the call runs, then its arguments, the bytes it passed and the
 * bytes it wrote are recorded.  Follower: nothing runs; the same call is
 * compared with the leader's record and gets the leader's result (errno
 * included), the buffers the leader's call filled copied into its own.
 * A descriptor a leader's accept created reaches the follower, at the same
 * number, when it replays the accept; a close() the leader made is made on
 * the follower's copy too, so that the follower does not keep open a
 * connection the leader closed (fds.c). */
#include "shadow/shadow.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <sys/random.h>
#include <sys/time.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include "molt/program.h"

/* The follower's result: the leader's, with its errno (true).  false: the
 * thread leads from this call on (molt promote, or the leader is gone):
 * the caller makes the call and records it as a leader does.  The replay's
 * own calls are not trapped (trap.c); a thread that leads from here stays
 * allowed, since its calls are real from now on (a thread that follows
 * again blocks at the end of its next replay). */
static bool replay(const molt__sc *c, int64_t *ret) {
  int e = 0;
  molt__shadow_trap_allow();
  if (!molt__shadow_replay(c, ret, &e))
    return false;
  /* A thread that completed a call the dead leader was inside of runs
   * alone from now on: its calls are real, the backstop stays off. */
  if (molt__shadow_follows())
    molt__shadow_trap_block();
  errno = e;
  return true;
}

static void record(const molt__sc *c, int64_t ret, size_t out_len) {
  int e = errno;
  molt__shadow_record(c, ret, e, out_len);
  errno = e;
}

/* The leader's read, recv, write and send go through an intent
 * (molt__shadow_intent_begin): the record is reserved before the call, a
 * read's bytes land in it (shared memory) and are copied to buf after, so
 * that a follower outliving the leader can complete the call (design §17,
 * "The leader dies").  These end such a call: its result recorded, errno
 * kept. */
static ssize_t intent_end(molt__shadow_intent *it, ssize_t r, void *buf) {
  int e = errno;
  if (r > 0 && buf)
    memcpy(buf, it->data, (size_t)r);
  molt__shadow_intent_end(it, r, e);
  errno = e;
  return r;
}

ssize_t __wrap_read(int fd, void *buf, size_t n) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return read(fd, buf, n);
  molt__sc c = {MOLT__SC_READ, {fd, (int64_t)n, 0}, NULL, 0, buf, n, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (ssize_t)rr;
  molt__shadow_intent it;
  if (molt__shadow_intent_begin(&c, &it))
    return intent_end(&it, read(fd, it.data, n), buf);
  ssize_t r = read(fd, buf, n);
  record(&c, r, r > 0 ? (size_t)r : 0);
  return r;
}

ssize_t __wrap_recv(int fd, void *buf, size_t n, int flags) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return recv(fd, buf, n, flags);
  molt__sc c = {MOLT__SC_RECV, {fd, (int64_t)n, flags}, NULL, 0, buf, n, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (ssize_t)rr;
  molt__shadow_intent it;
  if (molt__shadow_intent_begin(&c, &it))
    return intent_end(&it, recv(fd, it.data, n, flags), buf);
  ssize_t r = recv(fd, buf, n, flags);
  record(&c, r, r > 0 ? (size_t)r : 0);
  return r;
}

ssize_t __wrap_write(int fd, const void *buf, size_t n) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return write(fd, buf, n);
  molt__sc c = {MOLT__SC_WRITE, {fd, (int64_t)n, 0}, buf, n, NULL, 0, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (ssize_t)rr;
  molt__shadow_intent it;
  if (molt__shadow_intent_begin(&c, &it))
    return intent_end(&it, write(fd, buf, n), NULL);
  ssize_t r = write(fd, buf, n);
  record(&c, r, 0);
  return r;
}

ssize_t __wrap_send(int fd, const void *buf, size_t n, int flags) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return send(fd, buf, n, flags);
  molt__sc c = {MOLT__SC_SEND, {fd, (int64_t)n, flags}, buf, n, NULL, 0, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (ssize_t)rr;
  molt__shadow_intent it;
  if (molt__shadow_intent_begin(&c, &it))
    return intent_end(&it, send(fd, buf, n, flags), NULL);
  ssize_t r = send(fd, buf, n, flags);
  record(&c, r, 0);
  return r;
}

/* accept and accept4: the output is the address length and the address. */
static int accept_common(molt__sc_kind kind, int fd, struct sockaddr *addr,
                         socklen_t *len, int flags) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return kind == MOLT__SC_ACCEPT ? accept(fd, addr, len)
                                   : accept4(fd, addr, len, flags);
  struct {
    socklen_t len;
    struct sockaddr_storage a;
  } out = {0};
  socklen_t cap = addr && len ? *len : 0;
  molt__sc c = {kind, {fd, flags, cap}, NULL, 0, &out, sizeof out, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr)) {
    int r = (int)rr;
    if (r >= 0 && addr && len) {
      int e = errno;
      memcpy(addr, &out.a, out.len < cap ? out.len : cap);
      *len = out.len;
      errno = e;
    }
    return r;
  }
  out.len = sizeof out.a;
  int r = kind == MOLT__SC_ACCEPT
              ? accept(fd, (struct sockaddr *)&out.a, &out.len)
              : accept4(fd, (struct sockaddr *)&out.a, &out.len, flags);
  if (r >= 0 && addr && len) {
    memcpy(addr, &out.a, out.len < cap ? out.len : cap);
    *len = out.len;
  }
  record(&c, r, r >= 0 ? sizeof out : 0);
  return r;
}

int __wrap_accept(int fd, struct sockaddr *addr, socklen_t *len) {
  return accept_common(MOLT__SC_ACCEPT, fd, addr, len, 0);
}

int __wrap_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
  return accept_common(MOLT__SC_ACCEPT4, fd, addr, len, flags);
}

/* poll: compared on its entries as a set -- (fd, events) pairs sorted --
 * and each entry's revents taken from the leader's entry of the same fd.
 * The order of the entries is not compared: a server that builds its set
 * from a table shared with other threads (kvfull's connection slots) lists
 * the same descriptors in another order when the follower's threads
 * freed and took slots in another interleaving (docs/design.md §17). */
typedef struct poll_entry {
  int32_t fd;
  int16_t events, pad;
} poll_entry;

/* want[0..n) sorted by (fd, events), idx[k] the position in fds of want[k]. */
static void poll_sorted(const struct pollfd *fds, nfds_t n, poll_entry *want,
                        uint16_t *idx) {
  for (nfds_t i = 0; i < n; i++) {
    poll_entry e = {fds[i].fd, fds[i].events, 0};
    nfds_t k = i;
    while (k > 0 && (want[k - 1].fd > e.fd ||
                     (want[k - 1].fd == e.fd && want[k - 1].events > e.events))) {
      want[k] = want[k - 1];
      idx[k] = idx[k - 1];
      k--;
    }
    want[k] = e;
    idx[k] = (uint16_t)i;
  }
}

int __wrap_poll(struct pollfd *fds, nfds_t n, int timeout) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return poll(fds, n, timeout);
  if (n > 1024) {
    if (role == MOLT__SHADOW_FOLLOWER)
      molt__shadow_follower_fail(MOLT__SHADOW_END_DIVERGED,
                                 "poll of %zu descriptors: at most 1024 are followed",
                                 (size_t)n);
    return poll(fds, n, timeout);
  }
  poll_entry want[1024];
  uint16_t idx[1024];
  short revents[1024]; /* in want's order */
  poll_sorted(fds, n, want, idx);
  molt__sc c = {MOLT__SC_POLL, {(int64_t)n, timeout, 0}, want, n * sizeof want[0],
                revents,       n * sizeof revents[0],    0};
  memset(revents, 0, n * sizeof revents[0]); /* a follower's retry returns no event */
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr)) {
    if (rr >= 0)
      for (nfds_t k = 0; k < n; k++)
        fds[idx[k]].revents = revents[k];
    return (int)rr;
  }
  int r = poll(fds, n, timeout);
  for (nfds_t k = 0; k < n; k++)
    revents[k] = fds[idx[k]].revents;
  record(&c, r, r >= 0 ? n * sizeof revents[0] : 0);
  return r;
}

/* epoll_create, epoll_ctl and the epoll waits: epoll.c. */

/* close: also the descriptor's epoll registrations (epoll.c): deleted from
 * the kernel's instances by the side that leads -- the other process's
 * copy of the descriptor would keep them -- and from the tables. */
int __wrap_close(int fd) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE) {
    molt__shadow_epoll_closing(fd, true, MOLT__SHADOW_ANY_GEN);
    return close(fd);
  }
  molt__sc c = {MOLT__SC_CLOSE, {fd, 0, 0}, NULL, 0, NULL, 0, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr)) {
    if (rr == 0)
      molt__shadow_epoll_closing(fd, false, molt__shadow_replayed_fd_gen());
    return (int)rr; /* the follower's copy: closed by the replay (fds.c) */
  }
  molt__shadow_epoll_closing(fd, true, MOLT__SHADOW_ANY_GEN);
  c.fd_gen = molt__shadow_fd_gen(fd); /* before the number can be reused */
  int r = close(fd);
  record(&c, r, 0);
  return r;
}

/* ---- descriptors made by name ---------------------------------------------------
 * socket, open and openat: compared on their arguments (a path as bytes);
 * the descriptor the leader got reaches the follower at the same number
 * (fds.c), like an accepted one. */

int __wrap_socket(int domain, int type, int protocol) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return socket(domain, type, protocol);
  molt__sc c = {MOLT__SC_SOCKET, {domain, type, protocol}, NULL, 0, NULL, 0, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (int)rr;
  int r = socket(domain, type, protocol);
  record(&c, r, 0);
  return r;
}

/* The mode argument, present when flags create a file. */
#define MODE_ARG(flags, last, mode)                                                      \
  do {                                                                                   \
    if ((flags) & (O_CREAT | O_TMPFILE)) {                                               \
      va_list ap;                                                                        \
      va_start(ap, last);                                                                \
      mode = va_arg(ap, unsigned);                                                       \
      va_end(ap);                                                                        \
    }                                                                                    \
  } while (0)

int __wrap_open(const char *path, int flags, ...) {
  unsigned mode = 0;
  MODE_ARG(flags, flags, mode);
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return open(path, flags, mode);
  molt__sc c = {MOLT__SC_OPEN, {flags, mode, 0}, path, strlen(path), NULL, 0, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (int)rr;
  int r = open(path, flags, mode);
  record(&c, r, 0);
  return r;
}

int __wrap_openat(int dirfd, const char *path, int flags, ...) {
  unsigned mode = 0;
  MODE_ARG(flags, flags, mode);
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return openat(dirfd, path, flags, mode);
  molt__sc c = {MOLT__SC_OPENAT, {dirfd, flags, mode}, path, strlen(path), NULL, 0, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (int)rr;
  int r = openat(dirfd, path, flags, mode);
  record(&c, r, 0);
  return r;
}

/* ---- time and randomness ----------------------------------------------------------
 * The leader's values: the follower gets what the leader's call returned,
 * so that a reply carrying a time stamp or a random token is the same in
 * both.  Compared on the clock (time, gettimeofday: whether each pointer
 * was given; getrandom: the length and flags), never on the values. */

int __wrap_clock_gettime(clockid_t clock, struct timespec *ts) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return clock_gettime(clock, ts);
  struct timespec v = {0, 0};
  molt__sc c = {MOLT__SC_CLOCK_GETTIME, {clock, 0, 0}, NULL, 0, &v, sizeof v, 0};
  int r;
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr)) {
    r = (int)rr;
  } else {
    r = clock_gettime(clock, &v);
    record(&c, r, r == 0 ? sizeof v : 0);
  }
  if (r == 0 && ts)
    *ts = v;
  return r;
}

int __wrap_gettimeofday(struct timeval *tv, void *tz) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return gettimeofday(tv, tz);
  struct {
    struct timeval tv;
    struct timezone tz;
  } v = {{0, 0}, {0, 0}};
  molt__sc c = {
      MOLT__SC_GETTIMEOFDAY, {tv != NULL, tz != NULL, 0}, NULL, 0, &v, sizeof v, 0};
  int r;
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr)) {
    r = (int)rr;
  } else {
    r = gettimeofday(&v.tv, tz ? (void *)&v.tz : NULL);
    record(&c, r, r == 0 ? sizeof v : 0);
  }
  if (r == 0 && tv)
    *tv = v.tv;
  if (r == 0 && tz)
    memcpy(tz, &v.tz, sizeof v.tz);
  return r;
}

time_t __wrap_time(time_t *t) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return time(t);
  molt__sc c = {MOLT__SC_TIME, {t != NULL, 0, 0}, NULL, 0, NULL, 0, 0};
  time_t r;
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr)) {
    r = (time_t)rr;
  } else {
    r = time(NULL);
    record(&c, r, 0);
  }
  if (t && r != (time_t)-1)
    *t = r;
  return r;
}

ssize_t __wrap_getrandom(void *buf, size_t n, unsigned flags) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return getrandom(buf, n, flags);
  molt__sc c = {MOLT__SC_GETRANDOM, {(int64_t)n, flags, 0}, NULL, 0, buf, n, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (ssize_t)rr;
  ssize_t r = getrandom(buf, n, flags);
  record(&c, r, r > 0 ? (size_t)r : 0);
  return r;
}
