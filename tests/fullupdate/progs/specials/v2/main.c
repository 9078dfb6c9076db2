/* $oldsym, $newsym, $oldtype, $newtype, $base in rule bodies. */
#include "fu.h"

struct pt {
  int x;
  int y;
  int sum;
};

int scale = 3;
struct pt origin = {4, 5, 0};
struct pt *pts MOLT_PTRARRAY(2);
int scaled;    /* INIT: uses $oldsym */
long sizes;    /* INIT: uses $oldtype / $newtype */
int side = -1; /* set from another rule through $newsym */

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2 scale=%d origin=%d,%d,%d p1=%d,%d,%d scaled=%d sizes=%ld "
           "side=%d\n",
           scale, origin.x, origin.y, origin.sum, pts[1].x, pts[1].y, pts[1].sum, scaled,
           sizes, side);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
