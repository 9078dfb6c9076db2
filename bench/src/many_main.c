/*
 * many — main() of the generated programs with N updatable functions
 * (start-up, PSU 5.2.4, and patch load, PSU 5.2.5).  See genfuncs.py.
 *
 *   many start           print t_main (CLOCK_MONOTONIC at main) and t_first
 *                        (after the first call of an updatable function
 *                        returned), then exit.  The runner took the clock
 *                        just before spawning us: t_main - t_spawn is
 *                        exec-to-main.
 *   many apply PATCH     (molt build) molt_apply() in-process, then call the
 *                        last function: prints apply_ns (molt_apply alone),
 *                        first_ns (request to the first call that returned
 *                        the new version) and dlopen_ns (the dynamic loader
 *                        alone, on a second private copy of the same patch,
 *                        for the breakdown).
 *   many wait            (molt build) print "ready <pid>", then call the last
 *                        function in a loop until it returns the new version
 *                        and print t_seen (CLOCK_MONOTONIC): `molt apply` from
 *                        outside is timed from the moment it was started.
 *                        Exits when stdin is closed.
 */
#define _GNU_SOURCE
#include "probe.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef PLAIN
#include "molt.h"
#endif

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#ifndef PLAIN
/* The dynamic loader's share of an apply: dlopen the same bytes under a new
 * inode (a copy in /tmp, so the loader cannot reuse the mapping molt made),
 * with the same flags molt uses.  The patch's imports stay unresolved (its
 * header is not looked at), which is exactly the loader's work. */
static uint64_t dlopen_ns(const char *path) {
  char tmp[] = "/tmp/molt-bench-dlopen-XXXXXX";
  int out = mkstemp(tmp);
  int in = open(path, O_RDONLY);
  if (out < 0 || in < 0)
    return 0;
  char buf[1 << 16];
  ssize_t n;
  while ((n = read(in, buf, sizeof buf)) > 0)
    if (write(out, buf, (size_t)n) != n)
      return 0;
  close(in);
  close(out);
  uint64_t t0 = mono_ns();
  void *h = dlopen(tmp, RTLD_NOW | RTLD_LOCAL);
  uint64_t t1 = mono_ns();
  unlink(tmp);
  if (!h)
    return 0;
  dlclose(h);
  return t1 - t0;
}
#endif

int main(int argc, char **argv) {
  uint64_t t_main = mono_ns();
  const char *mode = argc > 1 ? argv[1] : "start";
  if (strcmp(mode, "start") == 0) {
    int v = PROBE_FIRST(0);
    uint64_t t_first = mono_ns();
    printf("t_main=%llu t_first=%llu ok=%d\n", (unsigned long long)t_main,
           (unsigned long long)t_first, v == FIRST_OLD);
    return v == FIRST_OLD ? 0 : 1;
  }
#ifndef PLAIN
  if (strcmp(mode, "apply") == 0 && argc > 2) {
    /* Both probes once before (page faults, lazy binding).  They are direct
     * jumps to version 0: the thread is registered only by its first call
     * after the apply, on the dispatch path, and that is part of first_ns. */
    if (PROBE_FIRST(0) != FIRST_OLD || PROBE_LAST(0) != LAST_OLD)
      return 1;
    char err[512];
    uint64_t t0 = mono_ns();
    int rc = molt_apply(argv[2], MOLT_POLICY_IMMEDIATE, -1, err, sizeof err);
    uint64_t t1 = mono_ns();
    int v = PROBE_LAST(0);
    uint64_t t2 = mono_ns();
    if (rc != 0) {
      printf("error=%d msg=%s\n", rc, err);
      return 1;
    }
    int first = PROBE_FIRST(0);
    printf("apply_ns=%llu first_ns=%llu dlopen_ns=%llu ok=%d\n",
           (unsigned long long)(t1 - t0), (unsigned long long)(t2 - t0),
           (unsigned long long)dlopen_ns(argv[2]), v == LAST_NEW && first == FIRST_NEW);
    return v == LAST_NEW && first == FIRST_NEW ? 0 : 1;
  }
  if (strcmp(mode, "wait") == 0) {
    if (PROBE_LAST(0) != LAST_OLD)
      return 1;
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    /* PSU's patch-load program: an endless loop in main, calling. */
    while (PROBE_LAST(0) != LAST_NEW) {
    }
    uint64_t t_seen = mono_ns();
    printf("t_seen=%llu ok=%d\n", (unsigned long long)t_seen,
           PROBE_FIRST(0) == FIRST_NEW);
    fflush(stdout);
    /* Stay alive until the driver closes our stdin: the runtime answers
     * `molt apply` after the switch, and exiting now would cut that
     * answer off. */
    while (getchar() != EOF) {
    }
    return 0;
  }
#endif
  fprintf(stderr, "usage: many start | apply PATCH | wait\n");
  return 2;
}
