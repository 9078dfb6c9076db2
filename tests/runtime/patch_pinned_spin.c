/* A pinned patch of spin_call (tag 4; test_runtime pinnedproof): a thread
 * spins in it while it is rolled back.  Once published it is never
 * unmapped, so the runtime needs no proof that no thread runs it -- and
 * holds no entry on the dispatch path to get one. */
#include "molt.h"

MOLT_PATCH_PINNED("patch-pinned-spin", "spin_call with tag 4, pinned",
                  "patch_pinned_spin.c: pinned by the test");
MOLT_IMPORT_FUNCTION(int, version_tag, (int), NULL);
MOLT_IMPORT(volatile int, spin_hold);
MOLT_IMPORT(volatile int, spin_entered);

MOLT_PATCH_FUNCTION(int, spin_call, (void)) {
  int sum = 0;
  __atomic_store_n(&MOLT_REF(spin_entered), 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&MOLT_REF(spin_hold), __ATOMIC_SEQ_CST))
    sum += MOLT_REF(version_tag)(0);
  return 4 * 1000 + sum % 1;
}
