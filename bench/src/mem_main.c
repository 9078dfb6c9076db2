/*
 * mem — memory over many sequential patches (guarantee P6; PSU reclaims old
 * versions, and molt must too: H7).
 *
 *   mem PATCH_A PATCH_B COUNT EVERY
 *
 * Applies PATCH_A, PATCH_B, PATCH_A, ... COUNT times in-process
 * (molt_apply, policy immediate), checks after each apply that the new
 * version answers, and every EVERY patches prints a sample:
 *   sample <patches applied> <RSS KiB> <number of mappings>
 * Samples "before" (no patch yet) and "first" (one patch applied) are the
 * baselines; "final" is taken once the runtime has unloaded everything it
 * can (the number of mappings stops changing), so a leak of mappings or
 * memory shows as final - first.
 */
#define _GNU_SOURCE
#include "molt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The functions the patches replace: version() tells which patch runs;
 * work() is a second function so that a patch carries more than one. */
MOLT_FUNCTION(int, version, (void), ()) { return 0; }
MOLT_FUNCTION(int, work, (int x), (x)) { return x + 1; }

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "re");
  long size = 0, res = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &size, &res) != 2)
      res = 0;
    fclose(f);
  }
  return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static int mappings(void) {
  FILE *f = fopen("/proc/self/maps", "re");
  int n = 0, c;
  if (!f)
    return -1;
  while ((c = getc(f)) != EOF)
    n += c == '\n';
  fclose(f);
  return n;
}

static void sample(const char *tag, long applied) {
  printf("%s %ld %ld %d\n", tag, applied, rss_kib(), mappings());
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: mem PATCH_A PATCH_B COUNT EVERY\n");
    return 2;
  }
  long count = atol(argv[3]), every = atol(argv[4]);
  if (version() != 0 || work(1) != 2)
    return 1;
  sample("before", 0);
  char err[512];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 1; i <= count; i++) {
    int want = i % 2 ? 1 : 2;
    int rc = molt_apply(argv[i % 2 ? 1 : 2], MOLT_POLICY_IMMEDIATE, -1, err, sizeof err);
    if (rc != 0) {
      printf("error at patch %ld: %d %s\n", i, rc, err);
      return 1;
    }
    if (version() != want || work(1) != 1 + want * 10) {
      printf("error at patch %ld: wrong version %d\n", i, version());
      return 1;
    }
    if (i == 1)
      sample("first", 1);
    else if (i % every == 0)
      sample("sample", i);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  /* Let the runtime thread finish unloading: wait until the number of
   * mappings has not changed for 300 ms (at most 10 s). */
  int last = mappings(), stable = 0;
  for (int i = 0; i < 200 && stable < 6; i++) {
    usleep(50000);
    int m = mappings();
    stable = m == last ? stable + 1 : 0;
    last = m;
  }
  sample("final", count);
  printf("apply_loop_ns=%lld\n",
         (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
  return 0;
}
