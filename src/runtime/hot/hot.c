/* The hot-patch mode: apply and rollback under a policy, the rollback
 * history, their status records, and the mode's registration.
 *
 * Everything here runs on the runtime thread with op_lock held (the service
 * dispatches operations there), which keeps the history stable; the
 * history is also read under molt__rt_lock by nobody else, but written
 * under it so that the object lifecycle (patch.c) sees a consistent
 * in_history flag. */
#include "hot/hot.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define HISTORY_MAX 64 /* rollback depth */

static molt__object *history[HISTORY_MAX];
static size_t nhistory;

static const char *policy_name(molt_policy_t p) {
  const char *n = molt__policy_name(p);
  return n ? n : "?";
}

static int check_policy(molt_policy_t p, char *err, size_t errlen) {
  if (molt__policy_name(p))
    return 0;
  molt__errmsg(err, errlen, "unknown policy %d (use immediate, local or global)", (int)p);
  return MOLT_EPOLICY;
}

/* molt__rt_lock held. */
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

/* Makes the built generation g current under the request's policy; if
 * that fails (global timeout), g is discarded and nothing has changed. */
static int switch_or_discard(molt__gen *g, const molt__request *req, char *err,
                             size_t errlen) {
  int rc = molt__switch_publish(g, req->policy, req->timeout_ms, err, errlen);
  if (rc < 0) {
    molt__rt_lock_acquire();
    molt__gen_discard(g);
    molt__rt_lock_release();
  }
  return rc;
}

/* A refused apply or rollback is logged with its reason. */
static int refused(const molt__request *req, int rc, const char *err) {
  molt__log(MOLT__EV_REFUSE, molt__gen_number_now(), NULL, "%s%s%s refused: %s",
            req->op == MOLT__OP_APPLY ? "apply" : "rollback", req->path[0] ? " " : "",
            req->path, err);
  return rc;
}

/* Right after the switch: a thread found inside version 0 of a function
 * this patch replaces entered it before the patch and keeps running it
 * until it returns -- for ever if it is a loop (core/oldcode.c says how the
 * runtime looks and what it cannot see).  One `warning` record each, for
 * the CLI; not logged: the scan is conservative (a stale return address in
 * a live frame counts) and `molt status` looks again. */
static void warn_old_code(molt__object *obj, molt__buf *out) {
  molt__oldcode_scan();
  for (size_t i = 0; i < molt__oldcode_count(); i++) {
    const molt__oldcode *o = molt__oldcode_at(i);
    bool ours = false;
    for (size_t k = 0; k < obj->nby_index && !ours; k++)
      ours = obj->by_index[k].index == o->index;
    if (!ours)
      continue;
    molt__rt_lock_acquire();
    molt__fn_desc *d = molt__fn_at(o->index);
    molt__rt_lock_release();
    char name[64], msg[512];
    if (!molt__proc_name(0, o->tid, name, sizeof name))
      snprintf(name, sizeof name, "?");
    snprintf(
        msg, sizeof msg,
        "thread %d (%s) is still running version 0 of %s%s%s%s, entered before this "
        "patch (generation %" PRIu64 "): it runs the new version only from its next "
        "call; a loop that never returns keeps the old one (a full update replaces it)",
        (int)o->tid, name, d->name, d->is_static ? " (" : "", d->is_static ? d->tu : "",
        d->is_static ? ")" : "", obj->gen);
    molt__buf_pair(out, "warning", msg);
  }
}

/* Runs obj's callback cb ("pre-update" or "post-update") under the
 * request's callback timeout, on a thread of its own (callback.c): the
 * runtime thread keeps op_lock and takes no other lock meanwhile.  Logs the
 * outcome.  0: it returned 0.  MOLT_ECALLBACK: it returned something else.
 * MOLT_ETIMEDOUT: it is still running, and obj is marked stuck (never
 * unloaded).  err says which, in one line. */
static int run_callback(molt__object *obj, struct molt__object_callback *cb,
                        const char *kind, const molt__request *req, char *err,
                        size_t errlen) {
  int timeout = req->callback_timeout_ms > 0 ? req->callback_timeout_ms
                                             : MOLT__DEFAULT_CALLBACK_TIMEOUT_MS;
  int result = 0;
  unsigned ms = 0;
  molt__callback_thread *running = NULL;
  char why[256] = "";
  int rc = molt__callback_run(cb->fn, timeout, &result, &ms, &running, why, sizeof why);
  uint64_t gen = molt__gen_number_now();
  molt__rt_lock_acquire();
  if (rc == 0 && result == 0) {
    molt__log(MOLT__EV_CALLBACK, gen, obj->id,
              "%s callback %s of %s ran: returned 0 in %u ms", kind, cb->name, obj->id,
              ms);
  } else if (rc == 0) {
    rc = MOLT_ECALLBACK;
    molt__errmsg(err, errlen, "%s callback %s of patch %s returned %d", kind, cb->name,
                 obj->id, result);
    molt__log(MOLT__EV_CALLBACK, gen, obj->id,
              "%s callback %s of %s failed: returned %d in %u ms", kind, cb->name,
              obj->id, result, ms);
  } else if (rc == MOLT_ETIMEDOUT) {
    /* Its code is running: the object must stay mapped (object_release). */
    obj->stuck = cb == &obj->pre ? "pre-update callback still running"
                                 : "post-update callback still running";
    obj->owner.keeps_code = true; /* object_release keeps it: no proof needed */
    /* (none yet: a stuck object is never applied again) */
    molt__callback_release(obj->stuck_run);
    obj->stuck_run = running;
    molt__errmsg(err, errlen,
                 "%s callback %s of patch %s timed out after %u ms (still running; the "
                 "patch stays loaded)",
                 kind, cb->name, obj->id, ms);
    molt__log(MOLT__EV_CALLBACK, gen, obj->id,
              "%s callback %s of %s timed out after %u ms: still running, %s stays "
              "loaded",
              kind, cb->name, obj->id, ms, obj->path);
  } else {
    molt__errmsg(err, errlen, "%s callback %s of patch %s could not run: %s", kind,
                 cb->name, obj->id, why);
    molt__log(MOLT__EV_CALLBACK, gen, obj->id, "%s callback %s of %s could not run: %s",
              kind, cb->name, obj->id, why);
  }
  molt__rt_lock_release();
  return rc;
}

static int op_apply(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  int rc = check_policy(req->policy, err, errlen);
  if (rc < 0)
    return refused(req, rc, err);
  molt__object *obj;
  if (!req->has_fd && req->open_errno) { /* molt_apply could not open it */
    molt__errmsg(err, errlen, "cannot open %s: %s", req->path, strerror(req->open_errno));
    return refused(req, molt__from_errno(req->open_errno), err);
  }
  if (!req->has_fd) {
    /* Issue 16: the runtime never opens a path a client names (a FIFO or a
     * swapped symlink there would be the runtime's problem). */
    molt__errmsg(err, errlen,
                 "the request brought no open patch file; this molt CLI is older than "
                 "the runtime (it must pass the file with SCM_RIGHTS: docs/protocol.md)");
    return refused(req, MOLT_EPROTO, err);
  }
  rc = molt__patch_open(req->path, req->fd, &obj, err, errlen);
  if (rc < 0)
    return refused(req, rc, err);
  /* The patch is loaded, checked and bound; nothing is published yet.  Its
   * pre-update callback may still refuse it (then it goes as it came,
   * unless the callback is still running: obj->stuck keeps it loaded). */
  if (obj->pre.fn)
    rc = run_callback(obj, &obj->pre, "pre-update", req, err, errlen);
  molt__gen *g = NULL;
  if (rc == 0) {
    molt__rt_lock_acquire();
    rc = molt__patch_build_gen(obj, molt__gen_current(), &g, err, errlen);
    molt__rt_lock_release();
  }
  if (rc == 0)
    rc = switch_or_discard(g, req, err, errlen);
  if (rc < 0) {
    molt__rt_lock_acquire();
    molt__object_leave_history(obj); /* releases what it would roll back to */
    molt__rt_lock_release();
    molt__object_drop_unused(obj);
    return refused(req, rc, err);
  }
  molt__rt_lock_acquire();
  obj->gen = g->number;
  history_push(obj);
  molt__log(MOLT__EV_SWITCH, g->number, obj->id,
            "applied %s (%zu functions, policy %s): %s", obj->path,
            (size_t)(obj->hdr->fns_end - obj->hdr->fns), policy_name(req->policy),
            obj->description);
  molt__rt_lock_release();
  char num[24], msg[512];
  snprintf(num, sizeof num, "%" PRIu64, obj->gen);
  molt__buf_pair(out, "generation", num);
  snprintf(msg, sizeof msg, "applied patch %s: generation %" PRIu64 " (policy %s)",
           obj->id, obj->gen, policy_name(req->policy));
  molt__buf_pair(out, "message", msg);
  warn_old_code(obj, out);
  /* Published: whatever post does, the patch stays applied. */
  char why[512];
  if (obj->post.fn &&
      run_callback(obj, &obj->post, "post-update", req, why, sizeof why) < 0)
    molt__buf_pair(out, "warning", why);
  return 0;
}

static int op_rollback(const molt__request *req, molt__buf *out, char *err,
                       size_t errlen) {
  int rc = check_policy(req->policy, err, errlen);
  if (rc < 0)
    return refused(req, rc, err);
  molt__object *top = nhistory ? history[nhistory - 1] : NULL; /* op_lock */
  if (!top) {
    molt__errmsg(err, errlen,
                 "nothing to roll back: no patch is applied "
                 "(rollback reaches back %d patches)",
                 HISTORY_MAX);
    return refused(req, MOLT_ENOHISTORY, err);
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
  rc = molt__gen_new(molt__gen_current(), true, &g);
  if (rc == 0) {
    for (size_t i = 0; i < top->nprev; i++) {
      molt__object *o = top->prev[i].owner;
      uint32_t idx = top->prev[i].index;
      /* o was reloaded above if needed; its records are in file order. */
      void *impl = o ? o->hdr->fns[top->prev[i].rec].impl : molt__gen_body(idx);
      molt__gen_set(g, idx, impl, o ? &o->owner : NULL);
    }
  } else {
    molt__errmsg(err, errlen, "%s", molt_strerror(rc));
  }
  molt__rt_lock_release();
  if (rc == 0)
    rc = switch_or_discard(g, req, err, errlen);
  if (rc == 0) {
    molt__rt_lock_acquire();
    nhistory--;
    molt__log(MOLT__EV_ROLLBACK, g->number, top->id,
              "rolled back %s (policy %s): generation %" PRIu64
              " restores the state before it",
              top->id, policy_name(req->policy), g->number);
    char num[24], msg[512];
    snprintf(num, sizeof num, "%" PRIu64, g->number);
    molt__buf_pair(out, "generation", num);
    snprintf(msg, sizeof msg, "rolled back patch %s: generation %" PRIu64, top->id,
             g->number);
    molt__buf_pair(out, "message", msg);
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
    if (o && o->handle && !o->owner.gen_refs)
      molt__object_drop_unused(o);
  }
  return refused(req, rc, err);
}

/* Records "patch" (the history, bottom first) and "object" (loaded
 * objects). */
static void hot_status(molt__buf *out) {
  char num[24], num2[24];
  molt__rt_lock_acquire();
  for (size_t i = 0; i < nhistory; i++) {
    molt__object *o = history[i];
    snprintf(num, sizeof num, "%zu", i + 1);
    snprintf(num2, sizeof num2, "%" PRIu64, o->gen);
    char file[48];
    snprintf(file, sizeof file, "%ju:%ju", (uintmax_t)o->ident.dev,
             (uintmax_t)o->ident.ino);
    char cbs[2 * MOLT__CALLBACK_NAME_MAX + 16];
    molt__object_callbacks(o, cbs, sizeof cbs);
    const char *f[] = {"patch",
                       num,
                       o->id,
                       o->description,
                       o->path,
                       num2,
                       o->provenance,
                       o->replaced,
                       o->pinned || o->stuck ? molt__object_kept_reason(o) : "",
                       file,
                       o->ident.sha256,
                       cbs};
    molt__buf_record(out, 12, f);
  }
  for (molt__object *o = molt__objects_first(); o; o = molt__objects_next(o)) {
    if (!o->handle)
      continue;
    snprintf(num, sizeof num, "%" PRIu64, o->gen);
    snprintf(num2, sizeof num2, "%zu", o->owner.gen_refs);
    char cbs[2 * MOLT__CALLBACK_NAME_MAX + 16];
    molt__object_callbacks(o, cbs, sizeof cbs);
    const char *f[] = {"object", o->id,
                       o->path,  num,
                       num2,     o->pinned || o->stuck ? molt__object_kept_reason(o) : "",
                       cbs};
    molt__buf_record(out, 7, f);
  }
  molt__rt_lock_release();
}

/* A process of this mode runs no program image. */
static int hot_refuse(const molt__op_info *op, char *err, size_t errlen) {
  if (op->modes & MOLT__MODE_FULL) {
    molt__errmsg(err, errlen,
                 "process %d does not run a program image; start the program with "
                 "'molt run <image.so>' to update it as a whole, or use 'molt apply' for "
                 "hot patches",
                 (int)getpid());
    return MOLT_ENOPROGRAM;
  }
  molt__errmsg(err, errlen, "%s is not supported by this process", op->name);
  return MOLT_ENOTSUP;
}

static const molt__mode hot_mode = {
    .name = "hot",
    .bit = MOLT__MODE_HOT,
    .initial = true,
    .ops = {[MOLT__OP_APPLY] = op_apply, [MOLT__OP_ROLLBACK] = op_rollback},
    .refuse = hot_refuse,
    .status = hot_status,
};

__attribute__((constructor(101))) static void hot_register(void) {
  molt__mode_register(&hot_mode);
}
