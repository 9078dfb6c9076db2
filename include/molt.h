/*
 * molt.h -- the public header of molt, live updates for running C programs.
 *
 * A program includes this header, marks functions as updatable and links with
 * libmolt (moltcc does all of this for you).  While the program runs, `molt
 * apply <pid> patch.so` replaces updatable functions; calls that have already
 * started finish on the code they started with, and code that no thread can
 * run any more is unloaded.  Once the switch is over, a call of a patched
 * function costs one jump more than a call of an unpatched one; molt then
 * proves a superseded patch unused by reading the threads' stacks, so a
 * program that switches stacks in user space (coroutines, swapcontext) or
 * calls updatable functions from handlers on sigaltstack runs with
 * MOLT_COUNT_CALLS=1 in its environment (every call of a patched function
 * counted; guide section 6).
 *
 * Layout of this file:
 *   1. export macro, error codes (one table), version
 *   2. the public API callable from application code, ending with shadow
 *      data (per-object data of hot patches, in its own delimited part)
 *   3. the manual interface: declaring updatable functions and writing
 *      patches by hand (moltcc generates the same shapes automatically)
 *
 * The ABI between generated code and the runtime (molt__ names) is not an
 * API and lives in headers of its own: molt/abi.h (dispatch, module
 * registration, patches) and molt/program.h (program images and their state
 * migration, full updates).  This header includes molt/abi.h at its end,
 * because the manual interface expands to it and because every translation
 * unit with updatable functions registers them from a constructor defined
 * there; nothing in molt/abi.h is meant to be called or named by a program
 * author.  molt/program.h is included only by the code moltcc generates for
 * program images (and by hand-written images that take its place).
 */
#ifndef MOLT_H
#define MOLT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* 1. Export macro, errors, version                                          */
/* ------------------------------------------------------------------------ */

#define MOLT_EXTERN __attribute__((visibility("default")))

#define MOLT_VERSION_MAJOR 0
#define MOLT_VERSION_MINOR 1
#define MOLT_VERSION_STRING "0.1.0"

/*
 * Every function of molt returns 0 or one of these negative codes.  This
 * table is the only place where codes and messages are defined: the runtime,
 * the CLI (its exit codes) and the protocol all derive from it.
 *      XX(NAME,        value, "message")
 */
/* clang-format off */
#define MOLT_ERRNO_MAP(XX)                                                     \
  XX(EINVAL,       -1,  "invalid argument")                                    \
  XX(ENOMEM,       -2,  "out of memory")                                       \
  XX(EIO,          -3,  "input/output error")                                  \
  XX(ENOENT,       -4,  "no such file")                                        \
  XX(EPERM,        -5,  "permission denied")                                   \
  XX(EUNSAFE,      -6,  "patch file is writable by another user or not owned by the process owner or root") \
  XX(ENOTPATCH,    -7,  "not a molt patch")                                    \
  XX(ECORRUPT,     -8,  "corrupt or truncated file")                           \
  XX(EBUILDID,     -9,  "patch was built for a different program (build-id mismatch)") \
  XX(EABI,         -10, "patch was built for an incompatible molt ABI")        \
  XX(ENOSYM,       -11, "symbol not found in the running program")             \
  XX(ENOFUNC,      -12, "patch replaces a function that is not updatable in the running program") \
  XX(EDLOPEN,      -13, "the dynamic loader rejected the patch")               \
  XX(EBUSY,        -14, "too many generations are still running; try again when old calls have returned") \
  XX(ENOHISTORY,   -15, "nothing to roll back")                                \
  XX(ETIMEDOUT,    -16, "timed out")                                           \
  XX(EREFUSING,    -17, "the runtime is in a refusing state after an internal failure; see molt status") \
  XX(EPROTO,       -18, "malformed control message")                           \
  XX(EVERSION,     -19, "unsupported control protocol version")                \
  XX(ENOTMOLT,     -20, "process is not a molt process or has no control channel") \
  XX(ECONNECT,     -21, "cannot reach the process's control channel")          \
  XX(EPOLICY,      -22, "unknown update policy")                               \
  XX(EAMBIGUOUS,   -23, "symbol name is ambiguous in the running program")     \
  XX(ENOTSUP,      -24, "operation not supported")                             \
  XX(EINTERNAL,    -25, "internal error")                                    \
  XX(ENOTPROGRAM,  -26, "not a molt program image (build it with moltcc --molt-program)") \
  XX(ENOPROGRAM,   -27, "process does not run a program image (start it with molt run)") \
  XX(EXFORM,       -28, "state transformation failed; the update was aborted") \
  XX(ECALLBACK,    -29, "the patch's pre-update callback refused it")        \
  XX(EFULL,        -30, "the process's control channel was full; the request was not carried out")
/* clang-format on */

typedef enum {
#define MOLT__ERR_ENUM(name, val, msg) MOLT_##name = (val),
  MOLT_ERRNO_MAP(MOLT__ERR_ENUM)
#undef MOLT__ERR_ENUM
      MOLT__ERRNO_MIN = -30
} molt_errno_t;

/* Message for a code ("unknown error" for anything else); never NULL. */
MOLT_EXTERN const char *molt_strerror(int err);
/* Symbolic name for a code, e.g. "MOLT_EBUILDID"; never NULL. */
MOLT_EXTERN const char *molt_err_name(int err);

/* ------------------------------------------------------------------------ */
/* 2. Public API                                                              */
/* ------------------------------------------------------------------------ */

/* How a new generation reaches the threads (guarantees H2-H4). */
typedef enum {
  MOLT_POLICY_IMMEDIATE = 0, /* every call that starts after the switch */
  MOLT_POLICY_LOCAL = 1,     /* each thread at its own molt_quiesce()    */
  MOLT_POLICY_GLOBAL = 2     /* all threads at molt_update_point()       */
} molt_policy_t;

/*
 * Applies the patch at `path` from inside the process, exactly as `molt apply`
 * does (the work runs on the runtime thread; the caller waits for the result,
 * and while it waits it counts as waiting at an update point, so a thread
 * that calls molt_update_point() may itself apply under MOLT_POLICY_GLOBAL).
 * `timeout_ms` < 0 means the default.  On failure, `err_msg` (if not NULL,
 * `err_len` bytes) receives a one-line explanation.  Returns 0 or a MOLT_E*
 * code; on failure nothing has changed.
 */
MOLT_EXTERN int molt_apply(const char *path, molt_policy_t policy, int timeout_ms,
                           char *err_msg, size_t err_len);

/* Returns to the previous generation, as `molt rollback` does. */
MOLT_EXTERN int molt_rollback(molt_policy_t policy, int timeout_ms, char *err_msg,
                              size_t err_len);

/* Number of the generation new calls of the calling thread run (0 = the
 * program as built). Increases by one on every apply and every rollback. */
MOLT_EXTERN uint64_t molt_generation(void);

/*
 * Update timing (guarantees H3, H4).  A thread takes part simply by calling these.
 *
 * molt_quiesce(): the calling thread is at a local quiescence point (it
 *   holds no pointers into code or data that an update could change, e.g.
 *   between two requests).  From its first call on, the thread runs one
 *   generation as a whole between two quiescence points and moves to the
 *   newest generation here.  Never blocks.  Under policy `local` this is the
 *   only place the thread switches; under `immediate` it switches at once.
 *
 * molt_update_point(name): the thread is at an update point.  Normally
 *   returns 0 at once.  While a `global` update is pending, the thread waits
 *   here until every participating thread (every thread that has called
 *   molt_update_point) has arrived, the update is switched in, and all are
 *   released; it then returns 1.  If some thread does not arrive within the
 *   update's timeout, everyone is released, nothing changes, and it returns
 *   0.  An update point is also a quiescence point.  `name` must be a string
 *   that lives as long as the thread (a literal).
 *   In a program image (`molt run`), a full update waits here too; if it
 *   commits, molt_update_point() does NOT return in a program thread: the
 *   thread starts again in the new version (see "Full updates" below).
 *   If the update fails or times out it returns 0 and the old version goes
 *   on.  Threads of a program image take part from their first
 *   instruction, so each one must reach update points regularly (use
 *   molt_on_update_pending to wake those that block).
 *
 * molt_on_update_pending(cb, arg): cb(arg) is called (on molt's runtime
 *   thread, which runs every update) when a global update starts waiting,
 *   so that the program can wake threads blocked in I/O or on condition
 *   variables and let them reach an update point.  NULL removes the
 *   callback.
 */
MOLT_EXTERN void molt_quiesce(void);
MOLT_EXTERN int molt_update_point(const char *name);
MOLT_EXTERN void molt_on_update_pending(void (*cb)(void *arg), void *arg);

/*
 * Full updates (guarantees F1-F7): the whole program is built as an image
 * (`moltcc --molt-program -o prog.so *.c`), started with `molt run prog.so`
 * and replaced with `molt update <pid> prog2.so`.  These calls only matter
 * in a program image; elsewhere they return 0.
 *
 * In a program image every thread started with pthread_create (moltcc links
 * images with --wrap=pthread_create) takes part in full updates.  An update
 * waits until every such thread waits in molt_update_point(); then the
 * state is migrated while they wait.  If that succeeds, molt_update_point()
 * does not return: each thread starts again in the new version -- the main
 * thread in the new `main` (same argc/argv), every other thread in the new
 * version's function of the same name as its entry function, with the same
 * argument (redirected if it pointed to migrated data).  If it fails, every
 * thread returns 0 from molt_update_point() and the old version goes on.
 *
 * molt_is_updating(): true in a thread that was restarted by a full update
 *   until it reaches its first update point in the new version.
 * molt_is_updating_from(point): true if, in addition, the old version
 *   stopped this thread at update point `point` (compared by string).
 * MOLT_MIGRATE_LOCAL(var): in the old version, records that `var` (a local
 *   of the calling function) is to be carried across an update while the
 *   function's frame is live; in a restarted thread, sets `var` to the old
 *   value (transformed to the new type) and returns 1.  Returns 0 when there
 *   is nothing to migrate.  The frame is identified by the frame pointer
 *   (moltcc builds images with -fno-omit-frame-pointer).
 */
MOLT_EXTERN int molt_is_updating(void);
MOLT_EXTERN int molt_is_updating_from(const char *point);
MOLT_EXTERN int molt_migrate_local(const char *func, const char *name, void *addr,
                                   size_t size, void *frame);
#define MOLT_MIGRATE_LOCAL(var)                                                          \
  molt_migrate_local(__func__, #var, &(var), sizeof(var), __builtin_frame_address(0))

/*
 * Threads that block (guarantee F6): every program thread must reach an
 * update point soon after an update starts, also one that waits for I/O, a
 * timer or a condition variable.  These do the waking for the usual waits.
 *
 * molt_update_fd(): a descriptor (an eventfd, close-on-exec) that is
 *   readable exactly while an update is pending.  Add it, level-triggered,
 *   to every event loop (epoll, poll, select, libevent) whose thread must
 *   then return to its update point; never read it.  -1 if it cannot be
 *   made (errno says why).  The same descriptor for the whole process,
 *   across full updates.
 * MOLT_EVENT_LOOP_ONCE(base, name): the update point `name`, then
 *   event_base_loop(base, EVLOOP_ONCE) with the base watching
 *   molt_update_fd() (the event is added once per base: the base is carried
 *   across full updates, and the event's callback, molt_update_fd_cb, is
 *   libmolt's).  For a loop of the program's own around EVLOOP_ONCE.
 * MOLT_EVENT_LOOP(base, name): runs a libevent loop as event_base_loop(base,
 *   0) does, with the update point `name` before each round and the base
 *   watching molt_update_fd().  Returns event_base_loop's result: 0 after
 *   event_base_loopexit / loopbreak, -1 on an error, 1 if no event is left.  A macro, so that
 *   molt.h needs no libevent headers: include <event2/event.h> (or
 *   <event.h>) where it is used.  molt_update_fd_watch(base) is 1 the first
 *   time it sees base (the process keeps up to 256; a base freed and
 *   another made at the same address counts as seen).
 * molt_usleep(usec, name): an update point, a sleep of usec microseconds
 *   that an update ends early, and the update point again; for helper
 *   threads that poll with usleep().  Returns 1 if a hot-patch barrier
 *   switched the thread at either point.
 * molt_cond_wait(cond, mutex, name), molt_cond_timedwait(..., abstime,
 *   name): pthread_cond_wait / pthread_cond_timedwait (called and returning
 *   with mutex held) that an update wakes: the thread then releases mutex,
 *   waits at update point `name`, takes mutex again and returns EINTR --
 *   unless a full update committed: then the thread restarts in the new
 *   version without mutex (migrated unlocked; the new version takes it
 *   again).  EINTR is a spurious wake-up for the caller: check the
 *   predicate and wait again.  Otherwise the pthread function's result.
 *   Hold no other lock across the call: the update point would hold it.
 *
 * Signal handlers need nothing: at the commit of a full update every
 * handler (sigaction) that is a function of the old image is replaced by
 * the new image's function of the same name, flags and mask kept.
 */
MOLT_EXTERN int molt_update_fd(void);
MOLT_EXTERN void molt_update_fd_cb(int fd, short what, void *arg);
MOLT_EXTERN int molt_update_fd_watch(void *loop);
MOLT_EXTERN int molt_usleep(unsigned long usec, const char *name);
MOLT_EXTERN int molt_cond_wait(pthread_cond_t *cond, pthread_mutex_t *mutex,
                               const char *name);
MOLT_EXTERN int molt_cond_timedwait(pthread_cond_t *cond, pthread_mutex_t *mutex,
                                    const struct timespec *abstime, const char *name);
#define MOLT_EVENT_LOOP_ONCE(base, name)                                                 \
  __extension__({                                                                        \
    struct event_base *molt__base = (base);                                              \
    if (molt_update_fd_watch(molt__base))                                                \
      event_add(event_new(molt__base, molt_update_fd(), EV_READ | EV_PERSIST,            \
                          molt_update_fd_cb, NULL),                                      \
                NULL);                                                                   \
    molt_update_point(name);                                                             \
    event_base_loop(molt__base, EVLOOP_ONCE);                                            \
  })
#define MOLT_EVENT_LOOP(base, name)                                                      \
  __extension__({                                                                        \
    struct event_base *molt__loop = (base);                                              \
    int molt__rc;                                                                        \
    while ((molt__rc = MOLT_EVENT_LOOP_ONCE(molt__loop, name)) == 0 &&                   \
           !event_base_got_exit(molt__loop) && !event_base_got_break(molt__loop))        \
      ;                                                                                  \
    molt__rc;                                                                            \
  })

/*
 * Pointers that libraries keep into the program (libevent's events and
 * callbacks, a tsearch tree's keys, a custom allocator's hooks) are not
 * seen by the state migration, which follows the program's own types.  A
 * program image may define
 *
 *   int molt_on_migrated(char *why, size_t len);
 *
 * The NEW version's molt_on_migrated runs once its state has been migrated,
 * before it takes over, on molt's runtime thread while every program
 * thread still waits (under the migration's fault guard and time limit).
 * It reaches the new version's variables, and fixes the library's pointers:
 *
 * molt_migrated(old): the new address of an old pointer -- a migrated
 *   object's replacement, the new version's function or variable of the
 *   same name for an address in the old image, else old itself.
 * molt_migrated_store(slot, value): stores a pointer into memory the old
 *   version shares (library state); undone if the update aborts.
 *
 * Returning nonzero (with a reason in why) aborts the update: every store
 * is undone and the old version goes on.  Outside the hook molt_migrated
 * returns its argument and molt_migrated_store is a plain store.
 */
int molt_on_migrated(char *why, size_t len);
MOLT_EXTERN void *molt_migrated(const void *old);
MOLT_EXTERN void molt_migrated_store(void *slot, void *value);

/*
 * Type annotations for the state traversal of full updates (Kitsune's
 * E_* annotations, guarantee F5).  moltcc reads them through libclang; a plain
 * compiler sees nothing.  Put them after the declarator:
 *
 *   static int cache[64] MOLT_NO_MIGRATE;          // re-initialised, not migrated
 *   struct table { size_t n; struct entry *slots MOLT_PTRARRAY(n); };
 *   struct conn  { SSL *ssl MOLT_OPAQUE; };         // copied, never followed
 *   struct list  { void *val MOLT_VAR(t); struct list *next MOLT_INST(t); } MOLT_FORALL(t);
 *   struct list *users MOLT_INST(struct user);      // a list of struct user
 *
 * MOLT_PTRARRAY(n): the pointer addresses n elements; n is an integer or an
 *   expression over fields of the same struct and variables of the program
 *   (MOLT_PTRARRAY(rows * cols), MOLT_PTRARRAY(1 << hashpower),
 *   MOLT_PTRARRAY(settings.maxconns)), evaluated in the old version.
 *   Pointers default to one element; a pointer to pointers to a struct that
 *   changed needs it (the build refuses it otherwise: it may be an array).
 * MOLT_OPAQUE: the pointer value is kept as it is and not followed.
 * MOLT_FORALL(t) / MOLT_VAR(t) / MOLT_INST(type): a struct generic in type
 *   variable t, a void * field holding a t *, and an instantiation.
 * An unannotated void * is followed only if it points into the old image
 * (function, variable, string literal) or to an object already migrated;
 * one that points to a heap object the update then replaces (its type
 * changed) aborts the update, naming the pointer and the type.
 */
#if defined(__clang__)
#define MOLT__ANNOTATE(s) __attribute__((annotate(s)))
#else
#define MOLT__ANNOTATE(s)
#endif
#define MOLT_NO_MIGRATE MOLT__ANNOTATE("molt_no_migrate")
#define MOLT_PTRARRAY(n) MOLT__ANNOTATE("molt_ptrarray:" #n)
#define MOLT_OPAQUE MOLT__ANNOTATE("molt_opaque")
#define MOLT_FORALL(t) MOLT__ANNOTATE("molt_forall:" #t)
#define MOLT_VAR(t) MOLT__ANNOTATE("molt_var:" #t)
#define MOLT_INST(type) MOLT__ANNOTATE("molt_inst:" #type)

/*
 * Marks the next function definition as updatable for moltcc
 * (`MOLT_UPDATABLE int handle(struct req *r) { ... }`).  moltcc reads the
 * mark through libclang; a plain compiler sees nothing.
 */
#if defined(__clang__)
#define MOLT_UPDATABLE __attribute__((annotate("molt_updatable")))
#else
#define MOLT_UPDATABLE
#endif

/* ======================================================================== */
/* Shadow data (guarantee H13; guide section 6), the end of the public API        */
/* ======================================================================== */
/*
 * A hot patch cannot change the layout of a structure: every object in the
 * process, and all unpatched code, use the old layout.  A fix that needs a
 * new field instead attaches *shadow data* to each object: a block of
 * memory found by the object's address and a numeric id.  The patch keeps
 * the new field there (what Linux livepatch calls shadow variables).
 *
 *   #define CONN_FAILS 0x636f6e6e01u   // any constant; one per added field
 *   struct conn_fails { int fails; };
 *
 *   // creation (patched): the new object gets its field
 *   struct conn_fails *f = molt_shadow_attach(c, CONN_FAILS, sizeof *f,
 *                                             NULL, NULL, NULL);
 *   // use (patched): NULL = an object created before the patch
 *   struct conn_fails *f = molt_shadow_get(c, CONN_FAILS);
 *   // destruction (patched): before free(c)
 *   molt_shadow_free(c, CONN_FAILS, NULL);
 *
 * The (object, id) pair is the key: `obj` is only compared, never
 * dereferenced.  Ids are the patch author's choice (a later patch that
 * carries the same added field must use the same id; give a different
 * field a different id).  Shadow data is zero-filled and aligned for any
 * type (max_align_t).
 *
 * Lifetime.  Shadow data lives in libmolt, not in the patch that created
 * it: it survives that patch being superseded or unloaded, and the next
 * patch of the same fix finds it.  The runtime never keeps a constructor
 * or destructor pointer: each is called only during the call that passes
 * it, so code of the calling patch is fine.  The data itself must not
 * point into a patch (its string literals, functions or variables), which
 * is unloaded when superseded (guide section 6, "Lifetimes").
 *
 * Before / after the patch.  The patched creation path attaches a shadow
 * to every object it makes, so an object without one was created by code
 * that predates the patch -- including calls of the old creation code that
 * were still running when the patch was applied (guarantee H1).  Patched code
 * then behaves as the old code did for it, or adds the field lazily with
 * molt_shadow_get_or_alloc if a correct initial value can be derived.  The
 * hazard is a stale shadow: an object freed by code that does not free its
 * shadow (old code still running, a destruction path the patch does not
 * replace, everything after a rollback) leaves the shadow behind, and the
 * next object at that address would inherit it.  molt_shadow_attach at
 * creation destroys such a shadow; replace every destruction path; and
 * after a rollback free the id with molt_shadow_free_all once the patch's
 * code can no longer run (the guide shows how).
 *
 * Concurrency.  All functions are thread-safe.  molt_shadow_get takes no
 * lock and never blocks (the first call in a thread allocates 64 bytes); it
 * sees a shadow whose creation returned before it started, and never one
 * whose freeing returned before it started.  Writers lock one of 32 shards.
 * The data is the caller's: molt does not order accesses to it between
 * threads (use the same locking as for the object's other fields), and the
 * pointer stays valid until the shadow is freed -- never free a shadow
 * while another thread may use it, as for the object itself.  Whatever a
 * constructor wrote is visible to every thread that later gets the
 * pointer.  A constructor runs under a shard lock.  It may call the
 * program's functions and molt's (updatable functions, update points,
 * molt_apply) and molt_shadow_get; any other molt_shadow_* call from
 * inside it fails (NULL, MOLT_EBUSY or 0) instead of deadlocking.  It must
 * not call fork(), nor wait for a thread that may call molt_shadow_* or
 * fork().  Destructors run outside locks and may call anything.  Code that
 * molt's runtime thread runs during an update -- constructors and
 * destructors of a patch or a program image, state transformers, the
 * molt_on_update_pending callback -- must not call the functions that
 * create or free shadow data (molt_shadow_get is fine there).
 * These functions are not async-signal-safe.  The runtime never prints or
 * aborts: out of memory gives NULL.
 */

/* Initializes fresh (zero-filled) shadow data of `obj`; `arg` is passed
 * through.  Return 0 to keep it, anything else to fail the allocation. */
typedef int (*molt_shadow_ctor_fn)(const void *obj, void *data, void *arg);
/* Releases what the data holds (not the data itself) before it is freed. */
typedef void (*molt_shadow_dtor_fn)(const void *obj, void *data);

/* The shadow data (obj, id), or NULL if there is none. */
MOLT_EXTERN void *molt_shadow_get(const void *obj, uint64_t id);

/* New shadow data of `size` bytes for (obj, id), initialized by ctor (if
 * not NULL).  NULL if (obj, id) already has one, if obj is NULL or size 0,
 * if memory runs out, or if ctor fails (then nothing is allocated). */
MOLT_EXTERN void *molt_shadow_alloc(const void *obj, uint64_t id, size_t size,
                                    molt_shadow_ctor_fn ctor, void *arg);

/* The existing shadow data (obj, id), else new data as molt_shadow_alloc.
 * When threads race, the constructor runs once and all get the same
 * data.  NULL as molt_shadow_alloc (a failed constructor: none is made). */
MOLT_EXTERN void *molt_shadow_get_or_alloc(const void *obj, uint64_t id, size_t size,
                                           molt_shadow_ctor_fn ctor, void *arg);

/* For the creation path of the object: `obj` has just been created, so a
 * shadow (obj, id) that exists belonged to an earlier object at the same
 * address, freed by code that did not free its shadow.  That one is
 * destroyed (stale_dtor, if not NULL, is called on it) and replaced by new
 * data as molt_shadow_alloc makes it.  When this returns NULL (out of
 * memory, ctor failed), (obj, id) has no shadow: the object looks like one
 * created before the patch. */
MOLT_EXTERN void *molt_shadow_attach(const void *obj, uint64_t id, size_t size,
                                     molt_shadow_ctor_fn ctor, void *arg,
                                     molt_shadow_dtor_fn stale_dtor);

/* Frees the shadow data (obj, id), calling dtor (if not NULL) on it first.
 * 0, MOLT_ENOENT (none), MOLT_EINVAL (obj NULL), MOLT_EBUSY (called from a
 * constructor). */
MOLT_EXTERN int molt_shadow_free(const void *obj, uint64_t id, molt_shadow_dtor_fn dtor);

/* Frees every shadow of `id` (dtor, if not NULL, is called on each) and
 * returns how many.  Only when no thread uses any of them: typically after
 * the patch that used the id was rolled back and unloaded. */
MOLT_EXTERN size_t molt_shadow_free_all(uint64_t id, molt_shadow_dtor_fn dtor);

/* How many shadows of `id` / of all ids exist (for checks and leak
 * hunting: molt_shadow_count walks every shadow). */
MOLT_EXTERN size_t molt_shadow_count(uint64_t id);
MOLT_EXTERN size_t molt_shadow_total(void);

/* ======================================================================== */
/* End of shadow data                                                        */
/* ======================================================================== */

/* ------------------------------------------------------------------------ */
/* 3. Manual interface                                                       */
/* ------------------------------------------------------------------------ */
/*
 * Declaring an updatable function by hand (what moltcc generates from
 * MOLT_UPDATABLE / DSU_FUNC tags):
 *
 *     MOLT_FUNCTION(int, add, (int a, int b), (a, b)) {
 *         return a + b;
 *     }
 *     MOLT_VOID_FUNCTION(reset, (struct state *s), (s)) { s->n = 0; }
 *     MOLT_STATIC_FUNCTION(int, helper, (int x), (x)) { return x * 2; }
 *
 * `add` keeps its name and its address for the whole life of the process
 * (it is the stable entry); the body above becomes version 0.  Prototypes
 * elsewhere stay ordinary (`int add(int a, int b);`).  Variadic functions are
 * not supported by these macros (moltcc handles them).
 *
 * Writing a patch by hand (compiled with -fPIC -shared, stamped with the
 * target's build-id by `moltstamp PATCH.so PROGRAM`):
 *
 *     MOLT_PATCH("fix-1", "add saturates at INT_MAX");
 *     MOLT_IMPORT(int, counter);                  // the program's global
 *     MOLT_IMPORT_STATIC(int, hits, "server.c");  // a static of server.c
 *     MOLT_IMPORT_FUNCTION(int, helper, (int), "server.c");
 *     MOLT_PATCH_FUNCTION(int, add, (int a, int b)) {
 *         MOLT_REF(counter)++;
 *         return MOLT_REF(helper)(a) + b;
 *     }
 *     MOLT_PATCH_STATIC_FUNCTION(int, helper, (int x), "server.c") { ... }
 *
 * MOLT_REF(x) is the live object of the running program, never a copy: an
 * import is an undefined symbol of the patch (molt.imp.<name>) that the
 * runtime binds to the program's object before the patch runs.  The names
 * imported by one patch must be distinct (two statics of the same name in
 * different files cannot both be imported by a hand-written patch).  Imports
 * may be used in initializers too (`static int (*tab[])(int) =
 * {MOLT_REF(compute)};`): every relocation against them is bound.
 * MOLT_PATCH_PINNED(id, description, reasons) is MOLT_PATCH for a patch
 * whose code or data the program keeps pointers to (a callback, a string
 * it stores): the runtime never unloads it, and `molt status` shows the
 * reasons.  A patch has no constructors (moltcc and the runtime refuse
 * them: nothing of a patch runs when it is loaded); its callbacks are the
 * one way to run code at apply:
 *
 *     static int check_ready(void) { return MOLT_REF(counter) < 0; }
 *     MOLT_PATCH_PRE(check_ready);      // 0: go on; anything else refuses
 *     static int announce(void) { MOLT_REF(hits) = 0; return 0; }
 *     MOLT_PATCH_POST(announce);        // nonzero: a warning, stays applied
 *
 * Both take no argument and return int; at most one of each per patch.
 * They run inside the process on a short-lived thread of their own (not
 * the runtime thread), while molt waits at most the callback timeout
 * (`molt apply --callback-timeout SEC`, default 5 s):
 *   pre   after the patch is loaded, checked and its imports are bound,
 *         before anything is published.  Nonzero, or no return within the
 *         timeout, refuses the apply and nothing changes: the patch is
 *         unloaded -- unless pre is still running, then it stays loaded
 *         (never published; `molt status`: "pre-update callback still
 *         running").
 *   post  after the new generation is published (policy immediate: new
 *         calls already run the patch).  Nonzero or a timeout is a warning;
 *         a post still running keeps the patch loaded for good.
 * Rollback runs no callback.  A callback may call the program's functions
 * (updatable ones through their current version: pre still sees the old
 * one), read and write through MOLT_REF, and use molt_shadow_* (unlike
 * code on the runtime thread).  It must not call molt_apply or
 * molt_rollback (they wait for the apply that runs the callback), fork(),
 * nor wait for a thread that does, nor for anything that needs an update
 * to finish: the runtime holds its operation lock meanwhile, and such a
 * callback only times out.  The macros are for patch sources (compiled
 * with -DMOLT__NO_AUTO_REGISTER, as every patch is): a hand-written patch,
 * or the file moltcc takes with --molt-callbacks FILE.c for a patch built
 * from a fix; in a program they are a compile-time error.
 */

#define MOLT_FUNCTION(ret, name, params, args)                                           \
  MOLT__FUNCTION(extern, ret, name, params, args)
#define MOLT_STATIC_FUNCTION(ret, name, params, args)                                    \
  MOLT__FUNCTION(static, ret, name, params, args)
#define MOLT_VOID_FUNCTION(name, params, args)                                           \
  MOLT__VOID_FUNCTION(extern, name, params, args)
#define MOLT_STATIC_VOID_FUNCTION(name, params, args)                                    \
  MOLT__VOID_FUNCTION(static, name, params, args)

#define MOLT_PATCH(id, description) MOLT__PATCH_HEADER(id, description, "", 0u, "")
#define MOLT_PATCH_PINNED(id, description, reasons)                                      \
  MOLT__PATCH_HEADER(id, description, "", MOLT__PATCH_PINNED, reasons)

#define MOLT_PATCH_FUNCTION(ret, name, params)                                           \
  MOLT__PATCH_FUNCTION(ret, name, params, NULL)
#define MOLT_PATCH_STATIC_FUNCTION(ret, name, params, tu)                                \
  MOLT__PATCH_FUNCTION(ret, name, params, tu)

#ifdef MOLT__NO_AUTO_REGISTER
#define MOLT_PATCH_PRE(fn) MOLT__PATCH_CALLBACK(1, pre, fn)
#define MOLT_PATCH_POST(fn) MOLT__PATCH_CALLBACK(2, post, fn)
#else
#define MOLT_PATCH_PRE(fn)                                                               \
  _Static_assert(0, "MOLT_PATCH_PRE(" #fn ") belongs in a patch source (a hand-written " \
                    "patch, or moltcc --molt-patch --molt-callbacks FILE.c), not in a "  \
                    "program")
#define MOLT_PATCH_POST(fn)                                                              \
  _Static_assert(0, "MOLT_PATCH_POST(" #fn ") belongs in a patch source (a "             \
                    "hand-written patch, or moltcc --molt-patch --molt-callbacks "       \
                    "FILE.c), not in a program")
#endif

#define MOLT_IMPORT(type, name) MOLT__IMPORT(type, name, NULL)
#define MOLT_IMPORT_STATIC(type, name, tu) MOLT__IMPORT(type, name, tu)
#define MOLT_IMPORT_FUNCTION(ret, name, params, tu)                                      \
  extern ret molt__imp_##name params __asm__(MOLT__IMPORT_PREFIX #name);                 \
  MOLT__IMPORT_RECORD(name, tu)
#define MOLT_REF(name) (molt__imp_##name)

#ifdef __cplusplus
}
#endif

/* The ABI that the manual interface above and the module constructor use. */
#include "molt/abi.h"

#endif /* MOLT_H */
