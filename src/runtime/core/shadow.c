/* Shadow data (guarantee H13): new per-object data that a hot patch attaches to
 * existing objects by address, so that a fix which adds a field to a
 * structure can be a hot patch.  The idea is Linux livepatch's shadow
 * variables; the design is molt's own (docs/design.md §14, "Shadow data").
 *
 * The data lives in libmolt, not in the patch that created it: it outlives
 * that patch (a later patch of the same fix keeps using it).  The runtime
 * never stores a function pointer: constructors and destructors are called
 * only by the call that passes them.
 *
 * Structure.  A shadow is one heap node {links, obj, id, data}.  Nodes live
 * in SHARDS independent hash tables chosen by the top bits of hash(obj,
 * id); each shard has a mutex for writers and a bucket array that doubles
 * when the shard holds more nodes than buckets.
 *
 * Readers take no lock: molt_shadow_get walks a chain and protects what it
 * stands on with hazard pointers (Michael, 2004), three per thread: the
 * bucket array, the current node and the previous one.  Writers (under the
 * shard lock) publish a node with a release store of the link that makes
 * it reachable; to unlink a node they first mark its own link (low bit),
 * then store its successor into its predecessor's link.  An unlinked node
 * is retired to its shard's limbo list and freed by a later reclamation
 * pass unless a hazard pointer names it.
 *
 *   reader, for each node n it moves to through link L of table t:
 *     hp = n                       (release store; compiler barrier)
 *     check *L == n, unmarked, and shard->table == t   (acquire loads)
 *     only then read n's fields
 *   reclaimer:
 *     take the limbo lists         (every node in them is unlinked)
 *     membarrier()                 (a full fence on every running thread)
 *     read every hazard pointer    (acquire)
 *     free the nodes and tables none names; keep the others for later
 *
 * Why it is correct: the store-buffering pattern of molt's generation
 * counters (design.md §2), with membarrier() as the fence of the side that
 * runs rarely.  For a reader and a retired node X: the reader's store hp =
 * X falls before or after the barrier point membarrier() imposes on its
 * thread.  Before: the scan sees X (or a later value of that slot, written
 * after the reader was done with X: its release pairs with the scan's
 * acquire) and keeps X.  After: the reader's check loads come after the
 * barrier point, hence after X was unlinked (the retiring thread unlinked X
 * before pushing it, with release, to the limbo list the reclaimer took
 * with acquire before calling membarrier()), so the check fails and the
 * reader starts over without touching X.  A check that succeeds means X was
 * in the current table when the check ran: a node is only unlinked from the
 * current table, and its own link is marked first, so an unmarked link to
 * X from a node that was itself checked is still live.  A stalled reader
 * (preempted, stopped in a debugger) pins at most its own three pointers:
 * memory never depends on readers making progress, and nothing ever waits
 * for a reader.
 *
 * Growth without blocking readers: every node has two links, one per table
 * parity.  The new table of the other parity is threaded through the other
 * link under the shard lock while readers keep walking the current one,
 * then published with a release store.  A reader that started in the old
 * table fails its next check (shard->table changed) and starts over in the
 * new one; the old bucket array is retired like a node.
 *
 * A signal handler that calls molt_shadow_get while the interrupted code is
 * inside it uses a second set of hazard pointers (depth 1); deeper nesting
 * takes the shard lock.
 *
 * Memory order: every access made under a shard lock to data of that
 * shard is relaxed (the mutex orders them); the orders below are for the
 * lock-free side (readers, limbo lists, reclaimer) and each says why.
 *
 * Locks: the first two rows of the lock table (base/base.h, where the
 * argument for their rank is): the shard locks (shadow_lock, never two at
 * once) and reclaim_lock (shadow_reclaim_lock, never held with a shard
 * lock), both checked molt__locks.  A constructor runs under its shard
 * lock and may call anything of the program and the runtime; only the
 * shadow calls that would take a lock fail from inside it (molt_shadow_get
 * works there).  Two things the check cannot express use the raw mutex,
 * each with its reason: the fork handlers, which hold all 32 shard locks
 * (one rank) in index order, called by service/runtime.c's handlers first
 * in the order of the table; and the passes that only try reclaim_lock. */
#include "core/core.h"

#include <linux/membarrier.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* 32 shards: writers rarely contend, and the 37 locks the fork handlers
 * hold (33 here, op, prog, rt, reg) stay within what ThreadSanitizer
 * tracks for one thread (64). */
#define SHARD_BITS 5
#define SHARDS (1u << SHARD_BITS)
#define MIN_BUCKETS 8u
/* Every RECLAIM_BATCH-th retirement in a shard starts a reclamation pass. */
#define RECLAIM_BATCH 64u
/* Hazard pointers of one nesting level: bucket array, two nodes. */
#define HP_TABLE 0
#define HP_PER_LEVEL 3
#define HP_LEVELS 2

typedef struct node {
  /* Link to the next node of the chain in the table of parity 0 or 1.
   * Bit 0 set: this node has been unlinked.  Written under the shard lock
   * with release, read lock-free with acquire. */
  _Atomic(uintptr_t) next[2];
  const void *obj;      /* immutable after publication */
  uint64_t id;          /* immutable after publication */
  struct node *retired; /* limbo link */
  size_t size;
  alignas(max_align_t) unsigned char data[];
} node;

typedef struct table {
  size_t mask;     /* buckets - 1 */
  unsigned parity; /* which link of the nodes this table's chains use */
  unsigned shard;
  struct table *retired;
  _Atomic(uintptr_t) bucket[];
} table;

typedef struct shard {
  molt__lock lock; /* shadow_lock */
  /* The current table (NULL until the first shadow).  Written under lock
   * with release, read by readers with acquire. */
  _Atomic(table *) table;
  size_t count; /* shadows in the table (lock) */
  /* Retired nodes and tables (lock-free pushes, taken whole by the
   * reclaimer) and the count of retirements that triggers a pass. */
  _Atomic(node *) limbo;
  _Atomic(table *) limbo_tables;
  _Atomic size_t nretired;
} __attribute__((aligned(128))) shard;

/* One per thread that has called molt_shadow_get.  Records are never
 * freed: a thread that exits gives its record back (owned = 0) to the next
 * new thread, so the reclaimer can always read every record. */
typedef struct reader {
  /* Written only by the owner (release), read by the reclaimer (acquire). */
  _Atomic(void *) hp[HP_LEVELS][HP_PER_LEVEL];
  struct reader *next; /* immutable once the record is in the list */
  _Atomic int owned;
  int depth; /* nesting of molt_shadow_get (owner only) */
} __attribute__((aligned(64))) reader;

static shard shards[SHARDS] = {[0 ... SHARDS - 1] = {.lock = MOLT__LOCK_INIT(shadow)}};
static _Atomic(reader *) readers;
static __thread reader *self __attribute__((tls_model("initial-exec")));
/* The shard whose lock this thread holds while it runs a constructor, or
 * NULL.  Only the thread itself reads or writes it. */
static __thread shard *ctor_shard __attribute__((tls_model("initial-exec")));

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;
static bool key_ok;
/* No expedited membarrier(): readers fence themselves (written once in
 * init(), read after pthread_once). */
static bool fence_mode;

static molt__lock reclaim_lock = MOLT__LOCK_INIT(shadow_reclaim);
/* Threads waiting for reclaim_lock in a blocking call (free_all, fork).
 * The passes that retirements start only try the lock, and skip while
 * someone waits: otherwise threads that keep freeing could take the lock
 * again and again before a woken waiter runs, and starve it. */
static _Atomic int reclaim_waiters;
/* The hazard pointers of one pass, sorted (reclaim_lock). */
static void **scan_buf;
static size_t scan_cap;
/* Nodes retired while membarrier() failed although it worked at start-up:
 * kept for ever, never freed under a reader (reclaim_lock). */
static node *kept_nodes;
static table *kept_tables;

#define MARK ((uintptr_t)1)
static inline node *node_of(uintptr_t link) { return (node *)(link & ~MARK); }

/* ---- hashing -------------------------------------------------------------*/

static inline uint64_t hash_of(const void *obj, uint64_t id) {
  /* Objects are 16-byte aligned and ids small numbers: mix both, then two
   * xor-shift-multiply rounds (the top bits pick the shard, the low bits
   * the bucket). */
  uint64_t h = (uint64_t)(uintptr_t)obj ^ (id * 0x9e3779b97f4a7c15ull);
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  return h;
}

static inline shard *shard_of(uint64_t h) { return &shards[h >> (64 - SHARD_BITS)]; }

/* ---- initialization, threads, fork ---------------------------------------*/

static void reader_exit(void *arg) {
  reader *r = arg;
  self = NULL;
  for (int l = 0; l < HP_LEVELS; l++)
    for (int i = 0; i < HP_PER_LEVEL; i++)
      atomic_store_explicit(&r->hp[l][i], NULL, memory_order_release);
  /* release: everything the thread did through the record happens before
   * the next owner's claim (acquire CAS). */
  atomic_store_explicit(&r->owned, 0, memory_order_release);
}

static void reclaim_lock_blocking(void) {
  /* relaxed: only a hint for the trylock side; the mutex orders the rest. */
  atomic_fetch_add_explicit(&reclaim_waiters, 1, memory_order_relaxed);
  molt__lock_acquire(&reclaim_lock);
  atomic_fetch_sub_explicit(&reclaim_waiters, 1, memory_order_relaxed);
}

/* fork(): service/runtime.c's handlers call these first (prepare) and last
 * (parent, child), the order of the lock table.  The shard locks are all
 * of one rank, so the checked acquire would report the second one: they
 * are taken raw, in index order -- the only place that holds two, and
 * writers hold one at a time, so it cannot deadlock against them.
 *
 * A constructor must not fork (molt.h): its thread holds its shard's lock,
 * which this would take again.  Skipping that shard is no way out: the
 * thread would take the lower shards while holding a higher one, against
 * the index order of a fork() in another thread -- a deadlock between the
 * two.  It is reported (molt status names it) before the thread blocks. */
void molt__shadow_fork_prepare(void) {
  if (ctor_shard)
    molt__fail("fork() called inside a shadow-data constructor: the thread holds "
               "shadow_lock of shard %u, which the fork handler takes; it blocks",
               (unsigned)(ctor_shard - shards));
  for (unsigned i = 0; i < SHARDS; i++)
    pthread_mutex_lock(&shards[i].lock.m);
  reclaim_lock_blocking();
}

void molt__shadow_fork_parent(void) {
  molt__lock_release(&reclaim_lock);
  for (unsigned i = SHARDS; i-- > 0;)
    pthread_mutex_unlock(&shards[i].lock.m);
}

/* In the child only the forking thread exists.  It holds every lock here
 * itself (no other thread of the parent held one across fork()), so
 * releasing them is enough.  The other threads' records are given back
 * with their hazard pointers cleared. */
void molt__shadow_fork_child(void) {
  /* relaxed: the child has one thread, this one. */
  for (reader *r = atomic_load_explicit(&readers, memory_order_relaxed); r; r = r->next) {
    if (r == self)
      continue;
    for (int l = 0; l < HP_LEVELS; l++)
      for (int i = 0; i < HP_PER_LEVEL; i++)
        atomic_store_explicit(&r->hp[l][i], NULL, memory_order_relaxed);
    r->depth = 0;
    atomic_store_explicit(&r->owned, 0, memory_order_relaxed);
  }
  molt__shadow_fork_parent();
}

/* The barrier of a reclamation pass.  Only the expedited command (an IPI
 * to the CPUs that run our threads, microseconds): passes run on
 * application threads, which must not wait for the global command's
 * scheduler pass (milliseconds) that platform.c accepts for the runtime
 * thread.  Without it, readers fence themselves (fence_mode). */
static bool membarrier_expedited(void) {
  long mask = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  /* Registering is idempotent (platform.c registers the same command). */
  return mask >= 0 && (mask & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
         syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

static void init(void) {
  key_ok = pthread_key_create(&exit_key, reader_exit) == 0;
  /* MOLT__SHADOW_FENCES=1 (tests only) takes the path of kernels without
   * the expedited membarrier(). */
  const char *force = getenv("MOLT__SHADOW_FENCES");
  fence_mode = (force && *force == '1') || !membarrier_expedited();
}

static inline void init_once(void) { pthread_once(&once, init); }

/* The calling thread's record: a given-back one, else a new one.  NULL
 * only when out of memory (the caller then reads under the shard lock). */
static __attribute__((noinline)) reader *reader_claim(void) {
  init_once();
  reader *r;
  for (r = atomic_load_explicit(&readers, memory_order_acquire); r; r = r->next) {
    int free_rec = 0;
    /* relaxed peek (a failed CAS is only a missed record); acquire CAS:
     * pairs with the release in reader_exit. */
    if (atomic_load_explicit(&r->owned, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_strong_explicit(
            &r->owned, &free_rec, 1, memory_order_acquire, memory_order_relaxed))
      break;
  }
  if (!r) {
    r = aligned_alloc(alignof(reader), sizeof *r);
    if (!r)
      return NULL;
    memset(r, 0, sizeof *r);
    atomic_init(&r->owned, 1);
    /* relaxed: as in push_node. */
    reader *head = atomic_load_explicit(&readers, memory_order_relaxed);
    do
      r->next = head;
    /* release: the record's initial fields are visible to a reclaimer that
     * finds it in the list (acquire load of `readers`). */
    while (!atomic_compare_exchange_weak_explicit(
        &readers, &head, r, memory_order_release, memory_order_relaxed));
  }
  r->depth = 0;
  self = r;
  /* Without a key the record is never given back (one record per thread
   * ever created: a leak, never a fault). */
  if (key_ok)
    pthread_setspecific(exit_key, r);
  return r;
}

/* ---- lookups -------------------------------------------------------------*/

/* Publishes a hazard pointer.  release: whatever this thread read through
 * the slot's previous value happens before a reclaimer that reads the new
 * value (acquire) frees the old one.  The store must also precede the
 * check loads that follow (store-load order): a compiler barrier here, the
 * CPU-level order comes from the reclaimer's membarrier() (file comment).
 * Without membarrier() the store is an exchange: on x86-64 (molt's only
 * target) a locked instruction, i.e. a store followed by a full barrier,
 * which pairs with the reclaimer's (scan_hazards). */
static inline void hp_set(_Atomic(void *) *slot, void *p, bool fence) {
  if (__builtin_expect(fence, 0))
    (void)atomic_exchange_explicit(slot, p, memory_order_seq_cst);
  else
    atomic_store_explicit(slot, p, memory_order_release);
  atomic_signal_fence(memory_order_seq_cst);
}

/* The lock-free lookup with the hazard pointers hp[0..2]. */
static inline node *lookup(_Atomic(void *) *hp, shard *sh, uint64_t h, const void *obj,
                           uint64_t id, bool fence) {
retry:;
  /* acquire (table loads): pairs with the release that published the
   * table, so its buckets and the links of its parity are visible. */
  table *t = atomic_load_explicit(&sh->table, memory_order_acquire);
  if (!t)
    return NULL;
  hp_set(&hp[HP_TABLE], t, fence);
  if (atomic_load_explicit(&sh->table, memory_order_acquire) != t)
    goto retry;
  unsigned p = t->parity;
  _Atomic(uintptr_t) *link = &t->bucket[h & t->mask];
  int slot = 1;
  /* acquire (link loads): pairs with the release store that made the node
   * reachable, so its obj, id and data (zeroed, constructed) are visible. */
  uintptr_t cur = atomic_load_explicit(link, memory_order_acquire);
  while (cur) {
    if (cur & MARK) /* the node holding `link` was unlinked */
      goto retry;
    node *n = node_of(cur);
    hp_set(&hp[slot], n, fence);
    /* n is protected once it is still reachable from a protected place of
     * the current table (see the file comment). */
    if (atomic_load_explicit(link, memory_order_acquire) != cur ||
        atomic_load_explicit(&sh->table, memory_order_acquire) != t)
      goto retry;
    if (n->obj == obj && n->id == id)
      return n;
    link = &n->next[p];
    cur = atomic_load_explicit(link, memory_order_acquire);
    slot = 3 - slot; /* the other node slot; n stays protected in this one */
  }
  /* The end of a chain of the current table is the answer; a link read in
   * a table that has since been replaced may have been rewritten by a later
   * growth (links of that parity): look again. */
  if (atomic_load_explicit(&sh->table, memory_order_acquire) != t)
    goto retry;
  return NULL;
}

/* Under the shard lock (no marks on live nodes). */
static node *walk_locked(const table *t, uint64_t h, const void *obj, uint64_t id) {
  unsigned p = t->parity;
  /* relaxed: the lock orders every write. */
  for (node *n =
           node_of(atomic_load_explicit(&t->bucket[h & t->mask], memory_order_relaxed));
       n; n = node_of(atomic_load_explicit(&n->next[p], memory_order_relaxed)))
    if (n->obj == obj && n->id == id)
      return n;
  return NULL;
}

static __attribute__((noinline)) void *get_locked(const void *obj, uint64_t id) {
  uint64_t h = hash_of(obj, id);
  shard *sh = shard_of(h);
  init_once();
  /* In a constructor of this very shard the thread holds its lock. */
  bool held = sh == ctor_shard;
  if (!held)
    molt__lock_acquire(&sh->lock);
  table *t = atomic_load_explicit(&sh->table, memory_order_relaxed);
  node *n = t ? walk_locked(t, h, obj, id) : NULL;
  if (!held)
    molt__lock_release(&sh->lock);
  return n ? n->data : NULL;
}

/* The rare cases of molt_shadow_get, out of line so that the fast path
 * saves no registers: obj NULL, the thread's first call, deeper nesting. */
static __attribute__((noinline)) void *get_slow(const void *obj, uint64_t id) {
  if (!obj)
    return NULL;
  if (!self)
    return reader_claim() ? molt_shadow_get(obj, id) : get_locked(obj, id);
  return get_locked(obj, id); /* a third nested level (signal handlers) */
}

void *molt_shadow_get(const void *obj, uint64_t id) {
  reader *r = self;
  /* Only this thread (and its signal handlers, which restore it) writes
   * depth: load + store is the increment. */
  int depth;
  if (__builtin_expect(!obj || !r || (depth = r->depth) >= HP_LEVELS, 0))
    return get_slow(obj, id);
  r->depth = depth + 1;
  atomic_signal_fence(memory_order_seq_cst); /* a handler sees the new depth */
  uint64_t h = hash_of(obj, id);
  _Atomic(void *) *hp = r->hp[depth];
  node *n = lookup(hp, shard_of(h), h, obj, id, fence_mode);
  /* release (clearing): our reads of the nodes happen before a reclaimer
   * that sees the slots empty (acquire) frees them. */
  for (int i = 0; i < HP_PER_LEVEL; i++)
    atomic_store_explicit(&hp[i], NULL, memory_order_release);
  atomic_signal_fence(memory_order_seq_cst);
  r->depth = depth;
  return n ? n->data : NULL;
}

/* ---- reclamation ---------------------------------------------------------*/

static void push_node(shard *sh, node *n) {
  /* relaxed: only the CAS below publishes, and it retries with the value
   * it finds. */
  node *head = atomic_load_explicit(&sh->limbo, memory_order_relaxed);
  do
    n->retired = head;
  /* release: n's unlinking (and the destructor's writes) happen before the
   * reclaimer takes the list (acquire exchange). */
  while (!atomic_compare_exchange_weak_explicit(
      &sh->limbo, &head, n, memory_order_release, memory_order_relaxed));
}

static void push_table(shard *sh, table *t) {
  /* relaxed: as in push_node. */
  table *head = atomic_load_explicit(&sh->limbo_tables, memory_order_relaxed);
  do
    t->retired = head;
  /* release: as in push_node. */
  while (!atomic_compare_exchange_weak_explicit(
      &sh->limbo_tables, &head, t, memory_order_release, memory_order_relaxed));
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

static bool protected_by_hp(const void *p, size_t n) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if ((uintptr_t)scan_buf[mid] < (uintptr_t)p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && scan_buf[lo] == p;
}

/* Reads every hazard pointer into scan_buf, sorted.  SIZE_MAX if no
 * barrier or no memory for the list: then nothing may be freed. */
static size_t scan_hazards(void) {
  static _Atomic int fence_word;
  if (fence_mode)
    /* A locked instruction, a full barrier on x86-64: pairs with the
     * readers' exchange (store-buffering with a barrier on each side). */
    (void)atomic_fetch_add_explicit(&fence_word, 0, memory_order_seq_cst);
  else if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0)
    return SIZE_MAX;
  size_t n = 0;
  for (reader *r = atomic_load_explicit(&readers, memory_order_acquire); r; r = r->next) {
    if (n + HP_LEVELS * HP_PER_LEVEL > scan_cap) {
      size_t cap = scan_cap ? scan_cap * 2 : 64;
      void **b = realloc(scan_buf, cap * sizeof *b);
      if (!b)
        return SIZE_MAX;
      scan_buf = b;
      scan_cap = cap;
    }
    for (int l = 0; l < HP_LEVELS; l++)
      for (int i = 0; i < HP_PER_LEVEL; i++) {
        /* acquire: pairs with the reader's release store of a later value
         * (see hp_set), so its reads through the earlier one are done. */
        void *p = atomic_load_explicit(&r->hp[l][i], memory_order_acquire);
        if (p)
          scan_buf[n++] = p;
      }
  }
  if (n > 1)
    qsort(scan_buf, n, sizeof *scan_buf, cmp_ptr);
  return n;
}

/* One reclamation pass: frees every retired node and table that no hazard
 * pointer names, and puts the others back.  block: wait for the lock
 * (free_all); else give up at once if another pass runs or someone waits. */
static void reclaim(bool block) {
  /* The trylock is raw (the check has no try): a try cannot deadlock, and
   * the thread holds no shard lock here (retire_node's callers released
   * it).  The release at the end is the checked one either way: it only
   * clears a rank bit that is set in the blocking case. */
  if (block)
    reclaim_lock_blocking();
  else if (atomic_load_explicit(&reclaim_waiters, memory_order_relaxed) ||
           pthread_mutex_trylock(&reclaim_lock.m) != 0)
    return;
  node *nodes[SHARDS];
  table *tables[SHARDS];
  bool any = false;
  for (unsigned i = 0; i < SHARDS; i++) {
    shard *sh = &shards[i];
    /* relaxed: a trigger count, it orders nothing. */
    atomic_store_explicit(&sh->nretired, 0, memory_order_relaxed);
    /* acquire: pairs with the retiring thread's release push, so the
     * unlinking happens before our membarrier(). */
    nodes[i] = atomic_exchange_explicit(&sh->limbo, NULL, memory_order_acquire);
    tables[i] = atomic_exchange_explicit(&sh->limbo_tables, NULL, memory_order_acquire);
    any |= nodes[i] || tables[i];
  }
  if (!any)
    goto out;
  size_t nhp = scan_hazards();
  for (unsigned i = 0; i < SHARDS; i++) {
    for (node *n = nodes[i], *next; n; n = next) {
      next = n->retired;
      if (nhp == SIZE_MAX) {
        n->retired = kept_nodes;
        kept_nodes = n;
      } else if (protected_by_hp(n, nhp)) {
        push_node(&shards[i], n); /* a later pass frees it */
      } else {
        free(n);
      }
    }
    for (table *t = tables[i], *next; t; t = next) {
      next = t->retired;
      if (nhp == SIZE_MAX) {
        t->retired = kept_tables;
        kept_tables = t;
      } else if (protected_by_hp(t, nhp)) {
        push_table(&shards[i], t);
      } else {
        free(t);
      }
    }
  }
out:
  molt__lock_release(&reclaim_lock);
}

/* n is unlinked; the caller holds no lock. */
static void retire_node(shard *sh, node *n) {
  push_node(sh, n);
  /* One pass (one membarrier()) per batch of retirements.  relaxed: a
   * trigger count, it orders nothing. */
  size_t k = atomic_fetch_add_explicit(&sh->nretired, 1, memory_order_relaxed) + 1;
  if (k >= RECLAIM_BATCH)
    reclaim(false);
}

/* ---- writers (shard lock held) --------------------------------------------*/

static table *table_new(size_t buckets, unsigned parity, unsigned shard_index) {
  if (buckets > (SIZE_MAX - sizeof(table)) / sizeof(_Atomic(uintptr_t)))
    return NULL;
  table *t = calloc(1, sizeof(table) + buckets * sizeof(_Atomic(uintptr_t)));
  if (!t)
    return NULL;
  t->mask = buckets - 1;
  t->parity = parity;
  t->shard = shard_index;
  return t;
}

/* Doubles the shard's table when it holds more shadows than buckets.  A
 * failed allocation only leaves the chains longer. */
static void maybe_grow(shard *sh) {
  table *t = atomic_load_explicit(&sh->table, memory_order_relaxed);
  if (sh->count <= t->mask + 1 || t->mask + 1 > SIZE_MAX / 4)
    return;
  unsigned p = t->parity, np = p ^ 1u;
  table *nt = table_new((t->mask + 1) * 2, np, t->shard);
  if (!nt)
    return;
  for (size_t i = 0; i <= t->mask; i++)
    for (node *n = node_of(atomic_load_explicit(&t->bucket[i], memory_order_relaxed)); n;
         n = node_of(atomic_load_explicit(&n->next[p], memory_order_relaxed))) {
      _Atomic(uintptr_t) *b = &nt->bucket[hash_of(n->obj, n->id) & nt->mask];
      /* relaxed: readers trust links of parity np only after checking that
       * nt is the current table, and nt is published below with release.
       * (A reader still in the table before t may read these links, but
       * its check against shard->table fails before it uses them.) */
      atomic_store_explicit(&n->next[np], atomic_load_explicit(b, memory_order_relaxed),
                            memory_order_relaxed);
      atomic_store_explicit(b, (uintptr_t)n, memory_order_relaxed);
    }
  /* release: a reader that loads nt (acquire) sees its buckets and links. */
  atomic_store_explicit(&sh->table, nt, memory_order_release);
  push_table(sh, t);
}

/* Makes n reachable at the head of its bucket. */
static void insert(shard *sh, table *t, uint64_t h, node *n) {
  _Atomic(uintptr_t) *b = &t->bucket[h & t->mask];
  /* relaxed: n is not reachable yet; the release below publishes it. */
  atomic_store_explicit(&n->next[t->parity],
                        atomic_load_explicit(b, memory_order_relaxed),
                        memory_order_relaxed);
  /* release: n's obj, id, link and data (zeroed, constructed) are visible
   * to a reader that loads n from this link (acquire). */
  atomic_store_explicit(b, (uintptr_t)n, memory_order_release);
  sh->count++;
  maybe_grow(sh);
}

/* Under the shard lock: the link that points at (obj, id), or NULL. */
static _Atomic(uintptr_t) *find_link(table *t, uint64_t h, const void *obj, uint64_t id) {
  unsigned p = t->parity;
  _Atomic(uintptr_t) *link = &t->bucket[h & t->mask];
  for (;;) {
    node *n = node_of(atomic_load_explicit(link, memory_order_relaxed));
    if (!n)
      return NULL;
    if (n->obj == obj && n->id == id)
      return link;
    link = &n->next[p];
  }
}

static node *unlink_at(shard *sh, table *t, _Atomic(uintptr_t) *link) {
  unsigned p = t->parity;
  node *n = node_of(atomic_load_explicit(link, memory_order_relaxed));
  uintptr_t succ = atomic_load_explicit(&n->next[p], memory_order_relaxed);
  /* Mark first: a reader standing on n can no longer check a step through
   * n's link, so it never trusts a successor that may be retired later.
   * release (both stores): a reader that follows `link` to succ sees succ's
   * initialized fields, which we saw through the lock. */
  atomic_store_explicit(&n->next[p], succ | MARK, memory_order_release);
  atomic_store_explicit(link, succ, memory_order_release);
  sh->count--;
  return n;
}

typedef enum { MODE_ALLOC, MODE_GET_OR_ALLOC, MODE_ATTACH } alloc_mode;

static void *alloc_common(const void *obj, uint64_t id, size_t size,
                          molt_shadow_ctor_fn ctor, void *arg, alloc_mode mode,
                          molt_shadow_dtor_fn stale_dtor) {
  if (!obj || size == 0 || size > SIZE_MAX / 2 - sizeof(node))
    return NULL;
  if (mode == MODE_GET_OR_ALLOC) {
    void *have = molt_shadow_get(obj, id);
    if (have)
      return have;
  }
  if (ctor_shard)
    return NULL;
  init_once();
  node *n = calloc(1, sizeof(node) + size);
  if (n) {
    n->obj = obj;
    n->id = id;
    n->size = size;
  } else if (mode != MODE_ATTACH) {
    return NULL;
  }
  uint64_t h = hash_of(obj, id);
  shard *sh = shard_of(h);
  void *result = NULL;
  node *stale = NULL;
  molt__lock_acquire(&sh->lock);
  table *t = atomic_load_explicit(&sh->table, memory_order_relaxed);
  if (!t && n) {
    t = table_new(MIN_BUCKETS, 0, (unsigned)(sh - shards));
    if (t)
      /* release: the zeroed buckets are visible to readers (acquire). */
      atomic_store_explicit(&sh->table, t, memory_order_release);
  }
  _Atomic(uintptr_t) *link = t ? find_link(t, h, obj, id) : NULL;
  if (link) {
    node *have = node_of(atomic_load_explicit(link, memory_order_relaxed));
    if (mode == MODE_GET_OR_ALLOC) {
      /* Another thread constructed it between our get and the lock. */
      result = have->data;
      goto unlock;
    }
    if (mode == MODE_ALLOC)
      goto unlock;
    /* attach: the object is new, so a shadow at its address belonged to
     * an earlier object that was freed without freeing it. */
    stale = unlink_at(sh, t, link);
  }
  if (!n || !t)
    goto unlock;
  if (ctor) {
    ctor_shard = sh;
    int rc = ctor(obj, n->data, arg);
    ctor_shard = NULL;
    if (rc != 0)
      goto unlock;
  }
  insert(sh, t, h, n);
  result = n->data;
  n = NULL;
unlock:
  molt__lock_release(&sh->lock);
  free(n); /* never published: no reader can have seen it */
  if (stale) {
    if (stale_dtor)
      stale_dtor(obj, stale->data);
    retire_node(sh, stale);
  }
  return result;
}

void *molt_shadow_alloc(const void *obj, uint64_t id, size_t size,
                        molt_shadow_ctor_fn ctor, void *arg) {
  return alloc_common(obj, id, size, ctor, arg, MODE_ALLOC, NULL);
}

void *molt_shadow_get_or_alloc(const void *obj, uint64_t id, size_t size,
                               molt_shadow_ctor_fn ctor, void *arg) {
  return alloc_common(obj, id, size, ctor, arg, MODE_GET_OR_ALLOC, NULL);
}

void *molt_shadow_attach(const void *obj, uint64_t id, size_t size,
                         molt_shadow_ctor_fn ctor, void *arg,
                         molt_shadow_dtor_fn stale_dtor) {
  return alloc_common(obj, id, size, ctor, arg, MODE_ATTACH, stale_dtor);
}

int molt_shadow_free(const void *obj, uint64_t id, molt_shadow_dtor_fn dtor) {
  if (!obj)
    return MOLT_EINVAL;
  if (ctor_shard)
    return MOLT_EBUSY;
  init_once();
  uint64_t h = hash_of(obj, id);
  shard *sh = shard_of(h);
  node *n = NULL;
  molt__lock_acquire(&sh->lock);
  table *t = atomic_load_explicit(&sh->table, memory_order_relaxed);
  _Atomic(uintptr_t) *link = t ? find_link(t, h, obj, id) : NULL;
  if (link)
    n = unlink_at(sh, t, link);
  molt__lock_release(&sh->lock);
  if (!n)
    return MOLT_ENOENT;
  /* Outside the lock: a destructor may call molt_shadow_* itself. */
  if (dtor)
    dtor(obj, n->data);
  retire_node(sh, n);
  return 0;
}

size_t molt_shadow_free_all(uint64_t id, molt_shadow_dtor_fn dtor) {
  if (ctor_shard)
    return 0;
  init_once();
  size_t freed = 0;
  for (unsigned i = 0; i < SHARDS; i++) {
    shard *sh = &shards[i];
    node *mine = NULL;
    molt__lock_acquire(&sh->lock);
    table *t = atomic_load_explicit(&sh->table, memory_order_relaxed);
    for (size_t b = 0; t && b <= t->mask; b++) {
      _Atomic(uintptr_t) *link = &t->bucket[b];
      node *n;
      while ((n = node_of(atomic_load_explicit(link, memory_order_relaxed)))) {
        if (n->id == id) {
          unlink_at(sh, t, link);
          n->retired = mine;
          mine = n;
        } else {
          link = &n->next[t->parity];
        }
      }
    }
    molt__lock_release(&sh->lock);
    while (mine) {
      node *next = mine->retired;
      if (dtor)
        dtor(mine->obj, mine->data);
      push_node(sh, mine);
      freed++;
      mine = next;
    }
  }
  /* Give the memory back now: a rollback's clean-up frees many at once. */
  if (freed)
    reclaim(true);
  return freed;
}

size_t molt_shadow_count(uint64_t id) {
  if (ctor_shard)
    return 0;
  init_once();
  size_t count = 0;
  for (unsigned i = 0; i < SHARDS; i++) {
    shard *sh = &shards[i];
    molt__lock_acquire(&sh->lock);
    table *t = atomic_load_explicit(&sh->table, memory_order_relaxed);
    for (size_t b = 0; t && b <= t->mask; b++)
      for (node *n = node_of(atomic_load_explicit(&t->bucket[b], memory_order_relaxed));
           n;
           n = node_of(atomic_load_explicit(&n->next[t->parity], memory_order_relaxed)))
        count += n->id == id;
    molt__lock_release(&sh->lock);
  }
  return count;
}

size_t molt_shadow_total(void) {
  if (ctor_shard)
    return 0;
  init_once();
  size_t count = 0;
  for (unsigned i = 0; i < SHARDS; i++) {
    molt__lock_acquire(&shards[i].lock);
    count += shards[i].count;
    molt__lock_release(&shards[i].lock);
  }
  return count;
}
