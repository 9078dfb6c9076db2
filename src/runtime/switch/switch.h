/*
 * switch -- when threads move to a new generation, on core/: local
 * quiescence points (molt_quiesce, WFPATCH), update points and the barrier
 * (molt_update_point, Kitsune), the three policies, and the registry of
 * modes with their hooks.
 *
 *   points.c  participants, molt_quiesce, molt_update_point, the barrier,
 *             molt__switch_publish (immediate, local, global)
 *   waits.c   waking threads that block: the update descriptor, molt_usleep,
 *             molt_cond_wait
 *   modes.c   modes register here and are called only through their hooks
 *
 * A mode (hot/, full/, shadow/) is a layer above this one.
 * Nothing below the modes names a mode: the service layer dispatches an
 * operation to the current mode's handler, and the points call the modes'
 * hooks.
 */
#ifndef MOLT_SWITCH_H
#define MOLT_SWITCH_H

#include "core/core.h"

/* ---- points.c ---------------------------------------------------------------*/

MOLT__HIDDEN void molt__switch_init(void);

/* How the participants leave a barrier. */
typedef enum {
  MOLT__VERDICT_NONE = 0, /* timeout or failure: molt_update_point returns 0 */
  MOLT__VERDICT_UPDATED,  /* a new generation was switched in: it returns 1 */
  MOLT__VERDICT_RESTART   /* a full update committed: program threads restart
                             (a mode's on_release hook does not return), the
                             others return 1 */
} molt__verdict;

/* Makes g current under `policy` (op_lock held, molt__rt_lock not held):
 * immediate: now, for every thread; local: now for threads without a view,
 * at their next quiescence point for the others; global: once every
 * participant waits at an update point, else MOLT_ETIMEDOUT with the
 * missing threads in err and nothing changed (g is not published). */
MOLT__HIDDEN int molt__switch_publish(molt__gen *g, molt_policy_t policy, int timeout_ms,
                                      char *err, size_t errlen);
/* The barrier (op_lock held, molt__rt_lock and bar_lock not held): raises
 * the pending flag, calls the molt_on_update_pending callback, waits until
 * every participant waits at an update point (else MOLT_ETIMEDOUT, missing
 * threads named in err), then runs while_parked(arg) WITHOUT bar_lock while
 * they stay parked, and releases them with on_success if it returned 0,
 * else with MOLT__VERDICT_NONE.  A barrier with on_success RESTART is a
 * full update: its participants must reach a real update point (they
 * restart from there), so a thread waiting in molt_apply does not count as
 * arrived for it.  Returns 0 or the error of the wait or of while_parked;
 * a step that returns a positive value releases them with
 * MOLT__VERDICT_NONE and molt__barrier returns that value (a shadowed
 * update's leader: the step forked the follower, the leader does not
 * switch). */
MOLT__HIDDEN int molt__barrier(int timeout_ms,
                               int (*while_parked)(void *arg, char *err, size_t errlen),
                               void *arg, molt__verdict on_success, char *err,
                               size_t errlen);
/* The calling thread is a barrier participant from now on (last point
 * "(none)"): program threads join from their first instruction.  If a
 * barrier's step is running, waits until it ends. */
MOLT__HIDDEN void molt__point_join(void);
/* The calling thread leaves the barrier (it exits).  For a mode that took
 * the thread's exit over (its owns_exit hook); idempotent. */
MOLT__HIDDEN void molt__point_leave(void);
/* The calling thread restarts in a new image: forget its last point (a
 * literal of the old image). */
MOLT__HIDDEN void molt__point_restarted(void);
/* fn runs once, in the calling thread, at its next molt_update_point. */
MOLT__HIDDEN void molt__point_call_next(void (*fn)(void));
/* The calling thread waits for a request it handed to the runtime thread
 * (molt_apply, molt_rollback): while it waits it runs no program code, so
 * a participant counts as arrived at an update point for a barrier that
 * starts meanwhile (e.g. its own global apply).  wait_end is like passing
 * an update point: a barrier pending then holds it until it ends.  No-ops
 * for a thread that is no participant. */
MOLT__HIDDEN void molt__point_wait_begin(void);
MOLT__HIDDEN void molt__point_wait_end(void);
/* The molt_on_update_pending callback, and forgetting it if it is still cb
 * (a full update clears a callback that lives in the image it unloads). */
MOLT__HIDDEN void (*molt__pending_cb(void))(void *);
MOLT__HIDDEN void molt__pending_cb_forget(void (*cb)(void *));
/* The fork handlers (service/runtime.c).  fork_begin, first of all: a
 * participant counts as waiting (arrived) for a hot-patch barrier while it
 * is in fork(), and a full update gives up at once instead of waiting for
 * it; fork_end, in the parent, last of all: like passing an update point.
 * switch_fork_prepare/parent hold bar_lock across fork(). */
MOLT__HIDDEN void molt__point_fork_begin(void);
MOLT__HIDDEN void molt__point_fork_end(void);
MOLT__HIDDEN void molt__switch_fork_prepare(void);
MOLT__HIDDEN void molt__switch_fork_parent(void);
MOLT__HIDDEN void molt__switch_after_fork_child(void);

/* bar_lock, for waits.c's list of condition waits; and the pending flag
 * (relaxed: under bar_lock, or with a mutex the waker takes, as waits.c
 * explains). */
MOLT__HIDDEN void molt__point_lock(void);
MOLT__HIDDEN void molt__point_unlock(void);
MOLT__HIDDEN bool molt__point_pending(void);

/* ---- waits.c ----------------------------------------------------------------*/

/* Wakes threads blocked where molt.h's waits can reach them (the pending
 * flag raised, bar_lock held): makes the update descriptor readable and
 * broadcasts every molt_cond_wait's condition variable.  A wake-up may be
 * lost (the barrier calls it again every 20 ms while it waits). */
MOLT__HIDDEN void molt__waits_wake(void);
/* The barrier ends (bar_lock held): the descriptor is drained. */
MOLT__HIDDEN void molt__waits_end(void);
/* The child of fork(): no thread of it waits in molt_cond_wait. */
MOLT__HIDDEN void molt__waits_after_fork_child(void);

/* ---- modes.c ------------------------------------------------------------------*/

typedef int (*molt__op_handler)(const molt__request *req, molt__buf *out, char *err,
                                size_t errlen);

/*
 * A mode: one way of updating a process.  It registers once, from a
 * constructor of libmolt (priority 101, before the runtime starts), and is
 * then reached only through this table.  Every hook is optional.
 */
typedef struct molt__mode {
  const char *name; /* "hot", "full", "shadow" */
  unsigned bit;     /* MOLT__MODE_* (protocol.h) */
  bool initial;     /* the mode of a process that has not entered another */
  /* MOLT__MODE_* bits of the modes this one works on top of: its ops are
   * carried out while the process is in one of them (the shadow mode, on
   * a process running a program image).  0: only while it is current. */
  unsigned within;
  /* Its operations (runtime thread, op_lock held, after a reclamation pass):
   * the request's result records into out, or MOLT_E* with a one-line err.
   * A handler logs its own outcome. */
  molt__op_handler ops[MOLT__OP_END];
  /* Why operation op, which this mode does not carry out, is refused while
   * the process is in this mode: its code and a one-line message. */
  int (*refuse)(const molt__op_info *op, char *err, size_t errlen);
  /* A participant parks at an update point for a barrier that ends with
   * `pending` on success (bar_lock held, on the parking thread, which
   * touches only its own state).  frame: its caller's frame. */
  void (*on_park)(void *frame, const char *point, molt__verdict pending);
  /* A participant was released from a barrier (its own thread, no lock).
   * May not return (a restart). */
  void (*on_release)(molt__verdict verdict);
  /* The calling thread exits (after it left the registry): true if the mode
   * takes it out of the barrier itself, later (molt__point_leave). */
  bool (*owns_exit)(void);
  /* Around fork() (prepare: after op_lock, before molt__rt_lock; the child
   * hook runs in the child's only thread). */
  void (*fork_prepare)(void);
  void (*fork_parent)(void);
  void (*fork_child)(void);
  /* Where participant tid is, for the message of a barrier that timed out
   * without it: a phrase such as "started in f (f.c), in read() called from
   * g (g.c)" into buf, or nothing (buf[0] stays '\0') if tid is none of the
   * mode's threads.  Runtime thread, op_lock and bar_lock held (it may take
   * locks further down the table). */
  void (*describe_thread)(pid_t tid, char *buf, size_t len);
  /* Before another mode's operation runs (op_lock held): 0, or MOLT_E* with
   * a one-line err to refuse it (a shadowed update refuses a plain full
   * update while its follower runs).  Logs its refusal. */
  int (*veto)(const molt__op_info *op, char *err, size_t errlen);
  /* Its records for `molt status` (op_lock held, molt__rt_lock not held). */
  void (*status)(molt__buf *out);
  /* Each reclamation pass (runtime thread, op_lock held). */
  void (*reclaim)(void);
  /* Work the mode asked the runtime thread for (it called molt__wake): a
   * shadowed update's next attempt.  On the runtime thread's own passes
   * only, never inside another operation, with op_lock held as an
   * operation holds it (the thread may fork). */
  void (*deferred)(void);
} molt__mode;

MOLT__HIDDEN void molt__mode_register(const molt__mode *m);
/* The process enters mode m (e.g. `molt run` starts a program image). */
MOLT__HIDDEN void molt__mode_enter(const molt__mode *m);
/* The mode the process is in; NULL only if no mode registered. */
MOLT__HIDDEN const molt__mode *molt__mode_current(void);
/* The mode that carries out op in the current mode: the current mode if
 * it has a handler for op, else a registered mode that works within it
 * and has one; NULL if none. */
MOLT__HIDDEN const molt__mode *molt__mode_for_op(unsigned op);
/* Hooks of every registered mode, in registration order (fork_parent and
 * fork_child in reverse). */
/* The vetoes of every registered mode but `handler` on op (op_lock held):
 * the first refusal, or 0. */
MOLT__HIDDEN int molt__modes_veto(const molt__mode *handler, const molt__op_info *op,
                                  char *err, size_t errlen);
MOLT__HIDDEN void molt__modes_on_park(void *frame, const char *point,
                                      molt__verdict pending);
MOLT__HIDDEN void molt__modes_on_release(molt__verdict verdict);
MOLT__HIDDEN bool molt__modes_own_exit(void);
MOLT__HIDDEN void molt__modes_fork_prepare(void);
MOLT__HIDDEN void molt__modes_fork_parent(void);
MOLT__HIDDEN void molt__modes_fork_child(void);
MOLT__HIDDEN void molt__modes_status(molt__buf *out);
/* The first mode's describe_thread that says something; buf "" if none. */
MOLT__HIDDEN void molt__modes_describe_thread(pid_t tid, char *buf, size_t len);
MOLT__HIDDEN void molt__modes_reclaim(void);
MOLT__HIDDEN void molt__modes_deferred(void);

#endif /* MOLT_SWITCH_H */
