/* Pointers to string literals of the old image (Kitsune's other defect):
 * they must keep working after the old image is unloaded. */
#include "fu.h"

struct msg {
  const char *text;
  int n;
};

const char *greeting = "hello from v2";
struct msg *note;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "pick")) {
    greeting = "picked in v2";
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    printf("version=2 greeting=%s note=%s\n", greeting, note->text);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  if (!molt_is_updating()) {
    note = calloc(1, sizeof *note);
    note->text = "v2 initial";
  }
  fu_serve();
  return 0;
}
