/* $oldsym, $newsym, $oldtype, $newtype, $base in rule bodies. */
#include "fu.h"

struct pt {
  int x;
  int y;
};

int scale = 3;
struct pt origin = {4, 5};
struct pt *pts MOLT_PTRARRAY(2);

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=1 scale=%d origin=%d,%d p1=%d,%d\n", scale, origin.x, origin.y,
           pts[1].x, pts[1].y);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  pts = calloc(2, sizeof *pts);
  pts[0].x = 1;
  pts[0].y = 2;
  pts[1].x = 30;
  pts[1].y = 40;
  scale = 7;
  fu_serve();
  return 0;
}
