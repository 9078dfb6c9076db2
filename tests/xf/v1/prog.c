/* Version 1 of the xf test program: a program image (molt__program + main)
 * whose state the test builds with v1_setup() and v2 migrates. */
#include "molt.h"
#include "molt/program.h" /* hand-written image: the ABI moltcc generates against */
#include "layouts.h"

#include <stdlib.h>
#include <string.h>

struct entry {
  int key;
  float weight;
  struct entry *next;
  const char *label;
  int (*op)(int);
};
struct pool {
  size_t n;
  struct entry **slots;
};
_Static_assert(sizeof(struct entry) == sizeof(struct o_entry), "layout");
_Static_assert(offsetof(struct entry, op) == offsetof(struct o_entry, op), "layout");
_Static_assert(sizeof(struct pool) == sizeof(struct o_pool), "layout");

int counter = 1;
static int hidden_counter = 5;
struct entry *head;
struct entry *shared_a, *shared_b;
int *counter_ptr;
struct entry table[4];
struct entry *table_ptr;
const char *greeting;
struct pool pool;
char *interior;
char *scratch; /* dropped by v2: its migration frees it (SC_FREE_OLD) */

int op_double(int x) { return 2 * x; }
static int op_negate(int x) { return -x; }
int op_only_v1(int x) { return x + 1; }

/* For the symbol tests: the address of the static function. */
void *v1_op_negate(void) { return (void *)op_negate; }
int v1_hidden_counter(void) { return hidden_counter; }

static struct entry *node(int key, float w) {
  struct entry *e = calloc(1, sizeof *e);
  e->key = key;
  e->weight = w;
  return e;
}

void v1_setup(int scenario, long n) {
  if (scenario == SC_BIG) {
    struct entry **link = &head;
    for (long i = 0; i < n; i++) {
      struct entry *e = node((int)i, (float)i * 0.5f);
      e->label = "node";
      e->op = op_double;
      *link = e;
      link = &e->next;
    }
    return;
  }
  counter = 77;
  hidden_counter = 99;
  struct entry *n1 = node(1, 0.1f), *n2 = node(2, 2.5f), *n3 = node(3, -1.25f),
               *n4 = node(4, 4.0f);
  n1->next = n2;
  n2->next = n3;
  n3->next = n1; /* a cycle */
  n1->label = "one";
  n2->label = strdup("two-heap");
  n1->op = op_double;
  n2->op = op_negate;
  n3->op = scenario == SC_MISSING_FN ? op_only_v1 : NULL;
  head = n1;
  shared_a = n2; /* n2 is shared by two owners (and n1->next) */
  shared_b = n2;
  counter_ptr = &counter;
  for (int i = 0; i < 4; i++) {
    table[i].key = 100 + i;
    table[i].weight = (float)i + 0.5f;
    table[i].next = i < 3 ? &table[i + 1] : n1;
    table[i].label = "tbl";
    table[i].op = op_double;
  }
  table_ptr = &table[2];
  greeting = "hello from v1";
  pool.n = 4;
  pool.slots = malloc(4 * sizeof *pool.slots);
  pool.slots[0] = n1;
  pool.slots[1] = n3;
  pool.slots[2] = &table[1];
  pool.slots[3] = n4; /* reachable only through the pointer array */
  interior = scenario == SC_INTERIOR ? (char *)n2 + 4 : NULL;
  if (scenario == SC_FREE_OLD) {
    scratch = malloc(SCRATCH_BYTES);
    memset(scratch, 'S', SCRATCH_BYTES);
  }
}

/* Frees the state (after an aborted update the old version still owns it). */
void v1_free_all(void) {
  struct entry *e = head;
  if (pool.slots) {
    /* the normal scenarios: n1 -> n2 -> n3 -> n1, n4 in the pool */
    free((void *)head->next->label);
    free(pool.slots[3]);
    for (int i = 0; i < 3; i++) {
      struct entry *next = e->next;
      free(e);
      e = next;
    }
    free(pool.slots);
  } else {
    while (e) {
      struct entry *next = e->next;
      free(e);
      e = next;
    }
  }
  head = NULL;
  pool.slots = NULL;
  free(scratch);
  scratch = NULL;
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  return counter;
}

MOLT_EXTERN const molt__program_info molt__program = {MOLT__PROGRAM_ABI, 0, NULL, NULL};
