/* v2 of progs/abort: the same program; the .xf file decides how the
 * migration from v1 ends. */
#include "fu.h"

int counter = 1;
char *label;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "inc")) {
    counter++;
    /* the old version allocates after an abort: a lock the escape had
     * left held (malloc's) would hang here */
    char *s = malloc(32);
    snprintf(s, 32, "v2-%d", counter);
    free(label);
    label = s;
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    printf("version=2 counter=%d label=%s\n", counter, label);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  if (!molt_is_updating())
    label = strdup("v2-1");
  fu_serve();
  free(label);
  return 0;
}
