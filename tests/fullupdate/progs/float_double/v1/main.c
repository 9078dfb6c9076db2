/* float -> double (Kitsune's defect: a bitwise copy would garble it). */
#include "fu.h"

struct m {
  float x;
  int n;
};

struct m gm = {0.1f, 1};
struct m *hm;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=1 gm=%.17g/%d hm=%.17g/%d\n", (double)gm.x, gm.n, (double)hm->x,
           hm->n);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  hm = malloc(sizeof *hm);
  hm->x = -1234.5678f;
  hm->n = 2;
  gm.x = 3.14159f;
  fu_serve();
  return 0;
}
