/* A build that changes migrated types without transformers is refused. */
#include "fu.h"

struct entry {
  int key;
  int len;
};

struct entry *table;
int total;
static int misses;
int untouched;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "miss"))
    misses++;
  printf("version=1 total=%d misses=%d\n", total, misses);
  return 1;
}

int main(void) {
  table = calloc(4, sizeof *table);
  fu_serve();
  return 0;
}
