/* MOLT_MIGRATE_LOCAL: main's `acc` changed type (new field `gen`), the
 * worker's `wl` did not. */
#include "fu.h"
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

struct acc {
  int sum;
  int cnt;
  int gen;
};

int main_restored = -1; /* main's own: written and read by main only */
/* Written by the worker when it (re)starts, read by main's "dump": relaxed
 * atomics, each a value on its own that publishes nothing else (the dump
 * is polled until the values it waits for show up). */
_Atomic int worker_restored = -1;
long worker_seen;
_Atomic long worker_first = -1; /* wl right after it was restored */

void *worker(void *arg) {
  long wl = 0;
  atomic_store_explicit(&worker_restored, MOLT_MIGRATE_LOCAL(wl), memory_order_relaxed);
  atomic_store_explicit(&worker_first, wl, memory_order_relaxed);
  for (;;) {
    molt_update_point("worker");
    wl++;
    /* relaxed: a progress value that publishes nothing else */
    __atomic_store_n(&worker_seen, wl, __ATOMIC_RELAXED);
    struct timespec ts = {0, 2000000L};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

int main(void) {
  int n = 0;
  struct acc acc = {0, 0, 0};
  main_restored = MOLT_MIGRATE_LOCAL(n) + MOLT_MIGRATE_LOCAL(acc);
  char line[256];
  for (;;) {
    molt_update_point("main");
    struct pollfd p = {0, POLLIN, 0};
    if (poll(&p, 1, 10) <= 0)
      continue;
    if (!fgets(line, sizeof line, stdin))
      _exit(0);
    int v;
    if (sscanf(line, "add %d", &v) == 1) {
      n++;
      acc.sum += v;
      acc.cnt++;
      printf("ok\n");
    } else if (!strncmp(line, "dump", 4)) {
      printf("version=2 n=%d sum=%d cnt=%d gen=%d main_restored=%d "
             "worker_restored=%d worker_first=%ld worker_seen=%ld\n",
             n, acc.sum, acc.cnt, acc.gen, main_restored,
             atomic_load_explicit(&worker_restored, memory_order_relaxed),
             atomic_load_explicit(&worker_first, memory_order_relaxed),
             __atomic_load_n(&worker_seen, __ATOMIC_RELAXED));
    } else if (!strncmp(line, "ping", 4)) {
      printf("pong\n");
    } else if (!strncmp(line, "quit", 4)) {
      printf("bye\n");
      fflush(stdout);
      _exit(0);
    } else {
      printf("error %s", line);
    }
    fflush(stdout);
  }
}

static int fu_handle(char *cmd) { return 0; }
