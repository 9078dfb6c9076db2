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
 *     With retries (molt update --shadow --retries N), a follower that
 *     ended on its own (a divergence, a crash, a failed update) while the
 *     old version led is replaced: the monitor waits the retry delay and
 *     wakes the runtime thread, whose deferred hook (switch.h) runs steps
 *     1-3 again from the kept image (a fresh fork at the next update
 *     points, under the same timeout and rules), up to N times.
 *
 *  5. molt promote: the new version leads, the old one follows under the
 *     reverse rules (ring.c hands every ring over at each thread's next
 *     followed call); molt rollback hands the lead back and ends the
 *     follower; molt commit hands it back if promoted, ends the follower
 *     and performs the rehearsed update in place (the process keeps its
 *     pid).  A follower whose leader ends other than through exit() takes
 *     over and serves alone, with a control socket of its own.
 *
 * Lock: shd_lock (the lock table in base.h) protects the stage, the
 * follower's pid, the image path, the outcome and the retries' state; the
 * runtime thread takes it inside op_lock, the monitor thread (and the
 * thread waiting out a retry delay) alone; molt__log inside. */
#include "shadow/shadow.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The stages, as `molt status` names them. */
#define MOLT__SHADOW_STAGES(XX)                                                          \
  XX(NONE, "none")           /* never shadowed */                                        \
  XX(SHADOWING, "shadowing") /* the old version leads, the follower follows */           \
  XX(PROMOTED, "promoted")   /* the new version (the follower) leads */                  \
  XX(ENDED, "ended")         /* the follower ended; the old version serves */            \
  XX(COMMITTED, "committed") /* molt commit: the process runs the new version */         \
  XX(RETRYING, "retrying") /* a follower ended; the next attempt forks after a delay */  \
  XX(TOOK_OVER, "took-over") /* (in a follower) its leader ended; it serves alone */

typedef enum {
#define STAGE_ENUM(NAME, name) STAGE_##NAME,
  MOLT__SHADOW_STAGES(STAGE_ENUM)
#undef STAGE_ENUM
} stage_t;

static const char *const stage_names[] = {
#define STAGE_NAME(NAME, name) name,
    MOLT__SHADOW_STAGES(STAGE_NAME)
#undef STAGE_NAME
};

static molt__lock shd_lock = MOLT__LOCK_INIT(shd);
static stage_t stage;            /* shd_lock */
static pid_t follower;           /* shd_lock: the live or last follower */
static char image[4096];         /* shd_lock: the new image's path */
static int image_fd = -1;        /* shd_lock: the new image, kept for molt commit */
static char outcome[2048 + 256]; /* shd_lock: how the last session ended */
static uint64_t divergences;     /* shd_lock: sessions ended by a divergence */
/* shd_lock: why the runtime killed the follower (molt rollback, molt
 * commit); NULL: it did not. */
static const char *ending;
static unsigned nrules;      /* shd_lock: rules of the last session */
static char rules_name[256]; /* shd_lock: where they came from ("": none) */

/* Retries (shd_lock).  attempt: the running or last attempt, from 1;
 * attempts: at most how many (1 + the retries asked for).  While RETRYING,
 * a thread waits retry_delay_ms, then sets retry_due and wakes the runtime
 * thread, whose deferred hook forks the next attempt under retry_timeout_ms
 * (the request's timeout).  retry_epoch changes whenever a wait must not
 * lead to a retry any more (molt rollback, the retries ended, a new
 * wait): a waiter that finds another epoch leaves. */
static unsigned attempt, attempts;
static int retry_delay_ms, retry_timeout_ms;
static bool retry_due;
static uint64_t retry_epoch;

static bool running(stage_t s) { return s == STAGE_SHADOWING || s == STAGE_PROMOTED; }
/* A shadowed update is under way: a follower runs or the next attempt waits. */
static bool busy(stage_t s) { return running(s) || s == STAGE_RETRYING; }

/* The rules of the next session, parsed before the barrier (op_lock). */
static molt__rules next_rules;

/* What the step needs, on the runtime thread's stack. */
typedef struct fork_ctx {
  molt__full_update *u;
  pid_t pid;
} fork_ctx;

/* ---- the follower --------------------------------------------------------------*/

/* The follower's only thread, in the child of the step's fork(): never
 * returns. */
static void follower_main(fork_ctx *c) __attribute__((noreturn));
static void took_over(pid_t leader);

static void follower_main(fork_ctx *c) {
  pid_t leader = getppid();
  /* The epoll instances it shares hold the leader's data (epoll.c). */
  molt__shadow_epoll_disown();
  molt__shadow_become_follower();
  molt__shadow_note_inherited();
  /* The follower watches its leader: a pidfd becomes readable when the
   * leader's process has ended.  (Opened after the inherited set was
   * noted: it is the follower's own; kept in the runtime's band, out of
   * the numbers where descriptors the leader creates are placed, fds.c.)
   * Without pidfds (Linux < 5.3) it dies with the leader's runtime thread
   * instead, as it always did. */
  molt__fd watch = MOLT__FD_NONE;
  int pidfd = (int)syscall(SYS_pidfd_open, leader, 0);
  if (pidfd >= 0 && molt__fd_keep(&watch, pidfd) == 0)
    pidfd = watch.fd;
  else
    pidfd = -1;
  if (pidfd < 0)
    prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != leader)
    _exit(112);
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
  if (pidfd >= 0) {
    struct pollfd p = {pidfd, POLLIN, 0};
    while (poll(&p, 1, -1) <= 0)
      ;
    molt__fd_close(&watch);
    /* A leader that ended through exit() meant to end: so does its
     * follower.  A crash or a signal: the follower takes over. */
    if (molt__shadow_leader_exited())
      _exit(0);
    took_over(leader);
  }
  for (;;)
    pause();
}

/* The leader is gone: every program thread of the follower replays what
 * its ring still holds (what the leader did and answered), then makes its
 * calls for real; the follower gets a runtime thread and a control socket
 * under its own pid. */
static void took_over(pid_t leader) {
  /* The pidfd said the leader's process is dead: its threads' reads and
   * writes in progress can be completed (ring.c, intents). */
  molt__shadow_session_peer_died();
  molt__lock_acquire(&shd_lock);
  stage = STAGE_TOOK_OVER;
  follower = getpid();
  snprintf(outcome, sizeof outcome,
           "the leader %d ended (a crash or a signal); this follower (%d) took over and "
           "serves alone in the new version",
           (int)leader, (int)getpid());
  molt__log(MOLT__EV_SHADOW, molt__gen_number_now(), NULL, "shadowed update: %s",
            outcome);
  molt__lock_release(&shd_lock);
  molt__start_if_needed();
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
  if (rc == 0)
    rc = molt__shadow_epoll_begin(err, errlen);
  if (rc < 0)
    return rc;
  *molt__shadow_rules() = next_rules;
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

/* ---- retries ---------------------------------------------------------------------*/

/* The retry delay as "1.500 s" into buf. */
static void delay_text(int ms, char *buf, size_t len) {
  snprintf(buf, len, "%d.%03d s", ms / 1000, ms % 1000);
}

/* ", attempt k of m" when the shadow has retries, else "". */
static void attempt_text(unsigned k, unsigned m, char *buf, size_t len) {
  buf[0] = '\0';
  if (m > 1)
    snprintf(buf, len, ", attempt %u of %u", k, m);
}

/* Waits out the retry delay (shd_lock not held), then lets the runtime
 * thread fork the next attempt: retry_due, and a wake-up that makes it run
 * its deferred hooks (shadow_deferred), sent again every 500 ms until the
 * hook has taken it (a wake-up written while the host had closed the
 * runtime's pair is lost).  Returns at once when the wait no longer leads
 * anywhere (another epoch: molt rollback cancelled it). */
static void wait_then_retry(uint64_t epoch) {
  molt__lock_acquire(&shd_lock);
  uint64_t due = molt__now_ns() + (uint64_t)retry_delay_ms * 1000000u;
  molt__lock_release(&shd_lock);
  uint64_t woke = 0; /* when it last woke the runtime thread; 0: never */
  for (;;) {
    molt__lock_acquire(&shd_lock);
    bool live = retry_epoch == epoch && stage == STAGE_RETRYING;
    uint64_t now = molt__now_ns();
    if (live && now >= due && !woke)
      retry_due = true;
    bool taken = woke && !retry_due; /* the hook took it (a new wait: a new epoch) */
    molt__lock_release(&shd_lock);
    if (!live || taken)
      return;
    if (now >= due && (!woke || now - woke >= 500000000u)) {
      molt__wake();
      woke = now;
    }
    /* Polled, so that a cancelled wait of up to an hour ends within 20 ms
     * without a condition variable (and a lock of its own). */
    uint64_t left = now < due ? due - now : 20000000u;
    struct timespec ts = {0, (long)(left < 20000000u ? left : 20000000u)};
    nanosleep(&ts, NULL);
  }
}

static void *retry_waiter(void *arg) {
  sigset_t old;
  molt__block_async_signals(&old);
  wait_then_retry((uint64_t)(uintptr_t)arg);
  return NULL;
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
  /* Each thread replays what its ring still holds (after a promotion, the
   * new version's calls), completes a read or write the new version died
   * inside of (reaped: it is dead), then runs alone. */
  molt__shadow_session_peer_died();
  char report[2048] = "";
  int kind = molt__shadow_report(report, sizeof report);
  uint64_t rec = 0, cmp = 0, applied = 0;
  unsigned use = 0;
  molt__shadow_counts(&rec, &cmp, &use, &applied);
  char text[2048 + 256];
  molt__lock_acquire(&shd_lock);
  const char *why = ending;
  ending = NULL;
  bool led = stage == STAGE_PROMOTED;
  molt__lock_release(&shd_lock);
  if (why && !kind)
    snprintf(text, sizeof text, "%s: follower %d killed", why, (int)pid);
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
  /* After a promotion, a new version that ended while it led hands the
   * lead back (the old version replays its calls first); an old version
   * that had stopped following cannot lead again. */
  const char *after = "the leader goes on";
  if (led && !why)
    after = kind ? "the new version had left the old one behind; the old version's "
                   "threads stay stopped (restart the process)"
                 : "it led: the old version replays its calls and leads again";
  molt__lock_acquire(&shd_lock);
  /* Retried: a follower that ended on its own while the old version led
   * (a divergence, a crash, a failed update or relaunch, a call molt does
   * not follow) -- not one the operator ended, nor one a full ring made
   * the leader drop (the follower was too slow: each retry would make the
   * leader's threads wait for room again), nor after a promotion. */
  bool retry = !why && !led && kind != MOLT__SHADOW_END_DROPPED && attempt < attempts;
  char which[64], next[128] = "";
  attempt_text(attempt, attempts, which, sizeof which);
  if (retry) {
    char d[32];
    delay_text(retry_delay_ms, d, sizeof d);
    snprintf(next, sizeof next,
             "; attempt %u of %u forks at the next update points in %s", attempt + 1,
             attempts, d);
  } else if (attempts > 1 && !why && !led) {
    snprintf(next, sizeof next, "; no attempt left (%u made)", attempt);
  }
  stage = retry ? STAGE_RETRYING : STAGE_ENDED;
  snprintf(outcome, sizeof outcome, "%s%s%.2048s%s", which[0] ? which + 2 : "",
           which[0] ? ": " : "", text, next);
  if (kind == MOLT__SHADOW_END_DIVERGED)
    divergences++;
  if (!retry && image_fd >= 0) {
    close(image_fd);
    image_fd = -1;
  }
  uint64_t epoch = retry ? ++retry_epoch : 0;
  molt__log(MOLT__EV_SHADOW, molt__gen_number_now(), NULL,
            "shadowed update to %s%s: %s (%" PRIu64 " calls recorded, %" PRIu64
            " compared, %" PRIu64 " decided by a rule); %s%s",
            image, which, text, rec, cmp, applied, after, next);
  molt__lock_release(&shd_lock);
  if (retry)
    wait_then_retry(epoch); /* this thread has nothing else to do */
  return NULL;
}

/* ---- the operation ---------------------------------------------------------------*/

/* Starts the monitor of follower pid (shd_lock not held): 0, or (no thread)
 * the follower killed, the shadow ended and MOLT_ENOMEM with err. */
static int watch(pid_t pid, char *err, size_t errlen) {
  pthread_t th;
  if (pthread_create(&th, NULL, monitor, (void *)(intptr_t)pid) == 0) {
    pthread_detach(th);
    return 0;
  }
  /* Without a monitor nobody would reap it: end it now. */
  kill(pid, SIGKILL);
  waitpid(pid, NULL, __WALL);
  molt__shadow_session_end();
  molt__lock_acquire(&shd_lock);
  stage = STAGE_ENDED;
  snprintf(outcome, sizeof outcome, "no thread to watch the follower: killed");
  if (image_fd >= 0) {
    close(image_fd);
    image_fd = -1;
  }
  molt__lock_release(&shd_lock);
  molt__errmsg(err, errlen, "cannot start the thread that watches the follower");
  return MOLT_ENOMEM;
}

/* One attempt's steps 1-3 (runtime thread, op_lock held): the new image
 * prepared from fd, the barrier within timeout_ms, the fork.  0 with *pid
 * the follower's; or MOLT_E* with err, *prepared telling whether the image
 * was accepted (the full mode logged a refusal of it). */
static int fork_attempt(const char *path, int fd, int timeout_ms, pid_t *pid,
                        bool *prepared, char *err, size_t errlen) {
  fork_ctx c = {0};
  *prepared = false;
  int rc = molt__full_update_prepare(path, fd, timeout_ms, &c.u, err, errlen);
  if (rc < 0)
    return rc;
  *prepared = true;
  rc = molt__barrier(timeout_ms, fork_step, &c, MOLT__VERDICT_RESTART, err, errlen);
  molt__full_update_discard(c.u);
  if (rc <= 0)
    return rc == 0 ? MOLT_EINTERNAL : rc; /* 0 cannot happen: the step returns 1 */
  *pid = c.pid;
  return 0;
}

/* The refusal of an operation that needs a follower, while the next attempt
 * waits (shd_lock held). */
static void retrying_why(char *buf, size_t len) {
  snprintf(buf, len,
           "no follower runs: attempt %u of %u of the shadowed update ended and the "
           "next one forks at the next update points ('molt rollback' cancels it; "
           "molt status)",
           attempt, attempts);
}

static int op_shadow(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  uint64_t gen = molt__gen_number_now();
  molt__lock_acquire(&shd_lock);
  stage_t st = stage;
  pid_t busy_pid = follower;
  char why[256];
  retrying_why(why, sizeof why);
  molt__lock_release(&shd_lock);
  if (busy(st)) {
    if (st == STAGE_RETRYING)
      molt__errmsg(err, errlen, "a shadowed update is already under way: %s", why);
    else
      molt__errmsg(err, errlen,
                   "a shadowed update is already running (follower %d); end it first "
                   "with 'molt commit' or 'molt rollback' (molt status)",
                   (int)busy_pid);
    molt__log(MOLT__EV_REFUSE, gen, NULL, "shadow %s refused: %s", req->path, err);
    return MOLT_EBUSY;
  }
  int area_rc = molt__shadow_area_get(err, errlen);
  if (area_rc < 0) {
    molt__log(MOLT__EV_REFUSE, gen, NULL, "shadow %s refused: %s", req->path, err);
    return area_rc;
  }
  /* The rules, parsed again here: the text came from a client.  Into a
   * table of the operation's (op_lock): the session's table, which the
   * original process's threads read while they follow after a promotion,
   * is written by the fork step, with every program thread parked.  A
   * retry forks under the same table (no other shadow starts meanwhile). */
  molt__rules *rules = &next_rules;
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
  if (req->retries < 0 || req->retries > MOLT__MAX_RETRIES ||
      req->retry_delay_ms > MOLT__MAX_RETRY_DELAY_MS) {
    molt__errmsg(err, errlen, "retries %d, delay %d ms: out of range", req->retries,
                 req->retry_delay_ms);
    molt__log(MOLT__EV_REFUSE, gen, NULL, "shadow %s refused: %s", req->path, err);
    return MOLT_EINVAL;
  }
  pid_t pid = 0;
  bool prepared;
  int rc = fork_attempt(req->path, req->has_fd ? req->fd : -1, req->timeout_ms, &pid,
                        &prepared, err, errlen);
  if (rc < 0) {
    if (prepared) /* else the full mode logged it */
      molt__log(MOLT__EV_REFUSE, gen, NULL, "shadow %s refused: %s", req->path, err);
    return rc;
  }
  /* The image, kept for molt commit and for retries (opened after the
   * fork: the follower does not hold it; a high number, out of the way of
   * the program's). */
  int keep = req->has_fd ? fcntl(req->fd, F_DUPFD_CLOEXEC, 256)
                         : open(req->path, O_RDONLY | O_CLOEXEC);
  molt__lock_acquire(&shd_lock);
  stage = STAGE_SHADOWING;
  follower = pid;
  nrules = rules->n;
  snprintf(rules_name, sizeof rules_name, "%s", req->rules_len ? req->rules_name : "");
  ending = NULL;
  if (image_fd >= 0)
    close(image_fd);
  image_fd = keep;
  snprintf(image, sizeof image, "%s", req->path);
  outcome[0] = '\0';
  attempt = 1;
  attempts = 1 + (unsigned)req->retries;
  retry_delay_ms =
      req->retry_delay_ms >= 0 ? req->retry_delay_ms : MOLT__DEFAULT_RETRY_DELAY_MS;
  retry_timeout_ms = req->timeout_ms;
  retry_due = false;
  retry_epoch++;
  char which[64], tries[96] = "";
  attempt_text(attempt, attempts, which, sizeof which);
  if (attempts > 1) {
    char d[32];
    delay_text(retry_delay_ms, d, sizeof d);
    snprintf(tries, sizeof tries, "; up to %u retr%s, each %s after a follower ends",
             attempts - 1, attempts == 2 ? "y" : "ies", d);
  }
  molt__log(MOLT__EV_SHADOW, gen, NULL,
            "shadowed update to %s%s: follower %d forked at the update points; it "
            "updates and replays the leader's calls under %u rule%s%s%s, the leader goes "
            "on%s",
            req->path, which, (int)pid, rules->n, rules->n == 1 ? "" : "s",
            rules_name[0] ? " from " : "", rules_name, tries);
  molt__lock_release(&shd_lock);
  rc = watch(pid, err, errlen);
  if (rc < 0)
    return rc;
  char num[24], msg[256];
  snprintf(num, sizeof num, "%" PRIu64, gen);
  molt__buf_pair(out, "generation", num);
  snprintf(msg, sizeof msg,
           "follower %d updates and is compared; the leader serves on (molt status)",
           (int)pid);
  molt__buf_pair(out, "message", msg);
  return 0;
}

/* The runtime thread's deferred hook (op_lock held, in its own pass): the
 * next attempt of a shadowed update once its delay has passed -- the image
 * kept open, a barrier within the request's timeout, a fresh fork, under
 * the same rules.  A barrier that times out uses up its attempt (threads
 * busy for a moment may park next time); any other refusal ends the
 * retries, as it would refuse the next attempt too. */
static void shadow_deferred(void) {
  molt__lock_acquire(&shd_lock);
  if (stage != STAGE_RETRYING || !retry_due) {
    molt__lock_release(&shd_lock);
    return;
  }
  retry_due = false;
  unsigned k = attempt + 1, m = attempts;
  int fd = image_fd, timeout_ms = retry_timeout_ms;
  char path[sizeof image];
  memcpy(path, image, sizeof path);
  molt__lock_release(&shd_lock);

  char err[1024] = "", reason[256];
  pid_t pid = 0;
  bool prepared = false;
  int rc;
  if (molt__refusing(reason, sizeof reason)) {
    molt__errmsg(err, sizeof err,
                 "the runtime refuses updates after an internal failure: %s", reason);
    rc = MOLT_EREFUSING;
  } else if (fd < 0) {
    molt__errmsg(err, sizeof err, "the new image %s was not kept open", path);
    rc = MOLT_EIO;
  } else {
    rc = fork_attempt(path, fd, timeout_ms, &pid, &prepared, err, sizeof err);
  }
  uint64_t gen = molt__gen_number_now();
  molt__lock_acquire(&shd_lock);
  attempt = k;
  char which[64];
  attempt_text(k, m, which, sizeof which);
  if (rc == 0) {
    stage = STAGE_SHADOWING;
    follower = pid;
    ending = NULL;
    outcome[0] = '\0';
    molt__log(MOLT__EV_SHADOW, gen, NULL,
              "shadowed update to %s%s: follower %d forked at the update points; it "
              "updates and replays the leader's calls under %u rule%s%s%s, the leader "
              "goes on",
              path, which, (int)pid, nrules, nrules == 1 ? "" : "s",
              rules_name[0] ? " from " : "", rules_name);
    molt__lock_release(&shd_lock);
    char werr[128];
    (void)watch(pid, werr, sizeof werr); /* on failure the outcome says so */
    return;
  }
  bool again = rc == MOLT_ETIMEDOUT && k < m;
  char next[128];
  uint64_t epoch = 0;
  if (again) {
    char d[32];
    delay_text(retry_delay_ms, d, sizeof d);
    snprintf(next, sizeof next, "attempt %u of %u forks at the next update points in %s",
             k + 1, m, d);
    epoch = ++retry_epoch;
  } else {
    snprintf(next, sizeof next, "%s",
             k < m ? "no more attempts: the next would be refused the same way"
                   : "no attempt left");
    stage = STAGE_ENDED;
    if (image_fd >= 0) {
      close(image_fd);
      image_fd = -1;
    }
  }
  snprintf(outcome, sizeof outcome, "attempt %u of %u did not start: %.1900s; %s", k, m,
           err, next);
  molt__log(MOLT__EV_SHADOW, gen, NULL, "shadowed update to %s: %s; the leader goes on",
            path, outcome);
  molt__lock_release(&shd_lock);
  pthread_t th;
  if (again) {
    if (pthread_create(&th, NULL, retry_waiter, (void *)(uintptr_t)epoch) == 0) {
      pthread_detach(th);
    } else {
      molt__lock_acquire(&shd_lock);
      if (retry_epoch == epoch && stage == STAGE_RETRYING) {
        stage = STAGE_ENDED;
        retry_epoch++;
        snprintf(outcome, sizeof outcome,
                 "attempt %u of %u did not start: %.1900s; no thread to wait for the "
                 "next one: retries ended",
                 k, m, err);
        if (image_fd >= 0) {
          close(image_fd);
          image_fd = -1;
        }
        molt__log(MOLT__EV_SHADOW, gen, NULL, "shadowed update to %s: %s", path, outcome);
      }
      molt__lock_release(&shd_lock);
    }
  }
}

/* Kills the follower for `why` (shd_lock not held) and waits until the
 * monitor has reaped it and recorded the outcome, so that `molt status`
 * right after shows it ended. */
static void end_follower(pid_t pid, const char *why) {
  /* This process leads (a promotion was handed back first): its threads
   * stop recording now rather than when the monitor has reaped the
   * follower -- on a loaded machine that can take long enough for a busy
   * thread to fill its ring and drop the shadow with a misleading report. */
  molt__shadow_session_alone();
  molt__lock_acquire(&shd_lock);
  ending = why;
  kill(pid, SIGKILL);
  molt__lock_release(&shd_lock);
  for (int ms = 0; ms < 5000; ms += 10) {
    molt__lock_acquire(&shd_lock);
    bool done = !running(stage);
    molt__lock_release(&shd_lock);
    if (done)
      break;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
}

/* The running session's stage and follower (NONE if none runs).  A
 * promoted session whose old version stopped following (its report
 * written) cannot hand the lead back: err says so. */
static stage_t session_now(pid_t *pid, char *why, size_t whylen) {
  molt__lock_acquire(&shd_lock);
  stage_t st = running(stage) ? stage : STAGE_NONE;
  *pid = follower;
  molt__lock_release(&shd_lock);
  why[0] = '\0';
  if (st != STAGE_NONE)
    molt__shadow_report(why, whylen);
  return st;
}

/* A wrong stage: the refusal, logged. */
static int refuse(int rc, const char *op, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int refuse(int rc, const char *op, char *err, size_t errlen, const char *fmt,
                  ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  molt__log(MOLT__EV_REFUSE, molt__gen_number_now(), NULL, "%s refused: %s", op, err);
  return rc;
}

static int timeout_of(const molt__request *req) {
  return req->timeout_ms > 0 ? req->timeout_ms : MOLT__DEFAULT_TIMEOUT_MS;
}

/* molt rollback while the next attempt waits (shd_lock held): no more
 * attempts (the waiting thread finds another epoch and leaves). */
static void cancel_locked(void) {
  stage = STAGE_ENDED;
  retry_epoch++;
  retry_due = false;
  /* Set by a rollback whose follower had just ended on its own: its
   * monitor had read it already. */
  ending = NULL;
  if (image_fd >= 0) {
    close(image_fd);
    image_fd = -1;
  }
  char last[sizeof outcome];
  memcpy(last, outcome, sizeof last);
  snprintf(outcome, sizeof outcome,
           "retries cancelled by molt rollback after attempt %u of %u (%.2048s)", attempt,
           attempts, last);
  molt__log(MOLT__EV_SHADOW, molt__gen_number_now(), NULL,
            "shadowed update to %s: retries cancelled by molt rollback after attempt %u "
            "of %u; no follower runs, the leader goes on",
            image, attempt, attempts);
}

/* molt rollback while the next attempt waits: cancelled, its answer into
 * out.  false if none waits. */
static bool cancel_retries(molt__buf *out) {
  molt__lock_acquire(&shd_lock);
  if (stage != STAGE_RETRYING) {
    molt__lock_release(&shd_lock);
    return false;
  }
  unsigned k = attempt, m = attempts;
  cancel_locked();
  molt__lock_release(&shd_lock);
  char num[24], msg[160];
  snprintf(num, sizeof num, "%" PRIu64, molt__gen_number_now());
  molt__buf_pair(out, "generation", num);
  snprintf(msg, sizeof msg,
           "the shadowed update's retries were cancelled after attempt %u of %u; no "
           "follower runs",
           k, m);
  molt__buf_pair(out, "message", msg);
  return true;
}

/* While the next attempt waits: op (promote, commit) refused; 0 if none
 * waits. */
static int refuse_retrying(const char *op, char *err, size_t errlen) {
  molt__lock_acquire(&shd_lock);
  bool waiting = stage == STAGE_RETRYING;
  char why[256];
  retrying_why(why, sizeof why);
  molt__lock_release(&shd_lock);
  if (!waiting)
    return 0;
  molt__errmsg(err, errlen, "%s", why);
  molt__log(MOLT__EV_REFUSE, molt__gen_number_now(), NULL, "%s refused: %s", op, err);
  return MOLT_EINVAL;
}

/* molt promote: the new version (the follower) leads, the old one follows
 * under the reverse rules. */
static int op_promote(const molt__request *req, molt__buf *out, char *err,
                      size_t errlen) {
  int wrc = refuse_retrying("promote", err, errlen);
  if (wrc < 0)
    return wrc;
  pid_t pid;
  char why[2048];
  stage_t st = session_now(&pid, why, sizeof why);
  if (st == STAGE_NONE)
    return refuse(MOLT_ENOHISTORY, "promote", err, errlen,
                  "nothing to promote: no shadowed update is running (start one with "
                  "'molt update --shadow')");
  if (st == STAGE_PROMOTED)
    return refuse(MOLT_EINVAL, "promote", err, errlen,
                  "already promoted: the new version (follower %d) leads; 'molt commit' "
                  "keeps it, 'molt rollback' returns to the old version",
                  (int)pid);
  if (why[0])
    return refuse(MOLT_EINVAL, "promote", err, errlen, "the follower %d is ending: %s",
                  (int)pid, why);
  char herr[512] = "";
  int rc = molt__shadow_hand_over(1, timeout_of(req), pid, herr, sizeof herr);
  if (rc < 0)
    return refuse(rc, "promote", err, errlen, "promotion of follower %d failed: %s",
                  (int)pid, herr);
  molt__lock_acquire(&shd_lock);
  stage = STAGE_PROMOTED;
  molt__log(
      MOLT__EV_SHADOW, molt__gen_number_now(), NULL,
      "shadowed update to %s promoted: the new version (follower %d) leads, the old "
      "version follows under the reverse rules",
      image, (int)pid);
  molt__lock_release(&shd_lock);
  char num[24], msg[160];
  snprintf(num, sizeof num, "%" PRIu64, molt__gen_number_now());
  molt__buf_pair(out, "generation", num);
  snprintf(msg, sizeof msg,
           "the new version (follower %d) leads; the old version follows (molt commit, "
           "molt rollback)",
           (int)pid);
  molt__buf_pair(out, "message", msg);
  return 0;
}

/* Hands the lead back to the old version after a promotion. */
static int hand_back(const char *op, pid_t pid, const char *why, int timeout_ms,
                     char *err, size_t errlen) {
  if (why[0])
    return refuse(MOLT_EINVAL, op, err, errlen,
                  "the old version stopped following the new one and cannot lead again "
                  "(%s)",
                  why);
  char herr[512] = "";
  int rc = molt__shadow_hand_over(0, timeout_ms, pid, herr, sizeof herr);
  if (rc < 0)
    return refuse(rc, op, err, errlen,
                  "the lead could not be handed back to the old version: %s; the new "
                  "version (follower %d) still leads",
                  herr, (int)pid);
  return 0;
}

/* molt rollback in a program image: ends a running shadow's follower; after
 * a promotion it first hands the lead back to the old version.  Without a
 * shadow, the full mode's answer (hot patches are not supported there). */
static int op_rollback(const molt__request *req, molt__buf *out, char *err,
                       size_t errlen) {
  if (cancel_retries(out))
    return 0;
  pid_t pid;
  char why[2048];
  stage_t st = session_now(&pid, why, sizeof why);
  if (st == STAGE_NONE) {
    const molt__mode *m = molt__mode_current();
    const molt__op_info *oi = molt__op_find(MOLT__OP_ROLLBACK);
    int rc = m && m->refuse && oi ? m->refuse(oi, err, errlen) : MOLT_ENOTSUP;
    molt__log(MOLT__EV_REFUSE, molt__gen_number_now(), NULL, "rollback refused: %s", err);
    return rc;
  }
  if (st == STAGE_PROMOTED) {
    int rc = hand_back("rollback", pid, why, timeout_of(req), err, errlen);
    if (rc < 0)
      return rc;
  }
  end_follower(pid, st == STAGE_PROMOTED
                        ? "rolled back by molt rollback after the promotion: the old "
                          "version leads again"
                        : "dropped by molt rollback");
  /* Its follower may have ended on its own just before the kill, its
   * monitor now waiting to retry: the rollback cancels that too. */
  molt__lock_acquire(&shd_lock);
  if (stage == STAGE_RETRYING)
    cancel_locked();
  molt__lock_release(&shd_lock);
  char num[24], msg[160];
  snprintf(num, sizeof num, "%" PRIu64, molt__gen_number_now());
  molt__buf_pair(out, "generation", num);
  snprintf(msg, sizeof msg, "follower %d of the shadowed update ended%s", (int)pid,
           st == STAGE_PROMOTED ? "; the old version leads again" : "");
  molt__buf_pair(out, "message", msg);
  return 0;
}

/* molt commit: keeps the new version.  The lead comes back to this process
 * (after a promotion), the follower ends, and this process performs the
 * rehearsed full update in place, so that it keeps its pid. */
static int op_commit(const molt__request *req, molt__buf *out, char *err, size_t errlen) {
  int wrc = refuse_retrying("commit", err, errlen);
  if (wrc < 0)
    return wrc;
  pid_t pid;
  char why[2048];
  stage_t st = session_now(&pid, why, sizeof why);
  if (st == STAGE_NONE)
    return refuse(MOLT_ENOHISTORY, "commit", err, errlen,
                  "nothing to commit: no shadowed update is running (start one with "
                  "'molt update --shadow')");
  if (st == STAGE_SHADOWING && why[0])
    return refuse(MOLT_EINVAL, "commit", err, errlen, "the follower %d is ending: %s",
                  (int)pid, why);
  if (st == STAGE_PROMOTED) {
    int rc = hand_back("commit", pid, why, timeout_of(req), err, errlen);
    if (rc < 0)
      return rc;
  }
  molt__lock_acquire(&shd_lock);
  int fd = image_fd;
  image_fd = -1;
  char path[sizeof image];
  memcpy(path, image, sizeof path);
  molt__lock_release(&shd_lock);
  end_follower(pid, "ended by molt commit");
  molt__request *u = calloc(1, sizeof *u);
  int rc = MOLT_ENOMEM;
  const molt__mode *full = molt__mode_current();
  if (u && fd >= 0 && full && full->ops[MOLT__OP_UPDATE]) {
    u->op = MOLT__OP_UPDATE;
    u->timeout_ms = req->timeout_ms;
    u->has_fd = true;
    u->fd = fd;
    snprintf(u->path, sizeof u->path, "%s", path);
    rc = full->ops[MOLT__OP_UPDATE](u, out, err, errlen); /* logs its outcome */
  } else if (fd < 0) {
    molt__errmsg(err, errlen, "the new image %s was not kept open", path);
    rc = MOLT_EIO;
  }
  free(u);
  if (fd >= 0)
    close(fd);
  molt__lock_acquire(&shd_lock);
  stage = rc == 0 ? STAGE_COMMITTED : STAGE_ENDED;
  if (rc == 0)
    snprintf(outcome, sizeof outcome,
             "committed: the process runs %.1024s (updated in place; follower %d ended)",
             path, (int)pid);
  else
    snprintf(outcome, sizeof outcome,
             "commit failed: %s; the follower %d ended and the old version serves on",
             err[0] ? err : molt_strerror(rc), (int)pid);
  molt__log(MOLT__EV_SHADOW, molt__gen_number_now(), NULL, "shadowed update to %s: %s",
            path, outcome);
  molt__lock_release(&shd_lock);
  return rc;
}

/* A plain full update while a follower runs would switch the leader under
 * it: refused. */
static int shadow_veto(const molt__op_info *op, char *err, size_t errlen) {
  if (op->op != MOLT__OP_UPDATE)
    return 0;
  molt__lock_acquire(&shd_lock);
  stage_t st = stage;
  pid_t pid = follower;
  char why[256];
  retrying_why(why, sizeof why);
  molt__lock_release(&shd_lock);
  if (!busy(st))
    return 0;
  if (st == STAGE_RETRYING)
    return refuse(MOLT_EBUSY, "update", err, errlen, "a shadowed update is under way: %s",
                  why);
  return refuse(MOLT_EBUSY, "update", err, errlen,
                "a shadowed update is running (follower %d, %s); end it first: 'molt "
                "commit' applies the new version, 'molt rollback' drops it",
                (int)pid, stage_names[st]);
}

/* ---- status, fork ------------------------------------------------------------------*/

/* shadow <stage> <follower pid> <image> <recorded> <compared> <ring use %>
 *        <divergences> <outcome> <rules> <calls decided by a rule>
 *        <attempt> <attempts> (both empty in a follower that took over) */
static void shadow_status(molt__buf *out) {
  molt__lock_acquire(&shd_lock);
  if (stage != STAGE_NONE) {
    /* While promoted, an old version that stopped following: its report. */
    char why[2048] = "";
    if (stage == STAGE_PROMOTED && molt__shadow_report(why, sizeof why))
      snprintf(outcome, sizeof outcome,
               "the old version stopped following: %s; the new version serves alone",
               why);
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
    /* After the other side died: the calls it died inside of, completed
     * here (ring.c, intents). */
    char said[sizeof outcome + 320];
    molt__shadow_intents in;
    molt__shadow_intent_counts(&in);
    if (in.completed + in.nothing + in.uncertain)
      snprintf(said, sizeof said,
               "%s; calls the other side died inside of: %" PRIu64 " completed (%" PRIu64
               " bytes it had read given to the program, %" PRIu64
               " bytes it had written not sent again), %" PRIu64
               " had moved nothing, %" PRIu64 " could not be told",
               outcome, in.completed, in.read_bytes, in.skipped_bytes, in.nothing,
               in.uncertain);
    else
      snprintf(said, sizeof said, "%s", outcome);
    char k[16] = "", m[16] = "";
    if (attempts > 0) {
      snprintf(k, sizeof k, "%u", attempt);
      snprintf(m, sizeof m, "%u", attempts);
    }
    const char *f[] = {
        "shadow", stage_names[stage], pid, image, r, c, u, d, said, nr, ap, k, m};
    molt__buf_record(out, 13, f);
  }
  molt__lock_release(&shd_lock);
}

static void shadow_fork_prepare(void) {
  molt__lock_acquire(&shd_lock);
  molt__shadow_epoll_fork_prepare();
  molt__shadow_fds_fork_prepare();
}
static void shadow_fork_parent(void) {
  molt__shadow_fds_fork_parent();
  molt__shadow_epoll_fork_parent();
  molt__lock_release(&shd_lock);
}
static void shadow_fork_child(void) {
  molt__shadow_epoll_fork_child();
  molt__shadow_fds_fork_child();
  /* A child of the leader (the program's own fork(), or the follower)
   * neither records nor has a shadow of its own. */
  molt__shadow_session_end();
  stage = STAGE_NONE;
  attempt = attempts = 0;
  retry_due = false;
  /* The image kept for a retry or commit is the leader's (the follower of
   * a retry inherits it: it never reads it). */
  if (image_fd >= 0) {
    close(image_fd);
    image_fd = -1;
  }
  molt__lock_reinit(&shd_lock);
}

static const molt__mode shadow_mode = {
    .name = "shadow",
    .within = MOLT__MODE_FULL,
    .ops = {[MOLT__OP_SHADOW] = op_shadow,
            [MOLT__OP_ROLLBACK] = op_rollback,
            [MOLT__OP_PROMOTE] = op_promote,
            [MOLT__OP_COMMIT] = op_commit},
    .veto = shadow_veto,
    .fork_prepare = shadow_fork_prepare,
    .fork_parent = shadow_fork_parent,
    .fork_child = shadow_fork_child,
    .status = shadow_status,
    .deferred = shadow_deferred,
};

__attribute__((constructor(101))) static void shadow_register(void) {
  molt__mode_register(&shadow_mode);
  molt__program_set_thread_hooks(&molt__shadow_thread_hooks);
}
