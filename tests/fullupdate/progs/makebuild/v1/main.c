/* A program built with make CC="moltcc --molt-program". */
#include "fu.h"
#include "table.h"

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    int sum = 0, extra = 0;
    for (int i = 0; i < table.n; i++)
      sum += table.cells[i].v;
    printf("version=1 sum=%d extra=%d\n", sum, extra);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  if (!molt_is_updating())
    table_init(5);
  fu_serve();
  return 0;
}
