/* The same functions, new bodies. */
#include "fu.h"

int op_triple(int x) { return 3 * x + 1000; }
static int op_neg(int x) { return -x - 1000; }

struct handler {
  int (*fn)(int);
  int arg;
};

struct handler *h;
int (*cur_op)(int) = op_triple; /* the migrated value wins */

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2 h=%d cur=%d h_is_new=%d cur_is_new=%d\n", h->fn(h->arg), cur_op(5),
           h->fn == op_triple, cur_op == op_neg);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
