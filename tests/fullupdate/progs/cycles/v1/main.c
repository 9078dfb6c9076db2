/* Cycles and sharing: a ring of changed-type nodes, two globals pointing
 * to the same node, and a cycle of an unchanged type (fixed in place). */
#include "fu.h"

struct node {
  int v;
  struct node *next, *prev;
};

struct pair {
  int x;
  struct pair *other;
};

struct node *ring;
struct node *a, *b; /* both point to the node with v == 2 */
struct pair *p1;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    int len = 0, ok = 1;
    struct node *n = ring;
    do {
      ok &= n->next->prev == n;
      n = n->next;
      len++;
    } while (n != ring && len < 100);
    printf("version=1 ring_len=%d links_ok=%d shared=%d a_v=%d pairs=%d\n", len, ok,
           a == b, a->v, p1->other->other == p1);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  struct node *prev = NULL;
  for (int i = 0; i < 4; i++) {
    struct node *n = malloc(sizeof *n);
    n->v = i;
    if (i == 0)
      ring = n;
    else
      prev->next = n;
    n->prev = prev;
    prev = n;
    if (i == 2)
      a = b = n;
  }
  prev->next = ring;
  ring->prev = prev;
  p1 = malloc(sizeof *p1);
  p1->x = 1;
  p1->other = malloc(sizeof *p1);
  p1->other->x = 2;
  p1->other->other = p1;
  fu_serve();
  return 0;
}
