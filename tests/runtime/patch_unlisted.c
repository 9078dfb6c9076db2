/* A patch with an import symbol its import table does not list: the
 * runtime must refuse it (weak, so that the dynamic loader accepts it). */
#include "molt.h"

MOLT_PATCH("patch-unlisted", "refers to molt.imp.ghost without a record");
extern int ghost __asm__(MOLT__IMPORT_PREFIX "ghost") __attribute__((weak));

MOLT_PATCH_FUNCTION(int, version_tag, (int x)) { return ghost + x; }
