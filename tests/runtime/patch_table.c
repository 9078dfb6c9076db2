/* A patch that reaches program functions through data words: tables of
 * imported functions in its own data (R_X86_64_64 relocations against
 * import symbols, one table writable, one in RELRO) -- the shape of
 * `int (*stored)(int) = compute;`.  Linked with -z now (tests.cmake). */
#include "molt.h"

MOLT_PATCH("patch-table", "through_static calls through tables of program functions");
MOLT_IMPORT_FUNCTION(int, doubler, (int), "target.c");
MOLT_IMPORT_FUNCTION(int, rec, (int), NULL);

static int (*table[])(int) = {MOLT_REF(doubler), MOLT_REF(rec)};
static int (*const ro_table[])(int) = {MOLT_REF(rec), MOLT_REF(doubler)};

/* (Two entries and a volatile index, so that the compiler reads the words
 * instead of calling the functions directly.) */
static volatile int first;

/* doubler and rec of the program: 2x and 0 (base versions). */
MOLT_PATCH_FUNCTION(int, through_static, (int x)) {
  return 5000 + table[first](x) + ro_table[first](3);
}
