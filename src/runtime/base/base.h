/*
 * base -- the lowest layer of libmolt, on common/: what every part of the
 * runtime needs and nothing that knows about functions, generations or
 * threads.
 *
 *   lock.c      the runtime's locks, with a rank each (the table below) and
 *               a check of the order in debug and test builds
 *   state.c     the state lock (molt__rt_lock), the refusing state
 *               (molt__fail), the runtime thread's wake-up (a socket pair),
 *               and the lazy start of the runtime thread in a forked child
 *   log.c       the update log: a ring in memory and an optional file
 *   platform.c  membarrier, thread ids, clocks
 *   file.c      opening update files once, checking them (R7), sealed copies
 *   fd.c        the runtime's descriptors, checked before every use: the
 *               host may close them and reuse their numbers
 */
#ifndef MOLT_BASE_H
#define MOLT_BASE_H

#include "common/common.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/types.h>
#include <time.h>

/* ---- locks (lock.c) -------------------------------------------------------
 *
 * Every lock of the runtime, outermost first.  This table is THE lock
 * order (docs/design.md shows a copy): a thread that holds a lock may take
 * only locks further down.  Each lock's rank is its position here; with
 * MOLT_LOCK_CHECK (debug builds, and the test builds of scripts/test.sh)
 * taking a lock whose rank is not greater than that of every lock the thread
 * already holds is reported (refusing state, a `fail` log entry, and
 * molt__lock_violations() for tests) -- never an abort.
 *
 * The dynamic loader's own lock sits between op and rt: op may be held
 * across dlopen/dlclose, rt never is, because a module registers itself
 * (taking rt) from a constructor, i.e. while the loader holds its lock.
 *
 * The shadow-data locks (core/shadow.c) come first, above op.  A shadow
 * constructor runs under its shard's lock (that is what makes it run once
 * per object when threads race) and may do whatever an application thread
 * may: call an updatable function (the first call registers the thread:
 * reg; in a forked child it also starts the runtime thread: op), reach an
 * update point (bar, prog), log, dlopen, or call molt_apply (req, then it
 * waits for the runtime thread, which carries the request out under op).
 * So every other lock, and the runtime thread's work, may nest inside a
 * shard lock, and the converse must never happen: the runtime thread
 * takes no shadow lock.  No runtime code calls molt_shadow_*; code that
 * the runtime thread runs for a program -- constructors and destructors of
 * patches and images (under op and the loader's lock), state
 * transformers, molt_on_update_pending callbacks -- must not call the
 * shadow writers (molt_shadow_get takes no lock), and the check reports it
 * if it does.  Shard locks never nest with each other (a constructor's own
 * shadow calls fail instead) nor with shadow_reclaim, which nothing is
 * taken under; only the fork handler holds them all, shards first.
 *
 * fork(): the fork handlers (service/runtime.c) take EVERY lock of this
 * table, in this order, before fork() copies the process, release them in
 * the parent and make each anew in the child, so no lock is ever copied
 * held by a thread that does not exist in the child.  A new lock belongs
 * in the table and in the handlers (tests/runtime, case forklocks, forks
 * while each one is held).  Before it takes any, the forking thread counts
 * as waiting at an update point (switch/points.c): a barrier holds op
 * while it waits for its participants and must not wait for one that
 * waits for op.
 *
 *   XX(name, owner, protects -- taken by)
 */
/* clang-format off */
#define MOLT__LOCKS(XX)                                                        \
  XX(shadow, "core/shadow.c",                                                  \
     "shadow data, one lock per shard (32) -- application threads in the "    \
     "molt_shadow_* writers, one shard at a time; a shadow constructor runs " \
     "under it; never the runtime thread")                                     \
  XX(shadow_reclaim, "core/shadow.c",                                          \
     "a reclamation pass of shadow data -- the thread that retires a batch "  \
     "or frees an id, holding no shard lock; nothing is taken under it")      \
  XX(op, "service/runtime.c",                                                  \
     "whole operations: apply, rollback, update, status, reclamation; may be " \
     "held across dlopen/dlclose -- the runtime thread")    \
  XX(bar, "switch/points.c",                                                   \
     "participants and state of the barrier (policy global, full updates), "   \
     "waits.c's condition waits and event loops -- "                           \
     "the runtime thread inside op (never while the barrier's step runs); "    \
     "application threads alone, at an update point's slow path")             \
  XX(prog, "full/program.c",                                                   \
     "the program-thread registry and images of a program image -- the "       \
     "runtime thread inside op; program threads alone at start, exit and "     \
     "their first update point after a restart; never across dlopen/dlclose") \
  XX(shd, "shadow/shadow.c",                                                   \
     "a shadowed update's stage, follower and outcome -- the runtime thread "  \
     "inside op, the shadow's monitor thread alone; logs inside")             \
  XX(shep, "shadow/epoll.c",                                                   \
     "a shadowed update's epoll tables -- program threads in the epoll "       \
     "wrappers and close(), alone; nothing is taken under it")                \
  XX(shfd, "shadow/fds.c",                                                     \
     "a follower's placement of a descriptor the leader passed -- its "        \
     "program threads, alone; nothing is taken under it")                     \
  XX(rt, "base/state.c",                                                       \
     "the runtime state: modules, generations, entries, patch objects -- the " \
     "runtime thread; application threads when a module registers from a "    \
     "constructor")                                                            \
  XX(reg, "core/thread.c",                                                     \
     "the thread registry -- reclamation and status (inside rt); a thread's "  \
     "registration and its exit; nothing that can block is done under it")    \
  XX(req, "service/request.c",                                                 \
     "the queue of in-process requests -- application threads in molt_apply " \
     "and molt_rollback, the runtime thread; nothing is taken under it")      \
  XX(log, "base/log.c",                                                        \
     "the log ring and the log file -- anyone; only fd is taken under it")     \
  XX(fd, "base/fd.c",                                                          \
     "placing the runtime's descriptors; a kept one used by another thread "   \
     "than the runtime thread (a waker's write, a log line) -- anyone; a leaf")
/* clang-format on */

enum {
#define MOLT__LOCK_ENUM(name, owner, what) MOLT__LOCK_RANK_##name,
  MOLT__LOCKS(MOLT__LOCK_ENUM)
#undef MOLT__LOCK_ENUM
      MOLT__LOCK_RANKS
};

/* On unless NDEBUG: debug builds check, release builds do not, and
 * -DMOLT_LOCK_CHECK=1 (CMake option MOLT_LOCK_CHECK) turns it on anywhere. */
#ifndef MOLT_LOCK_CHECK
#ifdef NDEBUG
#define MOLT_LOCK_CHECK 0
#else
#define MOLT_LOCK_CHECK 1
#endif
#endif

typedef struct molt__lock {
  pthread_mutex_t m;
  unsigned rank; /* MOLT__LOCK_RANK_* */
} molt__lock;

#define MOLT__LOCK_INIT(name)                                                            \
  { PTHREAD_MUTEX_INITIALIZER, MOLT__LOCK_RANK_##name }

/* "op_lock", ... */
MOLT__HIDDEN const char *molt__lock_name(unsigned rank);

#if MOLT_LOCK_CHECK
MOLT__HIDDEN void molt__lock_acquire(molt__lock *l);
MOLT__HIDDEN void molt__lock_release(molt__lock *l);
/* pthread_cond_wait / timedwait on l (held, and held again on return). */
MOLT__HIDDEN int molt__lock_wait(pthread_cond_t *c, molt__lock *l);
MOLT__HIDDEN int molt__lock_timedwait(pthread_cond_t *c, molt__lock *l,
                                      const struct timespec *deadline);
#else
static inline void molt__lock_acquire(molt__lock *l) { pthread_mutex_lock(&l->m); }
static inline void molt__lock_release(molt__lock *l) { pthread_mutex_unlock(&l->m); }
static inline int molt__lock_wait(pthread_cond_t *c, molt__lock *l) {
  return pthread_cond_wait(c, &l->m);
}
static inline int molt__lock_timedwait(pthread_cond_t *c, molt__lock *l,
                                       const struct timespec *deadline) {
  return pthread_cond_timedwait(c, &l->m, deadline);
}
#endif
/* In a forked child: l is initialized anew (it may have been held by a
 * thread that does not exist there) and counts as not held. */
MOLT__HIDDEN void molt__lock_reinit(molt__lock *l);
/* Order violations seen so far (always 0 without MOLT_LOCK_CHECK). */
MOLT__HIDDEN unsigned molt__lock_violations(void);

/* ---- the log (log.c) ------------------------------------------------------
 *   XX(NAME, "name in the log")
 */
/* clang-format off */
#define MOLT__EVENTS(XX)                                                       \
  XX(START, "start")       /* runtime started                         */      \
  XX(LOAD, "load")         /* patch object loaded                     */      \
  XX(SWITCH, "switch")     /* a new generation became current         */      \
  XX(ROLLBACK, "rollback") /* switch back to an earlier state         */      \
  XX(UNLOAD, "unload")     /* patch object or program image unloaded  */      \
  XX(RECLAIM, "reclaim")   /* generation reclaimed                    */      \
  XX(REFUSE, "refuse")     /* a request was refused (bad patch, ...)  */      \
  XX(DENIED, "denied")     /* control connection refused (uid)        */      \
  XX(FAIL, "fail")         /* internal failure: refusing state        */      \
  XX(INFO, "info")                                                             \
  XX(UPDATE, "update")     /* a full update committed                 */      \
  XX(ABORT, "abort")       /* a full update aborted after the barrier */ \
  XX(CALLBACK, "callback") /* a patch's pre/post-update callback ran  */ \
  XX(SHADOW, "shadow")     /* a shadowed update's follower: forked, ended */
/* clang-format on */

typedef enum {
#define MOLT__EV_ENUM(NAME, name) MOLT__EV_##NAME,
  MOLT__EVENTS(MOLT__EV_ENUM)
#undef MOLT__EV_ENUM
} molt__event;

MOLT__HIDDEN void molt__log_init(void);
MOLT__HIDDEN void molt__log(molt__event ev, uint64_t gen, const char *patch_id,
                            const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Appends the ring as TSV records: log <seq> <unix time> <event> <gen> <patch id> <message> */
MOLT__HIDDEN void molt__log_dump(molt__buf *out);
MOLT__HIDDEN const char *molt__event_name(molt__event ev);
/* For the fork handlers: log_lock held across fork() (the child's ring and
 * file descriptor are then consistent), made anew in the child. */
MOLT__HIDDEN void molt__log_fork_prepare(void);
MOLT__HIDDEN void molt__log_fork_parent(void);
MOLT__HIDDEN void molt__log_after_fork_child(void);

/* ---- platform.c -----------------------------------------------------------*/
/* Prepares process-wide memory barriers. false if the kernel lacks them. */
MOLT__HIDDEN bool molt__membarrier_init(void);
/* Full memory barrier on every running thread of the process. */
MOLT__HIDDEN int molt__membarrier(void);
/* After code was rewritten: no thread keeps running stale instructions. */
MOLT__HIDDEN void molt__sync_core(void);
MOLT__HIDDEN pid_t molt__gettid(void);
MOLT__HIDDEN uint64_t molt__now_ns(void);      /* CLOCK_MONOTONIC */
MOLT__HIDDEN uint64_t molt__realtime_ns(void); /* CLOCK_REALTIME  */
/* The CLOCK_MONOTONIC time ms milliseconds from now (pthread_cond_timedwait
 * with a monotonic condition, sem_clockwait). */
MOLT__HIDDEN struct timespec molt__monotonic_after_ms(int ms);
/* Blocks every signal but the synchronous faults (SIGSEGV, SIGBUS, SIGILL,
 * SIGFPE, SIGTRAP) in the calling thread, the old mask in *old: for threads
 * molt starts, which signals sent to the process must not reach, while a
 * fault stays visible to sanitizers and debuggers instead of a silent
 * kill.  A thread created meanwhile inherits the mask. */
MOLT__HIDDEN void molt__block_async_signals(sigset_t *old);

/* ---- descriptors the host may close (fd.c) --------------------------------
 *
 * Programs close descriptors they did not open: daemons close every
 * inherited one at start-up (closefrom, close_range, a loop up to
 * sysconf(_SC_OPEN_MAX)), after molt's runtime has started, and then reuse
 * the numbers for their own sockets and files.  A number alone therefore
 * never names a runtime descriptor: a molt__fd also remembers which file it
 * is (device, inode, status flags, a memfd's seals, a socket's own
 * address), and molt__fd_ours() checks that before every use that could
 * touch a file of the host (read, write, accept, dlopen through
 * /proc/self/fd, close).  A descriptor that fails the check is lost: its
 * number is the host's now and is never used or closed again; its owner
 * makes a new one.
 *
 * The check and the use are two system calls: a host thread that closes a
 * runtime descriptor and opens a file on the same number in between wins
 * that race, exactly as it would against any descriptor a library opens
 * for a moment.  What the check rules out is the lasting danger: a number
 * the runtime kept for seconds or days and that the host reused meanwhile.
 *
 * Not thread-safe by itself: each molt__fd belongs to one thread or lock. */
typedef struct molt__fd {
  int fd; /* -1: none */
  dev_t dev;
  ino_t ino;
  int flags;     /* F_GETFL */
  int seals;     /* F_GET_SEALS, -1 where the file has none (not a memfd) */
  uint64_t name; /* a socket's own address (getsockname), hashed; else 0 */
} molt__fd;

#define MOLT__FD_NONE                                                                    \
  { .fd = -1 }

/* The lowest number of the band where kept descriptors go (fd.c; -1 if
 * unknown): shadow/trap.c lets the runtime's own I/O on them through. */
MOLT__HIDDEN int molt__fd_band(void);
/* Takes fd over where it is (a descriptor used for a moment): records what
 * file it is.  0, or MOLT_EIO if fd is not open (any more). */
MOLT__HIDDEN int molt__fd_take(molt__fd *o, int fd);
/* Takes fd over for long: moves it out of the host's way (to a number near the top
 * of the first 1024, fd.c says why) and records what file it is.  Returns 0
 * or a MOLT_E* code: then o is none and fd is not the caller's any more
 * (closed by the host before it could be kept). */
MOLT__HIDDEN int molt__fd_keep(molt__fd *o, int fd);
/* Whether o's number still names the file it was kept with (false for
 * none). */
MOLT__HIDDEN bool molt__fd_ours(const molt__fd *o);
/* Closes o's number if it is still ours, never the host's; o becomes none.
 * Returns false if the descriptor had been lost. */
MOLT__HIDDEN bool molt__fd_close(molt__fd *o);
/* fd_lock (fd.c): held while a kept descriptor is checked and used by a
 * thread other than the runtime thread, and while one is placed.  The fork
 * handlers hold it across fork() and make it anew in the child. */
MOLT__HIDDEN void molt__fd_lock(void);
MOLT__HIDDEN void molt__fd_unlock(void);
MOLT__HIDDEN void molt__fd_after_fork_child(void);
/* o becomes none without closing anything (a lost descriptor). */
MOLT__HIDDEN void molt__fd_forget(molt__fd *o);
/* "/proc/self/fd/<n>" for o's number, if o is still ours: 0, or MOLT_EIO. */
MOLT__HIDDEN int molt__fd_path(const molt__fd *o, char *buf, size_t len);
/* The same for dlopen: a name that no loaded object has (o may move to
 * another number for that, fd.c says why).  0, or MOLT_EIO if o is lost. */
MOLT__HIDDEN int molt__fd_load_path(molt__fd *o, char *buf, size_t len);
/* A loaded object's load name no longer shows in the loader's list (its
 * link map names it otherwise) but the loader still matches it: load paths
 * avoid it until the object is closed (runtime thread).  hidden: 0 or
 * MOLT_ENOMEM (then the caller must not rename). */
MOLT__HIDDEN int molt__fd_load_name_hidden(const char *name);
MOLT__HIDDEN void molt__fd_load_name_shown(const char *name);

/* ---- file.c ---------------------------------------------------------------*/
/* Opens `path` once, checks it (regular file, owned by the process owner or
 * root, not writable by group/others: R7) and keeps a sealed memfd copy in
 * *out that everything later reads.  Returns 0, or a negative MOLT_E* with
 * err set. */
MOLT__HIDDEN int molt__file_open_checked(const char *path, size_t max_bytes,
                                         molt__fd *out, char *err, size_t errlen);
/* What was loaded, for status and the log: the file's device and inode as
 * checked, and the SHA-256 of the copy (hex). */
typedef struct molt__file_identity {
  dev_t dev;
  ino_t ino;
  char sha256[65];
} molt__file_identity;
/* The same checks on a descriptor opened by someone else (received with a
 * request, or opened by molt_apply's caller), which stays the caller's
 * (not closed): regular file, owner, mode, open read-only; then the sealed
 * copy in *out and, if id, what it is. */
MOLT__HIDDEN int molt__file_copy_checked(int fd, const char *name, size_t max_bytes,
                                         molt__fd *out, molt__file_identity *id,
                                         char *err, size_t errlen);
/* open(path) as the runtime's callers may (never the runtime thread for a
 * client): O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, no read. */
MOLT__HIDDEN int molt__file_open_path(const char *path, int *fd, char *err,
                                      size_t errlen);

/* ---- state.c --------------------------------------------------------------*/
/* molt__rt_lock: the runtime state (modules, generations, entries, objects). */
MOLT__HIDDEN void molt__rt_lock_acquire(void);
MOLT__HIDDEN void molt__rt_lock_release(void);
/* For the fork handlers: held across fork(), initialized anew in the child. */
MOLT__HIDDEN void molt__rt_lock_after_fork_child(void);

/* Enters the refusing state (R3): the first reason is kept, a `fail` entry
 * is logged, later updates fail with MOLT_EREFUSING and status reports the
 * reason.  The program keeps running its current generation. */
MOLT__HIDDEN void molt__fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Same without the log entry (for a caller that holds the log lock). */
MOLT__HIDDEN void molt__fail_quiet(const char *reason);
MOLT__HIDDEN bool molt__refusing(char *reason, size_t len);

/* The runtime thread's wake-up: a connected pair of sockets; it polls the
 * read end, anyone else writes a byte into the other.  The write end also
 * trips when the host closes it: the read end sees end-of-file at once
 * (state.c).  molt__wake() may be called from any thread (it is not a
 * cancellation point); on the runtime thread it only raises a flag. */
MOLT__HIDDEN int molt__wake_init(void); /* 0 or MOLT_E* (then refusing) */
MOLT__HIDDEN void molt__wake(void);
/* The runtime thread, once at its start: its own wake-ups need no write. */
MOLT__HIDDEN void molt__wake_serve_here(void);
/* Runtime thread: makes sure the pair is the runtime's own and makes a new
 * one if the host closed or replaced either end (an `info` entry says so).
 * Returns the read end to poll, or -1 if there is none right now (then
 * poll with a timeout and call again). */
MOLT__HIDDEN int molt__wake_keep(void);
/* Runtime thread, after poll: whether someone woke it (revents of the read
 * end, or the flag of molt__wake on the runtime thread); empties the read
 * end. */
MOLT__HIDDEN bool molt__wake_drain(short revents);
/* Runtime thread: whether either end is lost (molt__wake_keep would make
 * a new pair). */
MOLT__HIDDEN bool molt__wake_lost(void);
/* Runtime thread: whether a wake-up is pending (then poll must not sleep). */
MOLT__HIDDEN bool molt__wake_pending(void);
MOLT__HIDDEN void molt__wake_after_fork_child(void);

/* In a forked child the runtime thread is started lazily: the fork handler
 * arms `start`, the first registration (or the program driver) calls
 * molt__start_if_needed, which runs it until it disarms itself. */
MOLT__HIDDEN void molt__start_arm(void (*start)(void));
MOLT__HIDDEN void molt__start_disarm(void);
MOLT__HIDDEN bool molt__start_armed(void);
MOLT__HIDDEN void molt__start_if_needed(void);

#endif /* MOLT_BASE_H */
