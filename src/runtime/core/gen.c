/* Generations: immutable tables "function index -> version", their slots,
 * publication and reclamation.
 *
 * All functions here run with molt__rt_lock held.  The fast path (molt.h)
 * reads molt__current, molt__gens[s] and the counters without any lock; the
 * comments at each store say how it is ordered against those readers. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* Slot 0 starts as an empty generation so that molt__current is never NULL,
 * even before the first module registers. */
static void *const empty_table[1];
molt__gen molt__gens[MOLT__SLOTS] = {[0] = {.table = empty_table}};
_Atomic(molt__gen *) molt__current = &molt__gens[0];

static molt__gen_priv priv[MOLT__SLOTS] = {[0] = {.in_use = true}};
static unsigned next_slot = 1;
static bool reclaim_ok;
static uint64_t mark_stamp;

int molt__gen_init(void) {
  for (unsigned s = 0; s < MOLT__SLOTS; s++)
    molt__gens[s].slot = s;
  reclaim_ok = molt__membarrier_init();
  return 0;
}

bool molt__gen_reclaim_enabled(void) { return reclaim_ok; }
molt__gen_priv *molt__gen_priv_of(const molt__gen *g) { return &priv[g->slot]; }

molt__gen *molt__gen_current(void) {
  /* relaxed: only the runtime (under molt__rt_lock) stores molt__current. */
  return atomic_load_explicit(&molt__current, memory_order_relaxed);
}

int molt__gen_new(const molt__gen *from, molt__gen **out) {
  /* Round-robin over the slots: a slot is reused as late as possible, which
   * keeps the (harmless) ABA case of the fast path rare. */
  unsigned s = MOLT__SLOTS;
  for (unsigned i = 0; i < MOLT__SLOTS; i++) {
    unsigned c = (next_slot + i) % MOLT__SLOTS;
    if (!priv[c].in_use) {
      s = c;
      break;
    }
  }
  if (s == MOLT__SLOTS)
    return MOLT_EBUSY;
  uint32_t n = molt__fn_count();
  void **table = malloc((n ? n : 1) * sizeof *table);
  molt__object **owner = calloc(n ? n : 1, sizeof *owner);
  if (!table || !owner) {
    free(table);
    free(owner);
    return MOLT_ENOMEM;
  }
  uint32_t copied = 0;
  if (from) {
    const molt__gen_priv *fp = &priv[from->slot];
    copied = from->size < n ? from->size : n;
    memcpy(table, from->table, copied * sizeof *table);
    if (fp->entry_owner)
      memcpy(owner, fp->entry_owner, copied * sizeof *owner);
  }
  for (uint32_t i = copied; i < n; i++)
    table[i] = molt__fn_at(i)->body;

  next_slot = (s + 1) % MOLT__SLOTS;
  priv[s] = (molt__gen_priv){.in_use = true, .table = table, .entry_owner = owner};
  /* Plain stores: slot s is not published, and a stale reader that still
   * holds &molt__gens[s] fails its recheck (molt__current != it) before it
   * reads any field.  The release store in molt__gen_publish orders these
   * writes before any reader can see s as current. */
  molt__gens[s].table = table;
  molt__gens[s].size = n;
  molt__gens[s].number = from ? from->number : 0;
  *out = &molt__gens[s];
  return 0;
}

void molt__gen_set(molt__gen *g, uint32_t index, void *impl, molt__object *owner) {
  molt__gen_priv *p = &priv[g->slot];
  p->table[index] = impl;
  p->entry_owner[index] = owner;
}

static void release_slot(unsigned s) {
  free(priv[s].table);
  free(priv[s].entry_owner);
  free(priv[s].owners);
  priv[s] = (molt__gen_priv){0};
}

void molt__gen_discard(molt__gen *g) { release_slot(g->slot); }

/* The distinct objects g's table points into, each referenced once. */
static int collect_owners(molt__gen *g) {
  molt__gen_priv *p = &priv[g->slot];
  uint64_t stamp = ++mark_stamp;
  size_t n = 0, cap = 0;
  molt__object **list = NULL;
  for (uint32_t i = 0; i < g->size; i++) {
    molt__object *o = p->entry_owner[i];
    if (!o || o->mark == stamp)
      continue;
    o->mark = stamp;
    if (n == cap) {
      size_t nc = cap ? cap * 2 : 4;
      molt__object **nl = realloc(list, nc * sizeof *nl);
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
    molt__object_ref(list[i]);
  p->owners = list;
  p->nowners = n;
  return 0;
}

int molt__gen_publish_checked(molt__gen *g) {
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
   * Every call that starts after this store runs g (SPEC H2). */
  atomic_store_explicit(&molt__current, g, memory_order_release);
  if (old != g) {
    priv[old->slot].retired = true;
    priv[old->slot].retired_at_ns = molt__now_ns();
  }
  molt__runtime_kick();
  return 0;
}

void molt__gen_publish(molt__gen *g) { (void)molt__gen_publish_checked(g); }

int molt__gen_extend_current(void) {
  molt__gen *cur = molt__gen_current(), *g;
  int rc = molt__gen_new(cur, &g);
  if (rc < 0)
    return rc;
  rc = molt__gen_publish_checked(g);
  if (rc < 0)
    molt__gen_discard(g);
  return rc;
}

bool molt__gen_any_replaces(uint32_t index, const void *body) {
  for (unsigned s = 0; s < MOLT__SLOTS; s++)
    if (priv[s].in_use && priv[s].table && index < molt__gens[s].size &&
        priv[s].table[index] != body)
      return true;
  return false;
}

typedef struct scan_ctx {
  molt__gen_usage *u;
} scan_ctx;

static void scan_thread(void *arg, const molt__thread *t, pid_t tid,
                        const char *name) {
  molt__gen_usage *u = ((scan_ctx *)arg)->u;
  for (unsigned s = 0; s < MOLT__SLOTS; s++)
    /* acquire: pairs with the release decrement in molt__leave, so all
     * accesses of a finished call happen before we free what it used. */
    u->active[s] += atomic_load_explicit(&((molt__thread *)t)->active[s],
                                         memory_order_acquire);
  /* acquire: pairs with the thread's release store of its view (local
   * policy): a view we see is pinned. */
  molt__gen *v = atomic_load_explicit(&((molt__thread *)t)->view, memory_order_acquire);
  if (v)
    u->views[v->slot]++;
}

void molt__gen_scan(molt__gen_usage *u) {
  memset(u, 0, sizeof *u);
  scan_ctx c = {u};
  molt__threads_foreach(scan_thread, &c);
}

size_t molt__gen_reclaim(molt__object **to_close) {
  size_t retired = 0;
  for (unsigned s = 0; s < MOLT__SLOTS; s++)
    retired += priv[s].in_use && priv[s].retired;
  if (!retired || !reclaim_ok)
    return retired;
  /* After this barrier every thread either made its counter increment for
   * a generation visible to the scan below, or will fail its recheck
   * because it sees the generation that retired this one (molt.h,
   * molt__enter). */
  if (molt__membarrier() != 0) {
    reclaim_ok = false;
    molt__log(MOLT__EV_FAIL, molt__gen_current()->number, NULL,
              "membarrier failed: old versions will no longer be unloaded");
    return retired;
  }
  molt__gen_usage u;
  molt__gen_scan(&u);
  bool freed = false;
  for (unsigned s = 0; s < MOLT__SLOTS; s++) {
    molt__gen_priv *p = &priv[s];
    if (!p->in_use || !p->retired || u.active[s] || u.views[s])
      continue;
    for (size_t i = 0; i < p->nowners; i++)
      if (molt__object_unref(p->owners[i])) {
        p->owners[i]->close_next = *to_close;
        *to_close = p->owners[i];
      }
    molt__log(MOLT__EV_RECLAIM, molt__gens[s].number, NULL,
              "generation %llu no longer runs anywhere (slot %u freed)",
              (unsigned long long)molt__gens[s].number, s);
    release_slot(s);
    retired--;
    freed = true;
  }
  if (freed)
    molt__entries_relax();
  return retired;
}
