/* The registry of modes (switch.h, struct molt__mode): the modes plug in
 * here, and everything below and beside them reaches them only through
 * these hooks.
 *
 * Registration happens in libmolt's constructors, before the runtime thread
 * starts and before any code of the program runs; the count is published
 * with a release store anyway, and every reader loads it with acquire, so a
 * hook never sees a half-written slot.  The current mode changes once at
 * most (a program image starts), also published with release/acquire. */
#include "switch/switch.h"

#define MAX_MODES 4

static const molt__mode *modes[MAX_MODES];
static _Atomic unsigned nmodes;
static _Atomic(const molt__mode *) entered;

void molt__mode_register(const molt__mode *m) {
  unsigned n = atomic_load_explicit(&nmodes, memory_order_relaxed);
  if (n == MAX_MODES) {
    molt__fail("cannot register mode %s: at most %d modes", m->name, MAX_MODES);
    return;
  }
  modes[n] = m;
  atomic_store_explicit(&nmodes, n + 1, memory_order_release);
}

static unsigned count(void) {
  return atomic_load_explicit(&nmodes, memory_order_acquire);
}

void molt__mode_enter(const molt__mode *m) {
  atomic_store_explicit(&entered, m, memory_order_release);
}

const molt__mode *molt__mode_current(void) {
  const molt__mode *m = atomic_load_explicit(&entered, memory_order_acquire);
  if (m)
    return m;
  unsigned n = count();
  for (unsigned i = 0; i < n; i++)
    if (modes[i]->initial)
      return modes[i];
  return NULL;
}

const molt__mode *molt__mode_for_op(unsigned op) {
  const molt__mode *cur = molt__mode_current();
  if (!cur || op >= MOLT__OP_END)
    return NULL;
  if (cur->ops[op])
    return cur;
  unsigned n = count();
  for (unsigned i = 0; i < n; i++)
    if ((modes[i]->within & cur->bit) && modes[i]->ops[op])
      return modes[i];
  return NULL;
}

int molt__modes_veto(const molt__mode *handler, const molt__op_info *op, char *err,
                     size_t errlen) {
  unsigned n = count();
  for (unsigned i = 0; i < n; i++) {
    if (modes[i] == handler || !modes[i]->veto)
      continue;
    int rc = modes[i]->veto(op, err, errlen);
    if (rc < 0)
      return rc;
  }
  return 0;
}

void molt__modes_on_park(void *frame, const char *point, molt__verdict pending) {
  unsigned n = count();
  for (unsigned i = 0; i < n; i++)
    if (modes[i]->on_park)
      modes[i]->on_park(frame, point, pending);
}

void molt__modes_on_release(molt__verdict verdict) {
  unsigned n = count();
  for (unsigned i = 0; i < n; i++)
    if (modes[i]->on_release)
      modes[i]->on_release(verdict);
}

bool molt__modes_own_exit(void) {
  unsigned n = count();
  bool owned = false;
  for (unsigned i = 0; i < n; i++)
    if (modes[i]->owns_exit && modes[i]->owns_exit())
      owned = true;
  return owned;
}

void molt__modes_fork_prepare(void) {
  unsigned n = count();
  for (unsigned i = 0; i < n; i++)
    if (modes[i]->fork_prepare)
      modes[i]->fork_prepare();
}

void molt__modes_fork_parent(void) {
  for (unsigned i = count(); i-- > 0;)
    if (modes[i]->fork_parent)
      modes[i]->fork_parent();
}

void molt__modes_fork_child(void) {
  for (unsigned i = count(); i-- > 0;)
    if (modes[i]->fork_child)
      modes[i]->fork_child();
}

void molt__modes_status(molt__buf *out) {
  unsigned n = count();
  for (unsigned i = 0; i < n; i++)
    if (modes[i]->status)
      modes[i]->status(out);
}

void molt__modes_describe_thread(pid_t tid, char *buf, size_t len) {
  if (!len)
    return;
  buf[0] = '\0';
  unsigned n = count();
  for (unsigned i = 0; i < n && !buf[0]; i++)
    if (modes[i]->describe_thread)
      modes[i]->describe_thread(tid, buf, len);
}

void molt__modes_reclaim(void) {
  unsigned n = count();
  for (unsigned i = 0; i < n; i++)
    if (modes[i]->reclaim)
      modes[i]->reclaim();
}

void molt__modes_deferred(void) {
  unsigned n = count();
  for (unsigned i = 0; i < n; i++)
    if (modes[i]->deferred)
      modes[i]->deferred();
}
