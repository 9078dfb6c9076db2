/* Version 2 of the xf test program, with a HAND-WRITTEN migration in the
 * shape moltcc's generator emits: both versions' types re-declared, one
 * molt__xf_type and one function per (old type, new type) pair, and a
 * migrate() that hands every variable to the engine. */
#include "molt.h"
#include "molt/program.h" /* hand-written image: the ABI moltcc generates against */
#include "layouts.h"

#include <stdint.h>
#include <stdlib.h>

struct entry {
  long key;
  double weight;
  int hits;
  struct entry *next;
  const char *label;
  int (*op)(int);
};
struct pool {
  size_t n;
  struct entry **slots;
};
_Static_assert(sizeof(struct entry) == sizeof(struct n_entry), "layout");
_Static_assert(offsetof(struct entry, op) == offsetof(struct n_entry, op), "layout");

int counter = 1000; /* migrated: the old value wins over the initializer */
static int hidden_counter = 0;
struct entry *head;
struct entry *shared_a, *shared_b;
int *counter_ptr;
struct entry table[4];
struct entry *table_ptr;
const char *greeting;
struct pool pool;
char *interior;
int fresh = 7; /* new in v2: keeps its initializer */
int xf_mode;   /* set by the test before migrating (not migrated) */

int op_double(int x) { return 2 * x + 1000; } /* v2 behaviour differs */
static int op_negate(int x) { return -x - 1000; }

int v2_hidden_counter(void) { return hidden_counter; }
void *v2_op_negate(void) { return (void *)op_negate; }

/* ---- what the generator would emit --------------------------------------*/
struct molt_o_entry {
  int key;
  float weight;
  struct molt_o_entry *next;
  const char *label;
  int (*op)(int);
};
_Static_assert(offsetof(struct molt_o_entry, weight) == 4, "old layout");
_Static_assert(offsetof(struct molt_o_entry, next) == 8, "old layout");
_Static_assert(sizeof(struct molt_o_entry) == 32, "old layout");
struct molt_o_pool {
  size_t n;
  struct molt_o_entry **slots;
};

static void xf_entry(molt__xf_ctx *cx, const void *in, void *out);
static void fix_entryp(molt__xf_ctx *cx, const void *in, void *out);
static void fix_intp(molt__xf_ctx *cx, const void *in, void *out);
static void fix_charp(molt__xf_ctx *cx, const void *in, void *out);
static void fix_pool(molt__xf_ctx *cx, const void *in, void *out);

static const molt__xf_type xt_entry = {"struct entry", sizeof(struct molt_o_entry),
                                       sizeof(struct entry), xf_entry,
                                       MOLT__XF_CHANGED | MOLT__XF_TRAVERSE};
static const molt__xf_type xt_entryp = {"struct entry *", sizeof(void *), sizeof(void *),
                                        fix_entryp, MOLT__XF_TRAVERSE};
static const molt__xf_type xt_int = {"int", sizeof(int), sizeof(int), NULL, 0};
static const molt__xf_type xt_intp = {"int *", sizeof(void *), sizeof(void *), fix_intp,
                                      MOLT__XF_TRAVERSE};
static const molt__xf_type xt_charp = {"char *", sizeof(void *), sizeof(void *),
                                       fix_charp, MOLT__XF_TRAVERSE};
static const molt__xf_type xt_pool = {"struct pool", sizeof(struct molt_o_pool),
                                      sizeof(struct pool), fix_pool, MOLT__XF_TRAVERSE};

/* Faults on purpose, hidden from UBSan's null check so that the real
 * SIGSEGV reaches the runtime's guard (what the test is about). */
static int *volatile null_ptr;
__attribute__((noinline, no_sanitize("undefined"))) static void poke_null(void) {
  *null_ptr = 1;
}
__attribute__((noinline)) static int recurse(int n) {
  volatile char buf[512];
  buf[0] = (char)n;
  /* The bound is never reached: the stack runs out long before. */
  return n < (1 << 30) ? recurse(n + 1) + buf[0] : buf[0];
}

static void xf_entry(molt__xf_ctx *cx, const void *in_, void *out_) {
  const struct molt_o_entry *in = in_;
  struct entry *out = out_;
  if (xf_mode == XM_FAULT_IN_XF && in->key == 2)
    poke_null();
  if (xf_mode == XM_STACK_OVERFLOW && in->key == 2)
    out->hits = recurse(0);
  if (xf_mode == XM_FAIL_IN_XF && in->key == 3)
    molt__xf_fail(cx, "entry %d is corrupt", in->key);
  out->key = in->key;
  out->weight = in->weight; /* float -> double by C conversion */
  out->hits = in->key * 10; /* INIT struct entry.hits: { $out = $base->key * 10; } */
  out->next = molt__xf_ptr(cx, in->next, &xt_entry, 1);
  out->label = molt__xf_ptr(cx, in->label, NULL, 1);
  out->op = (int (*)(int))molt__xf_ptr(cx, (const void *)(uintptr_t)in->op, NULL, 1);
}

static void fix_entryp(molt__xf_ctx *cx, const void *in, void *out) {
  molt__xf_setp(cx, out, molt__xf_ptr(cx, *(void *const *)in, &xt_entry, 1));
}
static void fix_intp(molt__xf_ctx *cx, const void *in, void *out) {
  molt__xf_setp(cx, out, molt__xf_ptr(cx, *(void *const *)in, &xt_int, 1));
}
static void fix_charp(molt__xf_ctx *cx, const void *in, void *out) {
  molt__xf_setp(cx, out, molt__xf_ptr(cx, *(void *const *)in, NULL, 1));
}
static void fix_pool(molt__xf_ctx *cx, const void *in_, void *out_) {
  const struct molt_o_pool *in = in_;
  struct pool *out = out_;
  molt__xf_setp(cx, &out->slots, molt__xf_ptr(cx, in->slots, &xt_entryp, in->n));
}

/* v2 has no `scratch`: the rule frees v1's buffer -- and, to exercise the
 * safety rules, asks for it twice, for an address inside it, for a node the
 * engine replaces anyway and an address inside one, for a variable of the
 * old image and for NULL.  Only the buffer and the node may be freed, each
 * once (a double or interior free crashes the plain build and is reported
 * by AddressSanitizer). */
static void free_old_rule(molt__xf_ctx *cx) {
  char *s = *(char **)molt__xf_oldsym(cx, "scratch", NULL);
  char *h = *(char **)molt__xf_oldsym(cx, "head", NULL);
  molt__xf_free_old(cx, s);
  molt__xf_free_old(cx, s);
  molt__xf_free_old(cx, s + 16);
  molt__xf_free_old(cx, h);
  molt__xf_free_old(cx, h + 8);
  molt__xf_free_old(cx, molt__xf_oldsym(cx, "counter", NULL));
  molt__xf_free_old(cx, NULL);
}

static void migrate(molt__xf_ctx *cx) {
  if (xf_mode == XM_FREE_OLD || xf_mode == XM_FREE_OLD_FAIL)
    free_old_rule(cx);
  molt__xf_var(cx, molt__xf_oldsym(cx, "counter", NULL), &counter, &xt_int, 1);
  molt__xf_var(cx, molt__xf_oldsym(cx, "hidden_counter", "prog.c"), &hidden_counter,
               &xt_int, 1);
  molt__xf_var(cx, molt__xf_oldsym(cx, "table", NULL), table, &xt_entry, 4);
  molt__xf_var(cx, molt__xf_oldsym(cx, "head", NULL), &head, &xt_entryp, 1);
  molt__xf_var(cx, molt__xf_oldsym(cx, "shared_a", NULL), &shared_a, &xt_entryp, 1);
  molt__xf_var(cx, molt__xf_oldsym(cx, "shared_b", NULL), &shared_b, &xt_entryp, 1);
  molt__xf_var(cx, molt__xf_oldsym(cx, "counter_ptr", NULL), &counter_ptr, &xt_intp, 1);
  molt__xf_var(cx, molt__xf_oldsym(cx, "table_ptr", NULL), &table_ptr, &xt_entryp, 1);
  molt__xf_var(cx, molt__xf_oldsym(cx, "greeting", NULL), &greeting, &xt_charp, 1);
  molt__xf_var(cx, molt__xf_oldsym(cx, "pool", NULL), &pool, &xt_pool, 1);
  molt__xf_var(cx, molt__xf_oldsym(cx, "interior", NULL), &interior, &xt_charp, 1);
  molt__xf_local(cx, "serve", "cur", &xt_entryp);
  molt__xf_local(cx, "serve", "w", &xt_entry);
  if (xf_mode == XM_FAIL_AFTER_RUN) {
    molt__xf_run(cx); /* in-place writes into the old pool happened */
    molt__xf_fail(cx, "rule for pool refused %zu slots", pool.n);
  }
  if (xf_mode == XM_FREE_OLD_FAIL) {
    molt__xf_run(cx);
    molt__xf_fail(cx, "refused after asking to free old objects");
  }
  if (xf_mode == XM_NULL_WRITE) {
    molt__xf_run(cx);
    poke_null();
  }
  molt__xf_run(cx);
}

/* Frees the migrated state (the test's leak check). */
void v2_free_all(void) {
  struct entry *e = head;
  if (pool.slots) {
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
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  return counter;
}

MOLT_EXTERN const molt__program_info molt__program = {MOLT__PROGRAM_ABI, 0,
                                                      "0123456789abcdef", migrate};
