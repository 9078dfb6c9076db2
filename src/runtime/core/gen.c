/* Generations: immutable tables "function index -> version", their slots,
 * their numbers, the owners their tables point into, publication and
 * reclamation.
 *
 * All functions here run with molt__rt_lock held (except molt_generation
 * and molt__gen_number_now, which say so).  The fast path (molt/abi.h)
 * reads molt__current, molt__gens[s] and the counters without any lock;
 * the comments at each store say how it is ordered against those readers.
 *
 * Once reclamation has freed a generation, gen.c works out per function
 * index whether all published, not yet reclaimed generations map it to one
 * version (molt__gen_relax_if_due) and hands that to entry.c, which makes
 * such entries jump straight to it -- entries learn it without asking.  (A
 * generation built but not yet published does not count: its publication
 * prepares its entries again.) */
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

/* Private side of a generation slot. */
typedef struct priv {
  bool in_use;
  bool retired;              /* no longer current (may still run) */
  void **table;              /* owned copy (molt__gens[s].table aliases it) */
  molt__owner **entry_owner; /* per entry: owner of its version, NULL = program */
  molt__owner **owners;      /* distinct owners the table points into */
  size_t nowners;
  bool counted; /* published (its owners are referenced) */
  uint64_t retired_at_ns;
} priv;

/* Slot 0 starts as an empty generation so that molt__current is never NULL,
 * even before the first module registers. */
static void *const empty_table[1];
molt__gen molt__gens[MOLT__SLOTS] = {[0] = {.table = empty_table}};
_Atomic(molt__gen *) molt__current = &molt__gens[0];

static priv privs[MOLT__SLOTS] = {[0] = {.in_use = true}};
static unsigned next_slot = 1;
static bool reclaim_ok;
static uint64_t mark_stamp;
static uint64_t last_number; /* highest generation number published */
static bool relax_due;       /* a generation was freed since the last relax */

/* Per function index: version 0. */
static void **bodies;
static uint32_t nfns, capfns;

void molt__gen_init(void) {
  for (unsigned s = 0; s < MOLT__SLOTS; s++)
    molt__gens[s].slot = s;
  reclaim_ok = molt__membarrier_init();
}

bool molt__gen_reclaim_enabled(void) { return reclaim_ok; }

molt__gen *molt__gen_current(void) {
  /* relaxed: only the runtime (under molt__rt_lock) stores molt__current. */
  return atomic_load_explicit(&molt__current, memory_order_relaxed);
}

uint64_t molt__gen_number_now(void) {
  molt__rt_lock_acquire();
  uint64_t n = molt__gen_current()->number;
  molt__rt_lock_release();
  return n;
}

uint64_t molt_generation(void) {
  /* Pin the generation so that reading its number cannot race with the
   * slot being reused. */
  molt__gen *g = molt__enter();
  uint64_t n = g->number;
  molt__leave(g);
  return n;
}

int molt__gen_add_functions(const molt__fn_desc *start, uint32_t first, uint32_t n) {
  if (first + n > capfns) {
    uint32_t cap = capfns ? capfns : 64;
    while (cap < first + n)
      cap *= 2;
    void **b = realloc(bodies, cap * sizeof *b);
    if (!b)
      return MOLT_ENOMEM;
    bodies = b;
    capfns = cap;
  }
  for (uint32_t i = 0; i < n; i++)
    bodies[first + i] = start[i].body;
  if (first + n > nfns)
    nfns = first + n;
  return 0;
}

void *molt__gen_body(uint32_t index) { return index < nfns ? bodies[index] : NULL; }

int molt__gen_new(const molt__gen *from, bool numbered, molt__gen **out) {
  /* Round-robin over the slots: a slot is reused as late as possible, which
   * keeps the (harmless) ABA case of the fast path rare. */
  unsigned s = MOLT__SLOTS;
  for (unsigned i = 0; i < MOLT__SLOTS; i++) {
    unsigned c = (next_slot + i) % MOLT__SLOTS;
    if (!privs[c].in_use) {
      s = c;
      break;
    }
  }
  if (s == MOLT__SLOTS)
    return MOLT_EBUSY;
  uint32_t n = nfns;
  void **table = malloc((n ? n : 1) * sizeof *table);
  molt__owner **owner = calloc(n ? n : 1, sizeof *owner);
  if (!table || !owner) {
    free(table);
    free(owner);
    return MOLT_ENOMEM;
  }
  uint32_t copied = 0;
  if (from) {
    const priv *fp = &privs[from->slot];
    copied = from->size < n ? from->size : n;
    memcpy(table, from->table, copied * sizeof *table);
    if (fp->entry_owner)
      memcpy(owner, fp->entry_owner, copied * sizeof *owner);
  }
  for (uint32_t i = copied; i < n; i++)
    table[i] = bodies[i];

  next_slot = (s + 1) % MOLT__SLOTS;
  privs[s] = (priv){.in_use = true, .table = table, .entry_owner = owner};
  /* Plain stores: slot s is not published, and a stale reader that still
   * holds &molt__gens[s] fails its recheck (molt__current != it) before it
   * reads any field.  The release store in molt__gen_publish orders these
   * writes before any reader can see s as current. */
  molt__gens[s].table = table;
  molt__gens[s].size = n;
  molt__gens[s].number = numbered ? last_number + 1 : from ? from->number : 0;
  *out = &molt__gens[s];
  return 0;
}

void molt__gen_set(molt__gen *g, uint32_t index, void *impl, molt__owner *owner) {
  priv *p = &privs[g->slot];
  p->table[index] = impl;
  p->entry_owner[index] = owner;
}

molt__owner *const *molt__gen_owners(const molt__gen *g) {
  return privs[g->slot].entry_owner;
}

molt__owner *molt__gen_owner(const molt__gen *g, uint32_t index) {
  const priv *p = &privs[g->slot];
  return p->entry_owner && index < g->size ? p->entry_owner[index] : NULL;
}

bool molt__gen_live(unsigned s, bool *current) {
  const molt__gen *cur = molt__gen_current();
  *current = &molt__gens[s] == cur;
  return privs[s].in_use && (privs[s].table || *current);
}

static void release_slot(unsigned s) {
  priv *p = &privs[s];
  free(p->table);
  free(p->entry_owner);
  free(p->owners);
  *p = (priv){0};
}

void molt__gen_discard(molt__gen *g) { release_slot(g->slot); }

/* The distinct owners g's table points into, each referenced once (at
 * publication). */
static int collect_owners(molt__gen *g) {
  priv *p = &privs[g->slot];
  uint64_t stamp = ++mark_stamp;
  size_t n = 0, cap = 0;
  molt__owner **list = NULL;
  for (uint32_t i = 0; i < g->size; i++) {
    molt__owner *o = p->entry_owner[i];
    if (!o || o->mark == stamp)
      continue;
    o->mark = stamp;
    if (n == cap) {
      size_t nc = cap ? cap * 2 : 4;
      molt__owner **nl = realloc(list, nc * sizeof *nl);
      if (!nl) {
        free(list);
        return MOLT_ENOMEM;
      }
      list = nl;
      cap = nc;
    }
    list[n++] = o;
  }
  for (size_t i = 0; i < n; i++)
    list[i]->gen_refs++;
  p->owners = list;
  p->nowners = n;
  p->counted = true;
  return 0;
}

int molt__gen_publish(molt__gen *g) {
  /* First the entries: every function g replaces must run its dispatch
   * path before g can be seen (entry.c). */
  char why[256];
  int rc = molt__entries_prepare(g, why, sizeof why);
  if (rc < 0) {
    molt__log(MOLT__EV_FAIL, g->number, NULL, "generation %llu not published: %s",
              (unsigned long long)g->number, why);
    return rc;
  }
  rc = collect_owners(g);
  if (rc < 0)
    return rc;
  molt__gen *old = molt__gen_current();
  /* release: the table and the fields of g (written above and in
   * molt__gen_new) happen before any reader's acquire recheck that sees g.
   * Every call that starts after this store runs g (guarantee H2). */
  atomic_store_explicit(&molt__current, g, memory_order_release);
  if (g->number > last_number)
    last_number = g->number;
  if (old != g) {
    privs[old->slot].retired = true;
    privs[old->slot].retired_at_ns = molt__now_ns();
  }
  molt__wake(); /* the runtime thread reclaims the retired generation */
  return 0;
}

int molt__gen_bump(uint64_t *number) {
  molt__gen *g = NULL;
  int rc = molt__gen_new(molt__gen_current(), true, &g);
  if (rc < 0)
    return rc;
  rc = molt__gen_publish(g);
  if (rc < 0) {
    molt__gen_discard(g);
    return rc;
  }
  /* Same table: threads with local views may follow at once, which lets
   * the previous generation be reclaimed without waiting for their next
   * quiescence point. */
  molt__threads_set_views(g);
  *number = g->number;
  return 0;
}

int molt__gen_extend_current(void) {
  molt__gen *g;
  int rc = molt__gen_new(molt__gen_current(), false, &g);
  if (rc < 0)
    return rc;
  rc = molt__gen_publish(g);
  if (rc < 0)
    molt__gen_discard(g);
  return rc;
}

static void scan_thread(void *arg, const molt__thread *t, pid_t tid) {
  molt__gen_usage *u = arg;
  (void)tid;
  for (unsigned s = 0; s < MOLT__SLOTS; s++)
    /* acquire: pairs with the release decrement in molt__leave, so all
     * accesses of a finished call happen before we free what it used. */
    u->active[s] +=
        atomic_load_explicit(&((molt__thread *)t)->active[s], memory_order_acquire);
  /* acquire: pairs with the thread's release store of its view (local
   * policy): a view we see is pinned. */
  molt__gen *v = atomic_load_explicit(&((molt__thread *)t)->view, memory_order_acquire);
  if (v)
    u->views[v->slot]++;
}

void molt__gen_scan(molt__gen_usage *u) {
  memset(u, 0, sizeof *u);
  molt__threads_foreach(scan_thread, u);
}

size_t molt__gen_reclaim(molt__owner **released) {
  size_t retired = 0;
  for (unsigned s = 0; s < MOLT__SLOTS; s++)
    retired += privs[s].in_use && privs[s].retired;
  if (!retired || !reclaim_ok)
    return retired;
  /* First a look without the barrier: a retired generation that some
   * thread is seen to run (a count or a view) stays alive whatever the
   * barrier would add.  A count read without the barrier can be stale or
   * about to drop (a call ending, a recheck about to fail): that only
   * keeps the generation one pass longer.  Only a count read as zero needs
   * the barrier below before it is believed.  So while an old generation
   * lingers, the reclaimer's polls interrupt no thread (the barrier is an
   * IPI to every CPU running the process: issue 14, item 3). */
  molt__gen_usage u;
  molt__gen_scan(&u);
  bool candidate = false;
  for (unsigned s = 0; s < MOLT__SLOTS && !candidate; s++)
    candidate = privs[s].in_use && privs[s].retired && !u.active[s] && !u.views[s];
  if (!candidate)
    return retired;
  /* After this barrier every thread either made its counter increment for
   * a generation visible to the scan below, or will fail its recheck
   * because it sees the generation that retired this one (molt/abi.h,
   * molt__enter). */
  if (molt__membarrier() != 0) {
    reclaim_ok = false;
    molt__log(MOLT__EV_FAIL, molt__gen_current()->number, NULL,
              "membarrier failed: old versions will no longer be unloaded");
    return retired;
  }
  molt__gen_scan(&u);
  bool freed = false;
  for (unsigned s = 0; s < MOLT__SLOTS; s++) {
    priv *p = &privs[s];
    if (!p->in_use || !p->retired || u.active[s] || u.views[s])
      continue;
    for (size_t i = 0; i < p->nowners; i++)
      if (--p->owners[i]->gen_refs == 0) {
        p->owners[i]->release_next = *released;
        *released = p->owners[i];
      }
    molt__log(MOLT__EV_RECLAIM, molt__gens[s].number, NULL,
              "generation %llu no longer runs anywhere (slot %u freed)",
              (unsigned long long)molt__gens[s].number, s);
    release_slot(s);
    retired--;
    freed = true;
  }
  relax_due |= freed;
  return retired;
}

void molt__gen_relax_if_due(void) {
  if (!relax_due || molt__proof_holds_dispatch())
    return;
  /* Per function: the version every published live generation maps it to
   * (NULL: they disagree), and its owner if that one may be entered
   * uncounted (core/proof.c decides). */
  uint32_t n = nfns;
  void **agreed = malloc((n ? n : 1) * sizeof *agreed);
  molt__owner **owners = calloc(n ? n : 1, sizeof *owners);
  if (!agreed || !owners) {
    free(agreed);
    free(owners);
    return; /* entries keep dispatching; the next pass tries again */
  }
  bool first = true;
  for (unsigned s = 0; s < MOLT__SLOTS; s++) {
    const priv *p = &privs[s];
    if (!p->in_use || !p->counted)
      continue;
    const molt__gen *g = &molt__gens[s];
    for (uint32_t i = 0; i < n; i++) {
      void *v = i < g->size ? g->table[i] : bodies[i];
      if (first) {
        agreed[i] = v;
        owners[i] = i < g->size ? p->entry_owner[i] : NULL;
      } else if (agreed[i] != v) {
        agreed[i] = NULL;
      }
    }
    first = false;
  }
  for (uint32_t i = 0; i < n && !first; i++)
    if (owners[i] && !molt__proof_accepts(owners[i]))
      owners[i] = NULL;
  if (!first)
    molt__entries_relax(agreed, owners, n);
  relax_due = false;
  free(agreed);
  free(owners);
}

void molt__gen_hold_or_relax(void) {
  if (molt__proof_holds_dispatch()) {
    molt__entries_hold();
    relax_due = true;
  } else {
    molt__gen_relax_if_due();
  }
}
