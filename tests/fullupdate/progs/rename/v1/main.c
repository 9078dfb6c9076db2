/* Variable rename: hits -> nhits, a static misses@main.c -> nmisses. */
#include "fu.h"

int hits;
static int misses;
int *hp = &hits; /* a pointer to the renamed variable */

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "hit")) {
    hits++;
    printf("ok\n");
  } else if (!strcmp(cmd, "miss")) {
    misses++;
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    printf("version=1 hits=%d misses=%d via_hp=%d\n", hits, misses, *hp);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
