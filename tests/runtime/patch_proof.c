/* The patch of the proof case (test_runtime proof): pipe_call and spin_call
 * with tag 1, nothing else -- the busy threads of the case call functions
 * it does not replace. */
#include "molt.h"
#include <unistd.h>

MOLT_PATCH("patch-proof", "test patch of the proofs (tag 1)");
MOLT_IMPORT_FUNCTION(int, version_tag, (int), NULL);
MOLT_IMPORT(volatile int, spin_hold);
MOLT_IMPORT(volatile int, spin_entered);

MOLT_PATCH_FUNCTION(int, pipe_call, (int fd)) {
  unsigned char c;
  return read(fd, &c, 1) == 1 ? 1 * 1000 + c : -1;
}

MOLT_PATCH_FUNCTION(int, spin_call, (void)) {
  int sum = 0;
  __atomic_store_n(&MOLT_REF(spin_entered), 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&MOLT_REF(spin_hold), __ATOMIC_SEQ_CST))
    sum += MOLT_REF(version_tag)(0);
  return 1 * 1000 + sum % 1;
}
