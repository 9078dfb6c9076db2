/* The shared rings of a shadowed update (shadow.h): record and replay.
 *
 * One MAP_SHARED anonymous area, made once and kept (a process runs one
 * shadowed update at a time; the next one empties it), inherited by the
 * follower at fork().  It holds one ring per program thread of the leader
 * (the registry's order at the fork, the same order in which the follower
 * relaunches them; a thread started later claims a free one, "threads"
 * below) and the report of how a session ended.  The rings'
 * bytes are a second such mapping, MOLT__SHADOW_MAX_THREADS rings of
 * ring_bytes each (MOLT_SHADOW_RING_BYTES, 64 MiB by default), made
 * MAP_NORESERVE: shared anonymous pages cost memory only once touched, so
 * a ring can be large enough to absorb everything the leader does while
 * the follower migrates a big store, and costs what the session wrote
 * into it.  A thread that runs alone for good, the other side dead, gives
 * its ring's pages back (MADV_REMOVE, give_back()); a new session gives
 * back what is left before it starts.
 *
 * A ring has a single producer, the leader's thread, and a single
 * consumer, the follower's thread of the same index.  Records are
 * variable-sized (a header, the input bytes kept, the output bytes) and
 * never wrap: a record that would not fit before the end is preceded by a
 * SKIP filler.  head and tail count bytes from the session's start.
 *
 * Ordering between threads is neither recorded nor compared: each follower
 * thread sees its own leader thread's calls in their order, and nothing
 * says how they interleaved with other threads' calls (docs/design.md §17).
 *
 * Who leads (molt promote, docs/design.md §17 "Promotion").  The original
 * process is side 0, the forked follower side 1; `want` in the area says
 * which side should lead.  A ring's producer and consumer swap roles in
 * the ring itself: a leading thread that sees `want` name the other side
 * makes no call, appends a HANDOVER record and waits until its counterpart
 * has consumed it (tail == head); from then on it consumes.  The
 * counterpart replays up to the HANDOVER, takes it (`taken`), waits until
 * the operation releases the handover (`ready`: every ring taken, the
 * descriptors checked) and from its current call on makes its calls and
 * records them.  head and tail keep one writer each at any time: the swap
 * happens at the HANDOVER record, which orders the two writers (below, at
 * each use).  When the other side is gone (its process ended, or it was
 * dropped), each thread replays what its ring still holds and then runs
 * alone (`alone`).
 */
#include "shadow/shadow.h"

#include "molt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* A record that hands the lead to the consumer (a[0]: the handover's
 * epoch).  Not a call kind: outside molt__sc_kind's range. */
#define REC_HANDOVER 0xffffu
/* The producer's thread started a thread (a[0]: the new thread's ring, a[1]:
 * 1 if a channel for that ring was sent on this ring's, fds.c; the input:
 * its entry function's name; ret: pthread_create's result), and its
 * thread ended (threads, below).  Not call kinds either. */
#define REC_THREAD 0xfffeu
#define REC_EXIT 0xfffdu
/* Descriptor numbers whose presence the original process tracks after a
 * promotion (see `opened`). */
#define FD_TRACKED 4096

typedef struct rec {
  uint32_t size;    /* of the whole record, a multiple of 8 */
  uint16_t kind;    /* molt__sc_kind */
  uint16_t fd_kind; /* molt__fd_kind of a[0], if a forward rule names one */
  int64_t a[3];
  int64_t ret;
  int32_t err;
  uint32_t in_keep; /* input bytes kept after the header */
  uint64_t in_len;  /* the input's whole length */
  uint64_t in_hash; /* FNV-1a of the whole input */
  uint32_t out_len; /* output bytes after the kept input */
  uint32_t fd_gen;  /* the descriptor it created or closed: its generation (fds.c) */
  /* A read or write made through an intent (molt__shadow_intent_begin):
   * base holds the kernel's running total of bytes consumed from (read)
   * or written to (write) the descriptor just before the call, if
   * base_ok (a TCP socket whose total the leader knows, see fd_total). */
  uint32_t base_ok;
  uint32_t aux_len; /* the call's aux results (molt__sc.aux), after the output */
  uint64_t seq;     /* its place among all threads' records (area.clock) */
  uint64_t base;
} rec;

/* The fields each side writes for every record are on cache lines of
 * their own (the producer's: head, intent, recorded; the consumer's: tail,
 * compared, applied), apart from those written only when a side waits
 * (seq, waiting) and from the rest: a record does not move a line the
 * other side keeps reading (P10, bench/RESULTS.md). */
#define LINE 64
typedef struct ring {
  /* Bytes published by the leader: release store after the record is
   * written, acquire load by the follower before it reads it. */
  _Alignas(LINE) _Atomic uint64_t head;
  /* relaxed: counters for status (recorded: one writer, the producer;
   * compared, applied: the consumer) */
  _Atomic uint64_t recorded;
  /* The record of the producer's read or write in progress: its position
   * + 1 (0: none).  The producer reserves the record, writes the call's
   * header (kind, arguments, the kernel's total before it: an intent),
   * stores this with release and only then makes the system call (a
   * read's bytes land in the record's payload, in this shared mapping);
   * it publishes the record (head) once the call returned.  A mark below
   * head is stale.  Read by a consumer only once the producer's process
   * is dead (peer_dead): acquire, pairing with the release store, orders
   * the header written before it; what the kernel wrote into the payload
   * during the call and the producer's last stores are ordered by its
   * death, which the consumer learned from the kernel (a pidfd, waitpid)
   * before it set peer_dead. */
  _Atomic uint64_t intent;
  /* Bytes the follower consumed: release store after it copied a record
   * out, acquire load by the leader before it reuses the space (which it
   * does from a copy it refreshes only now and then, reserve()). */
  _Alignas(LINE) _Atomic uint64_t tail;
  _Atomic uint64_t compared;
  _Atomic uint64_t applied; /* calls a rule decided */
  /* The follower waits on seq (a futex across the two processes) after
   * setting waiting: WAIT_NAP for a short nap that ends by its timeout,
   * WAIT_SLEEP for a sleep the leader must end (consumer_wait()).  The
   * leader stores head, then loads waiting, and bumps seq and wakes the
   * follower only for WAIT_SLEEP.  seq_cst on both sides: either the
   * follower sees the new head on its re-check, or the leader sees the
   * waiting it stored (Dekker). */
  _Alignas(LINE) _Atomic uint32_t seq;
  _Atomic uint32_t waiting;
  _Atomic uint64_t max_use; /* relaxed: bytes, for status (the producer, now and then) */
  /* Read by both sides at every record, written rarely: before the fork,
   * or when a thread started after it claims the ring (leader_tid: tid_of,
   * set_tid), at a handover (taken, handed). */
  _Alignas(LINE) pid_t leader_tid; /* the original process's thread */
  /* The epoch of the last HANDOVER its consumer took: release store by
   * that consumer after its last replay, acquire load by the operation,
   * which then reads `opened` and `closed` (written by those replays). */
  _Atomic uint32_t taken;
  /* The epoch of the last HANDOVER its producer saw taken: release store
   * by that producer, which makes no call after it until the handover is
   * released; acquire load by a promotion's operation, in the same
   * process, before it looks at the descriptors those threads created
   * (molt__shadow_note_shared_with).  The order through `taken` passes
   * through the other process, where a sanitizer does not see it. */
  _Atomic uint32_t handed;
  /* Its ring_bytes bytes in the rings' mapping (set once when the
   * mapping is made, before any fork); records are 8-byte aligned (their
   * sizes are multiples of 8, the mapping is page-aligned). */
  char *data;
  /* Threads started after the fork (below, "threads"): whether a thread
   * of this session has the ring -- RING_LIVE from the session's start
   * (the threads of the fork) or from its claim by a creating thread until
   * the consumer took its EXIT record; RING_FREE then, RING_CLAIMING while
   * a claimer sets it up.  A claimer takes it from RING_FREE by
   * compare-exchange (acquire: the last consumer's release store of
   * RING_FREE, after it was done with the ring), sets it up and stores
   * RING_LIVE (release: the set-up before any reader that sees it live,
   * acquire loads). */
  _Atomic uint32_t live;
  /* The slot was claimed for a thread started after the fork this session:
   * leader_tid names no thread of the fork (relaxed: read only with
   * `live`, see role_of_this_call). */
  _Atomic uint32_t reused;
} ring;

/* Descriptor numbers whose byte totals the leading side keeps (a read or
 * write on a higher number still records an intent, without a base). */
#define FD_TOTALS 65536
/* fd_total.tag: the session's number << 2 | one of these. */
#define TOT_KNOWN 1u /* total is the kernel's (a TCP socket) */
#define TOT_NONE 2u  /* not a TCP socket: the kernel keeps no total */

/* The leading side's count of the bytes a descriptor moved in one
 * direction, equal to the kernel's running total for a TCP socket
 * (tcp_totals): measured at the descriptor's first read or write of the
 * session (or 0 for one a followed accept created), then raised by each
 * followed call's result.  A tag from an earlier session, or 0 (a followed
 * close or socket reset it), means not known yet.  Only threads doing I/O
 * on the descriptor in that direction touch it, one at a time (two
 * threads reading one stream socket at once are not supported, design
 * §17): relaxed atomics, the program's own synchronisation (or, across
 * the processes, a HANDOVER record) orders the hand-offs. */
typedef struct fd_total {
  _Atomic uint64_t tag;
  _Atomic uint64_t total;
} fd_total;

typedef struct area {
  /* How the session ended: 0 until one side writes a report.  The writer
   * claims it with a compare-exchange from 0 (the first one wins), writes
   * the text and then stores `written` with release; the leader reads the
   * text after an acquire load of `written` (or after waitpid). */
  _Atomic int kind;
  _Atomic int written;
  char text[2048];
  uint32_t nrings; /* written before the fork */
  /* The leader's records in the order their calls returned, across threads
   * (relaxed fetch-add: only the numbers' order matters, and a record is
   * published with release after it takes its number).  On a line of its
   * own: every leader thread writes it at every record, and reads `want`
   * at every call. */
  _Alignas(LINE) _Atomic uint64_t clock;
  /* The side that should lead (0 the original process, 1 the follower),
   * and the number of the handover that set it: the operation stores
   * epoch, then want with release; a thread's acquire load of want sees
   * the epoch it writes into its HANDOVER. */
  _Alignas(LINE) _Atomic uint32_t want;
  _Atomic uint32_t epoch;
  /* The last handover the operation released: a thread that took a
   * HANDOVER of epoch e leads only once ready >= e (acquire, pairing with
   * the operation's release store, after which `want` is final for e). */
  _Atomic uint32_t ready;
  /* The original process ended through exit() (its destructor): a
   * follower that sees it gone ends too instead of taking over. */
  _Atomic int leader_exited;
  /* After a promotion: per number, the newest generation of a descriptor
   * the new version created there (opened) and the newest one it closed
   * (closed), as the original process's threads replayed them.  The new
   * version's descriptor at fd is open -- and absent from the original
   * process, to which nothing passes it -- while opened > closed, whatever
   * order threads replayed a close and a reuse of the number in (a number
   * is reused only after its close, so generations grow).  Raised with
   * relaxed atomic RMWs by the replaying threads; read by the operation
   * after `taken` (see there). */
  _Atomic uint32_t opened[FD_TRACKED], closed[FD_TRACKED];
  /* Per descriptor number and direction (0 in, 1 out): the kernel's
   * running total of bytes moved through it, as the leading side knows it
   * (fd_total below). */
  fd_total totals[FD_TOTALS][2];
  ring rings[MOLT__SHADOW_MAX_THREADS];
  /* Rings a thread of this session had, at most (nrings at the start;
   * raised by a claim, release after the ring is set up and live; acquire
   * loads by the loops over the rings). */
  _Atomic uint32_t nslots;
} area;

static area *shared;

/* ring.live (see there). */
enum { RING_FREE = 0, RING_LIVE = 1, RING_CLAIMING = 2 };

/* The rings a thread of this session had, at most (area.nslots). */
static uint32_t slots(void) {
  return atomic_load_explicit(&shared->nslots, memory_order_acquire);
}

static bool is_live(const ring *r) {
  return atomic_load_explicit(&r->live, memory_order_acquire) == RING_LIVE;
}

/* ring.leader_tid: written before the fork for the threads of the fork,
 * by the new thread for a thread started after it (threads, below), read
 * for messages and by role_of_this_call: relaxed atomic accesses. */
static pid_t tid_of(const ring *r) {
  return __atomic_load_n(&r->leader_tid, __ATOMIC_RELAXED);
}
static void set_tid(ring *r, pid_t tid) {
  __atomic_store_n(&r->leader_tid, tid, __ATOMIC_RELAXED);
}
/* The rings' mapping: MOLT__SHADOW_MAX_THREADS rings of ring_bytes each
 * (both written once, by the runtime thread before the first session, and
 * only read after: the session's start orders them before the program
 * threads' reads, as it orders the rings' headers). */
static char *ring_mem;
static uint64_t ring_bytes;
/* This process takes part in a session (process-local; release store when
 * a session starts, with every program thread parked, or in the follower
 * before its threads start; acquire load in every wrapper, inlined there
 * as molt__shadow_off(), shadow.h). */
_Atomic bool molt__shadow_active;
/* The other side is gone: each thread replays what its ring holds, then
 * runs alone (release store; acquire loads in the wrappers). */
static _Atomic bool alone;
/* The other side's process is dead, not merely dropped: set before
 * `alone` (whose release store and the consumers' acquire loads order it)
 * once its death was seen through the kernel; only then does a consumer
 * complete a read or write the other side was inside of (its intent). */
static _Atomic bool peer_dead;
/* Calls the other side died inside of, as this process completed them
 * (relaxed counters for status, molt__shadow_intents). */
static _Atomic uint64_t int_completed, int_nothing, int_uncertain, int_read_bytes,
    int_skipped_bytes;
/* The session's number, so that a thread's cached ring index is not taken
 * from an earlier session. */
static _Atomic uint32_t session;
static _Atomic pid_t follower_pid;
/* This process is the forked follower, side 1 (set before its program
 * threads start); the original process is side 0. */
static bool follower;
/* The rules of the session (shadow.c parses them on the runtime thread
 * before the fork, with no session running; the follower has its own copy
 * from the fork and only reads it). */
static molt__rules rules;
/* A rule of the follower's direction names a descriptor kind: the leader
 * records each call's (want_fd_kind: this side records them when it leads;
 * has_fd_kind: the other side's records carry them).  Process-local,
 * written before `active` is released. */
static bool want_fd_kind, has_fd_kind;

/* Whether a rule of direction dir names a descriptor kind. */
static bool names_fd_kind(unsigned dir) {
  for (uint32_t i = 0; i < rules.n; i++)
    if (rules.r[i].dir == dir && rules.r[i].fd_kind != MOLT__FDK_ANY)
      return true;
  return false;
}

/* The calling thread's ring: its index + 1 (0: none, which is what a
 * thread has from its start, so a thread the follower starts itself has
 * none), for the session my_session (leader). */
static __thread uint32_t my_session __attribute__((tls_model("initial-exec")));
static __thread unsigned my_ring1 __attribute__((tls_model("initial-exec")));
/* Follower: the record a readiness call is being retried on (its seq) and
 * since when (see retry()). */
static __thread uint64_t retry_seq __attribute__((tls_model("initial-exec")));
static __thread uint64_t retry_t0 __attribute__((tls_model("initial-exec")));
/* Follower: records of its ring it consumed ahead of the tail (their
 * positions; see find_on_fd()). */
#define AHEAD_MAX 32
static __thread uint64_t ahead[AHEAD_MAX] __attribute__((tls_model("initial-exec")));
static __thread unsigned nahead __attribute__((tls_model("initial-exec")));

/* Whether the record at position pos was consumed ahead of the tail
 * (forget: and drop it from the list, the tail passing it). */
static bool taken_ahead(uint64_t pos, bool forget) {
  for (unsigned i = 0; i < nahead; i++)
    if (ahead[i] == pos) {
      if (forget)
        ahead[i] = ahead[--nahead];
      return true;
    }
  return false;
}
/* The producer's copy of its ring's tail and the head past which it loads
 * the tail again (reserve()); both 0 at a session's start. */
#define TAIL_REFRESH (64u << 10)
static __thread uint64_t tail_seen __attribute__((tls_model("initial-exec")));
static __thread uint64_t refresh_at __attribute__((tls_model("initial-exec")));
/* The last early wrap's filler (reserve()): where it ends and its size. */
static __thread uint64_t hole_end __attribute__((tls_model("initial-exec")));
static __thread uint64_t hole_len __attribute__((tls_model("initial-exec")));
/* The thread produces its ring (leads); done: it runs alone for good. */
static __thread bool my_lead __attribute__((tls_model("initial-exec")));
static __thread bool my_done __attribute__((tls_model("initial-exec")));
/* A consumer whose producer died inside a read or write: that record (in
 * the ring, which nobody writes any more) until the thread's own call on
 * the descriptor completes it (finish_carry); carry_moved: the bytes the
 * dead call moved, as the kernel tells (-1: it cannot tell), carry_given:
 * those already given to the program. */
static __thread const rec *carry __attribute__((tls_model("initial-exec")));
static __thread int64_t carry_moved __attribute__((tls_model("initial-exec")));
static __thread int64_t carry_given __attribute__((tls_model("initial-exec")));

static unsigned my_side(void) { return follower ? 1u : 0u; }

/* The ring size MOLT_SHADOW_RING_BYTES asks for (bytes, or a number with
 * a K, M or G suffix): 0, or MOLT_EINVAL with err set. */
static int ring_size_from_env(uint64_t *bytes, char *err, size_t errlen) {
  const char *v = getenv("MOLT_SHADOW_RING_BYTES");
  *bytes = MOLT__SHADOW_RING_DEFAULT;
  if (!v || !*v)
    return 0;
  char *end = NULL;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  unsigned shift = 0;
  if (end != v && (*end == 'K' || *end == 'k'))
    shift = 10, end++;
  else if (end != v && (*end == 'M' || *end == 'm'))
    shift = 20, end++;
  else if (end != v && (*end == 'G' || *end == 'g'))
    shift = 30, end++;
  if (end == v || *end || errno || v[0] == '-' || n > (MOLT__SHADOW_RING_MAX >> shift) ||
      (n << shift) < MOLT__SHADOW_RING_MIN || (n << shift) % 4096) {
    molt__errmsg(err, errlen,
                 "MOLT_SHADOW_RING_BYTES='%.40s' in the target's environment is not a "
                 "ring size: a multiple of 4096 bytes from %llu K to %llu M (a K, M or G "
                 "suffix allowed)",
                 v, MOLT__SHADOW_RING_MIN >> 10, MOLT__SHADOW_RING_MAX >> 20);
    return MOLT_EINVAL;
  }
  *bytes = (uint64_t)n << shift;
  return 0;
}

int molt__shadow_area_get(char *err, size_t errlen) {
  if (shared) {
    /* No session runs (the caller checked): what the last one left in the
     * rings -- threads that never ran alone after it, a thread blocked
     * since -- is given back; the next session writes from the start. */
    madvise(ring_mem, (size_t)ring_bytes * MOLT__SHADOW_MAX_THREADS, MADV_REMOVE);
    return 0;
  }
  uint64_t bytes = 0;
  int rc = ring_size_from_env(&bytes, err, errlen);
  if (rc < 0)
    return rc;
  /* Virtual space only: MAP_NORESERVE shared pages are neither counted
   * against the commit limit nor backed until a ring writes them. */
  size_t rings_len = (size_t)bytes * MOLT__SHADOW_MAX_THREADS;
  void *m = mmap(NULL, rings_len, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    molt__errmsg(err, errlen,
                 "cannot map the shadow's rings (%d x %llu MiB of address space): %s "
                 "(MOLT_SHADOW_RING_BYTES in the target's environment sets a smaller "
                 "ring)",
                 MOLT__SHADOW_MAX_THREADS, (unsigned long long)(bytes >> 20),
                 strerror(errno));
    return MOLT_ENOMEM;
  }
  void *p = mmap(NULL, sizeof(area), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    munmap(m, rings_len);
    molt__errmsg(err, errlen, "cannot map the shadow's shared area: out of memory");
    return MOLT_ENOMEM;
  }
  ring_mem = m;
  ring_bytes = bytes;
  shared = p;
  for (size_t i = 0; i < MOLT__SHADOW_MAX_THREADS; i++)
    shared->rings[i].data = ring_mem + i * (size_t)bytes;
  return 0;
}

/* The calling thread runs alone for good and the other side's process is
 * dead: nobody reads or writes its ring any more (it is the ring's only
 * producer and consumer left, and it is between two calls: no read of its
 * own lands in the ring), so the ring's pages go back to the kernel.  Once
 * per session and thread. */
static __thread uint32_t my_given_back __attribute__((tls_model("initial-exec")));
static void give_back(ring *r) {
  uint32_t s = atomic_load_explicit(&session, memory_order_relaxed);
  if (my_given_back == s)
    return;
  my_given_back = s;
  madvise(r->data, (size_t)ring_bytes, MADV_REMOVE);
}

molt__rules *molt__shadow_rules(void) { return &rules; }

void molt__shadow_session_begin(const pid_t *tids, size_t n) {
  area *s = shared;
  want_fd_kind = names_fd_kind(MOLT__RULE_FORWARD);
  has_fd_kind = names_fd_kind(MOLT__RULE_REVERSE);
  atomic_store_explicit(&s->want, 0, memory_order_relaxed);
  atomic_store_explicit(&s->epoch, 0, memory_order_relaxed);
  atomic_store_explicit(&s->ready, 0, memory_order_relaxed);
  atomic_store_explicit(&s->leader_exited, 0, memory_order_relaxed);
  for (size_t i = 0; i < FD_TRACKED; i++) {
    atomic_store_explicit(&s->opened[i], 0, memory_order_relaxed);
    atomic_store_explicit(&s->closed[i], 0, memory_order_relaxed);
  }
  atomic_store_explicit(&alone, false, memory_order_relaxed);
  atomic_store_explicit(&peer_dead, false, memory_order_relaxed);
  for (size_t i = 0; i < n; i++) {
    ring *r = &s->rings[i];
    atomic_store_explicit(&r->intent, 0, memory_order_relaxed);
    atomic_store_explicit(&r->head, 0, memory_order_relaxed);
    atomic_store_explicit(&r->tail, 0, memory_order_relaxed);
    atomic_store_explicit(&r->seq, 0, memory_order_relaxed);
    atomic_store_explicit(&r->waiting, 0, memory_order_relaxed);
    atomic_store_explicit(&r->recorded, 0, memory_order_relaxed);
    atomic_store_explicit(&r->compared, 0, memory_order_relaxed);
    atomic_store_explicit(&r->max_use, 0, memory_order_relaxed);
    atomic_store_explicit(&r->applied, 0, memory_order_relaxed);
    atomic_store_explicit(&r->taken, 0, memory_order_relaxed);
    atomic_store_explicit(&r->handed, 0, memory_order_relaxed);
    set_tid(r, tids[i]);
  }
  s->nrings = (uint32_t)n;
  /* Every other slot free, with its counters at 0 (a slot's counters add
   * up over the threads that have it in one session). */
  for (size_t i = 0; i < MOLT__SHADOW_MAX_THREADS; i++) {
    ring *r = &s->rings[i];
    atomic_store_explicit(&r->live, i < n ? RING_LIVE : RING_FREE, memory_order_relaxed);
    atomic_store_explicit(&r->reused, 0, memory_order_relaxed);
    if (i >= n) {
      atomic_store_explicit(&r->recorded, 0, memory_order_relaxed);
      atomic_store_explicit(&r->compared, 0, memory_order_relaxed);
      atomic_store_explicit(&r->max_use, 0, memory_order_relaxed);
      atomic_store_explicit(&r->applied, 0, memory_order_relaxed);
    }
  }
  atomic_store_explicit(&s->nslots, (uint32_t)n, memory_order_relaxed);
  atomic_store_explicit(&s->clock, 1, memory_order_relaxed);
  molt__shadow_fds_begin(n);
  atomic_store_explicit(&s->kind, 0, memory_order_relaxed);
  atomic_store_explicit(&s->written, 0, memory_order_relaxed);
  s->text[0] = '\0';
  atomic_store_explicit(&follower_pid, 0, memory_order_relaxed);
  atomic_fetch_add_explicit(&session, 1, memory_order_relaxed);
  /* release: a thread that sees `active` sees the rings made above (the
   * program threads are parked anyway; the barrier orders it too). */
  atomic_store_explicit(&molt__shadow_active, true, memory_order_release);
}

void molt__shadow_session_follower(pid_t pid) {
  atomic_store_explicit(&follower_pid, pid, memory_order_relaxed);
  molt__shadow_fds_forked();
}

void molt__shadow_session_end(void) {
  atomic_store_explicit(&molt__shadow_active, false, memory_order_release);
  molt__shadow_fds_end();
}

static void wake_all(void);

void molt__shadow_session_peer_died(void) {
  /* relaxed: ordered before the consumers' reads by alone's release store */
  atomic_store_explicit(&peer_dead, true, memory_order_relaxed);
  molt__shadow_session_alone();
}

void molt__shadow_session_alone(void) {
  atomic_store_explicit(&alone, true, memory_order_release);
  wake_all();
  /* The original process: the follower is gone or being killed, and no
   * thread of ours records from now on -- its channels close (fds.c).  The
   * follower keeps its ends: it may still take descriptors from what its
   * rings hold. */
  if (!follower)
    molt__shadow_fds_end();
}

/* The backstop could be installed (trap.c): each thread arms it. */
static bool trap_ok;
/* The original process's form of trap_ok: the backstop was installed at
 * a promotion, so each thread of the old version arms it when it starts
 * to follow the new one (sync_backstop) and disarms it when it leads
 * again or runs alone.  Relaxed: stored on the runtime thread before the
 * release store of `want` that starts the handover, and read by a thread
 * only once it follows, after its acquire load of that `want`. */
static _Atomic bool old_trap_ok;

/* MOLT_SHADOW_BACKSTOP=off in the target's environment: the follower runs
 * without the backstop (the wrappers alone).  For measuring under
 * valgrind, which makes the guest's system calls from its own code: with
 * Syscall User Dispatch armed the kernel would trap those (SIGSYS). */
static bool backstop_off(void) {
  const char *v = getenv("MOLT_SHADOW_BACKSTOP");
  return v && strcmp(v, "off") == 0;
}

void molt__shadow_become_follower(void) {
  follower = true;
  trap_ok = !backstop_off() && molt__shadow_trap_install() == 0;
  /* The follower records when it leads, for the original process's
   * threads, which the reverse rules decide. */
  want_fd_kind = names_fd_kind(MOLT__RULE_REVERSE);
  has_fd_kind = names_fd_kind(MOLT__RULE_FORWARD);
  atomic_store_explicit(&alone, false, memory_order_relaxed);
  atomic_store_explicit(&peer_dead, false, memory_order_relaxed);
  atomic_store_explicit(&molt__shadow_active, true, memory_order_release);
}

void molt__shadow_follower_thread(size_t index, void *arg) {
  (void)arg;
  my_ring1 = (unsigned)index + 1;
  my_lead = false;
  my_done = false;
  /* Without Syscall User Dispatch (kernel before 5.11, or not x86-64)
   * the follower runs without the backstop, as the wrappers alone. */
  if (trap_ok)
    molt__shadow_trap_arm();
}

static bool hand_over(ring *r);

static molt__shadow_role role_of_this_call(void) {
  if (!atomic_load_explicit(&molt__shadow_active, memory_order_acquire))
    return MOLT__SHADOW_NONE;
  if (!follower) {
    uint32_t s = atomic_load_explicit(&session, memory_order_relaxed);
    if (my_session != s) {
      my_session = s;
      my_ring1 = 0;
      my_lead = true;
      my_done = false;
      carry = NULL;
      tail_seen = refresh_at = hole_end = hole_len = 0;
      pid_t tid = molt__gettid();
      /* Only the rings of the threads of the fork: a thread started later
       * was given its ring when it started (threads, below). */
      for (uint32_t i = 0; i < shared->nrings; i++)
        if (tid_of(&shared->rings[i]) == tid && is_live(&shared->rings[i]) &&
            !atomic_load_explicit(&shared->rings[i].reused, memory_order_relaxed))
          my_ring1 = i + 1;
    }
    if (!my_ring1)
      return MOLT__SHADOW_NONE;
  } else if (!my_ring1) {
    /* A thread the follower started: after a takeover it runs as any
     * thread; before, replay ends the follower (it is not followed). */
    return atomic_load_explicit(&alone, memory_order_acquire) ? MOLT__SHADOW_NONE
                                                              : MOLT__SHADOW_FOLLOWER;
  }
  /* A thread running alone with a call the dead side was inside of still
   * to complete goes through molt__shadow_replay (finish_carry). */
  if (my_done) {
    if (carry)
      return MOLT__SHADOW_FOLLOWER;
    /* acquire on alone orders peer_dead (stored before its release). */
    if (atomic_load_explicit(&alone, memory_order_acquire) &&
        atomic_load_explicit(&peer_dead, memory_order_relaxed))
      give_back(&shared->rings[my_ring1 - 1]);
    return MOLT__SHADOW_NONE;
  }
  if (!my_lead)
    return MOLT__SHADOW_FOLLOWER;
  /* The follower leading after a promotion: an old version that stopped
   * following (its report written) leaves it alone. */
  if (atomic_load_explicit(&alone, memory_order_acquire) ||
      (follower && atomic_load_explicit(&shared->written, memory_order_acquire))) {
    my_done = true;
    return MOLT__SHADOW_NONE;
  }
  if (atomic_load_explicit(&shared->want, memory_order_acquire) == my_side())
    return MOLT__SHADOW_LEADER;
  if (!hand_over(&shared->rings[my_ring1 - 1])) {
    my_done = true;
    return MOLT__SHADOW_NONE;
  }
  return MOLT__SHADOW_FOLLOWER;
}

/* The original process's thread: the backstop armed exactly while it
 * follows the promoted new version (SUD is per thread: only the thread
 * itself can turn it on or off, here at its followed calls).  Outside a
 * promotion a thread of this process is never armed: disarm is a load of
 * a thread-local flag then. */
static void sync_backstop(molt__shadow_role role) {
  if (role == MOLT__SHADOW_FOLLOWER && molt__shadow_follows()) {
    if (atomic_load_explicit(&old_trap_ok, memory_order_relaxed))
      molt__shadow_trap_arm(); /* -errno: no SUD, it follows without */
  } else {
    molt__shadow_trap_disarm();
  }
}

/* A thread for which a shadow no longer decides anything (NONE) makes its
 * calls itself.  In the follower that means it runs alone now (the leader
 * died, or a thread it started after the takeover): the backstop must let
 * its calls through whatever its last replay left the selector at -- a
 * close there deletes the descriptor's epoll registrations itself
 * (epoll.c), which the backstop refuses to a thread that still follows.
 * In the original process a thread is armed only while it follows a
 * promoted new version (sync_backstop). */
molt__shadow_role molt__shadow_role_now(void) {
  /* A follower's thread restarting in the new version (relaunched:
   * molt_is_updating() until its first update point) runs the new
   * version's start-up path, which the leader, resumed at its update
   * point, never runs: its calls there have no record to be compared with
   * (mosquitto's main seeds rand() from gettimeofday before it skips its
   * start-up).  It makes them itself, under the backstop as it is (BLOCK):
   * time, randomness and memory pass, I/O the leader does ends the
   * follower, named (trap.c). */
  if (follower && my_ring1 && !my_lead && molt_is_updating())
    return MOLT__SHADOW_NONE;
  molt__shadow_role role = role_of_this_call();
  if (role == MOLT__SHADOW_NONE && follower)
    molt__shadow_trap_allow();
  if (!follower)
    sync_backstop(role);
  return role;
}

/* ---- descriptions (the report) -----------------------------------------------*/

static const char *kind_name(unsigned k) { return molt__sc_name(k); }

/* Up to 48 bytes of p, quoted with C escapes. */
static void quote(char *buf, size_t len, const void *p, size_t n) {
  const unsigned char *c = p;
  size_t w = 0;
  if (len < 8)
    return;
  buf[w++] = '"';
  for (size_t i = 0; i < n && i < 48 && w + 6 < len; i++) {
    if (c[i] == '\n')
      w += (size_t)snprintf(buf + w, len - w, "\\n");
    else if (c[i] >= 0x20 && c[i] < 0x7f && c[i] != '"' && c[i] != '\\')
      buf[w++] = (char)c[i];
    else
      w += (size_t)snprintf(buf + w, len - w, "\\x%02x", c[i]);
  }
  if (n > 48 && w + 4 < len)
    w += (size_t)snprintf(buf + w, len - w, "...");
  if (w + 2 < len)
    buf[w++] = '"';
  buf[w] = '\0';
}

static void describe(char *buf, size_t len, unsigned kind, const int64_t *a,
                     const void *in, size_t in_keep, uint64_t in_len) {
  char q[256] = "";
  if (in)
    quote(q, sizeof q, in, in_keep);
  snprintf(buf, len, "%s(%" PRId64 ", %" PRId64 ", %" PRId64 ")%s%s", kind_name(kind),
           a[0], a[1], a[2], in ? " with " : "", q);
  if (in && in_len > in_keep)
    snprintf(buf + strlen(buf), len - strlen(buf), " (%" PRIu64 " bytes)", in_len);
}

static void thread_diverged(ring *r, const rec *x, const char *mine)
    __attribute__((noreturn));

/* ---- the report ----------------------------------------------------------------*/

static bool report(int kind, const char *fmt, va_list ap) {
  area *s = shared;
  int expected = 0;
  /* relaxed on failure: the loser writes nothing. */
  if (!atomic_compare_exchange_strong_explicit(
          &s->kind, &expected, kind, memory_order_relaxed, memory_order_relaxed))
    return false;
  vsnprintf(s->text, sizeof s->text, fmt, ap);
  /* release: the text is complete before a reader sees `written`. */
  atomic_store_explicit(&s->written, 1, memory_order_release);
  return true;
}

/* A thread of the original process that follows (after a promotion) and
 * can follow no more: the process keeps its pid and control socket and
 * cannot end, so the thread stops here for good; the new version, which
 * leads, sees the report and goes on alone. */
static void park_for_good(void) __attribute__((noreturn));
static void park_for_good(void) {
  for (;;) {
    struct timespec ts = {3600, 0};
    nanosleep(&ts, NULL);
  }
}

void molt__shadow_follower_fail(int kind, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  report(kind, fmt, ap);
  va_end(ap);
  if (!follower)
    park_for_good();
  _exit(111);
}

/* A leading thread drops the shadow: reports why and stops following.  In
 * the original process: it stops recording and kills the follower (the
 * monitor logs it when it reaps it).  In the follower leading after a
 * promotion: the old version (the original process, which cannot be
 * killed) is left behind, and the follower goes on alone. */
static void drop(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void drop(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  bool first = report(MOLT__SHADOW_END_DROPPED, fmt, ap);
  va_end(ap);
  if (follower) {
    molt__shadow_session_alone();
    return;
  }
  atomic_store_explicit(&molt__shadow_active, false, memory_order_release);
  pid_t pid = atomic_load_explicit(&follower_pid, memory_order_relaxed);
  if (first && pid > 0)
    kill(pid, SIGKILL);
}

void molt__shadow_drop(const char *fmt, ...) {
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  drop("%s", text);
}

bool molt__shadow_alone(void) {
  return atomic_load_explicit(&alone, memory_order_acquire);
}

/* Whether a leading thread still records (not dropped, not alone). */
static bool still_leading(void) {
  if (follower)
    return !atomic_load_explicit(&alone, memory_order_relaxed) &&
           !atomic_load_explicit(&shared->written, memory_order_relaxed);
  return atomic_load_explicit(&molt__shadow_active, memory_order_relaxed) &&
         !atomic_load_explicit(&alone, memory_order_relaxed);
}

int molt__shadow_report(char *text, size_t len) {
  area *s = shared;
  if (!s || !atomic_load_explicit(&s->written, memory_order_acquire))
    return 0;
  snprintf(text, len, "%s", s->text);
  return atomic_load_explicit(&s->kind, memory_order_relaxed);
}

void molt__shadow_counts(uint64_t *recorded, uint64_t *compared, unsigned *max_use_pct,
                         uint64_t *applied) {
  *recorded = *compared = *applied = 0;
  *max_use_pct = 0;
  area *s = shared;
  if (!s)
    return;
  uint64_t max = 0;
  for (uint32_t i = 0; i < slots(); i++) {
    ring *r = &s->rings[i];
    *recorded += atomic_load_explicit(&r->recorded, memory_order_relaxed);
    *compared += atomic_load_explicit(&r->compared, memory_order_relaxed);
    *applied += atomic_load_explicit(&r->applied, memory_order_relaxed);
    uint64_t m = atomic_load_explicit(&r->max_use, memory_order_relaxed);
    if (m > max)
      max = m;
  }
  /* Rounded up: a ring that holds anything shows at least 1%. */
  *max_use_pct = (unsigned)((max * 100 + ring_bytes - 1) / ring_bytes);
}

/* ---- the leader --------------------------------------------------------------*/

/* The hash a call's input is compared by (both sides run this libmolt):
 * FNV-1a's constants, eight bytes a step (a byte at a time cost the
 * leader ~50 instructions a call, P10), each step's product folded so
 * that every input bit reaches the low half; the length mixed in last. */
static uint64_t fnv1a(const void *p, size_t n) {
  const unsigned char *c = p;
  uint64_t h = 0xcbf29ce484222325ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, c + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 32;
  }
  for (; i < n; i++)
    h = (h ^ c[i]) * 0x100000001b3ull;
  return (h ^ n) * 0x100000001b3ull;
}

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* A call whose result is a new descriptor (fds.c passes it). */
static bool creates_fd(unsigned kind) {
  return kind == MOLT__SC_ACCEPT || kind == MOLT__SC_ACCEPT4 || kind == MOLT__SC_SOCKET ||
         kind == MOLT__SC_OPEN || kind == MOLT__SC_OPENAT ||
         kind == MOLT__SC_EPOLL_CREATE;
}

/* An epoll wait (epoll.c translates its events). */
static bool is_epoll_wait(unsigned kind) {
  return kind == MOLT__SC_EPOLL_WAIT || kind == MOLT__SC_EPOLL_PWAIT ||
         kind == MOLT__SC_EPOLL_PWAIT2;
}

/* A receive that leaves its bytes in the socket (MSG_PEEK in its flags,
 * a[2]). */
static bool is_peek(unsigned kind, const int64_t *a) {
  return (kind == MOLT__SC_RECV || kind == MOLT__SC_RECVFROM ||
          kind == MOLT__SC_RECVMSG) &&
         (a[2] & MSG_PEEK);
}

static void futex_wake(_Atomic uint32_t *w) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, 1, NULL, NULL, 0);
}

static void futex_wait_us(_Atomic uint32_t *w, uint32_t seen, long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, seen, &ts, NULL, 0);
}

/* ring.waiting: how the consumer waits. */
#define WAIT_NONE 0u
#define WAIT_NAP 1u   /* a nap that ends by its timeout: no wake needed */
#define WAIT_SLEEP 2u /* the producer wakes it at its next record */
/* A consumer that finds its ring empty naps, first NAP_MIN_US, twice as
 * long after each nap that brought nothing, and once past NAP_MAX_US
 * sleeps until the producer wakes it (at most SLEEP_US, then it looks
 * again).  Under load the producer thus makes no system call for its
 * consumer: a futex wake at every record cost the leader ~7 us of CPU per
 * request of kvs and the follower as much (P10, bench/RESULTS.md); the
 * consumer takes the records in batches, up to NAP_MAX_US behind. */
#define NAP_MIN_US 500
#define NAP_MAX_US 2000
#define SLEEP_US 100000
static __thread uint32_t nap_us __attribute__((tls_model("initial-exec")));

/* The consumer found nothing past `head` in its ring: waits for the
 * producer (or a wake of wake_all()), by a nap or a sleep (above). */
static void consumer_wait(ring *r, uint64_t head) {
  if (nap_us < NAP_MIN_US)
    nap_us = NAP_MIN_US;
  bool sleep = nap_us > NAP_MAX_US;
  /* seq read before waiting is stored: a bump after our store is one the
   * futex sees (the wait returns at once) */
  uint32_t seen = atomic_load_explicit(&r->seq, memory_order_seq_cst);
  /* seq_cst store, then seq_cst load of head: with the producer's seq_cst
   * store of head and load of waiting, one of us sees the other's store
   * (Dekker): either the record is seen here, or the producer sees
   * WAIT_SLEEP and wakes us.  A nap may miss a record: it ends anyway. */
  atomic_store_explicit(&r->waiting, sleep ? WAIT_SLEEP : WAIT_NAP, memory_order_seq_cst);
  if (atomic_load_explicit(&r->head, memory_order_seq_cst) == head)
    futex_wait_us(&r->seq, seen, sleep ? SLEEP_US : (long)nap_us);
  /* relaxed: a stale WAIT_* seen by the producer costs one needless wake */
  atomic_store_explicit(&r->waiting, WAIT_NONE, memory_order_relaxed);
  /* relaxed: only whether something came matters here; next_record reads
   * head again with acquire before it reads a record */
  if (atomic_load_explicit(&r->head, memory_order_relaxed) != head)
    nap_us = NAP_MIN_US;
  else if (nap_us <= NAP_MAX_US)
    nap_us *= 2;
}

/* What descriptor a call's first argument is (poll's is a count). */
static molt__fd_kind fd_kind_of(unsigned kind, int64_t fd) {
  struct stat st;
  if (kind == MOLT__SC_POLL || fd < 0 || fd > INT32_MAX || fstat((int)fd, &st) < 0)
    return MOLT__FDK_ANY;
  if (S_ISSOCK(st.st_mode))
    return MOLT__FDK_SOCKET;
  if (S_ISREG(st.st_mode))
    return MOLT__FDK_FILE;
  if (S_ISFIFO(st.st_mode))
    return MOLT__FDK_PIPE;
  return MOLT__FDK_ANY;
}

/* Pages of a ring are given back in chunks of this size as the consumer
 * passes them, but for the first (rings smaller than 4 chunks keep all
 * theirs): trim_behind(). */
#define TRIM_CHUNK (1u << 20)
static bool trimmed(void) {
  return ring_bytes >= 4u * TRIM_CHUNK && ring_bytes % TRIM_CHUNK == 0;
}

/* Room for a record of `size` bytes at the ring's head (SKIP filler
 * written): its address, *end the head once it is published; NULL if the
 * shadow was dropped meanwhile. */
static rec *reserve(ring *r, size_t size, uint64_t *end) {
  /* Only this thread writes head while it produces: relaxed.  (A thread
   * that has just taken a HANDOVER read head with acquire there.) */
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
  size_t pos = (size_t)(head % ring_bytes);
  size_t skip = pos + size > ring_bytes ? ring_bytes - pos : 0;
  /* Past the first chunk of a ring whose consumer keeps up (what it has
   * not consumed, and this record, fit before pos): back to the ring's
   * start, whose pages the consumer keeps (trim_behind()), instead of on
   * into pages it gave back, which the kernel would fault in and zero
   * again for both processes -- 0.08 faults per request of kvs in the
   * leader and half as many in the follower (P10).  The SKIP filler
   * takes the rest of the ring.  tail_seen is at most the tail: the room
   * it shows is there. */
  if (!skip && pos >= TRIM_CHUNK && trimmed() && head - tail_seen + size <= pos) {
    skip = ring_bytes - pos;
    hole_end = head + skip;
    hole_len = skip;
  }
  uint64_t need = skip + size;
  uint64_t t0 = 0;
  /* The tail as last loaded: the room it shows is there (the tail only
   * grows within a session), so the consumer's line is read again only
   * when that room runs short, or every refresh bytes (for the ring's use
   * in status). */
  if (head + need - tail_seen <= ring_bytes && head + need < refresh_at)
    goto room;
  for (;;) {
    /* acquire: the follower is done reading the bytes we reuse. */
    tail_seen = atomic_load_explicit(&r->tail, memory_order_acquire);
    uint64_t refresh = ring_bytes / 16 < TAIL_REFRESH ? ring_bytes / 16 : TAIL_REFRESH;
    refresh_at = head + need + refresh;
    /* relaxed: a counter for status, written by this thread alone: the
     * backlog and this reservation, less the early wrap's filler if the tail
     * has not passed it yet (a filler holds nothing; at most one lies
     * between tail and head, an early wrap needing a backlog below 1 MiB) */
    uint64_t use = head + need - tail_seen - (tail_seen < hole_end ? hole_len : 0);
    if (use > atomic_load_explicit(&r->max_use, memory_order_relaxed))
      atomic_store_explicit(&r->max_use, use, memory_order_relaxed);
    if (head + need - tail_seen <= ring_bytes)
      break;
    if (!still_leading())
      return NULL; /* dropped meanwhile */
    uint64_t now = molt__now_ns();
    if (!t0)
      t0 = now;
    else if (now - t0 > (uint64_t)MOLT__SHADOW_FULL_WAIT_MS * 1000000u) {
      drop(
          "the ring of thread %d stayed full for %d ms (the follower fell behind by "
          "%" PRIu64 " bytes; ring %d, handover %u, released %u); the shadow was dropped",
          (int)molt__gettid(), MOLT__SHADOW_FULL_WAIT_MS, head - tail_seen,
          (int)(r - shared->rings), atomic_load_explicit(&r->taken, memory_order_relaxed),
          atomic_load_explicit(&shared->ready, memory_order_relaxed));
      return NULL;
    }
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
room:
  if (skip) {
    rec *f = (rec *)(r->data + pos);
    f->size = (uint32_t)skip;
    f->kind = MOLT__SC_SKIP;
    pos = 0;
  }
  *end = head + need;
  return (rec *)(r->data + pos);
}

/* One more record for status: relaxed, and a load and a store, not a
 * locked add (the producer is the counter's only writer). */
static void count_record(ring *r) {
  atomic_store_explicit(&r->recorded,
                        atomic_load_explicit(&r->recorded, memory_order_relaxed) + 1,
                        memory_order_relaxed);
}

/* Publishes the records up to end and wakes the consumer if it sleeps
 * (not if it naps: consumer_wait). */
static void publish(ring *r, uint64_t end) {
  /* release: the record's bytes before the new head (the consumer's
   * acquire load); seq_cst for the futex handshake (see struct ring). */
  atomic_store_explicit(&r->head, end, memory_order_seq_cst);
  if (atomic_load_explicit(&r->waiting, memory_order_seq_cst) == WAIT_SLEEP) {
    /* The consumer read seq before it stored WAIT_SLEEP, which we saw
     * (seq_cst: that store is ordered before this bump), so its futex
     * wait sees the new value if it has not begun yet. */
    atomic_fetch_add_explicit(&r->seq, 1, memory_order_seq_cst);
    futex_wake(&r->seq);
  }
}

/* ---- byte totals: what a read or write the leader died inside of moved -----------*/

/* TCP states (tcpi_state, the kernel's include/net/tcp_states.h). */
enum {
  TCPS_FIN_WAIT1 = 4,
  TCPS_FIN_WAIT2 = 5,
  TCPS_TIME_WAIT = 6,
  TCPS_CLOSE = 7,
  TCPS_CLOSE_WAIT = 8,
  TCPS_LAST_ACK = 9,
  TCPS_CLOSING = 11
};

/* The kernel's running totals of a TCP socket (shared by every process
 * holding it, so they outlive the leader): tot[0] the bytes consumed from
 * it (read by anyone) and tot[1] the bytes written to it, since it was
 * made.  tcpi_bytes_received counts what arrived in order and SIOCINQ
 * what of it nobody read yet; tcpi_bytes_acked what the peer acknowledged
 * and SIOCOUTQ what was written but not acknowledged yet (Linux 4.19 and
 * later).  A FIN counts one in the first pair once received and one in
 * the second once sent; it is taken out by the state.  A socket's SYN may
 * count one in tot[1]; it is there before any write, so it cancels out
 * against a base measured the same way.  false: not a TCP socket, or a
 * state where the totals cannot be told (closed). */
static bool tcp_totals(int fd, uint64_t tot[2]) {
  struct tcp_info ti;
  socklen_t len = sizeof ti;
  memset(&ti, 0, sizeof ti);
  if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0 ||
      len <
          offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
    return false;
  int inq = 0, outq = 0;
  if (ti.tcpi_state == TCPS_CLOSE || ioctl(fd, SIOCINQ, &inq) < 0 ||
      ioctl(fd, SIOCOUTQ, &outq) < 0 || inq < 0 || outq < 0)
    return false;
  unsigned st = ti.tcpi_state;
  bool fin_in = st == TCPS_CLOSE_WAIT || st == TCPS_LAST_ACK || st == TCPS_CLOSING ||
                st == TCPS_TIME_WAIT;
  bool fin_out = st == TCPS_FIN_WAIT1 || st == TCPS_FIN_WAIT2 || st == TCPS_CLOSING ||
                 st == TCPS_LAST_ACK || st == TCPS_TIME_WAIT;
  tot[0] = ti.tcpi_bytes_received - (uint64_t)inq - fin_in;
  tot[1] = ti.tcpi_bytes_acked + (uint64_t)outq - fin_out;
  return true;
}

static fd_total *totals_of(int64_t fd, int dir) {
  return fd >= 0 && fd < FD_TOTALS ? &shared->totals[fd][dir] : NULL;
}

static uint64_t session_tag(void) {
  return (uint64_t)atomic_load_explicit(&session, memory_order_relaxed) << 2;
}

/* The leader's record of a call that creates or closes a descriptor: its
 * totals start again (relaxed: see fd_total).  A socket a followed accept
 * made has moved nothing yet, nor has the kernel counted anything for it
 * (a passive socket's SYN counts in neither total); a file is no TCP
 * socket; a close, or a socket() (its SYN may count), leaves the total to
 * be measured at its first use. */
static void note_totals(unsigned kind, int64_t fd_arg, int64_t ret) {
  int64_t fd = kind == MOLT__SC_CLOSE ? fd_arg : ret;
  if (fd < 0 || fd >= FD_TOTALS || (kind == MOLT__SC_CLOSE && ret != 0) ||
      (kind != MOLT__SC_CLOSE && !creates_fd(kind)))
    return;
  uint64_t tag = 0;
  if (kind == MOLT__SC_ACCEPT || kind == MOLT__SC_ACCEPT4)
    tag = session_tag() | TOT_KNOWN;
  else if (kind == MOLT__SC_OPEN || kind == MOLT__SC_OPENAT)
    tag = session_tag() | TOT_NONE;
  for (int dir = 0; dir < 2; dir++) {
    fd_total *t = &shared->totals[fd][dir];
    atomic_store_explicit(&t->total, 0, memory_order_relaxed);
    atomic_store_explicit(&t->tag, tag, memory_order_relaxed);
  }
}

/* The leader's total for fd in direction dir before its call (measured
 * from the kernel at the first use in this session): *base; false if the
 * kernel keeps none (not a TCP socket) or fd is out of the table. */
static bool base_of(int64_t fd, int dir, uint64_t *base) {
  fd_total *t = totals_of(fd, dir);
  if (!t)
    return false;
  uint64_t want = session_tag();
  uint64_t tag = atomic_load_explicit(&t->tag, memory_order_relaxed);
  if ((tag & ~(uint64_t)3) != want || !(tag & 3)) {
    uint64_t tot[2] = {0, 0};
    tag = want | (tcp_totals((int)fd, tot) ? TOT_KNOWN : TOT_NONE);
    atomic_store_explicit(&t->total, tot[dir], memory_order_relaxed);
    atomic_store_explicit(&t->tag, tag, memory_order_relaxed);
  }
  *base = atomic_load_explicit(&t->total, memory_order_relaxed);
  return (tag & 3) == TOT_KNOWN;
}

void molt__shadow_record(const molt__sc *c, int64_t ret, int err, size_t out_len) {
  /* A follower's call that it made itself: it has just become the leader
   * (its record follows), or runs alone (no record). */
  if (!my_ring1 || !my_lead || my_done)
    return;
  note_totals(c->kind, c->a[0], ret);
  ring *r = &shared->rings[my_ring1 - 1];
  size_t keep = c->in_len < MOLT__SHADOW_IN_KEEP ? c->in_len : MOLT__SHADOW_IN_KEEP;
  size_t size = sizeof(rec) + align8(keep) + align8(out_len) + align8(c->aux_len);
  if (size > MOLT__SHADOW_REC_MAX) {
    drop("thread %d: %s of %zu bytes is too large to record (at most %u); the shadow "
         "was dropped",
         (int)molt__gettid(), kind_name(c->kind), out_len + keep,
         (unsigned)MOLT__SHADOW_REC_MAX);
    return;
  }
  uint64_t end = 0;
  rec *x = reserve(r, size, &end);
  if (!x)
    return;
  /* A descriptor the call created goes to the follower before the record
   * that names it is published (fds.c). */
  uint32_t gen = c->fd_gen;
  if (creates_fd(c->kind) && ret >= 0) {
    int rc = molt__shadow_fd_created(my_ring1 - 1, (int)ret, &gen);
    /* The channel closed because the session is over (molt rollback or
     * commit ran molt__shadow_session_alone after this thread saw itself
     * lead): nothing to follow, nothing to drop. */
    if (rc == -ENOTCONN && !still_leading())
      return;
    if (rc < 0) {
      drop("thread %d: descriptor %d, which %s created, could not be sent to the "
           "follower (%s); the shadow was dropped",
           (int)molt__gettid(), (int)ret, kind_name(c->kind), strerror(-rc));
      return;
    }
  }
  *x = (rec){.size = (uint32_t)size,
             .kind = (uint16_t)c->kind,
             .ret = ret,
             .err = err,
             .in_keep = (uint32_t)keep,
             .in_len = c->in_len,
             .in_hash = c->in ? fnv1a(c->in, c->in_len) : 0,
             .out_len = (uint32_t)out_len,
             .fd_gen = gen,
             .aux_len = (uint32_t)c->aux_len,
             .seq = atomic_fetch_add_explicit(&shared->clock, 1, memory_order_relaxed)};
  memcpy(x->a, c->a, sizeof x->a);
  /* (Not of a close: the descriptor is gone, its number may be another
   * thread's new one already; the follower looks at its own copy.) */
  if (want_fd_kind && c->kind != MOLT__SC_CLOSE)
    x->fd_kind = (uint16_t)fd_kind_of(c->kind, c->a[0]);
  char *p = (char *)(x + 1);
  if (keep)
    memcpy(p, c->in, keep);
  if (out_len)
    memcpy(p + align8(keep), c->out, out_len);
  if (c->aux_len)
    memcpy(p + align8(keep) + align8(out_len), c->aux, c->aux_len);
  count_record(r);
  publish(r, end);
}

/* ---- the leader's reads and writes: intents ---------------------------------------
 * The window between a call and its record: the leader's process may die
 * (SIGKILL, a crash) after the kernel made its read or write and before
 * the record is published.  So for read, recv, write and send the record
 * is reserved and its header written before the call, and marked as the
 * ring's intent; a read's bytes land in the record's payload (shared
 * memory: they outlive the leader) and are copied to the caller's buffer
 * after.  A consumer that finds the mark at the head of its drained ring
 * once the producer died asks the kernel how many bytes the dead call
 * moved (tcp_totals against the base in the header) and completes the call
 * (finish_carry). */

bool molt__shadow_intent_begin(const molt__sc *c, molt__shadow_intent *it) {
  it->x = NULL;
  if (!my_ring1 || !my_lead || my_done)
    return false;
  int buffer = molt__sc_buffer(c->kind);
  size_t keep = buffer == 2 && c->in_len > MOLT__SHADOW_IN_KEEP ? MOLT__SHADOW_IN_KEEP
                : buffer == 2                                   ? c->in_len
                                                                : 0;
  size_t cap = buffer == 1 ? c->out_cap : 0;
  size_t size = sizeof(rec) + align8(keep) + align8(cap) + align8(c->aux_len);
  /* Larger reads are recorded after the call, as other calls are (the
   * window stays open for them: design §17). */
  if (size > MOLT__SHADOW_REC_MAX)
    return false;
  ring *r = &shared->rings[my_ring1 - 1];
  uint64_t end = 0;
  rec *x = reserve(r, size, &end);
  if (!x)
    return false;
  int dir = buffer == 1 ? 0 : 1;
  bool peek = is_peek(c->kind, c->a);
  uint64_t base = 0;
  bool ok = !peek && base_of(c->a[0], dir, &base);
  *x = (rec){.size = (uint32_t)size,
             .kind = (uint16_t)c->kind,
             .in_keep = (uint32_t)keep,
             .in_len = c->in_len,
             .in_hash = c->in ? fnv1a(c->in, c->in_len) : 0,
             .base_ok = ok,
             .base = base};
  memcpy(x->a, c->a, sizeof x->a);
  if (want_fd_kind)
    x->fd_kind = (uint16_t)fd_kind_of(c->kind, c->a[0]);
  if (keep)
    memcpy(x + 1, c->in, keep);
  it->x = x;
  it->end = end;
  it->reserved = size;
  it->data = buffer == 1 ? (char *)(x + 1) : NULL;
  it->total = ok ? totals_of(c->a[0], dir) : NULL;
  it->aux = c->aux;
  it->aux_len = c->aux_len;
  /* release: the header above before the mark; the system call comes
   * after it in this thread (see ring.intent). */
  atomic_store_explicit(&r->intent, end - size + 1, memory_order_release);
  return true;
}

void molt__shadow_intent_end(molt__shadow_intent *it, int64_t ret, int err) {
  rec *x = it->x;
  ring *r = &shared->rings[my_ring1 - 1];
  size_t out_len = it->data && ret > 0 ? (size_t)ret : 0;
  /* A datagram's MSG_TRUNC result counts bytes that were not read: the
   * record keeps those read, at most what was reserved for them. */
  size_t room = it->reserved - sizeof(rec) - align8(x->in_keep) - align8(it->aux_len);
  if (out_len > room)
    out_len = room;
  size_t size = sizeof(rec) + align8(x->in_keep) + align8(out_len) + align8(it->aux_len);
  /* The call moved ret bytes: the total the next call's base starts from
   * (relaxed: see fd_total). */
  if (it->total && ret > 0)
    atomic_fetch_add_explicit(&((fd_total *)it->total)->total, (uint64_t)ret,
                              memory_order_relaxed);
  x->size = (uint32_t)size;
  x->ret = ret;
  x->err = err;
  x->out_len = (uint32_t)out_len;
  /* The aux results after the bytes read (within the reservation: out_len
   * is at most the capacity reserved before them). */
  x->aux_len = (uint32_t)it->aux_len;
  if (it->aux_len)
    memcpy((char *)(x + 1) + align8(x->in_keep) + align8(out_len), it->aux, it->aux_len);
  x->seq = atomic_fetch_add_explicit(&shared->clock, 1, memory_order_relaxed);
  count_record(r);
  /* The unused part of the reservation is given back: the record ends
   * where its bytes end.  Publishing makes the mark stale (below head). */
  publish(r, it->end - it->reserved + size);
}

/* A leading thread hands its ring over (`want` names the other side): a
 * HANDOVER record instead of its current call, then it waits until the
 * other side has replayed everything up to it, so that it consumes from
 * there.  false: the other side is gone (or the shadow was dropped)
 * meanwhile, and the thread runs alone. */
static bool hand_over(ring *r) {
  uint32_t e = atomic_load_explicit(&shared->epoch, memory_order_relaxed);
  uint64_t end = 0;
  rec *x = reserve(r, sizeof(rec), &end);
  if (!x)
    return false;
  *x = (rec){.size = sizeof(rec), .kind = REC_HANDOVER, .a = {e, 0, 0}};
  publish(r, end);
  my_lead = false;
  for (;;) {
    /* acquire: pairs with the consumer's release store of tail after it
     * took the HANDOVER; from here this thread writes tail. */
    if (atomic_load_explicit(&r->tail, memory_order_acquire) == end)
      break;
    if (atomic_load_explicit(&alone, memory_order_acquire))
      return false;
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  atomic_store_explicit(&r->handed, e, memory_order_release);
  /* Then until the operation releases the handover: what it wrote for the
   * following side (the original's inherited set) is ordered before this
   * thread's replays in this process too, not only through the other
   * process's records (acquire, pairing with its release of ready).  The
   * first record comes after that anyway. */
  while (atomic_load_explicit(&shared->ready, memory_order_acquire) < e) {
    if (atomic_load_explicit(&alone, memory_order_acquire))
      return false;
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  return true;
}

/* ---- the follower --------------------------------------------------------------*/

/* The first forward rule with this action matching a call of `kind` on a
 * descriptor of kind fdk whose buffer is bytes[0..n) (NULL: no buffer). */
static const molt__rule *rule_for(int action, unsigned kind, unsigned fdk,
                                  const void *bytes, size_t n) {
  /* The forked follower follows the old version under the forward rules;
   * the original process follows the new one (promoted) under the reverse
   * rules. */
  unsigned dir = follower ? MOLT__RULE_FORWARD : MOLT__RULE_REVERSE;
  for (uint32_t i = 0; i < rules.n; i++) {
    const molt__rule *r = &rules.r[i];
    if (r->dir != dir || r->action != action)
      continue;
    if (r->call != MOLT__SC_SKIP && r->call != kind)
      continue;
    if (r->fd_kind != MOLT__FDK_ANY && r->fd_kind != fdk)
      continue;
    if (r->has_pattern && (!bytes || !molt__rule_matches(r, bytes, n)))
      continue;
    return r;
  }
  return NULL;
}

/* A write the follower's thread made outside the wrappers (libc's own, as
 * fprintf's to a log file opened before the fork) has no record on either
 * side: the leader's was not seen either.  A forward `drop` rule naming it
 * (`forward write file drop`) says the leader's copy is the one that
 * counts: not made here.  After a promotion the old version's thread,
 * armed too, is decided by a reverse rule (rule_for's direction).  Called
 * from the SIGSYS handler: rule_for and fd_kind_of allocate nothing and
 * take no lock. */
bool molt__shadow_trap_drops(unsigned kind, int64_t fd, const void *bytes, size_t n) {
  if (!rules.n || !my_ring1)
    return false;
  if (!rule_for(MOLT__RULE_DROP, kind, fd_kind_of(kind, fd), bytes, n))
    return false;
  atomic_fetch_add_explicit(&shared->rings[my_ring1 - 1].applied, 1,
                            memory_order_relaxed);
  return true;
}

/* The bytes a rule's pattern looks at in the leader's record: the data an
 * input call got, the (kept) bytes an output call passed. */
static const void *rec_bytes(const rec *x, size_t *n) {
  const char *kept = (const char *)(x + 1);
  int b = molt__sc_buffer(x->kind);
  if (b == 1 && x->ret >= 0) {
    *n = x->out_len;
    return kept + align8(x->in_keep);
  }
  if (b == 2) {
    *n = x->in_keep;
    return kept;
  }
  *n = 0;
  return NULL;
}

/* The consumer moves its tail from old_tail to new_tail (before it
 * publishes new_tail, once it is done with the record between them: the
 * chunk given back may hold that record's first bytes): a chunk of the
 * ring the tail has just left behind is given back (MADV_REMOVE), so that
 * a ring costs memory for what it holds, not for every byte it ever held
 * -- except its first chunk, the warm one the producer comes back to
 * while the consumer keeps up (reserve()).  Safe: its bytes are consumed
 * (records taken ahead lie beyond the tail), the producer reads none of
 * its records once published, and it writes there again only after it
 * sees the new tail -- the release store that follows this call, which
 * the madvise() precedes.  A page written again is a fresh zero page. */
static void trim_behind(ring *r, uint64_t old_tail, uint64_t new_tail) {
  if (!trimmed() || old_tail / TRIM_CHUNK == new_tail / TRIM_CHUNK)
    return;
  /* A record is at most MOLT__SHADOW_REC_MAX < TRIM_CHUNK bytes, so the
   * chunk where old_tail lies is wholly consumed; a SKIP filler may pass
   * more chunks, which this lap did not write (given back on an earlier
   * lap, or never written). */
  uint64_t chunk = (old_tail / TRIM_CHUNK) * TRIM_CHUNK;
  if (chunk % ring_bytes)
    madvise(r->data + chunk % ring_bytes, TRIM_CHUNK, MADV_REMOVE);
}

/* Waits for the ring's next record (SKIP fillers passed): its address;
 * NULL when the other side is gone and the ring is empty. */
static rec *next_record(ring *r, uint64_t *tailp) {
  uint64_t tail = *tailp;
  for (;;) {
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    if (head == tail) {
      if (atomic_load_explicit(&alone, memory_order_acquire)) {
        /* acquire again: the other side's last records, published before
         * it was found gone, are seen (nothing is published after). */
        if (atomic_load_explicit(&r->head, memory_order_acquire) == tail)
          return NULL;
        continue;
      }
      /* The original process following a new version that went on alone:
       * nothing more will come. */
      if (!follower && atomic_load_explicit(&shared->written, memory_order_acquire))
        park_for_good();
      consumer_wait(r, tail);
      continue;
    }
    rec *x = (rec *)(r->data + tail % ring_bytes);
    if (x->kind == MOLT__SC_SKIP || (nahead && taken_ahead(tail, true))) {
      uint64_t next = tail + x->size; /* read before the trim (consume()) */
      trim_behind(r, tail, next);
      tail = next;
      atomic_store_explicit(&r->tail, tail, memory_order_release);
      continue;
    }
    *tailp = tail;
    return x;
  }
}

/* Whether the descriptor the call of x created is close-on-exec. */
static bool wants_cloexec(const rec *x) {
  switch (x->kind) {
  case MOLT__SC_ACCEPT4:
  case MOLT__SC_SOCKET:
    return x->a[1] & SOCK_CLOEXEC;
  case MOLT__SC_OPEN:
    return x->a[0] & O_CLOEXEC;
  case MOLT__SC_OPENAT:
    return x->a[1] & O_CLOEXEC;
  case MOLT__SC_EPOLL_CREATE: /* epoll_create1's EPOLL_CLOEXEC is O_CLOEXEC */
    return x->a[0] == 1 && (x->a[1] & O_CLOEXEC);
  default:
    return false;
  }
}

/* The original process following the new version (promoted): descriptors
 * the new version created (a replayed accept, socket, open) and not yet
 * closed.  They are passed to the original process (fds.c), but under the
 * new version's generations, not the original's own numbering (`made`), so
 * it cannot lead again while any is open: the absent-descriptor refusal of
 * molt rollback and molt commit. */
static void raise_to(_Atomic uint32_t *v, uint32_t gen) {
  uint32_t cur = atomic_load_explicit(v, memory_order_relaxed);
  /* relaxed: the operation reads the values after `taken` (release/acquire) */
  while (cur < gen && !atomic_compare_exchange_weak_explicit(
                          v, &cur, gen, memory_order_relaxed, memory_order_relaxed))
    ;
}

static void note_absent(const rec *x) {
  int64_t fd = x->kind == MOLT__SC_CLOSE ? x->a[0] : x->ret;
  if (fd < 0 || fd >= FD_TRACKED || x->fd_gen == 0)
    return;
  if (creates_fd(x->kind) && x->ret >= 0)
    raise_to(&shared->opened[fd], x->fd_gen);
  else if (x->kind == MOLT__SC_CLOSE && x->ret == 0)
    raise_to(&shared->closed[fd], x->fd_gen);
}

/* Done with record x at tail: in the follower, a descriptor it created is
 * placed, one it closed is closed (fds.c); in the original process
 * following after a promotion, one the new version created is noted as
 * absent and one it closed is closed here if both hold it (the set
 * molt__shadow_note_shared_with made); then the producer may reuse its
 * bytes. */
/* The generation the last record this thread consumed carried (epoll.c
 * tells descriptors reused out of order apart by it). */
static __thread uint32_t replayed_gen __attribute__((tls_model("initial-exec")));

uint32_t molt__shadow_replayed_fd_gen(void) { return replayed_gen; }

static void consume(ring *r, uint64_t *tail, const rec *x, uint64_t pos, uint64_t n) {
  replayed_gen = x->fd_gen;
  if (!follower) {
    note_absent(x);
    /* generation 0: a descriptor the new version did not create (fds.c);
     * else one it created and passed here (placed below), closed when it
     * closed that generation. */
    if (creates_fd(x->kind) && x->ret >= 0)
      molt__shadow_fd_take((unsigned)(r - shared->rings), (int)x->ret, x->fd_gen,
                           wants_cloexec(x));
    else if (x->kind == MOLT__SC_CLOSE && x->ret == 0)
      molt__shadow_fd_release((int)x->a[0],
                              x->fd_gen == 0 ? MOLT__SHADOW_ANY_GEN : x->fd_gen);
  } else if (creates_fd(x->kind) && x->ret >= 0) {
    molt__shadow_fd_take((unsigned)(r - shared->rings), (int)x->ret, x->fd_gen,
                         wants_cloexec(x));
  } else if (x->kind == MOLT__SC_CLOSE && x->ret == 0) {
    molt__shadow_fd_release((int)x->a[0], x->fd_gen);
  }
  atomic_store_explicit(&r->compared, n, memory_order_relaxed);
  if (pos != *tail) { /* taken ahead: the tail passes it later */
    ahead[nahead++] = pos;
    return;
  }
  /* x's size read before the trim, which may give back its first bytes. */
  uint64_t next = *tail + x->size;
  trim_behind(r, *tail, next);
  *tail = next;
  /* release: we are done with the record's bytes before the leader may
   * overwrite them (its acquire load of tail). */
  atomic_store_explicit(&r->tail, *tail, memory_order_release);
}

/* A call on one descriptor (its first argument). */
static bool on_fd(unsigned kind) {
  switch (kind) {
  case MOLT__SC_READ:
  case MOLT__SC_WRITE:
  case MOLT__SC_RECV:
  case MOLT__SC_SEND:
  case MOLT__SC_READV:
  case MOLT__SC_WRITEV:
  case MOLT__SC_RECVFROM:
  case MOLT__SC_SENDTO:
  case MOLT__SC_RECVMSG:
  case MOLT__SC_SENDMSG:
  case MOLT__SC_ACCEPT:
  case MOLT__SC_ACCEPT4:
  case MOLT__SC_CLOSE:
    return true;
  default:
    return false;
  }
}

/* A call that reads the time or random bytes. */
static bool is_time(unsigned kind) {
  return kind == MOLT__SC_CLOCK_GETTIME || kind == MOLT__SC_GETTIMEOFDAY ||
         kind == MOLT__SC_TIME || kind == MOLT__SC_GETRANDOM;
}

/* The follower's call c is on another descriptor than the record at the
 * tail: the record of the same call on c's descriptor further on, before
 * the thread's next readiness call and before any other call on that
 * descriptor (its position in *pos), waiting for the leader's thread to
 * record it (up to MOLT__SHADOW_RETRY_MS; a round's end stops the search).
 * Within one round of a server's loop the calls on different descriptors
 * are compared each in its descriptor's order, not across descriptors:
 * kvfull's worker serves the descriptors its poll found ready in the order
 * of its connection slots, which the follower's threads may have filled
 * in another order (docs/design.md §17). */
static rec *find_on_fd(ring *r, uint64_t tail, const molt__sc *c, uint64_t *pos) {
  uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
  uint64_t p = tail, t0 = 0;
  for (int seen = 0; seen < 64; seen++) {
    /* The round goes on past what the leader published: its thread is
     * making the call we look for, or will end the round soon. */
    while (p == head) {
      uint64_t now = molt__now_ns();
      if (!t0)
        t0 = now;
      else if (now - t0 > (uint64_t)MOLT__SHADOW_RETRY_MS * 1000000u)
        return NULL;
      /* The other side is gone: nothing more comes (acquire: as in
       * next_record). */
      if (atomic_load_explicit(&alone, memory_order_acquire))
        return NULL;
      consumer_wait(r, head);
      head = atomic_load_explicit(&r->head, memory_order_acquire);
    }
    rec *y = (rec *)(r->data + p % ring_bytes);
    if (y->kind != MOLT__SC_SKIP && !taken_ahead(p, false)) {
      if (!on_fd(y->kind) && !is_time(y->kind))
        return NULL; /* a readiness call ends the round */
      bool mine = is_time(c->kind) ? y->kind == c->kind && y->a[0] == c->a[0]
                                   : on_fd(y->kind) && y->a[0] == c->a[0];
      if (mine) {
        if (y->kind != c->kind || p == tail)
          return NULL;
        *pos = p;
        return y;
      }
    }
    p += y->size;
  }
  return NULL;
}

/* Whether every other follower thread has replayed each record its leader
 * thread made before record `seq` (its next one is later, or it has none
 * yet).  A peek at records nobody else writes meanwhile: the leader
 * overwrites a record only after its consumer moved past it, and a value
 * read as that thread moves on only makes us wait once more. */
static bool others_caught_up(const ring *mine, uint64_t seq) {
  for (uint32_t j = 0; j < slots(); j++) {
    const ring *o = &shared->rings[j];
    if (o == mine || !is_live(o))
      continue;
    uint64_t t = atomic_load_explicit(&o->tail, memory_order_acquire);
    uint64_t h = atomic_load_explicit(&o->head, memory_order_acquire);
    while (t != h) {
      const rec *y = (const rec *)(o->data + t % ring_bytes);
      /* Size 0: that thread moved past this record meanwhile and gave its
       * chunk back (trim_behind), a hole reads as zeros: wait once more,
       * the next look starts from its new tail. */
      if (y->size == 0)
        return false;
      /* A HANDOVER: that thread is handing its ring over, past every call
       * before it (HANDOVER records carry no place among the calls). */
      if (y->kind == REC_HANDOVER)
        break;
      if (y->kind != MOLT__SC_SKIP) {
        if (y->seq < seq)
          return false;
        break;
      }
      t += y->size;
    }
  }
  return true;
}

/* A poll whose set holds every (fd, events) entry of the leader's record x
 * and more: the follower's thread is ahead of the leader's (another
 * follower thread handed it a descriptor sooner than the leader's did).
 * Readiness is an observation, so the follower takes the leader's revents
 * for the entries both have and none for the others, which the program
 * then treats as not ready, exactly as the leader's did not have them.
 * Both sets are sorted (calls.c); the output is the follower's revents in
 * its sorted order.  *ret: the entries with events. */
static bool poll_within(const rec *x, const molt__sc *c, int64_t *ret) {
  typedef struct {
    int32_t fd;
    int16_t events, pad;
  } entry;
  size_t ln = (size_t)x->a[0], fn = (size_t)c->a[0];
  if (x->a[1] != c->a[1] || x->in_keep != x->in_len || x->in_len != ln * sizeof(entry) ||
      ln > fn || x->ret < 0 || x->out_len != ln * sizeof(short))
    return false;
  const entry *le = (const entry *)(const void *)(x + 1), *fe = c->in;
  const short *lrev =
      (const short *)(const void *)((const char *)(x + 1) + align8(x->in_keep));
  short *frev = c->out;
  size_t j = 0;
  for (size_t k = 0; k < ln; k++, j++) {
    while (j < fn && (fe[j].fd != le[k].fd || fe[j].events != le[k].events))
      j++;
    if (j == fn)
      return false;
  }
  int64_t ready = 0;
  j = 0;
  for (size_t k = 0; k < ln; k++, j++) {
    while (fe[j].fd != le[k].fd || fe[j].events != le[k].events)
      frev[j++] = 0;
    frev[j] = lrev[k];
    ready += lrev[k] != 0;
  }
  for (; j < fn; j++)
    frev[j] = 0;
  *ret = ready;
  return true;
}

/* A readiness call (poll, epoll_wait) whose descriptors differ from the
 * leader's record x: most likely the follower's thread built its set from
 * state another follower thread has not brought up to date yet (kvfull's
 * acceptor hands a connection to a worker through a shared table; the
 * follower's acceptor had not replayed that accept when the worker built
 * its set).  Rather than a divergence, the thread waits until the others
 * have replayed what the leader's threads did before x, and the call
 * returns as though it timed out (EINTR for an infinite timeout), x not
 * consumed: the program builds its set again and calls again.  For at
 * most MOLT__SHADOW_RETRY_MS per record: then the difference is real.
 * False: give up (the caller reports the divergence). */
static bool retry(ring *r, const rec *x, const molt__sc *c, int64_t *ret, int *err) {
  uint64_t now = molt__now_ns();
  if (retry_seq != x->seq) {
    retry_seq = x->seq;
    retry_t0 = now;
  }
  if (now - retry_t0 > (uint64_t)MOLT__SHADOW_RETRY_MS * 1000000u)
    return false;
  struct timespec ts = {0, 100000};
  for (int i = 0; i < 200 && !others_caught_up(r, x->seq); i++) {
    molt__shadow_nudge(); /* the others may nap with records waiting */
    nanosleep(&ts, NULL);
  }
  /* and time for them to act on what they replayed (a table updated
   * after an accept returned) before this thread looks again */
  ts.tv_nsec = 200000;
  nanosleep(&ts, NULL);
  int64_t timeout = c->kind == MOLT__SC_POLL ? c->a[1] : c->a[2];
  *err = timeout < 0 ? EINTR : 0;
  *ret = timeout < 0 ? -1 : 0;
  return true;
}

/* The consumer takes a HANDOVER record x at *tail: true if the thread
 * leads from now, false if the handover was called off (it handed the
 * ring straight back and follows on) or the other side is gone (my_done). */
static bool take_handover(ring *r, uint64_t *tail, const rec *x) {
  uint32_t e = (uint32_t)x->a[0];
  *tail += x->size;
  /* release: our replays (and the `absent` bits they set) before the
   * operation's acquire load of taken, and before the other thread, which
   * consumes from here on, reads tail. */
  atomic_store_explicit(&r->tail, *tail, memory_order_release);
  atomic_store_explicit(&r->taken, e, memory_order_release);
  while (atomic_load_explicit(&shared->ready, memory_order_acquire) < e) {
    if (atomic_load_explicit(&alone, memory_order_acquire)) {
      my_done = true;
      return false;
    }
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  my_lead = true;
  if (atomic_load_explicit(&shared->want, memory_order_acquire) == my_side()) {
    /* The old version leads again (rollback after a promotion): its calls
     * are real from this one on, the backstop off. */
    if (!follower)
      molt__shadow_trap_disarm();
    return true;
  }
  /* Called off: back to the other side before any call of ours. */
  if (!hand_over(r)) {
    my_done = true;
    return false;
  }
  /* Coherence: after hand_over's acquire load saw tail == end. */
  *tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  return false;
}

/* ---- completing a call the other side died inside of --------------------------------*/

/* A consumer whose ring is drained for good (my_done): if the other side's
 * process died (relaxed: next_record's acquire load of `alone` ordered
 * peer_dead, stored before it), a read or write it was inside of is taken
 * to complete (carry), and in the follower the descriptors still in the
 * ring's channel -- created by the dead leader after its last published
 * record, an accepted connection say -- are closed: no record will place
 * them, and held there they would keep a client waiting for ever. */
static const rec *pending_intent(ring *r, uint64_t tail);
static void take_carry(const rec *x);
static void drained_after_death(ring *r) {
  if (!atomic_load_explicit(&peer_dead, memory_order_relaxed))
    return;
  const rec *p = pending_intent(r, atomic_load_explicit(&r->tail, memory_order_relaxed));
  if (p)
    take_carry(p);
  if (follower)
    molt__shadow_fds_drain((unsigned)(r - shared->rings));
}

static bool is_rw(unsigned kind) {
  return kind == MOLT__SC_READ || kind == MOLT__SC_RECV || kind == MOLT__SC_WRITE ||
         kind == MOLT__SC_SEND || kind == MOLT__SC_READV || kind == MOLT__SC_WRITEV ||
         kind == MOLT__SC_RECVFROM || kind == MOLT__SC_SENDTO ||
         kind == MOLT__SC_RECVMSG || kind == MOLT__SC_SENDMSG;
}

/* The record the producer reserved for a read or write and had not
 * published when it died (its mark at the drained ring's tail), or NULL. */
static const rec *pending_intent(ring *r, uint64_t tail) {
  /* acquire: pairs with the producer's release store of the mark, after
   * the header it wrote (see ring.intent for the rest). */
  uint64_t m = atomic_load_explicit(&r->intent, memory_order_acquire);
  if (!m || m - 1 < tail || m - 1 - tail >= ring_bytes)
    return NULL; /* none, or published (below head) */
  const rec *x = (const rec *)(r->data + (m - 1) % ring_bytes);
  return is_rw(x->kind) ? x : NULL;
}

/* The thread takes the dead side's call x to complete: what it moved, from
 * the kernel's totals now (nobody else has moved bytes on it since: the
 * dead side was the one making calls on it, this thread replays it). */
static void take_carry(const rec *x) {
  int dir = molt__sc_buffer(x->kind) == 1 ? 0 : 1;
  uint64_t tot[2];
  carry = x;
  carry_given = 0;
  carry_moved = -1;
  if (is_peek(x->kind, x->a))
    carry_moved = 0; /* a peek consumes nothing: made again */
  else if (x->base_ok && tcp_totals((int)x->a[0], tot) && tot[dir] >= x->base &&
           tot[dir] - x->base <= (uint64_t)x->a[1])
    carry_moved = (int64_t)(tot[dir] - x->base);
}

static void count(_Atomic uint64_t *v, uint64_t n) {
  atomic_fetch_add_explicit(v, n, memory_order_relaxed); /* a counter for status */
}

/* A poll that waits for input on the descriptor whose bytes the dead
 * side's read took: they are in the carry, not in the socket, so the poll
 * is made at once and that descriptor reported readable. */
static bool poll_with_carry(const molt__sc *c, int64_t fd, int64_t *result, int *err) {
  typedef struct {
    int32_t fd;
    int16_t events, pad;
  } entry;
  size_t n = (size_t)c->a[0];
  const entry *e = c->in;
  short *rev = c->out;
  struct pollfd p[1024];
  bool has = false;
  if (n > 1024)
    return false;
  for (size_t i = 0; i < n; i++) {
    p[i] = (struct pollfd){e[i].fd, e[i].events, 0};
    has |= e[i].fd == fd && (e[i].events & POLLIN);
  }
  if (!has || poll(p, n, 0) < 0)
    return false;
  int64_t ready = 0;
  for (size_t i = 0; i < n; i++) {
    rev[i] = p[i].revents;
    if (e[i].fd == fd && (e[i].events & POLLIN))
      rev[i] |= POLLIN;
    ready += rev[i] != 0;
  }
  *result = ready;
  *err = 0;
  return true;
}

/* The thread's call c, with a call of the dead side to complete: true if c
 * was completed from it (*result, *err), false if c is made for real (the
 * carry waits for a call on its descriptor, or is done). */
static bool finish_carry(const molt__sc *c, int64_t *result, int *err) {
  const rec *x = carry;
  int64_t fd = x->a[0];
  int xb = molt__sc_buffer(x->kind);
  bool pending_in = xb == 1 && carry_moved > carry_given;
  if (c->kind == MOLT__SC_POLL)
    return pending_in && poll_with_carry(c, fd, result, err);
  if (!on_fd(c->kind) || c->a[0] != fd)
    return false; /* another descriptor: made for real, the carry waits */
  if (c->kind == MOLT__SC_CLOSE) {
    if (pending_in || carry_moved < 0)
      count(&int_uncertain, 1); /* bytes read that nobody will get */
    carry = NULL;
    return false;
  }
  if (!is_rw(c->kind) || molt__sc_buffer(c->kind) != xb)
    return false; /* the other direction: the carry waits */
  if (carry_moved <= 0) {
    count(carry_moved < 0 ? &int_uncertain : &int_nothing, 1);
    carry = NULL;
    return false;
  }
  if (xb == 1) {
    /* The bytes the dead call read, from the record's payload, as a
     * read returns them (in pieces if this buffer is smaller). */
    const char *data = (const char *)(x + 1) + align8(x->in_keep);
    size_t k = (size_t)(carry_moved - carry_given);
    if (k > c->out_cap)
      k = c->out_cap;
    if (k)
      memcpy(c->out, data + carry_given, k);
    if (!is_peek(c->kind, c->a)) {
      carry_given += (int64_t)k;
      count(&int_read_bytes, k);
      if (carry_given == carry_moved) {
        count(&int_completed, 1);
        carry = NULL;
      }
    }
    *result = (int64_t)k;
    *err = 0;
    return true;
  }
  /* A write: the first carry_moved bytes already went out.  Only if this
   * call passes the same bytes (length and hash) are they skipped. */
  carry = NULL;
  if (c->in_len != x->in_len || fnv1a(c->in, c->in_len) != x->in_hash) {
    count(&int_uncertain, 1);
    return false;
  }
  size_t done = (size_t)carry_moved;
  int64_t ret = (int64_t)done;
  if (done < c->in_len) {
    const char *rest = (const char *)c->in + done;
    /* The rest as one buffer: a writev's or sendmsg's bytes are gathered
     * (calls.c); on a TCP socket (the only kind whose carry moved bytes)
     * neither the pieces nor a destination address change what is sent.
     * send's flags: a[2]'s low half (sendto and sendmsg keep a hash of
     * the address in the high half). */
    bool sends = c->kind == MOLT__SC_SEND || c->kind == MOLT__SC_SENDTO ||
                 c->kind == MOLT__SC_SENDMSG;
    ssize_t w = sends ? send((int)fd, rest, c->in_len - done, (int)(uint32_t)c->a[2])
                      : write((int)fd, rest, c->in_len - done);
    if (w > 0)
      ret += w; /* else a short write of what went out */
  }
  count(&int_completed, 1);
  count(&int_skipped_bytes, done);
  *result = ret;
  *err = 0;
  return true;
}

void molt__shadow_intent_counts(molt__shadow_intents *n) {
  n->completed = atomic_load_explicit(&int_completed, memory_order_relaxed);
  n->nothing = atomic_load_explicit(&int_nothing, memory_order_relaxed);
  n->uncertain = atomic_load_explicit(&int_uncertain, memory_order_relaxed);
  n->read_bytes = atomic_load_explicit(&int_read_bytes, memory_order_relaxed);
  n->skipped_bytes = atomic_load_explicit(&int_skipped_bytes, memory_order_relaxed);
}

bool molt__shadow_follows(void) { return my_ring1 && !my_lead && !my_done; }

/* From the SIGSYS handler: a plain flag and atomic loads (no sanitizer
 * hooks there).  acquire on alone: as everywhere it is read; it orders
 * peer_dead, stored before alone's release store.  In the follower only
 * once the leader died: it serves alone then, and a thread trapped
 * between its last replay and its next followed call must not end the
 * only process left serving. */
__attribute__((no_sanitize("address", "thread", "undefined"))) bool
molt__shadow_trap_passes(void) {
  if (!atomic_load_explicit(&alone, memory_order_acquire))
    return false;
  return !follower || atomic_load_explicit(&peer_dead, memory_order_relaxed);
}

__attribute__((no_sanitize("address", "thread", "undefined"))) bool
molt__shadow_in_follower(void) {
  return follower;
}

bool molt__shadow_replay(const molt__sc *c, int64_t *result, int *err) {
  char mine[512];
  if (!my_ring1 || !shared) {
    describe(mine, sizeof mine, c->kind, c->a, c->in, c->in_len < 48 ? c->in_len : 48,
             c->in_len);
    molt__shadow_follower_fail(
        MOLT__SHADOW_END_DIVERGED,
        "thread %d of the follower is neither one the leader had at the update nor "
        "one a followed thread started with pthread_create (a thread started "
        "outside the program image's wrappers is not followed); it called %s",
        (int)molt__gettid(), mine);
  }
  /* Running alone, with a call of the dead side still to complete (the
   * only way here once my_done, molt__shadow_role_now). */
  if (my_done)
    return carry && finish_carry(c, result, err);
  ring *r = &shared->rings[my_ring1 - 1];
  /* Only this thread writes tail: relaxed. */
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  int buffer = molt__sc_buffer(c->kind);
  for (;;) {
    rec *x = next_record(r, &tail);
    if (!x) { /* the other side is gone: this call is made for real */
      my_done = true;
      /* ... unless it died inside a read or write of its own: completed
       * from what the kernel says it moved. */
      drained_after_death(r);
      return carry && finish_carry(c, result, err);
    }
    if (x->kind == REC_HANDOVER) {
      if (take_handover(r, &tail, x))
        return false; /* this thread leads: the caller makes the call */
      if (my_done)
        return false;
      continue;
    }
    /* The leader's thread started a thread or ended where this one makes
     * a call: a divergence, which no rule reconciles. */
    if (x->kind == REC_THREAD || x->kind == REC_EXIT) {
      describe(mine, sizeof mine, c->kind, c->a, c->in,
               c->in_len < MOLT__SHADOW_IN_KEEP ? c->in_len : MOLT__SHADOW_IN_KEEP,
               c->in_len);
      thread_diverged(r, x, mine);
    }
    uint64_t xpos = tail;
    bool natural = x->kind == c->kind && (is_time(c->kind) || x->a[0] == c->a[0]);
    if (!natural && (on_fd(c->kind) || is_time(c->kind)) &&
        (on_fd(x->kind) || is_time(x->kind)) && nahead < AHEAD_MAX) {
      rec *y = find_on_fd(r, tail, c, &xpos);
      if (y)
        x = y;
    }
    const char *kept = (const char *)(x + 1);
    uint64_t n = atomic_load_explicit(&r->compared, memory_order_relaxed) + 1;
    /* The descriptor's kind, for rules that name one: the leader's record
     * of the same descriptor says it (the follower may not have it, if the
     * leader opened it after the fork); else the follower's own. */
    unsigned fdk = MOLT__FDK_ANY;
    if (rules.n) {
      bool same_fd = c->kind != MOLT__SC_POLL && x->kind != MOLT__SC_POLL &&
                     x->kind != MOLT__SC_CLOSE && x->a[0] == c->a[0];
      fdk = same_fd && has_fd_kind ? x->fd_kind : fd_kind_of(c->kind, c->a[0]);
    }
    /* An output call's bytes as compared: rewritten by a rule that
     * matches them. */
    molt__sc f = *c;
    const molt__rule *rw = rules.n && buffer == 2 ? rule_for(MOLT__RULE_REWRITE, c->kind,
                                                             fdk, c->in, c->in_len)
                                                  : NULL;
    if (rw) {
      f.in = rw->text;
      f.in_len = rw->text_len;
      f.a[1] = rw->text_len;
    }
    bool same = x->kind == f.kind && memcmp(x->a, f.a, sizeof x->a) == 0 &&
                x->in_len == f.in_len && (!f.in || x->in_hash == fnv1a(f.in, f.in_len));
    const molt__rule *tol = NULL;
    if (!same && rules.n && x->kind == c->kind && x->a[0] == c->a[0]) {
      size_t xn = 0;
      const void *xb = rec_bytes(x, &xn);
      tol = buffer == 2 ? rule_for(MOLT__RULE_TOLERATE, c->kind, fdk, c->in, c->in_len)
                        : rule_for(MOLT__RULE_TOLERATE, c->kind, fdk, xb, xn);
    }
    /* An epoll wait: every descriptor the leader's events name must be in
     * the follower's table (else, like a poll whose set differs, the call
     * is retried: another thread's epoll_ctl not replayed yet). */
    if ((same || tol) && is_epoll_wait(c->kind) && x->ret > 0) {
      const char *why = molt__shadow_epoll_fits(c, kept + align8(x->in_keep), x->out_len);
      int64_t ret;
      if (why && retry(r, x, c, &ret, err)) {
        *result = ret;
        return true;
      }
      if (why)
        molt__shadow_follower_fail(
            MOLT__SHADOW_END_DIVERGED,
            "divergence in thread %d (leader thread %d), call %" PRIu64 ": %s",
            (int)my_ring1 - 1, (int)tid_of(r), n, why);
    }
    if (same || tol) {
      int64_t ret = x->ret;
      *err = x->err;
      size_t xn = 0;
      const void *xb = rec_bytes(x, &xn);
      /* An input call's data as the follower gets it: rewritten by a
       * rule that matches it. */
      const molt__rule *in_rw = rules.n && buffer == 1 && x->ret > 0
                                    ? rule_for(MOLT__RULE_REWRITE, c->kind, fdk, xb, xn)
                                    : NULL;
      if (in_rw) {
        size_t k = in_rw->text_len < c->out_cap ? in_rw->text_len : c->out_cap;
        if (k)
          memcpy(c->out, in_rw->text, k);
        ret = (int64_t)k;
      } else if (x->out_len && c->out) {
        memcpy(c->out, kept + align8(x->in_keep),
               x->out_len < c->out_cap ? x->out_len : c->out_cap);
      }
      /* The leader's aux results (an address, control data) as they are. */
      if (x->aux_len && c->aux)
        memcpy(c->aux, kept + align8(x->in_keep) + align8(x->out_len),
               x->aux_len < c->aux_len ? x->aux_len : c->aux_len);
      /* A tolerated or rewritten output call that the leader's call
       * completed: it completed for the follower too, with its length. */
      if ((tol || rw) && buffer == 2 && x->ret >= 0)
        ret = (int64_t)c->in_len;
      if (tol || rw || in_rw)
        atomic_fetch_add_explicit(&r->applied, 1, memory_order_relaxed);
      consume(r, &tail, x, xpos, n);
      *result = ret;
      return true;
    }
    if ((c->kind == MOLT__SC_POLL || is_epoll_wait(c->kind)) && x->kind == c->kind) {
      int64_t ret;
      if (c->kind == MOLT__SC_POLL && poll_within(x, c, &ret)) {
        *err = x->err;
        consume(r, &tail, x, xpos, n);
        *result = ret;
        return true;
      }
      if (retry(r, x, c, &ret, err)) {
        *result = ret;
        return true;
      }
    }
    /* A call only the follower makes, which a rule drops: not compared,
     * not made; it succeeded. */
    if (rules.n && rule_for(MOLT__RULE_DROP, c->kind, fdk, c->in, c->in_len)) {
      *err = 0;
      if (c->kind == MOLT__SC_CLOSE) /* the follower's own close: its copy */
        molt__shadow_fd_release((int)c->a[0], MOLT__SHADOW_ANY_GEN);
      atomic_fetch_add_explicit(&r->applied, 1, memory_order_relaxed);
      *result = buffer == 2 ? (int64_t)c->in_len : 0;
      return true;
    }
    /* A call only the leader made, which a rule inserts into the
     * follower's calls: passed over as though the follower had made it. */
    if (rules.n) {
      size_t xn = 0;
      const void *xb = rec_bytes(x, &xn);
      if (rule_for(MOLT__RULE_INSERT, x->kind, has_fd_kind ? x->fd_kind : MOLT__FDK_ANY,
                   xb, xn)) {
        atomic_fetch_add_explicit(&r->applied, 1, memory_order_relaxed);
        consume(r, &tail, x, xpos, n);
        continue;
      }
    }
    char theirs[512];
    describe(theirs, sizeof theirs, x->kind, x->a, x->in_keep ? kept : NULL, x->in_keep,
             x->in_len);
    describe(mine, sizeof mine, c->kind, c->a, c->in,
             c->in_len < MOLT__SHADOW_IN_KEEP ? c->in_len : MOLT__SHADOW_IN_KEEP,
             c->in_len);
    molt__shadow_follower_fail(MOLT__SHADOW_END_DIVERGED,
                               "divergence in thread %d (leader thread %d), call %" PRIu64
                               ": the leader made %s = %" PRId64 ", the follower %s",
                               (int)my_ring1 - 1, (int)tid_of(r), n, theirs, x->ret,
                               mine);
  }
}

/* ---- handovers, the other side gone ---------------------------------------------*/

static void wake_all(void) {
  area *s = shared;
  if (!s)
    return;
  for (uint32_t i = 0; i < slots(); i++) {
    atomic_fetch_add_explicit(&s->rings[i].seq, 1, memory_order_seq_cst);
    futex_wake(&s->rings[i].seq);
  }
}

void molt__shadow_nudge(void) {
  area *s = shared;
  if (!s)
    return;
  for (uint32_t i = 0; i < s->nrings; i++) {
    ring *r = &s->rings[i];
    /* relaxed: a wait begun after this look ends by its timeout (or by
     * its producer), as it would have without the nudge; the bump makes
     * a futex wait about to begin return at once (its seq changed). */
    if (atomic_load_explicit(&r->waiting, memory_order_relaxed) != WAIT_NONE) {
      atomic_fetch_add_explicit(&r->seq, 1, memory_order_relaxed);
      futex_wake(&r->seq);
    }
  }
}

int molt__shadow_leading_side(void) {
  return shared ? (int)atomic_load_explicit(&shared->want, memory_order_relaxed) : 0;
}

bool molt__shadow_leader_exited(void) {
  return shared && atomic_load_explicit(&shared->leader_exited, memory_order_acquire);
}

/* The original process ends through exit() while its follower runs: the
 * follower ends with it instead of taking over (a crash or a signal runs
 * no destructor, and the follower takes over then). */
__attribute__((destructor)) static void leader_exits(void) {
  if (shared && !follower &&
      atomic_load_explicit(&molt__shadow_active, memory_order_relaxed))
    atomic_store_explicit(&shared->leader_exited, 1, memory_order_release);
}

/* Lists the new version's descriptors the original process lacks (at
 * most 8 named) into buf; their number. */
static size_t absent_list(char *buf, size_t len) {
  size_t n = 0, w = 0;
  buf[0] = '\0';
  for (int fd = 0; fd < FD_TRACKED; fd++) {
    if (atomic_load_explicit(&shared->opened[fd], memory_order_relaxed) <=
        atomic_load_explicit(&shared->closed[fd], memory_order_relaxed))
      continue;
    if (n++ < 8 && w + 16 < len)
      w += (size_t)snprintf(buf + w, len - w, "%s%d", n > 1 ? ", " : "", fd);
  }
  if (n > 8 && w + 8 < len)
    snprintf(buf + w, len - w, ", ...");
  return n;
}

int molt__shadow_hand_over(unsigned to, int timeout_ms, pid_t other, char *err,
                           size_t errlen) {
  area *s = shared;
  unsigned from = to ? 0u : 1u;
  uint64_t t0 = molt__now_ns();
  /* Handing the lead back (to 0): first, while everything runs on,
   * descriptors the new version created after the promotion, which the
   * original process does not have, are waited for (a client that has
   * just hung up: the new version closes it at its next call).  The check
   * is made again once every ring is handed over, when no thread makes a
   * call.  A promotion needs none: every descriptor the old version
   * created after the fork was passed to the follower (fds.c). */
  char list[160];
  while (to == 0 && absent_list(list, sizeof list) > 0 &&
         molt__now_ns() - t0 < (uint64_t)timeout_ms * 1000000u / 2) {
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  /* A promotion: the old version's threads follow under the backstop too
   * (each arms it at its switch, sync_backstop).  Its SIGSYS handler is
   * installed here, once every program thread could trap; it stays (as
   * the follower's does), a program's own SIGSYS handler replaced.
   * Installed again at a later promotion: the same. */
  if (to == 1 && !follower)
    atomic_store_explicit(&old_trap_ok,
                          !backstop_off() && molt__shadow_trap_install() == 0,
                          memory_order_relaxed);
  uint32_t e = atomic_load_explicit(&s->epoch, memory_order_relaxed) + 1;
  atomic_store_explicit(&s->epoch, e, memory_order_relaxed);
  /* release: a thread whose acquire load sees the new want sees epoch e */
  atomic_store_explicit(&s->want, to, memory_order_release);
  int rc = 0;
  for (;;) {
    uint32_t i, waiting_on = 0;
    /* A promotion: the original process's threads, which hand over, are
     * waited for in this process too (`handed`). */
    /* A ring that no thread has (its thread ended on both sides) hands
     * nothing over; one a thread claims meanwhile is born in the state of
     * its creator's ring (claim_slot), which this loop waits for. */
    uint32_t nslots = slots();
    for (i = 0; i < nslots; i++)
      if (is_live(&s->rings[i]) &&
          (atomic_load_explicit(&s->rings[i].taken, memory_order_acquire) != e ||
           (to == 1 &&
            atomic_load_explicit(&s->rings[i].handed, memory_order_acquire) != e)))
        break;
    if (i == nslots)
      break;
    waiting_on = i;
    if (atomic_load_explicit(&alone, memory_order_acquire) ||
        atomic_load_explicit(&s->written, memory_order_acquire)) {
      molt__errmsg(err, errlen, "the follower ended during the handover");
      rc = MOLT_EINTERNAL;
      break;
    }
    if (molt__now_ns() - t0 > (uint64_t)timeout_ms * 1000000u) {
      molt__errmsg(err, errlen,
                   "program thread %u (tid %d in this process) did not reach a followed "
                   "call within %d ms; nothing changed",
                   waiting_on, (int)tid_of(&s->rings[waiting_on]), timeout_ms);
      rc = MOLT_ETIMEDOUT;
      break;
    }
    struct timespec ts = {0, 500000};
    nanosleep(&ts, NULL);
  }
  if (rc == 0 && to == 0 && absent_list(list, sizeof list) > 0) {
    molt__errmsg(err, errlen,
                 "descriptor(s) %s, which the new version opened after the promotion, "
                 "are still open and the old version holds them only as the new "
                 "version's copies; nothing changed (try again once those connections "
                 "are closed)",
                 list);
    rc = MOLT_EBUSY;
  }
  /* The original process follows from now: it closes its copy of a
   * descriptor the new version closes if it is one both hold. */
  if (rc == 0 && to == 1)
    molt__shadow_note_shared_with(other);
  if (rc < 0)
    atomic_store_explicit(&s->want, from, memory_order_release);
  /* release: `want` is final for e before a thread that took a HANDOVER
   * of e leads (its acquire load of ready). */
  atomic_store_explicit(&s->ready, e, memory_order_release);
  return rc;
}

/* ---- threads started after the fork ----------------------------------------------
 * (docs/design.md §17, "Threads started after the fork")
 *
 * A program thread that starts a thread (pthread_create, which program
 * images wrap: full/program.c calls these hooks) while it produces its
 * ring claims a free ring for the new thread (claim_slot) and appends a
 * THREAD record to its own ring, in its place among its calls; the new
 * thread produces the new ring.  The consumer of the creator's ring, when
 * its program starts a thread at the same place of its calls, takes that
 * record -- compared: a call there, or a record that is not THREAD, is a
 * divergence, and so is another entry function -- and starts its thread
 * paired with the same ring, as its consumer.  A thread that ends appends
 * an EXIT record (producer) or takes it (consumer: a call there instead is
 * a divergence); the consumer that took it frees the ring (its pages given
 * back, its channel closed), and a later thread claims it again: rings are
 * reused, 64 threads at a time at most.  A creator that finds no free ring
 * for MOLT__SHADOW_FULL_WAIT_MS (the follower is that far behind) drops
 * the shadow, as a full ring does.
 *
 * The new thread of the producing side makes no call before its creator
 * has published the THREAD record (it waits in `started`): a side that
 * outlives the other then has either the record, and the new thread's
 * calls to replay, or neither (the thread started on its own from there).
 *
 * Handovers (molt promote) pass through threads as through calls: a new
 * ring is born in the state of its creator's ring (taken and handed: the
 * epoch of the handover by which the creator became the producer), so
 * that the operation waits for it exactly when the creator has still to
 * hand over; a thread that ends after `want` changed hands its ring over
 * first, then takes the other side's EXIT. */

/* A thread being started, from `creating` to the new thread's `started`:
 * malloc'ed by the creator; freed by the new thread, or by the creator if
 * no thread started.  The token is its address, | 1 if the new thread
 * produces its ring. */
typedef struct born {
  unsigned ring;   /* the new thread's ring */
  _Atomic int go;  /* producer: 0 until the creator published THREAD, then
                     1 (the ring is the new thread's) or 2 (none: the
                     shadow was dropped meanwhile); release store by the
                     creator, acquire load by the new thread */
  char entry[128]; /* its entry function's name, as compared */
} born;

/* How a record of the other side names what it did, for a divergence. */
static void describe_rec(char *buf, size_t len, const rec *x) {
  const char *kept = (const char *)(x + 1);
  if (x->kind == REC_THREAD)
    snprintf(buf, len, "pthread_create(%.*s) = %" PRId64, (int)x->in_keep, kept, x->ret);
  else if (x->kind == REC_EXIT)
    snprintf(buf, len, "the end of its thread");
  else
    describe(buf, len, x->kind, x->a, x->in_keep ? kept : NULL, x->in_keep, x->in_len);
}

static void thread_diverged(ring *r, const rec *x, const char *mine) {
  char theirs[512];
  describe_rec(theirs, sizeof theirs, x);
  molt__shadow_follower_fail(MOLT__SHADOW_END_DIVERGED,
                             "divergence in thread %d (leader thread %d), call %" PRIu64
                             ": the leader made %s, the follower %s",
                             (int)(r - shared->rings), (int)tid_of(r),
                             atomic_load_explicit(&r->compared, memory_order_relaxed) + 1,
                             theirs, mine);
}

/* A consumer's next record, which must be of kind `want` (REC_THREAD,
 * REC_EXIT; mine: what this thread does, for a divergence).  NULL: this
 * thread leads from now (my_lead) or runs alone (my_done). */
static rec *expect_record(ring *r, uint64_t *tail, unsigned want, const char *mine) {
  for (;;) {
    rec *x = next_record(r, tail);
    if (!x) {
      my_done = true;
      /* as in molt__shadow_replay */
      drained_after_death(r);
      return NULL;
    }
    if (x->kind == REC_HANDOVER) {
      if (take_handover(r, tail, x) || my_done)
        return NULL;
      continue;
    }
    if (x->kind == want)
      return x;
    thread_diverged(r, x, mine);
  }
}

/* Appends a THREAD or EXIT record to the producer's ring r: false if the
 * shadow was dropped or is over meanwhile. */
static bool record_thread_rec(ring *r, unsigned kind, const int64_t a[3], int64_t ret,
                              const char *name) {
  size_t len = name ? strlen(name) : 0;
  size_t size = sizeof(rec) + align8(len);
  uint64_t end = 0;
  rec *x = reserve(r, size, &end);
  if (!x)
    return false;
  *x = (rec){.size = (uint32_t)size,
             .kind = (uint16_t)kind,
             .ret = ret,
             .in_keep = (uint32_t)len,
             .in_len = len,
             .in_hash = fnv1a(name ? name : "", len),
             .seq = atomic_fetch_add_explicit(&shared->clock, 1, memory_order_relaxed)};
  memcpy(x->a, a, sizeof x->a);
  if (len)
    memcpy(x + 1, name, len);
  atomic_fetch_add_explicit(&r->recorded, 1, memory_order_relaxed);
  publish(r, end);
  return true;
}

/* A free ring for a thread the producer of ring `creator` starts, set up
 * empty and live: its index, or MOLT__SHADOW_MAX_THREADS if none came free
 * within MOLT__SHADOW_FULL_WAIT_MS (the shadow dropped) or the shadow is
 * over. */
static unsigned claim_slot(const ring *creator) {
  uint64_t t0 = 0;
  for (;;) {
    for (unsigned i = 0; i < MOLT__SHADOW_MAX_THREADS; i++) {
      ring *r = &shared->rings[i];
      uint32_t cur = RING_FREE;
      /* relaxed look first: the compare-exchange below orders the claim */
      if (atomic_load_explicit(&r->live, memory_order_relaxed) != RING_FREE ||
          !atomic_compare_exchange_strong_explicit(
              &r->live, &cur, RING_CLAIMING, memory_order_acquire, memory_order_relaxed))
        continue;
      atomic_store_explicit(&r->head, 0, memory_order_relaxed);
      atomic_store_explicit(&r->tail, 0, memory_order_relaxed);
      atomic_store_explicit(&r->seq, 0, memory_order_relaxed);
      atomic_store_explicit(&r->waiting, 0, memory_order_relaxed);
      atomic_store_explicit(&r->intent, 0, memory_order_relaxed);
      /* Born in its creator's handover state (the epoch by which the
       * creator became the producer: the creator took it, so its own
       * store; see the section's comment). */
      uint32_t e = atomic_load_explicit(&creator->taken, memory_order_relaxed);
      atomic_store_explicit(&r->taken, e, memory_order_relaxed);
      atomic_store_explicit(&r->handed, e, memory_order_relaxed);
      atomic_store_explicit(&r->reused, 1, memory_order_relaxed);
      set_tid(r, 0);
      /* release: the set-up above before any reader that sees it live */
      atomic_store_explicit(&r->live, RING_LIVE, memory_order_release);
      uint32_t n = atomic_load_explicit(&shared->nslots, memory_order_relaxed);
      /* release: a loop that reads the new count sees the ring live */
      while (n < i + 1 &&
             !atomic_compare_exchange_weak_explicit(
                 &shared->nslots, &n, i + 1, memory_order_release, memory_order_relaxed))
        ;
      return i;
    }
    if (!still_leading())
      return MOLT__SHADOW_MAX_THREADS;
    uint64_t now = molt__now_ns();
    if (!t0) {
      t0 = now;
    } else if (now - t0 > (uint64_t)MOLT__SHADOW_FULL_WAIT_MS * 1000000u) {
      drop("thread %d started a thread while all %d rings stayed in use for %d ms (the "
           "follower had not finished replaying the threads that ended); the shadow "
           "was dropped",
           (int)molt__gettid(), MOLT__SHADOW_MAX_THREADS, MOLT__SHADOW_FULL_WAIT_MS);
      return MOLT__SHADOW_MAX_THREADS;
    }
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
}

/* The consumer took its ring's EXIT: nobody uses the ring any more (its
 * producer ended after that record), so its pages go back, its channel
 * closes, and the slot is free for a thread started later. */
static void free_slot(ring *r) {
  /* relaxed: next_record's acquire load saw this head, the last one */
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
  uint64_t used = head < ring_bytes ? (head + 4095) & ~(uint64_t)4095 : ring_bytes;
  if (used)
    madvise(r->data, (size_t)used, MADV_REMOVE);
  if (follower)
    molt__shadow_fds_ring_close((unsigned)(r - shared->rings));
  /* release: done with the ring before a claimer sets it up again (its
   * acquire compare-exchange) */
  atomic_store_explicit(&r->live, RING_FREE, memory_order_release);
}

static int thread_creating(const char *entry, uintptr_t *token) {
  *token = 0;
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return 0;
  unsigned me = my_ring1 - 1;
  ring *r = &shared->rings[me];
  born *b = calloc(1, sizeof *b);
  if (!b) {
    if (role == MOLT__SHADOW_FOLLOWER)
      molt__shadow_follower_fail(MOLT__SHADOW_END_FAILED,
                                 "thread %u of the follower: out of memory starting a "
                                 "thread",
                                 me);
    drop("thread %d: out of memory starting a thread; the shadow was dropped",
         (int)molt__gettid());
    return 0;
  }
  snprintf(b->entry, sizeof b->entry, "%s", entry ? entry : "?");
  if (role == MOLT__SHADOW_FOLLOWER) {
    /* The replay's own calls (the ring's futex, the channel) and the
     * thread's creation (clone) are not trapped; `created` blocks again. */
    molt__shadow_trap_allow();
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    char mine[192];
    snprintf(mine, sizeof mine, "pthread_create(%s)", b->entry);
    rec *x = expect_record(r, &tail, REC_THREAD, mine);
    if (x) {
      size_t len = strlen(b->entry);
      if (x->in_len != len || x->in_hash != fnv1a(b->entry, len))
        thread_diverged(r, x, mine);
      /* Not before every other thread has replayed what its leader thread
       * did before this start: the new thread's work may follow from it
       * through the world outside (a client that got its reply from one
       * connection's thread, then opened the connection this thread
       * serves, and reads back what it wrote), which no record shows.
       * Bounded: a thread that waits on its own program goes on after. */
      uint64_t t0 = molt__now_ns();
      while (!others_caught_up(r, x->seq) &&
             molt__now_ns() - t0 < (uint64_t)MOLT__SHADOW_RETRY_MS * 1000000u) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
      }
      int rc = (int)x->ret;
      unsigned k = (unsigned)x->a[0];
      if (rc == 0 && k >= MOLT__SHADOW_MAX_THREADS)
        molt__shadow_follower_fail(MOLT__SHADOW_END_FAILED,
                                   "thread %u: a THREAD record names ring %u", me, k);
      /* The new ring's channel, sent before the record was published. */
      if (rc == 0 && x->a[1])
        molt__shadow_fds_ring_take(me, k);
      consume(r, &tail, x, tail,
              atomic_load_explicit(&r->compared, memory_order_relaxed) + 1);
      if (rc != 0) {
        /* The leader's pthread_create failed: so does this one. */
        free(b);
        if (molt__shadow_follows())
          molt__shadow_trap_block();
        return rc;
      }
      b->ring = k;
      *token = (uintptr_t)b;
      return 0;
    }
    if (my_done) { /* alone: started as any thread */
      free(b);
      return 0;
    }
    /* this thread leads from here */
  }
  unsigned k = claim_slot(r);
  if (k == MOLT__SHADOW_MAX_THREADS) {
    free(b);
    return 0;
  }
  b->ring = k;
  *token = (uintptr_t)b | 1u;
  return 0;
}

static void thread_created(uintptr_t token, int rc, pid_t tid) {
  (void)tid; /* the new thread writes its own (started) */
  born *b = (born *)(token & ~(uintptr_t)1);
  if (!b)
    return;
  if (!(token & 1)) { /* the consumer's side: the new thread frees b */
    if (rc != 0)
      molt__shadow_follower_fail(MOLT__SHADOW_END_DIVERGED,
                                 "thread %u of the follower could not start the thread "
                                 "the leader's started in %s: %s",
                                 my_ring1 - 1, b->entry, strerror(rc));
    if (molt__shadow_follows())
      molt__shadow_trap_block();
    return;
  }
  unsigned me = my_ring1 - 1, k = b->ring;
  ring *r = &shared->rings[me], *nr = &shared->rings[k];
  bool ok = still_leading();
  int64_t a[3] = {k, 0, 0};
  /* The original process leads: the new ring gets a channel for the
   * descriptors its thread creates, sent on the creator's (fds.c). */
  if (ok && rc == 0 && !follower) {
    int crc = molt__shadow_fds_ring_open(me, k);
    if (crc == 0) {
      a[1] = 1;
    } else if (crc != -ENOTCONN || still_leading()) {
      drop("thread %d: the channel of the thread it started could not be sent to the "
           "follower (%s); the shadow was dropped",
           (int)molt__gettid(), strerror(-crc));
      ok = false;
    } else {
      ok = false;
    }
  }
  if (ok)
    ok = record_thread_rec(r, REC_THREAD, a, rc, b->entry);
  if (rc != 0) {
    /* No thread: its ring free again (a failure recorded is replayed as
     * one: the follower starts none either; release, as in free_slot). */
    atomic_store_explicit(&nr->live, RING_FREE, memory_order_release);
    free(b);
    return;
  }
  /* release: the record published before the new thread makes a call */
  atomic_store_explicit(&b->go, ok ? 1 : 2, memory_order_release);
}

static void thread_started(uintptr_t token) {
  /* A thread started in this session has its ring (or none) from here:
   * role_of_this_call does not look it up by tid. */
  my_session = atomic_load_explicit(&session, memory_order_relaxed);
  my_ring1 = 0;
  my_lead = my_done = false;
  born *b = (born *)(token & ~(uintptr_t)1);
  if (!b)
    return;
  bool lead = token & 1;
  int go = 1;
  /* The producer's new thread: not before its creator published THREAD. */
  while (lead && (go = atomic_load_explicit(&b->go, memory_order_acquire)) == 0) {
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
  unsigned k = b->ring;
  free(b);
  if (go != 1)
    return;
  my_ring1 = k + 1;
  my_lead = lead;
  if (!follower)
    set_tid(&shared->rings[k], molt__gettid());
  /* A thread started by a following thread follows from its start: in
   * the follower, or in the original process while promoted. */
  if (!lead &&
      (follower ? trap_ok : atomic_load_explicit(&old_trap_ok, memory_order_relaxed)))
    molt__shadow_trap_arm();
}

static void thread_exiting(void) {
  molt__shadow_role role = molt__shadow_role_now();
  if (role == MOLT__SHADOW_NONE)
    return;
  unsigned me = my_ring1 - 1;
  ring *r = &shared->rings[me];
  if (role == MOLT__SHADOW_FOLLOWER) {
    /* This thread's calls pass from here (the replay's, then its exit's):
     * it runs no program code any more. */
    molt__shadow_trap_allow();
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    rec *x = expect_record(r, &tail, REC_EXIT, "the end of its thread");
    if (x) {
      consume(r, &tail, x, tail,
              atomic_load_explicit(&r->compared, memory_order_relaxed) + 1);
      my_done = true;
      free_slot(r);
      return;
    }
    if (my_done)
      return;
    /* this thread leads from here */
  }
  int64_t a[3] = {0, 0, 0};
  record_thread_rec(r, REC_EXIT, a, 0, NULL);
  my_done = true;
  if (!follower)
    molt__shadow_fds_ring_close(me);
}

const molt__program_thread_hooks molt__shadow_thread_hooks = {
    thread_creating, thread_created, thread_started, thread_exiting};
