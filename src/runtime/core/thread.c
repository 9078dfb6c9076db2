/* The thread registry: every thread that has called an updatable function.
 *
 * Registration is lazy (first call of an updatable function takes the slow
 * path in molt__enter), so pthread_create itself costs nothing extra (guarantee
 * P3; PSU registered at creation and paid up to 24x).  A pthread key
 * destructor unregisters the thread when it exits.
 *
 * Lock: reg_lock protects the list (its place in the order: base.h).  The
 * reclaimer and status scan it inside molt__rt_lock; application threads
 * take it only to register and to unregister at exit. */
#include "core/core.h"

/* The fast-path part of the per-thread state (layout fixed by molt/abi.h). */
__thread molt__thread molt__self __attribute__((tls_model("initial-exec")));

typedef struct reg {
  molt__thread *t;
  pid_t tid;
  bool registered;
  /* The thread's own stack, [stack_lo, stack_hi) (0, 0: not known): every
   * frame of the thread lies there unless it runs on another stack (a
   * signal handler on sigaltstack, a coroutine), which proofs refuse
   * (core/proof.c). */
  uintptr_t stack_lo, stack_hi;
  molt__link link;
} reg;

static __thread reg self_reg __attribute__((tls_model("initial-exec")));
static molt__lock reg_lock = MOLT__LOCK_INIT(reg);
static molt__link *head;
static pthread_key_t exit_key;
static bool key_ok;
static void (*exit_hook)(void);

static void on_thread_exit(void *arg) {
  reg *r = arg;
  molt__lock_acquire(&reg_lock);
  if (r->registered) {
    molt__list_unlink(&head, &r->link);
    r->registered = false;
  }
  molt__lock_release(&reg_lock);
  if (exit_hook)
    exit_hook();
  /* A later TLS destructor that calls an updatable function registers the
   * thread again (pthread_setspecific re-arms this destructor). */
  r->t->viewp = NULL;
  atomic_store_explicit(&r->t->view, NULL, memory_order_relaxed);
}

void molt__threads_init(void) {
  key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0;
}

/* Set once by the runtime's initialization, before any thread can exit
 * registered (a thread registers only after libmolt's constructors ran). */
void molt__threads_on_exit(void (*fn)(void)) { exit_hook = fn; }

void molt__thread_register(void) {
  molt__thread *t = &molt__self;
  reg *r = &self_reg;
  if (t->viewp)
    return;
  /* In a forked child, the first registration starts the runtime thread. */
  molt__start_if_needed();
  r->t = t;
  r->tid = molt__gettid();
  if (!r->stack_hi) {
    /* Once per thread (the main thread's bounds come from /proc/self/maps
     * inside glibc). */
    pthread_attr_t a;
    if (pthread_getattr_np(pthread_self(), &a) == 0) {
      void *addr;
      size_t size;
      if (pthread_attr_getstack(&a, &addr, &size) == 0) {
        r->stack_lo = (uintptr_t)addr;
        r->stack_hi = (uintptr_t)addr + size;
      }
      pthread_attr_destroy(&a);
    }
  }
  molt__lock_acquire(&reg_lock);
  if (!r->registered) {
    molt__list_push(&head, &r->link);
    r->registered = true;
  }
  molt__lock_release(&reg_lock);
  if (key_ok)
    pthread_setspecific(exit_key, r);
  /* Set only after the thread is in the list: from here on its counters can
   * pin a generation, so the reclaimer must already be able to see them.
   * The mutex release above orders the insertion before this store, and a
   * reclaimer that scanned before our insertion had published its new
   * generation before that scan, so our first recheck sees it (the mutex
   * acquire in our insertion synchronizes with the reclaimer's release). */
  t->viewp = &molt__current;
}

void molt__threads_foreach(void (*fn)(void *arg, const molt__thread *t, pid_t tid),
                           void *arg) {
  molt__lock_acquire(&reg_lock);
  for (molt__link *l = head; l; l = l->next) {
    reg *r = MOLT__CONTAINER(l, reg, link);
    fn(arg, r->t, r->tid);
  }
  molt__lock_release(&reg_lock);
}

void molt__thread_own_stack(uintptr_t *lo, uintptr_t *hi) {
  *lo = self_reg.stack_lo;
  *hi = self_reg.stack_hi;
}

bool molt__thread_stack_of(pid_t tid, uintptr_t *lo, uintptr_t *hi) {
  bool found = false;
  molt__lock_acquire(&reg_lock);
  for (molt__link *l = head; l && !found; l = l->next) {
    reg *r = MOLT__CONTAINER(l, reg, link);
    if (r->tid == tid && r->stack_hi) {
      *lo = r->stack_lo;
      *hi = r->stack_hi;
      found = true;
    }
  }
  molt__lock_release(&reg_lock);
  return found;
}

void molt__threads_set_views(molt__gen *g) {
  molt__lock_acquire(&reg_lock);
  for (molt__link *l = head; l; l = l->next) {
    reg *r = MOLT__CONTAINER(l, reg, link);
    /* A thread may race us in molt_quiesce with an older value; its recheck
     * against molt__current (already g) then moves it to g itself.
     * release: pairs with the acquire recheck in molt__enter. */
    if (atomic_load_explicit(&r->t->view, memory_order_relaxed))
      atomic_store_explicit(&r->t->view, g, memory_order_release);
  }
  molt__lock_release(&reg_lock);
}

void molt__threads_lock(void) { molt__lock_acquire(&reg_lock); }
void molt__threads_unlock(void) { molt__lock_release(&reg_lock); }

/* In the child of fork() only the forking thread exists.  The parent's
 * fork handler held reg_lock across fork(), so the list is consistent. */
void molt__threads_after_fork_child(void) {
  reg *self = self_reg.registered ? &self_reg : NULL;
  head = NULL;
  if (self) {
    self->tid = molt__gettid();
    molt__list_push(&head, &self->link);
  }
  molt__lock_reinit(&reg_lock);
}
