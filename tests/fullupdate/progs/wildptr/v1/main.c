/* Live data with pointers that point nowhere: a connection slot whose
 * buffer pointer was never initialised (non-canonical garbage) or was left
 * dangling.  The program never follows them; the migration must not
 * either (it faulted, naming neither the field nor the object). */
#include "fu.h"

struct buf {
  char *data;
  int len;
};

struct conn {
  int id;
  struct buf *rbuf;
  struct conn *next;
};

static struct conn *conns;

static void add(int id, struct buf *b) {
  struct conn *c = calloc(1, sizeof *c);
  c->id = id;
  c->rbuf = b;
  c->next = conns;
  conns = c;
}

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "good")) {
    struct buf *b = malloc(sizeof *b);
    b->data = strdup("hello");
    b->len = 5;
    add(1, b);
    printf("ok\n");
  } else if (!strcmp(cmd, "wild")) {
    add(2, (struct buf *)(uintptr_t)0xdead00000000beefull); /* non-canonical */
    printf("ok\n");
  } else if (!strcmp(cmd, "dangling")) {
    add(3, (struct buf *)(uintptr_t)0x18); /* canonical, unmapped */
    printf("ok\n");
  } else if (!strcmp(cmd, "dump")) {
    int n = 0;
    const char *data = "-";
    for (struct conn *c = conns; c; c = c->next) {
      n++;
      if (c->id == 1)
        data = c->rbuf->data;
    }
    printf("version=1 conns=%d data=%s\n", n, data);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  fu_serve();
  return 0;
}
