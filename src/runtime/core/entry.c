/* Stable entries: the jump at the address of every updatable function.
 *
 * Each entry is a 5-byte `jmp rel32` inside one aligned 8-byte word
 * (MOLT__ENTRY_STUB in molt/abi.h).  It jumps either
 *   direct    to version 0, while every live generation maps the function
 *             to version 0: an updatable call then costs one direct jump
 *             and pins nothing (version 0 is part of a module that is never
 *             unloaded, so there is nothing to protect), or
 *   dispatch  to the generation-table path (molt__enter/leave), which pins
 *             the generation it runs and honours per-thread views (policy
 *             local) -- needed as soon as some live generation holds
 *             another version.
 * The runtime moves an entry to dispatch before it publishes a generation
 * that replaces version 0 (molt__entries_prepare, from gen.c), and back to
 * direct once the last generation that replaced it is reclaimed
 * (molt__entries_relax, told by gen.c which functions some live generation
 * still replaces: entries never ask the generations).  Both run under
 * molt__rt_lock, the only writer.
 *
 * Cross-modifying code.  The new displacement is written with one atomic
 * 8-byte store into a word that holds the whole instruction (only the four
 * displacement bytes change; the opcode and the neighbouring bytes are
 * written back unchanged), so a thread that fetches the entry decodes
 * either the old or the new jump, never a mix.  It may still run the old
 * jump for a short while (prefetched code); a membarrier with SYNC_CORE
 * afterwards makes every thread of the process execute a core-serializing
 * instruction, after which all of them fetch the new one.  So when
 * molt__entries_prepare returns, every call that starts runs the dispatch
 * path (guarantee H2 holds once the generation is published after it).  Both
 * targets are correct at every moment in between: the dispatch path reads
 * the current generation, and direct is only ever chosen when that maps
 * the function to version 0 anyway.
 *
 * The text is made writable only for the store (mprotect to RWX on the
 * pages holding the entries, then back to the segment's protection); other
 * threads keep executing those pages meanwhile.  A system that forbids
 * writable+executable mappings makes the store fail: the patch is refused
 * with that reason and nothing changes.
 *
 * The instruction itself (its encoding, the 8-byte code stores) is
 * common/arch/x86_64/jump.h. */
#include "core/core.h"
#include "common/arch/x86_64/jump.h"

#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { MODE_DIRECT, MODE_DISPATCH, MODE_ALWAYS_DISPATCH };

typedef struct entry {
  uint8_t *at;    /* the jmp instruction (the function's address)      */
  void *direct;   /* version 0 (NULL: always dispatch)                  */
  void *dispatch; /* the generation-table path                          */
  void *body;     /* version 0 as generation tables hold it             */
  uint32_t seg;   /* index into segs: the executable segment holding at */
  uint8_t mode;
} entry;

typedef struct segment {
  uintptr_t lo, hi; /* page-aligned span of an executable PT_LOAD */
  int prot;         /* its protection, restored after a write   */
} segment;

static entry *ents; /* indexed by function index (molt__rt_lock) */
static uint32_t nents, capents;
static uint32_t ndispatch; /* entries in MODE_DISPATCH                  */
static segment *segs;
static size_t nsegs;
static uintptr_t page_size;

/* ---- executable segments ----------------------------------------------- */

static int add_segments(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  (void)data;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
      continue;
    uintptr_t lo = (info->dlpi_addr + ph->p_vaddr) & ~(page_size - 1);
    uintptr_t hi =
        (info->dlpi_addr + ph->p_vaddr + ph->p_memsz + page_size - 1) & ~(page_size - 1);
    bool known = false;
    for (size_t s = 0; s < nsegs && !known; s++)
      known = segs[s].lo == lo && segs[s].hi == hi;
    if (known)
      continue;
    segment *n = realloc(segs, (nsegs + 1) * sizeof *n);
    if (!n)
      return 1; /* stop: the caller sees the entry outside every segment */
    segs = n;
    segs[nsegs++] = (segment){lo, hi,
                              PROT_EXEC | (ph->p_flags & PF_R ? PROT_READ : 0) |
                                  (ph->p_flags & PF_W ? PROT_WRITE : 0)};
  }
  return 0;
}

static bool find_segment(uintptr_t a, uint32_t *seg) {
  for (size_t s = 0; s < nsegs; s++)
    if (a >= segs[s].lo && a + 8 <= segs[s].hi) {
      *seg = (uint32_t)s;
      return true;
    }
  return false;
}

/* ---- registration --------------------------------------------------------- */

int molt__entries_add(const molt__fn_desc *start, uint32_t first, uint32_t n, char *why,
                      size_t whylen) {
  if (!page_size)
    page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
  if (first + n > capents) {
    uint32_t cap = capents ? capents : 64;
    while (cap < first + n)
      cap *= 2;
    entry *e = realloc(ents, cap * sizeof *e);
    if (!e) {
      snprintf(why, whylen, "out of memory");
      return MOLT_ENOMEM;
    }
    ents = e;
    capents = cap;
  }
  bool rescanned = false;
  for (uint32_t i = 0; i < n; i++) {
    const molt__fn_desc *d = &start[i];
    uint8_t *at = d->entry;
    uint32_t seg;
    if (!find_segment((uintptr_t)at, &seg)) {
      /* A module loaded since the last scan: read the program headers
       * again, once per registration. */
      if (!rescanned) {
        dl_iterate_phdr(add_segments, NULL);
        rescanned = true;
      }
      if (!find_segment((uintptr_t)at, &seg)) {
        snprintf(why, whylen, "the entry of %s (%p) is not in an executable segment",
                 d->name, (void *)at);
        return MOLT_EINTERNAL;
      }
    }
    /* The instruction must lie inside one aligned 8-byte word (offset 0..3)
     * and be the long jmp to one of the two targets the descriptor names. */
    const uint8_t *target = molt__jmp_target(at);
    uint8_t mode;
    if (!molt__jmp_in_one_word(at) || !target)
      mode = 0xff;
    else if (d->direct && target == d->direct)
      mode = MODE_DIRECT;
    else if (target == d->dispatch)
      mode = d->direct ? MODE_DISPATCH : MODE_ALWAYS_DISPATCH;
    else
      mode = 0xff;
    if (mode == 0xff && molt__is_endbr64(at)) {
      snprintf(why, whylen,
               "the entry of %s (%s) starts with endbr64: updatable functions cannot be "
               "built with -fcf-protection (use -fcf-protection=none for their files)",
               d->name, d->tu);
      return MOLT_EINTERNAL;
    }
    if (mode == 0xff) {
      snprintf(why, whylen,
               "the entry of %s (%s) is not a molt entry jump (was %s built with "
               "another molt.h, or with options that add code to naked functions?)",
               d->name, d->tu, d->name);
      return MOLT_EINTERNAL;
    }
    if (mode == MODE_DISPATCH)
      ndispatch++; /* a fork child, or a module built with dispatch entries */
    ents[first + i] = (entry){at, d->direct, d->dispatch, d->body, seg, mode};
  }
  if (first + n > nents)
    nents = first + n;
  return 0;
}

/* ---- writing -------------------------------------------------------------- */

/* Rewrites the entries listed in idx[0..n) to `mode`, one segment at a
 * time (one mprotect pair per segment and batch). */
static int write_entries(const uint32_t *idx, size_t n, uint8_t mode, char *err,
                         size_t errlen) {
  int rc = 0;
  for (size_t s = 0; s < nsegs; s++) {
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (size_t k = 0; k < n; k++) {
      entry *e = &ents[idx[k]];
      if (e->seg != s)
        continue;
      uintptr_t a = (uintptr_t)e->at & ~(page_size - 1);
      uintptr_t b = ((uintptr_t)e->at + 8 + page_size - 1) & ~(page_size - 1);
      lo = a < lo ? a : lo;
      hi = b > hi ? b : hi;
    }
    if (lo >= hi)
      continue;
    if (mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) {
      int e = errno;
      molt__errmsg(err, errlen, "cannot make the entry code writable (mprotect: %s)",
                   strerror(e));
      rc = molt__from_errno(e);
      break; /* entries of earlier segments are rewritten: serialize below */
    }
    for (size_t k = 0; k < n; k++) {
      entry *e = &ents[idx[k]];
      if (e->seg != s || e->mode == mode)
        continue;
      molt__jmp_retarget(e->at, mode == MODE_DIRECT ? e->direct : e->dispatch);
      e->mode = mode;
      if (mode == MODE_DISPATCH)
        ndispatch++;
      else
        ndispatch--;
    }
    if (mprotect((void *)lo, hi - lo, segs[s].prot) != 0)
      molt__log(MOLT__EV_FAIL, 0, NULL,
                "cannot restore the protection of entry code at %p: it stays writable",
                (void *)lo);
  }
  /* Every thread executes a core-serializing instruction before this
   * returns: from here on no thread runs a jump it fetched before the
   * stores above. */
  molt__sync_core();
  return rc;
}

int molt__entries_prepare(const molt__gen *g, char *err, size_t errlen) {
  uint32_t n = g->size < nents ? g->size : nents;
  uint32_t *idx = NULL;
  size_t k = 0, cap = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (ents[i].mode != MODE_DIRECT || g->table[i] == ents[i].body)
      continue;
    if (k == cap) {
      size_t nc = cap ? cap * 2 : 16;
      uint32_t *ni = realloc(idx, nc * sizeof *ni);
      if (!ni) {
        free(idx);
        molt__errmsg(err, errlen, "%s", molt_strerror(MOLT_ENOMEM));
        return MOLT_ENOMEM;
      }
      idx = ni;
      cap = nc;
    }
    idx[k++] = i;
  }
  int rc = k ? write_entries(idx, k, MODE_DISPATCH, err, errlen) : 0;
  free(idx);
  return rc;
}

void molt__entries_relax(const uint32_t *replaced, uint32_t n) {
  if (!ndispatch)
    return;
  uint32_t *idx = malloc(ndispatch * sizeof *idx);
  if (!idx)
    return; /* dispatch stays correct; the next reclamation tries again */
  size_t k = 0;
  for (uint32_t i = 0; i < nents && k < ndispatch; i++)
    if (ents[i].mode == MODE_DISPATCH && (i >= n || replaced[i] == 0))
      idx[k++] = i;
  char err[256];
  if (k && write_entries(idx, k, MODE_DIRECT, err, sizeof err) < 0)
    molt__log(MOLT__EV_FAIL, 0, NULL, "entries stay on the dispatch path: %s", err);
  free(idx);
}

bool molt__entry_dispatching(uint32_t index) {
  return index < nents && ents[index].mode != MODE_DIRECT;
}
