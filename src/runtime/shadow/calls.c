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
 * A close() the leader made of a descriptor the follower inherited at the
 * fork is made in the follower too, so that a connection the leader closes
 * is not kept open by the follower's copy. */
#include "shadow/shadow.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "molt/program.h"

/* Descriptors the follower inherited at the fork (below this bound). */
#define INHERITED_MAX 4096
static unsigned char inherited[INHERITED_MAX / 8];

void molt__shadow_note_inherited(void) {
  for (int fd = 0; fd < INHERITED_MAX; fd++)
    if (fcntl(fd, F_GETFD) >= 0)
      inherited[fd / 8] |= (unsigned char)(1u << (fd % 8));
}

void molt__shadow_note_shared_with(pid_t other) {
  memset(inherited, 0, sizeof inherited);
  for (int fd = 0; fd < INHERITED_MAX; fd++) {
    struct stat mine, theirs;
    char path[64];
    if (fstat(fd, &mine) < 0)
      continue;
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)other, fd);
    /* The same object under the same number in the other process: a copy
     * of the same descriptor from the fork (for a socket, the inode is the
     * socket itself). */
    if (stat(path, &theirs) == 0 && theirs.st_dev == mine.st_dev &&
        theirs.st_ino == mine.st_ino)
      inherited[fd / 8] |= (unsigned char)(1u << (fd % 8));
  }
}

static bool was_inherited(int fd) {
  return fd >= 0 && fd < INHERITED_MAX && (inherited[fd / 8] & (1u << (fd % 8)));
}

void molt__shadow_close_inherited(int fd) {
  if (!was_inherited(fd))
    return;
  int e = errno;
  close(fd);
  inherited[fd / 8] &= (unsigned char)~(1u << (fd % 8));
  errno = e;
}

/* The follower's result: the leader's, with its errno (true).  false: the
 * thread leads from this call on (molt promote, or the leader is gone):
 * the caller makes the call and records it as a leader does. */
static bool replay(const molt__sc *c, int64_t *ret) {
  int e = 0;
  if (!molt__shadow_replay(c, ret, &e))
    return false;
  errno = e;
  return true;
}

static void record(const molt__sc *c, int64_t ret, size_t out_len) {
  int e = errno;
  molt__shadow_record(c, ret, e, out_len);
  errno = e;
}

ssize_t __wrap_read(int fd, void *buf, size_t n) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return read(fd, buf, n);
  molt__sc c = {MOLT__SC_READ, {fd, (int64_t)n, 0}, NULL, 0, buf, n};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (ssize_t)rr;
  ssize_t r = read(fd, buf, n);
  record(&c, r, r > 0 ? (size_t)r : 0);
  return r;
}

ssize_t __wrap_recv(int fd, void *buf, size_t n, int flags) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return recv(fd, buf, n, flags);
  molt__sc c = {MOLT__SC_RECV, {fd, (int64_t)n, flags}, NULL, 0, buf, n};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (ssize_t)rr;
  ssize_t r = recv(fd, buf, n, flags);
  record(&c, r, r > 0 ? (size_t)r : 0);
  return r;
}

ssize_t __wrap_write(int fd, const void *buf, size_t n) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return write(fd, buf, n);
  molt__sc c = {MOLT__SC_WRITE, {fd, (int64_t)n, 0}, buf, n, NULL, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (ssize_t)rr;
  ssize_t r = write(fd, buf, n);
  record(&c, r, 0);
  return r;
}

ssize_t __wrap_send(int fd, const void *buf, size_t n, int flags) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return send(fd, buf, n, flags);
  molt__sc c = {MOLT__SC_SEND, {fd, (int64_t)n, flags}, buf, n, NULL, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (ssize_t)rr;
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
  molt__sc c = {kind, {fd, flags, cap}, NULL, 0, &out, sizeof out};
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

/* poll: compared on (fd, events) of every entry; the output is revents. */
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
  struct {
    int32_t fd;
    int16_t events, pad;
  } want[1024];
  short revents[1024];
  for (nfds_t i = 0; i < n; i++)
    want[i] = (typeof(want[0])){fds[i].fd, fds[i].events, 0};
  molt__sc c = {MOLT__SC_POLL, {(int64_t)n, timeout, 0}, want, n * sizeof want[0],
                revents,       n * sizeof revents[0]};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr)) {
    if (rr >= 0)
      for (nfds_t i = 0; i < n; i++)
        fds[i].revents = revents[i];
    return (int)rr;
  }
  int r = poll(fds, n, timeout);
  for (nfds_t i = 0; i < n; i++)
    revents[i] = fds[i].revents;
  record(&c, r, r >= 0 ? n * sizeof revents[0] : 0);
  return r;
}

int __wrap_epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return epoll_wait(epfd, ev, max, timeout);
  size_t cap = max > 0 ? (size_t)max * sizeof *ev : 0;
  molt__sc c = {MOLT__SC_EPOLL_WAIT, {epfd, max, timeout}, NULL, 0, ev, cap};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr))
    return (int)rr;
  int r = epoll_wait(epfd, ev, max, timeout);
  record(&c, r, r > 0 ? (size_t)r * sizeof *ev : 0);
  return r;
}

int __wrap_close(int fd) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return close(fd);
  molt__sc c = {MOLT__SC_CLOSE, {fd, 0, 0}, NULL, 0, NULL, 0};
  int64_t rr;
  if (role == MOLT__SHADOW_FOLLOWER && replay(&c, &rr)) {
    if (rr == 0)
      molt__shadow_close_inherited(fd);
    return (int)rr;
  }
  int r = close(fd);
  record(&c, r, 0);
  return r;
}
