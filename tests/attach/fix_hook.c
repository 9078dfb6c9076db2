/* The attach patch of the pointer tests: setup() registers the patch's own
 * thrice() under the label "patched" -- slot 3 only the label, with the
 * program's twice() -- so the program's tables hold pointers into the
 * patch (its code, its string literals) that it keeps calling and reading
 * after a rollback. */
struct handler {
  long (*fn)(long);
  const char *label;
};
struct handler *handler_slot(long k);
long twice(long n);

static long thrice(long n) { return 3 * n; }

long setup(long k) {
  struct handler *h = handler_slot(k);
  if (!h)
    return -1;
  h->fn = k == 3 ? twice : thrice;
  h->label = k == 3 ? "patched-label" : "patched";
  return 1;
}
