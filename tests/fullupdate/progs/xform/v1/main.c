/* Kitsune's figure 2 state: `mapping` is an array of config_size data. */
#include "fu.h"

typedef int data;
int config_size = 8;
data *mapping;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  int k, v;
  if (sscanf(cmd, "set %d %d", &k, &v) == 2 && k >= 0 && k < config_size) {
    mapping[k] = v;
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    printf("version=1");
    for (k = 0; k < config_size; k++)
      if (mapping[k])
        printf(" %d:%d", k, mapping[k]);
    printf("\n");
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  mapping = calloc((size_t)config_size, sizeof *mapping);
  fu_serve();
  return 0;
}
