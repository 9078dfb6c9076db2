/* molt.h in the dialects programs are written in (test_header.py): the
 * manual interface of a hand-written patch. */
#include "molt.h"

MOLT_PATCH_PINNED("p", "d", "header_patch.c:8: keeps a literal");
MOLT_IMPORT(int, counter);
MOLT_IMPORT_STATIC(int, hits, "target.c");
MOLT_IMPORT_FUNCTION(int, rec, (int), NULL);
MOLT_PATCH_FUNCTION(int, add, (int a, int b)) {
  return a + b + MOLT_REF(counter) + MOLT_REF(hits) + MOLT_REF(rec)(1);
}
