/* INIT of a new struct field: struct item gains `price`. */
#include "fu.h"

struct item {
  int id;
  int qty;
  int price;
};

struct item items[3] = {{1, 10, -1}, {2, 20, -1}, {3, 30, -1}};
struct item *single;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2 i0=%d/%d/%d i2=%d/%d/%d single=%d/%d/%d\n", items[0].id,
           items[0].qty, items[0].price, items[2].id, items[2].qty, items[2].price,
           single->id, single->qty, single->price);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  if (!molt_is_updating()) {
    single = calloc(1, sizeof *single);
  }
  fu_serve();
  return 0;
}
