/* MOLT_PTRARRAY with an expression: over fields of the struct holding the
 * pointer (rows * cols), and over variables of the program (a member of a
 * settings struct, as memcached's settings.maxconns). */
#include "fu.h"

struct cell {
  int v;
  int extra; /* new */
};

struct config {
  int verbose;
  int nslots;
};

struct grid {
  int rows, cols;
  struct cell *cells MOLT_PTRARRAY(rows *cols);
};

struct config settings = {0, 4};
struct grid grid;
struct cell **slots; /* an array, but not said so */

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    int sum = 0, ssum = 0, extra = 0;
    for (int i = 0; i < grid.rows * grid.cols; i++)
      sum += grid.cells[i].v, extra += grid.cells[i].extra;
    for (int i = 0; i < settings.nslots; i++)
      ssum += slots[i]->v, extra += slots[i]->extra;
    printf("version=2 sum=%d ssum=%d extra=%d\n", sum, ssum, extra);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  if (!molt_is_updating()) {
    grid.rows = 2;
    grid.cols = 3;
    grid.cells = calloc(6, sizeof *grid.cells);
    for (int i = 0; i < 6; i++)
      grid.cells[i].v = i + 1;
    slots = calloc((size_t)settings.nslots, sizeof *slots);
    for (int i = 0; i < settings.nslots; i++) {
      slots[i] = calloc(1, sizeof **slots);
      slots[i]->v = 10 * (i + 1);
    }
  }
  fu_serve();
  return 0;
}
