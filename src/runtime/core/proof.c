/*
 * core/proof.c -- proofs that no thread still runs a superseded patch whose
 * functions were entered by a direct jump.
 *
 * Why a proof is needed.  Once every live generation agrees on a patch's
 * version of a function, its entry jumps straight to that version
 * (entry.c, "patch" mode): the call costs two jumps and is not counted.
 * When a later generation replaces or rolls back that version, the counters
 * (molt/abi.h) say nothing about those calls, so before the patch object is
 * unloaded the runtime must know by other means that no thread runs its
 * code (H1, H7), without stopping, signalling or blocking any thread (H10).
 *
 * When the question is asked.  An owner (a patch object) comes here from
 * reclamation when no live generation points into it any more
 * (molt__gen_reclaim).  From that moment T on no new call can reach its
 * code: every entry that jumped into it was moved to its dispatch path (or
 * elsewhere) by molt__entries_prepare, followed by a core-serializing
 * membarrier, before the generation that stopped using it was published,
 * and its trampoline quad was pointed at the dispatch path at the same time
 * (a thread between the entry and the slot goes there); dispatched calls
 * read generations, none of which names the owner; and nothing else may
 * hold a pointer into a patch (guide §6; a patch that lets one escape is
 * pinned and never unloaded).  So a thread that has no frame in the
 * owner's code at some moment after T never runs it again: it could only
 * come back by returning into a frame of it.  A frame of the owner is a
 * return address into its code on the thread's stack (its calls push
 * one; a tail call leaves none but also leaves the owner for good), or
 * the program counter itself, or an interrupted context saved by a signal
 * frame on the stack -- all words between the thread's stack pointer and
 * the top of its stack, or its program counter.
 *
 * A thread is proved out of owner O when, after T, one of these held:
 *   1. it is gone (not in /proc/self/task);
 *   2. it was blocked in the kernel and its stack held no word inside O's
 *      code, nor its program counter: the runtime thread reads the
 *      thread's stack pointer and program counter (/proc/self/task/T/syscall,
 *      which the kernel reports only for a task that is not running), its
 *      context-switch counts (/proc/self/task/T/status), its stack from the
 *      stack pointer to the top with process_vm_readv, then the syscall
 *      file and the counts again: same stack pointer and program counter,
 *      same counts means the thread did not run while its stack was read
 *      (to block again it would have had to be switched out, which
 *      counts), so the words read are the thread's whole stack at one
 *      moment (core/stack.c does the reading, for oldcode.c too).  Nothing
 *      is stopped or signalled; a read that fails or a thread that ran is
 *      simply asked again at the next pass;
 *   3. it checked its own stack, the same way, while running the dispatch
 *      path of any function, at molt_quiesce or at an update point
 *      (molt__thread_prove): it is running molt's code, not O's, so its
 *      frames are exactly the words from its current stack pointer to the
 *      top of its stack; it read the table of owners under proof (with
 *      acquire, after T) before reading its stack.  A thread that never
 *      blocks but calls updatable functions is proved here: while a proof
 *      waits for a thread that was found running, every entry takes its
 *      dispatch path (from 5 ms after the proof began -- most threads are
 *      proved by a read of their stack before -- for a second, then a
 *      second out of every 16: molt__entries_hold; for threads found
 *      blocked on another stack only the later seconds,
 *      molt__proof_holds_dispatch), and molt__proof_round changes at every
 *      pass, which makes the next dispatched call or point of every thread
 *      answer -- once per table: a thread whose answer about the current
 *      table found no owner on its stack is not asked again.
 * A thread that is in O (blocked inside it, or spinning in it) is never
 * proved out, and O stays mapped until it is (guarantee H1); a stale word
 * left in a live frame can keep O mapped longer than needed (conservative).
 *
 * Where the stack is.  A registered thread's stack bounds were taken at its
 * registration (pthread_getattr_np); an unregistered thread's stack is the
 * mapping that holds its stack pointer (/proc/self/maps, cached per thread
 * by core/stack.c).
 * A stack pointer outside the registered bounds (a signal handler on
 * sigaltstack, a coroutine's stack) proves nothing.  What this cannot see
 * -- frames on another stack than the one the thread runs on: stacks of
 * suspended coroutines or user-level threads (swapcontext), the
 * interrupted frames below a handler on sigaltstack of an unregistered
 * thread -- is why such programs set MOLT_COUNT_CALLS=1: entries then never
 * jump into patches, every call of a patch is counted, and no proof is
 * needed (guide §6).
 *
 * Owners never entered by a direct jump (counted all along) are released
 * at once, as before; so are owners whose release keeps their code mapped
 * anyway (keeps_code: a pinned patch), for which a proof would prove
 * nothing that matters.  At most PROOF_SLOTS owners are under proof at once
 * (a bit each in a thread's answer); while that many are pending, no new
 * owner is entered directly (molt__proof_accepts), so pending proofs are
 * bounded however many patches follow (P6).
 *
 * Runs on the runtime thread under op_lock (molt__proof_pass); application
 * threads only read the published ranges (a sequence lock) and write their
 * own answer.
 */
#include "core/core.h"

#include <link.h>
#include <stdlib.h>
#include <string.h>

#define PROOF_SLOTS 32                   /* bits of a thread's answer        */
#define RANGES 4                         /* executable segments per owner   */
#define HOLD_AFTER_NS 5000000ull         /* stacks alone for 5 ms, then     */
#define HOLD_NS 1000000000ull            /* entries dispatch for 1 s ...    */
#define HOLD_PERIOD_NS 16000000000ull    /* ... then 1 s out of every 16 s  */
#define STACK_MAX ((uintptr_t)256 << 20) /* deeper stacks prove nothing     */

MOLT__ATOMIC(uint32_t) molt__proof_round;

typedef struct pending {
  molt__owner *o;
  uintptr_t lo[RANGES], hi[RANGES];
  unsigned nr;
  pid_t *tids; /* threads not proved out yet (sorted) */
  size_t ntids;
  bool capture; /* take the thread list at the next pass */
  uint64_t since_ns;
} pending;

static pending table[PROOF_SLOTS]; /* runtime thread, op_lock */
static molt__owner *waiting;       /* released while the table was full */
static size_t nwaiting;
static bool count_calls; /* MOLT_COUNT_CALLS: never enter a patch uncounted */
/* The last pass found a thread to prove that was not blocked, or whose
 * stack could not be read at one moment (it ran meanwhile): a thread that
 * runs can only answer on the dispatch path or at a point. */
static bool running_unproved;
/* The last pass found a thread to prove blocked on another stack than its
 * own (its words prove nothing; it answers when it runs again). */
static bool elsewhere_unproved;

/* The code ranges of the table as application threads read them: written
 * under `seq` odd, stable while even (a sequence lock). */
static MOLT__ATOMIC(uint32_t) seq;
static MOLT__ATOMIC(uintptr_t) pub_lo[PROOF_SLOTS][RANGES], pub_hi[PROOF_SLOTS][RANGES];

void molt__proof_init(void) {
  const char *v = getenv("MOLT_COUNT_CALLS");
  count_calls = v && *v && strcmp(v, "0") != 0;
}

static size_t npending(void) {
  size_t n = nwaiting;
  for (unsigned k = 0; k < PROOF_SLOTS; k++)
    n += table[k].o != NULL;
  return n;
}

bool molt__proof_accepts(const molt__owner *o) {
  if (count_calls)
    return false;
  return o->entered_directly || o->keeps_code || npending() < PROOF_SLOTS;
}

/* Whether every entry is held on its dispatch path now.  The hold costs
 * every updatable call of every thread the dispatch path, and it only helps
 * a thread that runs: one found running answers on its next dispatched
 * call, so while one is unproved the hold starts 5 ms into the proof, for
 * a second, then a second out of every 16.  A thread blocked on another
 * stack cannot answer before it runs again, and then it most often blocks
 * on its own stack (read at the next pass) or passes a point: for it the
 * hold comes only in the later periods (the second from 16 s, from 32 s,
 * ...), which still bounds how long a thread that runs without blocking
 * or passing a point keeps a proof open.  (Under valgrind every blocked
 * thread is on another stack: before this, entries stayed on the dispatch
 * path until the slowest thread passed a point.) */
bool molt__proof_holds_dispatch(void) {
  if (!running_unproved && !elsewhere_unproved)
    return false;
  uint64_t now = molt__now_ns();
  for (unsigned k = 0; k < PROOF_SLOTS; k++) {
    uint64_t age = now - table[k].since_ns;
    if (!table[k].o || age < HOLD_AFTER_NS || age % HOLD_PERIOD_NS >= HOLD_NS)
      continue;
    if (running_unproved || age >= HOLD_PERIOD_NS)
      return true;
  }
  return false;
}

/* ---- the table as application threads see it -------------------------------*/

static void publish(void) {
  uint32_t s = atomic_load_explicit(&seq, memory_order_relaxed);
  atomic_store_explicit(&seq, s + 1, memory_order_relaxed);
  /* release fence: the odd value is visible before any range changes, so a
   * reader that saw a changed range sees seq changed when it checks. */
  atomic_thread_fence(memory_order_release);
  for (unsigned k = 0; k < PROOF_SLOTS; k++)
    for (unsigned r = 0; r < RANGES; r++) {
      bool on = table[k].o && r < table[k].nr;
      atomic_store_explicit(&pub_lo[k][r], on ? table[k].lo[r] : 0, memory_order_relaxed);
      atomic_store_explicit(&pub_hi[k][r], on ? table[k].hi[r] : 0, memory_order_relaxed);
    }
  /* release: the ranges happen before a reader's acquire load of s + 2. */
  atomic_store_explicit(&seq, s + 2, memory_order_release);
}

/* The span [*min, *max) of all the ranges (empty: min >= max). */
static void span_of(const uintptr_t (*lo)[RANGES], const uintptr_t (*hi)[RANGES],
                    uintptr_t *min, uintptr_t *max) {
  *min = UINTPTR_MAX;
  *max = 0;
  for (unsigned k = 0; k < PROOF_SLOTS; k++)
    for (unsigned r = 0; r < RANGES; r++)
      if (lo[k][r] < hi[k][r]) {
        *min = lo[k][r] < *min ? lo[k][r] : *min;
        *max = hi[k][r] > *max ? hi[k][r] : *max;
      }
}

/* Bit k for every slot k with an owner whose code holds address a. */
static uint32_t hits_of(uintptr_t a, const uintptr_t (*lo)[RANGES],
                        const uintptr_t (*hi)[RANGES]) {
  uint32_t hits = 0;
  for (unsigned k = 0; k < PROOF_SLOTS; k++)
    for (unsigned r = 0; r < RANGES; r++)
      if (a >= lo[k][r] && a < hi[k][r])
        hits |= 1u << k;
  return hits;
}

/* The calling thread checks its own stack (argument 3 of the file comment).
 * Not instrumented: it reads every word of its own stack, the sanitizers'
 * redzones between frames included. */
__attribute__((noinline, no_sanitize("address", "thread", "undefined"))) void
molt__thread_prove(void) {
  molt__thread *t = &molt__self;
  if (!t->viewp)
    return; /* registers on this very call, answers on the next */
  /* relaxed: any value that differs from the last one answered asks again. */
  t->proof_round = atomic_load_explicit(&molt__proof_round, memory_order_relaxed);
  /* acquire: pairs with publish's release; everything the runtime did
   * before publishing (the entries moved, the owners' generations freed:
   * time T of the file comment) happens before the stack read below. */
  uint32_t s = atomic_load_explicit(&seq, memory_order_acquire);
  if (s & 1)
    return; /* being changed: the next round asks again */
  /* Already answered about this very table, with no owner on the stack:
   * that answer stays true (a thread out of an owner after T never comes
   * back into it, file comment) and stays where the runtime reads it, so
   * a new round asks nothing of this thread until the table changes.
   * relaxed: only this thread writes its answer.  Rounds change at every
   * pass while a proof waits; without this a thread read its whole stack
   * at its next point or dispatched call after each of them. */
  uint64_t last = atomic_load_explicit(&t->proof_answer, memory_order_relaxed);
  if ((uint32_t)(last >> 32) == s && (uint32_t)last == 0)
    return;
  uintptr_t lo[PROOF_SLOTS][RANGES], hi[PROOF_SLOTS][RANGES], min, max;
  for (unsigned k = 0; k < PROOF_SLOTS; k++)
    for (unsigned r = 0; r < RANGES; r++) {
      lo[k][r] = atomic_load_explicit(&pub_lo[k][r], memory_order_relaxed);
      hi[k][r] = atomic_load_explicit(&pub_hi[k][r], memory_order_relaxed);
    }
  span_of((const uintptr_t(*)[RANGES])lo, (const uintptr_t(*)[RANGES])hi, &min, &max);
  /* acquire fence: the range loads above complete before seq is read again. */
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&seq, memory_order_relaxed) != s)
    return;
  uintptr_t slo, shi;
  molt__thread_own_stack(&slo, &shi);
  uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
  uint32_t hits = 0;
  if (!shi || sp < slo || sp >= shi) {
    hits = UINT32_MAX; /* not on its own stack: proves nothing */
  } else if (min < max) {
    for (const volatile uintptr_t *w = (const volatile uintptr_t *)(sp & ~(uintptr_t)7);
         (uintptr_t)(w + 1) <= shi; w++) {
      uintptr_t v = *w;
      if (v >= min && v < max)
        hits |=
            hits_of(v, (const uintptr_t(*)[RANGES])lo, (const uintptr_t(*)[RANGES])hi);
    }
  }
  /* release: the runtime reads it with acquire (nothing else is ordered by
   * it; the value is the whole message). */
  atomic_store_explicit(&t->proof_answer, (uint64_t)s << 32 | hits, memory_order_release);
}

/* ---- the runtime thread's side ------------------------------------------------*/

typedef struct find_code {
  uintptr_t at;
  pending *p;
} find_code;

static int code_ranges(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  find_code *f = data;
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum && !mine; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
    mine = ph->p_type == PT_LOAD && f->at >= lo && f->at < lo + ph->p_memsz;
  }
  if (!mine)
    return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
      continue;
    if (f->p->nr == RANGES) {
      /* More executable segments than we track: one range over them all
       * (conservative). */
      f->p->hi[RANGES - 1] = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
      continue;
    }
    f->p->lo[f->p->nr] = info->dlpi_addr + ph->p_vaddr;
    f->p->hi[f->p->nr++] = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
  }
  return 1;
}

/* Puts o under proof in a free slot; false if there is none. */
static bool admit(molt__owner *o) {
  for (unsigned k = 0; k < PROOF_SLOTS; k++) {
    pending *p = &table[k];
    if (p->o)
      continue;
    *p = (pending){.o = o, .capture = true, .since_ns = molt__now_ns()};
    find_code f = {(uintptr_t)o->direct_code, p};
    /* (The loader's lock: op_lock is above it, molt__rt_lock is not held.) */
    dl_iterate_phdr(code_ranges, &f);
    if (!p->nr) {
      /* Its code is not found (never happens while it is loaded): one
       * range around the version called directly keeps it mapped. */
      p->lo[0] = (uintptr_t)o->direct_code;
      p->hi[0] = p->lo[0] + 1;
      p->nr = 1;
    }
    return true;
  }
  return false;
}

static void drop(pending *p) {
  free(p->tids);
  *p = (pending){0};
}

static int by_tid(const void *a, const void *b) {
  pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
  return (x > y) - (x < y);
}

/* Thread tid is proved out of slot k's owner. */
static void proved(pending *p, pid_t tid) {
  pid_t *at = p->ntids ? bsearch(&tid, p->tids, p->ntids, sizeof tid, by_tid) : NULL;
  if (!at)
    return;
  memmove(at, at + 1, (size_t)(p->tids + p->ntids - at - 1) * sizeof *at);
  p->ntids--;
}

/* Argument 2 of the file comment: the owners a blocked thread's stack or
 * program counter names (core/stack.c reads it at one moment). */
typedef struct stack_hits {
  uint32_t hits;
  const uintptr_t (*lo)[RANGES], (*hi)[RANGES];
} stack_hits;

static void hits_reset(void *arg) { ((stack_hits *)arg)->hits = 0; }

static void hits_add(void *arg, uintptr_t word) {
  stack_hits *h = arg;
  h->hits |= hits_of(word, h->lo, h->hi);
}

typedef struct answers {
  uint32_t seq;
} answers;

/* Argument 3: the answers registered threads gave on their own. */
static void take_answer(void *arg, const molt__thread *t, pid_t tid) {
  answers *a = arg;
  /* acquire: pairs with the thread's release store of its answer. */
  uint64_t v =
      atomic_load_explicit(&((molt__thread *)t)->proof_answer, memory_order_acquire);
  if ((uint32_t)(v >> 32) != a->seq)
    return; /* an answer about another table (or none) */
  uint32_t hits = (uint32_t)v;
  for (unsigned k = 0; k < PROOF_SLOTS; k++)
    if (table[k].o && !table[k].capture && !(hits & (1u << k)))
      proved(&table[k], tid);
}

static void release_owner(molt__owner *o) {
  molt__rt_lock_acquire();
  /* A rollback may have taken it up again meanwhile: then it is live. */
  bool live = o->gen_refs != 0;
  if (!live)
    o->entered_directly = false; /* counted again until an entry jumps in */
  molt__rt_lock_release();
  if (!live)
    o->release(o);
}

size_t molt__proof_pass(molt__owner *released) {
  bool changed = false;
  /* Owners no generation points into any more: at once if every call was
   * counted, else under proof (a slot, or the waiting list). */
  while (released) {
    molt__owner *o = released;
    released = o->release_next;
    o->release_next = NULL;
    molt__rt_lock_acquire();
    bool direct = o->entered_directly;
    molt__rt_lock_release();
    if (!direct) {
      o->release(o);
      continue;
    }
    /* An owner whose release keeps its code mapped (a pinned patch) needs
     * no proof: a thread still in its code, or returning into it, runs
     * mapped code.  Released at once, so a transition that supersedes it
     * ends with the reclamation of its generation (no hold, no answers
     * asked of the threads: issue 14).  One already under proof (it could
     * only have become so while there) goes the usual way below. */
    bool in_table = false;
    for (unsigned k = 0; k < PROOF_SLOTS && !in_table; k++)
      in_table = table[k].o == o;
    if (o->keeps_code && !in_table) {
      release_owner(o);
      continue;
    }
    /* Taken up again by a rollback while under proof, and superseded
     * again: the proof starts over, and answers given before (about the
     * same table) no longer count -- a new table version. */
    bool again = false;
    for (unsigned k = 0; k < PROOF_SLOTS && !again; k++)
      if (table[k].o == o) {
        free(table[k].tids);
        table[k].tids = NULL;
        table[k].ntids = 0;
        table[k].capture = true;
        table[k].since_ns = molt__now_ns();
        again = changed = true;
      }
    if (!again) {
      o->release_next = waiting;
      waiting = o;
      nwaiting++;
    }
  }
  /* Admit waiting owners (oldest first would be nicer; any order is
   * correct). */
  while (waiting) {
    molt__owner *o = waiting;
    if (!admit(o))
      break;
    waiting = o->release_next;
    o->release_next = NULL;
    nwaiting--;
    changed = true;
  }
  if (changed)
    publish();
  bool any = false;
  for (unsigned k = 0; k < PROOF_SLOTS; k++)
    any |= table[k].o != NULL;
  if (!any) {
    molt__stack_forget(NULL, 0);
    running_unproved = elsewhere_unproved = false;
    return nwaiting;
  }
  pid_t *now;
  size_t nnow = molt__stack_threads(&now);
  /* The thread list of new proofs: every thread now (after T).  One that
   * starts later cannot reach the owner's code. */
  for (unsigned k = 0; k < PROOF_SLOTS; k++) {
    pending *p = &table[k];
    if (!p->o || !p->capture)
      continue;
    p->tids = nnow ? malloc(nnow * sizeof *p->tids) : NULL;
    if (nnow && !p->tids)
      continue; /* asked again at the next pass */
    if (nnow)
      memcpy(p->tids, now, nnow * sizeof *now);
    p->ntids = nnow;
    p->capture = false;
  }
  /* 1: gone.  3: answered on their own. */
  for (unsigned k = 0; k < PROOF_SLOTS; k++)
    for (size_t i = 0; table[k].o && i < table[k].ntids;)
      if (!molt__stack_has_tid(now, nnow, table[k].tids[i]))
        proved(&table[k], table[k].tids[i]);
      else
        i++;
  answers a = {atomic_load_explicit(&seq, memory_order_relaxed)};
  molt__threads_foreach(take_answer, &a);
  /* 2: blocked threads, each once for every owner it is not proved out of. */
  uintptr_t lo[PROOF_SLOTS][RANGES], hi[PROOF_SLOTS][RANGES];
  for (unsigned k = 0; k < PROOF_SLOTS; k++)
    for (unsigned r = 0; r < RANGES; r++) {
      bool on = table[k].o && r < table[k].nr;
      lo[k][r] = on ? table[k].lo[r] : 0;
      hi[k][r] = on ? table[k].hi[r] : 0;
    }
  stack_hits h = {0, (const uintptr_t(*)[RANGES])lo, (const uintptr_t(*)[RANGES])hi};
  molt__stack_scan scan = {
      .limit = STACK_MAX, .reset = hits_reset, .hit = hits_add, .arg = &h};
  span_of(h.lo, h.hi, &scan.min, &scan.max);
  uint64_t *buf = malloc(MOLT__STACK_BUF);
  running_unproved = elsewhere_unproved = false;
  /* Only threads some proof still waits for are looked at (the others
   * are gone or answered on their own above): no /proc read for them. */
  for (size_t i = 0; buf && i < nnow; i++) {
    bool wanted = false;
    for (unsigned k = 0; k < PROOF_SLOTS && !wanted; k++)
      wanted = table[k].o && !table[k].capture &&
               molt__stack_has_tid(table[k].tids, table[k].ntids, now[i]);
    if (!wanted)
      continue;
    int rc = molt__stack_scan_blocked(now[i], &scan, buf);
    if (rc != MOLT__STACK_READ) {
      if (rc == MOLT__STACK_ELSEWHERE)
        elsewhere_unproved = true;
      else
        running_unproved = true;
      continue;
    }
    for (unsigned k = 0; k < PROOF_SLOTS; k++)
      if (table[k].o && !table[k].capture && !(h.hits & (1u << k)))
        proved(&table[k], now[i]);
  }
  free(buf);
  molt__stack_forget(now, nnow);
  free(now);
  /* Owners every thread is proved out of are released. */
  changed = false;
  size_t left = nwaiting;
  for (unsigned k = 0; k < PROOF_SLOTS; k++) {
    pending *p = &table[k];
    if (!p->o)
      continue;
    if (p->capture || p->ntids) {
      left++;
      continue;
    }
    molt__owner *o = p->o;
    drop(p);
    changed = true;
    release_owner(o);
  }
  if (changed)
    publish();
  if (left)
    /* A new round: every thread's next dispatched call answers again.
     * relaxed: the answer carries the table's version, which is what the
     * answer is checked against. */
    atomic_fetch_add_explicit(&molt__proof_round, 1, memory_order_relaxed);
  return left;
}

/* In the child of fork() only the forking thread exists, with a copy of
 * its stack, under a new number: every proof takes the thread list again. */
void molt__proof_after_fork_child(void) {
  for (unsigned k = 0; k < PROOF_SLOTS; k++)
    if (table[k].o) {
      free(table[k].tids);
      table[k].tids = NULL;
      table[k].ntids = 0;
      table[k].capture = true;
    }
  molt__stack_forget(NULL, 0);
}
