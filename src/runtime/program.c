/* program.c: running a program image (work in progress; see internal.h). */
#include "internal.h"

/* Placeholder until program threads exist: no thread has saved locals. */
void molt__program_foreach_local(void (*fn)(void *arg, molt__saved_local *l), void *arg) {
  (void)fn;
  (void)arg;
}
