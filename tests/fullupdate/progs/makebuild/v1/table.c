/* The annotated type lives in its own object: the link must know its
 * annotations (MOLT_PTRARRAY) without the source. */
#include "table.h"

#include <stdlib.h>

struct table table;

void table_init(int n) {
  table.n = n;
  table.cells = calloc((size_t)n, sizeof *table.cells);
  for (int i = 0; i < n; i++)
    table.cells[i].v = i + 1;
}
