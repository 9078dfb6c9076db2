/*
 * core -- the mechanism every way of updating shares, on base/: which
 * threads run updatable code, which functions are updatable, which
 * generations are alive, and where each function's entry jumps.  Nothing
 * here knows when a thread switches (switch/) or where a new version comes
 * from (the modes).
 *
 *   thread.c   the thread registry (lazy registration, exit hook)
 *   entry.c    the jump at each updatable function's address
 *   gen.c      generations: slots, tables, numbering, owners, publication,
 *              reclamation; molt_generation()
 *   module.c   registered modules and their updatable functions
 *   proof.c    proofs that no thread still runs a superseded patch that
 *              calls reached by a direct jump (uncounted)
 *   oldcode.c  which threads still run version 0 of a replaced function
 *   stack.c    reading another thread's stack while it is blocked (for
 *              proof.c and oldcode.c)
 *   shadow.c   shadow data (molt_shadow_*, molt.h): per-object data of hot
 *              patches, which belongs to no mode and outlives its patch
 *
 * Within the layer: module -> gen -> entry, proof -> stack -> thread,
 * oldcode -> stack (no calls back up);
 * shadow.c calls nothing of the others.
 * The functions of entry.c, gen.c and module.c run with molt__rt_lock held
 * unless their comment says otherwise; the registry (thread.c) takes its
 * own lock.
 */
#ifndef MOLT_CORE_H
#define MOLT_CORE_H

#include "base/base.h"

/* ---- thread.c: the registry ------------------------------------------------*/
MOLT__HIDDEN void molt__threads_init(void);
/* fn runs in every registered thread when it exits, after it has left the
 * registry (one hook: the switch layer's).  Set once at start-up. */
MOLT__HIDDEN void molt__threads_on_exit(void (*fn)(void));
/* Calls fn for each registered thread, under the registry lock. */
MOLT__HIDDEN void
molt__threads_foreach(void (*fn)(void *arg, const molt__thread *t, pid_t tid), void *arg);
/* Points the view of every thread that has one at g (immediate and global
 * switches). */
MOLT__HIDDEN void molt__threads_set_views(molt__gen *g);
/* The calling thread's own stack as found at its registration (0, 0: not
 * registered or not known). */
MOLT__HIDDEN void molt__thread_own_stack(uintptr_t *lo, uintptr_t *hi);
/* The stack of registered thread tid; false if it is not registered. */
MOLT__HIDDEN bool molt__thread_stack_of(pid_t tid, uintptr_t *lo, uintptr_t *hi);
/* fork(): hold the registry across it; in the child keep only the caller. */
MOLT__HIDDEN void molt__threads_lock(void);
MOLT__HIDDEN void molt__threads_unlock(void);
MOLT__HIDDEN void molt__threads_after_fork_child(void);

/* ---- entry.c: stable entries -------------------------------------------------*/
/* Checks and records the entries of start[0..n), function indices first..;
 * on failure `why` names the function. */
MOLT__HIDDEN int molt__entries_add(const molt__fn_desc *start, uint32_t first, uint32_t n,
                                   char *why, size_t whylen);
/* Before g is published: every entry that jumps straight to a version
 * other than the one g maps it to jumps to its dispatch path. */
MOLT__HIDDEN int molt__entries_prepare(const molt__gen *g, char *err, size_t errlen);
typedef struct molt__owner molt__owner;
/* After reclamation: every dispatching entry i (i < n) on whose version all
 * live generations agree (agreed[i]; NULL: they do not) jumps straight to
 * it: direct for version 0, through its trampoline to a patch version of
 * owners[i] (NULL: that owner may not be entered uncounted, stay).  Marks
 * such owners entered_directly. */
MOLT__HIDDEN void molt__entries_relax(void *const *agreed, molt__owner *const *owners,
                                      uint32_t n);
/* Every entry that jumps direct or into a patch jumps to its dispatch path
 * (while a proof waits for threads that never block, proof.c); the next
 * relax moves them back. */
MOLT__HIDDEN void molt__entries_hold(void);
/* "direct", "patch" or "dispatch" (status). */
MOLT__HIDDEN const char *molt__entry_state(uint32_t index);

/* ---- gen.c: generations ----------------------------------------------------*/
/*
 * An owner is whatever a generation's table points into besides the
 * program itself: today a patch object of the hot mode, which embeds one.
 * Generations count the live ones that point into each owner; when the
 * last is reclaimed, the owner is handed back through its release hook,
 * outside molt__rt_lock (release may dlclose).  The fields after `release`
 * are gen.c's own.
 */
struct molt__owner {
  const char *id;                  /* shown as a function's version in status */
  void (*release)(molt__owner *o); /* no live generation points into o now,
                                      and no thread runs its code */
  size_t gen_refs;                 /* live generations pointing into it      */
  uint64_t mark;                   /* scratch of gen.c (distinct owners)     */
  molt__owner *release_next;       /* list built by molt__gen_reclaim        */
  /* Some entry jumped straight into its code since it was loaded (entry.c):
   * calls it ran were not counted, so proof.c must show that no thread
   * runs it before it is released; direct_code is such a version (where
   * proof.c finds the object's code). */
  bool entered_directly;
  void *direct_code;
  /* Its release never unmaps the code calls reached (a pinned patch stays
   * mapped for the life of the process, a patch whose callback outlived
   * its deadline too): proof.c then proves nothing and releases it at
   * once.  Written and read on the runtime thread (op_lock). */
  bool keeps_code;
};

MOLT__HIDDEN void molt__gen_init(void);
MOLT__HIDDEN bool molt__gen_reclaim_enabled(void);
/* Functions [first, first + n) were registered: their version 0 bodies. */
MOLT__HIDDEN int molt__gen_add_functions(const molt__fn_desc *start, uint32_t first,
                                         uint32_t n);
/* Version 0 of function `index`. */
MOLT__HIDDEN void *molt__gen_body(uint32_t index);
/* Allocates a slot and a table of every registered function copied from
 * `from` (NULL: version 0 bodies).  numbered: g gets the next generation
 * number (a new state of the program: apply, rollback, full update); else
 * it keeps from's (the same state with more functions).  MOLT_EBUSY if no
 * slot is free, MOLT_ENOMEM. */
MOLT__HIDDEN int molt__gen_new(const molt__gen *from, bool numbered, molt__gen **out);
/* Entry `index` of unpublished g runs impl, which owner supplies (NULL:
 * version 0, the program's own). */
MOLT__HIDDEN void molt__gen_set(molt__gen *g, uint32_t index, void *impl,
                                molt__owner *owner);
MOLT__HIDDEN molt__owner *molt__gen_owner(const molt__gen *g, uint32_t index);
/* The owners of all g->size entries at once (NULL: all the program's), for
 * loops over a whole table. */
MOLT__HIDDEN molt__owner *const *molt__gen_owners(const molt__gen *g);
MOLT__HIDDEN void molt__gen_discard(molt__gen *g); /* never published */
/* Makes g current (for every thread that follows the current generation;
 * views are the switch layer's business); the old current is retired and
 * the runtime thread is woken to reclaim it.  Reports a failure to prepare
 * the entries or an allocation failure (then nothing changed). */
MOLT__HIDDEN int molt__gen_publish(molt__gen *g);
/* Publishes a copy of the current generation numbered one higher and moves
 * every view to it (a full update's commit: the image changed, the table
 * did not).  Its number in *number, or MOLT_EBUSY / MOLT_ENOMEM. */
MOLT__HIDDEN int molt__gen_bump(uint64_t *number);
/* Republishes the current generation with the entries of newly registered
 * functions (version 0); the generation number does not change. */
MOLT__HIDDEN int molt__gen_extend_current(void);
MOLT__HIDDEN molt__gen *molt__gen_current(void);
/* The current generation's number; takes molt__rt_lock itself (for log
 * entries and messages from any layer). */
MOLT__HIDDEN uint64_t molt__gen_number_now(void);
/* Whether slot s holds a live generation (current, or retired and still
 * running), and which. */
MOLT__HIDDEN bool molt__gen_live(unsigned s, bool *current);
/* Per-generation statistics from one scan of the thread registry. */
typedef struct molt__gen_usage {
  uint32_t active[MOLT__SLOTS]; /* calls in progress per slot */
  uint32_t views[MOLT__SLOTS];  /* threads whose local view is the slot */
} molt__gen_usage;
MOLT__HIDDEN void molt__gen_scan(molt__gen_usage *u);
/* One reclamation pass: retired generations that no thread runs are freed.
 * Owners no live generation points into any more are linked into
 * *released; the caller hands them to molt__owners_release AFTER releasing
 * molt__rt_lock.  Returns the number of retired generations still alive. */
MOLT__HIDDEN size_t molt__gen_reclaim(molt__owner **released);
/* After a pass that freed a generation (and no proof holds the dispatch
 * path): entries on whose version every live generation agrees jump
 * straight to it (entry.c). */
MOLT__HIDDEN void molt__gen_relax_if_due(void);
/* While molt__proof_holds_dispatch: every entry dispatches, and relaxes
 * once the hold ends; else molt__gen_relax_if_due. */
MOLT__HIDDEN void molt__gen_hold_or_relax(void);

/* ---- proof.c: no thread runs a superseded patch -----------------------------*/
MOLT__HIDDEN void molt__proof_init(void);
/* Whether the entries of owner o may jump straight into its code (not when
 * the program counts every call, MOLT_COUNT_CALLS, nor while too many
 * proofs are pending, unless o needs none: keeps_code). */
MOLT__HIDDEN bool molt__proof_accepts(const molt__owner *o);
/* Every entry takes its dispatch path while a proof waits for a thread found
 * running (from 5 ms into the proof for a second, then a second every 16 s;
 * for threads found blocked on another stack only from 16 s on): threads
 * that never block answer there (proof.c). */
MOLT__HIDDEN bool molt__proof_holds_dispatch(void);
/* One pass (runtime thread, op_lock held, no molt__rt_lock): the owners in
 * `released` (no live generation points into them) are released at once
 * if no call reached them uncounted, else once every thread has been
 * proved out of their code.  Returns the number of owners still waiting
 * for a proof. */
MOLT__HIDDEN size_t molt__proof_pass(molt__owner *released);
MOLT__HIDDEN void molt__proof_after_fork_child(void);

/* ---- stack.c: other threads' stacks -----------------------------------------*/
/* The process's threads but the caller, sorted (*out: free it; NULL when
 * there are none). */
MOLT__HIDDEN size_t molt__stack_threads(pid_t **out);
MOLT__HIDDEN bool molt__stack_has_tid(const pid_t *sorted, size_t n, pid_t tid);
/* Forgets what is cached about threads not in live[0..nlive) (sorted). */
MOLT__HIDDEN void molt__stack_forget(const pid_t *live, size_t nlive);
/* What to look for: the program counter and every stack word in [min, max)
 * go to hit(); reset() comes before each attempt (only the words of the
 * attempt that succeeds count).  limit: bytes above the stack pointer
 * looked at (0: all); a deeper stack fails unless truncate. */
typedef struct molt__stack_scan {
  uintptr_t min, max;
  size_t limit;
  bool truncate;
  void (*reset)(void *arg);
  void (*hit)(void *arg, uintptr_t word);
  void *arg;
} molt__stack_scan;
enum { MOLT__STACK_READ, MOLT__STACK_RUNNING, MOLT__STACK_ELSEWHERE, MOLT__STACK_FAILED };
#define MOLT__STACK_BUF 65536 /* bytes of the buffer a scan is given */
/* Reads thread tid's whole stack at one moment while it is blocked, into
 * s's callbacks; buf holds MOLT__STACK_BUF bytes.  MOLT__STACK_READ: done; RUNNING: it
 * is not blocked now; ELSEWHERE: blocked with its stack pointer outside its
 * registered stack (a handler on sigaltstack; every thread under valgrind,
 * which runs the program on stacks of its own); FAILED: gone, too deep,
 * or it ran during every attempt (runtime thread, op_lock). */
MOLT__HIDDEN int molt__stack_scan_blocked(pid_t tid, const molt__stack_scan *s,
                                          uint64_t *buf);

/* ---- module.c: modules and their updatable functions -------------------------*/
typedef struct molt__module {
  molt__fn_desc *start, *stop;
  uintptr_t base;                            /* load bias of the module          */
  char *path;                                /* file the module was loaded from */
  char build_id[MOLT__BUILD_ID_HEX_MAX + 1]; /* hex; "" if none */
  uint32_t first_index;                      /* index of start[0] in generation tables */
  /* Open-addressing index (name, tu of statics) -> descriptor, built on the
   * first lookup so that start-up does not pay for it (P4). */
  molt__fn_desc **index;
  size_t index_mask;
} molt__module;

MOLT__HIDDEN size_t molt__modules_count(void);
MOLT__HIDDEN molt__module *molt__module_at(size_t i);
/* The module with build-id `hex`, and its position in *i; NULL if none. */
MOLT__HIDDEN molt__module *molt__module_by_build_id(const char *hex, size_t *i);
/* The descriptor of updatable function (name, tu) in module m, or NULL.
 * tu is matched by basename; tu == NULL matches external functions only. */
MOLT__HIDDEN molt__fn_desc *molt__module_find_fn(molt__module *m, const char *name,
                                                 const char *tu);
/* The file to read module m's symbols from: /proc/self/exe for the
 * executable (the executed file, even if its path was rebuilt since). */
MOLT__HIDDEN const char *molt__module_file(const molt__module *m);
MOLT__HIDDEN uint32_t molt__fn_count(void); /* all modules */
MOLT__HIDDEN molt__fn_desc *molt__fn_at(uint32_t index);

/* ---- oldcode.c: threads still inside a replaced version 0 --------------------*/
/* One observation: thread `tid` was found inside version 0 of function
 * `index` (its stack holds an address inside the body) by every scan since
 * `since` (CLOCK_REALTIME ns); `seen` is the last such scan. */
typedef struct molt__oldcode {
  pid_t tid;
  uint32_t index;
  uint64_t since, seen;
} molt__oldcode;
/* Scans the stacks of the process's blocked threads for version 0 of every
 * function the current generation replaces (runtime thread, op_lock, no
 * molt__rt_lock) and keeps what it saw; returns the number of
 * observations.  Conservative and partial: see oldcode.c. */
MOLT__HIDDEN int molt__oldcode_scan(void);
MOLT__HIDDEN size_t molt__oldcode_count(void);
MOLT__HIDDEN const molt__oldcode *molt__oldcode_at(size_t i);
/* Threads the last scan could not look at (running, not blocked). */
MOLT__HIDDEN size_t molt__oldcode_uninspected(void);

/* ---- shadow.c: shadow data ---------------------------------------------------*/
/* Called by the runtime's fork handlers (service/runtime.c) at the place of
 * shadow_lock and shadow_reclaim_lock in the lock table: prepare before
 * every other lock, parent and child after every other is released or
 * reinitialized.  prepare holds every shard lock and the reclaim lock
 * across fork(); the child also gives back the reader records of the
 * threads it does not have. */
MOLT__HIDDEN void molt__shadow_fork_prepare(void);
MOLT__HIDDEN void molt__shadow_fork_parent(void);
MOLT__HIDDEN void molt__shadow_fork_child(void);

#endif /* MOLT_CORE_H */
