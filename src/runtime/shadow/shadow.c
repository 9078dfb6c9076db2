/* The shadow mode: a full update rehearsed in a forked follower while the
 * leader serves on (docs/design.md §17, MVEDSUA).
 *
 * The operation (runtime thread, op_lock held):
 *  1. the full mode's steps 1-4: the new image opened, checked, loaded,
 *     entries resolved (molt__full_update_prepare);
 *  2. the full update's barrier: every program thread parks at an update
 *     point, snapshotting its migrated locals (the full mode's on_park);
 *  3. the step, with every thread parked: one ring per program thread, the
 *     leader records from now on, and the runtime thread forks.
 *     - The parent (the leader) returns a positive value: the barrier
 *       releases its threads with MOLT__VERDICT_NONE, molt_update_point()
 *       returns 0 in each and the old version goes on.  The new image is
 *       closed; a monitor thread waits for the follower.
 *     - The child (the follower) has one thread, this one.  It never
 *       returns into the operation: it migrates and commits under the
 *       full mode's fault guard and deadline (molt__full_update_step),
 *       starts one new OS thread per program thread of the leader in the
 *       new version (molt__program_relaunch; threads do not survive
 *       fork(), and the restart frames of the leader's threads lie on
 *       stacks no thread of the follower runs on), and then waits for ever
 *       with every signal blocked.  The fork handlers made the follower's
 *       molt state its own (service/runtime.c, §12); op_lock, which this
 *       thread held when it forked, was made anew there.
 *  4. Follower failures end the follower only: a failed migration, a
 *     divergence and a fault each end its process; the leader's monitor
 *     reaps it, reads the shared report and logs it with both sides.
 *
 * Lock: shd_lock (the lock table in base.h) protects the stage, the
 * follower's pid, the image path and the outcome; the runtime thread
 * takes it inside op_lock, the monitor thread alone; molt__log inside. */
#include "shadow/shadow.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef enum { STAGE_NONE, STAGE_FOLLOWING, STAGE_ENDED } stage_t;

static molt__lock shd_lock = MOLT__LOCK_INIT(shd);
static stage_t stage;            /* shd_lock */
static pid_t follower;           /* shd_lock: the live or last follower */
static char image[4096];         /* shd_lock: the new image's path */
static char outcome[2048 + 256]; /* shd_lock: how the last session ended */
static uint64_t divergences;     /* shd_lock: sessions ended by a divergence */
static bool dropping;            /* shd_lock: molt rollback killed the follower */
static unsigned nrules;          /* shd_lock: rules of the last session */

/* What the step needs, on the runtime thread's stack. */
typedef struct fork_ctx {
  molt__full_update *u;
  pid_t pid;
} fork_ctx;

/* ---- the follower --------------------------------------------------------------*/

/* The follower's only thread, in the child of the step's fork(): never
 * returns. */
static void follower_main(fork_ctx *c) __attribute__((noreturn));
static void follower_main(fork_ctx *c) {
  /* The follower dies with the leader's runtime thread (the thread that
   * forked it), i.e. with the leader. */
  pid_t leader = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != leader)
    _exit(112);
  molt__shadow_become_follower();
  molt__shadow_note_inherited();
  char err[1024] = "";
  int rc = molt__full_update_step(c->u, err, sizeof err);
  if (rc < 0)
    molt__shadow_follower_fail(MOLT__SHADOW_END_FAILED,
                               "the update failed in the follower: %s",
                               err[0] ? err : molt_strerror(rc));
  rc = molt__program_relaunch(molt__shadow_follower_thread, NULL, err, sizeof err);
  if (rc < 0)
    molt__shadow_follower_fail(MOLT__SHADOW_END_FAILED,
                               "the follower could not start its threads: %s", err);
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  for (;;)
    pause();
}

/* The barrier's step (every program thread parked, bar_lock not held). */
static int fork_step(void *arg, char *err, size_t errlen) {
  fork_ctx *c = arg;
  pid_t tids[MOLT__SHADOW_MAX_THREADS];
  size_t n = molt__program_tids(tids, MOLT__SHADOW_MAX_THREADS);
  if (n > MOLT__SHADOW_MAX_THREADS) {
    molt__errmsg(err, errlen,
                 "the program has %zu threads; a shadowed update follows at most %d", n,
                 MOLT__SHADOW_MAX_THREADS);
    return MOLT_ENOTSUP;
  }
  /* Here, with every program thread parked: none can open one after it. */
  int rc = molt__shadow_fds_check_forkable(err, errlen);
  if (rc < 0)
    return rc;
  molt__shadow_session_begin(tids, n);
  molt__program_keep_threads_at_fork();
  pid_t pid = fork();
  if (pid == 0)
    follower_main(c);
  if (pid < 0) {
    int e = errno;
    molt__shadow_session_end();
    molt__errmsg(err, errlen, "cannot fork the follower: %s", strerror(e));
    return molt__from_errno(e);
  }
  molt__shadow_session_follower(pid);
  c->pid = pid;
  return 1; /* released without a switch: the leader goes on */
}

/* ---- the leader's monitor -------------------------------------------------------*/

static void *monitor(void *arg) {
  pid_t pid = (pid_t)(intptr_t)arg;
  sigset_t old;
  molt__block_async_signals(&old);
  int st = 0;
  pid_t w;
  while ((w = waitpid(pid, &st, __WALL)) < 0 && errno == EINTR)
    ;
  molt__shadow_session_end();
  char report[2048] = "";
  int kind = molt__shadow_report(report, sizeof report);
  uint64_t rec = 0, cmp = 0, applied = 0;
  unsigned use = 0;
  molt__shadow_counts(&rec, &cmp, &use, &applied);
  char text[2048 + 256];
  molt__lock_acquire(&shd_lock);
  bool dropped = dropping;
  dropping = false;
  molt__lock_release(&shd_lock);
  if (dropped && !kind)
    snprintf(text, sizeof text, "dropped by molt rollback: follower %d killed", (int)pid);
  else if (kind == MOLT__SHADOW_END_DIVERGED)
    snprintf(text, sizeof text, "diverged: %s; follower %d ended", report, (int)pid);
  else if (kind)
    snprintf(text, sizeof text, "%s; follower %d ended", report, (int)pid);
  else if (w == pid && WIFSIGNALED(st))
    snprintf(text, sizeof text, "the follower %d crashed (signal %d, %s)", (int)pid,
             WTERMSIG(st), strsignal(WTERMSIG(st)));
  else if (w == pid && WIFEXITED(st))
    snprintf(text, sizeof text, "the follower %d exited with status %d", (int)pid,
             WEXITSTATUS(st));
  else
    snprintf(text, sizeof text, "the follower %d was lost: %s", (int)pid,
             strerror(errno));
  molt__lock_acquire(&shd_lock);
  stage = STAGE_ENDED;
  snprintf(outcome, sizeof outcome, "%s", text);
  if (kind == MOLT__SHADOW_END_DIVERGED)
    divergences++;
  molt__log(MOLT__EV_SHADOW, molt__gen_number_now(), NULL,
            "shadowed update to %s: %s (%" PRIu64 " calls recorded, %" PRIu64
            " compared, %" PRIu64 " decided by a rule); the leader goes on",
            image, text, rec, cmp, applied);
  molt__lock_release(&shd_lock);
  return NULL;
}

/* ---- the operation ---------------------------------------------------------------*/

static int op_shadow(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  uint64_t gen = molt__gen_number_now();
  molt__lock_acquire(&shd_lock);
  bool busy = stage == STAGE_FOLLOWING;
  pid_t busy_pid = follower;
  molt__lock_release(&shd_lock);
  if (busy) {
    molt__errmsg(err, errlen,
                 "a shadowed update is already running (follower %d); wait until it ends "
                 "(molt status)",
                 (int)busy_pid);
    molt__log(MOLT__EV_REFUSE, gen, NULL, "shadow %s refused: %s", req->path, err);
    return MOLT_EBUSY;
  }
  if (molt__shadow_area_get() < 0) {
    molt__errmsg(err, errlen, "cannot map the shadow's rings: out of memory");
    molt__log(MOLT__EV_REFUSE, gen, NULL, "shadow %s refused: %s", req->path, err);
    return MOLT_ENOMEM;
  }
  /* The rules, parsed again here: the text came from a client.  No
   * session runs (checked above, under op_lock), so nobody reads them. */
  molt__rules *rules = molt__shadow_rules();
  if (req->rules_len > 0) {
    int prc = molt__rules_parse(req->rules_name, req->rules, req->rules_len, rules, err,
                                errlen);
    if (prc < 0) {
      rules->n = 0;
      molt__log(MOLT__EV_REFUSE, gen, NULL, "shadow %s refused: %s", req->path, err);
      return prc;
    }
  } else {
    rules->n = 0;
  }
  fork_ctx c = {0};
  int rc = molt__full_update_prepare(req->path, req->has_fd ? req->fd : -1,
                                     req->timeout_ms, &c.u, err, errlen);
  if (rc < 0)
    return rc; /* logged */
  pthread_t th;
  rc = molt__barrier(req->timeout_ms, fork_step, &c, MOLT__VERDICT_RESTART, err, errlen);
  molt__full_update_discard(c.u);
  if (rc <= 0) {
    if (rc == 0) /* cannot happen: the step returns 1 or an error */
      rc = MOLT_EINTERNAL;
    molt__log(MOLT__EV_REFUSE, gen, NULL, "shadow %s refused: %s", req->path, err);
    return rc;
  }
  molt__lock_acquire(&shd_lock);
  stage = STAGE_FOLLOWING;
  follower = c.pid;
  nrules = rules->n;
  snprintf(image, sizeof image, "%s", req->path);
  outcome[0] = '\0';
  molt__log(MOLT__EV_SHADOW, gen, NULL,
            "shadowed update to %s: follower %d forked at the update points; it updates "
            "and replays the leader's calls under %u rule%s%s%s, the leader goes on",
            req->path, (int)c.pid, rules->n, rules->n == 1 ? "" : "s",
            req->rules_len ? " from " : "", req->rules_len ? req->rules_name : "");
  molt__lock_release(&shd_lock);
  if (pthread_create(&th, NULL, monitor, (void *)(intptr_t)c.pid) == 0) {
    pthread_detach(th);
  } else {
    /* Without a monitor nobody would reap it: end it now. */
    kill(c.pid, SIGKILL);
    waitpid(c.pid, NULL, __WALL);
    molt__shadow_session_end();
    molt__lock_acquire(&shd_lock);
    stage = STAGE_ENDED;
    snprintf(outcome, sizeof outcome, "no thread to watch the follower: killed");
    molt__lock_release(&shd_lock);
    molt__errmsg(err, errlen, "cannot start the thread that watches the follower");
    return MOLT_ENOMEM;
  }
  char num[24], msg[256];
  snprintf(num, sizeof num, "%" PRIu64, gen);
  molt__buf_pair(out, "generation", num);
  snprintf(msg, sizeof msg,
           "follower %d updates and is compared; the leader serves on (molt status)",
           (int)c.pid);
  molt__buf_pair(out, "message", msg);
  return 0;
}

/* molt rollback in a program image: ends a following shadow's follower
 * (the leader never switched: nothing else to undo).  Without one, the
 * full mode's answer (hot patches are not supported there). */
static int op_rollback(const molt__request *req, molt__buf *out, char *err,
                       size_t errlen) {
  (void)req;
  molt__lock_acquire(&shd_lock);
  pid_t pid = stage == STAGE_FOLLOWING ? follower : 0;
  if (pid > 0) {
    dropping = true;
    kill(pid, SIGKILL);
  }
  molt__lock_release(&shd_lock);
  if (pid <= 0) {
    const molt__mode *m = molt__mode_current();
    const molt__op_info *oi = molt__op_find(MOLT__OP_ROLLBACK);
    int rc = m && m->refuse && oi ? m->refuse(oi, err, errlen) : MOLT_ENOTSUP;
    molt__log(MOLT__EV_REFUSE, molt__gen_number_now(), NULL, "rollback refused: %s", err);
    return rc;
  }
  /* The monitor reaps it and records the outcome: wait for that, so that
   * `molt status` right after shows it ended. */
  for (int ms = 0; ms < 5000; ms += 10) {
    molt__lock_acquire(&shd_lock);
    bool done = stage != STAGE_FOLLOWING;
    molt__lock_release(&shd_lock);
    if (done)
      break;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  char num[24], msg[96];
  snprintf(num, sizeof num, "%" PRIu64, molt__gen_number_now());
  molt__buf_pair(out, "generation", num);
  snprintf(msg, sizeof msg, "follower %d of the shadowed update ended", (int)pid);
  molt__buf_pair(out, "message", msg);
  return 0;
}

/* ---- status, fork ------------------------------------------------------------------*/

/* shadow <stage> <follower pid> <image> <recorded> <compared> <ring use %>
 *        <divergences> <outcome> <rules> <calls decided by a rule> */
static void shadow_status(molt__buf *out) {
  molt__lock_acquire(&shd_lock);
  if (stage != STAGE_NONE) {
    uint64_t rec = 0, cmp = 0, applied = 0;
    unsigned use = 0;
    molt__shadow_counts(&rec, &cmp, &use, &applied);
    char pid[16], r[24], c[24], u[16], d[24], nr[16], ap[24];
    snprintf(pid, sizeof pid, "%d", (int)follower);
    snprintf(r, sizeof r, "%" PRIu64, rec);
    snprintf(c, sizeof c, "%" PRIu64, cmp);
    snprintf(u, sizeof u, "%u", use);
    snprintf(d, sizeof d, "%" PRIu64, divergences);
    snprintf(nr, sizeof nr, "%u", nrules);
    snprintf(ap, sizeof ap, "%" PRIu64, applied);
    const char *f[] = {"shadow", stage == STAGE_FOLLOWING ? "following" : "ended",
                       pid,      image,
                       r,        c,
                       u,        d,
                       outcome,  nr,
                       ap};
    molt__buf_record(out, 11, f);
  }
  molt__lock_release(&shd_lock);
}

static void shadow_fork_prepare(void) { molt__lock_acquire(&shd_lock); }
static void shadow_fork_parent(void) { molt__lock_release(&shd_lock); }
static void shadow_fork_child(void) {
  /* A child of the leader (the program's own fork(), or the follower)
   * neither records nor has a shadow of its own. */
  molt__shadow_session_end();
  stage = STAGE_NONE;
  molt__lock_reinit(&shd_lock);
}

static const molt__mode shadow_mode = {
    .name = "shadow",
    .within = MOLT__MODE_FULL,
    .ops = {[MOLT__OP_SHADOW] = op_shadow, [MOLT__OP_ROLLBACK] = op_rollback},
    .fork_prepare = shadow_fork_prepare,
    .fork_parent = shadow_fork_parent,
    .fork_child = shadow_fork_child,
    .status = shadow_status,
};

__attribute__((constructor(101))) static void shadow_register(void) {
  molt__mode_register(&shadow_mode);
}
