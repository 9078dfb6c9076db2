/* A patch forced past moltcc (built by hand, stamped with moltstamp) that
 * would run code inside dlopen (CTOR) or dlclose (DTOR): it prints into the
 * host and ends it.  The runtime must refuse it before the loader sees it. */
#include "molt.h"
#include <stdio.h>
#include <unistd.h>

MOLT_PATCH("patch-ctor", "runs code at load or unload");
MOLT_PATCH_FUNCTION(int, version_tag, (int x)) { return 7 * 1000 + x; }

#ifdef CTOR
__attribute__((constructor)) static void take_over(void) {
  puts("constructor of a patch ran in the host");
  _exit(42);
}
#endif
#ifdef DTOR
__attribute__((destructor)) static void leave(void) {
  puts("destructor of a patch ran in the host");
  _exit(43);
}
#endif
