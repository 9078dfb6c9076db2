/* Function pointers stored in heap objects and globals: after the update
 * they reach the new version's functions (redirected by name). */
#include "fu.h"

int op_triple(int x) { return 3 * x; }
static int op_neg(int x) { return -x; }

struct handler {
  int (*fn)(int);
  int arg;
};

struct handler *h;
int (*cur_op)(int) = op_neg;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=1 h=%d cur=%d\n", h->fn(h->arg), cur_op(5));
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  h = malloc(sizeof *h);
  h->fn = op_triple;
  h->arg = 7;
  fu_serve();
  return 0;
}
