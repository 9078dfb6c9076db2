/*
 * linger — what the reclaimer's polling costs while an old generation
 * lingers (issue 14, item 3); run by bench/linger.sh under strace.
 *
 *   MOLT_COUNT_CALLS=1 linger PATCH_A PATCH_B
 *
 * Applies PATCH_A, starts a thread whose call of hold() (A's version,
 * counted: MOLT_COUNT_CALLS=1 keeps every call of a patch on the dispatch
 * path) sleeps 2 s, applies PATCH_B meanwhile, and waits for the call to
 * return: for those 2 s A's generation is retired but still running, and
 * the runtime thread polls (1 ms, doubling to 100 ms) until it is not.
 * linger.sh counts the membarrier calls (each an IPI to every CPU running
 * the process) over the run.
 */
#define _GNU_SOURCE
#include "molt.h"

#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

MOLT_FUNCTION(int, hold, (int ms), (ms)) {
  usleep((useconds_t)ms * 1000);
  return 0;
}

static void *holder(void *arg) {
  (void)arg;
  hold(2000);
  return NULL;
}

int main(int argc, char **argv) {
  char err[512];
  if (argc != 3) {
    fprintf(stderr, "usage: linger PATCH_A PATCH_B\n");
    return 2;
  }
  if (molt_apply(argv[1], MOLT_POLICY_IMMEDIATE, -1, err, sizeof err) != 0) {
    fprintf(stderr, "linger: %s\n", err);
    return 1;
  }
  usleep(100000);
  pthread_t th;
  if (pthread_create(&th, NULL, holder, NULL) != 0)
    return 1;
  usleep(100000);
  if (molt_apply(argv[2], MOLT_POLICY_IMMEDIATE, -1, err, sizeof err) != 0) {
    fprintf(stderr, "linger: %s\n", err);
    return 1;
  }
  pthread_join(th, NULL);
  usleep(300000);
  return 0;
}
