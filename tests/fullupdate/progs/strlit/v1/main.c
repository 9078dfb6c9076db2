/* Pointers to string literals of the old image (Kitsune's other defect):
 * they must keep working after the old image is unloaded. */
#include "fu.h"

struct msg {
  const char *text;
  int n;
};

const char *greeting = "hello from v1";
struct msg *note;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "pick")) {
    greeting = "picked at run time in v1";
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    printf("version=1 greeting=%s note=%s\n", greeting, note->text);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  note = malloc(sizeof *note);
  note->text = "a literal of v1 held by a heap object";
  note->n = 1;
  fu_serve();
  return 0;
}
