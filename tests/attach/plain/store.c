/* Records 0..NRECORDS-1 and, right after them, one that must never be
 * served: valid_index() lets index NRECORDS through (the bug fix_bounds.patch
 * fixes).  `served` has a namesake in server.c: a patch must reach this
 * one.  next_id() counts in a static local. */
#include "store.h"

#include <stdatomic.h>
#include <stdio.h>

static struct record table[NRECORDS + 1];
static atomic_long served;

static int valid_index(long i) { return i >= 0 && i <= NRECORDS; }

const char *lookup(long i) {
  atomic_fetch_add(&served, 1);
  if (!valid_index(i))
    return "none";
  return table[i].name;
}

/* lookup(0): the compiler inlines lookup() here, so a fix of lookup()
 * changes this function too. */
const char *lookup_first(void) { return lookup(0); }

long next_id(void) {
  static atomic_long counter;
  return atomic_fetch_add(&counter, 1) + 1;
}

long store_served(void) { return atomic_load(&served); }

void store_init(void) {
  for (int i = 0; i < NRECORDS; i++) {
    table[i].id = i;
    snprintf(table[i].name, sizeof table[i].name, "name%d", i);
  }
  table[NRECORDS].id = -1;
  snprintf(table[NRECORDS].name, sizeof table[NRECORDS].name, "secret");
}
