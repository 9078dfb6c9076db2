/* The thread registry: every thread that has called an updatable function.
 *
 * Registration is lazy (first call of an updatable function takes the slow
 * path in molt__enter), so pthread_create itself costs nothing extra (SPEC
 * P3; PSU registered at creation and paid up to 24x).  A pthread key
 * destructor unregisters the thread when it exits.
 *
 * Lock: reg_lock protects the list.  It nests inside molt__rt_lock (the
 * reclaimer scans with both held) and outside the log lock.  Application
 * threads take it only to register and to unregister at exit. */
#include "internal.h"

#include <string.h>
#include <sys/prctl.h>

/* The fast-path part of the per-thread state (layout fixed by molt.h). */
__thread molt__thread molt__self __attribute__((tls_model("initial-exec")));

typedef struct reg {
  molt__thread *t;
  pid_t tid;
  bool registered;
  struct reg *prev, *next;
} reg;

static __thread reg self_reg __attribute__((tls_model("initial-exec")));
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static reg *head;
static size_t count;
static pthread_key_t exit_key;
static bool key_ok;

static void unlink_locked(reg *r) {
  if (r->prev)
    r->prev->next = r->next;
  else
    head = r->next;
  if (r->next)
    r->next->prev = r->prev;
  r->prev = r->next = NULL;
  r->registered = false;
  count--;
}

static void on_thread_exit(void *arg) {
  reg *r = arg;
  pthread_mutex_lock(&reg_lock);
  if (r->registered)
    unlink_locked(r);
  pthread_mutex_unlock(&reg_lock);
  molt__timing_thread_exit();
  /* A later TLS destructor that calls an updatable function registers the
   * thread again (pthread_setspecific re-arms this destructor). */
  r->t->viewp = NULL;
  atomic_store_explicit(&r->t->view, NULL, memory_order_relaxed);
}

void molt__threads_init(void) {
  key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0;
}

void molt__thread_register(void) {
  molt__thread *t = &molt__self;
  reg *r = &self_reg;
  if (t->viewp)
    return;
  molt__runtime_started();
  r->t = t;
  r->tid = molt__gettid();
  pthread_mutex_lock(&reg_lock);
  if (!r->registered) {
    r->prev = NULL;
    r->next = head;
    if (head)
      head->prev = r;
    head = r;
    r->registered = true;
    count++;
  }
  pthread_mutex_unlock(&reg_lock);
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

void molt__threads_foreach(void (*fn)(void *arg, const molt__thread *t,
                                      pid_t tid, const char *name),
                           void *arg) {
  pthread_mutex_lock(&reg_lock);
  for (reg *r = head; r; r = r->next)
    fn(arg, r->t, r->tid, NULL);
  pthread_mutex_unlock(&reg_lock);
}

size_t molt__threads_count(void) {
  pthread_mutex_lock(&reg_lock);
  size_t n = count;
  pthread_mutex_unlock(&reg_lock);
  return n;
}

void molt__threads_set_views(molt__gen *g) {
  pthread_mutex_lock(&reg_lock);
  for (reg *r = head; r; r = r->next)
    /* A thread may race us in molt_quiesce with an older value; its recheck
     * against molt__current (already g) then moves it to g itself.
     * release: pairs with the acquire recheck in molt__enter. */
    if (atomic_load_explicit(&r->t->view, memory_order_relaxed))
      atomic_store_explicit(&r->t->view, g, memory_order_release);
  pthread_mutex_unlock(&reg_lock);
}

void molt__threads_lock(void) { pthread_mutex_lock(&reg_lock); }
void molt__threads_unlock(void) { pthread_mutex_unlock(&reg_lock); }

/* In the child of fork() only the forking thread exists.  The parent's
 * fork handler held reg_lock across fork(), so the list is consistent. */
void molt__threads_after_fork_child(void) {
  reg *self = self_reg.registered ? &self_reg : NULL;
  head = NULL;
  count = 0;
  if (self) {
    self->prev = self->next = NULL;
    self->tid = molt__gettid();
    head = self;
    count = 1;
  }
  pthread_mutex_init(&reg_lock, NULL);
}
