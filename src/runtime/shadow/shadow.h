/*
 * shadow -- shadowed full updates (M1 in docs/guarantees.md, MVEDSUA), on
 * full/: a full update rehearsed in a forked follower while the process
 * (the leader) serves on in the old version.  It plugs in as a molt__mode
 * that works within the full mode (switch.h, `within`): the operation
 * shadow, fork hooks, records in status.  docs/design.md §17.
 *
 *   shadow.c  the mode: the operation, the fork at the barrier, the
 *             follower's start, the leader's monitor of the follower
 *   ring.c    the shared rings: the leader records each covered call and
 *             its result, the follower compares its own and replays
 *   calls.c   the covered calls (__wrap_read ... of molt/program.h)
 *   fds.c     descriptors the leader creates after the fork, passed to
 *             the follower at the same number
 *   epoll.c   epoll: the follower's interest lists emulated, events
 *             recorded by descriptor and given back with its own data
 *   trap.c    the backstop: unfollowed I/O system calls of the follower
 *             trapped (Syscall User Dispatch)
 *
 * Nothing outside this folder includes this header.
 */
#ifndef MOLT_SHADOW_H
#define MOLT_SHADOW_H

#include "full/full.h"

/* Program threads a shadowed update follows at most at once (one ring
 * each; a ring whose thread ended is reused, ring.c "threads"). */
#define MOLT__SHADOW_MAX_THREADS 64
/* Bytes of one thread's ring (records and their payloads): by default
 * large enough that the leader does not wait while the follower migrates
 * a big store before it replays (bench/RESULTS.md, P10); the environment
 * variable MOLT_SHADOW_RING_BYTES of the target process sets it (bytes,
 * or with a K, M or G suffix, within the bounds below).  The rings are
 * MAP_NORESERVE shared memory: only the pages a session touched cost
 * memory, and they are given back as its threads run alone (ring.c). */
#define MOLT__SHADOW_RING_DEFAULT (64ull << 20)
#define MOLT__SHADOW_RING_MIN (256ull << 10)
#define MOLT__SHADOW_RING_MAX (1ull << 30)
/* The largest record kept (a call's kept input and output and its
 * header), whatever the ring's size: a quarter of the smallest ring. */
#define MOLT__SHADOW_REC_MAX (MOLT__SHADOW_RING_MIN / 4)
/* How long a leader thread waits for room in its full ring before the
 * shadow is dropped. */
#define MOLT__SHADOW_FULL_WAIT_MS 1000
/* How long a follower's readiness call whose descriptors differ from the
 * leader's is retried before it is a divergence (ring.c, retry()). */
#define MOLT__SHADOW_RETRY_MS 2000
/* Bytes of a call's input kept in its record (the rest is compared by
 * length and hash only). */
#define MOLT__SHADOW_IN_KEEP 4096

/* The covered calls and their kinds: MOLT__SHADOW_CALLS, molt__sc_kind
 * (common.h, which the rule language shares). */

/* One covered call as a wrapper sees it. */
typedef struct molt__sc {
  molt__sc_kind kind;
  int64_t a[3];   /* its scalar arguments, compared */
  const void *in; /* bytes it passes (a write's buffer), compared */
  size_t in_len;
  void *out; /* where its results go (a read's buffer) */
  size_t out_cap;
  uint32_t fd_gen; /* a close: the generation of the descriptor it closes (fds.c) */
  /* Further results, recorded after out and given back whole, never
   * compared nor matched by a rule (recvfrom's address; recvmsg's
   * address, msg_flags and control data): aux_len bytes at aux. */
  void *aux;
  size_t aux_len;
} molt__sc;

/* What the calling thread is in a shadowed update. */
typedef enum {
  MOLT__SHADOW_NONE = 0, /* no shadow: the call runs as it is */
  MOLT__SHADOW_LEADER,   /* runs the call, then molt__shadow_record */
  MOLT__SHADOW_FOLLOWER  /* molt__shadow_replay instead of the call */
} molt__shadow_role;

/* How a session ended (the shared report's kind). */
enum {
  MOLT__SHADOW_END_NONE = 0,
  MOLT__SHADOW_END_DIVERGED, /* the follower's call differed from the leader's */
  MOLT__SHADOW_END_FAILED,   /* the update failed in the follower */
  MOLT__SHADOW_END_DROPPED   /* the leader dropped the shadow (ring full) */
};

/* ---- ring.c ------------------------------------------------------------------*/
/* The shared area and the rings (MAP_SHARED, made once, kept; the rings'
 * size read from MOLT_SHADOW_RING_BYTES the first time): 0, or
 * MOLT_EINVAL (a bad value) / MOLT_ENOMEM with err set. */
MOLT__HIDDEN int molt__shadow_area_get(char *err, size_t errlen);
/* A new session (runtime thread, every program thread parked): one ring per
 * tid, emptied; the calling process records from now on. */
MOLT__HIDDEN void molt__shadow_session_begin(const pid_t *tids, size_t n);
/* The follower's pid, once forked (the leader kills it to drop the shadow). */
MOLT__HIDDEN void molt__shadow_session_follower(pid_t pid);
/* This process takes no part in the session any more (a child of fork(),
 * a follower that could not be watched). */
MOLT__HIDDEN void molt__shadow_session_end(void);
/* The other side is gone (its process ended): each thread replays what its
 * ring still holds, then runs alone. */
MOLT__HIDDEN void molt__shadow_session_alone(void);
/* molt promote (to 1) and the way back (to 0), on the original process's
 * runtime thread with op_lock held: every ring's lead handed to side `to`
 * (0 the original process, 1 the follower `other`), ring by ring at each
 * thread's next followed call, within timeout_ms.  0, or MOLT_E* with err
 * (then every thread goes back to the side that led). */
MOLT__HIDDEN int molt__shadow_hand_over(unsigned to, int timeout_ms, pid_t other,
                                        char *err, size_t errlen);
/* The side that leads (or is being handed the lead): 0 or 1. */
MOLT__HIDDEN int molt__shadow_leading_side(void);
/* The original process ended through exit() (not a crash, not a signal). */
MOLT__HIDDEN bool molt__shadow_leader_exited(void);
/* In the follower, before any program thread starts. */
MOLT__HIDDEN void molt__shadow_become_follower(void);
/* A follower's program thread: its ring (on_start of molt__program_relaunch). */
MOLT__HIDDEN void molt__shadow_follower_thread(size_t index, void *arg);
MOLT__HIDDEN molt__shadow_role molt__shadow_role_now(void);
/* No shadowed update involves this process: every wrapper makes the plain
 * call (the wrappers' fast path, calls.c).  When it is false the thread's
 * role is molt__shadow_role_now()'s.  The acquire load orders the rings a
 * session made before it set the flag (ring.c, release store) before the
 * wrapper's use of them. */
MOLT__HIDDEN extern _Atomic bool molt__shadow_active;
static inline bool molt__shadow_off(void) {
  return !atomic_load_explicit(&molt__shadow_active, memory_order_acquire);
}

/* The backstop (trap.c, in its SIGSYS handler): whether a forward `drop`
 * rule covers a write or writev (kind) of the follower's thread to fd that
 * the wrappers did not see (bytes: write's buffer; NULL for writev, which
 * only a rule without a pattern matches).  true: the call is not made and
 * succeeds; the rule's decision is counted. */
MOLT__HIDDEN bool molt__shadow_trap_drops(unsigned kind, int64_t fd, const void *bytes,
                                          size_t n);
/* The backstop (trap.c, in its SIGSYS handler): the calling thread
 * follows no more -- the other side is gone and this process runs alone
 * (in the forked follower: the leader died, it took over) --, so the
 * trapped call is let through and the thread disarmed. */
MOLT__HIDDEN bool molt__shadow_trap_passes(void);
/* This process is the forked follower (side 1), not the original one. */
MOLT__HIDDEN bool molt__shadow_in_follower(void);
/* The forward and reverse rules of the next or running session (ring.c
 * keeps them; shadow.c parses into them with no session running). */
MOLT__HIDDEN molt__rules *molt__shadow_rules(void);
/* Leader: appends c with its result (out: out_len bytes the call wrote);
 * nothing if the calling thread runs alone. */
MOLT__HIDDEN void molt__shadow_record(const molt__sc *c, int64_t ret, int err,
                                      size_t out_len);
/* The leader's read or write in progress (molt__shadow_intent_begin). */
typedef struct molt__shadow_intent {
  void *x;         /* its record, reserved and not yet published */
  uint64_t end;    /* the ring's head once the whole reservation is published */
  size_t reserved; /* bytes reserved */
  void *data;      /* a read: where the kernel is to put its bytes (shared memory) */
  void *total;     /* the descriptor's byte total to raise by the result (ring.c) */
  const void *aux; /* the call's aux (molt__sc): recorded by _end, filled by then */
  size_t aux_len;
} molt__shadow_intent;
/* Leader, before a read, recv, write or send (c: its arguments and, for a
 * write, its bytes): reserves its record, writes the call's header with
 * the kernel's byte total of the descriptor so far and marks it as the
 * ring's intent, so that a follower that outlives this process can tell
 * what the call did (docs/design.md §17 "The leader dies").  true: make
 * the call -- a read into it->data, then copy it out -- and then
 * molt__shadow_intent_end; false: make it as it is and then
 * molt__shadow_record. */
MOLT__HIDDEN bool molt__shadow_intent_begin(const molt__sc *c, molt__shadow_intent *it);
MOLT__HIDDEN void molt__shadow_intent_end(molt__shadow_intent *it, int64_t ret, int err);
/* The other side's process is dead (its death seen through the kernel):
 * as molt__shadow_session_alone, and each thread also completes a read or
 * write the dead side was inside of. */
MOLT__HIDDEN void molt__shadow_session_peer_died(void);
/* A thread of this process waits for another one's replay (a follower's
 * retry, epoll.c's registration waiting for a close): every consumer of
 * this process that naps on an empty ring looks at it again now (ring.c,
 * consumer_wait: a consumer naps up to 2 ms with nobody waking it). */
MOLT__HIDDEN void molt__shadow_nudge(void);
/* The calling thread replays the other side's calls (a follower's wrapper
 * blocks the backstop again after a replay only then). */
MOLT__HIDDEN bool molt__shadow_follows(void);
/* Calls the other side died inside of, as this process completed them:
 * completed from what the kernel says they moved, those that had moved
 * nothing (made again), those the kernel could not tell about (made
 * again: not a TCP socket), and the bytes of them given to the program
 * (read) and not sent again (written). */
typedef struct molt__shadow_intents {
  uint64_t completed, nothing, uncertain, read_bytes, skipped_bytes;
} molt__shadow_intents;
MOLT__HIDDEN void molt__shadow_intent_counts(molt__shadow_intents *n);
/* Follower: the leader's result of the same call into *result and *err,
 * compared first (a divergence ends the follower and does not return);
 * fills c->out; true.  false: the calling thread leads from this call on
 * (a promotion, or the other side is gone): the caller makes the call and
 * then molt__shadow_record. */
MOLT__HIDDEN bool molt__shadow_replay(const molt__sc *c, int64_t *result, int *err);
/* Calls fn(arg, fd) for each descriptor of this process whose
 * /proc/self/fd link reads link_name ("anon_inode:[eventpoll]"), up to the
 * first that returns non-zero: that, 0, or a MOLT_E* code with err. */
MOLT__HIDDEN int molt__shadow_each_fd_of(const char *link_name,
                                         int (*fn)(void *arg, int fd), void *arg,
                                         char *err, size_t errlen);
/* The wrappers' (calls.c, epoll.c) forms of the two, errno kept as the
 * program's call leaves it: the follower's result, the leader's, with its
 * errno (true), or false when the thread leads from this call on (the
 * caller makes the call and records it); record after a real call. */
MOLT__HIDDEN bool molt__shadow_call_replay(const molt__sc *c, int64_t *ret);
MOLT__HIDDEN void molt__shadow_call_record(const molt__sc *c, int64_t ret,
                                           size_t out_len);
/* The follower ends with a report (first one wins): never returns.  In
 * the original process following after a promotion, the calling thread
 * stops for good instead (the process keeps its control socket). */
MOLT__HIDDEN void molt__shadow_follower_fail(int kind, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 2, 3)));
/* A leading thread drops the shadow (the report says why): the original
 * process stops recording and kills the follower; a promoted follower goes
 * on alone. */
MOLT__HIDDEN void molt__shadow_drop(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
/* Follower: the descriptor generation (fds.c) of the record its last
 * replay consumed on this thread. */
MOLT__HIDDEN uint32_t molt__shadow_replayed_fd_gen(void);
/* The other side is gone (molt__shadow_session_alone ran in this process). */
MOLT__HIDDEN bool molt__shadow_alone(void);
/* The report of the session that ended: its kind (0: none) and text. */
MOLT__HIDDEN int molt__shadow_report(char *text, size_t len);
/* Counters for status: calls recorded and compared, the highest ring use
 * in percent, calls a rule decided. */
MOLT__HIDDEN void molt__shadow_counts(uint64_t *recorded, uint64_t *compared,
                                      unsigned *max_use_pct, uint64_t *applied);

/* The hooks of threads started after the fork (full.h), registered with the
 * mode. */
MOLT__HIDDEN extern const molt__program_thread_hooks molt__shadow_thread_hooks;

/* ---- fds.c: descriptors the leader creates after the fork ---------------------*/
/* Any generation (molt__shadow_fd_release). */
#define MOLT__SHADOW_ANY_GEN UINT32_MAX
/* Leader, before the fork (every program thread parked): one channel per
 * ring. */
MOLT__HIDDEN void molt__shadow_fds_begin(size_t n);
/* 0, or an error naming a descriptor whose kernel object a fork would share
 * with the follower (an epoll instance, an io_uring). */
MOLT__HIDDEN int molt__shadow_fds_check_forkable(char *err, size_t errlen);
/* Leader, after the fork: its copies of the follower's ends closed. */
MOLT__HIDDEN void molt__shadow_fds_forked(void);
/* The session is over: the leader's ends closed once no thread sends on
 * them (in a child of fork(), at once). */
MOLT__HIDDEN void molt__shadow_fds_end(void);
MOLT__HIDDEN bool molt__shadow_is_channel(int fd);
/* Leader: the generation of the descriptor at fd (a close reads it before
 * it closes); in the follower leading after a promotion, of its own
 * descriptor there, 0 if it did not create it. */
MOLT__HIDDEN uint32_t molt__shadow_fd_gen(int fd);
/* The generation an epoll table keeps for a registration this process
 * makes for real: in a follower that runs alone after a takeover, the
 * leader's generation of the descriptor it holds from the leader at fd (a
 * thread still replaying the dead leader's ring names that one in its
 * events), else molt__shadow_fd_gen. */
MOLT__HIDDEN uint32_t molt__shadow_fd_table_gen(int fd);
/* A close this process makes for real: in a follower, the descriptor is
 * held no more (the number claimed around it, so that a thread placing
 * the leader's descriptor there meanwhile is not closed instead). */
MOLT__HIDDEN int molt__shadow_fd_close_own(int fd);
/* Leader's thread of ring `ring`: fd was just created by a followed call;
 * sends it to the follower, *gen its new generation.  0 or -errno.  The
 * follower leading after a promotion sends it the other way, to the
 * original process (*gen: its own generation). */
MOLT__HIDDEN int molt__shadow_fd_created(unsigned ring, int fd, uint32_t *gen);
/* Follower, before its threads start: the descriptors it inherited. */
MOLT__HIDDEN void molt__shadow_note_inherited(void);
/* The original process, about to follow the follower `other` (promoted):
 * the descriptors both hold under the same numbers, which a close the new
 * version makes closes here too. */
MOLT__HIDDEN void molt__shadow_note_shared_with(pid_t other);
/* Follower's thread of ring `ring`, consuming the record of a call that
 * created fd (generation gen): receives it, places it at fd.  Also the
 * original process's thread following the promoted follower. */
MOLT__HIDDEN void molt__shadow_fd_take(unsigned ring, int fd, uint32_t gen, bool cloexec);
/* The fork handlers: shfd_lock taken, released, made anew. */
MOLT__HIDDEN void molt__shadow_fds_fork_prepare(void);
MOLT__HIDDEN void molt__shadow_fds_fork_parent(void);
MOLT__HIDDEN void molt__shadow_fds_fork_child(void);
/* A thread started after the fork (ring.c, threads): the leader's creator
 * (producer of ring `creator`) makes the new ring's channel and sends the
 * follower's end on its own (0 or -errno); the follower's creator takes
 * it when it replays that creation; a ring's end is closed when its thread
 * ends (the consumer's, the producer's in the leader). */
MOLT__HIDDEN int molt__shadow_fds_ring_open(unsigned creator, unsigned ring);
MOLT__HIDDEN void molt__shadow_fds_ring_take(unsigned creator, unsigned ring);
MOLT__HIDDEN void molt__shadow_fds_ring_close(unsigned ring);
/* Follower, its ring drained for good after the leader's death: closes the
 * descriptors still in the ring's channel (no record will place them). */
MOLT__HIDDEN void molt__shadow_fds_drain(unsigned ring);
/* Follower: the leader closed fd (generation gen, or MOLT__SHADOW_ANY_GEN):
 * closes the follower's copy if it holds that one. */
MOLT__HIDDEN void molt__shadow_fd_release(int fd, uint32_t gen);

/* ---- epoll.c: epoll instances, which a fork shares ------------------------------*/
/* Leader, at the barrier (every program thread parked): the registrations
 * of each epoll instance read from the kernel into this process's tables.
 * 0, or an error (two descriptors of one instance with the same data, too
 * many instances). */
MOLT__HIDDEN int molt__shadow_epoll_begin(char *err, size_t errlen);
/* This process stops being the one whose data the kernel's instances hold
 * (the follower at its start; a process that replays the other side's
 * epoll calls): its next real epoll call rewrites them first. */
MOLT__HIDDEN void molt__shadow_epoll_disown(void);
/* close(fd) of the program: fd leaves the tables (an instance's own table
 * goes with it); leading: its registrations are deleted from the kernel's
 * instances first (the other process's copy would keep them); following:
 * only those of generation gen (the replayed close's; 0: any). */
MOLT__HIDDEN void molt__shadow_epoll_closing(int fd, bool leading, uint32_t gen);
/* The fork handlers: shep_lock taken, released, made anew. */
MOLT__HIDDEN void molt__shadow_epoll_fork_prepare(void);
MOLT__HIDDEN void molt__shadow_epoll_fork_parent(void);
MOLT__HIDDEN void molt__shadow_epoll_fork_child(void);
/* Follower, replaying a wait (the record's output: the leader's events by
 * descriptor): NULL when every descriptor is in the follower's table (its
 * program's events filled in with its own data), else why not (the call is
 * retried as a readiness call whose set differs, ring.c). */
MOLT__HIDDEN const char *molt__shadow_epoll_fits(const molt__sc *c, const void *out,
                                                 size_t len);

/* ---- trap.c: the backstop for calls the wrappers do not see --------------------*/
/* In the follower before its threads start: the SIGSYS handler.  0 or
 * -errno (-ENOSYS: not on this architecture). */
MOLT__HIDDEN int molt__shadow_trap_install(void);
/* A following program thread (the follower's; the original process's
 * after molt promote): system calls outside the wrappers trap from now on.
 * 0 or -errno (the kernel has no Syscall User Dispatch).  A thread that
 * is armed already stays as it is. */
MOLT__HIDDEN int molt__shadow_trap_arm(void);
/* The calling thread's calls are not trapped any more (the original
 * process's thread leads again, or runs alone): dispatch turned off.  A
 * thread that is not armed: nothing. */
MOLT__HIDDEN void molt__shadow_trap_disarm(void);
/* The calling thread's backstop is on (a follower's thread, or the old
 * version's after a promotion): a thread-local load. */
MOLT__HIDDEN bool molt__shadow_trap_armed(void);
/* The wrappers' own calls, between these two, are not trapped. */
MOLT__HIDDEN void molt__shadow_trap_allow(void);
MOLT__HIDDEN void molt__shadow_trap_block(void);

#endif /* MOLT_SHADOW_H */
