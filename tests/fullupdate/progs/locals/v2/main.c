/* MOLT_MIGRATE_LOCAL: main's `acc` changed type (new field `gen`), the
 * worker's `wl` did not. */
#include "fu.h"
#include <pthread.h>
#include <time.h>

struct acc {
  int sum;
  int cnt;
  int gen;
};

int main_restored = -1, worker_restored = -1;
long worker_seen;
long worker_first = -1; /* wl right after it was restored */

void *worker(void *arg) {
  long wl = 0;
  worker_restored = MOLT_MIGRATE_LOCAL(wl);
  worker_first = wl;
  for (;;) {
    molt_update_point("worker");
    wl++;
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
             n, acc.sum, acc.cnt, acc.gen, main_restored, worker_restored,
             worker_first, __atomic_load_n(&worker_seen, __ATOMIC_RELAXED));
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
