/* The thread function's callee of the thread benchmark (thread_main.c):
 * plain (-DVARIANT_PLAIN) or updatable (MOLT_FUNCTION). */
long counter;

#ifdef VARIANT_PLAIN
__attribute__((noinline)) void bump(void) {
  __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
}
#else
#include "molt.h"
MOLT_VOID_FUNCTION(bump, (void), ()) {
  __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
}
#endif
