/* An attach patch that calls the C library's atol: server_statics.c has a
 * static atol of its own (it answers 7777), which must not be bound in its
 * place; with a preloaded library that defines atol (interpose.c), the
 * program's binding -- the preloaded one -- is the patch's too. */
#include <stdio.h>

long atol(const char *s);

long answer(long n) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", n * 3);
  return atol(buf);
}
