/* What a stopped thread's stack holds, read from outside: its words from
 * the stack pointer to the top of its mapping, and among them the signal
 * frames of handlers that have not returned yet.
 *
 * A thread interrupted by a signal has its ip (and its registers) saved in
 * a frame the kernel pushed onto its stack (or its alternate signal
 * stack); the handler's return address is the first word of that frame
 * and points at libc's restorer, which runs rt_sigreturn.  While the
 * handler runs, the thread's own ip is in the handler; the ip it goes back
 * to is in the frame.  So every word that points at the restorer's bytes
 * marks a frame, and the saved ip is read from it (attach.c checks it as
 * it checks the ips of the threads).  A stale word that merely looks like
 * a frame makes a check fail and retry, never pass wrongly. */
#include "attach/internal.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STACK_MAX (8u << 20) /* read at most this much of one stack */

/* The executable mappings alone: every word of every stack is looked up
 * among them during the stop (a handful, not the hundreds of mappings a
 * process with many threads has). */
static int index_exec(attach_view *v) {
  free(v->exec);
  v->exec = calloc(v->n ? v->n : 1, sizeof *v->exec);
  v->nexec = 0;
  if (!v->exec)
    return MOLT_ENOMEM;
  for (size_t i = 0; i < v->n; i++) {
    if (v->maps[i].x) {
      v->exec[v->nexec][0] = v->maps[i].start;
      v->exec[v->nexec++][1] = v->maps[i].end;
    }
  }
  return 0;
}

static bool in_exec(const attach_view *v, uint64_t addr) {
  size_t lo = 0, hi = v->nexec;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (addr < v->exec[mid][0])
      hi = mid;
    else if (addr >= v->exec[mid][1])
      lo = mid + 1;
    else
      return true;
  }
  return false;
}

int molt__view_open(pid_t pid, attach_view *v) {
  memset(v, 0, sizeof *v);
  v->pid = pid;
  /* One descriptor for every read of the check: opening /proc/PID/mem
   * (a ptrace access check) per stack would be most of its cost, and it
   * runs while every thread is stopped. */
  char path[64];
  molt__os_path(pid, "mem", path, sizeof path);
  v->mem = open(path, O_RDONLY | O_CLOEXEC);
  int rc = molt__os_maps(pid, &v->maps, &v->n);
  return rc ? rc : index_exec(v);
}

void molt__view_close(attach_view *v) {
  free(v->maps);
  free(v->exec);
  v->maps = NULL;
  v->exec = NULL;
  v->n = v->nexec = 0;
  if (v->mem >= 0)
    close(v->mem);
  v->mem = -1;
}

static int view_read(const attach_view *v, uint64_t addr, void *buf, size_t n) {
  if (v->mem < 0)
    return molt__os_read(v->pid, addr, buf, n);
  return pread(v->mem, buf, n, (off_t)addr) == (ssize_t)n ? 0 : MOLT_EIO;
}

/* The mapping holding addr: a binary search (the kernel lists mappings in
 * address order); every word of every stack is looked up during the
 * stop. */
const attach_map *molt__attach_map_at(const attach_view *v, uint64_t addr,
                                      size_t *index) {
  size_t lo = 0, hi = v->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (addr < v->maps[mid].start)
      hi = mid;
    else if (addr >= v->maps[mid].end)
      lo = mid + 1;
    else {
      if (index)
        *index = mid;
      return &v->maps[mid];
    }
  }
  return NULL;
}

int molt__stack_read(attach_view *v, uint64_t sp, attach_stack *out) {
  memset(out, 0, sizeof *out);
  const attach_map *m = molt__attach_map_at(v, sp, NULL);
  if (!m && !v->fresh) {
    /* a stack mapped since the maps were read (a new thread) */
    attach_map *maps;
    size_t n;
    int rc = molt__os_maps(v->pid, &maps, &n);
    if (rc)
      return rc;
    free(v->maps);
    v->maps = maps;
    v->n = n;
    v->fresh = true;
    rc = index_exec(v);
    if (rc)
      return rc;
    m = molt__attach_map_at(v, sp, NULL);
  }
  if (!m)
    return MOLT_ENOENT;
  uint64_t at = sp & ~(uint64_t)7;
  size_t len = (size_t)(m->end - at);
  if (len > STACK_MAX)
    len = STACK_MAX;
  out->w = malloc(len ? len : 8);
  if (!out->w)
    return MOLT_ENOMEM;
  int rc = view_read(v, at, out->w, len);
  if (rc) {
    molt__stack_free(out);
    return rc;
  }
  out->at = at;
  out->n = len / 8;
  return 0;
}

void molt__stack_free(attach_stack *s) {
  free(s->w);
  memset(s, 0, sizeof *s);
}

/* Whether addr is the first byte of a signal restorer: read once per
 * address and remembered (a handful of return addresses recur on every
 * thread's stack). */
static bool is_restorer(attach_view *v, uint64_t addr) {
  for (size_t i = 0; i < v->nrestorer; i++)
    if (v->restorer[i] == addr)
      return true;
  for (size_t i = 0; i < v->nother; i++)
    if (v->other[i] == addr)
      return false;
  const attach_map *m = molt__attach_map_at(v, addr, NULL);
  uint8_t code[ATTACH_RESTORER_LEN];
  bool yes = m && m->x && addr + sizeof code <= m->end &&
             view_read(v, addr, code, sizeof code) == 0 && molt__arch_is_restorer(code);
  if (yes && v->nrestorer < sizeof v->restorer / sizeof v->restorer[0])
    v->restorer[v->nrestorer++] = addr;
  else if (!yes && m && m->x) {
    /* once full, a slot chosen by the address: the cache only saves reads */
    size_t cap = sizeof v->other / sizeof v->other[0];
    v->other[v->nother < cap ? v->nother++ : (addr >> 4) % cap] = addr;
  }
  return yes;
}

size_t molt__stack_signal_words(attach_view *v, const attach_stack *s, unsigned word,
                                uint64_t *out, size_t max) {
  size_t found = 0;
  for (size_t k = 0; k + ATTACH_SIGFRAME_IP_WORD < s->n && found < max; k++) {
    if (!in_exec(v, s->w[k]) || !is_restorer(v, s->w[k]))
      continue;
    out[found++] = s->w[k + word];
  }
  return found;
}

size_t molt__stack_signal_ips(attach_view *v, const attach_stack *s, uint64_t *ips,
                              size_t max) {
  return molt__stack_signal_words(v, s, ATTACH_SIGFRAME_IP_WORD, ips, max);
}
