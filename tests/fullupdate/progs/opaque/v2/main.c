/* MOLT_OPAQUE: `hidden` still points to the old object (v1 layout: only
 * `a` may be read); `shown` was transformed. */
#include "fu.h"

struct secret {
  int a;
  int b;
};

struct holder {
  struct secret *hidden MOLT_OPAQUE;
  struct secret *shown;
};

struct holder h;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2 hidden=%p hidden_a=%d shown=%p shown_a=%d shown_b=%d\n",
           (void *)h.hidden, h.hidden->a, (void *)h.shown, h.shown->a, h.shown->b);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
