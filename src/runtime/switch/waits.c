/* Threads that block, and how an update reaches them: the update
 * descriptor for event loops (molt_update_fd), interruptible sleeps
 * (molt_usleep) and condition waits (molt_cond_wait).  A barrier raises
 * the pending flag and then wakes all three kinds (molt__waits_wake); when
 * it ends it takes the descriptor's readiness back (molt__waits_end).
 *
 * The descriptor is an eventfd, readable exactly while an update is
 * pending: the barrier writes it once when it starts and drains it before
 * it releases anyone, so a loop that watches it (level-triggered: epoll,
 * poll, libevent without EV_ET) wakes up at once, and a loop that runs
 * after the barrier does not spin on it.  The program only polls it; it
 * must not read it (that would hide the update from the other loops).
 *
 * Condition waits: a thread in molt_cond_wait is on a list (bar_lock) with
 * its condition variable and mutex.  The waker, having raised the pending
 * flag, broadcasts each listed condition variable holding the thread's
 * mutex when it can take it with trylock: the thread registered, read the
 * flag and entered pthread_cond_wait all while holding that mutex, so a
 * broadcast made under it cannot fall between its reading the flag and
 * its waiting.  When trylock fails (the thread is not in its wait yet, or
 * another thread of the program holds the mutex), the broadcast is made
 * anyway; the barrier wakes everything again every WAKE_AGAIN_MS
 * (points.c) until every participant has arrived, so a lost wake-up costs
 * that long at most.  The waker never blocks on a program mutex. */
#include "switch/switch.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef struct cond_waiter {
  pthread_cond_t *cond;
  pthread_mutex_t *mutex;
  molt__link link;
} cond_waiter;

static molt__link *waiters; /* cond_waiter (bar_lock) */
static bool fd_written;     /* the pending barrier wrote the descriptor (bar_lock) */

/* The descriptor, -1 until the first molt_update_fd.  Created once:
 * acq_rel on the compare-exchange, acquire on every load, so a thread that
 * sees the number sees the descriptor created. */
static _Atomic int update_fd = -1;

int molt_update_fd(void) {
  int fd = atomic_load_explicit(&update_fd, memory_order_acquire);
  if (fd >= 0)
    return fd;
  int made = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (made < 0)
    return -1;
  int expected = -1;
  if (!atomic_compare_exchange_strong_explicit(
          &update_fd, &expected, made, memory_order_acq_rel, memory_order_acquire)) {
    close(made); /* another thread made it first */
    return expected;
  }
  /* An update already pending when the descriptor is made: readable now. */
  if (molt__point_pending()) {
    uint64_t one = 1;
    if (write(made, &one, sizeof one) < 0) {
      /* EAGAIN only (the counter is far from full); nothing to do. */
    }
  }
  return made;
}

/* libevent's callback type (evutil_socket_t is int on Linux).  It does
 * nothing: returning from the loop is what brings its thread to its update
 * point.  It lives in libmolt, so an event that names it stays valid
 * across full updates (the image that added the event may be unloaded). */
void molt_update_fd_cb(int fd, short what, void *arg) {
  (void)fd;
  (void)what;
  (void)arg;
}

/* Event loops whose base already watches the update descriptor: a base is
 * carried across full updates (libevent's memory is not the image's), so
 * the restarted loop must not add a second event.  Few bases, kept for
 * the process's lifetime (a freed base's address reused by a new one would
 * be taken for watched: documented in molt.h). */
#define MAX_LOOPS 256
static void *loops[MAX_LOOPS]; /* bar_lock */
static size_t nloops;          /* bar_lock */
/* The loop this thread asked about last: MOLT_EVENT_LOOP_ONCE asks every
 * round, and a thread runs one loop, so bar_lock is taken about once per
 * thread (libmolt's TLS survives a full update's restart). */
static __thread void *asked_last __attribute__((tls_model("initial-exec")));

int molt_update_fd_watch(void *loop) {
  if (loop == asked_last || molt_update_fd() < 0)
    return 0;
  int add = 1;
  molt__point_lock();
  for (size_t i = 0; i < nloops && add; i++)
    if (loops[i] == loop)
      add = 0;
  if (add && nloops < MAX_LOOPS)
    loops[nloops++] = loop;
  molt__point_unlock();
  asked_last = loop;
  return add;
}

int molt_usleep(unsigned long usec, const char *name) {
  int updated = molt_update_point(name);
  int fd = molt_update_fd();
  if (fd < 0) {
    usleep(usec);
  } else {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    struct timespec t = {.tv_sec = (time_t)(usec / 1000000),
                         .tv_nsec = (long)(usec % 1000000) * 1000};
    /* EINTR: the sleep ends early, as usleep's does. */
    (void)ppoll(&p, 1, &t, NULL);
  }
  return molt_update_point(name) | updated;
}

/* Takes the waiter off the list; also run if the thread is cancelled in
 * its wait (pthread_cond_wait is a cancellation point). */
static void unlist(void *arg) {
  cond_waiter *w = arg;
  molt__point_lock();
  molt__list_unlink(&waiters, &w->link);
  molt__point_unlock();
}

int molt_cond_timedwait(pthread_cond_t *cond, pthread_mutex_t *mutex,
                        const struct timespec *abstime, const char *name) {
  cond_waiter w = {.cond = cond, .mutex = mutex};
  /* Listed, then the flag read, under bar_lock and holding mutex: see the
   * top of the file. */
  molt__point_lock();
  bool pending = molt__point_pending();
  if (!pending)
    molt__list_push(&waiters, &w.link);
  molt__point_unlock();
  int rc = 0;
  if (!pending) {
    pthread_cleanup_push(unlist, &w);
    rc = abstime ? pthread_cond_timedwait(cond, mutex, abstime)
                 : pthread_cond_wait(cond, mutex);
    pthread_cleanup_pop(1);
    /* Read after the wait, holding mutex again: a wake-up for an update
     * finds it raised (it was raised before the broadcast). */
    pending = molt__point_pending();
  }
  if (!pending)
    return rc;
  /* The update point, with the mutex released: a thread restarted by a
   * full update starts again without it, and its new version takes the
   * mutex (migrated unlocked) itself. */
  pthread_mutex_unlock(mutex);
  molt_update_point(name);
  pthread_mutex_lock(mutex);
  return EINTR;
}

int molt_cond_wait(pthread_cond_t *cond, pthread_mutex_t *mutex, const char *name) {
  return molt_cond_timedwait(cond, mutex, NULL, name);
}

void molt__waits_wake(void) {
  int fd = atomic_load_explicit(&update_fd, memory_order_acquire);
  if (fd >= 0) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    /* Written when the barrier starts, and again only if it is not
     * readable (a forked relative's barrier drained the shared counter):
     * waking the list again must not count it up for nothing. */
    if (!fd_written || poll(&p, 1, 0) == 0) {
      uint64_t one = 1;
      fd_written = write(fd, &one, sizeof one) == sizeof one;
    }
  }
  for (molt__link *l = waiters; l; l = l->next) {
    cond_waiter *w = MOLT__CONTAINER(l, cond_waiter, link);
    if (pthread_mutex_trylock(w->mutex) == 0) {
      pthread_cond_broadcast(w->cond);
      pthread_mutex_unlock(w->mutex);
    } else {
      pthread_cond_broadcast(w->cond); /* may be lost: woken again later */
    }
  }
}

void molt__waits_end(void) {
  int fd = atomic_load_explicit(&update_fd, memory_order_acquire);
  uint64_t value;
  /* One read takes the whole count (molt_update_fd may have written too). */
  if (fd >= 0 && read(fd, &value, sizeof value) < 0) {
    /* EAGAIN: it was not readable (made after the barrier started). */
  }
  fd_written = false;
}

void molt__waits_after_fork_child(void) {
  waiters = NULL;
  fd_written = false;
}
