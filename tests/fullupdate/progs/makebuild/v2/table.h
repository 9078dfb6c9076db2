#include <molt.h>

struct cell {
  int v;
  int extra; /* new */
};

struct table {
  int n;
  struct cell *cells MOLT_PTRARRAY(n);
};

extern struct table table;
void table_init(int n);
