/* The runtime's shared state at the bottom of the layers: the state lock,
 * the refusing state, the runtime thread's wake-up and its lazy start in a
 * forked child.  These live here, not in the service layer that runs the
 * runtime thread, because every layer uses them: generations wake the
 * runtime thread to reclaim, any layer can hit an internal failure. */
#include "base/base.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- the state lock ---------------------------------------------------------*/

static molt__lock rt_lock = MOLT__LOCK_INIT(rt);

void molt__rt_lock_acquire(void) { molt__lock_acquire(&rt_lock); }
void molt__rt_lock_release(void) { molt__lock_release(&rt_lock); }
void molt__rt_lock_after_fork_child(void) { molt__lock_reinit(&rt_lock); }

/* ---- the refusing state (R3) ------------------------------------------------*/

static _Atomic bool refusing;
static char refuse_reason[256]; /* written once, before refusing is set */

void molt__fail_quiet(const char *reason) {
  /* Only the first failure is kept as the reason.  The reason is written
   * by the winner of this exchange before the release store below; readers
   * load `refusing` with acquire before reading it. */
  static _Atomic bool claimed;
  bool expected = false;
  if (atomic_compare_exchange_strong(&claimed, &expected, true)) {
    snprintf(refuse_reason, sizeof refuse_reason, "%s", reason);
    atomic_store_explicit(&refusing, true, memory_order_release);
  }
}

void molt__fail(const char *fmt, ...) {
  char msg[sizeof refuse_reason];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  molt__fail_quiet(msg);
  molt__log(MOLT__EV_FAIL, 0, NULL, "refusing further updates: %s", msg);
}

bool molt__refusing(char *reason, size_t len) {
  if (!atomic_load_explicit(&refusing, memory_order_acquire))
    return false;
  if (reason && len)
    snprintf(reason, len, "%s", refuse_reason);
  return true;
}

/* ---- wake-up -------------------------------------------------------------------*/

/* A connected pair of stream sockets: the runtime thread polls `wake_rd`,
 * other threads write a byte into `wake_wr`.  Sockets, not an eventfd, for
 * two reasons (base.h, "descriptors the host may close"):
 *   - each socket has an inode of its own, so molt__fd_ours() can tell
 *     ours from a socket the host opened on the same number (all eventfds
 *     share one inode);
 *   - the write end is a tripwire.  Nothing but the descriptor table holds
 *     it, so when the host closes it -- and a loop that closes every
 *     descriptor does -- the read end sees end-of-file at once and wakes
 *     the runtime thread, which then finds every lost descriptor and makes
 *     new ones.  No periodic wake-up is needed to notice (the poll holds
 *     the read end itself, so closing that alone wakes nobody; the next
 *     write or client connection does, and changes nothing before).
 * The pair is read and replaced under fd_lock (fd.c): a waker checks and
 * writes under it, so the runtime thread never closes, and never places a
 * new descriptor on, a number a waker is about to write to. */
static molt__fd wake_rd = MOLT__FD_NONE, wake_wr = MOLT__FD_NONE;
static bool wake_broken; /* runtime thread: the read end saw end-of-file */
/* Raised by every molt__wake() before it writes, taken by the runtime
 * thread before it polls: on the runtime thread itself it replaces the
 * write, and it covers a wake-up whose write could not be made (the pair
 * lost or being replaced).  Release/acquire orders nothing else --
 * whatever a wake-up announces is published under its own lock (requests,
 * generations) -- the flag only decides whether the runtime thread may
 * sleep; a flag raised after the runtime thread looked is followed by the
 * write (or shutdown) that ends its poll. */
static _Atomic bool wake_pending;
static __thread bool wake_self __attribute__((tls_model("initial-exec")));

/* Makes a new pair (no lock held: keeping takes fd_lock).  The write end
 * is kept first: it takes the lower number, so a loop that closes from low
 * to high numbers and reaches any of ours trips it. */
static int wake_make(molt__fd *rd, molt__fd *wr) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0)
    return molt__from_errno(errno);
  int rc = molt__fd_keep(wr, sv[1]);
  if (rc < 0) {
    close(sv[0]);
    return rc;
  }
  rc = molt__fd_keep(rd, sv[0]);
  if (rc < 0)
    molt__fd_close(wr);
  return rc;
}

/* Publishes a new pair for the wakers (either may be none). */
static void wake_set(const molt__fd *rd, const molt__fd *wr) {
  molt__fd_lock();
  wake_rd = *rd;
  wake_wr = *wr;
  molt__fd_unlock();
  wake_broken = false;
}

int molt__wake_init(void) {
  molt__fd rd = MOLT__FD_NONE, wr = MOLT__FD_NONE;
  int rc = wake_make(&rd, &wr);
  wake_set(&rd, &wr);
  if (rc < 0)
    molt__fail("cannot create the runtime thread's wake-up sockets: %s",
               molt_strerror(rc));
  return rc;
}

void molt__wake_serve_here(void) { wake_self = true; }

void molt__wake(void) {
  atomic_store_explicit(&wake_pending, true, memory_order_release);
  if (wake_self)
    return; /* the runtime thread looks at the flag before it sleeps */
  /* Called by application threads (at an update point, at thread exit,
   * in molt_apply): send() must not make those cancellation points. */
  int cs;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
  molt__fd_lock();
  if (molt__fd_ours(&wake_wr)) {
    /* EAGAIN: full of earlier wake-ups, it is awake anyway. */
    ssize_t w = send(wake_wr.fd, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)w;
  } else if (molt__fd_ours(&wake_rd)) {
    /* The write end is gone but its file lives on somewhere (else the
     * read end has seen end-of-file already): shutting the read end down
     * ends the runtime thread's poll just as well. */
    shutdown(wake_rd.fd, SHUT_RD);
  }
  molt__fd_unlock();
  pthread_setcancelstate(cs, NULL);
}

bool molt__wake_lost(void) {
  /* The runtime thread is the only one that changes the pair. */
  return wake_broken || !molt__fd_ours(&wake_rd) || !molt__fd_ours(&wake_wr);
}

int molt__wake_keep(void) {
  static bool missing; /* runtime thread: lost, new ones not made yet */
  molt__fd_lock();
  bool replace =
      missing || wake_broken || !molt__fd_ours(&wake_rd) || !molt__fd_ours(&wake_wr);
  int lost_rd = wake_rd.fd, lost_wr = wake_wr.fd;
  if (replace) {
    /* Whichever end is still ours is closed; a lost one is forgotten: its
     * number belongs to the host now. */
    molt__fd_close(&wake_rd);
    molt__fd_close(&wake_wr);
  }
  molt__fd_unlock();
  if (!replace)
    return wake_rd.fd;
  /* Meanwhile a waker finds none and only raises the flag, which the
   * runtime thread -- this one -- looks at before it sleeps. */
  molt__fd rd = MOLT__FD_NONE, wr = MOLT__FD_NONE;
  int rc = wake_make(&rd, &wr);
  wake_set(&rd, &wr);
  /* One entry when the loss is found, one when a retry succeeds. */
  if (rc == 0 && missing)
    molt__log(MOLT__EV_INFO, 0, NULL, "made new wake-up descriptors (fds %d, %d)", rd.fd,
              wr.fd);
  else if (rc == 0)
    molt__log(MOLT__EV_INFO, 0, NULL,
              "the process closed or replaced molt's wake-up descriptors (fds %d, %d): "
              "made new ones (fds %d, %d)",
              lost_rd, lost_wr, rd.fd, wr.fd);
  else if (!missing)
    molt__log(MOLT__EV_INFO, 0, NULL,
              "the process closed or replaced molt's wake-up descriptors (fds %d, %d); "
              "cannot make new ones yet (%s): retrying every second",
              lost_rd, lost_wr, molt_strerror(rc));
  missing = rc < 0;
  return rc == 0 ? rd.fd : -1;
}

bool molt__wake_pending(void) {
  return atomic_load_explicit(&wake_pending, memory_order_acquire);
}

bool molt__wake_drain(short revents) {
  bool woken = atomic_exchange_explicit(&wake_pending, false, memory_order_acq_rel) ||
               revents != 0;
  if (revents == 0 || !molt__fd_ours(&wake_rd))
    return woken; /* a lost read end: molt__wake_keep replaces it */
  char buf[256];
  for (;;) {
    ssize_t n = recv(wake_rd.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0)
      continue;
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      wake_broken = true; /* the write end was closed (or shut down) */
    if (n < 0 && errno == EINTR)
      continue;
    return woken;
  }
}

void molt__wake_after_fork_child(void) {
  /* One thread: no lock needed (fd_lock is made anew by then).  The
   * parent's pair is closed if it is still ours: the child must not keep
   * the parent's write end open (it would blunt the parent's tripwire). */
  molt__fd_close(&wake_rd);
  molt__fd_close(&wake_wr);
  /* Relaxed: the child has one thread, nothing to order against. */
  atomic_store_explicit(&wake_pending, false, memory_order_relaxed);
  wake_self = false;
  (void)molt__wake_init();
}

/* ---- lazy start -------------------------------------------------------------*/

/* Armed only in a forked child, by its (single) thread in the fork handler,
 * before any other thread exists there: `start_fn` is written before the
 * flag, and every later reader either is that thread or was created after
 * (pthread_create orders it).  Relaxed: the start itself rechecks under
 * its own lock. */
static void (*start_fn)(void);
static _Atomic bool start_pending;

void molt__start_arm(void (*start)(void)) {
  start_fn = start;
  atomic_store_explicit(&start_pending, true, memory_order_relaxed);
}

void molt__start_disarm(void) {
  atomic_store_explicit(&start_pending, false, memory_order_relaxed);
}

bool molt__start_armed(void) {
  return atomic_load_explicit(&start_pending, memory_order_relaxed);
}

void molt__start_if_needed(void) {
  if (atomic_load_explicit(&start_pending, memory_order_relaxed))
    start_fn();
}
