/*
 * fcall — the loop of the function-call benchmarks (PSU 5.2.1 and 5.2.2).
 *
 *   fcall ITERATIONS [THREADS [PATCH]]
 *
 * Each thread calls target(&its_value) ITERATIONS times and sums the
 * results.  With THREADS > 1 every thread dereferences its own variable on
 * its own cache line (as in the thesis: "the variable dereferenced by the
 * invoked function in each thread is unique"), so only the call mechanism can
 * make threads interfere.
 *
 * PATCH (molt build, -DVARIANT_MOLT, only): before the loop the program
 * applies this patch in-process (molt_apply, policy immediate).  It replaces
 * target, so the runtime moves target's stable entry from the direct jump
 * to version 0 onto the dispatch path (generation table, per-thread
 * counters) for the transition, and once the old generation is reclaimed
 * (a few ms) straight into the patch through a trampoline slot.  The
 * program checks that the entry's jump really changed (else it fails),
 * waits (at most 5 s) for the jump into the patch, and prints entry_moved=1
 * and entry=patch -- or entry=dispatch when the jump did not come (with
 * MOLT_COUNT_CALLS=1 every call stays on the dispatch path: the cost of a
 * call during a transition).
 *
 * Prints `loop_ns=<ns> best_ns=<ns> sum=<sum>`: loop_ns is the time of the
 * loops alone (from before the first thread starts to after the last one is
 * joined), which excludes process start-up and the apply; the runner
 * measures the whole process as well.  best_ns is the time per call of the
 * fastest chunk of the first thread's loop, which is cut into chunks of
 * 10,000 calls (fewer for short loops: at least 100 chunks): on a machine
 * shared with other jobs a run is often interrupted, and the fastest chunk
 * is the call's cost when nothing else got in the way.  Chunks are short
 * (microseconds), so that even with more threads than CPUs many of them run
 * without being preempted; the clock read per chunk is ~0.2% of a chunk.
 * The sum is printed so that the calls cannot be dropped.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int target(int *p);

#ifdef VARIANT_MOLT
#include "molt.h"

static int into_patch; /* the entry jumps straight into the patch */

/* Destination of the `jmp rel32` at target's stable entry. */
static const void *entry_dest(void) {
  const unsigned char *e = (const unsigned char *)(void *)&target;
  int32_t rel;
  if (e[0] != 0xe9)
    return NULL;
  memcpy(&rel, e + 1, sizeof rel);
  return e + 5 + rel;
}

static int apply_patch(const char *path) {
  const void *before = entry_dest();
  char err[512] = "";
  int rc = molt_apply(path, MOLT_POLICY_IMMEDIATE, -1, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "fcall: molt_apply(%s): %s: %s\n", path, molt_err_name(rc), err);
    return -1;
  }
  const void *after = entry_dest();
  if (!before || !after || before == after) {
    fprintf(stderr, "fcall: the patch is applied but target's entry still jumps to %p\n",
            after);
    return -1;
  }
  /* The transition ends when the entry jumps to a trampoline slot
   * (jmp *quad: ff 25). */
  for (int ms = 0; ms < 5000; ms++) {
    const unsigned char *d = entry_dest();
    if (d && d[0] == 0xff && d[1] == 0x25) {
      into_patch = 1;
      break;
    }
    if (getenv("MOLT_COUNT_CALLS"))
      break; /* it never comes */
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return 0;
}
#endif

#define CALL_TARGET(p) target(p)

#define MAX_THREADS 64

/* One cache line per thread: the value it dereferences and its result. */
typedef struct lane {
  int value;
  long sum;
  uint64_t best_chunk_ns; /* fastest full chunk */
  long chunk;             /* iterations per chunk */
} __attribute__((aligned(64))) lane;

static lane lanes[MAX_THREADS];
static long iterations;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *loop(void *arg) {
  lane *l = arg;
  long sum = 0;
  long chunk = iterations >= 100 ? iterations / 100 : iterations;
  if (chunk > 10000)
    chunk = 10000;
  uint64_t best = UINT64_MAX;
  for (long done = 0; done < iterations;) {
    long m = iterations - done < chunk ? iterations - done : chunk;
    uint64_t t0 = mono_ns();
    for (long i = 0; i < m; i++)
      sum += CALL_TARGET(&l->value);
    uint64_t dt = mono_ns() - t0;
    if (m == chunk && dt < best)
      best = dt;
    done += m;
  }
  l->sum = sum;
  l->best_chunk_ns = best;
  l->chunk = chunk;
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: fcall ITERATIONS [THREADS [PATCH]]\n");
    return 2;
  }
  int moved = 0;
  if (argc > 3) {
#ifdef VARIANT_MOLT
    if (apply_patch(argv[3]) != 0)
      return 1;
    moved = 1;
#else
    fprintf(stderr, "fcall: PATCH needs the molt build (-DVARIANT_MOLT)\n");
    return 2;
#endif
  }
  iterations = atol(argv[1]);
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  if (threads < 1 || threads > MAX_THREADS)
    return 2;
  for (int i = 0; i < threads; i++)
    lanes[i].value = i + 1;
  pthread_t th[MAX_THREADS];
  uint64_t t0 = mono_ns();
  if (threads == 1) {
    loop(&lanes[0]); /* the thesis's single-threaded program: no extra thread */
  } else {
    for (int i = 0; i < threads; i++)
      if (pthread_create(&th[i], NULL, loop, &lanes[i]) != 0)
        return 1;
    for (int i = 0; i < threads; i++)
      pthread_join(th[i], NULL);
  }
  uint64_t t1 = mono_ns();
  long sum = 0;
  for (int i = 0; i < threads; i++)
    sum += lanes[i].sum;
  const char *entry = "";
#ifdef VARIANT_MOLT
  if (moved)
    entry = into_patch ? " entry=patch" : " entry=dispatch";
#endif
  printf("loop_ns=%llu best_ns=%.4f sum=%ld%s%s\n", (unsigned long long)(t1 - t0),
         lanes[0].chunk ? (double)lanes[0].best_chunk_ns / (double)lanes[0].chunk : 0.0,
         sum, moved ? " entry_moved=1" : "", entry);
  return 0;
}
