/* Update timing: local quiescence points (WFPATCH) and global update points
 * (Kitsune-style barrier), and how a new generation reaches the threads
 * under each policy.
 *
 * Local policy without a kernel extension: a participating thread reads its
 * generation through its own `view` pointer (molt__thread.viewp == &view),
 * which only it moves, at molt_quiesce().  The view is also the thread's
 * hazard pointer: the reclaimer never frees a generation some view names.
 *
 * The barrier (molt__timing_barrier) serves both the hot-patch `global`
 * policy and full updates (program.c).  It raises the pending flag, waits
 * until every participant waits in molt_update_point(), runs the caller's
 * `while_parked` step while they wait, and releases them with a verdict:
 *   none     timeout or failure: molt_update_point() returns 0
 *   updated  a hot patch was switched in: it returns 1
 *   restart  a full update committed: a program thread siglongjmps to its
 *            restart frame (program.c) instead of returning; any other
 *            participant returns 1.
 *
 * Participants: a thread becomes one at its first molt_update_point(), or
 * from its first instruction if it is a program thread (molt__timing_join,
 * called by the pthread wrapper and the driver), so that a program thread
 * that never reaches an update point is named in a timeout error.
 *
 * Lock: bar_lock protects the participant list and the barrier state.  It
 * is taken by application threads in molt_update_point (slow path only)
 * and by the updating thread, which nests it inside op_lock and outside
 * molt__rt_lock.  `while_parked` runs WITHOUT bar_lock: the participants
 * stay parked because release_seq does not change, and the step may
 * dlopen/dlclose (image destructors must not find bar_lock held).  A
 * program thread that parks for a full update snapshots its migrated locals
 * under bar_lock (touching only its own record, without prog_lock; prog_lock
 * may nest inside bar_lock, never the other way round). */
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct participant {
  pid_t tid;
  /* Last update point reached (a literal); NULL: none yet.  Written by the
   * thread without bar_lock, read by the updater for its error message and
   * by status: relaxed atomic (a stale value only makes a message stale). */
  _Atomic(const char *) point;
  bool parked;       /* waiting in molt_update_point */
  bool linked;
  /* How the barrier it was parked in ended (bar_lock): written by the
   * releaser when it counts the thread out, read by the thread when it
   * wakes.  Per participant, not global: a thread that wakes late, after a
   * LATER barrier has ended too, must still see the verdict of its own. */
  molt__verdict verdict;
  struct participant *next, *prev;
} participant;

static __thread participant self_part __attribute__((tls_model("initial-exec")));

static pthread_mutex_t bar_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t bar_arrive = PTHREAD_COND_INITIALIZER; /* to the updater */
static pthread_cond_t bar_release;                           /* to the threads */
static participant *parts;
static size_t nparts, nparked;
static uint64_t release_seq;         /* bumped when a barrier ends */
/* The pending barrier is complete and its while_parked step runs without
 * bar_lock (bar_lock).  A program thread that starts meanwhile (its
 * creator is not a program thread: those are all parked) waits in
 * molt__timing_join until the barrier ends, so that the step sees the
 * program-thread registry and every record in it stand still. */
static bool stepping;
/* The pending barrier is a full update (bar_lock): parking program threads
 * snapshot their migrated locals first. */
static bool pending_restart;

/* Read without bar_lock on every molt_update_point: relaxed, because a
 * thread that misses a just-raised flag simply parks at its next point;
 * the barrier state itself is read under bar_lock. */
static _Atomic bool pending;

static _Atomic(void (*)(void *)) pending_cb;
static _Atomic(void *) pending_arg;

static pthread_once_t cond_once = PTHREAD_ONCE_INIT;
static void init_conds(void) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&bar_release, &a);
  pthread_cond_destroy(&bar_arrive);
  pthread_cond_init(&bar_arrive, &a);
  pthread_condattr_destroy(&a);
}

void molt__timing_init(void) { pthread_once(&cond_once, init_conds); }

/* Moves the calling thread's view to the current generation (hazard-pointer
 * protocol as in molt__enter: publish the view, then recheck). */
static void refresh_view(molt__thread *t) {
  for (;;) {
    molt__gen *g = atomic_load_explicit(&molt__current, memory_order_relaxed);
    if (atomic_load_explicit(&t->view, memory_order_relaxed) == g)
      break; /* already our view, hence already pinned */
    /* release: pairs with the reclaimer's acquire read of views. */
    atomic_store_explicit(&t->view, g, memory_order_release);
    /* Compiler barrier; the CPU fence comes from the reclaimer's
     * membarrier(), exactly as for the call counters. */
    atomic_signal_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&molt__current, memory_order_acquire) == g)
      break;
  }
}

void molt_quiesce(void) {
  molt__thread *t = &molt__self;
  if (__builtin_expect(t->viewp == NULL, 0))
    molt__thread_register();
  refresh_view(t);
  /* From now on this thread reads its generation through its view.  Only
   * this thread reads viewp, so a plain store suffices. */
  t->viewp = &t->view;
}

static void unlink_part(participant *p) {
  if (p->prev)
    p->prev->next = p->next;
  else
    parts = p->next;
  if (p->next)
    p->next->prev = p->prev;
  p->next = p->prev = NULL;
  p->linked = false;
  nparts--;
}

void molt__timing_thread_exit(void) {
  participant *p = &self_part;
  if (!p->linked)
    return;
  /* thread.c's key destructor runs before program.c's (its key is older):
   * a program thread that leaves with pthread_exit() (or is cancelled)
   * must stay a participant until program.c has taken its record out of
   * the registry, or a barrier could complete without it and the update
   * step would read and write a record that the exiting thread is about to
   * free (and commit while the thread still runs image code in a later
   * key destructor).  program.c's end_thread calls us again then. */
  if (molt__program_owns_exit())
    return;
  pthread_mutex_lock(&bar_lock);
  unlink_part(p);
  /* The updater may be waiting for exactly this thread. */
  pthread_cond_broadcast(&bar_arrive);
  pthread_mutex_unlock(&bar_lock);
}

/* Links the calling thread into the participant list (once).  Registering
 * it with thread.c first means its exit unlinks it (thread.c's key
 * destructor calls molt__timing_thread_exit). */
static void join_self(void) {
  participant *p = &self_part;
  if (p->linked)
    return;
  molt__timing_init();
  molt__thread *t = &molt__self;
  if (!t->viewp)
    molt__thread_register();
  pthread_mutex_lock(&bar_lock);
  p->tid = molt__gettid();
  p->next = parts;
  p->prev = NULL;
  if (parts)
    parts->prev = p;
  parts = p;
  p->linked = true;
  nparts++;
  /* A barrier may be waiting right now: it now waits for us too, and we
   * will park at our first update point. */
  pthread_mutex_unlock(&bar_lock);
}

void molt__timing_join(void) {
  join_self();
  atomic_store_explicit(&self_part.point, NULL, memory_order_relaxed);
  /* A barrier that is complete counted without us: let its step finish
   * (it reads and writes the program-thread registry, which we are about
   * to enter) before we go on.  Not a cancellation point. */
  int cs;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
  pthread_mutex_lock(&bar_lock);
  while (stepping)
    pthread_cond_wait(&bar_release, &bar_lock);
  pthread_mutex_unlock(&bar_lock);
  pthread_setcancelstate(cs, NULL);
}

void molt__timing_restarted(void) {
  /* The last point was a literal of the old image, which is about to be
   * unloaded: forget it. */
  atomic_store_explicit(&self_part.point, NULL, memory_order_relaxed);
}

int molt_update_point(const char *name) {
  participant *p = &self_part;
  if (__builtin_expect(!p->linked, 0))
    join_self();
  molt__pthread *me = molt__pthread_self;
  /* A restarted program thread has reached its first update point in the
   * new version: it is no longer updating (F7 counts these).  relaxed:
   * only this thread clears the flag; the runtime set it while we were
   * parked, and bar_lock ordered that write before our wake-up. */
  if (__builtin_expect(me != NULL, 0) &&
      atomic_load_explicit(&me->updating, memory_order_relaxed))
    molt__program_first_point(me);
  atomic_store_explicit(&p->point, name, memory_order_relaxed);
  if (!atomic_load_explicit(&pending, memory_order_relaxed)) {
    if (molt__self.viewp == &molt__self.view)
      refresh_view(&molt__self);
    return 0;
  }
  /* Taken here, where the caller's frame is the image function that
   * called us: the start of the frame-pointer chain for migrated locals.
   * (Using it also makes this function keep a frame pointer.) */
  void *frame = __builtin_frame_address(0);
  /* Not a cancellation point: pthread_cond_wait is one, and a thread
   * cancelled in it would unwind holding bar_lock, counted as parked, and
   * its exit (molt__timing_thread_exit) would then block on bar_lock for
   * ever, and every barrier with it.  A pending cancellation is acted on
   * at the thread's next cancellation point instead. */
  int cs;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
  pthread_mutex_lock(&bar_lock);
  molt__verdict verdict = MOLT__VERDICT_NONE;
  if (atomic_load_explicit(&pending, memory_order_relaxed)) {
    if (pending_restart && me)
      molt__program_park(me, frame, name); /* own record only, no prog_lock */
    uint64_t seq = release_seq;
    p->parked = true;
    nparked++;
    pthread_cond_broadcast(&bar_arrive);
    while (release_seq == seq)
      pthread_cond_wait(&bar_release, &bar_lock);
    /* The releaser already counted us out (p->parked, nparked), so a next
     * barrier that starts before we wake up does not take us for parked. */
    /* Read under bar_lock: the releaser wrote it under the same lock
     * before bumping release_seq; it is ours alone, so a later barrier
     * that ended before we woke up cannot have overwritten it. */
    verdict = p->verdict;
  }
  pthread_mutex_unlock(&bar_lock);
  pthread_setcancelstate(cs, NULL);
  if (verdict == MOLT__VERDICT_RESTART && me)
    molt__program_restart_self(me); /* does not return if restarted */
  if (molt__self.viewp == &molt__self.view)
    refresh_view(&molt__self);
  return verdict != MOLT__VERDICT_NONE;
}

void molt_on_update_pending(void (*cb)(void *), void *arg) {
  /* arg first, then cb with release: a caller that sees the new cb with
   * acquire also sees its argument. */
  atomic_store_explicit(&pending_arg, arg, memory_order_relaxed);
  atomic_store_explicit(&pending_cb, cb, memory_order_release);
}

static void describe_missing(char *err, size_t errlen, int timeout_ms, bool full) {
  size_t used = 0;
  int n = snprintf(err, errlen, "%s timed out after %d ms; threads that did not "
                   "reach an update point:", full ? "update" : "global update", timeout_ms);
  used = n > 0 ? (size_t)n : 0;
  for (participant *q = parts; q && used + 1 < errlen; q = q->next) {
    if (q->parked)
      continue;
    char name[32] = "";
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/comm", (int)q->tid);
    FILE *f = fopen(path, "re");
    if (f) {
      if (fgets(name, sizeof name, f))
        name[strcspn(name, "\n")] = '\0';
      fclose(f);
    }
    const char *point = atomic_load_explicit(&q->point, memory_order_relaxed);
    n = snprintf(err + used, errlen - used, " %d (%s, last point %s%s%s)", (int)q->tid,
                 name[0] ? name : "?", point ? "\"" : "", point ? point : "(none)",
                 point ? "\"" : "");
    if (n < 0)
      break;
    used += (size_t)n;
  }
  if (used + 1 < errlen)
    snprintf(err + used, errlen - used, "; nothing was changed");
}

int molt__timing_barrier(int timeout_ms,
                         int (*while_parked)(void *arg, char *err, size_t errlen),
                         void *arg, molt__verdict on_success, char *err,
                         size_t errlen) {
  molt__timing_init();
  if (timeout_ms < 0)
    timeout_ms = MOLT__DEFAULT_TIMEOUT_MS;
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += timeout_ms / 1000;
  deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  bool full = on_success == MOLT__VERDICT_RESTART;
  pthread_mutex_lock(&bar_lock);
  pending_restart = full;
  atomic_store_explicit(&pending, true, memory_order_relaxed);
  pthread_mutex_unlock(&bar_lock);
  void (*cb)(void *) = atomic_load_explicit(&pending_cb, memory_order_acquire);
  if (cb)
    cb(atomic_load_explicit(&pending_arg, memory_order_relaxed));

  pthread_mutex_lock(&bar_lock);
  int rc = 0;
  while (nparked < nparts) {
    int w = pthread_cond_timedwait(&bar_arrive, &bar_lock, &deadline);
    if (w == ETIMEDOUT && nparked < nparts) {
      rc = MOLT_ETIMEDOUT;
      break;
    }
  }
  if (rc == 0) {
    /* Every participant is parked and stays parked until release_seq
     * changes, which only we do.  Acquiring bar_lock after each of them
     * released it (in pthread_cond_wait) makes everything they wrote
     * before parking visible to the step; our release of bar_lock below
     * makes everything the step writes visible to them when they wake. */
    stepping = true;
    pthread_mutex_unlock(&bar_lock);
    rc = while_parked ? while_parked(arg, err, errlen) : 0;
    pthread_mutex_lock(&bar_lock);
    stepping = false; /* joiners waiting for it wake on bar_release below */
  } else {
    describe_missing(err, errlen, timeout_ms, full);
  }
  atomic_store_explicit(&pending, false, memory_order_relaxed);
  pending_restart = false;
  molt__verdict verdict = rc == 0 ? on_success : MOLT__VERDICT_NONE;
  /* Count every parked thread out now, not when it wakes: otherwise a
   * barrier started right after this one could see a thread that is still
   * waking up (and about to run) as parked.  Each gets its verdict now for
   * the same reason. */
  for (participant *q = parts; q; q = q->next) {
    if (q->parked)
      q->verdict = verdict;
    q->parked = false;
  }
  nparked = 0;
  release_seq++;
  pthread_cond_broadcast(&bar_release);
  pthread_mutex_unlock(&bar_lock);
  return rc;
}

/* The hot-patch step: publish g while every participant is parked. */
static int publish_parked(void *arg, char *err, size_t errlen) {
  /* None of the participants runs updatable code, so switching all of
   * them (and everyone else) now cannot mix generations. */
  molt__rt_lock_acquire();
  int rc = molt__gen_publish_checked(arg);
  molt__rt_lock_release();
  /* Parked participants move their own views when released; threads that
   * only use molt_quiesce move at their next quiescence point. */
  if (rc < 0)
    molt__errmsg(err, errlen, "%s", molt_strerror(rc));
  return rc;
}

int molt__timing_switch(molt__gen *g, molt_policy_t policy, int timeout_ms,
                        char *err, size_t errlen) {
  if (policy != MOLT_POLICY_GLOBAL) {
    molt__rt_lock_acquire();
    int rc = molt__gen_publish_checked(g);
    /* immediate: threads that switch at quiescence points switch now too
     * (every call that starts after the apply returns runs g, H2). */
    if (rc == 0 && policy == MOLT_POLICY_IMMEDIATE)
      molt__threads_set_views(g);
    molt__rt_lock_release();
    return rc;
  }
  return molt__timing_barrier(timeout_ms, publish_parked, g, MOLT__VERDICT_UPDATED, err,
                              errlen);
}

/* After fork only the forking thread exists. */
void molt__timing_after_fork_child(void) {
  participant *self = self_part.linked ? &self_part : NULL;
  parts = NULL;
  nparts = nparked = 0;
  if (self) {
    self->next = self->prev = NULL;
    self->parked = false;
    self->tid = molt__gettid();
    parts = self;
    nparts = 1;
  }
  pthread_mutex_init(&bar_lock, NULL);
  /* The condition variables too: a parent thread may have been inside
   * pthread_cond_wait (just released, not yet out) at fork(), and glibc's
   * broadcast waits for such waiters to leave, which in the child they
   * never do.  Initialized over, never destroyed (destroy would wait for
   * them as well).  No thread of the child waits on them yet. */
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&bar_release, &a);
  pthread_cond_init(&bar_arrive, &a);
  pthread_condattr_destroy(&a);
  atomic_store(&pending, false);
  pending_restart = false;
  stepping = false;
}

/* For program.c at the commit of a full update (every participant parked,
 * bar_lock not held): forgets the molt_on_update_pending callback if it is
 * still `cb` (a function of the image about to be retired, which a later
 * update must not call once that image is unloaded).  The compare-exchange
 * keeps a callback registered meanwhile by some other thread.  release:
 * as in molt_on_update_pending (the next barrier loads it with acquire). */
void molt__timing_forget_pending_cb(void (*cb)(void *)) {
  void (*expected)(void *) = cb;
  atomic_compare_exchange_strong_explicit(&pending_cb, &expected, NULL, memory_order_release,
                                          memory_order_relaxed);
}

/* The callback now registered (program.c, for the check above).  acquire:
 * pairs with the release store of molt_on_update_pending. */
void (*molt__timing_pending_cb(void))(void *) {
  return atomic_load_explicit(&pending_cb, memory_order_acquire);
}

/* For status: every participant, parked or not. */
void molt__timing_foreach(void (*fn)(void *arg, pid_t tid, const char *point, bool parked),
                          void *arg) {
  pthread_mutex_lock(&bar_lock);
  for (participant *q = parts; q; q = q->next)
    fn(arg, q->tid, atomic_load_explicit(&q->point, memory_order_relaxed), q->parked);
  pthread_mutex_unlock(&bar_lock);
}
