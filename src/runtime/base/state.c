/* The runtime's shared state at the bottom of the layers: the state lock,
 * the refusing state, the runtime thread's wake-up and its lazy start in a
 * forked child.  These live here, not in the service layer that runs the
 * runtime thread, because every layer uses them: generations wake the
 * runtime thread to reclaim, any layer can hit an internal failure. */
#include "base/base.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
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

static int wake_fd = -1;

int molt__wake_init(void) {
  wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    int e = errno;
    molt__fail("cannot create an eventfd: %s", strerror(e));
    return molt__from_errno(e);
  }
  return 0;
}

int molt__wake_fd(void) { return wake_fd; }

void molt__wake(void) {
  if (wake_fd >= 0) {
    /* Called by application threads (at an update point, at thread exit,
     * in molt_apply): write() must not make those cancellation points. */
    int cs;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
    uint64_t one = 1;
    ssize_t w = write(wake_fd, &one, sizeof one); /* EAGAIN: already woken */
    (void)w;
    pthread_setcancelstate(cs, NULL);
  }
}

void molt__wake_drain(void) {
  uint64_t v;
  ssize_t r = read(wake_fd, &v, sizeof v);
  (void)r;
}

void molt__wake_after_fork_child(void) {
  if (wake_fd >= 0)
    close(wake_fd);
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
