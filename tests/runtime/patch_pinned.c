/* A pinned patch (tag 3): it stores a string literal of its own into the
 * program's data, so the runtime must keep it loaded after it is
 * superseded or rolled back.  Its header carries a provenance, as moltcc
 * writes it. */
#include "molt.h"

MOLT__PATCH_HEADER("patch-pinned", "version_tag 3; stores a literal in stored_msg",
                   "diff fix.patch sha256:0123abcd; files: target.c", MOLT__PATCH_PINNED,
                   "patch_pinned.c:17: a string literal is stored in stored_msg\n"
                   "patch_pinned.c:18: second reason");
MOLT_IMPORT(const char *, stored_msg);

MOLT_PATCH_FUNCTION(int, version_tag, (int x)) {
  MOLT_REF(stored_msg) = "stored by patch-pinned";
  return 3 * 1000 + x;
}
