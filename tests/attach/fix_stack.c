/* The second attach patch of the stacking tests, stacked on fix_answer.c:
 * answer() multiplies by four (replacing fix_answer.c's version of it), and
 * banner() -- which fix_answer.c does not replace -- says "patched-b". */
#include <stdio.h>
#include <stdlib.h>

extern long multiplier; /* static in server.c */

long answer(long n) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", n * (multiplier + 2));
  return strtol(buf, NULL, 10);
}

const char *banner(void) { return "patched-b"; }
