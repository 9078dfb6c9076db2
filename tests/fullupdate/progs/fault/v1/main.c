/* A failed migration leaves v1 running with its state: pointers that the
 * migration fixes in place (to a literal and a function of this image)
 * must be exactly as they were. */
#include "fu.h"

static int twice(int x) { return 2 * x; }

struct box {
  const char *label;
  int (*fn)(int);
  struct box *self;
};

int counter = 1;
struct box *box;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "inc")) {
    counter++;
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    printf("version=1 counter=%d label=%s label_at=%p fn=%d fn_at=%p self_ok=%d "
           "box_at=%p\n",
           counter, box->label, (void *)box->label, box->fn(21), (void *)box->fn,
           box->self == box, (void *)box);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  box = malloc(sizeof *box);
  box->label = "v1 label";
  box->fn = twice;
  box->self = box;
  fu_serve();
  return 0;
}
