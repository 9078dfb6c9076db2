/*
 * core/oldcode.c -- which threads are still inside version 0 of a function
 * that a patch has replaced (`molt status`, the warning of `molt apply`).
 *
 * What the runtime can know.  A call that takes the dispatch path pins its
 * generation (the counters, gen.c), but a call that entered version 0
 * through the entry's direct jump -- every call made before the function
 * was first patched -- leaves no trace: the direct path touches no memory
 * (P1).  A thread that entered an event loop before the patch runs that
 * loop's version 0 for ever, and nothing counted it.  So the runtime looks
 * at the threads' stacks: for every thread of the process that is blocked
 * in a system call (/proc/self/task/T/syscall gives its stack pointer and
 * program counter; a thread that is running cannot be looked at without
 * stopping it, which the runtime never does, H10), it reads its stack from
 * the stack pointer up (at most 1 MiB) at one moment, as core/stack.c does
 * for proof.c, and looks for a word that is an address inside version 0
 * of a replaced function, or a program counter inside one.  Threads found
 * running are asked again, all together, after 1 ms, twice at most.  An event loop waits in epoll_wait, poll or
 * a sleep most of the time, with the return address into its own version 0
 * on the stack above.
 *
 * The scan is conservative: a stale word left in a live frame can name a
 * function the thread has left (rare: it must be an address inside the
 * function's body, where only return addresses point), and a thread that
 * never blocks is not seen.  Version 0's extent comes from the module's
 * symbol table (molt__symtab_at at the body's address); a stripped module
 * without the symbol is not scanned.  Versions of patches are not scanned
 * (a patch's new version is entered through the dispatch path and counted
 * there).  docs/guide.md ("Debugging a patched process") says all this.
 *
 * Runs on the runtime thread under op_lock (apply, status), takes
 * molt__rt_lock only to read the current generation and descriptors.
 */
#include "core/core.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STACK_SCAN_MAX (1u << 20) /* bytes of one thread's stack looked at */
#define RUNNING_RETRIES 3         /* threads found running are asked again */
#define RUNNING_WAIT_NS 1000000   /* ... together, after 1 ms              */

typedef struct range {
  uintptr_t start, end;
  uint32_t index;
} range;

static molt__oldcode *seen; /* observations of the last scan (op_lock) */
static size_t nseen, capseen;
static size_t uninspected;     /* threads that were running at the last scan */
static molt__symtab **symtabs; /* per module, opened on first use (op_lock) */
static size_t nsymtabs;

static const molt__symtab *symtab_of(size_t m) {
  if (m >= nsymtabs) {
    size_t n = molt__modules_count();
    if (m >= n)
      return NULL;
    molt__symtab **p = realloc(symtabs, n * sizeof *p);
    if (!p)
      return NULL;
    memset(p + nsymtabs, 0, (n - nsymtabs) * sizeof *p);
    symtabs = p;
    nsymtabs = n;
  }
  if (!symtabs[m] &&
      molt__symtab_open(molt__module_file(molt__module_at(m)), &symtabs[m]) < 0)
    symtabs[m] = NULL;
  return symtabs[m];
}

static int by_start(const void *a, const void *b) {
  const range *x = a, *y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

/* Version 0 of every function the current generation replaces. */
static size_t replaced_ranges(range **out) {
  *out = NULL;
  typedef struct {
    uint32_t index;
    uintptr_t body;
    size_t module;
  } cand;
  cand *c = NULL;
  size_t n = 0;
  molt__rt_lock_acquire();
  molt__gen *cur = molt__gen_current();
  if (cur->size)
    c = malloc(cur->size * sizeof *c);
  for (uint32_t i = 0; c && i < cur->size; i++) {
    if (!molt__gen_owner(cur, i))
      continue; /* still version 0 */
    molt__fn_desc *d = molt__fn_at(i);
    for (size_t m = 0; m < molt__modules_count(); m++) {
      molt__module *mod = molt__module_at(m);
      if (d >= mod->start && d < mod->stop) {
        c[n++] = (cand){i, (uintptr_t)d->body, m};
        break;
      }
    }
  }
  molt__rt_lock_release();
  range *r = n ? malloc(n * sizeof *r) : NULL;
  size_t nr = 0;
  for (size_t k = 0; r && k < n; k++) {
    const molt__symtab *st = symtab_of(c[k].module);
    uintptr_t base = molt__module_at(c[k].module)->base, start;
    size_t size;
    if (!st ||
        molt__symtab_at(st, c[k].body - base, NULL, NULL, &start, &size, NULL) < 0 ||
        start != c[k].body - base || size == 0)
      continue;
    r[nr++] = (range){c[k].body, c[k].body + size, c[k].index};
  }
  free(c);
  if (nr)
    qsort(r, nr, sizeof *r, by_start);
  *out = r;
  return nr;
}

static const range *find(const range *r, size_t n, uintptr_t a) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r[mid].start <= a)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0 || a >= r[lo - 1].end)
    return NULL;
  return &r[lo - 1];
}

static void note(pid_t tid, uint32_t index, uint64_t now) {
  for (size_t i = 0; i < nseen; i++)
    if (seen[i].tid == tid && seen[i].index == index) {
      seen[i].seen = now;
      return;
    }
  if (nseen == capseen) {
    size_t cap = capseen ? capseen * 2 : 8;
    molt__oldcode *p = realloc(seen, cap * sizeof *p);
    if (!p)
      return;
    seen = p;
    capseen = cap;
  }
  seen[nseen++] = (molt__oldcode){tid, index, now, now};
}

/* The functions one look at a stack found (only the attempt that read the
 * stack at one moment counts: core/stack.c resets before each). */
typedef struct found {
  const range *r;
  size_t nr;
  uint32_t *idx;
  size_t n, cap;
} found;

static void found_reset(void *arg) { ((found *)arg)->n = 0; }

static void found_add(void *arg, uintptr_t word) {
  found *f = arg;
  const range *hit = find(f->r, f->nr, word);
  if (!hit)
    return;
  for (size_t i = 0; i < f->n; i++)
    if (f->idx[i] == hit->index)
      return;
  if (f->n == f->cap) {
    size_t cap = f->cap ? f->cap * 2 : 8;
    uint32_t *p = realloc(f->idx, cap * sizeof *p);
    if (!p)
      return;
    f->idx = p;
    f->cap = cap;
  }
  f->idx[f->n++] = hit->index;
}

int molt__oldcode_scan(void) {
  range *r;
  size_t nr = replaced_ranges(&r);
  uint64_t now = molt__realtime_ns();
  uninspected = 0;
  pid_t *tids = NULL;
  size_t ntids = nr ? molt__stack_threads(&tids) : 0;
  uint64_t *buf = ntids ? malloc(MOLT__STACK_BUF) : NULL;
  if (buf) {
    found f = {r, nr, NULL, 0, 0};
    molt__stack_scan scan = {.min = r[0].start,
                             .max = r[0].end,
                             .limit = STACK_SCAN_MAX,
                             .truncate = true,
                             .reset = found_reset,
                             .hit = found_add,
                             .arg = &f};
    for (size_t i = 1; i < nr; i++)
      scan.max = r[i].end > scan.max ? r[i].end : scan.max;
    /* A running thread cannot be looked at; those found running are asked
     * again together after one short wait (not each after a wait of its
     * own: a process with many busy threads held every apply for
     * milliseconds per busy thread). */
    size_t left = ntids, failed = 0;
    for (int round = 0; round < RUNNING_RETRIES && left; round++) {
      if (round) {
        struct timespec ts = {0, RUNNING_WAIT_NS};
        nanosleep(&ts, NULL);
      }
      size_t running = 0;
      for (size_t i = 0; i < left; i++) {
        int rc = molt__stack_scan_blocked(tids[i], &scan, buf);
        if (rc == MOLT__STACK_RUNNING)
          tids[running++] = tids[i]; /* (in place: running <= i) */
        else if (rc == MOLT__STACK_READ)
          for (size_t k = 0; k < f.n; k++)
            note(tids[i], f.idx[k], now);
        else
          failed++; /* gone, on another stack, or it ran during every read */
      }
      left = running;
    }
    uninspected = left + failed;
    free(f.idx);
  }
  free(buf);
  free(tids);
  free(r);
  /* Keep what this scan saw: a thread that left the function, or exited,
   * is forgotten; one still there keeps the time it was first seen. */
  size_t k = 0;
  for (size_t i = 0; i < nseen; i++)
    if (seen[i].seen == now)
      seen[k++] = seen[i];
  nseen = k;
  return (int)nseen;
}

size_t molt__oldcode_count(void) { return nseen; }
const molt__oldcode *molt__oldcode_at(size_t i) { return i < nseen ? &seen[i] : NULL; }
size_t molt__oldcode_uninspected(void) { return uninspected; }
