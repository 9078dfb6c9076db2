/* float -> double (Kitsune's defect: a bitwise copy would garble it). */
#include "fu.h"

struct m {
  double x;
  int n;
};

struct m gm;
struct m *hm;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2 gm=%.17g/%d hm=%.17g/%d\n", gm.x, gm.n, hm->x, hm->n);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
