/* Another program: a patch stamped with its build-id must be refused by
 * the runtime test program (H9). */
#include <stdio.h>
int main(void) {
  puts("other");
  return 0;
}
