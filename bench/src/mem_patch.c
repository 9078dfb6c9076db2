/* The two patches of the memory benchmark (mem_main.c), one source:
 * -DTAG=1 is patch A, -DTAG=2 patch B.  Each replaces both functions. */
#include "molt.h"

#define STR2(x) #x
#define STR(x) STR2(x)

MOLT_PATCH("mem-" STR(TAG), "memory benchmark patch " STR(TAG));

MOLT_PATCH_FUNCTION(int, version, (void)) { return TAG; }
MOLT_PATCH_FUNCTION(int, work, (int x)) { return x + TAG * 10; }
