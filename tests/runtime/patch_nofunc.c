/* A patch that replaces a function the program does not have. */
#include "molt.h"
MOLT_PATCH("patch-nofunc", "replaces a function that is not updatable");
MOLT_PATCH_FUNCTION(int, not_an_updatable_function, (int x)) { return x; }
