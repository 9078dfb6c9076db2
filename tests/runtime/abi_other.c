/* A shared object that claims another molt ABI: built against this tree's
 * molt.h, but its registration constructor (written out here instead of
 * molt.h's, which is disabled with MOLT__NO_AUTO_REGISTER) announces
 * MOLT__ABI + 1, as an object built with a newer molt release would.  The
 * runtime must refuse it: test_abi.py. */
#include "molt.h"

MOLT_FUNCTION(int, other_version, (int x), (x)) { return x + 7; }

extern molt__fn_desc other_fns_start[] __asm__("__start_molt_fns")
    __attribute__((weak, visibility("hidden")));
extern molt__fn_desc other_fns_stop[] __asm__("__stop_molt_fns")
    __attribute__((weak, visibility("hidden")));

__attribute__((constructor(101))) static void register_other_abi(void) {
  molt__register_module(MOLT__ABI + 1, other_fns_start, other_fns_stop);
}
