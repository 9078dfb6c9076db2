/* The attach patch of the tests: answer() multiplies by three (reading the
 * server's static `multiplier`; strlen is one of libc's indirect
 * functions, found through the server's GOT), spin_copy() copies byte by
 * byte and returns 2. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern long multiplier; /* static in server.c */

long answer(long n) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", n * (multiplier + 1));
  if (strlen(buf) > 30)
    return -1;
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
