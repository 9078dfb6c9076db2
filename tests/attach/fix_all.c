/* The attach patch of the attach --all tests: answer() multiplies by three,
 * as in fix_answer.c; park() is replaced too, so that a process with a
 * thread parked inside park()'s first bytes cannot take the patch. */
#include <stdio.h>
#include <stdlib.h>

extern long multiplier; /* static in server.c */

long answer(long n) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", n * (multiplier + 1));
  return strtol(buf, NULL, 10);
}

long park(long nr) { return nr ? 0 : -1; }
