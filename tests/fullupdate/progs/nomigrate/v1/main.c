/* MOLT_NO_MIGRATE: re-initialised by the new version, never copied. */
#include "fu.h"

static int op_one(int x) { return x + 1; }

struct ops {
  int (*f)(int);
};

int cache[4] MOLT_NO_MIGRATE;
struct ops ops MOLT_NO_MIGRATE = {op_one};
int normal;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "fill")) {
    for (int i = 0; i < 4; i++)
      cache[i] = i + 1;
    normal = 55;
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    printf("version=1 cache=%d,%d,%d,%d normal=%d f3=%d\n", cache[0], cache[1], cache[2],
           cache[3], normal, ops.f(3));
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
