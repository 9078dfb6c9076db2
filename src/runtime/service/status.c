/* The records of `molt status` (docs/protocol.md): the state, the modules,
 * the live generations, the functions and their entries, the threads --
 * and whatever the modes add through their status hooks (the hot mode's
 * patches and objects, the full mode's image and program threads). */
#include "service/service.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct tinfo {
  pid_t tid;
  uint64_t active;
  int view; /* slot of a local view or -1 */
} tinfo;

typedef struct tlist {
  tinfo *v;
  size_t n, cap;
} tlist;

static void collect_thread(void *arg, const molt__thread *t, pid_t tid) {
  tlist *l = arg;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    tinfo *p = realloc(l->v, cap * sizeof *p);
    if (!p)
      return;
    l->v = p;
    l->cap = cap;
  }
  tinfo *ti = &l->v[l->n++];
  ti->tid = tid;
  ti->active = 0;
  for (unsigned s = 0; s < MOLT__SLOTS; s++)
    ti->active +=
        atomic_load_explicit(&((molt__thread *)t)->active[s], memory_order_relaxed);
  molt__gen *v = atomic_load_explicit(&((molt__thread *)t)->view, memory_order_acquire);
  ti->view = v ? (int)v->slot : -1;
}

static void put_number(molt__buf *out, const char *k, uint64_t v) {
  char s[24];
  snprintf(s, sizeof s, "%" PRIu64, v);
  molt__buf_pair(out, k, s);
}

/* Threads still inside version 0 of a replaced function (core/oldcode.c:
 * a scan of the blocked threads' stacks, as far as the runtime can see):
 *   old <function> <tu> <static> <tid> <thread name> <version> <since>
 * since: CLOCK_REALTIME ns of the first scan that saw it there (the apply
 * that replaced the function scans once right after its switch); version
 * is always 0 (versions of patches are not scanned).  Then
 *   oldscan <threads not inspected: running, not blocked>
 * No molt__rt_lock held (the scan takes it to read the generation). */
static void old_code(molt__buf *out) {
  char tid[16], since[24], name[64], num[24];
  molt__oldcode_scan();
  for (size_t i = 0; i < molt__oldcode_count(); i++) {
    const molt__oldcode *o = molt__oldcode_at(i);
    molt__rt_lock_acquire();
    molt__fn_desc *d = o->index < molt__fn_count() ? molt__fn_at(o->index) : NULL;
    molt__rt_lock_release();
    if (!d)
      continue;
    snprintf(tid, sizeof tid, "%d", (int)o->tid);
    snprintf(since, sizeof since, "%" PRIu64, o->since);
    if (!molt__proc_name(0, o->tid, name, sizeof name))
      snprintf(name, sizeof name, "?");
    const char *f[] = {"old", d->name, d->tu, d->is_static ? "1" : "0",
                       tid,   name,    "0",   since};
    molt__buf_record(out, 8, f);
  }
  snprintf(num, sizeof num, "%zu", molt__oldcode_uninspected());
  molt__buf_pair(out, "oldscan", num);
}

void molt__status(molt__buf *out) {
  char reason[256], num[24], num2[24], num3[24], num4[24];
  if (molt__refusing(reason, sizeof reason)) {
    const char *f[] = {"state", "refusing", reason};
    molt__buf_record(out, 3, f);
  } else {
    molt__buf_pair(out, "state", "ok");
  }
  put_number(out, "pid", (uint64_t)getpid());
  tlist tl = {0};
  molt__rt_lock_acquire();
  molt__gen *cur = molt__gen_current();
  put_number(out, "generation", cur->number);
  molt__buf_pair(out, "reclaim", molt__gen_reclaim_enabled() ? "enabled" : "disabled");
  if (molt__control_error())
    molt__buf_pair(out, "control", molt_strerror(molt__control_error()));
  for (size_t i = 0; i < molt__modules_count(); i++) {
    molt__module *m = molt__module_at(i);
    const char *f[] = {"program", m->path ? m->path : "", m->build_id};
    molt__buf_record(out, 3, f);
  }
  molt__gen_usage u;
  molt__gen_scan(&u);
  for (unsigned s = 0; s < MOLT__SLOTS; s++) {
    bool current;
    if (!molt__gen_live(s, &current))
      continue;
    snprintf(num, sizeof num, "%" PRIu64, molt__gens[s].number);
    snprintf(num2, sizeof num2, "%u", s);
    snprintf(num3, sizeof num3, "%u", u.active[s]);
    const char *f[] = {"live", num, num2, current ? "current" : "retired", num3};
    molt__buf_record(out, 5, f);
  }
  for (uint32_t i = 0; i < cur->size; i++) {
    molt__fn_desc *d = molt__fn_at(i);
    molt__owner *o = molt__gen_owner(cur, i);
    const char *f[] = {
        "function",          d->name, d->tu, d->is_static ? "1" : "0", o ? o->id : "base",
        molt__entry_state(i)};
    molt__buf_record(out, 6, f);
  }
  molt__threads_foreach(collect_thread, &tl);
  uint64_t numbers[MOLT__SLOTS];
  for (unsigned s = 0; s < MOLT__SLOTS; s++)
    numbers[s] = molt__gens[s].number;
  molt__rt_lock_release();
  old_code(out);
  /* The modes' records (patches and objects; the program image and its
   * threads), each under its own locks. */
  molt__modes_status(out);
  for (size_t i = 0; i < tl.n; i++) {
    char name[64], follows[48];
    molt__proc_name(0, tl.v[i].tid, name, sizeof name);
    snprintf(num, sizeof num, "%d", (int)tl.v[i].tid);
    if (tl.v[i].view < 0)
      snprintf(follows, sizeof follows, "global");
    else
      snprintf(follows, sizeof follows, "generation %" PRIu64, numbers[tl.v[i].view]);
    snprintf(num4, sizeof num4, "%" PRIu64, tl.v[i].active);
    const char *f[] = {"thread", num, name, follows, num4};
    molt__buf_record(out, 5, f);
  }
  free(tl.v);
  /* Connections refused for their uid (control.c: runtime thread, as
   * this is). */
  molt__control_status(out);
}
