/* A static array the program never writes: gcc places it in .rodata
 * although DWARF does not call it const (and .data.rel.ro for one holding
 * pointers).  The update must not write into it. */
#include "fu.h"

static int table[4] = {10, 20, 30, 40};
static const char *names[3] = {"one", "two", "three"};
static int counter;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "inc")) {
    counter++;
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
