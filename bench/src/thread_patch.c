/* The patch of the molt-patched variant of the thread benchmark
 * (thread_main.c PATCH): it replaces bump with the same body (the program's
 * own counter, through an import), so only the dispatch changes.  Built
 * -fPIC -shared and stamped with the program's build-id (moltstamp). */
#include "molt.h"

MOLT_PATCH("bench-threads", "bump, same body: threads register on their first call");

MOLT_IMPORT(long, counter);

MOLT_PATCH_FUNCTION(void, bump, (void)) {
  __atomic_add_fetch(&MOLT_REF(counter), 1, __ATOMIC_RELAXED);
}
