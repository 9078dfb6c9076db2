/* The attach operations: attach, rollback, status (attach.h).
 *
 * attach, in this order -- everything before step 5 while the target runs:
 *   1. the target: traceable, the patches attached already finished (the
 *      new one goes on top of them, levels.c), its build-id that of the
 *      patch;
 *   2. the functions: each found in the target's symbol table (statics
 *      included), its entry decoded and checked (arch), its bytes kept --
 *      or, replaced by a patch below, that patch's site and jump taken;
 *   3. the place: a free range within reach of a rel32 jump from every
 *      function; the patch relocated for it in the tool, its references
 *      resolved through the target's symbol tables;
 *   4. staging: one thread stopped for a few system calls run on its own
 *      registers -- memfd_create, mmap of each part, close -- the image
 *      written into the memfd from here (/proc/PID/fd); the record
 *      "staged" saved; the pre-update callback, if any (callback.c);
 *   5. the record "applying"; the stop: every thread stopped; none may be
 *      inside the bytes to be rewritten (else resume, back off, retry
 *      until the timeout); the jumps, every thread resumed;
 *   6. the record "applied" with the stop's duration; the post-update
 *      callback, if any.
 * A failure before step 5 leaves at most an unused mapping, which a
 * rollback removes; killed during step 5, molt leaves the target
 * stopped-then-resumed by the kernel (tracees are detached when their
 * tracer dies) with some jumps written: the record says "applying" and
 * rollback restores every function whose bytes are the jump. */
#include "attach/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define GUARD (16 * ATTACH_PAGE) /* left free between the staged code and others */
#define REACH ((int64_t)INT32_MAX - (int64_t)(1 << 20))

/* ---- resolving the patch's references ------------------------------------ */

typedef struct lib_tab {
  char path[512];
  uint64_t bias;
  molt__symtab *st;
} lib_tab;

typedef struct target {
  pid_t pid;
  char exe[512];
  uint64_t bias;
  molt__symtab *st;
  attach_map *maps;
  size_t nmaps;
  lib_tab *libs;
  size_t nlibs;
} target;

static void target_free(target *t) {
  molt__symtab_close(t->st);
  for (size_t i = 0; i < t->nlibs; i++)
    molt__symtab_close(t->libs[i].st);
  free(t->libs);
  free(t->maps);

  memset(t, 0, sizeof *t);
}

/* The libraries of the target, in the loader's order, each read from the
 * file the target mapped (libs.c). */
static int load_libs(target *t) {
  attach_lib *list;
  size_t n;
  int rc = molt__libs_list(t->pid, t->bias, t->exe, t->maps, t->nmaps, &list, &n);
  if (rc)
    return rc;
  t->libs = calloc(n ? n : 1, sizeof *t->libs);
  if (!t->libs) {
    free(list);
    return MOLT_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    lib_tab *l = &t->libs[t->nlibs];
    snprintf(l->path, sizeof l->path, "%s", list[i].name);
    l->bias = list[i].bias;
    if (molt__symtab_open(list[i].path, &l->st) == 0)
      t->nlibs++; /* else: not an ELF file, or unreadable: no symbols from it */
  }
  free(list);
  return 0;
}

typedef struct got_find {
  const char *name;
  uint64_t slot;
  bool found;
} got_find;

static bool got_visit(const char *name, uint64_t slot, void *arg) {
  got_find *g = arg;
  if (strcmp(name, g->name) != 0)
    return false;
  g->slot = slot;
  g->found = true;
  return true;
}

/* A reference of the patch.  One the patch's own link bound to a library
 * (it carries the library's symbol version: `atol@GLIBC_2.2.5`) is bound
 * as the loader binds it -- the program's global symbols, then each
 * library in the loader's order, then (an indirect function) the
 * program's GOT slot -- and never to a static of the program: a static of
 * one of its files can then never shadow the library function the patch
 * calls.  Any other reference names the program's own (the patch declares
 * the program's globals and statics `extern`): its globals, its statics
 * (by unique name), then the libraries. */
static int resolve(const char *name, bool weak, bool library, uint64_t *value, void *arg,
                   char *err, size_t errlen) {
  target *t = arg;
  uintptr_t v;
  if (molt__symtab_lookup(t->st, name, NULL, &v) == 0) {
    *value = t->bias + v;
    return 0;
  }
  if (!library) {
    int rc = molt__symtab_lookup_any(t->st, name, &v);
    if (rc == 0) {
      *value = t->bias + v;
      return 0;
    }
    if (rc == MOLT_EAMBIGUOUS) {
      molt__errmsg(err, errlen,
                   "the patch refers to '%s', which names several statics of the target",
                   name);
      return rc;
    }
  }
  for (size_t i = 0; i < t->nlibs; i++) {
    if (molt__symtab_lookup(t->libs[i].st, name, NULL, &v) == 0) {
      *value = t->libs[i].bias + v;
      return 0;
    }
  }
  /* An indirect function (IFUNC: strlen, memcpy, ...) has no address in a
   * symbol table; if the program calls it, its GOT word holds what the
   * loader chose (or, bound lazily, the program's PLT entry, which works
   * as well). */
  char link[64];
  molt__os_path(t->pid, "exe", link, sizeof link);
  got_find g = {name, 0, false};
  uint64_t word;
  if (molt__elf_got_slots(link, got_visit, &g) == 0 && g.found &&
      molt__os_read(t->pid, t->bias + g.slot, &word, sizeof word) == 0 && word) {
    *value = word;
    return 0;
  }
  if (weak) {
    *value = 0;
    return 0;
  }
  molt__errmsg(err, errlen,
               "the patch refers to '%s', which is neither in the target's symbol table "
               "nor in a library it has loaded (nor, if it is an indirect function, "
               "called by the program)",
               name);
  return MOLT_ENOSYM;
}

static int open_target(pid_t pid, target *t, char *err, size_t errlen) {
  memset(t, 0, sizeof *t);
  t->pid = pid;
  int rc = molt__os_maps(pid, &t->maps, &t->nmaps);
  if (rc) {
    molt__errmsg(err, errlen, "cannot read the mappings of process %d", (int)pid);
    return rc;
  }
  rc = molt__os_exe(pid, t->maps, t->nmaps, t->exe, sizeof t->exe, &t->bias, err, errlen);
  if (rc)
    return rc;
  char link[64];
  molt__os_path(pid, "exe", link, sizeof link);
  rc = molt__symtab_open(link, &t->st);
  if (rc) {
    molt__errmsg(err, errlen, "cannot read the symbol table of %s", t->exe);
    return rc;
  }

  return load_libs(t);
}

static int target_build_id(pid_t pid, char *hex, size_t len, char *err, size_t errlen) {
  char link[64];
  molt__os_path(pid, "exe", link, sizeof link);
  int fd = open(link, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    molt__errmsg(err, errlen, "cannot open %s: %s", link, strerror(errno));
    return molt__from_errno(errno);
  }
  int rc = molt__elf_file_build_id(fd, hex, len, err, errlen);
  close(fd);
  if (rc == MOLT_ENOSYM)
    molt__errmsg(err, errlen,
                 "the program of process %d has no build-id (link it with "
                 "-Wl,--build-id); attach patches are matched by it",
                 (int)pid);
  return rc;
}

/* ---- planning --------------------------------------------------------------- */

/* The function `name` of the target -- at link-time address `addr` when
 * the patch says where (moltcc resolved it), else found by its name. */
static int plan_function(target *t, const char *name, uint64_t addr, molt__attach_func *f,
                         char *err, size_t errlen) {
  uintptr_t v = (uintptr_t)addr, start;
  size_t size;
  bool is_func;
  const char *tu = NULL; /* a static's file: where its .cold part is */
  int rc = addr ? 0 : molt__symtab_lookup_any(t->st, name, &v);
  if (rc == MOLT_EAMBIGUOUS) {
    molt__errmsg(err, errlen, "'%s' names several functions of the target", name);
    return rc;
  }
  if (rc || molt__symtab_at(t->st, v, NULL, &tu, &start, &size, &is_func) != 0 ||
      !is_func || start != v) {
    molt__errmsg(err, errlen,
                 "the patch defines '%s', which is not a function of the target (make "
                 "the patch's helpers static)",
                 name);
    return MOLT_ENOFUNC;
  }
  if (size == 0 || size > (16u << 20)) {
    molt__errmsg(err, errlen, "the size of function '%s' is unknown", name);
    return MOLT_ENOFUNC;
  }
  snprintf(f->name, sizeof f->name, "%s", name);
  f->addr = t->bias + v;
  f->size = size;
  uint8_t *code = malloc(size);
  if (!code)
    return MOLT_ENOMEM;
  rc = molt__os_read(t->pid, f->addr, code, size);
  if (rc) {
    molt__errmsg(err, errlen, "cannot read function '%s' in process %d", name,
                 (int)t->pid);
    free(code);
    return rc;
  }
  attach_site site;
  char why[300];
  rc = molt__arch_plan(code, size, f->addr, &site, why, sizeof why);
  free(code);
  if (rc == 0) {
    /* gcc's cold part of the function may branch back into it */
    char cold[160];
    snprintf(cold, sizeof cold, "%s.cold", name);
    uintptr_t cv;
    size_t csize;
    /* a static's in its own file: another file may have a static of the
     * same name with a cold part of its own */
    int found = tu ? molt__symtab_lookup(t->st, cold, tu, &cv)
                   : molt__symtab_lookup_any(t->st, cold, &cv);
    if (found == 0 && molt__symtab_at(t->st, cv, NULL, NULL, NULL, &csize, NULL) == 0 &&
        csize && csize < (16u << 20)) {
      uint8_t *cc = malloc(csize);
      if (!cc)
        return MOLT_ENOMEM;
      rc = molt__os_read(t->pid, t->bias + cv, cc, csize);
      f->cold = t->bias + cv;
      f->cold_size = csize;
      if (rc == 0)
        rc = molt__arch_check_branches(cc, csize, t->bias + cv, site.at,
                                       site.at + site.len, why, sizeof why);
      free(cc);
    }
  }
  if (rc) {
    molt__errmsg(err, errlen, "function '%s' cannot be replaced: %s", name, why);
    return rc == MOLT_ENOMEM ? rc : MOLT_ENOFUNC;
  }
  f->at = site.at;
  f->len = site.len;
  return molt__os_read(t->pid, f->at, f->orig, f->len);
}

static bool reaches(const molt__attach_state *st, uint64_t lo, uint64_t hi) {
  for (size_t i = 0; i < st->nfuncs; i++) {
    int64_t a = (int64_t)(lo - st->funcs[i].at), b = (int64_t)(hi - st->funcs[i].at);
    if (a < -REACH || a > REACH || b < -REACH || b > REACH)
      return false;
  }
  return true;
}

/* A free range of `size` bytes within reach of every function: the
 * candidate nearest to the functions, in a gap of the target's mappings
 * (GUARD bytes from its neighbours). */
static int choose_place(const target *t, const molt__attach_state *st, size_t size,
                        uint64_t *base, char *err, size_t errlen) {
  uint64_t center = st->funcs[0].at, best = 0, best_d = UINT64_MAX;
  uint64_t prev_end = 1u << 20; /* nothing below 1 MiB (mmap_min_addr) */
  bool after_heap = false;
  for (size_t i = 0; i <= t->nmaps; i++) {
    uint64_t gap_end = i < t->nmaps ? t->maps[i].start : (1ull << 47) - (1ull << 32);
    if (gap_end > prev_end && gap_end - prev_end >= size + 2 * GUARD) {
      uint64_t cand[2] = {gap_end - GUARD - size, prev_end + GUARD};
      /* not right above the heap: brk grows there */
      for (int k = 0; k < (after_heap ? 1 : 2); k++) {
        uint64_t c = cand[k] & ~(uint64_t)(ATTACH_PAGE - 1);
        if (c < prev_end + GUARD || !reaches(st, c, c + size))
          continue;
        uint64_t d = c > center ? c - center : center - c;
        if (d < best_d) {
          best_d = d;
          best = c;
        }
      }
    }
    if (i < t->nmaps && t->maps[i].end > prev_end) {
      prev_end = t->maps[i].end;
      after_heap = strcmp(t->maps[i].path, "[heap]") == 0;
    }
  }
  if (!best) {
    molt__errmsg(err, errlen,
                 "no free address range within 2 GiB of the functions to replace");
    return MOLT_ENOMEM;
  }
  *base = best;
  return 0;
}

/* $MOLT_ATTACH_TEST_PAUSE=<point>: the tests kill molt (SIGKILL) at a
 * named point of an attach -- prepared, staging (between the system calls
 * run on the hijacked thread), staged, stopped, stepping (a thread raised
 * to be stepped out of the first bytes, os_linux.c), applied -- to check what
 * the target is left with.  molt says where it waits on stderr and waits
 * a minute, or until SIGINT, SIGTERM, SIGHUP or SIGQUIT is pending (they
 * are blocked: the run goes on to its next safe point, as it would after
 * the microseconds a real step takes). */
static void test_pause(const char *point) {
  const char *want = getenv("MOLT_ATTACH_TEST_PAUSE");
  if (!want || strcmp(want, point) != 0)
    return;
  fprintf(stderr, "molt-attach-paused %s\n", point);
  fflush(stderr);
  for (int i = 0; i < 6000 && !molt__interrupt_pending(); i++) {
    struct timespec ts = {0, 10 * 1000000};
    nanosleep(&ts, NULL);
  }
}

/* The same for os_linux.c's points (a thread being single-stepped). */
void molt__test_pause(const char *point) { test_pause(point); }

/* A safe point: a pending SIGINT, SIGTERM, SIGHUP or SIGQUIT of molt is
 * taken; MOLT_EBUSY with "interrupted by SIG...; <then>" in err, or 0. */
static int safe_point(const char *then, char *err, size_t errlen) {
  int sig = molt__interrupt_take();
  if (!sig)
    return 0;
  const char *abbrev = sigabbrev_np(sig);
  molt__errmsg(err, errlen, "interrupted by SIG%s; %s", abbrev ? abbrev : "?", then);
  return MOLT_EBUSY;
}

/* Ends step `name` of st's run, begun at *since: its wall time is kept in
 * st->phases (what `molt attach` and `molt rollback` report), and the next
 * step begins now. */
static void phase_end(molt__attach_state *st, const char *name, uint64_t *since) {
  uint64_t now = molt__os_now_ns();
  if (st->nphases < sizeof st->phases / sizeof st->phases[0]) {
    st->phases[st->nphases].name = name;
    st->phases[st->nphases].ms = (double)(now - *since) / 1e6;
    st->nphases++;
  }
  *since = now;
}

/* ---- staging -------------------------------------------------------------------- */

/* Stops one thread to run system calls on (the main thread, else another),
 * raised to real-time priority first (os_linux.c: molt__os_boost) so that
 * it stops and runs each call at once, also among busy threads; give it
 * back with release_thread. */
static int stop_boosted(pid_t pid, pid_t tid, attach_stop *s, attach_boost *b, char *err,
                        size_t errlen) {
  molt__os_boost(tid, b);
  int rc = molt__os_stop_one(pid, tid, s, err, errlen);
  if (rc)
    molt__os_unboost(b);
  return rc;
}

static void release_thread(attach_stop *s, attach_boost *b) {
  molt__os_unboost(b); /* its policy back while it is still stopped */
  molt__os_resume_all(s);
}

static int stop_some_thread(pid_t pid, attach_stop *s, attach_boost *b, char *err,
                            size_t errlen) {
  int rc = stop_boosted(pid, pid, s, b, err, errlen);
  if (rc != MOLT_ENOENT)
    return rc;
  /* the main thread has exited (pthread_exit; a zombie, which cannot be
   * seized): another one */
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  struct dirent *e;
  while (d && rc == MOLT_ENOENT && (e = readdir(d))) {
    pid_t tid = (pid_t)atoi(e->d_name);
    if (tid > 0 && tid != pid)
      rc = stop_boosted(pid, tid, s, b, err, errlen);
  }
  if (d)
    closedir(d);
  return rc;
}

static int rsys(attach_thread *th, uint64_t insn, long nr, uint64_t a0, uint64_t a1,
                uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5, long *ret, char *err,
                size_t errlen) {
  const uint64_t args[6] = {a0, a1, a2, a3, a4, a5};
  int rc = molt__os_syscall(th, insn, nr, args, ret, err, errlen);
  if (rc == 0 && *ret < 0 && *ret > -4096) {
    const char *name = nr == SYS_memfd_create ? "memfd_create"
                       : nr == SYS_mmap       ? "mmap"
                       : nr == SYS_munmap     ? "munmap"
                       : nr == SYS_close      ? "close"
                                              : "a system call";
    molt__errmsg(err, errlen, "%s (system call %ld) in the target failed: %s", name, nr,
                 strerror((int)-*ret));
    rc = MOLT_EIO;
  }
  return rc;
}

/* The lowest descriptor number free in the target: the one memfd_create
 * will return (a filter may look at the descriptor mmap is given). */
static long lowest_free_fd(pid_t pid) {
  char path[64];
  molt__os_path(pid, "fd", path, sizeof path);
  DIR *d = opendir(path);
  if (!d)
    return 3;
  unsigned char used[1024] = {0};
  struct dirent *e;
  while ((e = readdir(d))) {
    long n = strtol(e->d_name, NULL, 10);
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && n >= 0 && n < 1024)
      used[n] = 1;
  }
  closedir(d);
  long fd = 0;
  while (fd < 1024 && used[fd])
    fd++;
  return fd;
}

/* The system calls stage() runs on thread tid -- memfd_create, one mmap
 * per run of pages, close -- and the munmap a rollback runs later, checked
 * against its seccomp filters before any of them runs. */
static int check_staging_calls(pid_t pid, pid_t tid, const attach_patch *p, uint64_t base,
                               uint64_t name_at, uint64_t insn, char *err,
                               size_t errlen) {
  size_t npages = p->size / ATTACH_PAGE;
  size_t all = npages + ATTACH_STATE_SIZE / ATTACH_PAGE, n = 0;
  attach_call *calls = calloc(all + 3, sizeof *calls);
  if (!calls)
    return MOLT_ENOMEM;
  long fd = lowest_free_fd(pid);
  calls[n++] = (attach_call){SYS_memfd_create, {name_at, MFD_CLOEXEC}};
  for (size_t k = 0; k < all;) {
    size_t e = k < npages ? k + 1 : all;
    int prot = k < npages ? p->prot[k] : PROT_READ | PROT_WRITE;
    while (k < npages && e < npages && p->prot[e] == p->prot[k])
      e++;
    calls[n++] =
        (attach_call){SYS_mmap,
                      {base + k * ATTACH_PAGE, (e - k) * ATTACH_PAGE, (uint64_t)prot,
                       MAP_SHARED | MAP_FIXED_NOREPLACE, (uint64_t)fd, k * ATTACH_PAGE}};
    k = e;
  }
  calls[n++] = (attach_call){SYS_close, {(uint64_t)fd}};
  calls[n++] = (attach_call){SYS_munmap, {base, all * ATTACH_PAGE}};
  int rc = molt__seccomp_check(pid, tid, insn, calls, n, err, errlen);
  free(calls);
  return rc;
}

/* Maps the relocated image and the state page at base in the target. */
static int stage(pid_t pid, const attach_patch *p, uint64_t base, uint64_t insn,
                 molt__attach_state *st, char *err, size_t errlen) {
  attach_stop s;
  attach_boost boost;
  int rc = stop_some_thread(pid, &s, &boost, err, errlen);
  if (rc)
    return rc;
  attach_thread *th = &s.t[0];
  size_t total = p->size + ATTACH_STATE_SIZE;
  static const char name[] = "molt-attach";
  /* The name goes below the thread's stack pointer, past the red zone: memory
   * nothing uses while the thread is stopped. */
  uint64_t name_at = (molt__arch_sp(&th->regs) - 1024) & ~(uint64_t)15;
  long fd = -1, r;
  /* Before any of them runs: does a seccomp filter let them all through? */
  rc = check_staging_calls(pid, th->tid, p, base, name_at, insn, err, errlen);
  if (rc) {
    release_thread(&s, &boost);
    return rc;
  }
  rc = molt__os_write(pid, name_at, name, sizeof name);
  if (rc)
    molt__errmsg(err, errlen, "cannot write into the stack of thread %d", (int)th->tid);
  if (rc == 0)
    rc = rsys(th, insn, SYS_memfd_create, name_at, MFD_CLOEXEC, 0, 0, 0, 0, &fd, err,
              errlen);
  if (rc == 0) {
    char path[64];
    char fdname[32];
    snprintf(fdname, sizeof fdname, "fd/%ld", fd);
    molt__os_path(pid, fdname, path, sizeof path);
    int mfd = open(path, O_RDWR | O_CLOEXEC);
    molt__buf b;
    molt__buf_init(&b);
    molt__state_format(st, &b);
    /* the state text with its terminating zero; the rest of the memfd is
     * zeros already */
    if (b.oom || b.len >= ATTACH_STATE_SIZE) {
      molt__errmsg(err, errlen, "the attach record does not fit its %u bytes",
                   ATTACH_STATE_SIZE);
      rc = MOLT_EINTERNAL;
    } else if (mfd < 0 || ftruncate(mfd, (off_t)total) != 0 ||
               pwrite(mfd, p->image, p->size, 0) != (ssize_t)p->size ||
               pwrite(mfd, b.data, b.len + 1, (off_t)p->size) != (ssize_t)b.len + 1) {
      molt__errmsg(err, errlen, "cannot fill the staged code (%s): %s", path,
                   strerror(errno));
      rc = MOLT_EIO;
    }
    molt__buf_free(&b);
    if (mfd >= 0)
      close(mfd);
  }
  /* Runs of pages with the same protection, then the state pages. */
  size_t npages = p->size / ATTACH_PAGE, mapped = 0;
  size_t all = npages + ATTACH_STATE_SIZE / ATTACH_PAGE;
  bool paused = false;
  for (size_t k = 0; rc == 0 && k < all;) {
    size_t e = k < npages ? k + 1 : all;
    int prot = k < npages ? p->prot[k] : PROT_READ | PROT_WRITE;
    while (k < npages && e < npages && p->prot[e] == p->prot[k])
      e++;
    if (prot == 0)
      prot = PROT_NONE;
    rc = rsys(th, insn, SYS_mmap, base + k * ATTACH_PAGE, (e - k) * ATTACH_PAGE,
              (uint64_t)prot, MAP_SHARED | MAP_FIXED_NOREPLACE, (uint64_t)fd,
              k * ATTACH_PAGE, &r, err, errlen);
    if (rc == 0 && (uint64_t)r != base + k * ATTACH_PAGE) {
      molt__errmsg(err, errlen, "the kernel placed the staged code elsewhere");
      rc = MOLT_EIO;
    }
    if (rc == 0)
      mapped = e;
    k = e;
    if (rc == 0 && !paused) {
      paused = true;
      test_pause("staging"); /* between two mmaps: the thread is hijacked */
    }
  }
  if (rc && mapped)
    rsys(th, insn, SYS_munmap, base, mapped * ATTACH_PAGE, 0, 0, 0, 0, &r, err, errlen);
  if (fd >= 0) {
    char cerr[128];
    rsys(th, insn, SYS_close, (uint64_t)fd, 0, 0, 0, 0, 0, &r, cerr, sizeof cerr);
  }
  release_thread(&s, &boost);
  return rc;
}

/* Removes the staged code of an attach that failed before any thread
 * could run it (no jump was left written), with one thread stopped for
 * the munmap: a failed stop of every thread (one that does not stop) does
 * not keep the mapping.  The record goes too; if the munmap cannot be
 * run, the record stays and `molt rollback` removes the mapping later. */
static void unstage(pid_t pid, const molt__attach_state *st) {
  attach_map *maps = NULL;
  size_t nmaps = 0;
  uint64_t insn = 0;
  char e2[256];
  bool ours = molt__os_maps(pid, &maps, &nmaps) == 0 &&
              molt__os_find_syscall(pid, maps, nmaps, &insn, e2, sizeof e2) == 0;
  for (size_t m = 0; ours && m < nmaps; m++) {
    if (maps[m].end > st->code_start && maps[m].start < st->code_end)
      ours = strstr(maps[m].path, "memfd:molt-attach") != NULL;
  }
  free(maps);
  attach_stop s;
  attach_boost boost;
  if (!ours || stop_some_thread(pid, &s, &boost, e2, sizeof e2) != 0)
    return;
  long r;
  int rc = rsys(&s.t[0], insn, SYS_munmap, st->code_start, st->code_end - st->code_start,
                0, 0, 0, 0, &r, e2, sizeof e2);
  release_thread(&s, &boost);
  if (rc == 0)
    molt__state_remove(pid, st->level);
}

/* ---- the stop ------------------------------------------------------------------- */

static bool in_bytes(const molt__attach_state *st, uint64_t ip, size_t *fi) {
  for (size_t k = 0; k < st->nfuncs; k++) {
    const molt__attach_func *f = &st->funcs[k];
    if (ip >= f->at && ip < f->at + f->len) {
      *fi = k;
      return true;
    }
  }
  return false;
}

/* Inside a function, its .cold part included: the entry itself counts
 * only when `entry` (a thread's ip there is inside it; a word of a stack
 * equal to it is a pointer to the function, not a return address). */
static bool in_function(const molt__attach_state *st, uint64_t a, bool entry,
                        size_t *fi) {
  for (size_t k = 0; k < st->nfuncs; k++) {
    const molt__attach_func *f = &st->funcs[k];
    if ((a > f->addr || (entry && a == f->addr)) && a < f->addr + f->size) {
      *fi = k;
      return true;
    }
    if (f->cold_size && a >= f->cold && a < f->cold + f->cold_size) {
      *fi = k;
      return true;
    }
  }
  return false;
}

/* A thread of s that would run the rewritten bytes of a function: its ip
 * inside them, or the ip saved in a signal frame on its stack (a handler
 * still running, which returns there).  The first byte counts too: a
 * thread interrupted in a long first instruction (rep movs) has its ip
 * there with registers already changed, and must finish it.  With
 * `active` (--check-active), also a thread anywhere inside a function to
 * be replaced, interrupted inside one, or with a return address into one
 * (any word of its stack: conservative).  Its index, the function's and
 * why; or -1. */
static int in_the_way(const attach_stop *s, const molt__attach_state *st, bool active,
                      attach_view *v, size_t from, size_t *fi, const char **why,
                      bool *steppable) {
  *steppable = false;
  for (size_t i = from; i < s->n; i++) {
    uint64_t ip = molt__arch_ip(&s->t[i].regs);
    /* a system call the thread is restarted in runs from ip - 2 */
    uint64_t back =
        molt__arch_syscall_nr(&s->t[i].regs) >= 0 ? ip - ATTACH_SYSCALL_LEN : ip;
    if (in_bytes(st, ip, fi) || in_bytes(st, back, fi)) {
      *why = "was inside the first bytes of";
      /* Interrupted in user code (not in a system call, which a step
       * would restart and maybe block in), no signal held back: it can
       * be stepped out of them.  With --check-active it would still be
       * running the function. */
      *steppable = !active && back == ip && s->t[i].sig == 0;
      return (int)i;
    }
    if (active && in_function(st, ip, true, fi)) {
      *why = "was running";
      return (int)i;
    }
    attach_stack stack;
    int rc = molt__stack_read(v, molt__arch_sp(&s->t[i].regs), &stack);
    if (rc) {
      /* cannot tell where its signal handlers return: in the way */
      *fi = 0;
      *why = "has a stack molt cannot read, so it may return into";
      return (int)i;
    }
    uint64_t saved[16];
    size_t n = molt__stack_signal_ips(v, &stack, saved, 16);
    int hit = -1;
    for (size_t k = 0; k < n && hit < 0; k++) {
      if (in_bytes(st, saved[k], fi)) {
        *why = "is running a signal handler that returns into the first bytes of";
        hit = (int)i;
      } else if (active && in_function(st, saved[k], true, fi)) {
        *why = "is running a signal handler that returns into";
        hit = (int)i;
      }
    }
    for (size_t k = 0; active && hit < 0 && k < stack.n; k++) {
      if (in_function(st, stack.w[k], false, fi)) {
        *why = "had a return address into";
        hit = (int)i;
      }
    }
    molt__stack_free(&stack);
    if (hit >= 0)
      return hit;
  }
  return -1;
}

/* How many instructions a thread is single-stepped to leave the bytes: a
 * prologue's few are enough; a long first instruction (rep movs, which
 * traps after each of its rounds when stepped) is left to finish on its
 * own while molt backs off. */
#define STEP_MAX 64

static bool still_in_bytes(uint64_t ip, void *arg) {
  size_t fi;
  return in_bytes(arg, ip, &fi);
}

/* Stops every thread with none in the way, retrying with back-off until
 * the deadline.  A thread whose ip is inside the bytes to be rewritten is
 * first single-stepped out of them while the others stay stopped (one
 * stop, not a retry of the whole stop, for each thread caught there);
 * *stepped counts them.  0 with s stopped, or MOLT_ETIMEDOUT naming who
 * blocked. */
static int stop_clear(pid_t pid, const molt__attach_state *st, bool active,
                      int timeout_ms, attach_stop *s, int *attempts, int *stepped,
                      char *err, size_t errlen) {
  uint64_t deadline = molt__os_now_ns() + (uint64_t)timeout_ms * 1000000u;
  long backoff_us = 200;
  *stepped = 0;
  for (*attempts = 1;; (*attempts)++) {
    /* The maps before the stop (read again during it only for a stack
     * that is not in them). */
    attach_view v;
    int rc = st ? molt__view_open(pid, &v) : 0;
    if (rc) {
      molt__errmsg(err, errlen, "cannot read the mappings of process %d", (int)pid);
      return rc;
    }
    rc = molt__os_stop_all(pid, s, err, errlen);
    if (rc && (rc != MOLT_ETIMEDOUT || molt__os_now_ns() >= deadline)) {
      /* a thread that does not stop (uninterruptible sleep): every other
       * was released; err names it */
      if (st)
        molt__view_close(&v);
      if (rc == MOLT_ETIMEDOUT) {
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, "; gave up after %d stops in %.1f s",
                 *attempts, timeout_ms / 1000.0);
      }
      return rc;
    }
    size_t fi = 0;
    const char *why = "";
    int ti = -1;
    for (size_t from = 0; rc == 0 && st;) {
      bool steppable;
      int steps;
      ti = in_the_way(s, st, active, &v, from, &fi, &why, &steppable);
      if (ti < 0 || !steppable ||
          molt__os_step_while(pid, &s->t[ti], still_in_bytes, (void *)st, STEP_MAX,
                              &steps) != 0)
        break;
      /* out of the bytes: the threads before it were clear already, and
       * its stack is the one looked at (a step pushes or pops a word at
       * most: looked at again from it) */
      (*stepped)++;
      from = (size_t)ti;
    }
    if (st)
      molt__view_close(&v);
    if (rc == 0 && ti < 0)
      return 0;
    pid_t tid = rc == 0 ? s->t[ti].tid : 0;
    uint64_t runs = 0;
    bool counted = rc == 0 && molt__os_runs(pid, tid, &runs);
    if (rc == 0)
      molt__os_resume_all(s);
    if (rc == 0 && molt__os_now_ns() >= deadline) {
      char comm[64];
      molt__proc_name(pid, tid, comm, sizeof comm);
      if (active)
        molt__errmsg(err, errlen,
                     "thread %d (%s) %s '%s' at the last of %d stops in %.1f s "
                     "(--check-active); if '%s' is a loop that never returns, replace "
                     "the program by a full update instead (moltcc --molt-program, "
                     "molt update)",
                     (int)tid, comm, why, st->funcs[fi].name, *attempts,
                     timeout_ms / 1000.0, st->funcs[fi].name);
      else
        molt__errmsg(err, errlen,
                     "thread %d (%s) %s '%s' at each of %d stops in %.1f s; try again, "
                     "or use a full update if it never leaves that function",
                     (int)tid, comm, why, st->funcs[fi].name, *attempts,
                     timeout_ms / 1000.0);
      return MOLT_ETIMEDOUT;
    }
    /* tried again after the back-off, and not before the thread in the way
     * has run (it would be found where it was) */
    molt__os_wait_ran(pid, counted ? tid : 0, runs,
                      molt__os_now_ns() + (uint64_t)backoff_us * 1000u, deadline);
    if (backoff_us < 50000)
      backoff_us *= 2;
    if (st &&
        safe_point("the staged code was removed, the program is unchanged", err, errlen))
      return MOLT_EBUSY;
  }
}

static int write_jumps(pid_t pid, const molt__attach_state *st, bool to_new, char *err,
                       size_t errlen) {
  for (size_t i = 0; i < st->nfuncs; i++) {
    const molt__attach_func *f = &st->funcs[i];
    int rc = molt__os_write(pid, f->at, to_new ? f->jump : f->orig, f->len);
    if (rc) {
      molt__errmsg(err, errlen, "cannot write the entry of '%s' in process %d", f->name,
                   (int)pid);
      return rc;
    }
  }
  return 0;
}

/* ---- attach --------------------------------------------------------------------- */

static int rollback_level(pid_t pid, int timeout_ms, molt__attach_state *st, char *err,
                          size_t errlen);

/* The stack a new patch goes on: its rolled-back levels whose code was
 * kept mapped are tried again first (reclaimed if no thread runs them
 * now); then the level the new patch takes, or a refusal (levels.c). */
static int stack_below(pid_t pid, molt__attach_stack *below, int *level, char *err,
                       size_t errlen) {
  char ignored[256];
  int rc = molt__attach_stack_load(pid, below, ignored, sizeof ignored);
  if (rc == MOLT_ENOHISTORY) {
    memset(below, 0, sizeof *below);
    *level = 1;
    return 0;
  }
  if (rc) {
    molt__errmsg(err, errlen, "%s", ignored);
    return rc;
  }
  bool kept = false;
  for (size_t i = 0; i < below->n; i++) {
    if (!molt__levels_active(&below->levels[i])) {
      /* one look (timeout 0): the attach does not wait for them */
      rollback_level(pid, 0, &below->levels[i], ignored, sizeof ignored);
      kept = true;
    }
  }
  if (kept) {
    molt__attach_stack_free(below);
    rc = molt__attach_stack_load(pid, below, ignored, sizeof ignored);
    if (rc == MOLT_ENOHISTORY) {
      memset(below, 0, sizeof *below);
      *level = 1;
      return 0;
    }
    if (rc) {
      molt__errmsg(err, errlen, "%s", ignored);
      return rc;
    }
  }
  rc = molt__levels_next(pid, below, level, err, errlen);
  if (rc)
    molt__attach_stack_free(below);
  return rc;
}

static int attach_locked(const molt__attach_opts *o, molt__attach_state *st, char *err,
                         size_t errlen) {
  pid_t pid = o->pid;
  int timeout_ms = o->timeout_ms < 0 ? MOLT__DEFAULT_TIMEOUT_MS : o->timeout_ms;
  uint64_t since = molt__os_now_ns();
  int rc = molt__os_check_traceable(pid, err, errlen);
  if (rc)
    return rc;
  /* The patches attached already: the new one goes on top of them. */
  molt__attach_stack below;
  int level = 1;
  rc = stack_below(pid, &below, &level, err, errlen);
  if (rc)
    return rc;
  memset(st, 0, sizeof *st);
  st->level = level;
  attach_patch p;
  molt__patch_callbacks cbs;
  rc = molt__patch_open(o->patch, &p, err, errlen);
  if (rc == 0) {
    rc = molt__callbacks_read(o->patch, &cbs, err, errlen);
    if (rc)
      molt__patch_close(&p);
  }
  if (rc) {
    molt__attach_stack_free(&below);
    return rc;
  }
  target t;
  memset(&t, 0, sizeof t);
  if (!realpath(o->patch, st->patch))
    snprintf(st->patch, sizeof st->patch, "%s", o->patch);
  st->start_time = molt__os_start_time(pid);
  rc = target_build_id(pid, st->build_id, sizeof st->build_id, err, errlen);
  if (rc == 0 && strcmp(st->build_id, p.build_id) != 0) {
    molt__errmsg(err, errlen,
                 "the patch was built for build-id %s, process %d runs %s; build it "
                 "against the running program",
                 p.build_id, (int)pid, st->build_id);
    rc = MOLT_EBUILDID;
  }
  if (rc == 0)
    rc = open_target(pid, &t, err, errlen);
  for (size_t i = 0; rc == 0 && i < p.nfuncs; i++) {
    molt__attach_func *f = &st->funcs[i];
    snprintf(f->name, sizeof f->name, "%s", p.funcs[i].name);
    /* where moltcc resolved it (a patch built from a fix): the levels
     * below are matched by that address, else by name */
    f->addr = p.funcs[i].target ? t.bias + p.funcs[i].target : 0;
    /* replaced by a patch below already: its site, its jump rewritten */
    rc = molt__levels_inherit(pid, &below, f, err, errlen);
    if (rc == 0)
      rc = plan_function(&t, p.funcs[i].name, p.funcs[i].target, f, err, errlen);
    else if (rc == 1)
      rc = 0;
  }
  molt__attach_stack_free(&below);
  if (rc == 0)
    st->nfuncs = p.nfuncs;
  uint64_t base = 0, insn = 0;
  if (rc == 0)
    rc = choose_place(&t, st, p.size + ATTACH_STATE_SIZE, &base, err, errlen);
  p.target_bias = t.bias;
  if (rc == 0)
    rc = molt__patch_relocate(&p, base, resolve, &t, err, errlen);
  for (size_t i = 0; rc == 0 && i < st->nfuncs; i++) {
    molt__attach_func *f = &st->funcs[i];
    f->new_addr = base + p.funcs[i].offset;
    if (!molt__arch_jump(f->at, f->new_addr, f->jump, f->len)) {
      molt__errmsg(err, errlen, "'%s' is out of reach of its new version", f->name);
      rc = MOLT_EINTERNAL;
    }
  }
  if (rc == 0)
    rc = molt__os_find_syscall(pid, t.maps, t.nmaps, &insn, err, errlen);
  if (rc == 0) {
    st->code_start = base;
    st->code_end = base + p.size + ATTACH_STATE_SIZE;
    st->time = (long long)time(NULL);
    /* The record comes first: killed while staging, molt leaves a
     * mapping that a rollback finds and removes. */
    snprintf(st->phase, sizeof st->phase, "staging");
    rc = molt__state_save(pid, st, 0, err, errlen);
    test_pause("prepared");
    snprintf(st->phase, sizeof st->phase, "staged");
    if (rc == 0)
      rc = safe_point("nothing was changed", err, errlen);
    phase_end(st, "prepare", &since);
    if (rc == 0)
      rc = stage(pid, &p, base, insn, st, err, errlen);
    phase_end(st, "staging", &since);
    if (rc)
      molt__state_remove(pid, st->level); /* stage() unmapped what it mapped */
  }
  molt__patch_close(&p);
  target_free(&t);
  if (rc)
    return rc;
  /* From here on the target has the staged mapping: the record says so,
   * whatever happens next. */
  rc = molt__state_save(pid, st, ATTACH_STATE_PAGE(st), err, errlen);
  test_pause("staged");
  /* pre: the patch's code is there, no entry jumps to it yet */
  if (rc == 0)
    rc = molt__callbacks_pre(pid, st, &cbs, st->code_start, o->callback_timeout_ms, err,
                             errlen);
  if (cbs.pre.present)
    phase_end(st, "pre", &since);
  attach_stop s;
  memset(&s, 0, sizeof s);
  int attempts = 0, stepped = 0;
  const char *undone = "the staged code was removed, the program is unchanged";
  if (rc == 0)
    rc = safe_point(undone, err, errlen);
  /* "applying" is saved before the stop, not during it: the record is a
   * file written and renamed, which need not hold every thread stopped (on
   * a /run that is a disk file system a rename waited for the journal, up
   * to 260 ms under I/O load).  Killed before a jump is written, a record
   * "applying" is rolled back as one with some jumps: each function that
   * holds its jump is restored (here none), the code unmapped. */
  if (rc == 0) {
    snprintf(st->phase, sizeof st->phase, "applying");
    rc = molt__state_save(pid, st, ATTACH_STATE_PAGE(st), err, errlen);
  }
  if (rc == 0)
    rc = stop_clear(pid, st, o->check_active, timeout_ms, &s, &attempts, &stepped, err,
                    errlen);
  if (rc == 0) {
    test_pause("stopped");
    /* the last safe point before the jumps: after them, molt finishes */
    if (rc == 0)
      rc = safe_point(undone, err, errlen);
    if (rc == 0)
      rc = write_jumps(pid, st, true, err, errlen);
    if (rc == 0)
      test_pause("applied");
    if (rc) {
      /* put back whatever was written */
      char e2[64];
      write_jumps(pid, st, false, e2, sizeof e2);
    }
    st->threads = (int)s.n;
    molt__os_resume_all(&s);
    st->stop_ms = s.ms;
    st->attempts = attempts;
    st->stepped = stepped;
  }
  phase_end(st, "stop", &since);
  if (rc) {
    /* The functions are untouched (no thread ever ran the staged code):
     * undo the staging, on one thread. */
    unstage(pid, st);
    return rc;
  }
  snprintf(st->phase, sizeof st->phase, "applied");
  st->time = (long long)time(NULL);
  rc = molt__state_save(pid, st, ATTACH_STATE_PAGE(st), err, errlen);
  /* post: every thread runs on, new calls go to the patch */
  if (rc == 0 && cbs.post.present) {
    molt__callbacks_post(pid, st, &cbs, st->code_start, o->callback_timeout_ms);
    rc = molt__state_save(pid, st, ATTACH_STATE_PAGE(st), err, errlen);
  }
  phase_end(st, "finish", &since);
  return rc;
}

/* ---- rollback ------------------------------------------------------------------- */

int molt__attach_func_live(pid_t pid, const molt__attach_func *f) {
  uint8_t now[MOLT__ATTACH_MAX_BYTES];
  if (molt__os_read(pid, f->at, now, f->len) != 0)
    return -1;
  if (memcmp(now, f->jump, f->len) == 0)
    return 1;
  return memcmp(now, f->orig, f->len) == 0 ? 0 : -1;
}

static bool in_code(const molt__attach_state *st, uint64_t v) {
  return v >= st->code_start && v < ATTACH_STATE_PAGE(st);
}

/* Whether a thread of s may still run the staged code: its ip or another
 * register, or a word of its stack (from sp to the top of the stack's
 * mapping: conservatively every word, return address or not) points into
 * it.  A stack molt cannot find or read counts as using it.  Returns the
 * thread's index or -1. */
static int code_in_use(const attach_stop *s, const molt__attach_state *st, attach_view *v,
                       const char **why) {
  for (size_t i = 0; i < s->n; i++) {
    const attach_regs *r = &s->t[i].regs;
    const uint64_t *w = (const uint64_t *)r;
    for (size_t k = 0; k < sizeof *r / 8; k++) {
      if (in_code(st, w[k])) {
        *why = molt__arch_ip(r) == w[k] ? "runs it" : "has a register pointing into it";
        return (int)i;
      }
    }
    attach_stack stack;
    bool hit = true;
    if (molt__stack_read(v, molt__arch_sp(r), &stack) == 0) {
      hit = false;
      for (size_t k = 0; k < stack.n && !hit; k++)
        hit = in_code(st, stack.w[k]);
      molt__stack_free(&stack);
    }
    if (hit) {
      *why = "has a return address (or a pointer) into it on its stack, or a stack "
             "molt cannot read";
      return (int)i;
    }
  }
  return -1;
}

/* Whether st's staged range still has a mapping of molt's in it. */
static bool staged_mapped(const attach_view *v, const molt__attach_state *st) {
  for (size_t m = 0; m < v->n; m++)
    if (v->maps[m].end > st->code_start && v->maps[m].start < st->code_end &&
        strstr(v->maps[m].path, "memfd:molt-attach"))
      return true;
  return false;
}

/* Pass 1 of the scan for pointers into st's code (scan.c): the staged
 * range itself and the state pages of every level are not looked in. */
static int scan_start(pid_t pid, const molt__attach_state *st, attach_scan *scan) {
  uint64_t skip[MOLT__ATTACH_MAX_LEVELS + 1][2];
  size_t nskip = 0;
  skip[nskip][0] = st->code_start;
  skip[nskip++][1] = st->code_end;
  molt__attach_stack all;
  char ignored[256];
  if (molt__attach_stack_load(pid, &all, ignored, sizeof ignored) == 0) {
    for (size_t i = 0; i < all.n && nskip < MOLT__ATTACH_MAX_LEVELS + 1; i++) {
      skip[nskip][0] = ATTACH_STATE_PAGE(&all.levels[i]);
      skip[nskip++][1] = all.levels[i].code_end;
    }
    molt__attach_stack_free(&all);
  }
  int rc = molt__scan_begin(scan, pid, st->code_start, ATTACH_STATE_PAGE(st),
                            (const uint64_t(*)[2])skip, nskip);
  if (rc)
    molt__scan_end(scan);
  return rc;
}

/* Why the code stays mapped: the word found (kept == 1), a stop that would
 * have read more memory than allowed (SCAN_OVER_LIMIT), or a scan that
 * could not be carried out.  The value is named by the patch's symbol
 * holding it, if its file can still be read. */
static void kept_note(pid_t pid, molt__attach_state *st, int kept,
                      const attach_scan *scan, const attach_found *found) {
  if (kept == SCAN_OVER_LIMIT) {
    snprintf(st->note, sizeof st->note,
             "kept mapped: the check for pointers into it would read over %llu MiB "
             "with every thread stopped (%s); molt rollback %d --scan-limit MIB "
             "unmaps it, stopping about 0.25 ms per MiB",
             (unsigned long long)(scan->over_limit >> 20),
             scan->concurrent ? "pages written meanwhile" : "no soft-dirty tracking",
             (int)pid);
    return;
  }
  if (kept != 1) {
    snprintf(st->note, sizeof st->note,
             "staged code kept mapped at %#llx: its memory could not be scanned for "
             "pointers into it (%s); molt rollback %d tries again",
             (unsigned long long)st->code_start, molt_strerror(kept), (int)pid);
    return;
  }
  if (found->value < st->code_start || found->value >= ATTACH_STATE_PAGE(st)) {
    snprintf(st->note, sizeof st->note,
             "kept mapped: the page at %#llx in %.48s cannot be read, and may hold a "
             "pointer into the patch; molt rollback %d tries again",
             (unsigned long long)found->at, found->where, (int)pid);
    return;
  }
  char what[96];
  snprintf(what, sizeof what, "patch offset %#llx",
           (unsigned long long)(found->value - st->code_start));
  molt__symtab *sym = NULL;
  const char *name = NULL;
  uintptr_t start = 0;
  if (found->value >= st->code_start && molt__symtab_open(st->patch, &sym) == 0 &&
      molt__symtab_at(sym, (uintptr_t)(found->value - st->code_start), &name, NULL,
                      &start, NULL, NULL) == 0 &&
      name)
    snprintf(what, sizeof what, "%.64s+%llu", name,
             (unsigned long long)(found->value - st->code_start - start));
  if (sym)
    molt__symtab_close(sym);
  snprintf(st->note, sizeof st->note,
           "kept mapped: a word at %#llx in %.48s points into the patch (%#llx %s); "
           "molt rollback %d unmaps it once unused",
           (unsigned long long)found->at, found->where, (unsigned long long)found->value,
           what, (int)pid);
}

/* Descriptors of a staged memfd left open in the target by a molt killed
 * between memfd_create and close (step 4; its record still says
 * "staging"): closed on stopped thread t, if its seccomp filters allow
 * it.  No run of molt holds one across its own end (the lock keeps two
 * from overlapping), so any found is a leak. */
static void close_leaked_memfds(pid_t pid, attach_thread *t, uint64_t insn) {
  char dir[64];
  molt__os_path(pid, "fd", dir, sizeof dir);
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char path[384], link[128];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0)
      continue;
    link[n] = '\0';
    if (strncmp(link, "/memfd:molt-attach", 18) != 0)
      continue;
    long fd = strtol(e->d_name, NULL, 10), r;
    char e2[200];
    attach_call close_it = {SYS_close, {(uint64_t)fd}};
    if (molt__seccomp_check(pid, t->tid, insn, &close_it, 1, e2, sizeof e2) == 0)
      rsys(t, insn, SYS_close, (uint64_t)fd, 0, 0, 0, 0, 0, &r, e2, sizeof e2);
  }
  if (d)
    closedir(d);
}

/* Pops patch st (loaded by the caller): its functions' bytes back, its
 * code unmapped once unused.  A level rolled back already (its code kept
 * mapped) only has its code looked at again: its entries may hold the
 * jumps of a patch stacked since. */
static int rollback_level(pid_t pid, int timeout_ms, molt__attach_state *st, char *err,
                          size_t errlen) {
  if (timeout_ms < 0)
    timeout_ms = MOLT__DEFAULT_TIMEOUT_MS;
  uint64_t since = molt__os_now_ns();
  st->nphases = 0;
  int rc = 0;
  bool restore = molt__levels_active(st);
  /* an attach killed in its staging step may have left the memfd open */
  bool was_staging = strcmp(st->phase, "staging") == 0;
  /* rolled back already, its code kept mapped: this run only reclaims it */
  bool reclaim = !restore;
  /* Every function must hold the jump or its original bytes: anything
   * else was written by someone else since, and is left alone. */
  for (size_t i = 0; restore && i < st->nfuncs; i++) {
    if (molt__attach_func_live(pid, &st->funcs[i]) < 0) {
      molt__errmsg(err, errlen,
                   "the entry of '%s' holds neither the attach's jump nor its original "
                   "bytes; not touched",
                   st->funcs[i].name);
      return MOLT_EIO;
    }
  }
  attach_view v;
  uint64_t insn = 0;
  rc = molt__view_open(pid, &v);
  if (rc == 0)
    rc = molt__os_find_syscall(pid, v.maps, v.n, &insn, err, errlen);
  attach_stop s;
  int attempts = 0, stepped = 0;
  if (rc == 0)
    rc = safe_point("nothing was changed", err, errlen);
  /* Pointers into the code kept in the target's memory: read once while
   * the threads run (scan.c), the pages written since read again in the
   * stop that decides (its cost is in the log entry). */
  attach_scan scan;
  bool scanning = false;
  int scan_rc = 0; /* a scan that cannot run keeps the code mapped */
  if (rc == 0 && staged_mapped(&v, st)) {
    scan_rc = scan_start(pid, st, &scan);
    scanning = scan_rc == 0;
  }
  phase_end(st, "prepare", &since);
  /* Restoring needs no thread out of the way: the jump is one instruction,
   * a thread is before it or past it. */
  if (rc == 0)
    rc = stop_clear(pid, NULL, false, timeout_ms, &s, &attempts, &stepped, err, errlen);
  if (rc) {
    if (scanning)
      molt__scan_end(&scan);
    molt__view_close(&v);
    return rc;
  }
  for (size_t i = 0; restore && rc == 0 && i < st->nfuncs; i++) {
    const molt__attach_func *f = &st->funcs[i];
    if (molt__attach_func_live(pid, f) == 1)
      rc = molt__os_write(pid, f->at, f->orig, f->len);
    if (rc)
      molt__errmsg(err, errlen, "cannot restore the entry of '%s'", f->name);
  }
  const char *why = NULL;
  int user = rc == 0 ? code_in_use(&s, st, &v, &why) : -1;
  /* The entries hold their old bytes again: nothing enters the staged code
   * any more, and threads still in it leave it.  Look again a few times
   * (backing off) within the timeout before keeping it mapped; the maps
   * are read again each time (new threads have new stacks). */
  uint64_t deadline = molt__os_now_ns() + (uint64_t)timeout_ms * 1000000u;
  /* (a SIGINT or SIGTERM of molt ends the wait: the functions are restored
   * already, the code stays mapped as after a timeout) */
  for (long backoff_us = 500; rc == 0 && user >= 0 && molt__os_now_ns() < deadline &&
                              !molt__interrupt_pending();) {
    /* looked at again after the back-off, and not before the thread in
     * the way has run (it would be found where it was) */
    pid_t waited = s.t[user].tid;
    uint64_t runs = 0;
    bool counted = molt__os_runs(pid, waited, &runs);
    molt__os_resume_all(&s);
    molt__os_wait_ran(pid, counted ? waited : 0, runs,
                      molt__os_now_ns() + (uint64_t)backoff_us * 1000u, deadline);
    if (backoff_us < 100000)
      backoff_us *= 2;
    molt__view_close(&v);
    rc = molt__view_open(pid, &v);
    if (rc == 0)
      rc = molt__os_stop_all(pid, &s, err, errlen);
    if (rc) {
      if (scanning)
        molt__scan_end(&scan);
      molt__view_close(&v);
      return rc;
    }
    attempts++;
    user = code_in_use(&s, st, &v, &why);
  }
  /* No thread runs it: does the memory still hold a pointer into it? */
  attach_found found;
  int kept = 0;
  if (rc == 0 && user < 0)
    kept = scanning ? molt__scan_finish(&scan, &s, &found) : scan_rc;
  const attach_map *maps = v.maps;
  size_t nmaps = v.n;
  bool unmapped = false, ours = true, any = false;
  /* Only the staged mapping goes: a range with anything else in it (the
   * attach was killed before it mapped there, and the program has mapped
   * something since) is left alone. */
  for (size_t m = 0; m < nmaps; m++) {
    if (maps[m].end <= st->code_start || maps[m].start >= st->code_end)
      continue;
    any = true;
    ours = ours && strstr(maps[m].path, "memfd:molt-attach") != NULL;
  }
  if (rc == 0 && user < 0 && any && ours && kept) {
    kept_note(pid, st, kept, &scan, &found);
  } else if (rc == 0 && user < 0 && !any) {
    unmapped = true; /* never mapped (killed while staging) */
  } else if (rc == 0 && user < 0 && !ours) {
    snprintf(st->note, sizeof st->note,
             "the staged range %#llx-%#llx holds other mappings; left alone",
             (unsigned long long)st->code_start, (unsigned long long)st->code_end);
    unmapped = true;
  } else if (rc == 0 && user < 0) {
    long r;
    char e2[200];
    /* a filter installed since the attach may refuse it */
    attach_call unmap = {SYS_munmap, {st->code_start, st->code_end - st->code_start}};
    unmapped =
        molt__seccomp_check(pid, s.t[0].tid, insn, &unmap, 1, e2, sizeof e2) == 0 &&
        rsys(&s.t[0], insn, SYS_munmap, st->code_start, st->code_end - st->code_start, 0,
             0, 0, 0, &r, e2, sizeof e2) == 0;
    if (!unmapped)
      snprintf(st->note, sizeof st->note, "staged code kept mapped: %s", e2);
  } else if (rc == 0) {
    char comm[64];
    molt__proc_name(pid, s.t[user].tid, comm, sizeof comm);
    snprintf(st->note, sizeof st->note,
             "staged code kept mapped at %#llx: thread %d (%s) %s; molt rollback %d "
             "again unmaps it once unused",
             (unsigned long long)st->code_start, (int)s.t[user].tid, comm, why, (int)pid);
  }
  if (rc == 0 && was_staging && s.n > 0)
    close_leaked_memfds(pid, &s.t[0], insn);
  st->threads = (int)s.n;
  molt__os_resume_all(&s);
  phase_end(st, "stop", &since);
  molt__view_close(&v);
  st->stop_ms = s.ms;
  st->attempts = attempts;
  st->time = (long long)time(NULL);
  snprintf(st->phase, sizeof st->phase, "rolled-back");
  if (rc)
    return rc;
  char cost[160] = "";
  if (scanning) {
    snprintf(cost, sizeof cost,
             " (memory scanned for pointers into it: %.1f MiB in %.1f ms while running, "
             "%.1f MiB in %.1f ms stopped)",
             (double)scan.bytes_run / (1 << 20), scan.ms_run,
             (double)scan.bytes_stop / (1 << 20), scan.ms_stop);
    molt__scan_end(&scan);
  }
  if (unmapped) {
    st->note[0] = '\0';
    molt__state_remove(pid, st->level);
    char msg[300];
    snprintf(msg, sizeof msg, "%s%s",
             reclaim ? "staged code unmapped"
                     : "functions restored, staged code unmapped",
             cost);
    molt__log_append(pid, reclaim ? "reclaim" : "rollback", st, msg);
    phase_end(st, "finish", &since);
    return 0;
  }
  if (!reclaim)
    molt__log_append(pid, "rollback", st, st->note);
  rc = molt__state_save(pid, st, ATTACH_STATE_PAGE(st), err, errlen);
  phase_end(st, "finish", &since);
  return rc;
}

/* molt rollback: pops the newest applied patch (or, with none applied,
 * tries again to unmap the code of popped ones), then tries the other
 * popped levels whose code was kept mapped. */
static int rollback_locked(pid_t pid, int timeout_ms, molt__attach_state *st, char *err,
                           size_t errlen) {
  int rc = molt__os_check_traceable(pid, err, errlen);
  if (rc == 0)
    rc = molt__attach_state_load(pid, st, err, errlen);
  if (rc == 0)
    rc = rollback_level(pid, timeout_ms, st, err, errlen);
  if (rc)
    return rc;
  molt__attach_stack rest;
  char ignored[256];
  if (molt__attach_stack_load(pid, &rest, ignored, sizeof ignored) != 0)
    return 0;
  for (size_t i = 0; i < rest.n; i++)
    if (!molt__levels_active(&rest.levels[i]) && rest.levels[i].level != st->level)
      rollback_level(pid, timeout_ms, &rest.levels[i], ignored, sizeof ignored);
  molt__attach_stack_free(&rest);
  return 0;
}

/* A failed run in the log: refused (nothing changed, or a rollback that
 * could not be carried out) or interrupted by a signal of molt's. */
static void log_failure(pid_t pid, int rc, molt__attach_state *st, const char *patch,
                        const char *what, const char *err) {
  if (rc == MOLT_ENOENT || rc == MOLT_EPERM || rc == MOLT_ENOHISTORY)
    return; /* no such process, no right to it, nothing to roll back */
  if (patch && !st->patch[0] && !realpath(patch, st->patch))
    snprintf(st->patch, sizeof st->patch, "%s", patch);
  char msg[600];
  snprintf(msg, sizeof msg, "%s: %s", what, err);
  molt__log_append(pid, molt__attach_interrupted() ? "interrupted" : "refused", st, msg);
}

/* A signal that came after the last safe point (while a callback ran, or
 * a rollback waited for threads) is taken here, before the signals are
 * unblocked, so the CLI reports the run and then ends with it instead of
 * dying silently; a failure says it was interrupted too. */
static void late_interrupt(int rc, char *err, size_t errlen) {
  bool before = molt__attach_interrupted() != 0;
  int sig = molt__interrupt_take();
  if (rc && sig && !before && !strstr(err, "interrupted by")) {
    const char *abbrev = sigabbrev_np(sig);
    size_t used = strlen(err);
    snprintf(err + used, errlen - used, "; then interrupted by SIG%s",
             abbrev ? abbrev : "?");
  }
}

/* The entry points: each holds the per-process lock for its whole run, so
 * a second molt cannot stage, write jumps or remove the record under it. */
int molt__attach(const molt__attach_opts *o, molt__attach_state *st, char *err,
                 size_t errlen) {
  /* A caller that may not trace the process is told that first. */
  int lock = molt__os_check_traceable(o->pid, err, errlen);
  if (lock == 0)
    lock = molt__state_lock(o->pid, err, errlen);
  if (lock < 0)
    return lock;
  sigset_t old;
  molt__interrupt_block(&old);
  molt__os_hurry();
  memset(st, 0, sizeof *st);
  int rc = attach_locked(o, st, err, errlen);
  late_interrupt(rc, err, errlen);
  if (rc == 0) {
    char msg[64];
    snprintf(msg, sizeof msg, "%d attempt%s", st->attempts, st->attempts == 1 ? "" : "s");
    molt__log_append(o->pid, "attach", st, msg);
  } else {
    log_failure(o->pid, rc, st, o->patch, "attach", err);
  }
  molt__os_unhurry();
  close(lock);
  molt__interrupt_restore(&old);
  return rc;
}

int molt__attach_rollback(pid_t pid, int timeout_ms, molt__attach_state *st, char *err,
                          size_t errlen) {
  int lock = molt__os_check_traceable(pid, err, errlen);
  if (lock == 0)
    lock = molt__state_lock(pid, err, errlen);
  if (lock < 0)
    return lock;
  sigset_t old;
  molt__interrupt_block(&old);
  molt__os_hurry();
  memset(st, 0, sizeof *st);
  int rc = rollback_locked(pid, timeout_ms, st, err, errlen);
  late_interrupt(rc, err, errlen);
  if (rc)
    log_failure(pid, rc, st, NULL, "rollback", err);
  molt__os_unhurry();
  close(lock);
  molt__interrupt_restore(&old);
  return rc;
}
