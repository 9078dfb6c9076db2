/* A patch's pre- and post-update callbacks (molt.h MOLT_PATCH_PRE/POST),
 * run with a deadline.
 *
 * The runtime thread holds the operation lock while it applies a patch, so
 * a callback never runs on it: a callback that blocks or loops would hold
 * that lock (and with it the control channel and every fork()) for ever.
 * Each callback gets a thread of its own, started for it and detached; the
 * runtime thread waits for it on a semaphore with a deadline
 * (CLOCK_MONOTONIC) and takes no lock of the table in base.h meanwhile, so
 * the callback may take any lock the program's threads take without an
 * order against op_lock arising here.  A callback that does not return in
 * time keeps running: its thread and the record below outlive the wait
 * (two references, the thread's and the waiter's, the last one frees), and
 * the caller keeps the patch loaded, since its code is still running. */
#include "hot/hot.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct molt__callback_thread {
  int (*fn)(void);
  int result;       /* written by the thread before `done` is posted */
  sem_t done;       /* posted once fn returned */
  _Atomic int refs; /* the thread's and the waiter's */
  /* Set by the thread after fn returned, read by status at any time.
   * Release/acquire: whoever sees it set also sees `result`. */
  _Atomic bool finished;
};

static void run_release(molt__callback_thread *r) {
  /* acq_rel: the last owner's free comes after every access of the other
   * owner, which happened before its own decrement (release). */
  if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1) {
    sem_destroy(&r->done);
    free(r);
  }
}

static void *callback_main(void *arg) {
  molt__callback_thread *r = arg;
  r->result = r->fn();
  atomic_store_explicit(&r->finished, true, memory_order_release);
  sem_post(&r->done); /* orders `result` before the waiter's sem_clockwait */
  run_release(r);
  return NULL;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int molt__callback_run(int (*fn)(void), int timeout_ms, int *result, unsigned *elapsed_ms,
                       molt__callback_thread **still_running, char *err, size_t errlen) {
  *still_running = NULL;
  *elapsed_ms = 0;
  molt__callback_thread *r = calloc(1, sizeof *r);
  if (!r) {
    molt__errmsg(err, errlen, "out of memory");
    return MOLT_ENOMEM;
  }
  r->fn = fn;
  atomic_init(&r->refs, 2);
  atomic_init(&r->finished, false);
  if (sem_init(&r->done, 0, 0) != 0) {
    free(r);
    molt__errmsg(err, errlen, "cannot make a semaphore for the callback");
    return MOLT_EINTERNAL;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  /* As the runtime thread: signals sent to the process go to the
   * application's threads; synchronous faults stay deliverable. */
  sigset_t old;
  molt__block_async_signals(&old);
  pthread_t t;
  uint64_t start = now_ms();
  int prc = pthread_create(&t, &attr, callback_main, r);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  if (prc != 0) {
    sem_destroy(&r->done);
    free(r);
    molt__errmsg(err, errlen, "cannot start a thread for the callback: %s",
                 strerror(prc));
    return molt__from_errno(prc);
  }
  pthread_setname_np(t, "molt-callback");
  struct timespec deadline = molt__monotonic_after_ms(timeout_ms);
  int rc;
  while ((rc = sem_clockwait(&r->done, CLOCK_MONOTONIC, &deadline)) != 0 &&
         errno == EINTR)
    ;
  *elapsed_ms = (unsigned)(now_ms() - start);
  if (rc != 0) {
    /* Still running: the waiter's reference goes to the caller. */
    *still_running = r;
    molt__errmsg(err, errlen, "did not return within %d ms", timeout_ms);
    return MOLT_ETIMEDOUT;
  }
  /* Acquire pairs with the thread's release store: `result` is visible
   * (the semaphore orders it too; this says so to ThreadSanitizer). */
  (void)atomic_load_explicit(&r->finished, memory_order_acquire);
  *result = r->result;
  run_release(r);
  return 0;
}

bool molt__callback_finished(molt__callback_thread *r) {
  return atomic_load_explicit(&r->finished, memory_order_acquire);
}

void molt__callback_release(molt__callback_thread *r) {
  if (r)
    run_release(r);
}
