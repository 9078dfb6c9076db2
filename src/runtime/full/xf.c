/*
 * The state transformation engine of full updates (molt__xf_*): see
 * docs/full-updates.md, "What migrates", and the ABI comments in molt/program.h.
 *
 * Threads: a migration runs on ONE thread (the runtime thread, under the
 * operation lock) while every program thread is parked at an update point
 * (the switch layer's barrier: they parked under bar_lock, so everything they wrote
 * is visible here, and everything written here is visible to them when they
 * are released under the same mutex).  The engine therefore needs no
 * atomics or locks of its own: a context is only ever touched by the thread
 * that migrates.  The only cross-context state is the fault guard (signal
 * handler) and the kept literal pool, both commented where they are.
 *
 * Cost model: the per-object path (molt__xf_ptr -> run -> fn) does no
 * system call and no allocation beyond the new object itself; every table
 * grows geometrically; the work list is an explicit stack, so a list of a
 * million nodes never recurses.  What a million objects cost is memory
 * traffic, so the tables are laid out for it:
 *  - the old->new map is sized up front from the heap's size, holds 8-byte
 *    slots (a tag of the key + index of a record appended in insertion
 *    order), and lives in huge pages where the kernel gives them
 *    (big_alloc).  Fresh pages can be the dominant cost on a VM (the kernel
 *    zeroes each one during the pause, and the table is touched all over),
 *    so its slots are kept small;
 *  - a bitmap with one bit per 16-byte granule of the old heap says which
 *    granules hold a map key, so that an untyped pointer (a string, a
 *    buffer) that cannot be a migrated object is answered without probing
 *    the map;
 *  - the same bitmap tells the commit whether a replaced object can contain
 *    another one; when none can (the usual case), the replaced objects are
 *    freed without sorting them;
 *  - the work loop prefetches the old objects of queued items and the map
 *    slots of the pointers of pointer arrays a few iterations ahead.
 */
#include "full/full.h"

#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Context                                                                   */
/* ------------------------------------------------------------------------ */

/* Markers stored as the type of map records that are not typed objects.
 * Their flags are 0: never CHANGED, so never freed as replaced objects. */
static const molt__xf_type pool_marker = {"string literal", 0, 0, NULL, 0};
static const molt__xf_type image_marker = {"old image address", 0, 0, NULL, 0};

/* A slot of the map: 8 bytes, a tag of the old address and the index of
 * its record (the record holds the address itself).  The table is touched
 * all over at random, so every page of it is fresh memory the kernel must
 * zero during the pause: at 8 bytes a slot (instead of key + index, 16)
 * that costs half as much, and a 2 KiB window (see hash_ptr) covers one
 * page of the old heap.  A probe compares the tag first and reads the
 * record only when the tag matches, i.e. almost only on a hit, which needs
 * the record anyway. */
typedef struct map_ent {
  uint32_t tag; /* map_tag(key) */
  uint32_t rec; /* index of the record + 1; 0 = empty slot */
} map_ent;

/* Records are indexed by 32 bits: more than this many keys fail the
 * migration as out of memory (they would need > 128 GiB of records). */
#define MAP_MAX_RECS ((size_t)UINT32_MAX - 1)

static inline uint32_t map_tag(uintptr_t k) {
  /* Keys of one window lie in one 4 KiB page: their granules differ. */
  return (uint32_t)(k >> 4);
}

/* What an old address maps to; appended in insertion order (cx->recs), so
 * that commit and abort walk a dense array instead of the whole table. */
typedef struct map_rec {
  uintptr_t key;          /* old address */
  void *val;              /* new address */
  const molt__xf_type *t; /* type it was migrated as, or a marker */
  size_t count;
} map_rec;

/* An untyped pointer (void *, char *: no type to follow it with) into the
 * heap that was kept as it was because its target was not migrated (yet);
 * with the object that held it, for the message. */
typedef struct untyped_ref {
  uintptr_t p;
  const char *field;                    /* NULL if the generated code did not name it */
  const struct molt__xf_type *holder_t; /* the object being migrated then */
  uintptr_t holder;
} untyped_ref;

typedef struct work_item {
  const void *in;
  void *out;
  const molt__xf_type *t;
  size_t count;
  bool in_place;   /* old memory fixed in place: setp writes are undo-logged */
  const char *via; /* the field that reached it ("struct conn.next"), or NULL */
} work_item;

typedef struct undo_ent {
  void **slot;
  void *prev;
} undo_ent;

typedef struct var_range {
  uintptr_t lo;  /* old start */
  size_t size;   /* old_size * count */
  uintptr_t out; /* new start */
  const molt__xf_type *t;
  size_t count;
} var_range;

typedef struct span {
  uintptr_t lo, hi;
  const char *what; /* interior check: type name of the object */
} span;

/* A heap mapping and where its granules start in the key bitmap. */
typedef struct heap_span {
  uintptr_t lo, hi;
  size_t g0;
} heap_span;

/* A growable array of fixed-size elements (amortised O(1) push).  Small
 * ones live in malloc memory; from BIG_BYTES on, in an mmap'd region that
 * grows with mremap (no copy) and may use huge pages (big_alloc). */
typedef struct vec {
  void *p;
  size_t n, cap;
  bool mapped;
} vec;

struct molt__xf_ctx {
  molt__image *old, *new;
  uintptr_t old_lo, old_hi; /* hull of the old image's segments: fast reject */
  bool check_interior;

  map_ent *map;           /* big_alloc'ed */
  size_t map_mask, map_n; /* capacity = mask + 1, a power of two */
  unsigned map_shift;     /* 64 - log2(capacity) */
  vec recs;               /* map_rec, indexed by map_ent.rec */
  vec pools;              /* void *: literal copies (freed on abort, kept on commit) */
  vec freeold;            /* uintptr_t: molt__xf_free_old requests */

  vec heap;                   /* heap_span: [heap] and anonymous private mappings */
  vec readable;               /* span: every readable mapping, merged, sorted */
  size_t heap_last;           /* index of the span that answered last */
  uintptr_t heap_lo, heap_hi; /* hull of the heap spans */
  uint64_t *kbits;            /* one bit per 16-byte heap granule holding a key */
  size_t kbits_bytes;         /* 0: no bitmap (every pointer probes the map) */
  bool kbits_shared;          /* some granule holds more than one key */

  vec work; /* work_item, used as a stack */
  vec undo; /* undo_ent */
  vec vars; /* var_range */
  bool vars_sorted;
  vec locals;  /* molt__saved_local * whose new_value this migration set */
  vec objs;    /* span: interior check, migrated and visited old objects */
  vec targets; /* uintptr_t: interior check, every pointer asked for */
  vec untyped; /* untyped_ref: heap pointers kept untyped (check_untyped) */

  /* The work item being run (for setp and for messages). */
  const molt__xf_type *cur_t;
  bool cur_in_place;
  const void *cur_in;   /* the old object (element) being transformed */
  const char *cur_via;  /* the field through which it was reached, or NULL */
  const char *cur_rule; /* the variable or INIT rule body running, or NULL */

  /* Pointers not followed because they point to no readable memory (a
   * dangling or uninitialised pointer): how many, and the first one. */
  uint64_t bad_ptrs;
  char bad_first[300];

  /* Memory the rule bodies allocated (molt__xf_malloc and friends): freed
   * on abort, handed to the new version on commit.  ralloc is the list
   * (a freed or reallocated entry becomes 0); rindex, built only once a
   * rule frees or reallocates a block that is not among the latest few,
   * maps a block to its entry (open addressing, power-of-two capacity). */
  vec ralloc;     /* uintptr_t */
  size_t *rindex; /* entry index + 1; 0 = empty; SIZE_MAX = deleted */
  size_t rindex_mask, rindex_used;

  /* The deadline of the migration (molt__xf_set_limit): 0 = none. */
  unsigned limit_ms;
  uint64_t deadline_ns; /* CLOCK_MONOTONIC, set when the migration starts */

  uint64_t objects, bytes, ns;
  bool migrating; /* inside molt__xf_migrate: failures may siglongjmp */
  bool restored;  /* the old state has been restored (abort done) */
  bool migrated;  /* molt__xf_migrate succeeded */
  int err_code;
  char err[512];
  sigjmp_buf jb;
  int fault_sig;
  int fault_code; /* si_code: SI_KERNEL for a general protection fault */
  uintptr_t fault_addr;
};

/* Literal pool strings of committed migrations: memory the runtime keeps for
 * the life of the process (the new version points into it).  Touched only
 * by the migrating thread at commit, which is serialised by the operation
 * lock, so no lock is needed. */
static vec kept_pool;

static void fail(molt__xf_ctx *cx, int code, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
static void run_hook(molt__xf_ctx *cx);
/* The migration whose hook (run_hook) is running, NULL otherwise.  Read by
 * molt_migrated and molt_migrated_store, which act only on the migrating
 * thread (guard_tid, set before the hook runs and read on the same thread:
 * program order); on any other thread they do nothing special. */
static molt__xf_ctx *hook_cx;

/* ------------------------------------------------------------------------ */
/* Memory for big tables                                                     */
/* ------------------------------------------------------------------------ */

#define HUGE_BYTES ((size_t)2 << 20)
#define BIG_BYTES ((size_t)1 << 20)

/* Zeroed memory straight from the kernel.  Pages are materialised on first
 * touch, so a generously sized table costs only what is used.  With huge,
 * transparent huge pages are requested (MADV_HUGEPAGE; the kernel may say
 * no, which only costs speed): one fault and one TLB entry per 2 MiB
 * instead of per 4 KiB, which is most of the cost of probing a table of
 * millions of entries at random. */
static void *big_alloc(size_t bytes, bool huge) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  if (huge && bytes >= HUGE_BYTES)
    (void)madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

static void big_free(void *p, size_t bytes) {
  if (p)
    munmap(p, bytes);
}

static bool vec_reserve(vec *v, size_t elem, size_t more) {
  if (v->cap - v->n >= more)
    return true;
  size_t cap = v->cap ? v->cap : 64;
  while (cap - v->n < more)
    cap *= 2;
  size_t bytes = cap * elem;
  if (bytes < BIG_BYTES) {
    void *p = realloc(v->p, bytes);
    if (!p)
      return false;
    v->p = p;
  } else if (v->mapped) {
    void *p = mremap(v->p, v->cap * elem, bytes, MREMAP_MAYMOVE);
    if (p == MAP_FAILED)
      return false;
    (void)madvise(p, bytes, MADV_HUGEPAGE);
    v->p = p;
  } else {
    void *p = big_alloc(bytes, true);
    if (!p)
      return false;
    if (v->n)
      memcpy(p, v->p, v->n * elem);
    free(v->p);
    v->p = p;
    v->mapped = true;
  }
  v->cap = cap;
  return true;
}

/* Pushes during a migration: out of memory aborts the migration. */
#define VPUSH(cx, v, type, ...)                                                          \
  do {                                                                                   \
    if (__builtin_expect((v)->n == (v)->cap, 0) && !vec_reserve((v), sizeof(type), 1))   \
      fail((cx), MOLT_ENOMEM, "out of memory while migrating the state");                \
    ((type *)(v)->p)[(v)->n++] = (type)__VA_ARGS__;                                      \
  } while (0)

static void vec_free(vec *v, size_t elem) {
  if (v->mapped)
    big_free(v->p, v->cap * elem);
  else
    free(v->p);
  v->p = NULL;
  v->n = v->cap = 0;
  v->mapped = false;
}

/* ------------------------------------------------------------------------ */
/* The old heap and its key bitmap                                           */
/* ------------------------------------------------------------------------ */

/* The heap mapping holding p, or NULL.  Objects cluster in few mappings:
 * the one that answered last is tried first. */
static inline const heap_span *heap_find(molt__xf_ctx *cx, uintptr_t p) {
  const heap_span *h = cx->heap.p;
  size_t i = cx->heap_last;
  if (i < cx->heap.n && p - h[i].lo < h[i].hi - h[i].lo)
    return &h[i];
  size_t lo = 0, hi = cx->heap.n; /* /proc/self/maps is sorted */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (h[mid].lo <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0 || p >= h[lo - 1].hi)
    return NULL;
  cx->heap_last = lo - 1;
  return &h[lo - 1];
}

static inline bool in_heap(molt__xf_ctx *cx, uintptr_t p) {
  return heap_find(cx, p) != NULL;
}

static inline size_t granule(const heap_span *h, uintptr_t p) {
  return h->g0 + ((p - h->lo) >> 4);
}

/* Records that key k is in the map (a heap address only: other pointers
 * always probe the map). */
static inline void kbits_set(molt__xf_ctx *cx, uintptr_t k) {
  if (!cx->kbits_bytes)
    return;
  const heap_span *h = heap_find(cx, k);
  if (!h)
    return;
  size_t g = granule(h, k);
  uint64_t m = 1ull << (g & 63);
  if (cx->kbits[g >> 6] & m)
    cx->kbits_shared = true;
  cx->kbits[g >> 6] |= m;
}

/* False only if p is certainly no key of the map. */
static inline bool maybe_key(molt__xf_ctx *cx, uintptr_t p) {
  if (!cx->kbits_bytes)
    return true;
  const heap_span *h = heap_find(cx, p);
  if (!h)
    return true;
  size_t g = granule(h, p);
  return (cx->kbits[g >> 6] >> (g & 63)) & 1;
}

/* Any key bit in granules [a, b)? */
static bool kbits_any(const molt__xf_ctx *cx, size_t a, size_t b) {
  const uint64_t *w = cx->kbits;
  while (a < b && (a & 63)) {
    if ((w[a >> 6] >> (a & 63)) & 1)
      return true;
    a++;
  }
  for (; a + 64 <= b; a += 64)
    if (w[a >> 6])
      return true;
  for (; a < b; a++)
    if ((w[a >> 6] >> (a & 63)) & 1)
      return true;
  return false;
}

/* ------------------------------------------------------------------------ */
/* The old -> new map: open addressing, linear probing                       */
/* ------------------------------------------------------------------------ */

/*
 * Slot of address k.  Objects that lie in the same 4 KiB page of the old
 * heap get consecutive slots of one 256-slot window, in address order, and
 * each page gets a pseudo-random window (Fibonacci hashing of the page
 * number: the top bits of the product depend on every bit).  Programs
 * allocate related objects together, so a traversal touches the table
 * mostly sequentially instead of missing the cache on every object; and
 * no regular stride can make distinct pages collide systematically.
 */
static inline size_t hash_ptr(const molt__xf_ctx *cx, uintptr_t k) {
  size_t page = (size_t)(((uint64_t)(k >> 12) * 0x9E3779B97F4A7C15ull) >> cx->map_shift);
  return ((page << 8) | ((k >> 4) & 255)) & cx->map_mask;
}

/* The entry for k, or the empty slot (rec == 0) where k would be
 * inserted. */
static inline map_ent *map_slot(const molt__xf_ctx *cx, uintptr_t k) {
  const map_rec *r = cx->recs.p;
  uint32_t tag = map_tag(k);
  for (size_t i = hash_ptr(cx, k);; i = (i + 1) & cx->map_mask) {
    map_ent *e = &cx->map[i];
    if (e->rec == 0 || (e->tag == tag && r[e->rec - 1].key == k))
      return e;
  }
}

static inline map_rec *map_rec_of(const molt__xf_ctx *cx, const map_ent *e) {
  return &((map_rec *)cx->recs.p)[e->rec - 1];
}

static inline map_rec *map_find(const molt__xf_ctx *cx, uintptr_t k) {
  map_ent *e = map_slot(cx, k);
  return e->rec ? map_rec_of(cx, e) : NULL;
}

/* Load factor at most 1/2: linear probing then needs ~2.5 probes for a
 * miss (the common case: every new object is a miss) instead of ~8.5 at
 * 3/4. */

static inline bool map_full(const molt__xf_ctx *cx) {
  return (cx->map_n + 1) * 2 > cx->map_mask + 1;
}

static bool map_alloc(molt__xf_ctx *cx, unsigned log2cap) {
  size_t cap = (size_t)1 << log2cap;
  map_ent *m = big_alloc(cap * sizeof *m, true);
  if (!m)
    return false;
  cx->map = m;
  cx->map_mask = cap - 1;
  cx->map_shift = 64 - log2cap;
  return true;
}

static bool map_grow(molt__xf_ctx *cx) {
  map_ent *old = cx->map;
  size_t old_cap = cx->map_mask + 1;
  if (!map_alloc(cx, 64 - cx->map_shift + 1)) {
    cx->map = old;
    return false;
  }
  /* Every record is in the map (keys are unique): re-place them in order. */
  const map_rec *r = cx->recs.p;
  for (size_t i = 0; i < cx->recs.n; i++) {
    size_t j = hash_ptr(cx, r[i].key);
    while (cx->map[j].rec)
      j = (j + 1) & cx->map_mask;
    cx->map[j] = (map_ent){map_tag(r[i].key), (uint32_t)(i + 1)};
  }
  big_free(old, old_cap * sizeof *old);
  return true;
}

/* Makes room for one insertion (so that a slot found now stays valid and
 * the record can be appended without failing). */
static inline void map_reserve(molt__xf_ctx *cx) {
  if (__builtin_expect(map_full(cx), 0) && !map_grow(cx))
    fail(cx, MOLT_ENOMEM, "out of memory while migrating the state");
  if (__builtin_expect(cx->recs.n == cx->recs.cap, 0) &&
      (cx->recs.n >= MAP_MAX_RECS || !vec_reserve(&cx->recs, sizeof(map_rec), 1)))
    fail(cx, MOLT_ENOMEM, "out of memory while migrating the state");
}

/* Fills the empty slot e (found by map_slot after map_reserve) with k. */
static inline void map_put(molt__xf_ctx *cx, map_ent *e, uintptr_t k, void *val,
                           const molt__xf_type *t, size_t count) {
  size_t r = cx->recs.n++;
  ((map_rec *)cx->recs.p)[r] = (map_rec){k, val, t, count};
  *e = (map_ent){map_tag(k), (uint32_t)(r + 1)};
  cx->map_n++;
  kbits_set(cx, k);
}

/* Inserts k (not present). */
static inline void map_insert(molt__xf_ctx *cx, uintptr_t k, void *val,
                              const molt__xf_type *t, size_t count) {
  map_reserve(cx);
  map_put(cx, map_slot(cx, k), k, val, t, count);
}

/* ------------------------------------------------------------------------ */
/* Failure and the fault guard                                               */
/* ------------------------------------------------------------------------ */

/*
 * The guard.  Only one migration runs at a time in the process (operation
 * lock), so its state is static.  Signal-safety and ordering:
 *  - guard_cx and the context's jmp_buf are written by the migrating
 *    thread before it arms the guard and read by the handler only when it
 *    runs ON that thread (synchronous fault), i.e. in program order with
 *    those writes; atomic_signal_fence keeps the compiler from moving the
 *    writes past the arming store.
 *  - guard_tid is read by handlers on any thread (a fault elsewhere): it is
 *    a lock-free atomic, so the read is async-signal-safe and never torn.
 *    A stale read cannot match: a thread id is unique among live threads.
 *  - guard_armed is a volatile sig_atomic_t: cleared by the handler before
 *    it jumps, so a second fault during the unwind is not caught again.
 */
static molt__xf_ctx *guard_cx;
static _Atomic pid_t guard_tid;
static volatile sig_atomic_t guard_armed;
static const int guard_sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
#define NGUARD (sizeof guard_sigs / sizeof guard_sigs[0])
static struct sigaction guard_prev[NGUARD];
/* The alternate stack, so that a stack overflow in a transformer is caught
 * too.  Generous: when a fault is not ours the previous handler (e.g.
 * AddressSanitizer's, which symbolizes) runs on it. */
#define GUARD_STACK_BYTES (256u << 10)

static void guard_handler(int sig, siginfo_t *si, void *uc) {
  /* si_code > 0: raised by the kernel for an instruction of this thread.
   * A SIGSEGV sent with kill()/tgkill() (si_code <= 0) is not a fault of
   * the transformer and is passed on like any other signal. */
  if (guard_armed && si->si_code > 0 &&
      atomic_load_explicit(&guard_tid, memory_order_relaxed) == molt__gettid()) {
    guard_armed = 0;
    guard_cx->fault_sig = sig;
    guard_cx->fault_addr = (uintptr_t)si->si_addr;
    guard_cx->fault_code = si->si_code;
    /* Restores the signal mask saved by sigsetjmp (the signal is unblocked
     * again) and leaves the alternate stack. */
    siglongjmp(guard_cx->jb, 1);
  }
  /* Not ours.  Chain to the previous handler when there is one, so that
   * the guard stays in place for the migrating thread (another thread's
   * fault must not leave the rest of the migration unguarded).  With the
   * default action, put it back and return: a synchronous fault
   * re-executes the instruction and gets exactly the default treatment (the
   * process is going down anyway); a signal sent with kill() is raised
   * again so that it is not lost. */
  for (size_t i = 0; i < NGUARD; i++) {
    if (guard_sigs[i] != sig)
      continue;
    const struct sigaction *prev = &guard_prev[i];
    if (prev->sa_flags & SA_SIGINFO) {
      prev->sa_sigaction(sig, si, uc);
      return;
    }
    if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
      prev->sa_handler(sig);
      return;
    }
    sigaction(sig, prev, NULL);
    if (si->si_code <= 0)
      raise(sig);
    return;
  }
}

typedef struct guard_state {
  stack_t old_ss;
  void *stack;
  bool ss_set;
  bool installed[NGUARD];
} guard_state;

static int guard_install(molt__xf_ctx *cx, guard_state *g) {
  memset(g, 0, sizeof *g);
  g->stack = malloc(GUARD_STACK_BYTES);
  if (!g->stack)
    return MOLT_ENOMEM;
  stack_t ss = {.ss_sp = g->stack, .ss_size = GUARD_STACK_BYTES, .ss_flags = 0};
  if (sigaltstack(&ss, &g->old_ss) == 0)
    g->ss_set = true;
  guard_cx = cx;
  atomic_store_explicit(&guard_tid, molt__gettid(), memory_order_relaxed);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = guard_handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < NGUARD; i++) {
    g->installed[i] = sigaction(guard_sigs[i], &sa, &guard_prev[i]) == 0;
    /* Read back: a sanitizer that owns the signal (ASAN_OPTIONS
     * handle_segv=2) reports success without installing anything.  The
     * migration still runs, but a fault in it is then the sanitizer's. */
    struct sigaction cur;
    if (g->installed[i] && sigaction(guard_sigs[i], NULL, &cur) == 0 &&
        cur.sa_sigaction != guard_handler) {
      g->installed[i] = false;
      molt__log(MOLT__EV_INFO, 0, NULL,
                "full update: cannot guard the migration against signal %d "
                "(another handler owns it); a fault will not be recovered",
                guard_sigs[i]);
    }
  }
  /* Everything the handler reads is written above; arm last. */
  atomic_signal_fence(memory_order_seq_cst);
  guard_armed = 1;
  return 0;
}

static void guard_remove(guard_state *g) {
  guard_armed = 0;
  atomic_signal_fence(memory_order_seq_cst);
  for (size_t i = 0; i < NGUARD; i++)
    if (g->installed[i])
      sigaction(guard_sigs[i], &guard_prev[i], NULL);
  atomic_store_explicit(&guard_tid, 0, memory_order_relaxed);
  if (g->ss_set) {
    /* Put back the previous alternate stack (AddressSanitizer installs its
     * own on each thread), or disable ours if there was none. */
    if (g->old_ss.ss_flags & SS_DISABLE) {
      stack_t off = {.ss_flags = SS_DISABLE};
      sigaltstack(&off, NULL);
    } else {
      sigaltstack(&g->old_ss, NULL);
    }
  }
  free(g->stack);
  g->stack = NULL;
}

/* ------------------------------------------------------------------------ */
/* The deadline                                                              */
/* ------------------------------------------------------------------------ */

/*
 * A migration that does not end (a rule that loops) must not hold the
 * process for ever: at its deadline (molt__xf_set_limit) the update aborts
 * the way it does after a fault.  A POSIX timer on CLOCK_MONOTONIC sends
 * DEADLINE_SIG to the migrating thread alone (SIGEV_THREAD_ID), once at the
 * deadline and then every DEADLINE_TICK_MS.  What the signal interrupts
 * decides what the handler may do:
 *
 *  - code of one of the two program images (the generated migration code,
 *    rule bodies, functions of the program they call): the handler escapes
 *    at once with siglongjmp, exactly like the fault guard.  Image code is
 *    entered from the engine only at call sites where the engine's state is
 *    consistent (the fault guard relies on that too), and while the PC is
 *    in an image no libc function is running on this thread, so no lock
 *    libc takes on its own behalf (malloc's arenas, stdio, the loader) is
 *    held;
 *  - anything else (libc, e.g. inside malloc; libmolt; a sanitizer's
 *    runtime): the handler only records that the deadline passed
 *    (deadline_hit) and returns.  The engine checks deadline_hit at each
 *    entry point the generated code calls and before each work item, and
 *    fails there like any other failure (fail(), no lock held); code that
 *    stays in libc is escaped by a later tick that finds it back in the
 *    image.
 *
 * What this cannot do (docs/full-updates.md, "The time limit"): a rule
 * that takes a lock itself (flockfile, a mutex of the program) and is
 * escaped while holding it leaves it held, and so does a rule that loops
 * in a callback a library function calls (the PC is in the image, the
 * library's frames are below it: dl_iterate_phdr's callback leaves the
 * loader's lock held); a rule blocked for ever in a system call that libc
 * retries after each signal (a lock's futex) is escaped only
 * DEADLINE_STUCK_MS after the deadline, and one that spins in a library
 * without a system call is not escaped at all.  Under
 * ThreadSanitizer, which delays asynchronous signals until the thread
 * enters its runtime, a loop that never calls anything is not escaped
 * either.
 *
 * Signal-safety and ordering: the timer targets the migrating thread, and
 * a DEADLINE_SIG that is not our timer's (si_code, cookie) is passed on to
 * the previous handler; so the handler runs on the migrating thread and
 * sees its writes in program order.  deadline_armed and deadline_hit are
 * volatile sig_atomic_t; everything else the handler reads (guard_cx and
 * its images, deadline_ns) is written before deadline_armed is set, and
 * atomic_signal_fence keeps the compiler from sinking those writes past
 * it.  A tick of an earlier migration's timer that was still pending when
 * its timer was deleted finds deadline_armed clear, or a deadline not yet
 * reached, and is ignored.
 */
#define DEADLINE_SIG (SIGRTMAX - 3)
#define DEADLINE_TICK_MS 1
/* How long past the deadline a migration blocked in a system call outside
 * the images is waited for before it is escaped from (deadline_handler). */
#define DEADLINE_STUCK_MS 1000u

static volatile sig_atomic_t deadline_armed; /* a deadline is being timed */
static volatile sig_atomic_t deadline_hit;   /* it passed: fail at the next check */
static char deadline_cookie;                 /* sival_ptr of our timer's signals */
static struct sigaction deadline_prev;

/* What was set up for a migration's deadline.  Static (one migration at a
 * time, operation lock): it is written after the sigsetjmp and read after
 * a siglongjmp, which a local variable of that frame would not survive. */
static struct deadline_state {
  timer_t timer;
  sigset_t old_mask;
  bool installed, have_timer, mask_set;
} dl;

/* The program counter the signal interrupted, 0 if unknown. */
static uintptr_t interrupted_pc(const void *uc) {
#if defined(__x86_64__)
  return (uintptr_t)((const ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
  return (uintptr_t)((const ucontext_t *)uc)->uc_mcontext.pc;
#else
  (void)uc;
  return 0; /* only the engine's own checks end such a migration */
#endif
}

/* Whether the signal interrupted a blocking system call (which returns
 * EINTR: our handler has no SA_RESTART): the instruction before the PC is
 * the system call instruction and its result register holds -EINTR.  A
 * lock's futex wait in libc is such a call, retried by libc for ever. */
static bool interrupted_syscall(const void *uc, uintptr_t pc) {
#if defined(__x86_64__)
  const unsigned char *ins = (const unsigned char *)pc - 2;
  return pc > 2 && ins[0] == 0x0f && ins[1] == 0x05 &&
         ((const ucontext_t *)uc)->uc_mcontext.gregs[REG_RAX] == -EINTR;
#elif defined(__aarch64__)
  uint32_t ins;
  memcpy(&ins, (const void *)(pc - 4), sizeof ins);
  return pc > 4 && ins == 0xd4000001u /* svc #0 */ &&
         (long)((const ucontext_t *)uc)->uc_mcontext.regs[0] == -EINTR;
#else
  (void)uc;
  (void)pc;
  return false;
#endif
}

static bool in_code_of(const molt__image *im, uintptr_t pc) {
  for (size_t i = 0; im && i < im->nranges; i++)
    if ((im->ranges[i].prot & PF_X) && pc >= im->ranges[i].lo && pc < im->ranges[i].hi)
      return true;
  return false;
}

static void deadline_handler(int sig, siginfo_t *si, void *uc) {
  if (si->si_code == SI_TIMER && si->si_value.sival_ptr == &deadline_cookie) {
    if (!deadline_armed ||
        atomic_load_explicit(&guard_tid, memory_order_relaxed) != molt__gettid())
      return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now); /* async-signal-safe */
    if ((uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec <
        guard_cx->deadline_ns)
      return; /* a late tick of an earlier migration */
    deadline_hit = 1;
    uintptr_t pc = interrupted_pc(uc);
    if (pc && (in_code_of(guard_cx->new, pc) || in_code_of(guard_cx->old, pc))) {
      deadline_armed = 0;
      guard_armed = 0;
      siglongjmp(guard_cx->jb, 3);
    }
    /* Outside the images.  Blocked in a system call that libc retries for
     * ever (the futex of a lock a parked thread holds, a semaphore, a
     * condition variable) for DEADLINE_STUCK_MS past the deadline: nothing
     * else will ever end it, and `molt update` must answer.  Such a thread
     * waits and holds no lock of libc's own (a mutex it waited for may be
     * left marked contended, which costs its owner one futex wake; a
     * condition variable it waited on may be left inconsistent): escaping
     * is the lesser harm, and the message says so. */
    if (pc && interrupted_syscall(uc, pc) &&
        (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec >=
            guard_cx->deadline_ns + DEADLINE_STUCK_MS * 1000000ull) {
      deadline_armed = 0;
      guard_armed = 0;
      siglongjmp(guard_cx->jb, 4);
    }
    return; /* the engine's next check, or a later tick */
  }
  /* Not ours: as if we were not there. */
  if (deadline_prev.sa_flags & SA_SIGINFO) {
    deadline_prev.sa_sigaction(sig, si, uc);
  } else if (deadline_prev.sa_handler != SIG_DFL && deadline_prev.sa_handler != SIG_IGN) {
    deadline_prev.sa_handler(sig);
  } else if (deadline_prev.sa_handler == SIG_DFL) {
    /* The default action of a real-time signal ends the process: let it. */
    sigaction(sig, &deadline_prev, NULL);
    raise(sig);
  }
}

/* Starts timing cx's migration on the calling thread (after the sigsetjmp
 * the handler jumps to).  Without a timer (the system refuses one) the
 * migration runs untimed: logged, never fatal. */
static void deadline_start(molt__xf_ctx *cx) {
  memset(&dl, 0, sizeof dl);
  deadline_hit = 0;
  if (!cx->limit_ms)
    return;
  cx->deadline_ns = molt__now_ns() + (uint64_t)cx->limit_ms * 1000000u;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = deadline_handler;
  /* No SA_RESTART: a rule blocked in a system call gets EINTR at a tick
   * and comes back into the image, where the next tick escapes it. */
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  struct sigevent sev;
  memset(&sev, 0, sizeof sev);
  sev.sigev_notify = SIGEV_THREAD_ID;
  sev.sigev_signo = DEADLINE_SIG;
  sev.sigev_value.sival_ptr = &deadline_cookie;
  sev._sigev_un._tid = molt__gettid();
  if (sigaction(DEADLINE_SIG, &sa, &deadline_prev) == 0) {
    dl.installed = true;
    dl.have_timer = timer_create(CLOCK_MONOTONIC, &sev, &dl.timer) == 0;
  }
  if (!dl.have_timer) {
    molt__log(MOLT__EV_INFO, 0, NULL,
              "full update: cannot time the migration (%s); it runs without its "
              "deadline of %u ms",
              strerror(errno), cx->limit_ms);
    return;
  }
  /* Everything the handler reads is written above; arm, then start. */
  atomic_signal_fence(memory_order_seq_cst);
  deadline_armed = 1;
  struct itimerspec its = {
      .it_value = {cx->limit_ms / 1000, (long)(cx->limit_ms % 1000) * 1000000L},
      .it_interval = {0, DEADLINE_TICK_MS * 1000000L}};
  timer_settime(dl.timer, 0, &its, NULL);
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, DEADLINE_SIG);
  /* The runtime thread blocks every signal; this one it takes now. */
  dl.mask_set = pthread_sigmask(SIG_UNBLOCK, &s, &dl.old_mask) == 0;
}

/* Stops timing (both after a normal end and after a jump, whose sigsetjmp
 * mask has DEADLINE_SIG as it was before deadline_start). */
static void deadline_stop(void) {
  deadline_armed = 0;
  deadline_hit = 0;
  atomic_signal_fence(memory_order_seq_cst);
  if (dl.have_timer)
    timer_delete(dl.timer);
  if (dl.installed) {
    /* A tick still pending is delivered here, to our handler, which
     * ignores it (not armed) -- not later to whatever handles the signal
     * then. */
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, DEADLINE_SIG);
    pthread_sigmask(SIG_UNBLOCK, &s, NULL);
    if (dl.mask_set)
      pthread_sigmask(SIG_SETMASK, &dl.old_mask, NULL);
    else
      pthread_sigmask(SIG_BLOCK, &s, NULL); /* unblocked above only */
    sigaction(DEADLINE_SIG, &deadline_prev, NULL);
  }
  memset(&dl, 0, sizeof dl);
}

static void timed_out(molt__xf_ctx *cx) __attribute__((noreturn, cold));

/* The engine's check point: fails once the deadline has passed. */
static inline void deadline_check(molt__xf_ctx *cx) {
  if (__builtin_expect(deadline_hit, 0))
    timed_out(cx);
}

/* Aborts the migration: records the message and jumps back into
 * molt__xf_migrate, which restores the old state. */
static void fail(molt__xf_ctx *cx, int code, const char *fmt, ...) {
  if (!cx->err_code) { /* the first failure is the cause */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cx->err, sizeof cx->err, fmt, ap);
    va_end(ap);
    cx->err_code = code;
  }
  if (cx->migrating)
    siglongjmp(cx->jb, 2);
  /* molt__xf_* called outside molt__xf_migrate: only generated code calls
   * them, and only from migrate(), so this is a broken image.  There is no
   * frame to return to (the caller was promised no return), and the runtime
   * must not kill its host: the runtime refuses further updates (status
   * shows why) and only the offending thread ends; the rest of the process
   * keeps running. */
  molt__fail("molt__xf_* called outside a migration: %s", cx->err);
  pthread_exit(NULL);
}

static const char *tname(const molt__xf_type *t);

/* The deadline passed (deadline_check, or the handler found the thread
 * outside the images once and it came back into the engine). */
static void timed_out(molt__xf_ctx *cx) {
  deadline_armed = 0;
  if (cx->cur_t)
    fail(cx, MOLT_ETIMEDOUT,
         "migration timed out after %u ms (in the transformer for %s); update aborted, "
         "the old version continues",
         cx->limit_ms, tname(cx->cur_t));
  fail(cx, MOLT_ETIMEDOUT,
       "migration timed out after %u ms; update aborted, the old version continues",
       cx->limit_ms);
}

/* ------------------------------------------------------------------------ */
/* Classification helpers                                                    */
/* ------------------------------------------------------------------------ */

static const char *tname(const molt__xf_type *t) {
  return t && t->name ? t->name : "untyped data";
}

static int var_cmp(const void *a, const void *b) {
  const var_range *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The migrated variable range holding p (one past the end included: C
 * allows pointing there), or NULL. */
static const var_range *var_at(molt__xf_ctx *cx, uintptr_t p) {
  if (!cx->vars_sorted) {
    qsort(cx->vars.p, cx->vars.n, sizeof(var_range), var_cmp);
    cx->vars_sorted = true;
  }
  const var_range *v = cx->vars.p;
  size_t lo = 0, hi = cx->vars.n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (v[mid].lo <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0)
    return NULL;
  const var_range *r = &v[lo - 1];
  return p - r->lo <= r->size ? r : NULL;
}

/* Why an old-image address could not be redirected (for the message). */
typedef struct redirect_err {
  int code;
  char msg[400];
} redirect_err;

/* New address for old-image address p at offset off into an old object of
 * `old_size` bytes whose new counterpart is at np with `new_size` bytes.
 * Offsets survive unchanged sizes; element-wise for a known type. */
static bool shift(uintptr_t np, size_t off, size_t old_size, size_t new_size,
                  const molt__xf_type *t, uintptr_t *out) {
  if (off == 0) {
    *out = np;
    return true;
  }
  if (old_size == new_size && !(t && (t->flags & MOLT__XF_CHANGED))) {
    *out = np + off;
    return true;
  }
  if (t && t->old_size && off % t->old_size == 0) {
    *out = np + off / t->old_size * t->new_size;
    return true;
  }
  return false;
}

/* Redirects an address inside the old image (prot != 0) to the new one.
 * Returns false with e filled if it cannot; never jumps (also used after
 * the migration by molt__xf_redirect).  *cacheable: the answer depends only
 * on the two images (functions, constants, literals), not on later
 * molt__xf_map_var calls. */
static bool image_redirect(molt__xf_ctx *cx, uintptr_t p, unsigned prot,
                           const molt__xf_type *t, size_t count, uintptr_t *out,
                           bool *pooled, redirect_err *e) {
  const char *name = NULL, *tu = NULL;
  uintptr_t start = 0;
  size_t size = 0;
  bool is_func = false;
  bool have = molt__image_sym_at(cx->old, p, &name, &tu, &start, &size, &is_func);
  *pooled = false;

  if (prot & PF_X) {
    if (!have) {
      e->code = MOLT_EXFORM;
      snprintf(e->msg, sizeof e->msg,
               "old data points to code at 0x%lx of the old version that is no "
               "function",
               (unsigned long)p);
      return false;
    }
    void *np = molt__image_sym(cx->new, name, tu);
    if (!np) {
      e->code = MOLT_ENOSYM;
      snprintf(e->msg, sizeof e->msg,
               "the new version has no function %s%s%s%s but old data points to it", name,
               tu ? " (" : "", tu ? tu : "", tu ? ")" : "");
      return false;
    }
    size_t nsize = 0;
    molt__image_sym_at(cx->new, (uintptr_t)np, NULL, NULL, NULL, &nsize, NULL);
    if (!shift((uintptr_t)np, p - start, size, nsize, NULL, out)) {
      e->code = MOLT_EXFORM;
      snprintf(e->msg, sizeof e->msg,
               "old data points into the middle of function %s (+%lu), which "
               "changed size",
               name, (unsigned long)(p - start));
      return false;
    }
    return true;
  }

  if (prot & PF_W) {
    const var_range *v = var_at(cx, p);
    /* One past the end of a migrated variable that is also the start of
     * another variable: it is the other variable. */
    if (v && p == v->lo + v->size && have && start == p)
      v = NULL;
    if (v) {
      size_t off = p - v->lo;
      if (shift(v->out, off, v->size, v->t ? v->t->new_size * v->count : v->size, v->t,
                out))
        return true;
      e->code = MOLT_EXFORM;
      snprintf(e->msg, sizeof e->msg,
               "pointer 0x%lx into the middle of an element of migrated variable "
               "of changed type %s (+%lu)",
               (unsigned long)p, tname(v->t),
               (unsigned long)(v->t && v->t->old_size ? off % v->t->old_size : off));
      return false;
    }
  }

  if (have && !is_func) {
    /* A variable that was not migrated (or a constant): the new version's
     * object of the same name. */
    void *np = molt__image_sym(cx->new, name, tu);
    if (np) {
      size_t nsize = 0;
      molt__image_sym_at(cx->new, (uintptr_t)np, NULL, NULL, NULL, &nsize, NULL);
      if (shift((uintptr_t)np, p - start, size, nsize, t, out))
        return true;
      e->code = MOLT_EXFORM;
      snprintf(e->msg, sizeof e->msg,
               "pointer 0x%lx into variable %s%s%s%s (+%lu), whose size changed "
               "(%zu -> %zu bytes)",
               (unsigned long)p, name, tu ? " (" : "", tu ? tu : "", tu ? ")" : "",
               (unsigned long)(p - start), size, nsize);
      return false;
    }
    if (prot & PF_W) {
      e->code = MOLT_ENOSYM;
      snprintf(e->msg, sizeof e->msg,
               "the new version has no variable %s%s%s%s but old data points to it", name,
               tu ? " (" : "", tu ? tu : "", tu ? ")" : "");
      return false;
    }
    /* A constant the new version dropped: its bytes are immutable and (in
     * a PIC image) free of relocated pointers, so a kept copy is faithful. */
    char *c = malloc(size ? size : 1);
    if (!c) {
      e->code = MOLT_ENOMEM;
      snprintf(e->msg, sizeof e->msg, "out of memory copying constant %s", name);
      return false;
    }
    memcpy(c, (const void *)start, size);
    *out = (uintptr_t)c + (p - start);
    *pooled = true;
    return true;
  }

  if (prot & PF_W) {
    e->code = MOLT_EXFORM;
    snprintf(e->msg, sizeof e->msg,
             "pointer 0x%lx into the old version's data matches no variable",
             (unsigned long)p);
    return false;
  }

  /* Read-only, no symbol: a string literal (or other anonymous constant).
   * Copy it out of the old image, bounded by the end of its segment. */
  uintptr_t seg_end = 0;
  for (size_t i = 0; i < cx->old->nranges; i++)
    if (p >= cx->old->ranges[i].lo && p < cx->old->ranges[i].hi)
      seg_end = cx->old->ranges[i].hi;
  size_t len;
  if (t && t->old_size) /* typed, unchanged constant */
    len = t->old_size * count < seg_end - p ? t->old_size * count : seg_end - p;
  else
    len = strnlen((const char *)p, seg_end - p);
  char *c = malloc(len + 1);
  if (!c) {
    e->code = MOLT_ENOMEM;
    snprintf(e->msg, sizeof e->msg, "out of memory copying a string literal");
    return false;
  }
  memcpy(c, (const void *)p, len);
  c[len] = '\0';
  *out = (uintptr_t)c;
  *pooled = true;
  return true;
}

/* ------------------------------------------------------------------------ */
/* The ABI (called by generated code inside the new image)                   */
/* ------------------------------------------------------------------------ */

static void *sym_or_fail(molt__xf_ctx *cx, const molt__image *im, const char *which,
                         const char *name, const char *tu) {
  deadline_check(cx);
  void *p = name ? molt__image_sym(im, name, tu) : NULL;
  if (!p)
    fail(cx, MOLT_ENOSYM, "the %s version has no symbol %s%s%s%s", which,
         name ? name : "(null)", tu ? " (" : "", tu ? tu : "", tu ? ")" : "");
  return p;
}

void *molt__xf_oldsym(molt__xf_ctx *cx, const char *name, const char *tu) {
  return sym_or_fail(cx, cx->old, "old", name, tu);
}

void *molt__xf_newsym(molt__xf_ctx *cx, const char *name, const char *tu) {
  return sym_or_fail(cx, cx->new, "new", name, tu);
}

void molt__xf_map_var(molt__xf_ctx *cx, const void *in, void *out, const molt__xf_type *t,
                      size_t count) {
  deadline_check(cx);
  if (!in || !out || !t || count == 0)
    fail(cx, MOLT_EINVAL, "molt__xf_map_var: invalid arguments for %s", tname(t));
  VPUSH(cx, &cx->vars, var_range,
        {(uintptr_t)in, t->old_size * count, (uintptr_t)out, t, count});
  cx->vars_sorted = false;
  /* Variables are not recorded for the interior check: a pointer into the
   * middle of one is redirected element-wise (image_redirect). */
}

void molt__xf_rule(molt__xf_ctx *cx, const char *what) {
  deadline_check(cx);
  cx->cur_rule = what;
}

static inline void push_work(molt__xf_ctx *cx, const void *in, void *out,
                             const molt__xf_type *t, size_t count, bool in_place) {
  VPUSH(cx, &cx->work, work_item, {in, out, t, count, in_place, NULL});
}

/* Whether [p, p + size) lies in readable memory of the process (old
 * objects all exist before the migration starts, when the mappings were
 * read).  The heap answers most questions without a search. */
static bool readable(molt__xf_ctx *cx, uintptr_t p, size_t size) {
  uintptr_t end = p + (size ? size : 1);
  if (end < p)
    return false;
  const heap_span *h = heap_find(cx, p);
  if (h && end <= h->hi)
    return true;
  const span *r = cx->readable.p;
  size_t lo = 0, hi = cx->readable.n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r[mid].lo <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo > 0 && end <= r[lo - 1].hi;
}

/* x86-64 and AArch64 user addresses have their top 17 (16) bits clear; a
 * pointer with them set is no address at all (the kernel reports a fault
 * on one as a general protection fault at address 0). */
static bool canonical(uintptr_t p) { return (p >> 47) == 0; }

/* Where the current work item's object is, for messages: "variable X
 * (file.c)" when it is a variable of the old image, else "<type> at 0x..";
 * plus the field that reached it. */
static void describe_cur(molt__xf_ctx *cx, char *buf, size_t len) {
  const char *name = NULL, *tu = NULL;
  uintptr_t in = (uintptr_t)cx->cur_in;
  if (in && molt__image_sym_at(cx->old, in, &name, &tu, NULL, NULL, NULL) && name)
    snprintf(buf, len, "variable %s%s%s%s", name, tu ? " (" : "", tu ? tu : "",
             tu ? ")" : "");
  else if (in)
    snprintf(buf, len, "%s at 0x%lx%s%s", tname(cx->cur_t), (unsigned long)in,
             cx->cur_via ? " reached through " : "", cx->cur_via ? cx->cur_via : "");
  else
    snprintf(buf, len, "the migration code");
}

/* p (to count objects of t) points to no readable memory: it cannot be a
 * live object (the old version would fault on it too), so it is kept as it
 * is and not followed; the update goes on, and the first such pointer is
 * logged with its field. */
static void bad_pointer(molt__xf_ctx *cx, uintptr_t p, const molt__xf_type *t,
                        const char *field) {
  if (cx->bad_ptrs++)
    return;
  char where[200];
  describe_cur(cx, where, sizeof where);
  snprintf(cx->bad_first, sizeof cx->bad_first, "%s%s = 0x%lx (%s, to %s) in %s",
           field ? "field " : "pointer", field ? field : "", (unsigned long)p,
           canonical(p) ? "unmapped" : "non-canonical", tname(t), where);
}

/* A variable of the new image that the compiler placed in read-only memory
 * (.rodata, or .data.rel.ro that the loader protects after relocation):
 * gcc does that with a static it sees never written, although DWARF does
 * not call it const, so writing its old value would fault.  The new
 * version never writes it, so its initializer is all it ever holds: it is
 * kept -- when the old version never wrote its copy either (read-only
 * there too).  An old copy that was writable may hold state the new
 * version cannot take: the update is refused, naming the variable. */
static bool readonly_var(molt__xf_ctx *cx, const void *in, void *out,
                         const molt__xf_type *t, size_t count) {
  size_t nsize = (t->new_size ? t->new_size : 1) * count;
  if (molt__image_writable(cx->new, (uintptr_t)out, nsize) ||
      !molt__image_prot_at(cx->new, (uintptr_t)out))
    return false;
  const char *name = "?", *tu = NULL;
  molt__image_sym_at(cx->new, (uintptr_t)out, &name, &tu, NULL, NULL, NULL);
  size_t osize = (t->old_size ? t->old_size : 1) * count;
  if (molt__image_writable(cx->old, (uintptr_t)in, osize))
    fail(cx, MOLT_EXFORM,
         "variable %s%s%s%s (%s) is read-only in the new version (the compiler placed it "
         "in read-only memory: the new version never writes it) but writable in the old "
         "one, whose value cannot be carried over; make it const in both versions, or "
         "mark it MOLT_NO_MIGRATE",
         name, tu ? " (" : "", tu ? tu : "", tu ? ")" : "", tname(t));
  molt__log(
      MOLT__EV_INFO, 0, NULL,
      "full update: variable %s%s%s%s is read-only in both versions (never written): "
      "it keeps the new version's initializer",
      name, tu ? " (" : "", tu ? tu : "", tu ? ")" : "");
  return true;
}

void molt__xf_var(molt__xf_ctx *cx, const void *in, void *out, const molt__xf_type *t,
                  size_t count) {
  molt__xf_map_var(cx, in, out, t, count); /* checks the deadline */
  if (readonly_var(cx, in, out, t, count))
    return;
  if (!(t->flags & MOLT__XF_CHANGED)) {
    if (t->old_size != t->new_size)
      fail(cx, MOLT_EINVAL, "type %s is marked unchanged but its size changed", tname(t));
    memcpy(out, in, t->old_size * count);
    cx->objects += count;
    cx->bytes += t->new_size * count;
    /* Visit the copy: it is new-image memory, so not in place (no undo). */
    if ((t->flags & MOLT__XF_TRAVERSE) && t->fn)
      push_work(cx, out, out, t, count, false);
  } else if (t->fn) {
    push_work(cx, in, out, t, count, false);
  }
}

/* An untyped heap pointer kept as it is: remembered, in case its target is
 * replaced later in the migration (check_untyped). */
static void note_untyped(molt__xf_ctx *cx, uintptr_t p, const char *field) {
  if (heap_find(cx, p))
    VPUSH(cx, &cx->untyped, untyped_ref, {p, field, cx->cur_t, (uintptr_t)cx->cur_in});
}

/* After the work list is drained: an untyped pointer kept as it was whose
 * target the migration then replaced (a heap object of a changed type,
 * reached first through a typed pointer) would point to freed memory once
 * the update commits -- the traversal could not type it, so it could not
 * redirect it.  Abort, naming it (a MOLT_VAR/MOLT_INST annotation, a typed
 * field or a rule lets the build know what it points to).  Untyped
 * pointers to objects migrated BEFORE them were redirected through the
 * map already. */
static void check_untyped(molt__xf_ctx *cx) {
  const untyped_ref *u = cx->untyped.p;
  for (size_t i = 0; i < cx->untyped.n; i++) {
    const map_rec *r = map_find(cx, u[i].p);
    if (!r || r->val == (void *)u[i].p || !(r->t->flags & MOLT__XF_CHANGED))
      continue;
    char holder[160];
    const char *name = NULL, *tu = NULL;
    if (u[i].holder &&
        molt__image_sym_at(cx->old, u[i].holder, &name, &tu, NULL, NULL, NULL) && name)
      snprintf(holder, sizeof holder, "variable %s", name);
    else if (u[i].holder)
      snprintf(holder, sizeof holder, "%s at 0x%lx", tname(u[i].holder_t),
               (unsigned long)u[i].holder);
    else
      snprintf(holder, sizeof holder, "a variable");
    fail(cx, MOLT_EXFORM,
         "an untyped pointer%s%s in %s points to %s at 0x%lx, which the update replaces "
         "(its type changed): the traversal cannot type the pointer, so it would be left "
         "to freed memory; give it a type (a typed field, MOLT_VAR/MOLT_INST) or migrate "
         "it in a rule",
         u[i].field ? " " : "", u[i].field ? u[i].field : "", holder, tname(r->t),
         (unsigned long)u[i].p);
  }
}

void *molt__xf_ptr(molt__xf_ctx *cx, const void *old, const molt__xf_type *t,
                   size_t count) {
  return molt__xf_fptr(cx, old, t, count, NULL);
}

void *molt__xf_fptr(molt__xf_ctx *cx, const void *old, const molt__xf_type *t,
                    size_t count, const char *field) {
  deadline_check(cx);
  if (!old)
    return NULL;
  uintptr_t p = (uintptr_t)old;
  if (cx->check_interior)
    VPUSH(cx, &cx->targets, uintptr_t, p);
  if (count == 0)
    count = 1;

  /* A pointer that is neither replaced nor visited when it is not in the
   * map (untyped, or of an unchanged type without pointers) is kept as it
   * is -- unless it is a key of the map or points into the old image.  The
   * key bitmap answers the first question for heap addresses without a
   * probe of the (large, randomly accessed) map. */
  if ((!t ||
       (!(t->flags & MOLT__XF_CHANGED) && !((t->flags & MOLT__XF_TRAVERSE) && t->fn))) &&
      p - cx->old_lo >= cx->old_hi - cx->old_lo && !maybe_key(cx, p)) {
    if (!t)
      note_untyped(cx, p, field);
    return (void *)old;
  }

  /* Reserve first: the slot found below is where a new object goes. */
  map_reserve(cx);
  map_ent *e = map_slot(cx, p);
  if (e->rec) {
    const map_rec *r = map_rec_of(cx, e);
    if (t && r->t == t && count > r->count && (t->flags & MOLT__XF_CHANGED))
      fail(cx, MOLT_EXFORM,
           "object at 0x%lx was migrated as %zu element(s) of %s but is also "
           "used as %zu",
           (unsigned long)p, r->count, tname(t), count);
    return r->val;
  }

  if (p - cx->old_lo < cx->old_hi - cx->old_lo) {
    unsigned prot = molt__image_prot_at(cx->old, p);
    if (prot) {
      uintptr_t np;
      bool pooled;
      redirect_err re;
      if (!(prot & (PF_X | PF_W)) && t && (t->flags & MOLT__XF_CHANGED) &&
          !molt__image_sym_at(cx->old, p, NULL, NULL, NULL, NULL, NULL))
        goto changed; /* an anonymous constant of a changed type: transform */
      if (!image_redirect(cx, p, prot, t, count, &np, &pooled, &re))
        fail(cx, re.code, "%s", re.msg);
      /* Functions, constants and literals depend only on the two images:
       * remember them (a million nodes pointing to the same function cost
       * one symbol lookup).  Variables go through the range table every
       * time, because a later molt__xf_map_var may cover them. */
      if (pooled) {
        /* Tracked before anything can fail, so that an abort frees it. */
        if (!vec_reserve(&cx->pools, sizeof(void *), 1)) {
          free((void *)np);
          fail(cx, MOLT_ENOMEM, "out of memory while migrating the state");
        }
        ((void **)cx->pools.p)[cx->pools.n++] = (void *)np;
      }
      if (pooled || (prot & PF_X))
        map_insert(cx, p, (void *)np, pooled ? &pool_marker : &image_marker, 1);
      return (void *)np;
    }
  }

  if (!t) {
    note_untyped(cx, p, field);
    return (void *)old;
  }
  if (((t->flags & MOLT__XF_CHANGED) || ((t->flags & MOLT__XF_TRAVERSE) && t->fn)) &&
      !readable(cx, p, (t->old_size ? t->old_size : 1) * count)) {
    bad_pointer(cx, p, t, field);
    return (void *)old;
  }
  if (t->flags & MOLT__XF_CHANGED) {
  changed:;
    void *n = calloc(count, t->new_size ? t->new_size : 1);
    if (!n)
      fail(cx, MOLT_ENOMEM, "out of memory allocating %zu new %s", count, tname(t));
    /* e is still the empty slot for p unless the image branch above
     * inserted (it returns, except for the goto, which inserts nothing);
     * map_reserve made room for the record. */
    map_put(cx, e, p, n, t, count);
    if (t->fn) {
      /* The old object is read when its item runs; start fetching it. */
      __builtin_prefetch(old);
      push_work(cx, old, n, t, count, false);
      ((work_item *)cx->work.p)[cx->work.n - 1].via = field;
    }
    if (cx->check_interior)
      VPUSH(cx, &cx->objs, span, {p, p + t->old_size * count, t->name});
    return n;
  }
  if ((t->flags & MOLT__XF_TRAVERSE) && t->fn) {
    map_put(cx, e, p, (void *)old, t, count);
    push_work(cx, old, (void *)old, t, count, true);
    ((work_item *)cx->work.p)[cx->work.n - 1].via = field;
    if (cx->check_interior)
      VPUSH(cx, &cx->objs, span, {p, p + t->old_size * count, t->name});
  }
  return (void *)old;
}

void molt__xf_setp(molt__xf_ctx *cx, void *slot, void *value) {
  deadline_check(cx);
  void **s = slot;
  /* In-place writes into old memory are logged so that an abort restores
   * them.  Outside a work item (a rule body in migrate()), anything not in
   * the new image is treated as old memory. */
  bool log = cx->cur_in_place;
  if (!cx->cur_t && !log)
    log = molt__image_prot_at(cx->new, (uintptr_t)slot) == 0;
  if (log && *s != value)
    VPUSH(cx, &cx->undo, undo_ent, {s, *s});
  *s = value;
}

void molt__xf_store_old(molt__xf_ctx *cx, void *slot, void *value) {
  deadline_check(cx);
  /* Always logged: a rule body may write anywhere, and replaying an entry
   * for memory that turns out to be new is harmless, since restore_old
   * replays the log before it frees what the migration allocated. */
  void *prev;
  memcpy(&prev, slot, sizeof prev);
  if (prev != value)
    VPUSH(cx, &cx->undo, undo_ent, {slot, prev});
  memcpy(slot, &value, sizeof value);
}

void molt__xf_run(molt__xf_ctx *cx) {
  /* Transformers may call molt__xf_run themselves: keep the caller's
   * current item. */
  const molt__xf_type *saved_t = cx->cur_t;
  bool saved_in_place = cx->cur_in_place;
  const void *saved_in = cx->cur_in;
  const char *saved_via = cx->cur_via;
  while (cx->work.n) {
    deadline_check(cx); /* before the item is taken off the list */
    work_item w = ((work_item *)cx->work.p)[--cx->work.n];
    const molt__xf_type *t = w.t;
    cx->cur_t = t;
    cx->cur_in_place = w.in_place;
    cx->cur_via = w.via;
    const char *in = w.in;
    char *out = w.out;
    molt__xf_fn fn = t->fn;
    size_t os = t->old_size, ns = w.in_place || in == out ? t->old_size : t->new_size;
    /* The item that runs AHEAD pops from now (unless this one queues
     * more): fetch its old object while this one runs. */
    enum { AHEAD = 4, PTR_AHEAD = 8 };
    if (cx->work.n >= AHEAD)
      __builtin_prefetch(((work_item *)cx->work.p)[cx->work.n - AHEAD].in);
    if (os == sizeof(void *) && w.count > PTR_AHEAD) {
      /* Probably an array of pointers: each element is looked up in the
       * map, at a random place.  Fetch the slot PTR_AHEAD elements ahead
       * (reading an element early is harmless: fn reads it anyway, and a
       * prefetch never faults). */
      for (size_t i = 0; i < w.count; i++) {
        if (i + PTR_AHEAD < w.count) {
          uintptr_t q;
          memcpy(&q, in + (i + PTR_AHEAD) * os, sizeof q);
          if (q)
            __builtin_prefetch(&cx->map[hash_ptr(cx, q)]);
        }
        cx->cur_in = in + i * os;
        fn(cx, in + i * os, out + i * ns);
      }
    } else {
      for (size_t i = 0; i < w.count; i++) {
        cx->cur_in = in + i * os;
        fn(cx, in + i * os, out + i * ns);
      }
    }
    cx->objects += w.count;
    cx->bytes += t->new_size * w.count;
  }
  cx->cur_t = saved_t;
  cx->cur_in_place = saved_in_place;
  cx->cur_in = saved_in;
  cx->cur_via = saved_via;
}

typedef struct local_args {
  molt__xf_ctx *cx;
  const char *func, *var;
  const molt__xf_type *t;
} local_args;

static void local_cb(void *arg, molt__saved_local *l) {
  local_args *a = arg;
  molt__xf_ctx *cx = a->cx;
  const molt__xf_type *t = a->t;
  if (!l->func || !l->name || strcmp(l->func, a->func) != 0 ||
      strcmp(l->name, a->var) != 0)
    return;
  if (l->old_size != t->old_size)
    fail(cx, MOLT_EXFORM,
         "local %s of %s has %zu bytes in the old version, but its transformer "
         "(%s) expects %zu",
         a->var, a->func, l->old_size, tname(t), t->old_size);
  if (l->new_value)
    return; /* already migrated (the same rule twice) */
  VPUSH(cx, &cx->locals, molt__saved_local *, l);
  l->new_value = calloc(1, t->new_size ? t->new_size : 1);
  if (!l->new_value)
    fail(cx, MOLT_ENOMEM, "out of memory migrating local %s of %s", a->var, a->func);
  l->new_size = t->new_size;
  if (!(t->flags & MOLT__XF_CHANGED)) {
    memcpy(l->new_value, l->old_copy, t->old_size);
    if ((t->flags & MOLT__XF_TRAVERSE) && t->fn)
      push_work(cx, l->new_value, l->new_value, t, 1, false);
  } else if (t->fn) {
    push_work(cx, l->old_copy, l->new_value, t, 1, false);
  }
  cx->objects++;
}

void molt__xf_local(molt__xf_ctx *cx, const char *func, const char *var,
                    const molt__xf_type *t) {
  deadline_check(cx);
  if (!func || !var || !t)
    fail(cx, MOLT_EINVAL, "molt__xf_local: invalid arguments");
  local_args a = {cx, func, var, t};
  molt__program_foreach_local(local_cb, &a);
}

void molt__xf_fail(molt__xf_ctx *cx, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* Messages are one line. */
  for (char *c = msg; *c; c++)
    if (*c == '\n' || *c == '\r')
      *c = ' ';
  fail(cx, MOLT_EXFORM, "%s", msg);
}

/* ------------------------------------------------------------------------ */
/* Runtime side                                                              */
/* ------------------------------------------------------------------------ */

/* Stack pointers of the process's threads, so that their stacks (anonymous
 * mappings like any heap) are never taken for heap.  A thread parked at an
 * update point is blocked in a system call, and /proc/self/task/T/syscall
 * then shows its stack pointer; the migrating thread adds its own.  *unknown
 * is set if some other thread's stack pointer could not be read (it was
 * running, or there were too many threads). */
#define MAX_SPS 4096
static size_t thread_sps(uintptr_t *sps, bool *unknown) {
  size_t n = 0;
  char here;
  sps[n++] = (uintptr_t)&here;
  pid_t me = molt__gettid();
  DIR *d = opendir("/proc/self/task");
  if (!d) {
    *unknown = true;
    return n;
  }
  struct dirent *de;
  while ((de = readdir(d))) {
    int tid = atoi(de->d_name);
    if (tid <= 0 || tid == me)
      continue;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t len = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
      close(fd);
    if (len <= 0 || n == MAX_SPS) {
      *unknown = true;
      continue;
    }
    buf[len] = '\0';
    /* "nr a0 a1 a2 a3 a4 a5 sp pc", "-1 sp pc", or "running". */
    char *tok[10];
    int k = 0;
    for (char *save = NULL, *t = strtok_r(buf, " \n", &save); t && k < 10;
         t = strtok_r(NULL, " \n", &save))
      tok[k++] = t;
    if (k < 3) {
      *unknown = true;
      continue;
    }
    sps[n++] = (uintptr_t)strtoull(tok[k - 2], NULL, 0);
  }
  closedir(d);
  return n;
}

/* [heap] and anonymous private read-write mappings: the only places an
 * object the program allocated with malloc can be, so the only places an
 * old object is ever freed -- except the mappings that hold a thread's
 * stack (an object on a stack must never be passed to free).  If a thread's
 * stack pointer is unknown, mappings shaped like a thread stack (directly
 * above an inaccessible guard, start not 64 MiB-aligned as malloc arenas
 * are) are skipped too.  Read once per migration: the old objects all exist
 * before it starts. */
static int read_heap_maps(molt__xf_ctx *cx) {
  uintptr_t *sps = malloc(MAX_SPS * sizeof *sps);
  if (!sps)
    return MOLT_ENOMEM;
  bool unknown = false;
  size_t nsps = thread_sps(sps, &unknown);
  FILE *f = fopen("/proc/self/maps", "re");
  if (!f) {
    free(sps);
    return molt__from_errno(errno);
  }
  char line[512];
  uintptr_t prev_hi = 0;
  bool prev_guard = false;
  int rc = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi, ino;
    char perms[8] = "";
    int path_at = 0;
    bool whole = strchr(line, '\n') != NULL;
    if (!whole) { /* overlong line (a long path): drop the rest of it */
      int c;
      while ((c = fgetc(f)) != EOF && c != '\n')
        ;
    }
    if (sscanf(line, "%lx-%lx %7s %*x %*x:%*x %lu %n", &lo, &hi, perms, &ino, &path_at) <
        4)
      continue;
    const char *path = path_at ? line + path_at : "";
    bool anon = ino == 0 && (path[0] == '\n' || path[0] == '\0');
    bool heap = strncmp(path, "[heap]", 6) == 0;
    bool stack_shaped = prev_guard && prev_hi == lo && (lo & ((64ul << 20) - 1)) != 0;
    bool keep =
        heap || (anon && strcmp(perms, "rw-p") == 0 && !(unknown && stack_shaped));
    for (size_t i = 0; keep && i < nsps; i++)
      if (sps[i] >= lo && sps[i] < hi)
        keep = false;
    if (perms[0] == 'r') {
      span *r = cx->readable.p;
      if (cx->readable.n && r[cx->readable.n - 1].hi == lo) {
        r[cx->readable.n - 1].hi = hi; /* adjacent: one span */
      } else if (!vec_reserve(&cx->readable, sizeof(span), 1)) {
        rc = MOLT_ENOMEM;
        break;
      } else {
        ((span *)cx->readable.p)[cx->readable.n++] = (span){lo, hi, NULL};
      }
    }
    if (keep) {
      if (!vec_reserve(&cx->heap, sizeof(heap_span), 1)) {
        rc = MOLT_ENOMEM;
        break;
      }
      ((heap_span *)cx->heap.p)[cx->heap.n++] = (heap_span){lo, hi, 0};
    }
    prev_guard = anon && strcmp(perms, "---p") == 0;
    prev_hi = hi;
  }
  fclose(f);
  free(sps);
  return rc;
}

/* Initial capacity of the map, from the size of the old heap: the map is
 * sized for one key per MAP_HINT_BYTES of heap at load 1/2, so that a
 * migration of (nearly) the whole heap rarely grows it (256 bytes per key
 * already grows it once at 1M entries of examples/kvfull), and capped (a
 * huge heap of opaque data would otherwise cost a huge table).  The
 * table's pages are materialised on first touch, so room that stays unused
 * costs little. */
#define MAP_HINT_BYTES 128u
#define MAP_MIN_LOG2 10u
#define MAP_MAX_LOG2 22u

int molt__xf_begin(molt__image *old, molt__image *new, bool check_interior,
                   molt__xf_ctx **out) {
  if (!old || !new || !out || !old->nranges)
    return MOLT_EINVAL;
  *out = NULL;
  molt__xf_ctx *cx = calloc(1, sizeof *cx);
  if (!cx)
    return MOLT_ENOMEM;
  cx->old = old;
  cx->new = new;
  cx->check_interior = check_interior;
  cx->old_lo = old->ranges[0].lo;
  cx->old_hi = old->ranges[old->nranges - 1].hi;
  /* The heap first: the tables allocated below are no part of it. */
  int rc = read_heap_maps(cx);
  size_t granules = 0;
  heap_span *h = cx->heap.p;
  if (rc == 0 && cx->heap.n) {
    cx->heap_lo = h[0].lo;
    cx->heap_hi = h[cx->heap.n - 1].hi;
  }
  for (size_t i = 0; rc == 0 && i < cx->heap.n; i++) {
    h[i].g0 = granules;
    granules += (h[i].hi - h[i].lo) >> 4;
  }
  if (rc == 0 && granules) {
    /* Without the bitmap every pointer probes the map: slower, not wrong. */
    size_t bytes = ((granules + 63) / 64) * sizeof(uint64_t);
    cx->kbits = big_alloc(bytes, true);
    cx->kbits_bytes = cx->kbits ? bytes : 0;
  }
  unsigned log2cap = MAP_MIN_LOG2;
  uint64_t want = (uint64_t)(granules << 4) / MAP_HINT_BYTES * 2;
  while (log2cap < MAP_MAX_LOG2 && ((uint64_t)1 << log2cap) < want)
    log2cap++;
  if (rc == 0 && !map_alloc(cx, log2cap) && !map_alloc(cx, MAP_MIN_LOG2))
    rc = MOLT_ENOMEM;
  if (rc < 0) {
    big_free(cx->kbits, cx->kbits_bytes);
    vec_free(&cx->heap, sizeof(heap_span));
    vec_free(&cx->readable, sizeof(span));
    free(cx);
    return rc;
  }
  *out = cx;
  return 0;
}

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  if (x->lo != y->lo)
    return x->lo < y->lo ? -1 : 1;
  return x->hi > y->hi ? -1 : x->hi < y->hi; /* outer first */
}

static int uptr_cmp(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

/* LSD radix sort by address, 8 bits per pass; passes in which every key
 * has the same digit (the high bytes of user-space addresses) are skipped.
 * A million objects sort in a few ms, where qsort takes ~100x longer.
 * Stable.  Falls back to qsort (with cmp) when out of memory. */
#define DEFINE_RADIX(fname, type, KEY)                                                   \
  static void fname(type *a, size_t n, int (*cmp)(const void *, const void *)) {         \
    if (n < 2) /* also: a may be NULL when nothing was recorded */                       \
      return;                                                                            \
    type *tmp = n > 256 ? malloc(n * sizeof *tmp) : NULL;                                \
    if (!tmp) {                                                                          \
      qsort(a, n, sizeof *a, cmp);                                                       \
      return;                                                                            \
    }                                                                                    \
    type *src = a, *dst = tmp;                                                           \
    for (unsigned shift = 0; shift < 64; shift += 8) {                                   \
      size_t count[256] = {0};                                                           \
      for (size_t i = 0; i < n; i++)                                                     \
        count[(KEY(src[i]) >> shift) & 255]++;                                           \
      if (count[(KEY(src[0]) >> shift) & 255] == n)                                      \
        continue;                                                                        \
      size_t pos = 0;                                                                    \
      for (size_t d = 0; d < 256; d++) {                                                 \
        size_t c = count[d];                                                             \
        count[d] = pos;                                                                  \
        pos += c;                                                                        \
      }                                                                                  \
      for (size_t i = 0; i < n; i++)                                                     \
        dst[count[(KEY(src[i]) >> shift) & 255]++] = src[i];                             \
      type *x = src;                                                                     \
      src = dst;                                                                         \
      dst = x;                                                                           \
    }                                                                                    \
    if (src != a)                                                                        \
      memcpy(a, src, n * sizeof *a);                                                     \
    free(tmp);                                                                           \
  }
#define SPAN_KEY(x) ((uint64_t)(x).lo)
#define UPTR_KEY(x) ((uint64_t)(x))
DEFINE_RADIX(sort_spans, span, SPAN_KEY)
DEFINE_RADIX(sort_uptrs, uintptr_t, UPTR_KEY)

/* --check-interior: a pointer strictly inside an object that was migrated
 * or visited means the object was addressed other than through its start;
 * such a pointer cannot be redirected, so the update must not go on. */
static void check_interior(molt__xf_ctx *cx) {
  span *o = cx->objs.p;
  uintptr_t *t = cx->targets.p;
  /* Object starts are unique (each is a map key), so sorting by start
   * alone is enough. */
  sort_spans(o, cx->objs.n, span_cmp);
  sort_uptrs(t, cx->targets.n, uptr_cmp);
  /* Sweep both sorted lists.  `cover` is, among the objects that start
   * strictly before the target, the one reaching furthest: the target is
   * interior to some object iff it is interior to that one.  (A target
   * that is also the start of a nested object is still inside `cover`.) */
  size_t j = 0;
  uintptr_t reach = 0;
  const span *cover = NULL;
  for (size_t i = 0; i < cx->targets.n; i++) {
    uintptr_t p = t[i];
    while (j < cx->objs.n && o[j].lo < p) {
      if (o[j].hi > reach) {
        reach = o[j].hi;
        cover = &o[j];
      }
      j++;
    }
    if (cover && p < cover->hi) {
      fail(cx, MOLT_EXFORM, "interior pointer 0x%lx into %s at 0x%lx (+%lu)",
           (unsigned long)p, cover->what ? cover->what : "an object",
           (unsigned long)cover->lo, (unsigned long)(p - cover->lo));
    }
  }
}

/* Undo in-place writes, free what this migration allocated.  Leaves the
 * old state exactly as it was before molt__xf_migrate. */
static void restore_old(molt__xf_ctx *cx) {
  if (cx->restored)
    return;
  cx->restored = true;
  undo_ent *u = cx->undo.p;
  for (size_t i = cx->undo.n; i-- > 0;)
    *u[i].slot = u[i].prev;
  cx->undo.n = 0;
  const map_rec *r = cx->recs.p;
  for (size_t i = 0; i < cx->recs.n; i++)
    if (r[i].t->flags & MOLT__XF_CHANGED) /* markers have no flags */
      free(r[i].val);
  void **pool = cx->pools.p;
  for (size_t i = 0; i < cx->pools.n; i++)
    free(pool[i]);
  cx->pools.n = 0;
  cx->freeold.n = 0; /* never freed on abort: the old version goes on */
  const uintptr_t *ra = cx->ralloc.p;
  for (size_t i = 0; i < cx->ralloc.n; i++)
    free((void *)ra[i]); /* 0 for blocks the rule freed itself */
  cx->ralloc.n = 0;
  free(cx->rindex);
  cx->rindex = NULL;
  /* Empty the map and the bitmap (private anonymous memory reads as zeros
   * after MADV_DONTNEED; clear by hand if that is refused). */
  size_t mbytes = (cx->map_mask + 1) * sizeof *cx->map;
  if (madvise(cx->map, mbytes, MADV_DONTNEED) != 0)
    memset(cx->map, 0, mbytes);
  if (cx->kbits_bytes && madvise(cx->kbits, cx->kbits_bytes, MADV_DONTNEED) != 0)
    memset(cx->kbits, 0, cx->kbits_bytes);
  cx->kbits_shared = false;
  cx->recs.n = 0;
  cx->map_n = 0;
  molt__saved_local **l = cx->locals.p;
  for (size_t i = 0; i < cx->locals.n; i++) {
    free(l[i]->new_value);
    l[i]->new_value = NULL;
    l[i]->new_size = 0;
  }
  cx->locals.n = 0;
}

static const char *sig_name(int sig) {
  switch (sig) {
  case SIGSEGV:
    return "SIGSEGV";
  case SIGBUS:
    return "SIGBUS";
  case SIGFPE:
    return "SIGFPE";
  case SIGILL:
    return "SIGILL";
  default:
    return "signal";
  }
}

int molt__xf_migrate(molt__xf_ctx *cx, char *err, size_t errlen) {
  if (!cx || cx->migrated || cx->restored) {
    molt__errmsg(err, errlen, "internal error: migration context reused");
    return MOLT_EINTERNAL;
  }
  void (*migrate)(molt__xf_ctx *) = cx->new->info ? cx->new->info->migrate : NULL;
  if (!migrate) {
    molt__errmsg(err, errlen,
                 "%s has no migration code (build it with moltcc --molt-from)",
                 cx->new->path);
    return MOLT_ENOTPROGRAM;
  }
  uint64_t t0 = molt__now_ns();
  guard_state g;
  if (guard_install(cx, &g) < 0) {
    molt__errmsg(err, errlen, "out of memory");
    return MOLT_ENOMEM;
  }
  /* volatile: read after a siglongjmp back into this frame. */
  volatile int rc = 0;
  int jumped = sigsetjmp(cx->jb, 1);
  if (jumped == 0) {
    cx->migrating = true;
    deadline_start(cx);
    migrate(cx);
    molt__xf_run(cx); /* whatever migrate() queued after its last run */
    check_untyped(cx);
    run_hook(cx);
    if (cx->check_interior)
      check_interior(cx);
    /* Finished, but late: the deadline bounds the whole migration. */
    deadline_check(cx);
  } else if (jumped == 3) {
    /* The deadline: deadline_handler jumped here from code of an image. */
    if (cx->cur_t)
      molt__errmsg(cx->err, sizeof cx->err,
                   "migration timed out after %u ms (in the transformer for %s); update "
                   "aborted, the old version continues",
                   cx->limit_ms, tname(cx->cur_t));
    else
      molt__errmsg(cx->err, sizeof cx->err,
                   "migration timed out after %u ms (in the migration code of %s); "
                   "update aborted, the old version continues",
                   cx->limit_ms, cx->new->path);
    cx->err_code = MOLT_ETIMEDOUT;
    rc = MOLT_ETIMEDOUT;
  } else if (jumped == 4) {
    /* deadline_handler escaped from a system call outside the images. */
    molt__errmsg(cx->err, sizeof cx->err,
                 "migration timed out after %u ms and stayed blocked in a system call "
                 "outside the program for %u ms more (in %s: waiting, for example, for a "
                 "lock that a parked thread holds); escaped from it -- a lock it waited "
                 "for or a condition variable it waited on may be left in an odd state; "
                 "update aborted, the old version continues",
                 cx->limit_ms, DEADLINE_STUCK_MS,
                 hook_cx        ? "molt_on_migrated"
                 : cx->cur_t    ? tname(cx->cur_t)
                 : cx->cur_rule ? cx->cur_rule
                                : "the migration code");
    cx->err_code = MOLT_ETIMEDOUT;
    rc = MOLT_ETIMEDOUT;
  } else if (jumped == 1) {
    /* A fault: guard_handler jumped here (the guard is already disarmed).
     * A general protection fault (a non-canonical address on x86-64) is
     * reported by the kernel with si_code SI_KERNEL and address 0: the
     * address is not known then, and 0 would be a lie. */
    char addr[80], where[240];
    if (cx->fault_code == SI_KERNEL)
      snprintf(addr, sizeof addr, "a non-canonical address (general protection fault)");
    else
      snprintf(addr, sizeof addr, "0x%lx", (unsigned long)cx->fault_addr);
    describe_cur(cx, where, sizeof where);
    if (cx->cur_t)
      molt__errmsg(cx->err, sizeof cx->err,
                   "transformer for %s faulted (%s at %s) migrating %s; update aborted, "
                   "the old version continues",
                   tname(cx->cur_t), sig_name(cx->fault_sig), addr, where);
    else if (cx->cur_rule)
      molt__errmsg(cx->err, sizeof cx->err,
                   "the %s faulted (%s at %s); update aborted, the old version continues",
                   cx->cur_rule, sig_name(cx->fault_sig), addr);
    else
      molt__errmsg(cx->err, sizeof cx->err,
                   "the migration code of %s faulted (%s at %s); update "
                   "aborted, the old version continues",
                   cx->new->path, sig_name(cx->fault_sig), addr);
    cx->err_code = MOLT_EXFORM;
    rc = MOLT_EXFORM;
  } else {
    rc = cx->err_code ? cx->err_code : MOLT_EXFORM;
  }
  cx->migrating = false;
  hook_cx = NULL; /* a jump out of the hook */
  deadline_stop();
  guard_remove(&g);
  cx->cur_t = NULL;
  cx->cur_in_place = false;
  cx->cur_in = NULL;
  cx->cur_via = NULL;
  cx->cur_rule = NULL;
  cx->ns += molt__now_ns() - t0;
  if (rc < 0) {
    restore_old(cx);
    if (jumped == 2) {
      size_t n = strlen(cx->err);
      if (!strstr(cx->err, "update aborted"))
        snprintf(cx->err + n, sizeof cx->err - n,
                 "; update aborted, the old version continues");
    }
    /* No log entry here: the caller (program.c) logs the abort. */
    molt__errmsg(err, errlen, "%s", cx->err);
    return rc;
  }
  cx->migrated = true;
  if (cx->bad_ptrs)
    molt__log(MOLT__EV_INFO, 0, NULL,
              "full update: %llu pointer(s) to no readable memory kept as they are, not "
              "followed (dangling or uninitialised); the first: %s",
              (unsigned long long)cx->bad_ptrs, cx->bad_first);
  return 0;
}

/* ---- the new version's hook (molt.h, molt_on_migrated) ---------------------- */

static bool in_hook(void) {
  return hook_cx &&
         atomic_load_explicit(&guard_tid, memory_order_relaxed) == molt__gettid();
}

/* Pointers that libraries keep into the program (libevent's events, a
 * tsearch tree's keys, an allocator's callbacks) are invisible to the
 * typed traversal.  The new version may define
 *   int molt_on_migrated(char *why, size_t len)
 * which runs here, once the state is migrated and before the update
 * commits, still under the fault guard and the deadline: it fixes them
 * with molt_migrated() and molt_migrated_store() (undone if the update
 * aborts), or returns nonzero with a reason to abort the update. */
static void run_hook(molt__xf_ctx *cx) {
  uintptr_t a = (uintptr_t)molt__image_sym(cx->new, "molt_on_migrated", NULL);
  if (!a || !(molt__image_prot_at(cx->new, a) & PF_X))
    return;
  int (*hook)(char *, size_t);
  memcpy(&hook, &a, sizeof hook);
  char why[300] = "";
  cx->cur_t = NULL;
  cx->cur_in = NULL;
  hook_cx = cx;
  int r = hook(why, sizeof why);
  hook_cx = NULL;
  molt__xf_run(cx); /* what molt_migrated queued */
  if (r != 0) {
    why[sizeof why - 1] = '\0';
    for (char *c = why; *c; c++)
      if (*c == '\n' || *c == '\r')
        *c = ' ';
    fail(cx, MOLT_EXFORM, "molt_on_migrated of the new version refused the update: %s",
         why[0] ? why : "(no reason given)");
  }
}

void *molt_migrated(const void *old) {
  if (!in_hook())
    return (void *)old;
  deadline_check(hook_cx);
  return molt__xf_redirect(hook_cx, (void *)old);
}

void molt_migrated_store(void *slot, void *value) {
  if (!slot)
    return;
  if (!in_hook()) {
    memcpy(slot, &value, sizeof value);
    return;
  }
  deadline_check(hook_cx);
  void *prev;
  memcpy(&prev, slot, sizeof prev);
  if (prev != value)
    VPUSH(hook_cx, &hook_cx->undo, undo_ent, {slot, prev});
  memcpy(slot, &value, sizeof value);
}

void *molt__xf_redirect(molt__xf_ctx *cx, void *old) {
  if (!cx || !old)
    return old;
  uintptr_t p = (uintptr_t)old;
  map_rec *r = map_find(cx, p);
  if (r)
    return r->val;
  if (p - cx->old_lo < cx->old_hi - cx->old_lo) {
    unsigned prot = molt__image_prot_at(cx->old, p);
    if (prot) {
      uintptr_t np;
      bool pooled;
      redirect_err re;
      if (!image_redirect(cx, p, prot, NULL, 1, &np, &pooled, &re))
        return old;
      if (pooled) {
        /* Keep it with this migration's pool (kept on commit, freed on
         * abort); if that fails, the copy cannot be tracked: drop it. */
        if ((map_full(cx) && !map_grow(cx)) || cx->recs.n >= MAP_MAX_RECS ||
            !vec_reserve(&cx->recs, sizeof(map_rec), 1) ||
            !vec_reserve(&cx->pools, sizeof(void *), 1)) {
          free((void *)np);
          return old;
        }
        ((void **)cx->pools.p)[cx->pools.n++] = (void *)np;
        map_put(cx, map_slot(cx, p), p, (void *)np, &pool_marker, 1);
      }
      return (void *)np;
    }
  }
  return old;
}

void molt__xf_free_old(molt__xf_ctx *cx, const void *old) {
  if (!cx)
    return;
  if (!cx->migrating)
    fail(cx, MOLT_EINVAL, "molt__xf_free_old called outside a migration");
  deadline_check(cx);
  if (old)
    VPUSH(cx, &cx->freeold, uintptr_t, (uintptr_t)old);
}

/* ---- memory the rules allocate ------------------------------------------------ */

/* Rule bodies allocate new state (a table, the entries of a list) with
 * malloc and friends; the generated code sends those calls here
 * (tools/moltcc/image/xfgen.py), so that an abort frees the blocks with
 * everything else the migration made, and a commit hands them over to the
 * new version.  Most blocks are never freed or reallocated by the rule:
 * tracking one is an append to cx->ralloc; the index of blocks is built
 * only when a rule frees or reallocates one that is not among the last
 * RALLOC_RECENT (a buffer the rule is growing). */
#define RALLOC_RECENT 16
#define RINDEX_DELETED SIZE_MAX

static inline size_t rindex_home(const molt__xf_ctx *cx, uintptr_t p) {
  return (size_t)(((uint64_t)(p >> 4) * 0x9E3779B97F4A7C15ull) >> 32) & cx->rindex_mask;
}

/* Builds the index for cx->ralloc with room for `more` insertions; false
 * when out of memory (lookups then scan the list). */
static bool rindex_build(molt__xf_ctx *cx, size_t more) {
  size_t cap = 64;
  while (cap < 2 * (cx->ralloc.n + more + 1))
    cap *= 2;
  size_t *ix = calloc(cap, sizeof *ix);
  if (!ix)
    return false;
  free(cx->rindex);
  cx->rindex = ix;
  cx->rindex_mask = cap - 1;
  cx->rindex_used = 0;
  const uintptr_t *a = cx->ralloc.p;
  for (size_t i = 0; i < cx->ralloc.n; i++) {
    if (!a[i])
      continue;
    size_t j = rindex_home(cx, a[i]);
    while (ix[j])
      j = (j + 1) & cx->rindex_mask;
    ix[j] = i + 1;
    cx->rindex_used++;
  }
  return true;
}

/* Entry + 1 of block p in cx->ralloc, or 0.  *slot: its index slot. */
static size_t ralloc_find(molt__xf_ctx *cx, uintptr_t p, size_t **slot) {
  const uintptr_t *a = cx->ralloc.p;
  *slot = NULL;
  if (!cx->rindex) {
    size_t lo = cx->ralloc.n > RALLOC_RECENT ? cx->ralloc.n - RALLOC_RECENT : 0;
    for (size_t i = cx->ralloc.n; i-- > lo;)
      if (a[i] == p)
        return i + 1;
    if (lo == 0 || !rindex_build(cx, 0)) {
      for (size_t i = lo; i-- > 0;) /* no index: scan */
        if (a[i] == p)
          return i + 1;
      return 0;
    }
  }
  for (size_t j = rindex_home(cx, p); cx->rindex[j]; j = (j + 1) & cx->rindex_mask)
    if (cx->rindex[j] != RINDEX_DELETED && a[cx->rindex[j] - 1] == p) {
      *slot = &cx->rindex[j];
      return cx->rindex[j];
    }
  return 0;
}

static void ralloc_forget(molt__xf_ctx *cx, size_t k, size_t *slot) {
  ((uintptr_t *)cx->ralloc.p)[k - 1] = 0;
  if (slot)
    *slot = RINDEX_DELETED;
}

/* Tracks block p (not NULL).  Out of memory frees it and fails the
 * migration: a block the runtime does not know of would leak on abort. */
static void *ralloc_track(molt__xf_ctx *cx, void *p) {
  if (cx->ralloc.n == cx->ralloc.cap && !vec_reserve(&cx->ralloc, sizeof(uintptr_t), 1)) {
    free(p);
    fail(cx, MOLT_ENOMEM, "out of memory while migrating the state");
  }
  size_t i = cx->ralloc.n++;
  ((uintptr_t *)cx->ralloc.p)[i] = (uintptr_t)p;
  if (cx->rindex) {
    if ((cx->rindex_used + 1) * 2 > cx->rindex_mask + 1 && !rindex_build(cx, 1)) {
      free(cx->rindex); /* rebuilt at the next lookup */
      cx->rindex = NULL;
      return p;
    }
    size_t j = rindex_home(cx, (uintptr_t)p);
    while (cx->rindex[j] && cx->rindex[j] != RINDEX_DELETED)
      j = (j + 1) & cx->rindex_mask;
    if (!cx->rindex[j])
      cx->rindex_used++;
    cx->rindex[j] = i + 1;
  }
  return p;
}

void *molt__xf_malloc(molt__xf_ctx *cx, size_t size) {
  deadline_check(cx);
  void *p = malloc(size);
  return p ? ralloc_track(cx, p) : NULL;
}

void *molt__xf_calloc(molt__xf_ctx *cx, size_t n, size_t size) {
  deadline_check(cx);
  void *p = calloc(n, size);
  return p ? ralloc_track(cx, p) : NULL;
}

char *molt__xf_strdup(molt__xf_ctx *cx, const char *s) {
  deadline_check(cx);
  char *p = strdup(s);
  return p ? ralloc_track(cx, p) : NULL;
}

char *molt__xf_strndup(molt__xf_ctx *cx, const char *s, size_t n) {
  deadline_check(cx);
  char *p = strndup(s, n);
  return p ? ralloc_track(cx, p) : NULL;
}

void molt__xf_free(molt__xf_ctx *cx, void *p) {
  deadline_check(cx);
  if (!p)
    return;
  size_t *slot;
  size_t k = ralloc_find(cx, (uintptr_t)p, &slot);
  if (k) {
    ralloc_forget(cx, k, slot);
    free(p);
    return;
  }
  /* Old data: the old version may still need it (an abort goes back to
   * it), so it is freed only once the update commits. */
  molt__xf_free_old(cx, p);
}

void *molt__xf_realloc(molt__xf_ctx *cx, void *p, size_t size) {
  if (!p)
    return molt__xf_malloc(cx, size);
  deadline_check(cx);
  size_t *slot;
  size_t k = ralloc_find(cx, (uintptr_t)p, &slot);
  if (!k)
    fail(cx, MOLT_EXFORM,
         "a rule reallocated 0x%lx, which this migration did not allocate: old data "
         "must stay as it is until the update commits (allocate a new block, copy, "
         "and free() the old one, which is then freed at the commit)",
         (unsigned long)(uintptr_t)p);
  if (size == 0) {
    molt__xf_free(cx, p);
    return NULL;
  }
  void *q = realloc(p, size);
  if (!q)
    return NULL; /* p is still valid and still tracked */
  ralloc_forget(cx, k, slot);
  return ralloc_track(cx, q);
}

/* Frees the old heap objects that were replaced, and those a rule asked
 * for with molt__xf_free_old (commit).  Only objects in the heap or an
 * anonymous private mapping are freed, each once, and never one that lies
 * inside another such object (an element or member addressed on its own:
 * not a malloc block of its own).
 *
 * The general case sorts the objects by address and sweeps them.  When the
 * key bitmap shows that no replaced object can contain another map key
 * (no key in any of its granules but its first, no granule with two keys,
 * no object reaching past its mapping) and no rule asked for frees, no
 * object lies inside another: every replaced heap object is freed as it
 * comes, without the sort. */
static void free_replaced(molt__xf_ctx *cx) {
  const map_rec *r = cx->recs.p;
  size_t nr = cx->recs.n;
  const uintptr_t *fo = cx->freeold.p;
  size_t nfo = cx->freeold.n;
  if (nr + nfo == 0)
    return;

  bool fast = cx->kbits_bytes && !cx->kbits_shared && nfo == 0;
  for (size_t i = 0; fast && i < nr; i++) {
    const molt__xf_type *t = r[i].t;
    if (!(t->flags & MOLT__XF_CHANGED))
      continue;
    const heap_span *h = heap_find(cx, r[i].key);
    if (!h)
      continue;
    size_t size = (t->old_size ? t->old_size : 1) * r[i].count;
    if (size > h->hi - r[i].key ||
        kbits_any(cx, granule(h, r[i].key) + 1, granule(h, r[i].key + size - 1) + 1))
      fast = false;
  }
  if (fast) {
    /* Prefetch a few objects ahead: free() reads each chunk's header. */
    enum { AHEAD = 8 };
    for (size_t i = 0; i < nr; i++) {
      if (i + AHEAD < nr)
        __builtin_prefetch((const char *)r[i + AHEAD].key - 16);
      if ((r[i].t->flags & MOLT__XF_CHANGED) && in_heap(cx, r[i].key))
        free((void *)r[i].key);
    }
    return;
  }

  span *s = malloc((nr + nfo) * sizeof *s);
  if (!s) {
    /* Cannot sort: freeing blindly could free an interior address.  Keep
     * the old objects (a leak, never a crash). */
    molt__log(MOLT__EV_INFO, 0, NULL,
              "full update: out of memory, %zu replaced old objects kept", nr + nfo);
    return;
  }
  /* Requests of the rule are marked: their extent is the malloc block's,
   * asked for only once it is known that the address is no interior one
   * of an object before it (malloc_usable_size needs a block start). */
  static const char free_old_mark[] = "free_old";
  size_t k = 0;
  for (size_t i = 0; i < nr; i++) {
    const molt__xf_type *t = r[i].t;
    if ((t->flags & MOLT__XF_CHANGED) && in_heap(cx, r[i].key))
      s[k++] =
          (span){r[i].key, r[i].key + (t->old_size ? t->old_size : 1) * r[i].count, NULL};
  }
  for (size_t i = 0; i < nfo; i++)
    if (in_heap(cx, fo[i]))
      s[k++] = (span){fo[i], fo[i] + 1, free_old_mark};
  /* Stable: at equal starts the replaced object (added first) comes
   * before requests for the same address. */
  sort_spans(s, k, span_cmp);
  /* Decide first, free after: sizes of blocks are read while every block
   * is still allocated.  The starts to free are collected at the front of
   * s (never past the element being read). */
  uintptr_t reach = 0, last = 0;
  size_t nf = 0;
  for (size_t i = 0; i < k; i++) {
    uintptr_t lo = s[i].lo, hi = s[i].hi;
    bool req = s[i].what == free_old_mark;
    if (lo >= reach) {
      if (req) {
        size_t size = malloc_usable_size((void *)lo);
        hi = lo + (size ? size : 1);
      }
      s[nf++].lo = lo;
      last = lo;
    } else if (req && lo == last) {
      /* The block just taken, asked for again (or replaced and asked
       * for): freed once, and nothing inside its whole extent. */
      size_t size = malloc_usable_size((void *)lo);
      hi = lo + (size ? size : 1);
    }
    if (hi > reach)
      reach = hi;
  }
  for (size_t i = 0; i < nf; i++)
    free((void *)s[i].lo);
  free(s);
}

void molt__xf_end(molt__xf_ctx *cx, bool commit) {
  if (!cx)
    return;
  if (commit && cx->migrated && !cx->restored) {
    free_replaced(cx);
    /* Literal copies now belong to the new version for good. */
    void **pool = cx->pools.p;
    for (size_t i = 0; i < cx->pools.n; i++) {
      if (!vec_reserve(&kept_pool, sizeof(void *), 1))
        break; /* still referenced by the new version: a leak, not a bug */
      ((void **)kept_pool.p)[kept_pool.n++] = pool[i];
    }
  } else {
    restore_old(cx);
  }
  big_free(cx->map, (cx->map_mask + 1) * sizeof *cx->map);
  big_free(cx->kbits, cx->kbits_bytes);
  vec_free(&cx->recs, sizeof(map_rec));
  vec_free(&cx->pools, sizeof(void *));
  vec_free(&cx->freeold, sizeof(uintptr_t));
  vec_free(&cx->work, sizeof(work_item));
  vec_free(&cx->undo, sizeof(undo_ent));
  vec_free(&cx->vars, sizeof(var_range));
  vec_free(&cx->locals, sizeof(molt__saved_local *));
  vec_free(&cx->heap, sizeof(heap_span));
  vec_free(&cx->readable, sizeof(span));
  vec_free(&cx->objs, sizeof(span));
  vec_free(&cx->targets, sizeof(uintptr_t));
  vec_free(&cx->untyped, sizeof(untyped_ref));
  vec_free(&cx->ralloc, sizeof(uintptr_t)); /* the blocks are the new version's */
  free(cx->rindex);
  free(cx);
}

void molt__xf_set_limit(molt__xf_ctx *cx, unsigned ms) {
  if (cx)
    cx->limit_ms = ms;
}

void molt__xf_stats(const molt__xf_ctx *cx, uint64_t *objects, uint64_t *bytes,
                    uint64_t *ns) {
  if (objects)
    *objects = cx ? cx->objects : 0;
  if (bytes)
    *bytes = cx ? cx->bytes : 0;
  if (ns)
    *ns = cx ? cx->ns : 0;
}
