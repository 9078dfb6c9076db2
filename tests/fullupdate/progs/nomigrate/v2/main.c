/* MOLT_NO_MIGRATE: `ops` changed type and needs no rule (it is not
 * migrated); `cache` keeps v2's initializer. */
#include "fu.h"

static int op_one(int x) { return x + 100; }
static int op_two(int x) { return x * 2; }

struct ops {
  int (*f)(int);
  int (*g)(int);
};

int cache[4] MOLT_NO_MIGRATE = {9, 9, 9, 9};
struct ops ops MOLT_NO_MIGRATE = {op_one, op_two};
int normal;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2 cache=%d,%d,%d,%d normal=%d f3=%d g3=%d\n", cache[0], cache[1],
           cache[2], cache[3], normal, ops.f(3), ops.g(3));
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
