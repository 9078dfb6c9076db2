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
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <sys/random.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include "molt/program.h"

/* The wrappers' fast path.  Outside every shadowed update each wrapper is
 * one load of a flag and a jump to the plain call: the shadowed path is a
 * function of its own, out of line, so that the wrapper sets up none of
 * its frame (the poll path's is 12 KiB, probed page by page) before the
 * test (P10, bench/RESULTS.md: instructions per request with and without
 * the wrappers). */
#define NOINLINE __attribute__((noinline))
#define FRONT(ret, name, params, args)                                                   \
  ret __wrap_##name params {                                                             \
    return molt__shadow_off() ? name args : shadowed_##name args;                        \
  }

/* Each wrapper's molt__sc literal lists the fields up to fd_gen; the aux
 * results (recvfrom, recvmsg) are set by name, and left zero (none) by
 * every other call. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

/* The follower's result: the leader's, with its errno (true).  false: the
 * thread leads from this call on (molt promote, or the leader is gone):
 * the caller makes the call and records it as a leader does.  The replay's
 * own calls are not trapped (trap.c); a thread that leads from here stays
 * allowed, since its calls are real from now on (a thread that follows
 * again blocks at the end of its next replay). */
bool molt__shadow_call_replay(const molt__sc *c, int64_t *ret) {
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

void molt__shadow_call_record(const molt__sc *c, int64_t ret, size_t out_len) {
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

static NOINLINE ssize_t shadowed_read(int fd, void *buf, size_t n) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return read(fd, buf, n);
  molt__sc c = {MOLT__SC_READ, {fd, (int64_t)n, 0}, NULL, 0, buf, n, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr))
    return (ssize_t)rr;
  molt__shadow_intent it;
  if (molt__shadow_intent_begin(&c, &it))
    return intent_end(&it, read(fd, it.data, n), buf);
  ssize_t r = read(fd, buf, n);
  molt__shadow_call_record(&c, r, r > 0 ? (size_t)r : 0);
  return r;
}

static NOINLINE ssize_t shadowed_recv(int fd, void *buf, size_t n, int flags) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return recv(fd, buf, n, flags);
  molt__sc c = {MOLT__SC_RECV, {fd, (int64_t)n, flags}, NULL, 0, buf, n, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr))
    return (ssize_t)rr;
  molt__shadow_intent it;
  if (molt__shadow_intent_begin(&c, &it))
    return intent_end(&it, recv(fd, it.data, n, flags), buf);
  ssize_t r = recv(fd, buf, n, flags);
  molt__shadow_call_record(&c, r, r > 0 ? (size_t)r : 0);
  return r;
}

static NOINLINE ssize_t shadowed_write(int fd, const void *buf, size_t n) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return write(fd, buf, n);
  molt__sc c = {MOLT__SC_WRITE, {fd, (int64_t)n, 0}, buf, n, NULL, 0, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr))
    return (ssize_t)rr;
  molt__shadow_intent it;
  if (molt__shadow_intent_begin(&c, &it))
    return intent_end(&it, write(fd, buf, n), NULL);
  ssize_t r = write(fd, buf, n);
  molt__shadow_call_record(&c, r, 0);
  return r;
}

static NOINLINE ssize_t shadowed_send(int fd, const void *buf, size_t n, int flags) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return send(fd, buf, n, flags);
  molt__sc c = {MOLT__SC_SEND, {fd, (int64_t)n, flags}, buf, n, NULL, 0, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr))
    return (ssize_t)rr;
  molt__shadow_intent it;
  if (molt__shadow_intent_begin(&c, &it))
    return intent_end(&it, send(fd, buf, n, flags), NULL);
  ssize_t r = send(fd, buf, n, flags);
  molt__shadow_call_record(&c, r, 0);
  return r;
}

/* accept and accept4: the output is the address length and the address. */
static NOINLINE int accept_common(molt__sc_kind kind, int fd, struct sockaddr *addr,
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
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr)) {
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
  molt__shadow_call_record(&c, r, r >= 0 ? sizeof out : 0);
  return r;
}

int __wrap_accept(int fd, struct sockaddr *addr, socklen_t *len) {
  return molt__shadow_off() ? accept(fd, addr, len)
                            : accept_common(MOLT__SC_ACCEPT, fd, addr, len, 0);
}

int __wrap_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
  return molt__shadow_off() ? accept4(fd, addr, len, flags)
                            : accept_common(MOLT__SC_ACCEPT4, fd, addr, len, flags);
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

static NOINLINE int shadowed_poll(struct pollfd *fds, nfds_t n, int timeout) {
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
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr)) {
    if (rr >= 0)
      for (nfds_t k = 0; k < n; k++)
        fds[idx[k]].revents = revents[k];
    return (int)rr;
  }
  int r = poll(fds, n, timeout);
  for (nfds_t k = 0; k < n; k++)
    revents[k] = fds[idx[k]].revents;
  molt__shadow_call_record(&c, r, r >= 0 ? n * sizeof revents[0] : 0);
  return r;
}

/* epoll_create, epoll_ctl and the epoll waits: epoll.c. */

/* close: also the descriptor's epoll registrations (epoll.c): deleted from
 * the kernel's instances by the side that leads -- the other process's
 * copy of the descriptor would keep them -- and from the tables. */
static NOINLINE int shadowed_close(int fd) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE) {
    molt__shadow_epoll_closing(fd, true, MOLT__SHADOW_ANY_GEN);
    return molt__shadow_fd_close_own(fd);
  }
  molt__sc c = {MOLT__SC_CLOSE, {fd, 0, 0}, NULL, 0, NULL, 0, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr)) {
    if (rr == 0)
      molt__shadow_epoll_closing(fd, false, molt__shadow_replayed_fd_gen());
    return (int)rr; /* the follower's copy: closed by the replay (fds.c) */
  }
  molt__shadow_epoll_closing(fd, true, MOLT__SHADOW_ANY_GEN);
  c.fd_gen = molt__shadow_fd_gen(fd); /* before the number can be reused */
  int r = close(fd);
  molt__shadow_call_record(&c, r, 0);
  return r;
}

/* ---- descriptors made by name ---------------------------------------------------
 * socket, open and openat: compared on their arguments (a path as bytes);
 * the descriptor the leader got reaches the follower at the same number
 * (fds.c), like an accepted one. */

static NOINLINE int shadowed_socket(int domain, int type, int protocol) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return socket(domain, type, protocol);
  molt__sc c = {MOLT__SC_SOCKET, {domain, type, protocol}, NULL, 0, NULL, 0, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr))
    return (int)rr;
  int r = socket(domain, type, protocol);
  molt__shadow_call_record(&c, r, 0);
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
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr))
    return (int)rr;
  int r = open(path, flags, mode);
  molt__shadow_call_record(&c, r, 0);
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
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr))
    return (int)rr;
  int r = openat(dirfd, path, flags, mode);
  molt__shadow_call_record(&c, r, 0);
  return r;
}

/* ---- time and randomness ----------------------------------------------------------
 * The leader's values: the follower gets what the leader's call returned,
 * so that a reply carrying a time stamp or a random token is the same in
 * both.  Compared on the clock (time, gettimeofday: whether each pointer
 * was given; getrandom: the length and flags), never on the values. */

static NOINLINE int shadowed_clock_gettime(clockid_t clock, struct timespec *ts) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return clock_gettime(clock, ts);
  struct timespec v = {0, 0};
  molt__sc c = {MOLT__SC_CLOCK_GETTIME, {clock, 0, 0}, NULL, 0, &v, sizeof v, 0};
  int r;
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr)) {
    r = (int)rr;
  } else {
    r = clock_gettime(clock, &v);
    molt__shadow_call_record(&c, r, r == 0 ? sizeof v : 0);
  }
  if (r == 0 && ts)
    *ts = v;
  return r;
}

static NOINLINE int shadowed_gettimeofday(struct timeval *tv, void *tz) {
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
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr)) {
    r = (int)rr;
  } else {
    r = gettimeofday(&v.tv, tz ? (void *)&v.tz : NULL);
    molt__shadow_call_record(&c, r, r == 0 ? sizeof v : 0);
  }
  if (r == 0 && tv)
    *tv = v.tv;
  if (r == 0 && tz)
    memcpy(tz, &v.tz, sizeof v.tz);
  return r;
}

static NOINLINE time_t shadowed_time(time_t *t) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return time(t);
  molt__sc c = {MOLT__SC_TIME, {t != NULL, 0, 0}, NULL, 0, NULL, 0, 0};
  time_t r;
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr)) {
    r = (time_t)rr;
  } else {
    r = time(NULL);
    molt__shadow_call_record(&c, r, 0);
  }
  if (t && r != (time_t)-1)
    *t = r;
  return r;
}

static NOINLINE ssize_t shadowed_getrandom(void *buf, size_t n, unsigned flags) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return getrandom(buf, n, flags);
  molt__sc c = {MOLT__SC_GETRANDOM, {(int64_t)n, flags, 0}, NULL, 0, buf, n, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(&c, &rr))
    return (ssize_t)rr;
  ssize_t r = getrandom(buf, n, flags);
  molt__shadow_call_record(&c, r, r > 0 ? (size_t)r : 0);
  return r;
}

/* ---- vectored and addressed reads and writes -----------------------------------
 * readv, writev, recvfrom, sendto, recvmsg, sendmsg: compared and recorded
 * as read, write, recv and send are, their bytes as one buffer -- an
 * output's iovecs gathered and compared with the follower's whole (how the
 * bytes are split into pieces is not compared), an input's bytes recorded
 * once and scattered into the follower's iovecs.  a[1] is the total length
 * of the iovecs, a[2] the flags (0 for readv and writev); sendto's and
 * sendmsg's a[2] also holds, in its high half, a hash of the destination
 * address and of the control data passed, so that a differing address or
 * a differing descriptor passed is a difference.  recvfrom's and recvmsg's
 * address, recvmsg's msg_flags and its control data are aux results
 * (molt__sc.aux): the follower gets the leader's, not compared.  A leader's
 * call on TCP goes through an intent as read and write do: the leader's
 * own read lands in the intent's single buffer (for a stream socket the
 * same bytes a scattered read takes), its write is the real call on the
 * program's iovecs.  Descriptors received with SCM_RIGHTS are not passed
 * to the follower: a replayed recvmsg that carried some ends the follower
 * with that reason (design §17). */

/* Up to this many bytes are gathered on the stack; more take malloc (made
 * only in a shadowed update's leader and follower). */
#define GATHER_STACK 2048
/* recvmsg's control data the follower can be given. */
#define AUX_CONTROL 256

typedef struct gathered {
  char small[GATHER_STACK];
  char *p;
  size_t len;
  bool heap;
} gathered;

/* The total length of cnt iovecs, or -1 if the kernel would refuse them
 * (EINVAL: a negative count, too many, a total past SSIZE_MAX). */
static ssize_t iov_total(const struct iovec *iov, int cnt) {
  if (cnt < 0 || cnt > IOV_MAX || (cnt > 0 && !iov))
    return -1;
  size_t t = 0;
  for (int i = 0; i < cnt; i++) {
    if (iov[i].iov_len > (size_t)SSIZE_MAX - t)
      return -1;
    t += iov[i].iov_len;
  }
  return (ssize_t)t;
}

/* A buffer of n bytes (g->p), holding the iovecs' bytes if iov != NULL.
 * false: no memory for it. */
static bool gather(gathered *g, const struct iovec *iov, int cnt, size_t n) {
  g->len = n;
  g->heap = n > sizeof g->small;
  g->p = g->heap ? malloc(n) : g->small;
  if (!g->p)
    return false;
  size_t at = 0;
  for (int i = 0; iov && i < cnt; i++) {
    if (iov[i].iov_len)
      memcpy(g->p + at, iov[i].iov_base, iov[i].iov_len);
    at += iov[i].iov_len;
  }
  return true;
}

static void gathered_free(gathered *g) {
  if (g->heap)
    free(g->p);
}

/* n bytes of src into the iovecs, in order. */
static void scatter(const struct iovec *iov, int cnt, const void *src, size_t n) {
  const char *s = src;
  for (int i = 0; i < cnt && n; i++) {
    size_t k = iov[i].iov_len < n ? iov[i].iov_len : n;
    if (k)
      memcpy(iov[i].iov_base, s, k);
    s += k;
    n -= k;
  }
}

/* 32 bits of FNV-1a over two byte strings (a destination address, control
 * data), 0 when both are empty. */
static uint64_t dest_hash(const void *a, size_t an, const void *b, size_t bn) {
  if (!an && !bn)
    return 0;
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < an; i++)
    h = (h ^ ((const unsigned char *)a)[i]) * 16777619u;
  for (size_t i = 0; i < bn; i++)
    h = (h ^ ((const unsigned char *)b)[i]) * 16777619u;
  return (uint64_t)(h | 1u) << 32;
}

/* The follower cannot hold the bytes of its call: ends with that reason. */
static void no_memory(molt__sc_kind kind, size_t n) __attribute__((noreturn));
static void no_memory(molt__sc_kind kind, size_t n) {
  molt__shadow_follower_fail(MOLT__SHADOW_END_FAILED,
                             "%s of %zu bytes: no memory to gather them in the follower",
                             molt__sc_name(kind), n);
}

/* An output call whose bytes c->in gathers: the follower's result, or the
 * leader's call (real(arg)) made through an intent where it can be. */
static ssize_t output_call(molt__shadow_role role, molt__sc *c, ssize_t (*real)(void *),
                           void *arg) {
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(c, &rr))
    return (ssize_t)rr;
  molt__shadow_intent it;
  if (molt__shadow_intent_begin(c, &it))
    return intent_end(&it, real(arg), NULL);
  ssize_t r = real(arg);
  molt__shadow_call_record(c, r, 0);
  return r;
}

/* An input call of at most c->out_cap bytes: the follower gets the
 * leader's bytes in c->out (a buffer of out_cap), the leader makes real
 * (arg, data) with data a single buffer of out_cap -- the intent's, or
 * c->out -- and the bytes end in c->out either way.  real fills c->aux.
 * *replayed: the result is the follower's (not made here). */
static ssize_t input_call(molt__shadow_role role, molt__sc *c,
                          ssize_t (*real)(void *, void *), void *arg, bool *replayed) {
  int64_t rr;
  *replayed = false;
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_call_replay(c, &rr)) {
    *replayed = true;
    return (ssize_t)rr;
  }
  molt__shadow_intent it;
  if (molt__shadow_intent_begin(c, &it)) {
    ssize_t r = real(arg, it.data);
    int e = errno;
    /* a datagram's MSG_TRUNC result may exceed what was read */
    if (r > 0)
      memcpy(c->out, it.data, (size_t)r < c->out_cap ? (size_t)r : c->out_cap);
    molt__shadow_intent_end(&it, r, e);
    errno = e;
    return r;
  }
  ssize_t r = real(arg, c->out);
  molt__shadow_call_record(c, r,
                           r > 0 ? ((size_t)r < c->out_cap ? (size_t)r : c->out_cap) : 0);
  return r;
}

/* recvfrom's aux: the sender's address. */
typedef struct from_aux {
  socklen_t len;
  uint32_t pad;
  struct sockaddr_storage a;
} from_aux;

/* recvmsg's aux: the header's results and the first AUX_CONTROL bytes of
 * its control data. */
typedef struct msg_aux {
  socklen_t namelen;
  int32_t flags;
  uint64_t controllen;
  struct sockaddr_storage name;
  char control[AUX_CONTROL];
} msg_aux;

typedef struct vec_args {
  int fd;
  const struct iovec *iov;
  int cnt;
  size_t n;
  int flags;
  const struct sockaddr *to; /* sendto */
  socklen_t to_len;
  from_aux *from;               /* recvfrom: the address wanted, or NULL */
  const struct msghdr *out_msg; /* sendmsg */
  struct msghdr *in_msg;        /* recvmsg: the program's header, results in it */
  msg_aux *maux;                /* recvmsg: the same results, recorded */
} vec_args;

static ssize_t real_writev(void *p) {
  vec_args *v = p;
  return writev(v->fd, v->iov, v->cnt);
}

static ssize_t real_sendto(void *p) {
  vec_args *v = p;
  return sendto(v->fd, v->iov[0].iov_base, v->n, v->flags, v->to, v->to_len);
}

static ssize_t real_sendmsg(void *p) {
  vec_args *v = p;
  return sendmsg(v->fd, v->out_msg, v->flags);
}

/* readv's bytes read whole into one buffer: for a socket, pipe or file
 * the same bytes the scattered read takes. */
static ssize_t real_readv(void *p, void *data) {
  vec_args *v = p;
  return read(v->fd, data, v->n);
}

static ssize_t real_recvfrom(void *p, void *data) {
  vec_args *v = p;
  if (!v->from)
    return recvfrom(v->fd, data, v->n, v->flags, NULL, NULL);
  v->from->len = sizeof v->from->a;
  return recvfrom(v->fd, data, v->n, v->flags, (struct sockaddr *)&v->from->a,
                  &v->from->len);
}

/* recvmsg into one buffer; the program's header gets the kernel's name,
 * control data and flags, the aux a copy of them. */
static ssize_t real_recvmsg(void *p, void *data) {
  vec_args *v = p;
  struct msghdr m = *v->in_msg;
  struct iovec one = {data, v->n};
  m.msg_iov = &one;
  m.msg_iovlen = 1;
  ssize_t r = recvmsg(v->fd, &m, v->flags);
  if (r < 0)
    return r;
  struct msghdr *h = v->in_msg;
  h->msg_namelen = m.msg_namelen;
  h->msg_controllen = m.msg_controllen;
  h->msg_flags = m.msg_flags;
  msg_aux *a = v->maux;
  a->flags = m.msg_flags;
  if (h->msg_name) {
    a->namelen = m.msg_namelen;
    memcpy(&a->name, h->msg_name,
           m.msg_namelen < sizeof a->name ? m.msg_namelen : sizeof a->name);
  }
  if (h->msg_control) {
    a->controllen = m.msg_controllen;
    memcpy(a->control, h->msg_control,
           m.msg_controllen < AUX_CONTROL ? m.msg_controllen : AUX_CONTROL);
  }
  return r;
}

static NOINLINE ssize_t shadowed_writev(int fd, const struct iovec *iov, int cnt) {
  molt__shadow_role role = molt__shadow_role_now();
  ssize_t n = role == MOLT__SHADOW_NONE ? 0 : iov_total(iov, cnt);
  if (role == MOLT__SHADOW_NONE || n < 0) /* refused by the kernel alike */
    return writev(fd, iov, cnt);
  gathered g;
  if (!gather(&g, iov, cnt, (size_t)n)) {
    if (role == MOLT__SHADOW_FOLLOWER)
      no_memory(MOLT__SC_WRITEV, (size_t)n);
    g.p = NULL; /* the leader's record: no bytes, a difference */
  }
  molt__sc c = {MOLT__SC_WRITEV, {fd, n, 0}, g.p, g.p ? (size_t)n : 0, NULL, 0, 0};
  vec_args v = {.fd = fd, .iov = iov, .cnt = cnt};
  ssize_t r = output_call(role, &c, real_writev, &v);
  int e = errno;
  if (g.p)
    gathered_free(&g);
  errno = e;
  return r;
}

static NOINLINE ssize_t shadowed_sendto(int fd, const void *buf, size_t n, int flags,
                                        const struct sockaddr *to, socklen_t to_len) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return sendto(fd, buf, n, flags, to, to_len);
  int64_t a2 =
      (int64_t)((uint64_t)(uint32_t)flags | dest_hash(to, to ? to_len : 0, NULL, 0));
  molt__sc c = {MOLT__SC_SENDTO, {fd, (int64_t)n, a2}, buf, n, NULL, 0, 0};
  struct iovec one = {(void *)buf, n};
  vec_args v = {
      .fd = fd, .iov = &one, .n = n, .flags = flags, .to = to, .to_len = to_len};
  return output_call(role, &c, real_sendto, &v);
}

/* The total of a message header's iovecs, -1 as iov_total. */
static ssize_t msg_total(const struct msghdr *msg) {
  if (!msg || msg->msg_iovlen > IOV_MAX)
    return -1;
  return iov_total(msg->msg_iov, (int)msg->msg_iovlen);
}

static NOINLINE ssize_t shadowed_sendmsg(int fd, const struct msghdr *msg, int flags) {
  molt__shadow_role role = molt__shadow_role_now();
  ssize_t n = role == MOLT__SHADOW_NONE ? 0 : msg_total(msg);
  if (role == MOLT__SHADOW_NONE || n < 0)
    return sendmsg(fd, msg, flags);
  gathered g;
  if (!gather(&g, msg->msg_iov, (int)msg->msg_iovlen, (size_t)n)) {
    if (role == MOLT__SHADOW_FOLLOWER)
      no_memory(MOLT__SC_SENDMSG, (size_t)n);
    g.p = NULL;
  }
  /* The address and the control data (an SCM_RIGHTS descriptor's number
   * is the same in both processes, fds.c) compared through the hash. */
  int64_t a2 =
      (int64_t)((uint64_t)(uint32_t)flags |
                dest_hash(msg->msg_name, msg->msg_name ? msg->msg_namelen : 0,
                          msg->msg_control, msg->msg_control ? msg->msg_controllen : 0));
  molt__sc c = {MOLT__SC_SENDMSG, {fd, n, a2}, g.p, g.p ? (size_t)n : 0, NULL, 0, 0};
  vec_args v = {.fd = fd, .out_msg = msg, .flags = flags};
  ssize_t r = output_call(role, &c, real_sendmsg, &v);
  int e = errno;
  if (g.p)
    gathered_free(&g);
  errno = e;
  return r;
}

static NOINLINE ssize_t shadowed_readv(int fd, const struct iovec *iov, int cnt) {
  molt__shadow_role role = molt__shadow_role_now();
  ssize_t n = role == MOLT__SHADOW_NONE ? 0 : iov_total(iov, cnt);
  if (role == MOLT__SHADOW_NONE || n < 0)
    return readv(fd, iov, cnt);
  gathered g;
  if (!gather(&g, NULL, 0, (size_t)n)) {
    if (role == MOLT__SHADOW_FOLLOWER)
      no_memory(MOLT__SC_READV, (size_t)n);
    ssize_t r = readv(fd, iov, cnt);
    int e = errno;
    molt__sc c = {MOLT__SC_READV, {fd, -1, 0}, NULL, 0, NULL, 0, 0};
    molt__shadow_call_record(&c, r,
                             0); /* no bytes recorded: a difference for the follower */
    errno = e;
    return r;
  }
  molt__sc c = {MOLT__SC_READV, {fd, n, 0}, NULL, 0, g.p, (size_t)n, 0};
  vec_args v = {.fd = fd, .n = (size_t)n};
  bool replayed;
  ssize_t r = input_call(role, &c, real_readv, &v, &replayed);
  int e = errno;
  if (r > 0)
    scatter(iov, cnt, g.p, (size_t)r);
  gathered_free(&g);
  errno = e;
  return r;
}

static NOINLINE ssize_t shadowed_recvfrom(int fd, void *buf, size_t n, int flags,
                                          struct sockaddr *from, socklen_t *from_len) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return recvfrom(fd, buf, n, flags, from, from_len);
  from_aux aux;
  memset(&aux, 0, sizeof aux); /* a result not the leader's: no address */
  bool want = from && from_len;
  molt__sc c = {MOLT__SC_RECVFROM, {fd, (int64_t)n, flags}, NULL, 0, buf, n, 0};
  if (want) {
    c.aux = &aux;
    c.aux_len = sizeof aux;
  }
  vec_args v = {.fd = fd, .n = n, .flags = flags, .from = want ? &aux : NULL};
  bool replayed;
  ssize_t r = input_call(role, &c, real_recvfrom, &v, &replayed);
  int e = errno;
  if (r >= 0 && want) {
    memcpy(from, &aux.a, aux.len < *from_len ? aux.len : *from_len);
    *from_len = aux.len;
  }
  errno = e;
  return r;
}

/* The follower's recvmsg got the leader's header results in aux: given to
 * the program's header, or the follower ends if it cannot have what the
 * leader got (descriptors, control data past AUX_CONTROL). */
static void recvmsg_give(struct msghdr *msg, const msg_aux *aux) {
  if (aux->controllen > AUX_CONTROL)
    molt__shadow_follower_fail(MOLT__SHADOW_END_FAILED,
                               "recvmsg in the leader got %llu bytes of control data: a "
                               "follower is given at most %d",
                               (unsigned long long)aux->controllen, AUX_CONTROL);
  struct msghdr m = {.msg_control = (void *)aux->control,
                     .msg_controllen = (size_t)aux->controllen};
  for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
    if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
      molt__shadow_follower_fail(MOLT__SHADOW_END_FAILED,
                                 "recvmsg in the leader received descriptors "
                                 "(SCM_RIGHTS): they are not passed to a follower");
  if (msg->msg_name) {
    memcpy(msg->msg_name, &aux->name,
           aux->namelen < msg->msg_namelen ? aux->namelen : msg->msg_namelen);
    msg->msg_namelen = aux->namelen;
  }
  int flags = aux->flags;
  if (msg->msg_control) {
    size_t k = (size_t)aux->controllen;
    if (k > msg->msg_controllen) {
      k = msg->msg_controllen;
      flags |= MSG_CTRUNC;
    }
    memcpy(msg->msg_control, aux->control, k);
    msg->msg_controllen = k;
  }
  msg->msg_flags = flags;
}

static NOINLINE ssize_t shadowed_recvmsg(int fd, struct msghdr *msg, int flags) {
  molt__shadow_role role = molt__shadow_role_now();
  ssize_t n = role == MOLT__SHADOW_NONE ? 0 : msg_total(msg);
  if (role == MOLT__SHADOW_NONE || n < 0)
    return recvmsg(fd, msg, flags);
  gathered g;
  if (!gather(&g, NULL, 0, (size_t)n)) {
    if (role == MOLT__SHADOW_FOLLOWER)
      no_memory(MOLT__SC_RECVMSG, (size_t)n);
    ssize_t r = recvmsg(fd, msg, flags);
    int e = errno;
    molt__sc c = {MOLT__SC_RECVMSG, {fd, -1, flags}, NULL, 0, NULL, 0, 0};
    molt__shadow_call_record(&c, r,
                             0); /* no bytes recorded: a difference for the follower */
    errno = e;
    return r;
  }
  msg_aux aux;
  memset(&aux, 0, sizeof aux); /* a result not the leader's: no name, no control */
  molt__sc c = {MOLT__SC_RECVMSG, {fd, n, flags}, NULL, 0, g.p, (size_t)n, 0};
  c.aux = &aux;
  c.aux_len = sizeof aux;
  vec_args v = {.fd = fd, .n = (size_t)n, .flags = flags, .in_msg = msg, .maux = &aux};
  bool replayed;
  ssize_t r = input_call(role, &c, real_recvmsg, &v, &replayed);
  int e = errno;
  /* made here, the header holds the kernel's results already */
  if (r >= 0 && replayed)
    recvmsg_give(msg, &aux);
  if (r > 0)
    scatter(msg->msg_iov, (int)msg->msg_iovlen, g.p,
            (size_t)r < (size_t)n ? (size_t)r : (size_t)n);
  gathered_free(&g);
  errno = e;
  return r;
}

/* ---- the wrappers themselves (FRONT above) ---------------------------------------*/

FRONT(ssize_t, read, (int fd, void *buf, size_t n), (fd, buf, n))
FRONT(ssize_t, recv, (int fd, void *buf, size_t n, int flags), (fd, buf, n, flags))
FRONT(ssize_t, write, (int fd, const void *buf, size_t n), (fd, buf, n))
FRONT(ssize_t, send, (int fd, const void *buf, size_t n, int flags), (fd, buf, n, flags))
FRONT(int, poll, (struct pollfd * fds, nfds_t n, int timeout), (fds, n, timeout))
FRONT(int, socket, (int domain, int type, int protocol), (domain, type, protocol))
FRONT(int, clock_gettime, (clockid_t clock, struct timespec *ts), (clock, ts))
FRONT(int, gettimeofday, (struct timeval * tv, void *tz), (tv, tz))
FRONT(time_t, time, (time_t * t), (t))
FRONT(ssize_t, getrandom, (void *buf, size_t n, unsigned flags), (buf, n, flags))
FRONT(ssize_t, writev, (int fd, const struct iovec *iov, int cnt), (fd, iov, cnt))
FRONT(ssize_t, sendto,
      (int fd, const void *buf, size_t n, int flags, const struct sockaddr *to,
       socklen_t to_len),
      (fd, buf, n, flags, to, to_len))
FRONT(ssize_t, sendmsg, (int fd, const struct msghdr *msg, int flags), (fd, msg, flags))
FRONT(ssize_t, readv, (int fd, const struct iovec *iov, int cnt), (fd, iov, cnt))
FRONT(ssize_t, recvfrom,
      (int fd, void *buf, size_t n, int flags, struct sockaddr *from,
       socklen_t *from_len),
      (fd, buf, n, flags, from, from_len))
FRONT(ssize_t, recvmsg, (int fd, struct msghdr *msg, int flags), (fd, msg, flags))

/* close: also the descriptor's epoll registrations outside a shadow, as
 * shadowed_close does (a process that was shadowed once keeps tables). */
int __wrap_close(int fd) {
  if (!molt__shadow_off())
    return shadowed_close(fd);
  molt__shadow_epoll_closing(fd, true, MOLT__SHADOW_ANY_GEN);
  return close(fd);
}

/* The calling thread's signal mask touches nothing but the thread: the
 * follower makes these calls itself, not compared, past the backstop --
 * trapped, each cost a SIGSYS, and mosquitto blocks its signals around
 * every epoll_wait (two a loop turn).  SIGSYS stays deliverable in the
 * follower: blocked, the backstop's next trap would kill it. */
static const sigset_t *keep_sigsys(const sigset_t *set, sigset_t *copy) {
  if (!set || !sigismember(set, SIGSYS))
    return set;
  *copy = *set;
  sigdelset(copy, SIGSYS);
  return copy;
}

/* A thread under the backstop: the call made past it, SIGSYS
 * left out of a mask it blocks.  (sigprocmask or pthread_sigmask: errno
 * kept for the former, the latter returns its error.) */
static NOINLINE int follower_sigmask(int (*call)(int, const sigset_t *, sigset_t *),
                                     int how, const sigset_t *set, sigset_t *old) {
  sigset_t copy;
  molt__shadow_trap_allow();
  int r = call(how, how == SIG_UNBLOCK ? set : keep_sigsys(set, &copy), old);
  int e = errno;
  molt__shadow_trap_block();
  errno = e;
  return r;
}

/* Only a thread under the backstop keeps SIGSYS out of its mask: a
 * follower's, or the old version's once it follows a promoted new version.
 * Any other thread -- the original process's outside a promotion, above
 * all -- makes the call as it is after one thread-local load, without
 * asking its role (the leader's 4 calls a message of mosquitto: 39
 * instructions each in molt__shadow_role_now, and the mask's copy set up
 * before any test).  A thread of the old version not armed yet (no
 * followed call since the handover) may block SIGSYS here: arming
 * unblocks it (trap.c). */
static NOINLINE int shadowed_sigprocmask(int how, const sigset_t *set, sigset_t *old) {
  if (!molt__shadow_trap_armed() || molt__shadow_role_now() != MOLT__SHADOW_FOLLOWER)
    return sigprocmask(how, set, old);
  return follower_sigmask(sigprocmask, how, set, old);
}

static NOINLINE int shadowed_pthread_sigmask(int how, const sigset_t *set,
                                             sigset_t *old) {
  if (!molt__shadow_trap_armed() || molt__shadow_role_now() != MOLT__SHADOW_FOLLOWER)
    return pthread_sigmask(how, set, old);
  return follower_sigmask(pthread_sigmask, how, set, old);
}

/* Out of line as the other wrappers' shadowed paths (FRONT): the copy of
 * the mask (128 bytes, with the stack protector's check) is set up only in
 * a shadow (mosquitto: 4 calls a message, 19 instructions each before). */
FRONT(int, sigprocmask, (int how, const sigset_t *set, sigset_t *old), (how, set, old))
FRONT(int, pthread_sigmask, (int how, const sigset_t *set, sigset_t *old),
      (how, set, old))
