/* A pinned patch whose apply fails (it replaces a function the program
 * does not have): it never ran, so it must not stay loaded. */
#include "molt.h"
MOLT_PATCH_PINNED("patch-pinned-nofunc", "pinned, refused",
                  "patch_pinned_nofunc.c:5: test");
MOLT_PATCH_FUNCTION(int, not_an_updatable_function, (int x)) { return x; }
