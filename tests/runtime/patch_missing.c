/* A patch that references a symbol the program does not have. */
#include "molt.h"
MOLT_PATCH("patch-missing", "imports a symbol that does not exist");
MOLT_IMPORT(int, no_such_variable_in_target);
MOLT_PATCH_FUNCTION(int, version_tag, (int x)) {
  return MOLT_REF(no_such_variable_in_target) + x;
}
