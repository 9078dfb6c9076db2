/* Three changes, no rules: struct entry (field added, field type),
 * total (int -> long), misses@main.c (int -> double). */
#include "fu.h"

struct entry {
  int key;
  long len;
  int hits;
};

struct entry *table;
long total;
static double misses;
int untouched;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "miss"))
    misses++;
  printf("version=2 total=%ld misses=%g\n", total, misses);
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
