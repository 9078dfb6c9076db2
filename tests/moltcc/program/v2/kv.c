/* Full-update fixture, version 2: struct entry changed (float -> double,
 * int -> size_t, a new field), 'rounds' renamed, a new variable. */
#include <molt.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct entry {
  int key;
  double weight;
  size_t len;
  long hits;
  struct entry *next;
};

struct table {
  size_t n;
  struct entry **slots MOLT_PTRARRAY(n);
  const char *name;
};

struct table store;
int loops;
int version_tag = -7; /* set by an INIT rule */
static int counter = 100;
static int cache[8] MOLT_NO_MIGRATE;

void stats_tick(void);
int stats_counter(void);

int main(void) {
  long local_count = -1;
  int got = MOLT_MIGRATE_LOCAL(local_count);
  if (molt_is_updating()) {
    printf("v2 updated local=%ld got=%d n=%zu name=%s loops=%d tag=%d counter=%d "
           "cache=%d stats=%d\n",
           local_count, got, store.n, store.name, loops > 0, version_tag, counter,
           cache[0], stats_counter() > 0);
    for (size_t i = 0; i < store.n; i++) {
      struct entry *e = store.slots[i];
      printf("entry %d weight=%.2f len=%zu hits=%ld next=%d\n", e->key, e->weight, e->len,
             e->hits, e->next ? e->next->key : -1);
    }
    printf("v2 done\n");
    fflush(stdout);
  }
  for (;;) {
    loops++;
    counter++;
    stats_tick();
    molt_update_point("loop");
    usleep(1000);
  }
}
