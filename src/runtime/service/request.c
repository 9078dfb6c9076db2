/* One path for every request: the dispatch table and the request queue.
 *
 * Every operation, from the control socket or from the in-process API
 * (molt_apply, molt_rollback), is carried out by the runtime thread.  The
 * control server runs on the runtime thread and calls molt__execute
 * directly; an application thread hands its request over (molt__request_run)
 * and waits for the answer.  While it waits it runs no program code, so if
 * it is a barrier participant it counts as waiting at an update point
 * (switch.h, molt__point_wait_begin): a thread that has called
 * molt_update_point() and then calls molt_apply(..., MOLT_POLICY_GLOBAL,
 * ...) gets its global apply, instead of a barrier that waits for it until
 * it times out.
 *
 * The dispatch table comes from the table of operations (MOLT__OPS,
 * common/protocol.h): its flags say whether an operation changes the
 * program (then it is refused in the refusing state and runs under op_lock
 * after a reclamation pass) and in which modes it is carried out.  The
 * handler is the service's own (status, log), the current mode's
 * (switch.h, molt__mode.ops) or that of a mode working within it (the
 * shadow mode's, in a process running a program image).
 *
 * Lock: req_lock protects the queue (the lock table: base.h); nothing else
 * is taken while it is held. */
#include "service/service.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- dispatch ------------------------------------------------------------------*/

static int op_status(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  (void)req, (void)err, (void)errlen;
  molt__op_lock();
  molt__status(out);
  molt__op_unlock();
  return 0;
}

static int op_log(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  (void)req, (void)err, (void)errlen;
  molt__log_dump(out);
  return 0;
}

/* The operations the service carries out itself, in any mode. */
static const molt__op_handler own[MOLT__OP_END] = {
    [MOLT__OP_STATUS] = op_status,
    [MOLT__OP_LOG] = op_log,
};

int molt__execute(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  if (errlen)
    err[0] = '\0';
  const molt__op_info *oi = molt__op_find(req->op);
  const molt__mode *mode = molt__mode_current();
  const molt__mode *handler; /* mode, or a mode that works within it */
  int rc = 0;
  char reason[256];
  if (!oi) {
    molt__errmsg(err, errlen, "unknown operation %d", (int)req->op);
    rc = MOLT_EPROTO;
  } else if ((oi->flags & MOLT__OPF_CHANGES) && molt__refusing(reason, sizeof reason)) {
    molt__errmsg(err, errlen, "the runtime refuses updates after an internal failure: %s",
                 reason);
    rc = MOLT_EREFUSING;
  } else if (own[oi->op]) {
    rc = own[oi->op](req, out, err, errlen);
  } else if (!mode || !(oi->modes & mode->bit)) {
    rc = mode && mode->refuse ? mode->refuse(oi, err, errlen) : MOLT_ENOTSUP;
    molt__log(MOLT__EV_REFUSE, molt__gen_number_now(), NULL, "%s%s%s refused: %s",
              oi->name, req->path[0] ? " " : "", req->path,
              err[0] ? err : molt_strerror(rc));
  } else if (!(handler = molt__mode_for_op(oi->op))) {
    molt__errmsg(err, errlen, "mode %s has no handler for %s", mode->name, oi->name);
    rc = MOLT_EINTERNAL;
  } else {
    molt__op_lock();
    /* Reclaim first: back-to-back updates would otherwise outrun the
     * runtime thread's passes and run out of generation slots. */
    if (oi->flags & MOLT__OPF_CHANGES)
      molt__reclaim_locked();
    rc = molt__modes_veto(handler, oi, err, errlen);
    if (rc == 0)
      rc = handler->ops[oi->op](req, out, err, errlen);
    molt__op_unlock();
  }
  if (rc == 0 && out->oom) {
    molt__errmsg(err, errlen, "out of memory while building the response");
    rc = MOLT_ENOMEM;
  }
  if (rc < 0 && errlen && !err[0])
    molt__errmsg(err, errlen, "%s", molt_strerror(rc));
  return rc;
}

/* ---- the queue -------------------------------------------------------------------*/

typedef struct pending {
  const molt__request *req;
  molt__buf *out;
  char *err;
  size_t errlen;
  int rc;
  bool done; /* req_lock */
  struct pending *next;
} pending;

static molt__lock req_lock = MOLT__LOCK_INIT(req);
static pthread_cond_t req_done = PTHREAD_COND_INITIALIZER;
static pending *queue_head, *queue_tail; /* req_lock */
/* The runtime thread takes requests (req_lock): from just before it starts
 * until its loop fails.  false in a forked child until it starts there. */
static bool open_for_requests;
static char stop_reason[160]; /* req_lock */
static __thread bool on_runtime_thread __attribute__((tls_model("initial-exec")));

void molt__requests_open(void) {
  molt__lock_acquire(&req_lock);
  open_for_requests = true;
  molt__lock_release(&req_lock);
}

void molt__requests_serve_here(void) { on_runtime_thread = true; }

/* Answers p (req_lock held). */
static void finish_locked(pending *p, int rc) {
  p->rc = rc;
  p->done = true;
  pthread_cond_broadcast(&req_done);
}

void molt__requests_drain(void) {
  for (;;) {
    molt__lock_acquire(&req_lock);
    pending *p = queue_head;
    if (p && !(queue_head = p->next))
      queue_tail = NULL;
    molt__lock_release(&req_lock);
    if (!p)
      return;
    /* The caller waits and does not touch p meanwhile; req_lock orders
     * what we write into p's buffers before its wake-up. */
    int rc = molt__execute(p->req, p->out, p->err, p->errlen);
    molt__lock_acquire(&req_lock);
    finish_locked(p, rc);
    molt__lock_release(&req_lock);
  }
}

void molt__requests_stop(void) {
  molt__lock_acquire(&req_lock);
  open_for_requests = false;
  snprintf(stop_reason, sizeof stop_reason, "the runtime thread is not running");
  for (pending *p = queue_head; p; p = p->next) {
    molt__errmsg(p->err, p->errlen, "%s", stop_reason);
    finish_locked(p, MOLT_EREFUSING);
  }
  queue_head = queue_tail = NULL;
  molt__lock_release(&req_lock);
}

/* The fork handlers hold req_lock across fork(): no thread is half-way
 * through queueing a request while the process is copied. */
void molt__requests_fork_prepare(void) { molt__lock_acquire(&req_lock); }
void molt__requests_fork_parent(void) { molt__lock_release(&req_lock); }

void molt__requests_after_fork_child(void) {
  /* The threads that queued requests do not exist in the child. */
  queue_head = queue_tail = NULL;
  open_for_requests = false;
  molt__lock_reinit(&req_lock);
  /* Initialized over, never destroyed: see switch/points.c. */
  pthread_cond_init(&req_done, NULL);
}

int molt__request_run(const molt__request *req, molt__buf *out, char *err,
                      size_t errlen) {
  if (on_runtime_thread)
    return molt__execute(req, out, err, errlen);
  /* In a forked child the runtime thread starts on first use. */
  molt__start_if_needed();
  pending p = {.req = req, .out = out, .err = err, .errlen = errlen};
  /* The request lives on this stack until it is answered: no cancellation
   * may unwind it meanwhile. */
  int cs;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
  molt__point_wait_begin(); /* before the runtime thread can see it */
  molt__lock_acquire(&req_lock);
  bool queued = open_for_requests;
  if (queued) {
    if (queue_tail)
      queue_tail->next = &p;
    else
      queue_head = &p;
    queue_tail = &p;
  } else {
    molt__errmsg(err, errlen, "%s; see molt status",
                 stop_reason[0] ? stop_reason : "the runtime thread is not running");
    p.rc = MOLT_EREFUSING;
  }
  molt__lock_release(&req_lock);
  if (queued) {
    molt__wake();
    molt__lock_acquire(&req_lock);
    while (!p.done)
      molt__lock_wait(&req_done, &req_lock);
    molt__lock_release(&req_lock);
  }
  molt__point_wait_end();
  pthread_setcancelstate(cs, NULL);
  return p.rc;
}

/* ---- the public API -------------------------------------------------------------------*/

static int run_public(const molt__request *req, char *err_msg, size_t err_len) {
  molt__buf out;
  molt__buf_init(&out);
  char err[1024];
  int rc = molt__request_run(req, &out, err, sizeof err);
  molt__buf_free(&out);
  if (rc < 0 && err_msg && err_len)
    snprintf(err_msg, err_len, "%s", err);
  return rc;
}

/* The request on the heap, not the caller's stack: it holds a rule file's
 * text (8 KiB) and the program's thread may have a small stack. */
static molt__request *request_new(molt__op op, molt_policy_t policy, int timeout_ms) {
  molt__request *req = calloc(1, sizeof *req);
  if (req) {
    req->op = op;
    req->policy = policy;
    req->timeout_ms = timeout_ms;
  }
  return req;
}

int molt_apply(const char *path, molt_policy_t policy, int timeout_ms, char *err_msg,
               size_t err_len) {
  if (!path || strlen(path) >= sizeof((molt__request *)0)->path) {
    if (err_msg && err_len)
      snprintf(err_msg, err_len, "invalid patch path");
    return MOLT_EINVAL;
  }
  molt__request *req = request_new(MOLT__OP_APPLY, policy, timeout_ms);
  if (!req)
    return MOLT_ENOMEM;
  strcpy(req->path, path);
  /* Opened here, on the calling thread (the program's own request, its
   * own path), O_NONBLOCK: the runtime thread only ever gets a descriptor
   * (issue 16). */
  char err[1024];
  int fd;
  int rc = molt__file_open_path(path, &fd, err, sizeof err);
  if (rc < 0) {
    /* Still a request: the runtime refuses it in its order (a refusing
     * runtime says so first) and logs it. */
    req->open_errno = errno ? errno : EIO;
    rc = run_public(req, err_msg, err_len);
    free(req);
    return rc;
  }
  req->has_fd = true;
  req->fd = fd;
  rc = run_public(req, err_msg, err_len);
  close(fd);
  free(req);
  return rc;
}

int molt_rollback(molt_policy_t policy, int timeout_ms, char *err_msg, size_t err_len) {
  molt__request *req = request_new(MOLT__OP_ROLLBACK, policy, timeout_ms);
  if (!req)
    return MOLT_ENOMEM;
  int rc = run_public(req, err_msg, err_len);
  free(req);
  return rc;
}
