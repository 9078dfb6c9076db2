/* The runtime's locks and the check of their order (base.h has the table).
 *
 * With MOLT_LOCK_CHECK each thread keeps a bit per lock rank it holds.
 * Taking a lock whose rank is not above every held one is a violation of
 * the order -- the kind of nesting that can deadlock against a thread that
 * nests the other way round, or against itself: it is reported, and the
 * lock is taken anyway.  Reported means: the runtime enters the refusing
 * state with a reason naming both locks (so `molt status` and every later
 * update show it), a `fail` entry is logged, and molt__lock_violations()
 * counts it for tests.  Never an abort: the host keeps running (R3).
 * Without MOLT_LOCK_CHECK the lock functions are the plain pthread calls
 * (inline in base.h) and nothing is counted. */
#include "base/base.h"

#include <stdio.h>

static const char *const names[] = {
#define MOLT__LOCK_NAME(name, owner, what) #name "_lock",
    MOLT__LOCKS(MOLT__LOCK_NAME)
#undef MOLT__LOCK_NAME
};

const char *molt__lock_name(unsigned rank) {
  return rank < MOLT__LOCK_RANKS ? names[rank] : "?";
}

_Static_assert(MOLT__LOCK_RANKS <= 32, "one bit per rank in a uint32_t");

/* Relaxed: a counter for tests, read after the threads that could bump it
 * are joined or quiet. */
static _Atomic unsigned violations;

unsigned molt__lock_violations(void) {
  return atomic_load_explicit(&violations, memory_order_relaxed);
}

#if MOLT_LOCK_CHECK

/* The ranks the calling thread holds, one bit each.  Only the thread itself
 * reads or writes it. */
static __thread uint32_t held __attribute__((tls_model("initial-exec")));

static void violation(const molt__lock *l, uint32_t above) {
  atomic_fetch_add_explicit(&violations, 1, memory_order_relaxed);
  unsigned worst = 31 - (unsigned)__builtin_clz(above); /* the highest rank held */
  char reason[256];
  snprintf(reason, sizeof reason,
           "lock order violated: %s taken while holding %s (see the lock table in "
           "src/runtime/base/base.h)",
           molt__lock_name(l->rank), molt__lock_name(worst));
  /* Logging takes the log lock: not if this thread holds it already. */
  if (held & (1u << MOLT__LOCK_RANK_log))
    molt__fail_quiet(reason);
  else
    molt__fail("%s", reason);
}

void molt__lock_acquire(molt__lock *l) {
  uint32_t above = held & ~((1u << l->rank) - 1); /* ranks >= l's */
  if (above)
    violation(l, above);
  pthread_mutex_lock(&l->m);
  held |= 1u << l->rank;
}

void molt__lock_release(molt__lock *l) {
  held &= ~(1u << l->rank);
  pthread_mutex_unlock(&l->m);
}

/* The mutex is released and taken again inside the wait; the thread holds
 * the same set of locks before and after, and runs nothing meanwhile. */
int molt__lock_wait(pthread_cond_t *c, molt__lock *l) {
  return pthread_cond_wait(c, &l->m);
}

int molt__lock_timedwait(pthread_cond_t *c, molt__lock *l,
                         const struct timespec *deadline) {
  return pthread_cond_timedwait(c, &l->m, deadline);
}

void molt__lock_reinit(molt__lock *l) {
  pthread_mutex_init(&l->m, NULL);
  held &= ~(1u << l->rank);
}

#else

void molt__lock_reinit(molt__lock *l) { pthread_mutex_init(&l->m, NULL); }

#endif
