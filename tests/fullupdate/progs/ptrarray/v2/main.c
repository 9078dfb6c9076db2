/* MOLT_PTRARRAY: every element is transformed, not just the first. */
#include "fu.h"

struct cell {
  int v;
  int w;
};

struct bag {
  size_t n;
  struct cell *cells MOLT_PTRARRAY(n);
};

struct bag bag;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2 n=%zu cells=", bag.n);
    for (size_t i = 0; i < bag.n; i++)
      printf("%d/%d,", bag.cells[i].v, bag.cells[i].w);
    printf("\n");
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
