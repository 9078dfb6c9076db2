/* The callee of the function-call benchmark (PSU 5.2.1): it dereferences a
 * pointer and returns the value.  It lives in its own translation unit so
 * that no compiler can inline it, prove it pure or hoist it out of the loop
 * (without LTO a call into another TU is opaque), at every -O level; the
 * noinline of the thesis is kept for the plain build as well.
 *
 * One file, one variant per build (-DVARIANT_...):
 *   PLAIN        a direct call (the baseline)
 *   MOLT         updatable through molt.h's manual interface (MOLT_FUNCTION);
 *                with a PATCH argument (fcall_main.c) the same program runs
 *                with target replaced by fcall_patch.c (variant molt-patched)
 * The moltcc build compiles fcall_target_cc.c instead (moltcc does the
 * rewriting itself). */
#if defined(VARIANT_PLAIN)
__attribute__((noinline)) int target(int *p) { return *p; }
#elif defined(VARIANT_MOLT)
#include "molt.h"
MOLT_FUNCTION(int, target, (int *p), (p)) { return *p; }
#else
#error "define VARIANT_PLAIN or VARIANT_MOLT"
#endif
