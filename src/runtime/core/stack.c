/*
 * core/stack.c -- reading the stack of another thread of the process
 * without stopping it, for proof.c (is a superseded patch still on some
 * stack?) and oldcode.c (is a replaced version 0 still on some stack?).
 *
 * A thread can be looked at only while it is blocked in the kernel: the
 * kernel reports its stack pointer and program counter in
 * /proc/self/task/T/syscall ("nr a1 .. a6 sp pc", or "-1 sp pc" when it
 * is blocked outside a system call; "running" when it is on a CPU, which
 * is never waited for: H10).  Its stack is then read from the stack
 * pointer up with process_vm_readv (a read that fails is an answer, not a
 * fault in the host).  The read is one moment of the thread's stack when
 * the same syscall line is read before and after it and the thread's
 * context-switch counts (/proc/self/task/T/status) did not change in
 * between: a thread that ran meanwhile and blocked again at the same place
 * was switched out once more, which counts.  A read that is not one
 * moment is tried again a few times, then given up (the caller asks again
 * later).  proof.c gives the argument for why a consistent read proves
 * something.
 *
 * Where the stack is: a registered thread's bounds were taken at its
 * registration (core/thread.c); an unregistered thread's stack is the
 * mapping that holds its stack pointer (/proc/self/maps), cached per
 * thread so that a thread costs one read of the maps, not one per look.
 * A stack pointer outside those bounds (sigaltstack, a coroutine's stack)
 * is "another stack": nothing is read.
 *
 * The cost is what a transition adds to the runtime thread (issue 14,
 * item 3): per blocked thread two reads of each file, and the status file
 * is opened only for a thread found blocked.
 *
 * Runtime thread only, under op_lock (the cache is not locked).
 */
#include "core/core.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define CONSISTENT_TRIES 4 /* attempts at one moment's read per look */

/* Unregistered threads: the mapping that held the stack pointer. */
typedef struct stack_cache {
  pid_t tid;
  uintptr_t lo, hi;
} stack_cache;
static stack_cache *cache;
static size_t ncache;

static int by_tid(const void *a, const void *b) {
  pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
  return (x > y) - (x < y);
}

size_t molt__stack_threads(pid_t **out) {
  *out = NULL;
  DIR *d = opendir("/proc/self/task");
  if (!d)
    return 0;
  pid_t self = molt__gettid(), *v = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    pid_t tid = (pid_t)atoi(e->d_name);
    if (tid <= 0 || tid == self)
      continue;
    if (n == cap) {
      size_t nc = cap ? cap * 2 : 16;
      pid_t *nv = realloc(v, nc * sizeof *nv);
      if (!nv)
        break;
      v = nv;
      cap = nc;
    }
    v[n++] = tid;
  }
  closedir(d);
  if (n)
    qsort(v, n, sizeof *v, by_tid);
  *out = v;
  return n;
}

bool molt__stack_has_tid(const pid_t *v, size_t n, pid_t tid) {
  /* (an empty list may be NULL, which bsearch must not be given) */
  return n && bsearch(&tid, v, n, sizeof tid, by_tid) != NULL;
}

void molt__stack_forget(const pid_t *live, size_t nlive) {
  /* A new thread may get a gone one's number, and another stack. */
  size_t kept = 0;
  for (size_t i = 0; i < ncache; i++)
    if (molt__stack_has_tid(live, nlive, cache[i].tid))
      cache[kept++] = cache[i];
  ncache = kept;
}

static bool read_at0(int fd, char *buf, size_t len) {
  ssize_t n = pread(fd, buf, len - 1, 0);
  if (n <= 0)
    return false;
  buf[n] = '\0';
  return true;
}

/* Voluntary + involuntary context switches from a status file. */
static bool switches(int fd, unsigned long long *out) {
  char buf[4096];
  if (!read_at0(fd, buf, sizeof buf))
    return false;
  const char *v = strstr(buf, "\nvoluntary_ctxt_switches:");
  const char *nv = strstr(buf, "\nnonvoluntary_ctxt_switches:");
  if (!v || !nv)
    return false;
  *out = strtoull(strchr(v, ':') + 1, NULL, 10) + strtoull(strchr(nv, ':') + 1, NULL, 10);
  return true;
}

/* The whole syscall line (compared as is) and its stack pointer and program
 * counter, the last two fields; false if the thread is running (or the
 * line is not understood). */
static bool syscall_at(int fd, char *line, size_t len, uintptr_t *sp, uintptr_t *pc) {
  if (!read_at0(fd, line, len) || strncmp(line, "running", 7) == 0)
    return false;
  const char *end = line + strlen(line);
  while (end > line && (end[-1] == '\n' || end[-1] == ' '))
    end--;
  const char *last = end;
  while (last > line && last[-1] != ' ')
    last--;
  if (last == line)
    return false;
  const char *prev = last - 1;
  while (prev > line && prev[-1] != ' ')
    prev--;
  if (prev == last - 1)
    return false;
  *sp = (uintptr_t)strtoull(prev, NULL, 16);
  *pc = (uintptr_t)strtoull(last, NULL, 16);
  return *sp != 0;
}

/* The mapping that holds sp (from /proc/self/maps), cached per thread. */
static bool mapping_of(pid_t tid, uintptr_t sp, uintptr_t *lo, uintptr_t *hi) {
  for (size_t i = 0; i < ncache; i++)
    if (cache[i].tid == tid && sp >= cache[i].lo && sp < cache[i].hi) {
      *lo = cache[i].lo;
      *hi = cache[i].hi;
      return true;
    }
  FILE *f = fopen("/proc/self/maps", "re");
  if (!f)
    return false;
  char line[512];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    /* "lo-hi perms ...": the two numbers (strtoul: sscanf costs ten times
     * as much, and the maps of a big program have thousands of lines). */
    char *dash;
    unsigned long a = strtoul(line, &dash, 16);
    if (*dash == '-') {
      unsigned long b = strtoul(dash + 1, NULL, 16);
      if (sp >= a && sp < b) {
        *lo = a;
        *hi = b;
        found = true;
      }
    }
    /* A line longer than the buffer: skip its rest. */
    while (!strchr(line, '\n') && fgets(line, sizeof line, f))
      ;
  }
  fclose(f);
  if (!found)
    return false;
  size_t i = 0;
  while (i < ncache && cache[i].tid != tid)
    i++;
  if (i == ncache) {
    stack_cache *n = realloc(cache, (ncache + 1) * sizeof *n);
    if (!n)
      return true;
    cache = n;
    ncache++;
  }
  cache[i] = (stack_cache){tid, *lo, *hi};
  return true;
}

int molt__stack_scan_blocked(pid_t tid, const molt__stack_scan *s, uint64_t *buf) {
  char path[64], line1[256], line2[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
  int fc = open(path, O_RDONLY | O_CLOEXEC);
  if (fc < 0)
    return MOLT__STACK_FAILED;
  int fs = -1, rc = MOLT__STACK_FAILED;
  uintptr_t sp, pc, sp2, pc2, slo = 0, shi = 0;
  /* The first look: is it blocked, and where is its stack?  A running
   * thread costs this one read. */
  if (!syscall_at(fc, line1, sizeof line1, &sp, &pc)) {
    rc = MOLT__STACK_RUNNING;
    goto out;
  }
  if (molt__thread_stack_of(tid, &slo, &shi)) {
    if (sp < slo || sp >= shi) {
      rc = MOLT__STACK_ELSEWHERE; /* on another stack than its own */
      goto out;
    }
  } else if (!mapping_of(tid, sp, &slo, &shi)) {
    goto out;
  }
  snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tid);
  if ((fs = open(path, O_RDONLY | O_CLOEXEC)) < 0)
    goto out;
  for (int attempt = 0; attempt < CONSISTENT_TRIES; attempt++) {
    unsigned long long c1, c2;
    /* (The first attempt uses the first look's line.) */
    if (attempt > 0 && !syscall_at(fc, line1, sizeof line1, &sp, &pc)) {
      rc = MOLT__STACK_RUNNING;
      break;
    }
    if (!switches(fs, &c1) || sp < slo || sp >= shi)
      break;
    uintptr_t top = shi;
    if (s->limit && shi - sp > s->limit) {
      if (!s->truncate)
        break; /* deeper than the caller can use: proves nothing */
      top = sp + s->limit;
    }
    s->reset(s->arg);
    s->hit(s->arg, pc);
    bool read_all = true;
    for (uintptr_t at = sp & ~(uintptr_t)7; at < top && read_all;) {
      size_t len = top - at < MOLT__STACK_BUF ? top - at : MOLT__STACK_BUF;
      struct iovec local = {buf, len}, remote = {(void *)at, len};
      ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
      if (got <= 0) {
        read_all = false;
        break;
      }
      for (size_t w = 0; w < (size_t)got / 8; w++)
        if (buf[w] >= s->min && buf[w] < s->max)
          s->hit(s->arg, (uintptr_t)buf[w]);
      at += (size_t)got;
    }
    if (!read_all)
      break;
    /* The same blocked state and no context switch in between: the words
     * are the thread's stack at one moment. */
    if (syscall_at(fc, line2, sizeof line2, &sp2, &pc2) && strcmp(line1, line2) == 0 &&
        switches(fs, &c2) && c1 == c2) {
      rc = MOLT__STACK_READ;
      break;
    }
  }
out:
  if (fs >= 0)
    close(fs);
  close(fc);
  return rc;
}
