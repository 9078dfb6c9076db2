/* Layouts of the test program's state in version 1 (o_) and version 2 (n_),
 * shared by the test and the images so that each side can check the other.
 * v1/prog.c and v2/prog.c assert that their own types match these. */
#ifndef XF_LAYOUTS_H
#define XF_LAYOUTS_H
#include <stddef.h>

struct o_entry {
  int key;
  float weight;
  struct o_entry *next;
  const char *label;
  int (*op)(int);
};

/* v2: key widened, weight float -> double, a new field. */
struct n_entry {
  long key;
  double weight;
  int hits;
  struct n_entry *next;
  const char *label;
  int (*op)(int);
};

/* Unchanged between the versions: an array of n pointers (PTRARRAY(n)). */
struct o_pool {
  size_t n;
  struct o_entry **slots;
};
struct n_pool {
  size_t n;
  struct n_entry **slots;
};

/* Scenarios of v1_setup. */
enum {
  SC_NORMAL = 0,
  SC_INTERIOR = 1,   /* `interior` points 4 bytes into a heap entry */
  SC_MISSING_FN = 2, /* an entry points to a function v2 does not have */
  SC_BIG = 3,        /* `head` is a list of n entries, nothing else */
  SC_FREE_OLD = 4,   /* SC_NORMAL + `scratch`, a heap buffer v2 dropped */
};

/* Migration modes of v2 (its global xf_mode). */
enum {
  XM_NORMAL = 0,
  XM_FAIL_AFTER_RUN = 1, /* molt__xf_fail after the work list ran */
  XM_NULL_WRITE = 2,     /* migrate() writes through NULL after the run */
  XM_FAULT_IN_XF = 3,    /* the entry transformer faults on key 2 */
  XM_STACK_OVERFLOW = 4, /* the entry transformer recurses without end */
  XM_FAIL_IN_XF = 5,     /* the entry transformer calls molt__xf_fail on key 3 */
  XM_FREE_OLD = 6,       /* molt__xf_free_old of scratch (and of addresses the
                          * safety rules must not free twice or at all) */
  XM_FREE_OLD_FAIL = 7,  /* the same, then molt__xf_fail after the run */
};

/* The size of v1's scratch buffer (SC_FREE_OLD), filled with 'S'. */
#define SCRATCH_BYTES 1000

#endif
