/* the same v2 with a correct transformer (v2good.xf) */
#include "fu.h"

static int twice(int x) { return 2 * x + 1; }

struct box {
  const char *label;
  int (*fn)(int);
  struct box *self;
};

int counter = 1;
struct box *box;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2 counter=%d label=%s fn=%d self_ok=%d\n", counter, box->label,
           box->fn(21), box->self == box);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  if (!molt_is_updating()) {
    box = malloc(sizeof *box);
    box->label = "v2 label";
    box->fn = twice;
    box->self = box;
  }
  fu_serve();
  return 0;
}
