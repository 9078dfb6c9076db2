/* MOLT_PTRARRAY: a pointer to n elements, n a field of the same struct. */
#include "fu.h"

struct cell {
  int v;
};

struct bag {
  size_t n;
  struct cell *cells MOLT_PTRARRAY(n);
};

struct bag bag;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=1 n=%zu cells=", bag.n);
    for (size_t i = 0; i < bag.n; i++)
      printf("%d,", bag.cells[i].v);
    printf("\n");
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  bag.n = 5;
  bag.cells = malloc(bag.n * sizeof *bag.cells);
  for (size_t i = 0; i < bag.n; i++)
    bag.cells[i].v = (int)(i * i + 1);
  fu_serve();
  return 0;
}
