/* Stable entries: the jump at the address of every updatable function.
 *
 * Each entry is a 5-byte `jmp rel32` inside one aligned 8-byte word
 * (MOLT__ENTRY_STUB in molt/abi.h).  It jumps
 *   direct    to version 0, while every live generation maps the function
 *             to version 0: an updatable call then costs one direct jump
 *             and pins nothing (version 0 is part of a module that is never
 *             unloaded, so there is nothing to protect),
 *   patch     to the version of a patch, while every live generation maps
 *             the function to that same version: through a trampoline slot
 *             near the entry (`jmp *quad`, below), because a patch is
 *             loaded wherever dlopen puts it, out of reach of a rel32.  The
 *             call is not counted; before the patch can be unloaded,
 *             core/proof.c proves that no thread still runs its code, or
 *   dispatch  to the generation-table path (molt__enter/leave), which pins
 *             the generation it runs and honours per-thread views (policy
 *             local) -- needed while live generations disagree about the
 *             function, i.e. during a transition.
 * The runtime moves an entry to dispatch before it publishes a generation
 * that maps it to another version than the one it jumps to
 * (molt__entries_prepare, from gen.c), and to direct or patch once every
 * live generation agrees again (molt__entries_relax, told by gen.c what
 * they agree on: entries never ask the generations).  Both run under
 * molt__rt_lock, the only writer.
 *
 * Trampolines.  A slot is 8 bytes of code, `jmp *disp32(%rip)` (ff 25), in
 * an executable page mapped within reach of the entries' rel32, whose
 * operand is the slot's 8-byte quad in the data page right after it.  The
 * code is written once, when the page is made; only quads change, with
 * plain atomic stores (data, not code).  A quad holds the patch version
 * while its entry is in patch mode and the entry's dispatch path at every
 * other moment: a thread that took the entry's old jump to the slot but
 * had not yet executed the slot's jump when the entry left patch mode (it
 * was preempted between the two) then goes to the dispatch path, which is
 * always correct -- never into a patch that core/proof.c may have proved
 * unused after the entry moved away.  The stores that move entries away
 * from a version (to dispatch) are ordered before later calls of other
 * threads by the core-serializing membarrier their batch ends with (it is
 * a full barrier on every CPU running the process); a batch that moves
 * entries off the dispatch path needs none (molt__entries_relax).
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
 * path (guarantee H2 holds once the generation is published after it).  All
 * targets are correct at every moment in between: the dispatch path reads
 * the current generation, and direct or patch is only ever chosen when
 * every live generation maps the function to that version anyway.  That
 * is also why molt__entries_relax, which moves entries from the dispatch
 * path to direct or patch, ends without the barrier: a thread that keeps
 * the old jump (until its next interrupt or system call return, which
 * serialize its core) runs the dispatch path, as correct as the new one;
 * the same single-store instruction change, an unsynchronized window that
 * every rewrite had already.
 *
 * The text is made writable only for the store (mprotect to RWX on the
 * pages holding the entries, then back to the segment's protection); other
 * threads keep executing those pages meanwhile.  A system that forbids
 * writable+executable mappings makes the store fail: the patch is refused
 * with that reason and nothing changes.  (Trampoline pages are written
 * while still private and not executable, then made read+execute.)
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

enum { MODE_DIRECT, MODE_DISPATCH, MODE_ALWAYS_DISPATCH, MODE_PATCH };

/* A page of trampoline code and the page of quads after it. */
#define SLOT_SIZE 8
typedef struct tramp_page {
  uint8_t *code;            /* SLOTS_PER_PAGE slots of `jmp *quad`  */
  _Atomic(uintptr_t) *quad; /* code + page_size: one per slot        */
  uint32_t used;
} tramp_page;

typedef struct entry {
  uint8_t *at;    /* the jmp instruction (the function's address)      */
  void *direct;   /* version 0 (NULL: always dispatch)                  */
  void *dispatch; /* the generation-table path                          */
  void *body;     /* version 0 as generation tables hold it             */
  uint32_t seg;   /* index into segs: the executable segment holding at */
  uint8_t mode;
  void *patch;   /* MODE_PATCH: the version the slot's quad holds      */
  uint8_t *slot; /* its trampoline slot (NULL: none yet)               */
  _Atomic(uintptr_t) *quad;
} entry;

typedef struct segment {
  uintptr_t lo, hi; /* page-aligned span of an executable PT_LOAD */
  int prot;         /* its protection, restored after a write   */
} segment;

static entry *ents; /* indexed by function index (molt__rt_lock) */
static uint32_t nents, capents;
static uint32_t ndispatch; /* entries in MODE_DISPATCH                  */
static uint32_t nalways;   /* entries in MODE_ALWAYS_DISPATCH           */
static segment *segs;
static size_t nsegs;
static uintptr_t page_size;
static tramp_page *tramps;
static size_t ntramps;

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
    nalways += mode == MODE_ALWAYS_DISPATCH;
    ents[first + i] =
        (entry){at, d->direct, d->dispatch, d->body, seg, mode, NULL, NULL, NULL};
  }
  if (first + n > nents)
    nents = first + n;
  return 0;
}

/* ---- trampolines --------------------------------------------------------- */

/* The rel32 of `jmp` at `from` reaches `to` (with a page of margin). */
static bool reachable(const void *from, const void *to) {
  intptr_t d = (intptr_t)to - (intptr_t)from;
  return d > -(INT32_MAX - (intptr_t)page_size) && d < INT32_MAX - (intptr_t)page_size;
}

/* A new page pair within reach of `at`: asked for by address hints below
 * and above the entry's segment, 16 MiB apart, until the kernel places one
 * there (a hint is only a hint; a page elsewhere is given back). */
static tramp_page *new_tramp_page(const uint8_t *at) {
  const segment *sg = NULL;
  for (size_t s = 0; s < nsegs && !sg; s++)
    if ((uintptr_t)at >= segs[s].lo && (uintptr_t)at < segs[s].hi)
      sg = &segs[s];
  if (!sg)
    return NULL;
  tramp_page *n = realloc(tramps, (ntramps + 1) * sizeof *n);
  if (!n)
    return NULL;
  tramps = n;
  const uintptr_t step = (uintptr_t)16 << 20, len = 2 * page_size;
  for (int k = 1; k <= 96; k++) {
    uintptr_t off = (uintptr_t)((k + 1) / 2) * step;
    uintptr_t hint = k % 2 ? sg->lo - off - len : sg->hi + off;
    if (k % 2 && sg->lo < off + len)
      continue;
    uint8_t *p = mmap((void *)hint, len, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return NULL;
    if (!reachable(at, p) || !reachable(at, p + len)) {
      munmap(p, len);
      continue;
    }
    /* Every slot: jmp *disp32(%rip) to its quad (rip = slot + 6, quad =
     * slot + page_size), then two int3 bytes. */
    uint32_t nslots = (uint32_t)(page_size / SLOT_SIZE);
    int32_t disp = (int32_t)page_size - 6;
    for (uint32_t i = 0; i < nslots; i++) {
      uint8_t *c = p + (size_t)i * SLOT_SIZE;
      c[0] = 0xff;
      c[1] = 0x25;
      memcpy(c + 2, &disp, 4);
      c[6] = c[7] = 0xcc;
    }
    if (mprotect(p, page_size, PROT_READ | PROT_EXEC) != 0) {
      munmap(p, len);
      return NULL; /* no executable pages of our own: entries keep dispatching */
    }
    tramps[ntramps] = (tramp_page){p, (_Atomic(uintptr_t) *)(void *)(p + page_size), 0};
    return &tramps[ntramps++];
  }
  return NULL;
}

/* Gives entry e its slot (once: a slot is the entry's for good). */
static bool give_slot(entry *e) {
  if (e->slot)
    return true;
  tramp_page *tp = NULL;
  for (size_t i = 0; i < ntramps && !tp; i++)
    if (tramps[i].used < page_size / SLOT_SIZE && reachable(e->at, tramps[i].code) &&
        reachable(e->at, tramps[i].code + page_size))
      tp = &tramps[i];
  if (!tp && !(tp = new_tramp_page(e->at)))
    return false;
  uint32_t i = tp->used++;
  e->slot = tp->code + (size_t)i * SLOT_SIZE;
  e->quad = &tp->quad[i];
  /* Not reachable yet (no entry jumps to the slot): relaxed. */
  atomic_store_explicit(e->quad, (uintptr_t)e->dispatch, memory_order_relaxed);
  return true;
}

/* ---- writing -------------------------------------------------------------- */

/* Where an entry in `mode` jumps. */
static const void *target_of(const entry *e, uint8_t mode) {
  return mode == MODE_DIRECT ? e->direct : mode == MODE_PATCH ? e->slot : e->dispatch;
}

/* Rewrites the entries listed in idx[0..n) to modes[k] (patch: to
 * patches[k] through the entry's slot, which the caller gave it), one
 * segment at a time (one mprotect pair per segment and batch).  serialize:
 * end with the core-serializing membarrier (every batch that moves entries
 * away from where they jumped must; see molt__entries_relax for the one
 * that need not). */
static int write_entries(const uint32_t *idx, const uint8_t *modes, void *const *patches,
                         size_t n, bool serialize, char *err, size_t errlen) {
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
      uint8_t mode = modes[k];
      if (e->seg != s ||
          (e->mode == mode && (mode != MODE_PATCH || e->patch == patches[k])))
        continue;
      if (mode == MODE_PATCH) {
        /* The quad first, then the jump to the slot: a thread that fetches
         * the new jump finds the quad stored (x86 makes stores visible in
         * order; the membarrier below covers the rest).  relaxed: see the
         * file comment. */
        atomic_store_explicit(e->quad, (uintptr_t)patches[k], memory_order_relaxed);
        e->patch = patches[k];
      }
      molt__jmp_retarget(e->at, target_of(e, mode));
      if (e->mode == MODE_PATCH && mode != MODE_PATCH) {
        /* Leaving the patch: a thread still between the old jump and the
         * slot's goes to the dispatch path (file comment). */
        atomic_store_explicit(e->quad, (uintptr_t)e->dispatch, memory_order_relaxed);
        e->patch = NULL;
      }
      ndispatch += (mode == MODE_DISPATCH) - (e->mode == MODE_DISPATCH);
      e->mode = mode;
    }
    if (mprotect((void *)lo, hi - lo, segs[s].prot) != 0)
      molt__log(MOLT__EV_FAIL, 0, NULL,
                "cannot restore the protection of entry code at %p: it stays writable",
                (void *)lo);
  }
  /* Every thread executes a core-serializing instruction (and a full
   * memory barrier) before this returns: from here on no thread runs a
   * jump it fetched before the stores above, nor reads an old quad. */
  if (serialize)
    molt__sync_core();
  return rc;
}

int molt__entries_prepare(const molt__gen *g, char *err, size_t errlen) {
  uint32_t n = g->size < nents ? g->size : nents;
  uint32_t *idx = NULL;
  uint8_t *modes = NULL;
  size_t k = 0, cap = 0;
  for (uint32_t i = 0; i < n; i++) {
    const entry *e = &ents[i];
    if (!(e->mode == MODE_DIRECT && g->table[i] != e->body) &&
        !(e->mode == MODE_PATCH && g->table[i] != e->patch))
      continue;
    if (k == cap) {
      size_t nc = cap ? cap * 2 : 16;
      uint32_t *ni = realloc(idx, nc * sizeof *ni);
      if (ni)
        idx = ni;
      uint8_t *nm = ni ? realloc(modes, nc) : NULL;
      if (!nm) {
        free(idx);
        free(modes);
        molt__errmsg(err, errlen, "%s", molt_strerror(MOLT_ENOMEM));
        return MOLT_ENOMEM;
      }
      modes = nm;
      cap = nc;
    }
    modes[k] = MODE_DISPATCH;
    idx[k++] = i;
  }
  int rc = k ? write_entries(idx, modes, NULL, k, true, err, errlen) : 0;
  free(idx);
  free(modes);
  return rc;
}

void molt__entries_relax(void *const *agreed, molt__owner *const *owners, uint32_t n) {
  if (!ndispatch)
    return;
  uint32_t *idx = malloc(ndispatch * sizeof *idx);
  uint8_t *modes = malloc(ndispatch);
  void **patches = malloc(ndispatch * sizeof *patches);
  if (!idx || !modes || !patches) {
    free(idx);
    free(modes);
    free(patches);
    return; /* dispatch stays correct; the next reclamation tries again */
  }
  size_t k = 0;
  for (uint32_t i = 0; i < nents && k < ndispatch; i++) {
    entry *e = &ents[i];
    if (e->mode != MODE_DISPATCH)
      continue;
    void *v = i < n ? agreed[i] : e->body;
    if (v == e->body) {
      modes[k] = MODE_DIRECT;
    } else if (v && owners[i] && give_slot(e)) {
      modes[k] = MODE_PATCH;
      /* Calls reach the owner uncounted from now on: before it is
       * unloaded, core/proof.c must prove no thread runs it. */
      owners[i]->entered_directly = true;
      owners[i]->direct_code = v;
    } else {
      continue;
    }
    patches[k] = v;
    idx[k++] = i;
  }
  /* Not serialized: these entries leave the dispatch path, which stays
   * correct for as long as a thread keeps running the old jump it fetched
   * (and a thread that reads a patch slot's quad before the new value
   * reaches it reads the dispatch path, the value the quad holds outside
   * patch mode).  Nothing waits for threads to see these jumps: the next
   * move away from them (molt__entries_prepare, _hold) serializes, and
   * that is the moment proofs count from (core/proof.c).  One barrier (an
   * IPI to every CPU running the process) fewer per transition. */
  char err[256];
  if (k && write_entries(idx, modes, patches, k, false, err, sizeof err) < 0)
    molt__log(MOLT__EV_FAIL, 0, NULL, "entries stay on the dispatch path: %s", err);
  free(idx);
  free(modes);
  free(patches);
}

void molt__entries_hold(void) {
  if (ndispatch + nalways == nents)
    return; /* all of them dispatch already */
  uint32_t *idx = malloc(nents * sizeof *idx);
  uint8_t *modes = malloc(nents ? nents : 1);
  if (!idx || !modes) {
    free(idx);
    free(modes);
    return; /* a proof may take longer; nothing is wrong */
  }
  size_t k = 0;
  for (uint32_t i = 0; i < nents; i++)
    if (ents[i].mode == MODE_DIRECT || ents[i].mode == MODE_PATCH) {
      modes[k] = MODE_DISPATCH;
      idx[k++] = i;
    }
  char err[256];
  if (k && write_entries(idx, modes, NULL, k, true, err, sizeof err) < 0)
    molt__log(MOLT__EV_FAIL, 0, NULL, "entries could not all move to dispatch: %s", err);
  free(idx);
  free(modes);
}

const char *molt__entry_state(uint32_t index) {
  if (index >= nents)
    return "direct";
  switch (ents[index].mode) {
  case MODE_DIRECT:
    return "direct";
  case MODE_PATCH:
    return "patch";
  default:
    return "dispatch";
  }
}
