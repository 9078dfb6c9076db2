/* Updates that abort after the rules ran (a rule that loops past the
 * deadline, faults, fails, or names a missing symbol): the old version
 * goes on with its state as it was, and nothing a rule allocated is left
 * behind (the ASan build's LeakSanitizer checks at exit).  v2 is the same
 * program; the .xf files decide how the migration ends. */
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
    snprintf(s, 32, "v1-%d", counter);
    free(label);
    label = s;
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    printf("version=1 counter=%d label=%s\n", counter, label);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  label = strdup("v1-1");
  fu_serve();
  free(label);
  return 0;
}
