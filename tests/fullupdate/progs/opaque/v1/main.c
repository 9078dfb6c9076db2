/* MOLT_OPAQUE: the pointer is kept as it is and never followed. */
#include "fu.h"

struct secret {
  int a;
};

struct holder {
  struct secret *hidden MOLT_OPAQUE;
  struct secret *shown;
};

struct holder h;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=1 hidden=%p hidden_a=%d shown=%p shown_a=%d\n", (void *)h.hidden,
           h.hidden->a, (void *)h.shown, h.shown->a);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  h.hidden = malloc(sizeof *h.hidden);
  h.hidden->a = 11;
  h.shown = malloc(sizeof *h.shown);
  h.shown->a = 22;
  fu_serve();
  return 0;
}
