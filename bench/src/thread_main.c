/*
 * threads — thread creation and destruction (PSU 5.2.3).
 *
 *   threads ITERATIONS [call|idle] [PATCH]
 *
 * A loop creates a thread and joins it, ITERATIONS times; the thread calls
 * bump(), which increments a global counter (the thesis's "simple thread
 * function that increments a global counter").  In the molt build bump() is
 * updatable.  While no patch replaces it, its stable entry jumps straight to
 * version 0, so the thread's call is a direct jump and the thread is never
 * registered with the runtime.  With `idle` the thread does not call bump():
 * the pure cost of being a thread of a molt program.
 *
 * PATCH (molt build only): before the loop the program applies this patch
 * in-process (thread_patch.c, molt_apply, policy immediate); it replaces
 * bump, whose entry then takes the dispatch path, so every new thread is
 * registered on its first call of bump (mutex, list insert,
 * pthread_setspecific) and unregistered at exit: the per-thread cost of a
 * program with a live patch.
 *
 * Prints loop_ns (the create/join loop alone), best_ns (per thread, the
 * fastest chunk of 50 create+joins: the cost when no other job on the machine
 * got in the way; see fcall_main.c) and the counter.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void bump(void);
extern long counter;

#ifndef VARIANT_PLAIN
#include "molt.h"
#endif

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *with_call(void *arg) {
  bump();
  return arg;
}

static void *without_call(void *arg) {
  __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
  return arg;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: threads ITERATIONS [call|idle] [PATCH]\n");
    return 2;
  }
  long n = atol(argv[1]);
  void *(*fn)(void *) =
      argc > 2 && strcmp(argv[2], "idle") == 0 ? without_call : with_call;
  if (argc > 3) {
#ifndef VARIANT_PLAIN
    char err[512] = "";
    int rc = molt_apply(argv[3], MOLT_POLICY_IMMEDIATE, -1, err, sizeof err);
    if (rc != 0) {
      fprintf(stderr, "threads: molt_apply(%s): %s: %s\n", argv[3], molt_err_name(rc),
              err);
      return 1;
    }
#else
    fprintf(stderr, "threads: PATCH needs the molt build\n");
    return 2;
#endif
  }
  const long chunk = 50;
  uint64_t best = UINT64_MAX;
  uint64_t t0 = mono_ns(), tc = t0;
  for (long i = 0; i < n; i++) {
    pthread_t th;
    if (pthread_create(&th, NULL, fn, NULL) != 0)
      return 1;
    pthread_join(th, NULL);
    if ((i + 1) % chunk == 0) {
      uint64_t now = mono_ns();
      if (now - tc < best)
        best = now - tc;
      tc = now;
    }
  }
  uint64_t t1 = mono_ns();
  printf("loop_ns=%llu best_ns=%.1f counter=%ld\n", (unsigned long long)(t1 - t0),
         best == UINT64_MAX ? 0.0 : (double)best / chunk, counter);
  return counter == n ? 0 : 1;
}
