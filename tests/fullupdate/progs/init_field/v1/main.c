/* INIT of a new struct field: struct item gains `price` in v2. */
#include "fu.h"

struct item {
  int id;
  int qty;
};

struct item items[3] = {{1, 10}, {2, 20}, {3, 30}};
struct item *single;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=1 i0=%d/%d i2=%d/%d single=%d/%d\n", items[0].id, items[0].qty,
           items[2].id, items[2].qty, single->id, single->qty);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  single = malloc(sizeof *single);
  single->id = 9;
  single->qty = 4;
  items[2].qty = 33; /* runtime state, not the initializer */
  fu_serve();
  return 0;
}
