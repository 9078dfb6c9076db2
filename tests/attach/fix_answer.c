/* The attach patch of the tests: answer() multiplies by three (reading the
 * server's static `multiplier`), spin_copy() copies with memmove and
 * returns 2. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

extern long multiplier; /* static in server.c */

long answer(long n) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", n * (multiplier + 1));
  return strtol(buf, NULL, 10);
}

long spin_copy(void *dst, const void *src, long rounds, size_t n) {
  volatile long k = rounds;
  unsigned char *d = dst;
  const unsigned char *s = src;
  for (size_t i = 0; i < n; i++)
    d[i] = s[i];
  while (k > 0)
    k--;
  return 2;
}
