/* Type change of a field: rec.a int -> long, in a linked list. */
#include "fu.h"
#include <limits.h>

struct rec {
  int a;
  int b;
  struct rec *next;
};

struct rec *recs;

static void push(int a, int b) {
  struct rec *r = malloc(sizeof *r);
  r->a = a;
  r->b = b;
  r->next = recs;
  recs = r;
}

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=1");
    for (struct rec *r = recs; r; r = r->next)
      printf(" %d/%d", r->a, r->b);
    printf("\n");
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  push(-5, 1);
  push(INT_MAX, 2);
  push(INT_MIN, 3);
  push(123456, 4);
  fu_serve();
  return 0;
}
