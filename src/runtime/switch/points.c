/* When threads switch: local quiescence points (WFPATCH) and global update
 * points (Kitsune-style barrier), and how a new generation reaches the
 * threads under each policy.
 *
 * Local policy without a kernel extension: a participating thread reads its
 * generation through its own `view` pointer (molt__thread.viewp == &view),
 * which only it moves, at molt_quiesce().  The view is also the thread's
 * hazard pointer: the reclaimer never frees a generation some view names.
 *
 * The barrier (molt__barrier) serves both the hot-patch `global` policy
 * and full updates.  It raises the pending flag, waits until every
 * participant waits in molt_update_point(), runs the caller's
 * `while_parked` step while they wait, and releases them with a verdict:
 *   none     timeout or failure: molt_update_point() returns 0
 *   updated  a new generation was switched in: it returns 1
 *   restart  a full update committed: the full mode's on_release hook
 *            restarts a program thread instead of returning; any other
 *            participant returns 1.
 *
 * Participants: a thread becomes one at its first molt_update_point(), or
 * from its first instruction if it is a program thread (molt__point_join,
 * called by the full mode's pthread wrapper and driver), so that a program
 * thread that never reaches an update point is named in a timeout error.
 * A participant that waits in molt_apply or molt_rollback for the runtime
 * thread (molt__point_wait_begin/end) runs no program code meanwhile: it
 * counts as arrived for a hot-patch barrier.
 *
 * Modes take part through their hooks (switch.h): on_park when a
 * participant parks, on_release when it is released, owns_exit when it
 * exits, and molt__point_call_next for "at the thread's next update point".
 *
 * Lock: bar_lock protects the participant list and the barrier state (its
 * place in the order: base.h).  It is taken by application threads in
 * molt_update_point (slow path only) and by the updating thread inside
 * op_lock.  `while_parked` runs WITHOUT bar_lock: the participants stay
 * parked because release_seq does not change, and the step may
 * dlopen/dlclose (image destructors must not find bar_lock held).  A mode's
 * on_park runs under bar_lock and touches only the parking thread's own
 * state. */
#include "switch/switch.h"

#include <errno.h>
#include <inttypes.h>
#include <semaphore.h>
#include <stdio.h>
#include <string.h>

typedef struct participant {
  pid_t tid;
  /* Last update point reached (a literal); NULL: none yet.  Written by the
   * thread without bar_lock, read by the updater for its error message:
   * relaxed atomic (a stale value only makes a message stale). */
  _Atomic(const char *) point;
  bool parked;  /* waiting in molt_update_point (bar_lock) */
  bool waiting; /* waiting for a request of its own, or in fork() (bar_lock) */
  bool forking; /* in the fork handlers (bar_lock) */
  bool linked;
  /* How the barrier it was parked in ended (bar_lock): written by the
   * releaser when it counts the thread out, read by the thread when it
   * wakes.  Per participant, not global: a thread that wakes late, after a
   * LATER barrier has ended too, must still see the verdict of its own. */
  molt__verdict verdict;
  /* A barrier that counted it while it waited switched a generation in
   * (bar_lock): it moves its view when the wait ends. */
  bool waited_through_update;
  /* Runs at the thread's next update point; only the thread touches it. */
  void (*at_next_point)(void);
  /* Posted by the end of a barrier when the thread is parked or joining
   * (bar_lock held by the poster); the thread waits on it without
   * bar_lock.  Its own semaphore, not a condition variable shared by all:
   * see release_seq. */
  sem_t wake;
  bool wake_ready; /* wake initialized (only the thread itself) */
  bool joining;    /* in molt__point_join, waiting for a step to end (bar_lock) */
  molt__link link;
} participant;

static __thread participant self_part __attribute__((tls_model("initial-exec")));

static molt__lock bar_lock = MOLT__LOCK_INIT(bar);
static pthread_cond_t bar_arrive = PTHREAD_COND_INITIALIZER; /* to the updater */
static molt__link *parts;
static size_t nparts, nparked, nwaiting;
/* Participants in fork()'s handlers (bar_lock): each waits for op_lock,
 * which a barrier holds throughout, so none of them can reach an update
 * point before the barrier ends (molt__point_fork_begin). */
static size_t nforking;
/* Bumped when a barrier ends (bar_lock).  Parked threads and joiners wait
 * for it to change on their own semaphore (participant.wake), which the
 * barrier's end posts: the end must never wait for them.  With one
 * condition variable for all, it could: glibc 2.36's
 * pthread_cond_broadcast waits until a thread woken by an EARLIER
 * broadcast has left pthread_cond_wait (its group switch), so a
 * participant that one barrier released and a debugger or ptrace then
 * stopped before it ran held the next barrier's end -- and the runtime
 * thread, holding bar_lock -- until it was let go (found by
 * examples/fullreal/failures.py, about 1 run in 50).  sem_post never
 * waits.  Not a raw futex: ThreadSanitizer knows sem_wait as a blocking
 * call and runs a signal arriving meanwhile inside it, as it did inside
 * pthread_cond_wait, not later inside the bar_lock acquisition that
 * follows (a handler that blocks would then hold bar_lock). */
static uint64_t release_seq;
/* The pending barrier is complete and its while_parked step runs without
 * bar_lock (bar_lock).  A program thread that starts meanwhile (its
 * creator is not a program thread: those are all parked) waits in
 * molt__point_join until the barrier ends, so that the step sees the
 * program-thread registry and every record in it stand still. */
static bool stepping;
/* What the pending barrier releases its participants with on success
 * (bar_lock): modes' on_park hooks act on it (a full update makes program
 * threads snapshot their migrated locals). */
static molt__verdict pending_verdict;

/* Read without bar_lock on every molt_update_point: relaxed, because a
 * thread that misses a just-raised flag simply parks at its next point;
 * the barrier state itself is read under bar_lock. */
static _Atomic bool pending;

static _Atomic(void (*)(void *)) pending_cb;

/* How often a barrier wakes blocked threads again (waits.c). */
#define WAKE_AGAIN_MS 20
static _Atomic(void *) pending_arg;

static participant *part_of(molt__link *l) {
  return MOLT__CONTAINER(l, participant, link);
}

/* Participants that count as arrived (bar_lock): parked at an update point,
 * or waiting for a request -- except for a full update, whose participants
 * restart from a real update point. */
static size_t arrived(void) {
  return nparked + (pending_verdict == MOLT__VERDICT_RESTART ? 0 : nwaiting);
}

static bool counts_arrived(const participant *q) {
  return q->parked || (q->waiting && pending_verdict != MOLT__VERDICT_RESTART);
}

static pthread_once_t cond_once = PTHREAD_ONCE_INIT;
static void init_conds(void) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_destroy(&bar_arrive);
  pthread_cond_init(&bar_arrive, &a);
  pthread_condattr_destroy(&a);
}

static void on_thread_exit(void);

/* bar_lock held (released while waiting, held again on return): waits
 * for the end of a barrier to post p->wake, or a signal, or a post left
 * over from an earlier wait -- callers re-check in a loop.  sem_wait is a
 * cancellation point: callers disable cancellation. */
static void wait_release_locked(participant *p) {
  molt__lock_release(&bar_lock);
  (void)sem_wait(&p->wake); /* EINTR: the caller re-checks */
  molt__lock_acquire(&bar_lock);
}

/* The condition variables wait on CLOCK_MONOTONIC.  Also run by the first
 * participant or barrier, should one come before the runtime's start-up. */
static void init_once(void) { pthread_once(&cond_once, init_conds); }

void molt__switch_init(void) {
  init_once();
  molt__threads_on_exit(on_thread_exit);
}

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

/* A quiescence or update point answers an open proof round like a
 * dispatched call (core/proof.c): a thread that calls no updatable
 * function but passes its points is proved out here. */
static void answer_proof(molt__thread *t) {
  if (__builtin_expect(t->proof_round !=
                           atomic_load_explicit(&molt__proof_round, memory_order_relaxed),
                       0))
    molt__thread_prove();
}

void molt_quiesce(void) {
  molt__thread *t = &molt__self;
  if (__builtin_expect(t->viewp == NULL, 0))
    molt__thread_register();
  answer_proof(t);
  refresh_view(t);
  /* From now on this thread reads its generation through its view.  Only
   * this thread reads viewp, so a plain store suffices. */
  t->viewp = &t->view;
}

static void leave_locked(participant *p) {
  molt__list_unlink(&parts, &p->link);
  p->linked = false;
  nparts--;
  /* The updater may be waiting for exactly this thread. */
  pthread_cond_broadcast(&bar_arrive);
}

void molt__point_leave(void) {
  participant *p = &self_part;
  if (!p->linked)
    return;
  molt__lock_acquire(&bar_lock);
  if (p->linked)
    leave_locked(p);
  molt__lock_release(&bar_lock);
}

/* The thread registry's exit hook.  A mode may take the thread's exit over
 * (the full mode does for program threads: such a thread must stay a
 * participant until the mode has taken its record out of its own registry,
 * or a barrier could complete without it and the update step would read
 * and write a record that the exiting thread is about to free); it then
 * calls molt__point_leave itself. */
static void on_thread_exit(void) {
  if (!self_part.linked || molt__modes_own_exit())
    return;
  molt__point_leave();
}

/* Links the calling thread into the participant list (once).  Registering
 * it with the thread registry first means its exit unlinks it (the
 * registry's exit hook). */
static void join_self(void) {
  participant *p = &self_part;
  if (p->linked)
    return;
  init_once();
  molt__thread *t = &molt__self;
  if (!t->viewp)
    molt__thread_register();
  if (!p->wake_ready) {
    sem_init(&p->wake, 0, 0);
    p->wake_ready = true;
  }
  molt__lock_acquire(&bar_lock);
  p->tid = molt__gettid();
  molt__list_push(&parts, &p->link);
  p->linked = true;
  nparts++;
  /* A barrier may be waiting right now: it now waits for us too, and we
   * will park at our first update point. */
  molt__lock_release(&bar_lock);
}

void molt__point_join(void) {
  join_self();
  atomic_store_explicit(&self_part.point, NULL, memory_order_relaxed);
  /* A barrier that is complete counted without us: let its step finish
   * (it reads and writes the program-thread registry, which we are about
   * to enter) before we go on.  Not a cancellation point. */
  int cs;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
  molt__lock_acquire(&bar_lock);
  self_part.joining = true; /* the barrier's end posts us */
  while (stepping)
    wait_release_locked(&self_part);
  self_part.joining = false;
  molt__lock_release(&bar_lock);
  pthread_setcancelstate(cs, NULL);
}

void molt__point_restarted(void) {
  /* The last point was a literal of the old image, which is about to be
   * unloaded: forget it. */
  atomic_store_explicit(&self_part.point, NULL, memory_order_relaxed);
}

void molt__point_call_next(void (*fn)(void)) { self_part.at_next_point = fn; }

/* Parks the calling participant until the pending barrier ends (bar_lock
 * held; cancellation disabled by the caller).  Returns its verdict. */
static molt__verdict park_locked(participant *p) {
  uint64_t seq = release_seq;
  p->parked = true;
  nparked++;
  pthread_cond_broadcast(&bar_arrive);
  while (release_seq == seq)
    wait_release_locked(p);
  /* The releaser already counted us out (p->parked, nparked), so a next
   * barrier that starts before we wake up does not take us for parked.
   * Read under bar_lock: the releaser wrote it under the same lock before
   * bumping release_seq; it is ours alone, so a later barrier that ended
   * before we woke up cannot have overwritten it. */
  return p->verdict;
}

int molt_update_point(const char *name) {
  participant *p = &self_part;
  if (__builtin_expect(!p->linked, 0))
    join_self();
  /* A mode asked for this thread's next update point (the full mode: a
   * restarted thread's first point in its new version, F7). */
  if (__builtin_expect(p->at_next_point != NULL, 0)) {
    void (*fn)(void) = p->at_next_point;
    p->at_next_point = NULL;
    fn();
  }
  atomic_store_explicit(&p->point, name, memory_order_relaxed);
  if (molt__self.viewp)
    answer_proof(&molt__self);
  if (!atomic_load_explicit(&pending, memory_order_relaxed)) {
    if (molt__self.viewp == &molt__self.view)
      refresh_view(&molt__self);
    return 0;
  }
  /* Taken here, where the caller's frame is the function that called us:
   * the start of the frame-pointer chain for migrated locals.  (Using it
   * also makes this function keep a frame pointer.) */
  void *frame = __builtin_frame_address(0);
  /* Not a cancellation point: pthread_cond_wait is one, and a thread
   * cancelled in it would unwind holding bar_lock, counted as parked, and
   * its exit would then block on bar_lock for ever, and every barrier with
   * it.  A pending cancellation is acted on at the thread's next
   * cancellation point instead. */
  int cs;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
  molt__lock_acquire(&bar_lock);
  molt__verdict verdict = MOLT__VERDICT_NONE;
  if (atomic_load_explicit(&pending, memory_order_relaxed)) {
    molt__modes_on_park(frame, name, pending_verdict);
    verdict = park_locked(p);
  }
  molt__lock_release(&bar_lock);
  pthread_setcancelstate(cs, NULL);
  if (verdict != MOLT__VERDICT_NONE)
    molt__modes_on_release(verdict); /* a restart does not return */
  if (molt__self.viewp == &molt__self.view)
    refresh_view(&molt__self);
  return verdict != MOLT__VERDICT_NONE;
}

void molt__point_wait_begin(void) {
  participant *p = &self_part;
  if (!p->linked)
    return;
  molt__lock_acquire(&bar_lock);
  p->waiting = true;
  p->waited_through_update = false;
  nwaiting++;
  /* A barrier may be waiting for this thread right now. */
  pthread_cond_broadcast(&bar_arrive);
  molt__lock_release(&bar_lock);
}

void molt__point_wait_end(void) {
  participant *p = &self_part;
  if (!p->linked || !p->waiting)
    return;
  int cs;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
  molt__lock_acquire(&bar_lock);
  p->waiting = false;
  nwaiting--;
  bool moved = p->waited_through_update;
  /* Going back to program code passes an update point: a barrier pending
   * now (one that counted us as waiting, or that started after our request
   * was answered) must not see us run until it ends.  Its verdict does not
   * matter here (the caller returns its own request's result); a full
   * update would not have counted us and restarts nothing of ours. */
  if (atomic_load_explicit(&pending, memory_order_relaxed) &&
      pending_verdict != MOLT__VERDICT_RESTART)
    moved |= park_locked(p) == MOLT__VERDICT_UPDATED;
  molt__lock_release(&bar_lock);
  pthread_setcancelstate(cs, NULL);
  /* Like a participant released from a barrier that switched. */
  if (moved && molt__self.viewp == &molt__self.view)
    refresh_view(&molt__self);
}

void molt__point_fork_begin(void) {
  participant *p = &self_part;
  if (!p->linked)
    return;
  /* Counted as waiting, like a thread waiting for its own request: it runs
   * no program code until fork() returns, and when it returns it passes
   * an update point (molt__point_fork_end).  A hot-patch barrier that holds
   * op_lock -- which the fork handler is about to wait for -- can then
   * complete without it instead of waiting for it until its timeout. */
  molt__lock_acquire(&bar_lock);
  p->forking = true;
  nforking++;
  p->waiting = true;
  p->waited_through_update = false;
  nwaiting++;
  pthread_cond_broadcast(&bar_arrive);
  molt__lock_release(&bar_lock);
}

void molt__point_fork_end(void) {
  participant *p = &self_part;
  if (!p->linked || !p->forking)
    return;
  molt__lock_acquire(&bar_lock);
  p->forking = false;
  nforking--;
  molt__lock_release(&bar_lock);
  molt__point_wait_end();
}

void molt__switch_fork_prepare(void) { molt__lock_acquire(&bar_lock); }
void molt__switch_fork_parent(void) { molt__lock_release(&bar_lock); }

void molt__point_lock(void) { molt__lock_acquire(&bar_lock); }
void molt__point_unlock(void) { molt__lock_release(&bar_lock); }
bool molt__point_pending(void) {
  return atomic_load_explicit(&pending, memory_order_relaxed);
}

void molt_on_update_pending(void (*cb)(void *), void *arg) {
  /* arg first, then cb with release: a caller that sees the new cb with
   * acquire also sees its argument. */
  atomic_store_explicit(&pending_arg, arg, memory_order_relaxed);
  atomic_store_explicit(&pending_cb, cb, memory_order_release);
}

static void describe_missing(char *err, size_t errlen, int timeout_ms, bool full) {
  size_t used = 0;
  int n = snprintf(err, errlen,
                   "%s timed out after %d ms; threads that did not "
                   "reach an update point:",
                   full ? "update" : "global update", timeout_ms);
  used = n > 0 ? (size_t)n : 0;
  for (molt__link *l = parts; l && used + 1 < errlen; l = l->next) {
    participant *q = part_of(l);
    if (counts_arrived(q))
      continue;
    char name[32], where[384];
    molt__proc_name(0, q->tid, name, sizeof name);
    /* The kernel's name is inherited from the creator unless the program
     * names its threads: the mode says what the thread runs and where it
     * is. */
    molt__modes_describe_thread(q->tid, where, sizeof where);
    const char *point = atomic_load_explicit(&q->point, memory_order_relaxed);
    n = snprintf(err + used, errlen - used, " %d (%s%s%s, last point %s%s%s)",
                 (int)q->tid, name[0] ? name : "?", where[0] ? ", " : "", where,
                 point ? "\"" : "", point ? point : "(none)", point ? "\"" : "");
    if (n < 0)
      break;
    used += (size_t)n;
  }
  if (used + 1 < errlen)
    snprintf(err + used, errlen - used, "; nothing was changed");
}

static void describe_forking(char *err, size_t errlen) {
  for (molt__link *l = parts; l; l = l->next) {
    participant *q = part_of(l);
    if (!q->forking)
      continue;
    char name[32];
    molt__proc_name(0, q->tid, name, sizeof name);
    molt__errmsg(err, errlen,
                 "update refused: program thread %d (%s) is in fork(), which waits "
                 "for the update to end; nothing was changed; try again",
                 (int)q->tid, name[0] ? name : "?");
    return;
  }
}

int molt__barrier(int timeout_ms,
                  int (*while_parked)(void *arg, char *err, size_t errlen), void *arg,
                  molt__verdict on_success, char *err, size_t errlen) {
  init_once();
  if (timeout_ms < 0)
    timeout_ms = MOLT__DEFAULT_TIMEOUT_MS;
  struct timespec deadline = molt__monotonic_after_ms(timeout_ms);
  bool full = on_success == MOLT__VERDICT_RESTART;
  molt__lock_acquire(&bar_lock);
  pending_verdict = on_success;
  atomic_store_explicit(&pending, true, memory_order_relaxed);
  molt__lock_release(&bar_lock);
  void (*cb)(void *) = atomic_load_explicit(&pending_cb, memory_order_acquire);
  if (cb)
    cb(atomic_load_explicit(&pending_arg, memory_order_relaxed));

  molt__lock_acquire(&bar_lock);
  /* Threads blocked in molt_update_fd loops, molt_usleep, molt_cond_wait
   * (waits.c); a wake-up may be lost, so they are woken again every
   * WAKE_AGAIN_MS while some participant is missing. */
  molt__waits_wake();
  int rc = 0;
  while (arrived() < nparts) {
    if (full && nforking > 0) {
      /* A program thread in fork() waits for op_lock, which we hold, and
       * cannot restart from there: it will not arrive.  Give up now, not
       * at the timeout; its fork() then goes on. */
      rc = MOLT_EBUSY;
      describe_forking(err, errlen);
      break;
    }
    struct timespec until = molt__monotonic_after_ms(WAKE_AGAIN_MS);
    if (until.tv_sec > deadline.tv_sec ||
        (until.tv_sec == deadline.tv_sec && until.tv_nsec > deadline.tv_nsec))
      until = deadline;
    int w = molt__lock_timedwait(&bar_arrive, &bar_lock, &until);
    if (w == ETIMEDOUT && arrived() < nparts) {
      struct timespec now = molt__monotonic_after_ms(0);
      if (now.tv_sec > deadline.tv_sec ||
          (now.tv_sec == deadline.tv_sec && now.tv_nsec >= deadline.tv_nsec)) {
        rc = MOLT_ETIMEDOUT;
        break;
      }
      molt__waits_wake();
    }
  }
  if (rc == 0) {
    /* Every participant is parked or waiting for a request, and stays so
     * until release_seq changes, which only we do (a waiting thread whose
     * wait ends parks, molt__point_wait_end).  Acquiring bar_lock after
     * each of them released it (in pthread_cond_wait) makes everything
     * they wrote before parking visible to the step; our release of
     * bar_lock below makes everything the step writes visible to them when
     * they wake. */
    stepping = true;
    molt__lock_release(&bar_lock);
    rc = while_parked ? while_parked(arg, err, errlen) : 0;
    molt__lock_acquire(&bar_lock);
    stepping = false; /* joiners waiting for it are posted with the parked, below */
  } else if (rc == MOLT_ETIMEDOUT) {
    describe_missing(err, errlen, timeout_ms, full);
  }
  molt__verdict verdict = rc == 0 ? on_success : MOLT__VERDICT_NONE;
  /* Count every parked thread out now, not when it wakes: otherwise a
   * barrier started right after this one could see a thread that is still
   * waking up (and about to run) as parked.  Each gets its verdict now for
   * the same reason. */
  release_seq++;
  for (molt__link *l = parts; l; l = l->next) {
    participant *q = part_of(l);
    if (q->parked)
      q->verdict = verdict;
    else if (q->waiting && !full && verdict == MOLT__VERDICT_UPDATED)
      q->waited_through_update = true;
    /* Under bar_lock: an exiting participant unlinks itself under it, so
     * q->wake is alive here.  A post to a thread that is not waiting yet
     * is found by its sem_wait. */
    if (q->parked || q->joining)
      sem_post(&q->wake);
    q->parked = false;
  }
  atomic_store_explicit(&pending, false, memory_order_relaxed);
  molt__waits_end(); /* the update descriptor is not readable any more */
  pending_verdict = MOLT__VERDICT_NONE;
  nparked = 0;
  molt__lock_release(&bar_lock);
  return rc;
}

/* The hot-patch step: publish g while every participant is parked. */
static int publish_parked(void *arg, char *err, size_t errlen) {
  /* None of the participants runs updatable code, so switching all of
   * them (and everyone else) now cannot mix generations. */
  molt__rt_lock_acquire();
  int rc = molt__gen_publish(arg);
  molt__rt_lock_release();
  /* Parked participants move their own views when released; threads that
   * only use molt_quiesce move at their next quiescence point. */
  if (rc < 0)
    molt__errmsg(err, errlen, "%s", molt_strerror(rc));
  return rc;
}

int molt__switch_publish(molt__gen *g, molt_policy_t policy, int timeout_ms, char *err,
                         size_t errlen) {
  if (policy != MOLT_POLICY_GLOBAL) {
    molt__rt_lock_acquire();
    int rc = molt__gen_publish(g);
    /* immediate: threads that switch at quiescence points switch now too
     * (every call that starts after the apply returns runs g, H2). */
    if (rc == 0 && policy == MOLT_POLICY_IMMEDIATE)
      molt__threads_set_views(g);
    molt__rt_lock_release();
    if (rc < 0)
      molt__errmsg(err, errlen, "%s", molt_strerror(rc));
    return rc;
  }
  return molt__barrier(timeout_ms, publish_parked, g, MOLT__VERDICT_UPDATED, err, errlen);
}

/* After fork only the forking thread exists. */
void molt__switch_after_fork_child(void) {
  participant *self = self_part.linked ? &self_part : NULL;
  parts = NULL;
  nparts = nparked = nwaiting = 0;
  nforking = 0;
  if (self) {
    self->parked = self->waiting = self->forking = self->joining = false;
    /* The parent's posts are not ours to consume. */
    sem_init(&self->wake, 0, 0);
    self->tid = molt__gettid();
    molt__list_push(&parts, &self->link);
    nparts = 1;
  }
  molt__lock_reinit(&bar_lock);
  /* The condition variable too: a parent thread may have been inside
   * pthread_cond_wait (just released, not yet out) at fork(), and glibc's
   * broadcast waits for such waiters to leave, which in the child they
   * never do (the participants' semaphores have no such state).  Initialized over,
   * never destroyed (destroy would wait for them as well).  No thread of
   * the child waits on it yet. */
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&bar_arrive, &a);
  pthread_condattr_destroy(&a);
  atomic_store(&pending, false);
  pending_verdict = MOLT__VERDICT_NONE;
  stepping = false;
  molt__waits_after_fork_child();
}

/* For the full mode at the commit of a full update (every participant
 * parked, bar_lock not held): forgets the molt_on_update_pending callback
 * if it is still `cb` (a function of the image about to be retired, which a
 * later update must not call once that image is unloaded).  The
 * compare-exchange keeps a callback registered meanwhile by some other
 * thread.  release: as in molt_on_update_pending (the next barrier loads it
 * with acquire). */
void molt__pending_cb_forget(void (*cb)(void *)) {
  void (*expected)(void *) = cb;
  atomic_compare_exchange_strong_explicit(&pending_cb, &expected, NULL,
                                          memory_order_release, memory_order_relaxed);
}

/* The callback now registered.  acquire: pairs with the release store of
 * molt_on_update_pending. */
void (*molt__pending_cb(void))(void *) {
  return atomic_load_explicit(&pending_cb, memory_order_acquire);
}
