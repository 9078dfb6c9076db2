/* INIT of a new variable: v1 has `counter` only. */
#include "fu.h"

int counter = 5;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "inc")) {
    counter++;
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    printf("version=1 counter=%d\n", counter);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
