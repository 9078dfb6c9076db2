/* The runtime: start-up, the runtime thread, operations (apply, rollback,
 * status, log), the refusing state, fork handling and the public API.
 *
 * Locks, outermost first:
 *   op_lock       serializes whole operations (apply, rollback, status,
 *                 reclamation).  May be held across dlopen/dlclose.
 *   (the dynamic loader's own lock)
 *   molt__rt_lock runtime state: modules, generations, objects, history.
 *                 Never held across dlopen/dlclose, because a module
 *                 registers itself from a constructor, i.e. while the
 *                 loader lock is held.
 *   (bar_lock, timing.c: taken between op_lock and molt__rt_lock by a
 *    global switch; alone by application threads at update points)
 *   (prog_lock, program.c: the program-thread registry; inside op_lock and
 *    bar_lock, never held together with molt__rt_lock except by
 *    fork_prepare, which takes molt__rt_lock inside it)
 *   registry lock (thread.c), log lock (log.c): leaves.
 * Application threads take only molt__rt_lock (registering a module from a
 * constructor), the registry lock (first call, thread exit) and op_lock if
 * they call molt_apply/molt_rollback themselves. */
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define HISTORY_MAX 64 /* rollback depth */
#define RECLAIM_MIN_MS 1
#define RECLAIM_MAX_MS 100

static pthread_mutex_t op_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t rt_lock = PTHREAD_MUTEX_INITIALIZER;

static _Atomic bool refusing;
static char refuse_reason[256]; /* written once, before refusing is set */
static int wake_fd = -1;
static int listen_fd = -1;
static int listen_err;
static pthread_t rt_thread;
static bool rt_started;
static uint64_t last_number; /* highest generation number handed out */
/* Set in a forked child; read without a lock by every registration, then
 * rechecked under op_lock (relaxed: op_lock orders the start itself). */
static _Atomic bool child_needs_start;

static molt__object *history[HISTORY_MAX];
static size_t nhistory;

void molt__rt_lock_acquire(void) { pthread_mutex_lock(&rt_lock); }
void molt__rt_lock_release(void) { pthread_mutex_unlock(&rt_lock); }

void molt__fail(const char *fmt, ...) {
  bool expected = false;
  char msg[sizeof refuse_reason];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* Only the first failure is kept as the reason.  The reason is written
   * by the winner of this exchange before the release store below; readers
   * load `refusing` with acquire before reading it. */
  static _Atomic bool claimed;
  if (atomic_compare_exchange_strong(&claimed, &expected, true)) {
    memcpy(refuse_reason, msg, sizeof msg);
    atomic_store_explicit(&refusing, true, memory_order_release);
  }
  molt__log(MOLT__EV_FAIL, 0, NULL, "refusing further updates: %s", msg);
}

bool molt__refusing(char *reason, size_t len) {
  if (!atomic_load_explicit(&refusing, memory_order_acquire))
    return false;
  if (reason && len)
    snprintf(reason, len, "%s", refuse_reason);
  return true;
}

void molt__runtime_kick(void) {
  if (wake_fd >= 0) {
    /* Called by application threads (program.c: at an update point, at
     * thread exit): write() must not make those cancellation points. */
    int cs;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
    uint64_t one = 1;
    ssize_t w = write(wake_fd, &one, sizeof one); /* EAGAIN: already kicked */
    (void)w;
    pthread_setcancelstate(cs, NULL);
  }
}

/* ---- reclamation ----------------------------------------------------------*/

/* op_lock held, molt__rt_lock not held. */
static size_t reclaim_locked(void) {
  molt__object *to_close = NULL;
  molt__rt_lock_acquire();
  size_t left = molt__gen_reclaim(&to_close);
  molt__rt_lock_release();
  molt__objects_close(to_close);
  return left;
}

static size_t reclaim_pass(void) {
  pthread_mutex_lock(&op_lock);
  size_t left = reclaim_locked();
  /* An old program image whose threads have all moved on (F7); it kicks
   * us when the last one does, so it needs no polling. */
  molt__program_reclaim();
  pthread_mutex_unlock(&op_lock);
  return left;
}

/* ---- the runtime thread -----------------------------------------------------*/

static void *runtime_main(void *arg) {
  (void)arg;
  int interval = -1; /* ms until the next reclamation pass; -1: none pending */
  for (;;) {
    struct pollfd fds[2] = {{.fd = wake_fd, .events = POLLIN},
                            {.fd = listen_fd, .events = POLLIN}};
    int n = poll(fds, listen_fd >= 0 ? 2 : 1, interval);
    if (n < 0 && errno != EINTR) {
      molt__fail("runtime thread: poll failed: %s", strerror(errno));
      return NULL;
    }
    if (n > 0 && (fds[0].revents & POLLIN)) {
      uint64_t v;
      ssize_t r = read(wake_fd, &v, sizeof v);
      (void)r;
      interval = RECLAIM_MIN_MS;
    }
    if (n > 0 && listen_fd >= 0 && (fds[1].revents & POLLIN))
      molt__control_serve(listen_fd);
    if (interval >= 0) {
      if (reclaim_pass() == 0)
        interval = -1;
      else if ((interval *= 2) > RECLAIM_MAX_MS)
        interval = RECLAIM_MAX_MS; /* a thread still runs old code: back off */
    }
  }
  return NULL;
}

static void start_runtime_thread(void) {
  listen_fd = molt__control_listen();
  if (listen_fd < 0) {
    listen_err = listen_fd;
    listen_fd = -1;
    molt__log(MOLT__EV_FAIL, 0, NULL, "no control channel: %s", molt_strerror(listen_err));
  }
  /* The runtime thread blocks every signal: signals sent to the process
   * must reach the application's threads, never ours. */
  sigset_t all, old;
  sigfillset(&all);
  /* Synchronous faults stay deliverable: blocking them would turn a fault
   * into a silent kill and hide it from sanitizers and debuggers. */
  sigdelset(&all, SIGSEGV);
  sigdelset(&all, SIGBUS);
  sigdelset(&all, SIGILL);
  sigdelset(&all, SIGFPE);
  sigdelset(&all, SIGTRAP);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  rt_started = pthread_create(&rt_thread, NULL, runtime_main, NULL) == 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rt_started)
    pthread_setname_np(rt_thread, "molt-runtime");
  else
    molt__fail("cannot start the runtime thread");
}

/* ---- generations for full updates ------------------------------------------*/

int molt__runtime_next_generation(uint64_t *number) {
  molt__rt_lock_acquire();
  molt__gen *g = NULL;
  int rc = molt__gen_new(molt__gen_current(), &g);
  if (rc == 0) {
    g->number = last_number + 1; /* op_lock: nobody else numbers meanwhile */
    rc = molt__gen_publish_checked(g);
    if (rc == 0) {
      /* Same table: threads with local views may follow at once, which
       * lets the previous generation be reclaimed without waiting for
       * their next quiescence point. */
      molt__threads_set_views(g);
      last_number++;
      *number = g->number;
    } else {
      molt__gen_discard(g);
    }
  }
  molt__rt_lock_release();
  if (rc == 0)
    molt__runtime_kick(); /* reclaim the retired generation */
  return rc;
}

uint64_t molt__runtime_generation(void) {
  molt__rt_lock_acquire();
  uint64_t n = molt__gen_current()->number;
  molt__rt_lock_release();
  return n;
}

/* ---- fork ----------------------------------------------------------------------*/

static void fork_prepare(void) {
  /* The lock order: op_lock, then prog_lock (program.c), then
   * molt__rt_lock, then the registry.  prog_lock and molt__rt_lock are
   * held together only here; no path takes prog_lock while holding
   * molt__rt_lock, so this cannot deadlock.  bar_lock is not taken: the
   * child rebuilds the barrier from scratch (timing.c), and a barrier
   * holds op_lock throughout, so none is running now. */
  pthread_mutex_lock(&op_lock);
  molt__program_fork_prepare();
  molt__rt_lock_acquire();
  molt__threads_lock();
}

static void fork_parent(void) {
  molt__threads_unlock();
  molt__rt_lock_release();
  molt__program_fork_parent();
  pthread_mutex_unlock(&op_lock);
}

/* The child has one thread and copies of locked mutexes: reinitialize, and
 * give it its own runtime thread and control socket (named by its pid). */
static void fork_child(void) {
  molt__threads_after_fork_child();
  molt__timing_after_fork_child();
  molt__program_fork_child();
  pthread_mutex_init(&rt_lock, NULL);
  pthread_mutex_init(&op_lock, NULL);
  if (listen_fd >= 0)
    close(listen_fd);
  listen_fd = -1;
  if (wake_fd >= 0)
    close(wake_fd);
  wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  /* No thread is started here: most children exec at once, and a thread
   * per fork() would tax every system() and popen().  The forking thread's
   * next updatable call takes the registration slow path, which starts the
   * child's runtime thread and control channel (molt__runtime_started). */
  atomic_store_explicit(&child_needs_start, true, memory_order_relaxed);
  molt__self.viewp = NULL;
}

void molt__runtime_started(void) {
  if (!atomic_load_explicit(&child_needs_start, memory_order_relaxed))
    return;
  pthread_mutex_lock(&op_lock);
  if (atomic_load_explicit(&child_needs_start, memory_order_relaxed)) {
    molt__log(MOLT__EV_START, molt__gen_current()->number, NULL,
              "runtime started in pid %d, a child of a molt process", (int)getpid());
    start_runtime_thread();
    atomic_store_explicit(&child_needs_start, false, memory_order_relaxed);
  }
  pthread_mutex_unlock(&op_lock);
}

__attribute__((constructor(101))) static void runtime_init(void) {
  molt__log_init();
  molt__threads_init();
  molt__gen_init();
  molt__timing_init();
  wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0)
    molt__fail("cannot create an eventfd: %s", strerror(errno));
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  molt__log(MOLT__EV_START, 0, NULL, "molt %s runtime started in pid %d%s",
            MOLT_VERSION_STRING, (int)getpid(),
            molt__gen_reclaim_enabled() ? "" : " (membarrier unavailable: old versions are never unloaded)");
  start_runtime_thread();
}

/* ---- operations ----------------------------------------------------------------*/

static const char *policy_name(molt_policy_t p) {
  switch (p) {
  case MOLT_POLICY_IMMEDIATE: return "immediate";
  case MOLT_POLICY_LOCAL: return "local";
  case MOLT_POLICY_GLOBAL: return "global";
  }
  return "?";
}

static int check_policy(molt_policy_t p, char *err, size_t errlen) {
  if (p == MOLT_POLICY_IMMEDIATE || p == MOLT_POLICY_LOCAL || p == MOLT_POLICY_GLOBAL)
    return 0;
  molt__errmsg(err, errlen, "unknown policy %d (use immediate, local or global)", (int)p);
  return MOLT_EPOLICY;
}

static void history_push(molt__object *obj) {
  if (nhistory == HISTORY_MAX) {
    molt__object *oldest = history[0];
    memmove(history, history + 1, (HISTORY_MAX - 1) * sizeof *history);
    nhistory--;
    molt__object_leave_history(oldest);
  }
  obj->in_history = true;
  history[nhistory++] = obj;
}

static void put_kv(molt__buf *out, const char *k, const char *v) {
  const char *f[] = {k, v};
  molt__buf_record(out, 2, f);
}

static void put_number(molt__buf *out, const char *k, uint64_t v) {
  char s[24];
  snprintf(s, sizeof s, "%" PRIu64, v);
  put_kv(out, k, s);
}

/* A failed operation must leave nothing behind: an object loaded for it is
 * closed again (it was never referenced by a generation). */
static void drop_unused_object(molt__object *obj) {
  molt__rt_lock_acquire();
  bool close_it = obj->handle && !obj->refs;
  molt__rt_lock_release();
  if (close_it) {
    obj->close_next = NULL;
    molt__objects_close(obj);
  } else {
    molt__rt_lock_acquire();
    molt__object_free_if_unused(obj);
    molt__rt_lock_release();
  }
}

/* Makes the built generation g current under the request's policy; if
 * that fails (global timeout), g is discarded and nothing has changed. */
static int switch_or_discard(molt__gen *g, const molt__request *req, char *err,
                             size_t errlen) {
  int rc = molt__timing_switch(g, req->policy, req->timeout_ms, err, errlen);
  if (rc < 0) {
    molt__rt_lock_acquire();
    molt__gen_discard(g);
    molt__rt_lock_release();
  }
  return rc;
}

static int do_apply(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  int rc = check_policy(req->policy, err, errlen);
  if (rc < 0)
    return rc;
  molt__object *obj;
  rc = molt__patch_open(req->path, &obj, err, errlen);
  if (rc < 0)
    return rc;
  molt__rt_lock_acquire();
  molt__gen *g = NULL;
  rc = molt__patch_build_gen(obj, molt__gen_current(), &g, err, errlen);
  if (rc == 0)
    g->number = last_number + 1; /* op_lock: nobody else numbers meanwhile */
  molt__rt_lock_release();
  if (rc == 0)
    rc = switch_or_discard(g, req, err, errlen);
  if (rc < 0) {
    molt__rt_lock_acquire();
    molt__object_leave_history(obj); /* releases what it would roll back to */
    molt__rt_lock_release();
    drop_unused_object(obj);
    return rc;
  }
  molt__rt_lock_acquire();
  last_number++;
  obj->gen = g->number;
  history_push(obj);
  molt__log(MOLT__EV_SWITCH, g->number, obj->id, "applied %s (%zu functions, policy %s): %s",
            obj->path, (size_t)(obj->hdr->fns_end - obj->hdr->fns), policy_name(req->policy),
            obj->description);
  molt__rt_lock_release();
  put_number(out, "generation", obj->gen);
  char msg[512];
  snprintf(msg, sizeof msg, "applied patch %s: generation %" PRIu64 " (policy %s)", obj->id,
           obj->gen, policy_name(req->policy));
  put_kv(out, "message", msg);
  return 0;
}

static int do_rollback(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  int rc = check_policy(req->policy, err, errlen);
  if (rc < 0)
    return rc;
  molt__rt_lock_acquire();
  molt__object *top = nhistory ? history[nhistory - 1] : NULL;
  molt__rt_lock_release();
  if (!top) {
    molt__errmsg(err, errlen, "nothing to roll back: no patch is applied "
                              "(rollback reaches back %d patches)", HISTORY_MAX);
    return MOLT_ENOHISTORY;
  }
  /* Bring back every object that supplied a version top replaced.  Loading
   * happens outside molt__rt_lock; op_lock keeps the history stable. */
  for (size_t i = 0; i < top->nprev; i++) {
    molt__object *o = top->prev[i].owner;
    if (o && !o->handle && (rc = molt__patch_reload(o, err, errlen)) < 0)
      goto undo_reloads;
  }
  molt__rt_lock_acquire();
  molt__gen *g;
  rc = molt__gen_new(molt__gen_current(), &g);
  if (rc == 0) {
    for (size_t i = 0; i < top->nprev; i++) {
      molt__object *o = top->prev[i].owner;
      uint32_t idx = top->prev[i].index;
      /* o was reloaded above if needed; its records are in file order. */
      void *impl = o ? o->hdr->fns[top->prev[i].rec].impl : molt__fn_at(idx)->body;
      molt__gen_set(g, idx, impl, o);
    }
    if (rc == 0)
      g->number = last_number + 1;
    else
      molt__gen_discard(g);
  } else {
    molt__errmsg(err, errlen, "%s", molt_strerror(rc));
  }
  molt__rt_lock_release();
  if (rc == 0)
    rc = switch_or_discard(g, req, err, errlen);
  if (rc == 0) {
    molt__rt_lock_acquire();
    last_number++;
    nhistory--;
    molt__log(MOLT__EV_ROLLBACK, g->number, top->id,
              "rolled back %s (policy %s): generation %" PRIu64 " restores the state before it",
              top->id, policy_name(req->policy), g->number);
    put_number(out, "generation", g->number);
    char msg[512];
    snprintf(msg, sizeof msg, "rolled back patch %s: generation %" PRIu64, top->id, g->number);
    put_kv(out, "message", msg);
    /* Last: this may free top (it is still referenced by the retired
     * generation, so in practice it stays until reclaimed). */
    molt__object_leave_history(top);
    molt__rt_lock_release();
    return 0;
  }
undo_reloads:
  /* Objects reloaded for a rollback that did not happen are closed again. */
  for (size_t i = 0; i < top->nprev; i++) {
    molt__object *o = top->prev[i].owner;
    if (o && o->handle && !o->refs)
      drop_unused_object(o);
  }
  return rc;
}

/* ---- status -------------------------------------------------------------------*/

typedef struct tinfo {
  pid_t tid;
  uint64_t active;
  int view; /* slot of a local view or -1 */
} tinfo;

typedef struct tlist {
  tinfo *v;
  size_t n, cap;
} tlist;

static void collect_thread(void *arg, const molt__thread *t, pid_t tid, const char *name) {
  tlist *l = arg;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    tinfo *p = realloc(l->v, cap * sizeof *p);
    if (!p)
      return;
    l->v = p;
    l->cap = cap;
  }
  tinfo *ti = &l->v[l->n++];
  ti->tid = tid;
  ti->active = 0;
  for (unsigned s = 0; s < MOLT__SLOTS; s++)
    ti->active += atomic_load_explicit(&((molt__thread *)t)->active[s], memory_order_relaxed);
  molt__gen *v = atomic_load_explicit(&((molt__thread *)t)->view, memory_order_acquire);
  ti->view = v ? (int)v->slot : -1;
}

static void thread_name(pid_t tid, char *name, size_t len) {
  char p[64];
  snprintf(p, sizeof p, "/proc/self/task/%d/comm", (int)tid);
  FILE *f = fopen(p, "re");
  name[0] = '\0';
  if (f) {
    if (fgets(name, (int)len, f))
      name[strcspn(name, "\n")] = '\0';
    fclose(f);
  }
}

static void do_status(molt__buf *out) {
  char reason[sizeof refuse_reason], num[24], num2[24], num3[24], num4[24];
  if (molt__refusing(reason, sizeof reason)) {
    const char *f[] = {"state", "refusing", reason};
    molt__buf_record(out, 3, f);
  } else {
    put_kv(out, "state", "ok");
  }
  put_number(out, "pid", (uint64_t)getpid());
  tlist tl = {0};
  molt__rt_lock_acquire();
  molt__gen *cur = molt__gen_current();
  put_number(out, "generation", cur->number);
  put_kv(out, "reclaim", molt__gen_reclaim_enabled() ? "enabled" : "disabled");
  if (listen_err)
    put_kv(out, "control", molt_strerror(listen_err));
  for (size_t i = 0; i < molt__modules_count(); i++) {
    molt__module *m = molt__module_at(i);
    const char *f[] = {"program", m->path ? m->path : "", m->build_id};
    molt__buf_record(out, 3, f);
  }
  for (size_t i = 0; i < nhistory; i++) {
    molt__object *o = history[i];
    snprintf(num, sizeof num, "%zu", i + 1);
    snprintf(num2, sizeof num2, "%" PRIu64, o->gen);
    const char *f[] = {"patch", num, o->id, o->description, o->path, num2};
    molt__buf_record(out, 6, f);
  }
  for (molt__object *o = molt__objects_head(); o; o = o->all_next) {
    if (!o->handle)
      continue;
    snprintf(num, sizeof num, "%" PRIu64, o->gen);
    snprintf(num2, sizeof num2, "%zu", o->refs);
    const char *f[] = {"object", o->id, o->path, num, num2};
    molt__buf_record(out, 5, f);
  }
  molt__gen_usage u;
  molt__gen_scan(&u);
  for (unsigned s = 0; s < MOLT__SLOTS; s++) {
    molt__gen_priv *p = molt__gen_priv_of(&molt__gens[s]);
    if (!p->in_use || (!p->table && &molt__gens[s] != cur))
      continue;
    snprintf(num, sizeof num, "%" PRIu64, molt__gens[s].number);
    snprintf(num2, sizeof num2, "%u", s);
    snprintf(num3, sizeof num3, "%u", u.active[s]);
    const char *f[] = {"live", num, num2, &molt__gens[s] == cur ? "current" : "retired", num3};
    molt__buf_record(out, 5, f);
  }
  molt__gen_priv *cp = molt__gen_priv_of(cur);
  for (uint32_t i = 0; i < cur->size; i++) {
    molt__fn_desc *d = molt__fn_at(i);
    molt__object *o = cp->entry_owner ? cp->entry_owner[i] : NULL;
    const char *f[] = {"function", d->name, d->tu, d->is_static ? "1" : "0", o ? o->id : "base",
                       molt__entry_dispatching(i) ? "dispatch" : "direct"};
    molt__buf_record(out, 6, f);
  }
  molt__threads_foreach(collect_thread, &tl);
  uint64_t numbers[MOLT__SLOTS];
  for (unsigned s = 0; s < MOLT__SLOTS; s++)
    numbers[s] = molt__gens[s].number;
  molt__rt_lock_release();
  /* The program image and its threads (prog_lock, not molt__rt_lock). */
  molt__program_status(out);
  for (size_t i = 0; i < tl.n; i++) {
    char name[64], follows[48];
    thread_name(tl.v[i].tid, name, sizeof name);
    snprintf(num, sizeof num, "%d", (int)tl.v[i].tid);
    if (tl.v[i].view < 0)
      snprintf(follows, sizeof follows, "global");
    else
      snprintf(follows, sizeof follows, "generation %" PRIu64, numbers[tl.v[i].view]);
    snprintf(num4, sizeof num4, "%" PRIu64, tl.v[i].active);
    const char *f[] = {"thread", num, name, follows, num4};
    molt__buf_record(out, 5, f);
  }
  free(tl.v);
}

int molt__execute(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  if (errlen)
    err[0] = '\0';
  int rc = 0;
  switch (req->op) {
  case MOLT__OP_STATUS:
    pthread_mutex_lock(&op_lock);
    do_status(out);
    pthread_mutex_unlock(&op_lock);
    break;
  case MOLT__OP_LOG:
    molt__log_dump(out);
    break;
  case MOLT__OP_APPLY:
  case MOLT__OP_ROLLBACK: {
    char reason[sizeof refuse_reason];
    if (molt__refusing(reason, sizeof reason)) {
      molt__errmsg(err, errlen, "the runtime refuses updates after an internal failure: %s", reason);
      rc = MOLT_EREFUSING;
      break;
    }
    /* A program image is replaced as a whole: a hot patch is stamped for
     * one image's build-id and would point into an image that a full
     * update later unloads, and patched code would not be carried over. */
    if (molt__program_active()) {
      molt__errmsg(err, errlen,
                   "hot patches are not supported in a process that runs a program "
                   "image; use 'molt update <pid> <new image>' instead");
      rc = MOLT_ENOTSUP;
      molt__log(MOLT__EV_REFUSE, molt__runtime_generation(), NULL, "%s %s refused: %s",
                req->op == MOLT__OP_APPLY ? "apply" : "rollback",
                req->op == MOLT__OP_APPLY ? req->path : "", err);
      break;
    }
    pthread_mutex_lock(&op_lock);
    /* Reclaim first: back-to-back updates would otherwise outrun the
     * runtime thread's passes and run out of generation slots. */
    reclaim_locked();
    rc = req->op == MOLT__OP_APPLY ? do_apply(req, out, err, errlen)
                                   : do_rollback(req, out, err, errlen);
    /* Under op_lock: the current generation cannot be reclaimed meanwhile. */
    if (rc < 0)
      molt__log(MOLT__EV_REFUSE, molt__gen_current()->number, NULL, "%s %s refused: %s",
                req->op == MOLT__OP_APPLY ? "apply" : "rollback",
                req->op == MOLT__OP_APPLY ? req->path : "", err);
    pthread_mutex_unlock(&op_lock);
    break;
  }
  case MOLT__OP_UPDATE: {
    char reason[sizeof refuse_reason];
    if (molt__refusing(reason, sizeof reason)) {
      molt__errmsg(err, errlen, "the runtime refuses updates after an internal failure: %s", reason);
      rc = MOLT_EREFUSING;
      break;
    }
    pthread_mutex_lock(&op_lock);
    reclaim_locked();
    molt__program_reclaim();
    /* Logs its own outcome (refused before the barrier, aborted after). */
    rc = molt__program_update(req->path, req->timeout_ms, req->check_interior, out, err,
                              errlen);
    pthread_mutex_unlock(&op_lock);
    break;
  }
  default:
    molt__errmsg(err, errlen, "unknown operation %d", (int)req->op);
    rc = MOLT_EPROTO;
  }
  if (rc == 0 && out->oom) {
    molt__errmsg(err, errlen, "out of memory while building the response");
    rc = MOLT_ENOMEM;
  }
  if (rc < 0 && errlen && !err[0])
    molt__errmsg(err, errlen, "%s", molt_strerror(rc));
  return rc;
}

/* ---- public API ---------------------------------------------------------------*/

static int run_public(molt__request *req, char *err_msg, size_t err_len) {
  molt__buf out;
  molt__buf_init(&out);
  char err[1024];
  int rc = molt__execute(req, &out, err, sizeof err);
  molt__buf_free(&out);
  if (rc < 0 && err_msg && err_len)
    snprintf(err_msg, err_len, "%s", err);
  return rc;
}

int molt_apply(const char *path, molt_policy_t policy, int timeout_ms,
               char *err_msg, size_t err_len) {
  molt__request req = {.op = MOLT__OP_APPLY, .policy = policy, .timeout_ms = timeout_ms};
  if (!path || strlen(path) >= sizeof req.path) {
    if (err_msg && err_len)
      snprintf(err_msg, err_len, "invalid patch path");
    return MOLT_EINVAL;
  }
  strcpy(req.path, path);
  return run_public(&req, err_msg, err_len);
}

int molt_rollback(molt_policy_t policy, int timeout_ms, char *err_msg, size_t err_len) {
  molt__request req = {.op = MOLT__OP_ROLLBACK, .policy = policy, .timeout_ms = timeout_ms};
  return run_public(&req, err_msg, err_len);
}

uint64_t molt_generation(void) {
  /* Pin the generation so that reading its number cannot race with the
   * slot being reused. */
  molt__gen *g = molt__enter();
  uint64_t n = g->number;
  molt__leave(g);
  return n;
}
