/* Type change of a field: rec.a int -> long, in a linked list. */
#include "fu.h"

struct rec {
  long a;
  int b;
  struct rec *next;
};

struct rec *recs;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2");
    for (struct rec *r = recs; r; r = r->next)
      printf(" %ld/%d", r->a, r->b);
    printf("\n");
  } else if (!strcmp(cmd, "bump")) { /* a is a long now: no overflow */
    for (struct rec *r = recs; r; r = r->next)
      r->a += 1000000000000L;
    printf("ok\n");
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
