/* Cycles and sharing: node gains `tag`; still one ring, still one node
 * behind a and b. */
#include "fu.h"

struct node {
  int v;
  int tag;
  struct node *next, *prev;
};

struct pair {
  int x;
  struct pair *other;
};

struct node *ring;
struct node *a, *b;
struct pair *p1;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    int len = 0, ok = 1, a_in_ring = 0, tags = 0;
    struct node *n = ring;
    do {
      ok &= n->next->prev == n;
      a_in_ring |= n == a;
      tags += n->tag;
      n = n->next;
      len++;
    } while (n != ring && len < 100);
    printf("version=2 ring_len=%d links_ok=%d shared=%d a_v=%d a_in_ring=%d "
           "tags=%d pairs=%d\n",
           len, ok, a == b, a->v, a_in_ring, tags, p1->other->other == p1);
  } else if (!strcmp(cmd, "poke")) { /* a write through a is seen through b */
    a->v = 42;
    printf("b_v=%d\n", b->v);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
