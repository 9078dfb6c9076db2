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
 * the stack pointer to the end of that mapping with process_vm_readv (a
 * read that fails is an error, not a fault in the host) and looks for a
 * word that is an address inside version 0 of a replaced function, or a
 * program counter inside one.  An event loop waits in epoll_wait, poll or
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

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define STACK_SCAN_MAX (1u << 20) /* bytes of one thread's stack looked at */
#define RUNNING_RETRIES 3         /* a running thread is asked again ...   */
#define RUNNING_WAIT_NS 1000000   /* ... after 1 ms                        */

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

/* The end of the mapping of the process that holds address a (0: none). */
static uintptr_t mapping_end(uintptr_t a) {
  FILE *f = fopen("/proc/self/maps", "re");
  uintptr_t end = 0;
  if (!f)
    return 0;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) {
      end = hi;
      break;
    }
  }
  fclose(f);
  return end;
}

/* Stack pointer and program counter of thread tid if it is blocked (in a
 * system call); false if it is running or gone. */
static bool blocked_at(pid_t tid, uintptr_t *sp, uintptr_t *pc) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
  for (int attempt = 0; attempt < RUNNING_RETRIES; attempt++) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
      return false;
    buf[n] = '\0';
    if (strncmp(buf, "running", 7) != 0) {
      /* "nr a1 .. a6 sp pc" or "-1 sp pc": the last two fields */
      char *last = strrchr(buf, ' ');
      if (!last)
        return false;
      *last = '\0';
      char *prev = strrchr(buf, ' ');
      if (!prev)
        return false;
      *sp = (uintptr_t)strtoull(prev + 1, NULL, 16);
      *pc = (uintptr_t)strtoull(last + 1, NULL, 16);
      return *sp != 0;
    }
    struct timespec ts = {0, RUNNING_WAIT_NS};
    nanosleep(&ts, NULL);
  }
  return false;
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

/* Notes every range that thread tid's program counter or a word of its
 * stack points into. */
static void scan_thread(pid_t tid, const range *r, size_t nr, uint64_t now,
                        uint64_t *buf) {
  uintptr_t sp, pc;
  if (!blocked_at(tid, &sp, &pc)) {
    uninspected++;
    return;
  }
  const range *hit = find(r, nr, pc);
  if (hit)
    note(tid, hit->index, now);
  uintptr_t end = mapping_end(sp);
  if (end <= sp)
    return;
  if (end - sp > STACK_SCAN_MAX)
    end = sp + STACK_SCAN_MAX;
  for (uintptr_t at = sp & ~(uintptr_t)7; at < end;) {
    size_t len = end - at < 65536 ? end - at : 65536;
    struct iovec local = {buf, len}, remote = {(void *)at, len};
    ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    if (got <= 0)
      return;
    for (size_t w = 0; w < (size_t)got / 8; w++) {
      hit = find(r, nr, (uintptr_t)buf[w]);
      if (hit)
        note(tid, hit->index, now);
    }
    at += (size_t)got;
  }
}

int molt__oldcode_scan(void) {
  range *r;
  size_t nr = replaced_ranges(&r);
  uint64_t now = molt__realtime_ns();
  uninspected = 0;
  if (nr) {
    uint64_t *buf = malloc(65536);
    DIR *d = opendir("/proc/self/task");
    pid_t self = molt__gettid();
    struct dirent *e;
    while (buf && d && (e = readdir(d)) != NULL) {
      pid_t tid = (pid_t)atoi(e->d_name);
      if (tid > 0 && tid != self)
        scan_thread(tid, r, nr, now, buf);
    }
    if (d)
      closedir(d);
    free(buf);
  }
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
