/* Pointers into a patch's staged code kept in the target's memory.
 *
 * A rollback restores the functions' entries, so no call enters the
 * patch's code through them any more; attach.c then unmaps the code once
 * no register and no stack word of any thread points into it.  But the
 * patched code may have stored a pointer into it elsewhere: one of its
 * functions in a table of callbacks, one of its string literals in a
 * heap object.  The program would call or read it after the unmap and
 * crash.  So, before unmapping, every 8-byte-aligned word of the
 * target's memory that can hold such a pointer is looked at, and any word
 * whose value lies in the patch's range keeps the code mapped.
 *
 * Where it looks: every mapping but the kernel's ([vvar], [vdso],
 * [vsyscall]), the staged range itself (the patch's own data points at
 * its own code) and the state pages of every level (text).  In a writable
 * mapping every page that is present or swapped out; in any other
 * (read-only, executable, PROT_NONE) only the pages the process has
 * written (anonymous copies, not the file's pages: RELRO, a table made
 * read-only or inaccessible once filled, a JIT's code).  A page never
 * touched holds zeros or its file's bytes, which predate the patch, so
 * guard pages and the program's text cost a pagemap read only.
 *
 * Of a thread's stack, the part below its stack pointer and below the
 * stack pointers saved in its signal frames is dead: stale return
 * addresses of calls the patch made lie there, and would keep the code
 * mapped for ever.  The 128-byte red zone below the stack pointer counts
 * as live for a thread interrupted in user code (a leaf function keeps
 * data there), not for one stopped in a system call (its wrapper's
 * arguments are in its registers).  Only a mapping that is a stack as the
 * kernel and glibc lay them out counts as one ([stack], or an anonymous
 * mapping right above a PROT_NONE guard); any other (a stack the program
 * allocated in its heap) is read whole: a stale word there keeps the code
 * mapped (conservative), never the other way round.
 *
 * Soundness against threads that move pointers while molt reads.  Reading
 * 100 MiB takes tens of milliseconds, too long to keep every thread
 * stopped.  So the memory is read twice:
 *   1. while the threads run, after clearing the process's soft-dirty bits
 *      (/proc/PID/clear_refs "4": every page table entry write-protected
 *      and its soft-dirty bit cleared; the next write to a page, by the
 *      process or by the kernel on its behalf, faults and sets the bit
 *      again, and a mapping created since is soft-dirty whole).  Words
 *      pointing into the patch are remembered by address; pages it could
 *      not read are remembered too;
 *   2. in the stop (every thread stopped, the maps read again): every page
 *      whose soft-dirty bit is set (pagemap bit 55), the remembered pages,
 *      every page of a writable shared mapping (another process sharing it
 *      writes through its own page tables, which set no bit in ours), and
 *      the remembered words read again.
 * A word w holds a pointer into the patch at the stop.  Either its page
 * was written since the bits were cleared: then its bit is set and pass 2
 * reads it in the stop, when nothing moves.  Or it was not: then its
 * bytes were the same during the whole first pass, which read it and
 * found the pointer, and pass 2 reads that word again.  Pages swapped out
 * keep their bit in the swap entry, a page moved by mremap is marked
 * soft-dirty, and brk and mmap mark new mappings soft-dirty whole.  The
 * registers and the live stacks are read in the stop as before
 * (attach.c).
 *
 * Without soft-dirty tracking (a kernel without CONFIG_MEM_SOFT_DIRTY,
 * found by trying it on a page of molt's own; or clear_refs refused) pass 1
 * is skipped and pass 2 reads everything while the threads are stopped:
 * sound, but the stop grows with the memory (measured: 0.2-0.25 ms per
 * MiB, design §16).
 *
 * The pages to read are found with PAGEMAP_SCAN where the kernel has it
 * (runs of present or swapped pages: untouched address space costs
 * nothing), else with one pagemap entry per page.
 *
 * Not covered: a pointer held only in a vector register (a copy in
 * flight whose source was overwritten already), or only in a file written
 * with write() and mapped shared but not yet faulted in by the process. */
#include "attach/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#define PM_PRESENT (1ull << 63)
#define PM_SWAPPED (1ull << 62)
#define PM_FILE (1ull << 61) /* a file page or shared anonymous memory */
#define PM_SOFT_DIRTY (1ull << 55)
#define BATCH_PAGES                                                                      \
  64 /* 256 KiB of memory (read, then looked at, in the cache), 512 bytes of pagemap */
#define RED_ZONE 128 /* below the stack pointer, still the function's (x86-64 ABI) */

/* Whether soft-dirty tracking works here: tried once on a page of molt's
 * own (a kernel without CONFIG_MEM_SOFT_DIRTY accepts "4" and never sets
 * the bit, which would make pass 1 unsound). */
static int soft_dirty_known; /* 0 unknown, 1 works, -1 does not */

/* The most bytes pass 2 reads with every thread stopped: without
 * soft-dirty tracking it reads all the memory there (0.2-0.25 ms per MiB
 * measured), and a server of gigabytes would stay stopped for a second.
 * Past the limit the scan gives up with SCAN_OVER_LIMIT and the code stays
 * mapped: safe, and the operator may allow a longer stop (--scan-limit). */
static uint64_t stop_limit = (uint64_t)MOLT__ATTACH_SCAN_LIMIT_MIB << 20;

void molt__attach_scan_limit(uint64_t bytes) { stop_limit = bytes; }

static bool soft_dirty_works(void) {
  if (soft_dirty_known)
    return soft_dirty_known > 0;
  soft_dirty_known = -1;
  volatile char *page =
      mmap(NULL, ATTACH_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED)
    return false;
  page[0] = 1;
  int cr = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  off_t at = (off_t)((uintptr_t)page / ATTACH_PAGE * 8);
  uint64_t clean = 0, dirty = 0;
  bool ok = cr >= 0 && pm >= 0 && write(cr, "4", 1) == 1 &&
            pread(pm, &clean, sizeof clean, at) == (ssize_t)sizeof clean;
  /* the store after the first pagemap read, not folded into the first */
  __asm__ volatile("" ::: "memory");
  page[0] = 2;
  __asm__ volatile("" ::: "memory");
  ok = ok && pread(pm, &dirty, sizeof dirty, at) == (ssize_t)sizeof dirty;
  if (ok && (clean & PM_PRESENT) && !(clean & PM_SOFT_DIRTY) && (dirty & PM_SOFT_DIRTY))
    soft_dirty_known = 1;
  if (cr >= 0)
    close(cr);
  if (pm >= 0)
    close(pm);
  munmap((void *)page, ATTACH_PAGE);
  return soft_dirty_known > 0;
}

/* Mappings never looked in: the kernel's. */
static bool looked_in(const attach_map *m) {
  return strcmp(m->path, "[vvar]") != 0 && strcmp(m->path, "[vvar_vclock]") != 0 &&
         strcmp(m->path, "[vsyscall]") != 0 && strcmp(m->path, "[vdso]") != 0;
}

static bool skipped(const attach_scan *sc, uint64_t addr) {
  for (size_t i = 0; i < sc->nskip; i++)
    if (addr >= sc->skip[i][0] && addr < sc->skip[i][1])
      return true;
  return false;
}

/* What one pass does with the pages it reads. */
typedef struct pass {
  attach_scan *sc;
  bool stop;     /* pass 2 (in the stop) */
  bool force;    /* every page, whatever its soft-dirty bit */
  uint64_t *at;  /* pass 2: where the first pointer was found */
  uint8_t *buf;  /* BATCH_PAGES pages */
  uint64_t live; /* pass 2: words below it are a stack's dead part */
} pass;

static bool wanted(const pass *ps, const attach_map *m, uint64_t pm) {
  if (!(pm & (PM_PRESENT | PM_SWAPPED)))
    return false; /* never touched: zeros, or the file's bytes */
  if (!m->w && (pm & PM_FILE))
    return false; /* read-only and as the file has it */
  if (!ps->stop || ps->force || !ps->sc->concurrent || ps->sc->all_dirty)
    return true;
  return (pm & PM_SOFT_DIRTY) || (m->shared && m->w);
}

static int remember(uint64_t **list, size_t *n, size_t *cap, uint64_t addr) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 64;
    uint64_t *nl = realloc(*list, c * sizeof *nl);
    if (!nl)
      return MOLT_ENOMEM;
    *list = nl;
    *cap = c;
  }
  (*list)[(*n)++] = addr;
  return 0;
}

/* The words of buf (len bytes read at addr): pass 1 remembers those that
 * point into the range, pass 2 stops at the first (1). */
static int look_at(pass *ps, uint64_t addr, const uint8_t *buf, size_t len) {
  attach_scan *sc = ps->sc;
  const uint64_t *w = (const uint64_t *)buf;
  uint64_t span = sc->hi - sc->lo;
  for (size_t k = 0; k < len / 8; k++) {
    /* one compare per word (in [lo, hi) iff w - lo < hi - lo, unsigned):
     * the loop the whole memory goes through */
    if (__builtin_expect(w[k] - sc->lo >= span, 1) || addr + 8 * k < ps->live)
      continue;
    if (ps->stop) {
      *ps->at = addr + 8 * k;
      return 1;
    }
    int rc = remember(&sc->hits, &sc->nhits, &sc->cap, addr + 8 * k);
    if (rc)
      return rc;
  }
  return 0;
}

/* Reads [addr, addr+len) (whole pages) and looks at it: process_vm_readv
 * for the run, /proc/PID/mem (which reads a page the process made
 * unreadable since) for a page it could not read.  A page neither reads:
 * pass 1 remembers it for pass 2; in pass 2 it counts as a pointer (an
 * unknown page may hold one), except in a device's mapping. */
static int read_run(pass *ps, const attach_map *m, uint64_t addr, size_t len) {
  attach_scan *sc = ps->sc;
  if (ps->stop && sc->bytes_stop + len > stop_limit) {
    sc->over_limit = stop_limit;
    return SCAN_OVER_LIMIT;
  }
  while (len) {
    struct iovec local = {ps->buf, len}, remote = {(void *)(uintptr_t)addr, len};
    ssize_t got = process_vm_readv(sc->pid, &local, 1, &remote, 1, 0);
    size_t ok = got > 0 ? (size_t)got / ATTACH_PAGE * ATTACH_PAGE : 0;
    if (ps->stop)
      sc->bytes_stop += ok;
    else
      sc->bytes_run += ok;
    int rc = look_at(ps, addr, ps->buf, ok);
    if (rc)
      return rc;
    addr += ok;
    len -= ok;
    if (!len)
      break;
    /* the page at addr did not read */
    if (pread(sc->mem, ps->buf, ATTACH_PAGE, (off_t)addr) == (ssize_t)ATTACH_PAGE) {
      rc = look_at(ps, addr, ps->buf, ATTACH_PAGE);
    } else if (!ps->stop) {
      rc = remember(&sc->unread, &sc->nunread, &sc->capunread, addr);
    } else if (strncmp(m->path, "/dev/", 5) != 0) {
      *ps->at = addr; /* unreadable: may hold one */
      rc = 1;
    }
    if (rc)
      return rc;
    addr += ATTACH_PAGE;
    len -= ATTACH_PAGE;
  }
  return 0;
}

/* The pages of [from, to) in mapping m that the pass wants, from one
 * pagemap entry per page (8 bytes read per 4 KiB of address space,
 * touched or not). */
static int scan_range_pagemap(pass *ps, const attach_map *m, uint64_t from, uint64_t to) {
  attach_scan *sc = ps->sc;
  uint64_t pm[BATCH_PAGES];
  for (uint64_t a = from; a < to;) {
    size_t n = (size_t)((to - a) / ATTACH_PAGE);
    if (n > BATCH_PAGES)
      n = BATCH_PAGES;
    ssize_t got = pread(sc->pagemap, pm, n * 8, (off_t)(a / ATTACH_PAGE * 8));
    if (got != (ssize_t)(n * 8))
      return MOLT_EIO;
    for (size_t i = 0; i < n;) {
      if (skipped(sc, a + i * ATTACH_PAGE) || !wanted(ps, m, pm[i])) {
        i++;
        continue;
      }
      size_t j = i + 1;
      while (j < n && !skipped(sc, a + j * ATTACH_PAGE) && wanted(ps, m, pm[j]))
        j++;
      int rc = read_run(ps, m, a + i * ATTACH_PAGE, (j - i) * ATTACH_PAGE);
      if (rc)
        return rc;
      i = j;
    }
    a += n * ATTACH_PAGE;
  }
  return 0;
}

/* The kernel's PAGEMAP_SCAN (Linux 6.7): the runs of pages present or
 * swapped out in a range, with what they are, without an entry per page
 * of address space -- a reservation of a terabyte (a sanitizer's shadow,
 * a runtime's heap cage) costs nothing where it was never touched, where
 * reading its pagemap would take gigabytes.  Declared here: older headers
 * lack it (the layout is the kernel's ABI). */
typedef struct pm_region {
  uint64_t start, end, categories;
} pm_region;
typedef struct pm_scan {
  uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
  uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
} pm_scan;
#define PM_SCAN_IOCTL _IOWR('f', 16, pm_scan)
#define PAGE_IS_FILE (1u << 2)
#define PAGE_IS_PRESENT (1u << 3)
#define PAGE_IS_SWAPPED (1u << 4)
#define PAGE_IS_SOFT_DIRTY (1u << 7)

static int pm_scan_known; /* 0 unknown, 1 works, -1 does not */

/* 0, MOLT_ENOTSUP (no PAGEMAP_SCAN: read the pagemap), or a MOLT_E* code. */
static int scan_range_regions(pass *ps, const attach_map *m, uint64_t from, uint64_t to) {
  attach_scan *sc = ps->sc;
  pm_region vec[64];
  for (uint64_t at = from; at < to;) {
    pm_scan arg = {.size = sizeof arg,
                   .start = at,
                   .end = to,
                   .vec = (uint64_t)(uintptr_t)vec,
                   .vec_len = sizeof vec / sizeof vec[0],
                   .category_anyof_mask = PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
                   .return_mask = PAGE_IS_PRESENT | PAGE_IS_SWAPPED | PAGE_IS_FILE |
                                  PAGE_IS_SOFT_DIRTY};
    int n = ioctl(sc->pagemap, PM_SCAN_IOCTL, &arg);
    if (n < 0 && pm_scan_known == 0 && (errno == ENOTTY || errno == EINVAL)) {
      pm_scan_known = -1;
      return MOLT_ENOTSUP;
    }
    if (n < 0 || arg.walk_end <= at || arg.walk_end > to)
      return MOLT_EIO;
    pm_scan_known = 1;
    for (int r = 0; r < n; r++) {
      /* as a pagemap entry would say it */
      uint64_t c = vec[r].categories;
      uint64_t pm = (c & PAGE_IS_PRESENT ? PM_PRESENT : 0) |
                    (c & PAGE_IS_SWAPPED ? PM_SWAPPED : 0) |
                    (c & PAGE_IS_FILE ? PM_FILE : 0) |
                    (c & PAGE_IS_SOFT_DIRTY ? PM_SOFT_DIRTY : 0);
      if (!wanted(ps, m, pm))
        continue;
      for (uint64_t a = vec[r].start; a < vec[r].end;) {
        if (skipped(sc, a)) {
          a += ATTACH_PAGE;
          continue;
        }
        uint64_t e = a + ATTACH_PAGE;
        while (e < vec[r].end && e - a < BATCH_PAGES * ATTACH_PAGE && !skipped(sc, e))
          e += ATTACH_PAGE;
        int rc = read_run(ps, m, a, (size_t)(e - a));
        if (rc)
          return rc;
        a = e;
      }
    }
    at = arg.walk_end;
  }
  return 0;
}

static int scan_range(pass *ps, const attach_map *m, uint64_t from, uint64_t to) {
  const char *test = getenv("MOLT_ATTACH_TEST_PAGEMAP");
  if (pm_scan_known >= 0 && !(test && strcmp(test, "read") == 0)) {
    int rc = scan_range_regions(ps, m, from, to);
    if (rc != MOLT_ENOTSUP)
      return rc;
  }
  return scan_range_pagemap(ps, m, from, to);
}

static int open_files(attach_scan *sc) {
  char path[64];
  molt__os_path(sc->pid, "mem", path, sizeof path);
  sc->mem = open(path, O_RDONLY | O_CLOEXEC);
  molt__os_path(sc->pid, "pagemap", path, sizeof path);
  sc->pagemap = open(path, O_RDONLY | O_CLOEXEC);
  return sc->mem >= 0 && sc->pagemap >= 0 ? 0 : MOLT_EIO;
}

int molt__scan_begin(attach_scan *sc, pid_t pid, uint64_t lo, uint64_t hi,
                     const uint64_t (*skip)[2], size_t nskip) {
  memset(sc, 0, sizeof *sc);
  sc->pid = pid;
  sc->lo = lo;
  sc->hi = hi;
  sc->mem = sc->pagemap = -1;
  for (size_t i = 0; i < nskip && i < sizeof sc->skip / sizeof sc->skip[0]; i++) {
    sc->skip[i][0] = skip[i][0];
    sc->skip[i][1] = skip[i][1];
    sc->nskip++;
  }
  int rc = open_files(sc);
  if (rc)
    return rc;
  /* $MOLT_ATTACH_TEST_SCAN: "stopped" forces the fallback; "both" runs
   * pass 1 also without soft-dirty tracking and has pass 2 read
   * everything again (the tests run pass 1's code on kernels without it) */
  const char *test = getenv("MOLT_ATTACH_TEST_SCAN");
  sc->all_dirty = test && strcmp(test, "both") == 0;
  if ((test && strcmp(test, "stopped") == 0) || (!sc->all_dirty && !soft_dirty_works()))
    return 0; /* pass 2 reads everything */
  uint64_t t0 = molt__os_now_ns();
  /* Cleared before the maps are read: a mapping made after this point is
   * soft-dirty whole, one made before is in the maps read below. */
  char path[64];
  molt__os_path(pid, "clear_refs", path, sizeof path);
  int cr = open(path, O_WRONLY | O_CLOEXEC);
  if (cr < 0)
    return 0;
  bool cleared = write(cr, "4", 1) == 1;
  close(cr);
  if (!cleared && !sc->all_dirty)
    return 0;
  attach_map *maps = NULL;
  size_t n = 0;
  rc = molt__os_maps(pid, &maps, &n);
  pass ps = {sc, false, false, NULL, malloc(BATCH_PAGES * ATTACH_PAGE), 0};
  if (rc == 0 && !ps.buf)
    rc = MOLT_ENOMEM;
  for (size_t i = 0; rc == 0 && i < n; i++)
    if (looked_in(&maps[i]))
      rc = scan_range(&ps, &maps[i], maps[i].start, maps[i].end);
  free(ps.buf);
  free(maps);
  /* A failed pass 1 only means pass 2 reads everything. */
  sc->concurrent = rc == 0;
  if (rc) {
    sc->nhits = sc->nunread = 0;
    sc->bytes_run = 0;
  }
  sc->ms_run = (double)(molt__os_now_ns() - t0) / 1e6;
  return rc == MOLT_ENOMEM ? rc : 0;
}

/* A thread's stack as the kernel ([stack]) or glibc (an anonymous mapping
 * right above its PROT_NONE guard) lays it out: it holds that stack only,
 * so what lies below the stack pointer is dead. */
static bool stack_like(const attach_view *v, size_t i) {
  const attach_map *m = &v->maps[i];
  if (strcmp(m->path, "[stack]") == 0)
    return true;
  if (m->path[0] || m->shared || !m->r || !m->w || i == 0)
    return false;
  const attach_map *below = &v->maps[i - 1];
  return below->end == m->start && !below->r && !below->w && !below->x;
}

/* Per mapping: where its live part begins (what lies below is the dead
 * part of a stack), and the thread whose stack it is. */
typedef struct live_from {
  uint64_t *from;
  pid_t *owner;
} live_from;

static int find_stacks(const attach_stop *s, attach_view *v, live_from *lf) {
  lf->from = calloc(v->n ? v->n : 1, sizeof *lf->from);
  lf->owner = calloc(v->n ? v->n : 1, sizeof *lf->owner);
  if (!lf->from || !lf->owner)
    return MOLT_ENOMEM;
  for (size_t i = 0; i < v->n; i++)
    lf->from[i] = UINT64_MAX; /* no stack pointer in it: all live */
  for (size_t t = 0; t < s->n; t++) {
    uint64_t sps[17];
    size_t nsp = 1;
    sps[0] = molt__arch_sp(&s->t[t].regs);
    attach_stack stack;
    if (molt__stack_read(v, sps[0], &stack) == 0) {
      /* where the code its signal handlers interrupted goes back to (an
       * alternate signal stack may sit anywhere) */
      nsp += molt__stack_signal_words(v, &stack, ATTACH_SIGFRAME_SP_WORD, sps + 1, 16);
      molt__stack_free(&stack);
    }
    /* A thread interrupted in user code may be in a leaf function that
     * keeps data in its red zone; one stopped in a system call is in its
     * wrapper, whose arguments are in the registers (checked), and the
     * red zone holds stale words of earlier, deeper calls. */
    bool in_call = molt__arch_syscall_nr(&s->t[t].regs) >= 0;
    for (size_t k = 0; k < nsp; k++) {
      size_t i;
      uint64_t live = sps[k] - (k == 0 && in_call ? 0 : RED_ZONE);
      if (!molt__attach_map_at(v, sps[k], &i) || !stack_like(v, i))
        continue;
      if (live < lf->from[i])
        lf->from[i] = live;
      lf->owner[i] = s->t[t].tid;
    }
  }
  for (size_t i = 0; i < v->n; i++) {
    uint64_t f = lf->from[i] == UINT64_MAX ? v->maps[i].start : lf->from[i];
    lf->from[i] = (f < v->maps[i].start ? v->maps[i].start : f) & ~(uint64_t)7;
  }
  return 0;
}

static void name_mapping(const attach_view *v, const live_from *lf, size_t i,
                         attach_found *found) {
  const attach_map *m = &v->maps[i];
  if (lf->owner[i] && strcmp(m->path, "[stack]") != 0)
    snprintf(found->where, sizeof found->where, "the stack of thread %d",
             (int)lf->owner[i]);
  else if (m->path[0]) {
    const char *base = m->path[0] == '/' ? strrchr(m->path, '/') + 1 : m->path;
    snprintf(found->where, sizeof found->where, "%.80s", base);
  } else
    snprintf(found->where, sizeof found->where, "an anonymous mapping");
}

int molt__scan_finish(attach_scan *sc, const attach_stop *s, attach_found *found) {
  uint64_t t0 = molt__os_now_ns();
  memset(found, 0, sizeof *found);
  /* the maps as they are now: nothing changes them while every thread is
   * stopped */
  attach_view v;
  live_from lf = {NULL, NULL};
  int rc = molt__view_open(sc->pid, &v);
  v.fresh = true; /* exact: never read again for a stack */
  if (rc == 0)
    rc = find_stacks(s, &v, &lf);
  pass ps = {sc, true, false, &found->at, malloc(BATCH_PAGES * ATTACH_PAGE), 0};
  if (rc == 0 && !ps.buf)
    rc = MOLT_ENOMEM;
  /* the words pass 1 found, read again */
  for (size_t h = 0; rc == 0 && h < sc->nhits; h++) {
    size_t i;
    uint64_t word;
    const attach_map *m = molt__attach_map_at(&v, sc->hits[h], &i);
    if (!m || !looked_in(m) || sc->hits[h] < lf.from[i] ||
        pread(sc->mem, &word, sizeof word, (off_t)sc->hits[h]) != (ssize_t)sizeof word)
      continue;
    if (word >= sc->lo && word < sc->hi) {
      found->at = sc->hits[h];
      rc = 1;
    }
  }
  /* the pages written since pass 1 (all of them without it) */
  for (size_t i = 0; rc == 0 && i < v.n; i++) {
    ps.live = lf.from[i];
    if (looked_in(&v.maps[i]) && lf.from[i] < v.maps[i].end)
      rc = scan_range(&ps, &v.maps[i], lf.from[i] & ~(uint64_t)(ATTACH_PAGE - 1),
                      v.maps[i].end);
  }
  /* and those pass 1 could not read */
  ps.force = true;
  for (size_t u = 0; rc == 0 && u < sc->nunread; u++) {
    size_t i;
    const attach_map *m = molt__attach_map_at(&v, sc->unread[u], &i);
    ps.live = m ? lf.from[i] : 0;
    if (m && looked_in(m) && sc->unread[u] + ATTACH_PAGE > lf.from[i])
      rc = scan_range(&ps, m, sc->unread[u], sc->unread[u] + ATTACH_PAGE);
  }
  if (rc == 1) {
    size_t i;
    if (molt__attach_map_at(&v, found->at, &i))
      name_mapping(&v, &lf, i, found);
    if (pread(sc->mem, &found->value, 8, (off_t)found->at) != 8)
      found->value = 0;
  }
  free(ps.buf);
  free(lf.from);
  free(lf.owner);
  molt__view_close(&v);
  sc->ms_stop = (double)(molt__os_now_ns() - t0) / 1e6;
  return rc;
}

void molt__scan_end(attach_scan *sc) {
  free(sc->hits);
  free(sc->unread);
  if (sc->mem >= 0)
    close(sc->mem);
  if (sc->pagemap >= 0)
    close(sc->pagemap);
  sc->hits = sc->unread = NULL;
  sc->nhits = sc->nunread = 0;
  sc->mem = sc->pagemap = -1;
}
