/* molt.h in the dialects programs are written in (test_header.py): the
 * manual interface of a program. */
#include "molt.h"

MOLT_FUNCTION(int, add, (int a, int b), (a, b)) { return a + b; }
MOLT_STATIC_FUNCTION(int, helper, (int x), (x)) { return x * 2; }
MOLT_VOID_FUNCTION(reset, (int *s), (s)) { *s = helper(0); }
int use(void);
int use(void) { return add(1, 2); }
