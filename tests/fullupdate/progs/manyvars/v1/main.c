/* manyvars, version 1: every global migrates (see ../vars.h). */
#include "fu.h"
#include "../vars.h"

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "set")) {
    MANYVARS(MV_SET)
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    long sum = 0;
    int wrong = -1;
    MANYVARS(MV_CHECK)
    printf("version=1 sum=%ld first_wrong=%d\n", sum, wrong);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
