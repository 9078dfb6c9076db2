/* Running a program image (full updates, docs/full-updates.md): the driver
 * (molt__program_run), program threads (__wrap_pthread_create), restart
 * frames, molt_is_updating*, MOLT_MIGRATE_LOCAL, the update operation, and
 * the full mode's registration with its hooks.
 *
 * Program threads.  The main thread of `molt run` and every thread the
 * image starts with pthread_create (images are linked with
 * --wrap=pthread_create, so those calls land in __wrap_pthread_create) get
 * a record (molt__pthread) and a restart frame: a sigsetjmp in the driver
 * or in the thread's trampoline, below the image's own frames.  A full
 * update that commits releases the barrier with the verdict `restart`; each
 * program thread then siglongjmps from molt_update_point() to its restart
 * frame (the mode's on_release hook) and calls the new version's main or
 * entry function.  The OS thread stays the same: PID, TIDs and pthread_t
 * values stay valid.
 *
 * Locks.  prog_lock protects the registry (the thread list, the current and
 * retired images, nupdating, nupdates).  It is taken by the pthread wrapper
 * and the trampoline at thread start and exit, by a thread at its first
 * update point after a restart, by status and by the runtime thread.  It is
 * never held while waiting on anything, never across dlopen/dlclose, and
 * nests as base.h's lock table says (the fork handler holds it with
 * molt__rt_lock inside; a parking thread's on_park hook runs under bar_lock
 * and touches only the thread's own record, without prog_lock).
 *
 * Per-thread data that is not under prog_lock (registrations, snapshots,
 * restart targets) is written either by the thread itself or by the
 * runtime thread while the thread is parked in the barrier; the barrier's
 * bar_lock orders the two (see switch/points.c). */
#include "full/full.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <semaphore.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* Registrations kept per thread: frames that returned are dropped when a
 * shallower frame registers, so this only bounds pathological programs. */
#define MAX_REGS 256
/* Frames followed from an update point towards the thread's start. */
#define MAX_CHAIN 512

/* One MOLT_MIGRATE_LOCAL registration of the running version.  func and
 * name are literals of the image that registered them (dropped at a
 * restart, before that image can be unloaded). */
typedef struct molt__reg {
  const char *func, *name;
  void *addr;
  size_t size;
  uintptr_t frame;
  /* The return address saved in that frame when it registered: a later
   * call that reuses the frame's address (the registering call returned)
   * has another one, unless it comes from the same call site. */
  uintptr_t ret;
} molt__reg;

/* A program thread: the main thread of `molt run`, or a thread the image
 * started with pthread_create (__wrap_pthread_create).  Lives from the
 * thread's start to its exit; linked into the registry (prog_lock).
 * Fields marked (parked) are written by the runtime thread only while the
 * thread is parked in a barrier, and read by the thread after it wakes
 * (bar_lock orders both). */
typedef struct molt__pthread molt__pthread;
struct molt__pthread {
  pid_t tid;
  bool is_main;
  void *(*entry)(void *);                /* entry of the running version (parked) */
  void *arg;                             /* its argument (parked) */
  int (*main_fn)(int, char **, char **); /* main thread: main (parked) */
  char *entry_name, *entry_tu;           /* (name, tu) of entry in its image; NULL:
                                  not a function of the image */
  uintptr_t stack_lo, stack_hi;          /* the thread's stack, for frame walks */
  /* Written by the thread (under prog_lock) and by the runtime thread
   * (parked, under prog_lock); read without lock by the thread itself:
   * relaxed atomic. */
  _Atomic bool updating;
  char *from_point;            /* point the old version parked at (copy) */
  char *parked_point;          /* point of the current park (copy, bar_lock) */
  bool snap_failed;            /* snapshot of its locals ran out of memory */
  bool restart;                /* (parked) restart when released */
  void *(*next_entry)(void *); /* (parked) resolved in the new image */
  molt__reg *regs;             /* MOLT_MIGRATE_LOCAL registrations (own) */
  size_t nregs;
  molt__saved_local *saved; /* snapshot at the update point */
  void *restart_env;        /* sigjmp_buf of its restart frame */
  molt__link link;          /* in the registry (prog_lock) */
};

/* The calling thread's record, or NULL if it is not a program thread. */
static __thread molt__pthread *pthread_self_rec
    __attribute__((tls_model("initial-exec")));

static molt__lock prog_lock = MOLT__LOCK_INIT(prog);
static molt__link *threads;  /* prog_lock */
static molt__image *current; /* running image (prog_lock; changed only by
                                  the runtime thread under op_lock) */
static molt__image *retired; /* old image awaiting F7 (prog_lock) */
static size_t nupdating;     /* restarted threads still updating (prog_lock) */
static uint64_t nupdates;    /* committed full updates (prog_lock) */
/* Why the last full update that reached its migration aborted, until one
 * commits (malloc'ed, prog_lock): `molt status` shows it. */
static char *last_abort;
/* Set once by the driver before the image runs; read by the wrapper and
 * the runtime.  release/acquire: a reader that sees true sees `current`. */
static _Atomic bool active;

/* The driver's arguments (set once before the image runs): a follower of a
 * shadowed update calls the new main with them in a new thread. */
static int run_argc;
static char **run_argv;
/* The next fork() is a shadowed update's (set by the runtime thread under
 * op_lock while every program thread is parked, read by the fork
 * handlers): its child keeps every thread record, to relaunch them. */
static bool keep_at_fork;

/* The shadow layer's hooks around thread creation and exit (full.h), set
 * by a constructor before the image runs; NULL: none. */
static const molt__program_thread_hooks *thread_hooks;

void molt__program_set_thread_hooks(const molt__program_thread_hooks *h) {
  thread_hooks = h;
}

static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static bool key_ok;

static const molt__mode full_mode;

static molt__pthread *thread_at(molt__link *l) {
  return l ? MOLT__CONTAINER(l, molt__pthread, link) : NULL;
}

/* ---- thread records ---------------------------------------------------------*/

static void free_saved_list(molt__saved_local *l) {
  while (l) {
    molt__saved_local *next = l->next;
    free(l->func);
    free(l->name);
    free(l->old_copy);
    free(l->new_value);
    free(l);
    l = next;
  }
}

static void free_record(molt__pthread *t) {
  free_saved_list(t->saved);
  free(t->regs);
  free(t->entry_name);
  free(t->entry_tu);
  free(t->from_point);
  free(t->parked_point);
  free(t);
}

static void end_thread(molt__pthread *t);

static void on_thread_exit(void *arg) {
  /* pthread_exit() from image code: the trampoline never sees the return. */
  if (arg)
    end_thread(arg);
}

static void make_key(void) {
  key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0;
}

static void stack_bounds(molt__pthread *t) {
  pthread_attr_t a;
  void *addr = NULL;
  size_t size = 0;
  if (pthread_getattr_np(pthread_self(), &a) == 0) {
    if (pthread_attr_getstack(&a, &addr, &size) != 0)
      addr = NULL;
    pthread_attr_destroy(&a);
  }
  if (addr) {
    t->stack_lo = (uintptr_t)addr;
    t->stack_hi = (uintptr_t)addr + size;
  } else {
    /* Unknown: no walk at all (its locals do not migrate).  Guessing a
     * range could make the walk read past the end of the mapped stack,
     * following a frame pointer register that code built without frame
     * pointers used for data, and fault in the parked thread. */
    t->stack_lo = t->stack_hi = 0;
  }
}

/* The calling thread becomes program thread t: a barrier participant
 * first (so a barrier that completes from now on includes it), then a
 * registry member. */
static void begin_thread(molt__pthread *t) {
  t->tid = molt__gettid();
  stack_bounds(t);
  pthread_self_rec = t;
  molt__point_join();
  pthread_once(&key_once, make_key);
  if (key_ok)
    pthread_setspecific(exit_key, t);
  molt__lock_acquire(&prog_lock);
  molt__list_push(&threads, &t->link);
  molt__lock_release(&prog_lock);
}

static void end_thread(molt__pthread *t) {
  /* Not cancellable half-way (molt__wake writes): a thread
   * cancelled between leaving the registry and leaving the barrier would
   * stay a participant for ever. */
  int cs;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
  if (thread_hooks)
    thread_hooks->exiting();
  bool kick = false;
  molt__lock_acquire(&prog_lock);
  molt__list_unlink(&threads, &t->link);
  /* relaxed: prog_lock orders it against status and the runtime. */
  if (atomic_load_explicit(&t->updating, memory_order_relaxed)) {
    atomic_store_explicit(&t->updating, false, memory_order_relaxed);
    if (nupdating && --nupdating == 0 && retired)
      kick = true;
  }
  molt__lock_release(&prog_lock);
  if (kick)
    molt__wake();
  /* Out of the registry first, then out of the barrier (an update that
   * completes from now on neither waits for us nor touches t).  Cleared
   * before, so that our owns_exit hook does not take it over again. */
  pthread_self_rec = NULL;
  molt__point_leave(); /* idempotent; the updater may wait for us */
  free_record(t);
  pthread_setcancelstate(cs, NULL);
}

/* The calling thread is past the end of its entry function or main (in
 * pthread_exit()'s key destructors): it must not restart. */
static __thread bool exiting __attribute__((tls_model("initial-exec")));

/* The mode's owns_exit hook.  True while the calling program thread's
 * record is still in the registry: end_thread then takes it out of the
 * barrier itself, after it has left the registry, so that an update never
 * commits while an exiting thread may still run old code.  Called when the
 * thread registry's key destructor runs (core/thread.c: its key is older
 * than ours, so it runs first), i.e. the thread exits.  Only this thread
 * reads or writes its pthread_self_rec and `exiting`.  Without our key,
 * pthread_exit() never reaches end_thread: the barrier must then let the
 * thread go itself. */
static bool full_owns_exit(void) {
  if (!pthread_self_rec)
    return false;
  exiting = true;
  return key_ok;
}

typedef struct start {
  molt__pthread *t;
  uintptr_t token; /* thread_hooks' */
  pid_t tid;       /* the new thread's, written before it posts */
  sem_t started;   /* on the creator's stack: posted once, never touched after */
} start;

static void *trampoline(void *p) {
  start *s = p;
  molt__pthread *t = s->t; /* not modified after sigsetjmp below */
  uintptr_t token = s->token;
  begin_thread(t);
  s->tid = t->tid;
  sem_post(&s->started); /* s may be gone from here on */
  if (thread_hooks)
    thread_hooks->started(token);
  sigjmp_buf env;
  t->restart_env = &env;
  /* Restart frame.  A full update siglongjmps here with t->entry and
   * t->arg already set to the new version's entry and the (redirected)
   * argument; the signal mask is the one the thread started with. */
  (void)sigsetjmp(env, 1);
  void *ret = t->entry(t->arg);
  if (key_ok)
    pthread_setspecific(exit_key, NULL);
  end_thread(t);
  return ret;
}

static char *dup_or_null(const char *s, bool *oom) {
  if (!s)
    return NULL;
  char *d = strdup(s);
  if (!d)
    *oom = true;
  return d;
}

MOLT_EXTERN int __wrap_pthread_create(pthread_t *th, const pthread_attr_t *attr,
                                      void *(*fn)(void *), void *arg) {
  /* acquire: pairs with the driver's release store of `active`. */
  if (!atomic_load_explicit(&active, memory_order_acquire) || !fn)
    return pthread_create(th, attr, fn, arg);
  molt__pthread *t = calloc(1, sizeof *t);
  if (!t)
    return EAGAIN;
  t->entry = fn;
  t->arg = arg;
  bool oom = false;
  /* The current image cannot be unloaded while we hold prog_lock: it is
   * retired (under prog_lock) before it is closed. */
  molt__lock_acquire(&prog_lock);
  const char *name = NULL, *tu = NULL;
  uintptr_t start_addr = 0;
  bool is_func = false;
  if (current &&
      molt__image_sym_at(current, (uintptr_t)fn, &name, &tu, &start_addr, NULL,
                         &is_func) &&
      is_func && start_addr == (uintptr_t)fn) {
    t->entry_name = dup_or_null(name, &oom);
    t->entry_tu = dup_or_null(tu, &oom);
  }
  molt__lock_release(&prog_lock);
  if (oom) {
    free_record(t);
    return EAGAIN;
  }
  start s = {.t = t};
  if (thread_hooks) {
    int refused = thread_hooks->creating(t->entry_name, &s.token);
    if (refused) {
      free_record(t);
      return refused;
    }
  }
  int rc = sem_init(&s.started, 0, 0) != 0 ? EAGAIN : 0;
  if (rc == 0) {
    rc = pthread_create(th, attr, trampoline, &s);
    if (rc != 0)
      sem_destroy(&s.started);
  }
  if (rc != 0) {
    if (thread_hooks)
      thread_hooks->created(s.token, rc, 0);
    free_record(t);
    return rc;
  }
  /* Wait until the thread is a participant: returning earlier would let
   * an update complete (we could park right away) without it, and it
   * would then start in the old version after the switch.  sem_wait is a
   * cancellation point and pthread_create is not one: a creator cancelled
   * here would unwind `s` while the new thread still posts to it. */
  int cs;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
  while (sem_wait(&s.started) != 0 && errno == EINTR)
    ;
  pthread_setcancelstate(cs, NULL);
  sem_destroy(&s.started);
  if (thread_hooks)
    thread_hooks->created(s.token, 0, s.tid);
  return 0;
}

/* ---- the driver ---------------------------------------------------------------*/

/* Why the driver could not start the image: into the log (the runtime
 * never writes to its host's stdout or stderr, R3) and to the caller,
 * which is the driver and tells the user. */
static int cannot_run(const char *path, int rc, char *err, size_t errlen, const char *fmt,
                      ...) __attribute__((format(printf, 5, 6)));
static int cannot_run(const char *path, int rc, char *err, size_t errlen, const char *fmt,
                      ...) {
  char why[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  molt__log(MOLT__EV_REFUSE, molt__gen_number_now(), NULL, "run %s refused: %s",
            path && *path ? path : "(none)", why);
  molt__errmsg(err, errlen, "%s", why);
  return rc;
}

int molt__program_run(const char *path, int argc, char **argv, int *status, char *err,
                      size_t errlen) {
  if (errlen)
    err[0] = '\0';
  if (!path || !*path)
    return cannot_run(path, MOLT_EINVAL, err, errlen, "no program image given");
  /* libmolt's constructor started the runtime thread and the control
   * socket; in a forked child this starts them (no-op otherwise). */
  molt__start_if_needed();
  char why[1024] = "";
  molt__image *im = NULL;
  int rc = molt__image_open(path, -1, &im, why, sizeof why);
  if (rc < 0)
    return cannot_run(path, rc, err, errlen, "%s", why[0] ? why : molt_strerror(rc));
  molt__pthread *t = calloc(1, sizeof *t);
  char *mname = strdup("main");
  if (!t || !mname) {
    free(t);
    free(mname);
    molt__image_close(im);
    return cannot_run(path, MOLT_ENOMEM, err, errlen, "out of memory");
  }
  molt__lock_acquire(&prog_lock);
  bool busy = current != NULL;
  if (!busy)
    current = im;
  molt__lock_release(&prog_lock);
  if (busy) {
    free(t);
    free(mname);
    molt__image_close(im);
    return cannot_run(path, MOLT_ENOTSUP, err, errlen,
                      "this process already runs a program image");
  }
  t->is_main = true;
  t->main_fn = im->main;
  run_argc = argc;
  run_argv = argv;
  t->entry_name = mname;
  /* A participant and in the registry BEFORE updates are accepted: an
   * update that ran in between would find no thread, commit, and leave
   * this thread to call the old main of an image it then unloads. */
  begin_thread(t);
  atomic_store_explicit(&active, true, memory_order_release);
  molt__mode_enter(&full_mode); /* from now on the process takes full updates */
  molt__log(MOLT__EV_INFO, molt__gen_number_now(), NULL,
            "running program image %s (build-id %s) in pid %d", im->path,
            im->build_id[0] ? im->build_id : "none", (int)getpid());
  sigjmp_buf env;
  t->restart_env = &env;
  /* Restart frame of the main thread: a full update comes back here with
   * t->main_fn set to the new main; same argc/argv. */
  (void)sigsetjmp(env, 1);
  *status = t->main_fn(argc, argv, environ);
  if (key_ok)
    pthread_setspecific(exit_key, NULL);
  end_thread(t);
  return 0;
}

/* ---- public API: updating state and migrated locals ----------------------------*/

int molt_is_updating(void) {
  molt__pthread *me = pthread_self_rec;
  /* relaxed: only this thread clears it; the runtime set it while we were
   * parked (ordered by bar_lock). */
  return me && atomic_load_explicit(&me->updating, memory_order_relaxed);
}

int molt_is_updating_from(const char *point) {
  molt__pthread *me = pthread_self_rec;
  return point && me && atomic_load_explicit(&me->updating, memory_order_relaxed) &&
         me->from_point && strcmp(me->from_point, point) == 0;
}

static bool same_str(const char *a, const char *b) { return a == b || strcmp(a, b) == 0; }

/* Records (func, name) -> (addr, size, frame) for the next update. */
static void register_local(molt__pthread *me, const char *func, const char *name,
                           void *addr, size_t size, uintptr_t frame) {
  /* The frame is live (the caller's own): its return address slot, next
   * to the saved frame pointer (x86-64 and AArch64 frame records), can be
   * read. */
  uintptr_t ret = frame ? ((const uintptr_t *)frame)[1] : 0;
  /* The caller's frame is the innermost live one of this thread (stacks
   * grow down): registrations of frames below it belong to calls that have
   * returned, and so do those of the same frame by another function or
   * from another call site.  The same (function, variable, frame) is
   * replaced. */
  size_t w = 0;
  for (size_t i = 0; i < me->nregs; i++) {
    molt__reg *r = &me->regs[i];
    if (r->frame < frame ||
        (r->frame == frame &&
         (r->ret != ret || !same_str(r->func, func) || same_str(r->name, name))))
      continue;
    me->regs[w++] = *r;
  }
  me->nregs = w;
  if (me->nregs == MAX_REGS) {
    memmove(me->regs, me->regs + 1, (MAX_REGS - 1) * sizeof *me->regs);
    me->nregs--;
  }
  if (!me->regs) {
    me->regs = malloc(MAX_REGS * sizeof *me->regs);
    if (!me->regs) {
      molt__log(
          MOLT__EV_INFO, 0, NULL,
          "thread %d: out of memory registering local %s of %s: it will not migrate",
          (int)me->tid, name, func);
      return;
    }
  }
  me->regs[me->nregs++] = (molt__reg){func, name, addr, size, frame, ret};
}

int molt_migrate_local(const char *func, const char *name, void *addr, size_t size,
                       void *frame) {
  molt__pthread *me = pthread_self_rec;
  if (!me || !func || !name || !addr || !size)
    return 0;
  register_local(me, func, name, addr, size, (uintptr_t)frame);
  if (!atomic_load_explicit(&me->updating, memory_order_relaxed))
    return 0;
  /* The saved list is this thread's own (the runtime filled it while we
   * were parked); each saved value is handed out once. */
  for (molt__saved_local *l = me->saved; l; l = l->next) {
    if (!l->new_value || strcmp(l->func, func) != 0 || strcmp(l->name, name) != 0)
      continue;
    int done = 0;
    if (l->new_size == size) {
      memcpy(addr, l->new_value, size);
      done = 1;
    } else {
      molt__log(MOLT__EV_INFO, 0, NULL,
                "thread %d: migrated local %s of %s has %zu bytes, the new variable %zu: "
                "left unchanged",
                (int)me->tid, name, func, l->new_size, size);
    }
    free(l->new_value);
    l->new_value = NULL;
    return done;
  }
  return 0;
}

/* ---- hooks of molt_update_point ---------------------------------------------------*/

/* A restarted program thread reaches its first update point in the new
 * version (armed by full_on_release with molt__point_call_next): it is no
 * longer updating, and the last such thread lets the old image go (F7). */
static void first_point(void) {
  molt__pthread *me = pthread_self_rec;
  if (!me || !atomic_load_explicit(&me->updating, memory_order_relaxed))
    return;
  /* Values no MOLT_MIGRATE_LOCAL asked for by now are dropped. */
  free_saved_list(me->saved);
  me->saved = NULL;
  bool kick = false;
  molt__lock_acquire(&prog_lock);
  atomic_store_explicit(&me->updating, false, memory_order_relaxed);
  if (nupdating && --nupdating == 0 && retired)
    kick = true;
  molt__lock_release(&prog_lock);
  if (kick)
    molt__wake(); /* the runtime thread unloads the old image (F7) */
}

/* The mode's on_park hook: a program thread parks for a full update
 * (bar_lock held; only this thread's record is touched): snapshot the live
 * migrated locals along the frame-pointer chain from `frame`; remember
 * `point`.  A snapshot of an earlier, failed attempt is stale. */
static void full_on_park(void *frame, const char *point, molt__verdict pending) {
  molt__pthread *me = pthread_self_rec;
  if (!me || pending != MOLT__VERDICT_RESTART)
    return;
  free_saved_list(me->saved);
  me->saved = NULL;
  me->snap_failed = false;
  free(me->parked_point);
  me->parked_point = strdup(point ? point : "");
  if (!me->parked_point)
    me->snap_failed = true;
  if (!me->nregs)
    return;
  /* The frame-pointer chain from molt_update_point's frame towards the
   * thread's start (images are built -fno-omit-frame-pointer).  Each
   * saved frame pointer must lie inside the stack, be aligned, and be
   * strictly above the previous one, so a frame of code built without
   * frame pointers ends the walk instead of sending it astray. */
  uintptr_t chain[MAX_CHAIN];
  size_t n = 0;
  uintptr_t f = (uintptr_t)frame;
  while (n < MAX_CHAIN && f >= me->stack_lo && f + 2 * sizeof(void *) <= me->stack_hi &&
         (f & (sizeof(void *) - 1)) == 0) {
    chain[n++] = f;
    uintptr_t next = *(const uintptr_t *)f;
    if (next <= f)
      break;
    f = next;
  }
  molt__saved_local **tail = &me->saved;
  for (size_t i = 0; i < me->nregs; i++) {
    const molt__reg *r = &me->regs[i];
    bool live = false;
    /* chain[k] + 2 words is inside the stack (checked by the walk). */
    for (size_t k = 0; k < n && !live; k++)
      live = chain[k] == r->frame && ((const uintptr_t *)chain[k])[1] == r->ret;
    if (!live)
      continue;
    molt__saved_local *l = calloc(1, sizeof *l);
    if (l) {
      l->func = strdup(r->func);
      l->name = strdup(r->name);
      l->old_copy = malloc(r->size);
    }
    if (!l || !l->func || !l->name || !l->old_copy) {
      free_saved_list(l);
      me->snap_failed = true;
      return;
    }
    memcpy(l->old_copy, r->addr, r->size);
    l->old_addr = r->addr;
    l->old_size = r->size;
    *tail = l;
    tail = &l->next;
  }
}

/* Released with the verdict restart: siglongjmps to the restart frame if
 * the update gave the thread a restart target, else returns. */
static void restart_self(molt__pthread *me) {
  if (!me->restart)
    return;
  me->restart = false;
  /* A key destructor of an exiting thread called molt_update_point: a
   * siglongjmp out of pthread_exit()'s destructor loop would be undefined.
   * The thread goes on exiting (molt_update_point returns 1); it counts
   * as updating (so the old image whose code it runs stays loaded) until
   * it reaches another update point or end_thread. */
  if (exiting)
    return;
  /* Registrations of the old version are gone with its frames (and name
   * literals of the image about to be unloaded). */
  me->nregs = 0;
  molt__point_restarted();
  /* Every updatable call this thread had in progress is abandoned with
   * its frame: drop its pins.  release, as in molt__leave: the reclaimer
   * reads the counters with acquire. */
  for (unsigned s = 0; s < MOLT__SLOTS; s++)
    atomic_store_explicit(&molt__self.active[s], 0, memory_order_release);
  siglongjmp(*(sigjmp_buf *)me->restart_env, 1);
}

/* The mode's on_release hook. */
static void full_on_release(molt__verdict verdict) {
  molt__pthread *me = pthread_self_rec;
  if (!me || verdict != MOLT__VERDICT_RESTART)
    return;
  /* The update committed and set us updating (it restarts every program
   * thread): our first update point in the new version ends that. */
  if (atomic_load_explicit(&me->updating, memory_order_relaxed))
    molt__point_call_next(first_point);
  restart_self(me); /* does not return if restarted */
}

static bool program_active(void) {
  return atomic_load_explicit(&active, memory_order_acquire);
}

/* Called by xf.c during a migration, on the runtime thread, while every
 * program thread is parked.  Deliberately without prog_lock: fn may abort
 * the migration with a siglongjmp (molt__xf_fail), which would leave the
 * lock held.  The list cannot change meanwhile: a thread that starts
 * during the step (its creator is not a program thread: those are parked)
 * waits in molt__point_join, before it enters the list, until the barrier
 * ends; a thread that exits leaves the barrier only after it left the
 * list (end_thread, full_owns_exit), so while it is in the list
 * and not parked the barrier cannot complete. */
void molt__program_foreach_local(void (*fn)(void *arg, molt__saved_local *l), void *arg) {
  for (molt__pthread *t = thread_at(threads); t; t = thread_at(t->link.next))
    for (molt__saved_local *l = t->saved; l; l = l->next)
      fn(arg, l);
}

/* ---- the update -------------------------------------------------------------------*/

typedef struct molt__full_update {
  molt__image *old, *new;
  bool check_interior;
  unsigned timeout_ms; /* also the migration's deadline */
  bool reached;        /* the barrier completed: the step ran */
  uint64_t gen;        /* generation after the commit */
  uint64_t objects, bytes, xf_ns, pause_ns;
  /* Of the pause, the time the migrating thread was on a CPU, and how often
   * the kernel preempted it: on a loaded machine the pause in wall time
   * includes the time other processes ran, which these separate out. */
  uint64_t pause_cpu_ns;
  long pause_preempted;
  size_t nthreads;
} upd;

/* CPU time of the calling thread and the involuntary context switches it
 * suffered so far (both 0 where the kernel does not tell). */
static void thread_cpu(uint64_t *ns, long *preempted) {
  struct timespec ts;
  *ns = clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0
            ? (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec
            : 0;
  struct rusage ru;
  *preempted = getrusage(RUSAGE_THREAD, &ru) == 0 ? ru.ru_nivcsw : 0;
}

/* Resolves the entry of every program thread in the new image into
 * t->next_entry.  prog_lock held.  0 or MOLT_ENOSYM with err set. */
static int resolve_entries(const upd *u, char *err, size_t errlen) {
  for (molt__pthread *t = thread_at(threads); t; t = thread_at(t->link.next)) {
    if (t->is_main)
      continue;
    if (t->entry_name) {
      void *e = molt__image_sym(u->new, t->entry_name, t->entry_tu);
      if (!e || !(molt__image_prot_at(u->new, (uintptr_t)e) & 1u /* PF_X */)) {
        molt__errmsg(err, errlen,
                     "the new image %s has no function '%s'%s%s%s, the entry function of "
                     "thread %d; a full update restarts every thread in the function of "
                     "the same name: keep it in the new version",
                     u->new->path, t->entry_name, t->entry_tu ? " (" : "",
                     t->entry_tu ? t->entry_tu : "", t->entry_tu ? ")" : "", (int)t->tid);
        return MOLT_ENOSYM;
      }
      t->next_entry = (void *(*)(void *))e;
    } else if (molt__image_prot_at(u->old, (uintptr_t)t->entry)) {
      molt__errmsg(err, errlen,
                   "thread %d was started in a function of the running image that has no "
                   "symbol, so it cannot be found in the new image",
                   (int)t->tid);
      return MOLT_ENOSYM;
    } else {
      t->next_entry = t->entry; /* outside the image: it stays loaded */
    }
  }
  return 0;
}

static void drop_snapshots(void) {
  /* Program threads are parked: the runtime thread may free their
   * snapshots.  prog_lock for the list (no thread can enter or leave it
   * during the step anyway, see molt__point_join and end_thread). */
  molt__lock_acquire(&prog_lock);
  for (molt__pthread *t = thread_at(threads); t; t = thread_at(t->link.next)) {
    free_saved_list(t->saved);
    t->saved = NULL;
  }
  molt__lock_release(&prog_lock);
}

/* At the commit: a signal handler that is a function of the old image
 * becomes the new image's function of the same name (flags and mask kept),
 * so that no program re-installs its handlers after an update and no
 * signal runs the old image once it is unloaded.  A handler the new image
 * lacks is left, and logged: the old image then stays callable only until
 * it is unloaded. */
static void redirect_signal_handlers(const molt__image *old, const molt__image *new,
                                     uint64_t gen) {
  for (int sig = 1; sig < NSIG; sig++) {
    struct sigaction sa;
    if (sigaction(sig, NULL, &sa) != 0)
      continue; /* the C library's own, or not a signal */
    uintptr_t h = (sa.sa_flags & SA_SIGINFO) ? (uintptr_t)sa.sa_sigaction
                                             : (uintptr_t)sa.sa_handler;
    if (h == (uintptr_t)SIG_DFL || h == (uintptr_t)SIG_IGN ||
        !molt__image_prot_at(old, h))
      continue;
    const char *name = NULL, *tu = NULL;
    uintptr_t start = 0;
    size_t size = 0;
    bool is_func = false;
    void *to = NULL;
    if (molt__image_sym_at(old, h, &name, &tu, &start, &size, &is_func) && is_func &&
        start == h)
      to = molt__image_sym(new, name, tu);
    if (!to) {
      molt__log(MOLT__EV_INFO, gen, NULL,
                "full update: the handler of signal %d (%s) has no function of the same "
                "name in the new version; it is left to the old image",
                sig, name ? name : "not a function's start");
      continue;
    }
    if (sa.sa_flags & SA_SIGINFO)
      sa.sa_sigaction = (void (*)(int, siginfo_t *, void *))to;
    else
      sa.sa_handler = (void (*)(int))to;
    sigaction(sig, &sa, NULL);
  }
}

/* The step run while every participant is parked (bar_lock not held). */
static int parked_step(void *arg, char *err, size_t errlen) {
  upd *u = arg;
  uint64_t t0 = molt__now_ns(), cpu0;
  long pre0;
  thread_cpu(&cpu0, &pre0);
  u->reached = true;
  int rc = 0;
  molt__lock_acquire(&prog_lock);
  for (molt__pthread *t = thread_at(threads); t && rc == 0; t = thread_at(t->link.next))
    if (t->snap_failed) {
      molt__errmsg(err, errlen, "out of memory saving the migrated locals of thread %d",
                   (int)t->tid);
      rc = MOLT_ENOMEM;
    }
  /* Again, now that no thread can start: one may have started since the
   * check before the barrier. */
  if (rc == 0)
    rc = resolve_entries(u, err, errlen);
  molt__lock_release(&prog_lock);
  if (rc < 0) {
    drop_snapshots();
    return rc;
  }

  molt__xf_ctx *cx = NULL;
  rc = molt__xf_begin(u->old, u->new, u->check_interior, &cx);
  if (rc < 0) {
    molt__errmsg(err, errlen, "cannot prepare the state migration: %s",
                 molt_strerror(rc));
    drop_snapshots();
    return rc;
  }
  /* The migration gets the update's timeout too, from now on: a rule that
   * loops must not hold the process for ever (F7: the update aborts). */
  molt__xf_set_limit(cx, u->timeout_ms);
  rc = molt__xf_migrate(cx, err, errlen);
  if (rc == 0) {
    molt__rt_lock_acquire();
    rc = molt__gen_bump(&u->gen);
    molt__rt_lock_release();
    if (rc < 0)
      molt__errmsg(err, errlen, "cannot number the new version: %s", molt_strerror(rc));
  }
  if (rc < 0) {
    molt__xf_end(cx, false); /* undoes in-place writes, frees new objects */
    drop_snapshots();
    return rc;
  }
  molt__xf_stats(cx, &u->objects, &u->bytes, &u->xf_ns);

  /* Commit.  Everything written here is read by each thread after it
   * wakes (bar_lock orders it); prog_lock orders it against status. */
  size_t n = 0;
  molt__lock_acquire(&prog_lock);
  for (molt__pthread *t = thread_at(threads); t; t = thread_at(t->link.next)) {
    if (t->is_main) {
      t->main_fn = u->new->main;
    } else {
      t->entry = t->next_entry;
      t->arg = molt__xf_redirect(cx, t->arg);
    }
    free(t->from_point);
    t->from_point = t->parked_point;
    t->parked_point = NULL;
    atomic_store_explicit(&t->updating, true, memory_order_relaxed);
    t->restart = true;
    n++;
  }
  /* Every thread restarted by an earlier update has reached an update
   * point in its new version (it is parked at one, and a restarted thread
   * stops updating at its first point), so nupdating is 0 and an image
   * the runtime thread has not unloaded yet can go now. */
  molt__image *earlier = retired;
  retired = u->old;
  nupdating = n;
  current = u->new;
  nupdates++;
  molt__lock_release(&prog_lock);
  molt__xf_end(cx, true); /* frees the replaced old heap objects */
  redirect_signal_handlers(u->old, u->new, u->gen);
  u->nthreads = n;
  /* A molt_on_update_pending callback of the old image would be called by
   * the next update after that image is unloaded: forget it (the new
   * version registers its own when it restarts, after this). */
  void (*cb)(void *) = molt__pending_cb();
  if (cb && molt__image_prot_at(u->old, (uintptr_t)cb))
    molt__pending_cb_forget(cb);
  if (earlier) {
    molt__log(MOLT__EV_UNLOAD, u->gen, NULL, "unloaded program image %s (build-id %s)",
              earlier->path, earlier->build_id);
    molt__image_close(earlier);
  }
  /* The CPU figures first: their interval lies inside the wall time's. */
  uint64_t cpu1;
  long pre1;
  thread_cpu(&cpu1, &pre1);
  u->pause_cpu_ns = cpu1 - cpu0;
  u->pause_preempted = pre1 - pre0;
  u->pause_ns = molt__now_ns() - t0;
  return 0;
}

/* Steps 1 to 4 of a full update (runtime thread, op_lock held): opens and
 * checks the new image, loads it, resolves the threads' entries in it.
 * Fills *u; logs a refusal.  On failure nothing is left loaded. */
static int update_prepare(const char *path, int fd, int timeout_ms, bool check_interior,
                          upd *u_out, char *err, size_t errlen) {
  uint64_t gen = molt__gen_number_now();
  if (!program_active()) {
    molt__errmsg(err, errlen,
                 "process %d does not run a program image; start the program with "
                 "'molt run <image.so>' to update it as a whole, or use 'molt apply' for "
                 "hot patches",
                 (int)getpid());
    molt__log(MOLT__EV_REFUSE, gen, NULL, "update %s refused: %s", path, err);
    return MOLT_ENOPROGRAM;
  }
  upd u = {.check_interior = check_interior,
           .timeout_ms = timeout_ms > 0 ? (unsigned)timeout_ms
                                        : (unsigned)MOLT__DEFAULT_TIMEOUT_MS};
  /* current changes only here, on the runtime thread under op_lock. */
  molt__lock_acquire(&prog_lock);
  u.old = current;
  molt__lock_release(&prog_lock);

  int rc = fd >= 0 ? molt__image_open(path, fd, &u.new, err, errlen) : MOLT_EPROTO;
  if (fd < 0) /* issue 16: never a path a client names */
    molt__errmsg(err, errlen,
                 "the request brought no open program image; this molt CLI is older than "
                 "the runtime (it must pass the file with SCM_RIGHTS: docs/protocol.md)");
  if (rc < 0) {
    molt__log(MOLT__EV_REFUSE, gen, NULL, "update %s refused: %s", path, err);
    return rc;
  }
  const char *from = u.new->info->from_build_id;
  if (!from || !*from) {
    molt__errmsg(err, errlen,
                 "%s is a first version (built without --molt-from), so it carries no "
                 "migration from the running image %s (build-id %s); build it with "
                 "moltcc --molt-from <running image>",
                 path, u.old->path, u.old->build_id[0] ? u.old->build_id : "none");
    rc = MOLT_EBUILDID;
  } else if (!u.old->build_id[0] || strcmp(from, u.old->build_id) != 0) {
    molt__errmsg(
        err, errlen,
        "%s was built from build-id %s, but the running image %s has build-id %s; "
        "rebuild it with --molt-from the running image",
        path, from, u.old->path, u.old->build_id[0] ? u.old->build_id : "none");
    rc = MOLT_EBUILDID;
  }
  if (rc == 0) {
    /* Before any thread is disturbed (step 4); again while parked. */
    molt__lock_acquire(&prog_lock);
    rc = resolve_entries(&u, err, errlen);
    molt__lock_release(&prog_lock);
  }
  if (rc < 0) {
    molt__image_close(u.new);
    molt__log(MOLT__EV_REFUSE, gen, NULL, "update %s refused: %s", path, err);
    return rc;
  }
  *u_out = u;
  return 0;
}

/* The full update (runtime thread, op_lock held): docs/full-updates.md.
 * Logs its own outcome (refused before the barrier, aborted after). */
static int program_update(const char *path, int fd, int timeout_ms, bool check_interior,
                          molt__buf *out, char *err, size_t errlen) {
  uint64_t gen = molt__gen_number_now();
  uint64_t t_start = molt__now_ns();
  upd u;
  int rc = update_prepare(path, fd, timeout_ms, check_interior, &u, err, errlen);
  if (rc < 0)
    return rc;

  rc = molt__barrier(timeout_ms, parked_step, &u, MOLT__VERDICT_RESTART, err, errlen);
  if (rc < 0) {
    /* The threads are running the old version again; nothing references
     * the new image. */
    molt__image_close(u.new);
    if (u.reached) {
      molt__log(MOLT__EV_ABORT, gen, NULL,
                "update to %s aborted, the old version goes on: %s", path, err);
      size_t n = strlen(path) + strlen(err) + 32;
      char *why = malloc(n);
      if (why)
        snprintf(why, n, "update to %s aborted: %s", path, err);
      molt__lock_acquire(&prog_lock);
      free(last_abort);
      last_abort = why; /* NULL when out of memory: nothing shown */
      molt__lock_release(&prog_lock);
    } else
      molt__log(MOLT__EV_REFUSE, gen, NULL, "update %s refused: %s", path, err);
    /* Snapshots taken by threads that parked before a timeout stay with
     * them (they are running again) until their next park or exit. */
    return rc;
  }
  molt__lock_acquire(&prog_lock);
  free(last_abort);
  last_abort = NULL;
  molt__lock_release(&prog_lock);
  double pause_ms = (double)u.pause_ns / 1e6;
  double cpu_ms = (double)u.pause_cpu_ns / 1e6;
  double total_ms = (double)(molt__now_ns() - t_start) / 1e6;
  molt__log(
      MOLT__EV_UPDATE, u.gen, NULL,
      "updated to %s (build-id %s, file %ju:%ju, sha256 %s) from %s: %zu threads "
      "restarted, %" PRIu64 " objects migrated (%" PRIu64
      " bytes), pause %.3f ms (on a CPU %.3f ms, preempted %ld times), total %.3f ms",
      u.new->path, u.new->build_id, (uintmax_t)u.new->ident.dev,
      (uintmax_t)u.new->ident.ino, u.new->ident.sha256, u.old->path, u.nthreads,
      u.objects, u.bytes, pause_ms, cpu_ms, u.pause_preempted, total_ms);
  char num[24], msg[768];
  snprintf(num, sizeof num, "%" PRIu64, u.gen);
  molt__buf_pair(out, "generation", num);
  snprintf(msg, sizeof msg,
           "%zu threads restarted in %s, %" PRIu64
           " objects migrated, pause %.3f ms (on a CPU %.3f ms, preempted %ld times)",
           u.nthreads, u.new->path, u.objects, pause_ms, cpu_ms, u.pause_preempted);
  molt__buf_pair(out, "message", msg);
  return 0;
}

/* The mode's reclaim hook (runtime thread, op_lock held): unloads the old
 * image once every restarted thread reached an update point in the new
 * version (F7); first_point wakes the runtime thread when the last one
 * does, so this needs no polling. */
static void full_reclaim(void) {
  molt__image *im = NULL;
  molt__lock_acquire(&prog_lock);
  if (retired && nupdating == 0) {
    im = retired;
    retired = NULL;
  }
  molt__lock_release(&prog_lock);
  if (!im)
    return;
  molt__log(MOLT__EV_UNLOAD, molt__gen_number_now(), NULL,
            "unloaded the old program image %s (build-id %s): every restarted thread has "
            "reached an update point in the new version",
            im->path, im->build_id[0] ? im->build_id : "none");
  molt__image_close(im); /* dlclose outside prog_lock */
}

/* ---- status -----------------------------------------------------------------------*/

/* The mode's status hook: the image and its threads. */
static void full_status(molt__buf *out) {
  if (!program_active())
    return;
  char num[24], num2[24];
  molt__lock_acquire(&prog_lock);
  if (current) {
    snprintf(num, sizeof num, "%" PRIu64, nupdates);
    char file[48];
    snprintf(file, sizeof file, "%ju:%ju", (uintmax_t)current->ident.dev,
             (uintmax_t)current->ident.ino);
    const char *f[] = {"image",
                       current->path,
                       current->build_id,
                       num,
                       retired ? retired->path : "",
                       last_abort ? last_abort : "",
                       file,
                       current->ident.sha256};
    molt__buf_record(out, 8, f);
  }
  /* Oldest first: the list is pushed at the front. */
  molt__link *last = threads;
  while (last && last->next)
    last = last->next;
  for (molt__pthread *t = thread_at(last); t; t = thread_at(t->link.prev)) {
    snprintf(num2, sizeof num2, "%d", (int)t->tid);
    bool upd = atomic_load_explicit(&t->updating, memory_order_relaxed);
    const char *f[] = {"program_thread",
                       num2,
                       t->entry_name ? t->entry_name : "?",
                       t->entry_tu ? t->entry_tu : "",
                       upd ? "1" : "0",
                       upd && t->from_point ? t->from_point : ""};
    molt__buf_record(out, 6, f);
  }
  molt__lock_release(&prog_lock);
}

/* ---- fork ---------------------------------------------------------------------------*/

/* fork(): hold the registry across it; in the child keep only the caller. */
static void full_fork_prepare(void) { molt__lock_acquire(&prog_lock); }
static void full_fork_parent(void) {
  keep_at_fork = false;
  molt__lock_release(&prog_lock);
}

static void full_fork_child(void) {
  if (keep_at_fork) {
    /* A shadowed update's follower (the runtime thread forked while every
     * program thread was parked): the records stay, with their snapshots,
     * for molt__full_update_step and molt__program_relaunch. */
    keep_at_fork = false;
    nupdating = 0;
    molt__lock_reinit(&prog_lock);
    return;
  }
  /* Only the forking thread exists in the child. */
  molt__pthread *me = pthread_self_rec;
  molt__pthread *t = thread_at(threads);
  while (t) {
    molt__pthread *next = thread_at(t->link.next);
    if (t != me)
      free_record(t);
    t = next;
  }
  threads = NULL;
  nupdating = 0;
  if (me) {
    molt__list_push(&threads, &me->link);
    me->tid = molt__gettid();
    if (atomic_load_explicit(&me->updating, memory_order_relaxed))
      nupdating = 1;
  }
  molt__lock_reinit(&prog_lock);
}

/* ---- for a shadowed update (shadow/, the layer above) -----------------------------*/

int molt__full_update_prepare(const char *path, int fd, int timeout_ms,
                              molt__full_update **out, char *err, size_t errlen) {
  upd *u = malloc(sizeof *u);
  if (!u) {
    molt__errmsg(err, errlen, "out of memory");
    return MOLT_ENOMEM;
  }
  int rc = update_prepare(path, fd, timeout_ms, false, u, err, errlen);
  if (rc < 0) {
    free(u);
    return rc;
  }
  *out = u;
  return 0;
}

void molt__full_update_discard(molt__full_update *u) {
  if (!u)
    return;
  drop_snapshots();
  molt__image_close(u->new);
  free(u);
}

int molt__full_update_step(molt__full_update *u, char *err, size_t errlen) {
  return parked_step(u, err, errlen);
}

size_t molt__program_tids(pid_t *tids, size_t max) {
  size_t n = 0;
  molt__lock_acquire(&prog_lock);
  for (molt__pthread *t = thread_at(threads); t; t = thread_at(t->link.next), n++)
    if (n < max)
      tids[n] = t->tid;
  molt__lock_release(&prog_lock);
  return n;
}

void molt__program_keep_threads_at_fork(void) {
  molt__lock_acquire(&prog_lock);
  keep_at_fork = true;
  molt__lock_release(&prog_lock);
}

typedef struct relaunch {
  molt__pthread *t;
  size_t index;
  void (*on_start)(size_t index, void *arg);
  void *arg;
} relaunch;

/* A follower's program thread: record t of a thread of the leader,
 * committed by molt__full_update_step (entry, argument and main of the new
 * version), run by a new OS thread.  Like a restart (restart_self) but on a
 * fresh stack: the leader's thread does not exist in the follower. */
static void *relaunched(void *p) {
  relaunch r = *(relaunch *)p;
  free(p);
  molt__pthread *t = r.t;
  t->tid = molt__gettid();
  stack_bounds(t);
  pthread_self_rec = t;
  molt__point_join();
  if (key_ok)
    pthread_setspecific(exit_key, t);
  t->restart = false;
  t->nregs = 0;
  molt__point_restarted();
  if (atomic_load_explicit(&t->updating, memory_order_relaxed))
    molt__point_call_next(first_point);
  r.on_start(r.index, r.arg);
  sigjmp_buf env;
  t->restart_env = &env;
  (void)sigsetjmp(env, 1);
  if (t->is_main) {
    int status = t->main_fn(run_argc, run_argv, environ);
    /* The follower's main returned: the follower ends as `molt run` would
     * (without atexit handlers: they belong to the program's leader). */
    _exit(status & 0xff);
  }
  void *ret = t->entry(t->arg);
  if (key_ok)
    pthread_setspecific(exit_key, NULL);
  end_thread(t);
  return ret;
}

int molt__program_relaunch(void (*on_start)(size_t index, void *arg), void *arg,
                           char *err, size_t errlen) {
  /* The follower's only thread: nobody else touches the list until the
   * threads start, and they do not change it (end_thread later does). */
  size_t i = 0;
  molt__link *next;
  for (molt__link *l = threads; l; l = next, i++) {
    next = l->next;
    relaunch *r = malloc(sizeof *r);
    pthread_t th;
    int rc = ENOMEM;
    /* A stack of our own: the stacks of the leader's threads, which
     * glibc keeps in the child as cached stacks, would give the new
     * threads the very pthread_t values of threads the child's copy of a
     * sanitizer's registry still holds (ThreadSanitizer then ends the
     * process: "dup thread with used id").  Kept for the follower's life
     * (its threads restart, they do not exit). */
    pthread_attr_t a;
    size_t size = 0;
    if (pthread_getattr_default_np(&a) == 0) {
      pthread_attr_getstacksize(&a, &size);
      pthread_attr_destroy(&a);
    }
    if (size < 1u << 20)
      size = 8u << 20;
    void *stack = mmap(NULL, size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
    if (r && stack != MAP_FAILED && pthread_attr_init(&a) == 0) {
      *r = (relaunch){thread_at(l), i, on_start, arg};
      rc = pthread_attr_setstack(&a, stack, size);
      if (rc == 0)
        rc = pthread_create(&th, &a, relaunched, r);
      pthread_attr_destroy(&a);
    }
    if (rc != 0 && stack != MAP_FAILED)
      munmap(stack, size);
    if (rc != 0) {
      free(r);
      molt__errmsg(err, errlen, "cannot start program thread %zu in the follower: %s", i,
                   strerror(rc));
      return MOLT_ENOMEM;
    }
    pthread_detach(th);
  }
  return 0;
}

/* ---- the mode ------------------------------------------------------------------------*/

/* The update operation (runtime thread, op_lock held). */
static int op_update(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  return program_update(req->path, req->has_fd ? req->fd : -1, req->timeout_ms,
                        req->check_interior, out, err, errlen);
}

/* A process that runs a program image is replaced as a whole: a hot patch
 * is stamped for one image's build-id and would point into an image that a
 * full update later unloads, and patched code would not be carried over. */
static int full_refuse(const molt__op_info *op, char *err, size_t errlen) {
  if (op->modes & MOLT__MODE_HOT) {
    molt__errmsg(err, errlen,
                 "hot patches are not supported in a process that runs a program "
                 "image; use 'molt update <pid> <new image>' instead");
    return MOLT_ENOTSUP;
  }
  molt__errmsg(err, errlen, "%s is not supported in a process that runs a program image",
               op->name);
  return MOLT_ENOTSUP;
}

/* " (tu)" after a static's name, or nothing. */
static const char *tu_open(const char *tu) { return tu ? " (" : ""; }
static const char *tu_text(const char *tu) { return tu ? tu : ""; }
static const char *tu_close(const char *tu) { return tu ? ")" : ""; }

/* The mode's describe_thread hook (runtime thread, op_lock and bar_lock
 * held): the entry function a program thread was started in -- its kernel
 * name is its creator's unless the program renames it -- and, if it is
 * blocked, the function it blocks in and the image's innermost call on its
 * stack. */
static void full_describe_thread(pid_t tid, char *buf, size_t len) {
  char entry[160] = "";
  uintptr_t stack_hi = 0;
  bool found = false;
  molt__lock_acquire(&prog_lock);
  for (molt__pthread *t = thread_at(threads); t; t = thread_at(t->link.next)) {
    if (t->tid != tid)
      continue;
    found = true;
    stack_hi = t->stack_hi;
    if (t->is_main)
      snprintf(entry, sizeof entry, "the main thread");
    else if (t->entry_name)
      snprintf(entry, sizeof entry, "started in %s%s%s%s", t->entry_name,
               tu_open(t->entry_tu), tu_text(t->entry_tu), tu_close(t->entry_tu));
    else
      snprintf(entry, sizeof entry, "started outside the image");
    break;
  }
  /* Images are opened and closed by the runtime thread only, which is
   * this one: current stays loaded after the lock is released. */
  const molt__image *im = current;
  molt__lock_release(&prog_lock);
  if (!found)
    return;
  long nr = 0;
  uintptr_t sp = 0, pc = 0;
  if (!molt__proc_blocked_at(tid, &nr, &sp, &pc)) {
    snprintf(buf, len, "%s, running", entry);
    return;
  }
  const char *in = NULL, *in_tu = NULL, *from = NULL, *from_tu = NULL;
  uintptr_t start = 0;
  bool is_func = false;
  Dl_info di;
  if (im && molt__image_prot_at(im, pc))
    (void)molt__image_sym_at(im, pc, &in, &in_tu, &start, NULL, &is_func);
  else if (dladdr((void *)pc, &di) && di.dli_sname)
    in = di.dli_sname;
  bool called =
      stack_hi && im && molt__image_caller_on_stack(im, sp, stack_hi, &from, &from_tu);
  char syscall[48] = "";
  if (nr >= 0)
    snprintf(syscall, sizeof syscall, " (system call %ld)", nr);
  snprintf(buf, len, "%s, blocked in %s%s%s%s%s%s%s%s%s%s", entry, in ? in : "?",
           tu_open(in_tu), tu_text(in_tu), tu_close(in_tu), syscall,
           called ? " called from " : "", called ? from : "",
           tu_open(called ? from_tu : NULL), tu_text(called ? from_tu : NULL),
           tu_close(called ? from_tu : NULL));
}

static const molt__mode full_mode = {
    .name = "full",
    .bit = MOLT__MODE_FULL,
    .ops = {[MOLT__OP_UPDATE] = op_update},
    .refuse = full_refuse,
    .on_park = full_on_park,
    .on_release = full_on_release,
    .owns_exit = full_owns_exit,
    .fork_prepare = full_fork_prepare,
    .fork_parent = full_fork_parent,
    .fork_child = full_fork_child,
    .status = full_status,
    .describe_thread = full_describe_thread,
    .reclaim = full_reclaim,
};

__attribute__((constructor(101))) static void full_register(void) {
  molt__mode_register(&full_mode);
}
