/* The same array, but this version writes it ("set"): it is writable
 * here, read-only in v2, so its state cannot go across. */
#include "fu.h"

static int table[4] = {10, 20, 30, 40};
static const char *names[3] = {"one", "two", "three"};
static int counter;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "inc")) {
    counter++;
    printf("ok\n");
  } else if (!strcmp(cmd, "set")) {
    table[0] = 11;
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    printf("version=1 counter=%d elem=%d name=%s\n", counter, table[counter & 3],
           names[counter % 3]);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
