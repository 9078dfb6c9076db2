/* INIT of a new variable: v2 adds counter_x10 and big (INIT rules) and
 * fresh (no rule: keeps its initializer). */
#include "fu.h"

int counter = 5;
int counter_x10;
long big;
int fresh = 42;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2 counter=%d counter_x10=%d big=%ld fresh=%d\n", counter, counter_x10,
           big, fresh);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
