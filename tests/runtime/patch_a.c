/* Patch a of the runtime tests: every function returns tag 1. */
#include "molt.h"
#include <sched.h>

MOLT_PATCH("patch-a", "test patch a (tag 1)");
MOLT_IMPORT(int, counter);
MOLT_IMPORT_STATIC(int, hits, "target.c");
MOLT_IMPORT(volatile int, block_hold);
MOLT_IMPORT(volatile int, block_entered);
MOLT_IMPORT_FUNCTION(int, rec, (int), NULL);

MOLT_PATCH_FUNCTION(int, version_tag, (int x)) { return 1 * 1000 + x; }

MOLT_PATCH_FUNCTION(int, rec, (int n)) { return n == 0 ? 1 : MOLT_REF(rec)(n - 1); }

MOLT_PATCH_FUNCTION(int, block_call, (void)) {
  __atomic_store_n(&MOLT_REF(block_entered), 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&MOLT_REF(block_hold), __ATOMIC_SEQ_CST))
    sched_yield();
  return 1;
}

/* The static function doubler of target.c, new version: it still counts in
 * the program's own static 'hits' (H6). */
MOLT_PATCH_STATIC_FUNCTION(int, doubler, (int x), "target.c") {
  __atomic_add_fetch(&MOLT_REF(hits), 10, __ATOMIC_RELAXED);
  __atomic_add_fetch(&MOLT_REF(counter), 1, __ATOMIC_RELAXED);
  return 1 * 1000 + 2 * x;
}
