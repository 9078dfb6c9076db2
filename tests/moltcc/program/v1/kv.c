/* Full-update fixture, version 1: a small key-value store whose entries
 * change type in version 2 (tests/moltcc/test_program_build.py). */
#include <molt.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct entry {
  int key;
  float weight;
  int len;
  struct entry *next;
};

struct table {
  size_t n;
  struct entry **slots MOLT_PTRARRAY(n);
  const char *name;
};

struct table store;
int rounds;                          /* renamed to 'loops' in version 2 */
static int counter = 100;            /* a static of the same name as stats.c's */
static int cache[8] MOLT_NO_MIGRATE; /* re-initialised by an update */

void stats_tick(void);

static void fill(void) {
  store.n = 4;
  store.slots = calloc(store.n, sizeof *store.slots);
  for (size_t i = 0; i < store.n; i++) {
    struct entry *e = calloc(1, sizeof *e);
    e->key = (int)i;
    e->weight = (float)i + 0.25f;
    e->len = (int)i * 3;
    e->next = i ? store.slots[i - 1] : NULL;
    store.slots[i] = e;
  }
  store.name = "kv-store";
  cache[0] = 42;
  counter = 5;
}

int main(void) {
  int local_count = 7;
  fill();
  MOLT_MIGRATE_LOCAL(local_count);
  printf("v1 ready counter=%d cache=%d\n", counter, cache[0]);
  fflush(stdout);
  for (;;) {
    rounds++;
    stats_tick();
    molt_update_point("loop");
    usleep(1000);
  }
}
