/* Descriptors of a shadowed update (shadow.h): those the leader creates
 * after the fork reach the follower, at the same number.
 *
 * The follower inherits every descriptor open at the fork.  One the leader
 * creates afterwards (an accepted connection) exists only in the leader:
 * the follower replays the accept and gets the number, not the descriptor.
 * So the leader's thread, right after the call, sends the new descriptor
 * over its ring's channel (a unix socketpair made before the fork,
 * SCM_RIGHTS, one byte per descriptor) before it publishes the record; the
 * follower's thread of the same index, when it consumes that record,
 * receives it (the channel and the ring have one producer and one consumer
 * each and the same order) and places it at the leader's number (dup3).
 * Not pidfd_getfd: the leader may have closed the descriptor and reused
 * its number long before the follower, which lags, replays the accept.
 *
 * Numbers are reused, and threads replay at their own pace: thread A's
 * close(7) and thread B's accept that got 7 again may be replayed in
 * either order.  The leader counts, per number, the descriptors its
 * followed calls created there (its generation, `made`); a record that
 * creates a descriptor carries the new generation, a close the one it
 * closed (read before the close: the number cannot be reused before it
 * returns).  The follower keeps, per number, the generation it holds
 * (`held`): it closes its copy only for a close of that generation, and
 * never replaces a newer one with an older one.
 *
 * After molt promote the follower leads and the original process follows.
 * The follower counts its own generations per number (`own`, from 1; 0 in
 * a record: a descriptor it did not create, one both processes hold), and
 * sends each descriptor its followed calls create the other way over the
 * same channel (a unix socketpair is two-way), before it publishes the
 * record; the original process takes it when it replays that record and
 * places it at the same number, as the follower does (take()), and closes
 * it when it replays its close.  So the old version has the connections
 * the new one accepts: a server that touches one outside the followed
 * calls (mosquitto sets each new connection non-blocking with fcntl) gets
 * the same descriptor, where it failed with EBADF and closed the
 * connection, a divergence.  The original process still notes those
 * descriptors as the new version's (ring.c, `opened`/`closed`), which bars
 * the lead from coming back while any is open (their generations are the
 * new version's numbering, not the original's `made`); a close of
 * generation 0 closes the original's copy if it is one both hold (`held`
 * there, set by molt__shadow_note_shared_with).
 *
 * The channels are placed at high numbers (just below the runtime's band of
 * base/fd.c, 760 and up under the usual limits), so that the numbers the
 * program uses are not taken in either process. */
#include "shadow/shadow.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Descriptors whose generations are kept (a higher number is placed
 * without the checks). */
#define TRACKED 4096
/* held[]: a descriptor is being placed or closed there. */
#define BUSY UINT32_MAX

/* Leader: descriptors its followed calls created per number (relaxed
 * atomics: a number's creation and close are ordered by the kernel, which
 * cannot hand out a number before its close returns). */
static _Atomic uint32_t made[TRACKED];
/* Follower: generation + 1 of the leader's descriptor it holds at a number
 * (0: none of the leader's).  A placement or close claims the number by
 * compare-exchange to BUSY (acquire), does its dup3/close, and stores the
 * new value (release): two follower threads never act on one number at
 * once, and the next one sees the descriptor table as the last one left
 * it. */
static _Atomic uint32_t held[TRACKED];

/* This process is the follower (set before its threads start). */
static bool in_follower;
/* Follower, leading after a promotion: generations of the descriptors its
 * followed calls created per number, and the one open at each number (0:
 * none of its own).  Relaxed, as `made`. */
static _Atomic uint32_t own[TRACKED], own_open[TRACKED];

/* The channels, one per ring: the leader's sending ends (-1: none), the
 * follower's receiving ends.  A leader thread counts itself in `senders`
 * (seq_cst) before it loads its end (seq_cst); the session's end swaps the
 * end to -1 (seq_cst) before it reads `senders` (seq_cst): either the
 * thread sees -1, or the end waits for it before it closes (Dekker). */
static _Atomic int send_end[MOLT__SHADOW_MAX_THREADS];
static _Atomic int senders[MOLT__SHADOW_MAX_THREADS];
/* seq_cst accesses (plain C on an atomic): a ring's receiving end is set
 * and closed by the follower's threads that have the ring in turn (its
 * creator places it, the consumer that takes its EXIT closes it), and what
 * orders them passes through the leader's process, where a sanitizer does
 * not see it. */
static _Atomic int recv_end[MOLT__SHADOW_MAX_THREADS];
/* Follower leading after a promotion: a descriptor could not be sent back
 * on this ring's channel, which carries none from then on (only this
 * ring's producer thread reads and writes it). */
static bool back_broken[MOLT__SHADOW_MAX_THREADS];
/* Channels slots: every ring's (a thread started after the fork gets one
 * for its ring, molt__shadow_fds_ring_open). */
static size_t nchannels;
static pid_t leader_pid; /* the process that made the channels */
/* A leader thread making a new ring's channel counts itself in `opening`
 * (seq_cst) before it loads `channels_open` (seq_cst); the session's end
 * clears `channels_open` (seq_cst) before it reads `opening` (seq_cst) and
 * waits for it: either the thread sees the channels closed and makes none,
 * or the end closes the channel it stored (Dekker, as `senders`). */
static _Atomic bool channels_open;
static _Atomic int opening;

/* fd moved to a high number below 1024 (close-on-exec): out of the small
 * numbers the program uses, below the runtime's band when there is room
 * (base/fd.c says why not near a raised limit: the kernel sizes the table
 * to the highest number); fd itself if that fails. */
static int high(int fd) {
  struct rlimit rl;
  long base = 0;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    long top = rl.rlim_cur < 1024 ? (long)rl.rlim_cur : 1024;
    if (top > 4 * MOLT__SHADOW_MAX_THREADS)
      base = top - top / 8 - 2 * MOLT__SHADOW_MAX_THREADS - 8;
  }
  int h = base > fd ? fcntl(fd, F_DUPFD_CLOEXEC, (int)base) : -1;
  if (h < 0)
    return fd;
  close(fd);
  return h;
}

void molt__shadow_fds_begin(size_t n) {
  leader_pid = getpid();
  nchannels = MOLT__SHADOW_MAX_THREADS;
  atomic_store_explicit(&channels_open, true, memory_order_relaxed);
  atomic_store_explicit(&opening, 0, memory_order_relaxed);
  for (size_t i = n; i < MOLT__SHADOW_MAX_THREADS; i++) {
    atomic_store_explicit(&send_end[i], -1, memory_order_relaxed);
    atomic_store_explicit(&senders[i], 0, memory_order_relaxed);
    recv_end[i] = -1;
  }
  for (size_t i = 0; i < n; i++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      /* No channel: a descriptor created on this thread drops the shadow. */
      atomic_store_explicit(&send_end[i], -1, memory_order_relaxed);
      recv_end[i] = -1;
      continue;
    }
    atomic_store_explicit(&send_end[i], high(sv[0]), memory_order_relaxed);
    atomic_store_explicit(&senders[i], 0, memory_order_relaxed);
    recv_end[i] = high(sv[1]);
  }
}

void molt__shadow_fds_forked(void) {
  for (size_t i = 0; i < nchannels; i++)
    if (recv_end[i] >= 0) {
      close(recv_end[i]);
      recv_end[i] = -1;
    }
}

void molt__shadow_fds_end(void) {
  /* In a child of fork() (the follower, or the program's own child) no
   * other thread runs: a sender counted in the copy never finishes. */
  bool child = getpid() != leader_pid;
  atomic_store_explicit(&channels_open, false, memory_order_seq_cst);
  while (!child && atomic_load_explicit(&opening, memory_order_seq_cst) > 0) {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  for (size_t i = 0; i < nchannels; i++) {
    int fd = atomic_exchange_explicit(&send_end[i], -1, memory_order_seq_cst);
    if (fd < 0)
      continue;
    while (!child && atomic_load_explicit(&senders[i], memory_order_seq_cst) > 0) {
      struct timespec ts = {0, 50000};
      nanosleep(&ts, NULL);
    }
    close(fd);
  }
}

bool molt__shadow_is_channel(int fd) {
  for (size_t i = 0; i < nchannels; i++)
    if (fd >= 0 && (fd == recv_end[i] ||
                    fd == atomic_load_explicit(&send_end[i], memory_order_relaxed)))
      return true;
  return false;
}

/* ---- the leader --------------------------------------------------------------*/

uint32_t molt__shadow_fd_gen(int fd) {
  if (fd < 0 || fd >= TRACKED)
    return 0;
  return atomic_load_explicit(in_follower ? &own_open[fd] : &made[fd],
                              memory_order_relaxed);
}

static int send_fd(unsigned ring, int fd);
static int send_on(int ch, int fd, bool wait_for_room);

int molt__shadow_fd_created(unsigned ring, int fd, uint32_t *gen) {
  if (in_follower) {
    /* Leading after a promotion: its own generation, and the descriptor
     * to the original process over its end of the channel (the follower
     * closes its ends only when it ends). */
    *gen = 0;
    if (fd < TRACKED) {
      *gen = atomic_fetch_add_explicit(&own[fd], 1, memory_order_relaxed) + 1;
      atomic_store_explicit(&own_open[fd], *gen, memory_order_relaxed);
    }
    int back = ring < nchannels ? recv_end[ring] : -1;
    if (back < 0 || back_broken[ring])
      return 0; /* nothing sent: the original process finds none (take) */
    /* A failure (the original process died: EPIPE; it lags by a full
     * channel) drops nothing: the new version serves on.  This ring sends
     * no more, so that the original never takes a later descriptor for
     * the one that was not sent; it follows without those, as it did
     * before descriptors went back at all. */
    if (send_on(back, fd, false) != 0)
      back_broken[ring] = true;
    return 0;
  }
  *gen = fd < TRACKED ? atomic_fetch_add_explicit(&made[fd], 1, memory_order_relaxed) + 1
                      : 0;
  return send_fd(ring, fd);
}

/* Sends fd over channel end ch (one byte with SCM_RIGHTS), never blocking
 * in the call: 0 or -errno.  wait_for_room: a full channel (the follower
 * is behind on this ring's descriptors) is waited for as a full ring is --
 * the follower's threads nudged out of their naps (ring.c), at most
 * MOLT__SHADOW_FULL_WAIT_MS, then the caller drops the shadow.  (Dropped
 * at once, it ended the shadow of a server taking connections back to back
 * while the follower's threads napped, ~2 ms behind: shadowupd_epoll under
 * load.) */
static int send_on(int ch, int fd, bool wait_for_room) {
  char byte = 'F';
  struct iovec iov = {&byte, 1};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr m = {.msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = u.buf,
                     .msg_controllen = sizeof u.buf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  ssize_t w;
  uint64_t t0 = 0;
  int e = 0;
  for (;;) {
    w = sendmsg(ch, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    e = w < 0 ? errno : 0;
    if (w >= 0 || (e != EINTR && e != EAGAIN))
      break;
    if (e == EINTR)
      continue;
    if (!wait_for_room)
      break;
    uint64_t now = molt__now_ns();
    if (!t0)
      t0 = now;
    else if (now - t0 > (uint64_t)MOLT__SHADOW_FULL_WAIT_MS * 1000000u)
      break;
    molt__shadow_nudge();
    struct pollfd room = {ch, POLLOUT, 0};
    poll(&room, 1, 10);
  }
  if (w != 1)
    return w < 0 ? -e : -EIO;
  return 0;
}

/* Sends fd on ring's channel: 0 or -errno (-ENOTCONN: the session's end
 * closed it). */
static int send_fd(unsigned ring, int fd) {
  if (ring >= nchannels)
    return -EINVAL;
  atomic_fetch_add_explicit(&senders[ring], 1, memory_order_seq_cst);
  int ch = atomic_load_explicit(&send_end[ring], memory_order_seq_cst);
  int rc = ch < 0 ? -ENOTCONN : send_on(ch, fd, true);
  /* release: done with the end before the session's end may close it. */
  atomic_fetch_sub_explicit(&senders[ring], 1, memory_order_release);
  return rc;
}

/* ---- the follower --------------------------------------------------------------*/

void molt__shadow_note_inherited(void) {
  in_follower = true;
  for (int fd = 0; fd < TRACKED; fd++)
    if (fcntl(fd, F_GETFD) >= 0 && !molt__shadow_is_channel(fd))
      atomic_store_explicit(&held[fd],
                            atomic_load_explicit(&made[fd], memory_order_relaxed) + 1,
                            memory_order_relaxed);
}

void molt__shadow_note_shared_with(pid_t other) {
  for (int fd = 0; fd < TRACKED; fd++) {
    struct stat mine, theirs;
    char path[64];
    uint32_t both = 0;
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)other, fd);
    /* The same object under the same number in the other process: a copy
     * of the same descriptor from the fork or passed over a channel (for a
     * socket, the inode is the socket itself). */
    /* (A channel is not looked at: the monitor closes it when the
     * follower ends, with no order to this thread's look.) */
    if (!molt__shadow_is_channel(fd) && fstat(fd, &mine) == 0 &&
        stat(path, &theirs) == 0 && theirs.st_dev == mine.st_dev &&
        theirs.st_ino == mine.st_ino)
      both = 1;
    /* relaxed: the handover's release of `ready` orders it before the
     * replays that read it (ring.c) */
    atomic_store_explicit(&held[fd], both, memory_order_relaxed);
  }
}

/* Claims number fd (BUSY): the value it had. */
static uint32_t claim(int fd) {
  for (;;) {
    uint32_t cur = atomic_load_explicit(&held[fd], memory_order_relaxed);
    if (cur != BUSY &&
        atomic_compare_exchange_weak_explicit(&held[fd], &cur, BUSY, memory_order_acquire,
                                              memory_order_relaxed))
      return cur;
    sched_yield();
  }
}

static void unclaim(int fd, uint32_t v) {
  atomic_store_explicit(&held[fd], v, memory_order_release);
}

uint32_t molt__shadow_fd_table_gen(int fd) {
  if (!in_follower || fd < 0 || fd >= TRACKED)
    return molt__shadow_fd_gen(fd);
  /* relaxed: a program registers a descriptor only after the call that
   * gave it the number returned -- in this thread, whose replay placed it
   * (take's release store), or ordered before it by the program's own
   * hand-off of the number. */
  uint32_t h = atomic_load_explicit(&held[fd], memory_order_relaxed);
  return h != 0 && h != BUSY ? h - 1 : molt__shadow_fd_gen(fd);
}

int molt__shadow_fd_close_own(int fd) {
  if (!in_follower || fd < 0 || fd >= TRACKED)
    return close(fd);
  claim(fd); /* whatever was held there is closed now */
  int r = close(fd);
  int e = errno;
  unclaim(fd, 0);
  errno = e;
  return r;
}

void molt__shadow_fd_release(int fd, uint32_t gen) {
  if (fd < 0 || fd >= TRACKED)
    return;
  int e = errno;
  uint32_t cur = claim(fd);
  if (cur != 0 && (gen == MOLT__SHADOW_ANY_GEN || cur == gen + 1)) {
    close(fd);
    cur = 0;
  }
  unclaim(fd, cur);
  errno = e;
}

/* Follower: one placement at a time (shfd_lock).  recvmsg puts the
 * descriptor it receives at the lowest free number, for the moment before
 * dup3 moves it to the leader's: another thread placing that very number
 * meanwhile would take it for one of the follower's own, or replace it
 * and have its descriptor closed by the receiver. */
static molt__lock shfd_lock = MOLT__LOCK_INIT(shfd);

void molt__shadow_fds_fork_prepare(void) { molt__lock_acquire(&shfd_lock); }
void molt__shadow_fds_fork_parent(void) { molt__lock_release(&shfd_lock); }
void molt__shadow_fds_fork_child(void) { molt__lock_reinit(&shfd_lock); }

static void take(unsigned ring, int ch, int fd, uint32_t gen, bool cloexec);

void molt__shadow_fd_take(unsigned ring, int fd, uint32_t gen, bool cloexec) {
  if (!in_follower) {
    /* The original process following (promoted follower leads): from its
     * end of the channel, if the follower sent one (molt__shadow_fd_created:
     * before it published the record, so it is there now or never).
     * Counted as a sender: the session's end closes the end only once no
     * thread uses it (Dekker, as the leader's sends). */
    if (ring >= nchannels)
      return;
    atomic_fetch_add_explicit(&senders[ring], 1, memory_order_seq_cst);
    int ch = atomic_load_explicit(&send_end[ring], memory_order_seq_cst);
    if (ch >= 0) {
      molt__lock_acquire(&shfd_lock);
      take(ring, ch, fd, gen, cloexec);
      molt__lock_release(&shfd_lock);
    }
    /* release: done with the end before the session's end may close it. */
    atomic_fetch_sub_explicit(&senders[ring], 1, memory_order_release);
    return;
  }
  molt__lock_acquire(&shfd_lock);
  /* a failure ends the follower: the lock goes too */
  take(ring, ring < nchannels ? recv_end[ring] : -1, fd, gen, cloexec);
  molt__lock_release(&shfd_lock);
}

/* The next descriptor on channel end ch of ring; what: what it is, for the
 * follower's end when it is not there.  The follower waits for it (the
 * leader sent it before it published the record being consumed) and ends
 * without it; the original process, following a promoted follower, takes
 * it only if it is there: -1 otherwise (the follower sent none).
 * shfd_lock held. */
/* One message (a byte and a descriptor) from channel end ch; flags: 0
 * or MSG_DONTWAIT.  Returns recvmsg's result (-1 with errno), the
 * descriptor in *got, -1 if the message carried none. */
static ssize_t recv_one(int ch, int flags, int *got) {
  char byte;
  struct iovec iov = {&byte, 1};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  struct msghdr m = {.msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = u.buf,
                     .msg_controllen = sizeof u.buf};
  ssize_t r;
  while ((r = recvmsg(ch, &m, MSG_CMSG_CLOEXEC | flags)) < 0 && errno == EINTR)
    ;
  struct cmsghdr *c = r == 1 ? CMSG_FIRSTHDR(&m) : NULL;
  *got = -1;
  if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
      c->cmsg_len == CMSG_LEN(sizeof(int)))
    memcpy(got, CMSG_DATA(c), sizeof *got);
  return r;
}

static int recv_fd(unsigned ring, int ch, const char *what) {
  if (ch < 0) {
    if (!in_follower)
      return -1;
    molt__shadow_follower_fail(MOLT__SHADOW_END_FAILED,
                               "%s, which the leader created after the fork, cannot "
                               "reach the follower (no channel for thread %u)",
                               what, ring);
  }
  int got;
  ssize_t r = recv_one(ch, in_follower ? 0 : MSG_DONTWAIT, &got);
  if (got < 0) {
    if (!in_follower)
      return -1;
    molt__shadow_follower_fail(MOLT__SHADOW_END_FAILED,
                               "%s, which the leader created after the fork, did not "
                               "reach the follower (%s)",
                               what,
                               r < 0 ? strerror(errno) : "no descriptor in the message");
  }
  return got;
}

/* A descriptor that cannot be placed ends the follower (the lock goes
 * with it).  The original process following does not stop there, holding
 * shfd_lock and its count in `senders`: the descriptor is not placed, and
 * a program that then acts on it diverges, reported as any divergence. */
#define CANNOT(...)                                                                      \
  do {                                                                                   \
    if (in_follower)                                                                     \
      molt__shadow_follower_fail(MOLT__SHADOW_END_FAILED, __VA_ARGS__);                  \
    errno = e;                                                                           \
    return;                                                                              \
  } while (0)

/* Receives the descriptor the other side sent on ch and places it at fd
 * (generation gen). */
static void take(unsigned ring, int ch, int fd, uint32_t gen, bool cloexec) {
  int e = errno;
  char what[48];
  snprintf(what, sizeof what, "descriptor %d", fd);
  int got = recv_fd(ring, ch, what);
  if (got < 0) { /* the original process: none was sent */
    errno = e;
    return;
  }
  if (fd >= TRACKED) {
    if (got != fd && dup3(got, fd, cloexec ? O_CLOEXEC : 0) < 0) {
      int de = errno;
      close(got);
      CANNOT("cannot place descriptor %d in the follower: %s", fd, strerror(de));
    }
    if (got != fd)
      close(got);
    errno = e;
    return;
  }
  uint32_t cur = claim(fd);
  if (cur > gen + 1) {
    /* A newer descriptor is there already: the leader closed this one. */
    unclaim(fd, cur);
    close(got);
    errno = e;
    return;
  }
  if (got != fd) {
    if (cur == 0 && fcntl(fd, F_GETFD) >= 0) {
      unclaim(fd, cur);
      close(got);
      CANNOT("descriptor %d, which the leader created after the fork, "
             "is taken in the follower by one of its own",
             fd);
    }
    if (dup3(got, fd, cloexec ? O_CLOEXEC : 0) < 0) {
      int de = errno;
      unclaim(fd, cur);
      close(got);
      CANNOT("cannot place descriptor %d in the follower: %s", fd, strerror(de));
    }
    close(got);
  } else if (!cloexec) {
    fcntl(fd, F_SETFD, 0);
  }
  unclaim(fd, gen + 1);
  errno = e;
}
#undef CANNOT

/* ---- channels of threads started after the fork ------------------------------------*/

static int ring_open(unsigned creator, unsigned ring) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return -errno;
  int out = high(sv[0]), in = high(sv[1]);
  int rc = send_fd(creator, in);
  close(in); /* the follower's end: in the channel now, or nowhere */
  if (rc < 0) {
    close(out);
    return rc;
  }
  /* The slot's last thread closed its end when it ended: none to close. */
  int old = atomic_exchange_explicit(&send_end[ring], out, memory_order_seq_cst);
  if (old >= 0)
    close(old);
  return 0;
}

int molt__shadow_fds_ring_open(unsigned creator, unsigned ring) {
  if (ring >= nchannels)
    return -EINVAL;
  atomic_fetch_add_explicit(&opening, 1, memory_order_seq_cst);
  int rc = atomic_load_explicit(&channels_open, memory_order_seq_cst)
               ? ring_open(creator, ring)
               : -ENOTCONN;
  /* release: done with the ends before the session's end closes them */
  atomic_fetch_sub_explicit(&opening, 1, memory_order_release);
  return rc;
}

void molt__shadow_fds_ring_take(unsigned creator, unsigned ring) {
  if (ring >= nchannels)
    molt__shadow_follower_fail(MOLT__SHADOW_END_FAILED,
                               "the channel of thread %u is out of range", ring);
  molt__lock_acquire(&shfd_lock);
  int got = recv_fd(creator, creator < nchannels ? recv_end[creator] : -1,
                    "the channel of a thread");
  int fd = high(got);
  molt__lock_release(&shfd_lock);
  int old = recv_end[ring];
  recv_end[ring] = fd;
  if (old >= 0)
    close(old);
}

void molt__shadow_fds_drain(unsigned ring) {
  if (ring >= nchannels || recv_end[ring] < 0)
    return;
  int e = errno;
  molt__lock_acquire(&shfd_lock);
  int got;
  while (recv_one(recv_end[ring], MSG_DONTWAIT, &got) == 1)
    if (got >= 0)
      close(got);
  molt__lock_release(&shfd_lock);
  errno = e;
}

void molt__shadow_fds_ring_close(unsigned ring) {
  if (ring >= nchannels)
    return;
  if (in_follower) {
    int fd = recv_end[ring];
    recv_end[ring] = -1;
    if (fd >= 0)
      close(fd);
    return;
  }
  /* Its thread was the ring's only sender; the session's end may swap
   * the end out at the same time: whoever gets it closes it. */
  int fd = atomic_exchange_explicit(&send_end[ring], -1, memory_order_seq_cst);
  if (fd >= 0)
    close(fd);
}

/* ---- kernel objects a fork shares -------------------------------------------------*/

/* An io_uring is a kernel object that fork() shares rather than copies:
 * the follower's submissions would go into the leader's rings, which the
 * kernel may read without any system call (SQPOLL), out of the backstop's
 * sight (trap.c).  It cannot be followed, so a program that holds one is
 * refused at the barrier, before the fork, with nothing changed.  (An
 * epoll instance is shared too; epoll.c follows it.) */
int molt__shadow_each_fd_of(const char *link_name, int (*fn)(void *arg, int fd),
                            void *arg, char *err, size_t errlen) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) {
    int e = errno;
    molt__errmsg(err, errlen, "cannot list the process's descriptors: %s", strerror(e));
    return molt__from_errno(e);
  }
  int rc = 0, dfd = dirfd(d);
  for (struct dirent *de; rc == 0 && (de = readdir(d)) != NULL;) {
    char *end;
    long fd = strtol(de->d_name, &end, 10);
    if (*end || end == de->d_name || fd == dfd)
      continue;
    char link[64];
    ssize_t n = readlinkat(dfd, de->d_name, link, sizeof link - 1);
    if (n <= 0)
      continue;
    link[n] = '\0';
    if (strcmp(link, link_name) == 0)
      rc = fn(arg, (int)fd);
  }
  closedir(d);
  return rc;
}

typedef struct refusal {
  char *err;
  size_t errlen;
} refusal;

static int refuse_io_uring(void *arg, int fd) {
  refusal *r = arg;
  molt__errmsg(r->err, r->errlen,
               "the program holds an io_uring (fd %d), which a forked follower would "
               "share with the leader; shadowed updates follow poll- and epoll-based "
               "servers only: use a plain full update (molt update)",
               fd);
  return MOLT_ENOTSUP;
}

int molt__shadow_fds_check_forkable(char *err, size_t errlen) {
  refusal r = {err, errlen};
  return molt__shadow_each_fd_of("anon_inode:[io_uring]", refuse_io_uring, &r, err,
                                 errlen);
}
