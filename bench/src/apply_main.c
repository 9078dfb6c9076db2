/*
 * apply_cost — what one hot-patch transition costs (issue 14, item 3).
 *
 *   apply_cost PATCH_A PATCH_B COUNT GAP_MS BUSY BLOCKING
 *
 * BUSY threads call work() in a tight loop and never block; BLOCKING
 * threads call work() and then sleep 200 us, over and over (a server's
 * workers, mostly asleep in the kernel).  The main thread applies PATCH_A,
 * PATCH_B, PATCH_A, ... COUNT times in-process (molt_apply, policy
 * immediate; mem_patch.c: each replaces version() and work()), and after
 * each apply waits until work()'s entry jumps into the patch again (a
 * trampoline slot, `jmp *quad`: the transition is over -- the old
 * generation is reclaimed, the superseded patch proved unused), then
 * GAP_MS more.
 *
 * Prints one line per apply, `apply <us> <settle_us>` (the molt_apply call;
 * from its start to the end of the transition), then
 *   rt_cpu_ns=<ns>     CPU time of the runtime thread over the whole loop
 *   calls=<n>          work() calls made by all workers over the loop
 *   loop_ns=<ns>
 * The driver (apply_cost.py) runs it against several libmolt builds in
 * one run and takes medians and spreads.
 */
#define _GNU_SOURCE
#include "molt.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

MOLT_FUNCTION(int, version, (void), ()) { return 0; }
MOLT_FUNCTION(int, work, (int x), (x)) { return x + 1; }

#define MAX_WORKERS 64

typedef struct lane {
  atomic_long calls;
  int blocking;
} __attribute__((aligned(64))) lane;

static lane lanes[MAX_WORKERS];
static atomic_int stop;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *worker(void *arg) {
  lane *l = arg;
  long sum = 0, n = 0;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    sum += work((int)n);
    n++;
    if (l->blocking) {
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL);
    }
    if ((n & 255) == 0 || l->blocking)
      atomic_store_explicit(&l->calls, n, memory_order_relaxed);
  }
  atomic_store_explicit(&l->calls, n, memory_order_relaxed);
  return (void *)(intptr_t)(sum & 1);
}

/* Where the `jmp rel32` at work's entry goes. */
static const unsigned char *entry_dest(void) {
  const unsigned char *e = (const unsigned char *)(void *)&work;
  int32_t rel;
  if (e[0] != 0xe9)
    return NULL;
  memcpy(&rel, e + 1, sizeof rel);
  return e + 5 + rel;
}

static int in_patch(void) {
  const unsigned char *d = entry_dest();
  return d && d[0] == 0xff && d[1] == 0x25;
}

/* CPU time of the thread named molt-runtime (schedstat, ns). */
static uint64_t runtime_cpu_ns(void) {
  DIR *d = opendir("/proc/self/task");
  uint64_t ns = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    char path[320], comm[32] = "";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "re");
    if (!f)
      continue;
    if (!fgets(comm, sizeof comm, f))
      comm[0] = '\0';
    fclose(f);
    if (strncmp(comm, "molt-runtime", 12) != 0)
      continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
    f = fopen(path, "re");
    unsigned long long v = 0;
    if (f && fscanf(f, "%llu", &v) == 1)
      ns = v;
    if (f)
      fclose(f);
  }
  if (d)
    closedir(d);
  return ns;
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: apply_cost PATCH_A PATCH_B COUNT GAP_MS BUSY BLOCKING\n");
    return 2;
  }
  long count = atol(argv[3]);
  int gap_ms = atoi(argv[4]), busy = atoi(argv[5]), blocking = atoi(argv[6]);
  if (busy < 0 || blocking < 0 || busy + blocking > MAX_WORKERS)
    return 2;
  if (version() != 0 || work(1) != 2)
    return 1;
  pthread_t th[MAX_WORKERS];
  int nth = busy + blocking;
  for (int i = 0; i < nth; i++) {
    lanes[i].blocking = i >= busy;
    if (pthread_create(&th[i], NULL, worker, &lanes[i]) != 0)
      return 1;
  }
  char err[512];
  uint64_t cpu0 = runtime_cpu_ns(), t0 = mono_ns();
  for (long i = 1; i <= count; i++) {
    int want = i % 2 ? 1 : 2;
    uint64_t a = mono_ns();
    int rc = molt_apply(argv[i % 2 ? 1 : 2], MOLT_POLICY_IMMEDIATE, -1, err, sizeof err);
    uint64_t b = mono_ns();
    if (rc != 0) {
      printf("error at patch %ld: %d %s\n", i, rc, err);
      return 1;
    }
    if (version() != want) {
      printf("error at patch %ld: wrong version %d\n", i, version());
      return 1;
    }
    /* The end of the transition: work's entry jumps into the patch. */
    while (!in_patch() && mono_ns() - a < 5000000000ull) {
      struct timespec ts = {0, 100000};
      nanosleep(&ts, NULL);
    }
    uint64_t c = mono_ns();
    printf("apply %.1f %.1f%s\n", (b - a) / 1e3, (c - a) / 1e3,
           in_patch() ? "" : " stuck");
    struct timespec gap = {gap_ms / 1000, (long)(gap_ms % 1000) * 1000000L};
    nanosleep(&gap, NULL);
  }
  uint64_t t1 = mono_ns(), cpu1 = runtime_cpu_ns();
  atomic_store(&stop, 1);
  long calls = 0;
  for (int i = 0; i < nth; i++) {
    pthread_join(th[i], NULL);
    calls += atomic_load(&lanes[i].calls);
  }
  printf("rt_cpu_ns=%llu\ncalls=%ld\nloop_ns=%llu\n", (unsigned long long)(cpu1 - cpu0),
         calls, (unsigned long long)(t1 - t0));
  return 0;
}
