/* Function pointers in unions (as libevent keeps its callbacks: a union of
 * callback types in struct event_callback): the update must redirect them
 * to the new version, although which member is live is unknown. */
#include "fu.h"

struct item {
  int key;
};

union callback {
  int (*on_read)(int);
  int (*on_close)(int, int);
  long raw;
};

struct ev {
  int fd;
  union callback cb;
  union {
    struct item *it;
    const char *name;
  } arg;
};

static int on_read(int fd) { return 1000 + fd; }
static int on_close(int fd, int why) { return 2000 + fd + why; }

static struct ev *evs[2];
static union {
  long n;
  int (*fn)(int);
} mixed;

static int fu_handle(char *cmd) {
  FU_COMMON(cmd)
  if (!strcmp(cmd, "dump")) {
    printf("version=2 read=%d close=%d mixed=%d key=%d\n", evs[0]->cb.on_read(evs[0]->fd),
           evs[1]->cb.on_close(evs[1]->fd, 1), mixed.fn(3), evs[0]->arg.it->key);
  } else {
    printf("error %s\n", cmd);
  }
  return 1;
}

int main(void) {
  if (!molt_is_updating()) {
    evs[0] = calloc(1, sizeof *evs[0]);
    evs[0]->fd = 5;
    evs[0]->cb.on_read = on_read;
    evs[0]->arg.it = calloc(1, sizeof(struct item));
    evs[0]->arg.it->key = 42;
    evs[1] = calloc(1, sizeof *evs[1]);
    evs[1]->fd = 6;
    evs[1]->cb.on_close = on_close;
    evs[1]->arg.name = "six";
    mixed.fn = on_read;
  }
  fu_serve();
  return 0;
}
