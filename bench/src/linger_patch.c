/* The two patches of linger_main.c, one source: -DTAG=1 and -DTAG=2. */
#include "molt.h"

#include <unistd.h>

#define STR2(x) #x
#define STR(x) STR2(x)

MOLT_PATCH("hold-" STR(TAG), "linger benchmark patch " STR(TAG));

MOLT_PATCH_FUNCTION(int, hold, (int ms)) {
  usleep((useconds_t)ms * 1000);
  return TAG;
}
