/* The checks and small helpers shared by the C test programs
 * (tests/README.md).  Each test program includes it once, from its own .c
 * file: it defines the program's failure counter.
 *
 *   CHECK(cond) or CHECK(cond, "format", args...)
 *       reports a false condition with its place (and the message) on
 *       stderr and counts it; the program goes on, and main returns
 *       non-zero when `failures` is.
 *   sleep_ms(ms), now_ns(), maps_count(needle)
 */
#ifndef MOLT_TESTS_CHECK_H
#define MOLT_TESTS_CHECK_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Failed checks.  Atomic because threads of a stress test check too; ++
 * on it is sequentially consistent, and nothing else is published through
 * it: a reader needs only the count. */
static atomic_int failures;

/* The message of a failed CHECK: ": message" when there is one, then the
 * end of the line.  CHECK passes it "" followed by its format (string
 * literals join), so a check without a message prints none. */
static inline void check_message(const char *fmt, ...) {
  if (fmt[0]) {
    va_list ap;
    fputs(": ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
  }
  fputc('\n', stderr);
}

#define CHECK(cond, ...)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "FAIL %s:%d: %s", __FILE__, __LINE__, #cond);                      \
      check_message("" __VA_ARGS__);                                                     \
      failures++;                                                                        \
    }                                                                                    \
  } while (0)

static inline void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Lines of /proc/self/maps that name `needle`. */
static inline int maps_count(const char *needle) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[4096];
  int n = 0;
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, needle))
      n++;
  if (f)
    fclose(f);
  return n;
}

#endif
