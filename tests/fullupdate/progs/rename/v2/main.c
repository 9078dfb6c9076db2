/* Variable rename: hits -> nhits, a static misses@main.c -> nmisses. */
#include "fu.h"

int nhits = -1;
static int nmisses = -1;
int *hp = &nhits;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "hit")) {
    nhits++;
    printf("ok\n");
  } else if (!strcmp(cmd, "miss")) {
    nmisses++;
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    printf("version=2 nhits=%d nmisses=%d via_hp=%d hp_is_nhits=%d\n", nhits, nmisses,
           *hp, hp == &nhits);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
