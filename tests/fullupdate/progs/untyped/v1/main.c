/* An untyped pointer to an object whose type changes: h->peer (void *)
 * and h->n (struct node *) point to the same node.  The migration visits
 * peer first, cannot type it and keeps it; then n replaces the node (v2
 * adds a field).  The update must abort naming the pointer, not commit
 * with peer left to the freed node. */
#include "fu.h"

#define VERSION 1

struct node {
  int a;
};

struct holder {
  void *peer; /* the same node, untyped */
  struct node *n;
};

struct holder *h;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump"))
    printf("version=%d a=%d same=%d\n", VERSION, h->n->a, h->peer == (void *)h->n);
  else
    printf("error %s\n", cmd);
  return 1;
}

int main(void) {
  if (!molt_is_updating()) {
    h = calloc(1, sizeof *h);
    h->n = calloc(1, sizeof *h->n);
    h->n->a = 41;
    h->peer = h->n;
  }
  fu_serve();
  return 0;
}
