/* Kitsune's examples 2+3 merged: mapping becomes a list and data a long. */
#include "fu.h"

typedef long data;
int config_size = 8;
struct list {
  int key;
  data val;
  struct list *next;
} * mapping;
void *retired_mapping; /* v1's array, handed over by v2.xf */

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2");
    for (struct list *l = mapping; l; l = l->next)
      printf(" %d:%ld", l->key, l->val);
    printf("\n");
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  if (molt_is_updating()) { /* committed: v1's array is garbage now */
    free(retired_mapping);
    retired_mapping = NULL;
  }
  fu_serve();
  return 0;
}
