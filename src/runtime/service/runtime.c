/* The runtime: start-up, the runtime thread, reclamation and fork.
 *
 * The runtime thread is where every operation runs (request.c): requests
 * of the control socket and of the in-process API alike.  Its loop polls
 * the wake-up sockets (base/state.c: new requests, published generations,
 * restarted threads) and the control socket, carries out queued requests,
 * serves a control client, and runs reclamation passes while retired
 * generations are alive.
 *
 * Before each poll it makes sure both descriptors are still its own: the
 * host may close them and reuse the numbers (base.h, "descriptors the host
 * may close").  A lost one is never touched again and is made anew -- the
 * listener under the same name, once the old socket is gone.  The loop
 * needs no periodic wake-up to notice: closing the wake-up write end ends
 * the poll (state.c), and so does a client of a lost listener, which the
 * poll keeps alive until it returns.
 *
 * op_lock serializes whole operations (the lock table: base.h).  The
 * runtime thread takes it for each operation and each reclamation pass;
 * the fork handlers hold it across fork(). */
#include "service/service.h"

#include <errno.h>
#include <poll.h>
#include <semaphore.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#define RECLAIM_MIN_MS 1
#define RECLAIM_MAX_MS 100
/* A lost descriptor that cannot be made again at once is retried this often. */
#define RETRY_MS 1000
/* How long the runtime lets a host finish closing and opening before it
 * makes new descriptors (keep_descriptors). */
#define QUIET_MS 50

static molt__lock op_lock = MOLT__LOCK_INIT(op);
static molt__fd listener = MOLT__FD_NONE;
/* The abstract name the listener has (without its NUL): "molt.<pid>", or
 * a fallback when another socket holds that (control.c). */
static char listener_name[108];
static int listen_err;
/* Runtime thread: the number of a listener the host closed or replaced,
 * while no new one could be made (-1: none lost). */
static int listener_lost = -1;
/* Runtime thread: no listener could be made at start; tried again like a
 * lost one. */
static bool listener_missing;
static pthread_t rt_thread;
/* Posted once by a new runtime thread when it reaches its loop;
 * start_runtime_thread waits for it (why: there). */
static sem_t rt_running;

/* The calling thread holds op_lock through molt__op_lock (an operation
 * runs): only the thread itself reads or writes it. */
static __thread bool op_mine __attribute__((tls_model("initial-exec")));

void molt__op_lock(void) {
  molt__lock_acquire(&op_lock);
  op_mine = true;
}
void molt__op_unlock(void) {
  op_mine = false;
  molt__lock_release(&op_lock);
}
int molt__control_error(void) { return listen_err; }

/* ---- reclamation ----------------------------------------------------------*/

size_t molt__reclaim_locked(void) {
  molt__owner *released = NULL;
  molt__rt_lock_acquire();
  size_t left = molt__gen_reclaim(&released);
  molt__rt_lock_release();
  /* Outside molt__rt_lock: releasing an owner may dlclose it, and an owner
   * that calls reached uncounted waits for the proof that no thread runs
   * it (core/proof.c). */
  left += molt__proof_pass(released);
  /* Entries on whose version every live generation agrees jump straight
   * to it -- not while a proof holds them all on the dispatch path. */
  molt__rt_lock_acquire();
  molt__gen_hold_or_relax();
  molt__rt_lock_release();
  /* A mode's own resources (an old program image whose threads have all
   * moved on, F7: the mode wakes us when the last one does). */
  molt__modes_reclaim();
  return left;
}

/* The runtime loop's pass: reclamation, then what a mode asked for
 * (molt__mode.deferred; through molt__op_lock, as an operation: a
 * shadowed update's retry forks its follower here).  *held: a proof now
 * holds every entry on its dispatch path. */
static size_t reclaim_pass(bool *held) {
  molt__op_lock();
  size_t left = molt__reclaim_locked();
  *held = molt__proof_holds_dispatch();
  molt__modes_deferred();
  molt__op_unlock();
  return left;
}

/* ---- the runtime thread -----------------------------------------------------*/

/* Runtime thread, before every poll: the wake-up read end to poll (-1:
 * none right now) in *wake_fd, and a listener that is ours or none.  A lost
 * listener's name is free once nothing holds the old socket: the poll that
 * noticed the loss held it and has returned.  Returns the ms after which a
 * descriptor that could not be made is tried again (-1: none). */
static int keep_descriptors(int *wake_fd) {
  if (molt__wake_lost() || (listener.fd >= 0 && !molt__fd_ours(&listener))) {
    /* Programs close every descriptor in one go and open their own right
     * after -- often on numbers they choose (dup2 onto 0, 1, 2, 3...).  A
     * new socket starts at the lowest free number before it moves up to
     * the band (fd.c): made in the middle of that, it could take a number
     * the program is about to use, or make its dup2() fail with EBUSY.
     * Waiting a moment lets the program finish.  Nothing is lost meanwhile
     * (a client of the CLI tries again, requests wait), and the runtime
     * thread holds no lock here. */
    struct timespec quiet = {0, QUIET_MS * 1000000L};
    nanosleep(&quiet, NULL);
  }
  int retry = -1;
  if ((*wake_fd = molt__wake_keep()) < 0)
    retry = RETRY_MS;
  bool found_lost = false;
  if (listener.fd >= 0 && !molt__fd_ours(&listener)) {
    /* The number is the host's now: forgotten, never closed. */
    listener_lost = listener.fd;
    molt__fd_forget(&listener);
    found_lost = true;
  }
  if (listener_lost < 0 && !listener_missing)
    return retry;
  int rc = molt__control_listen(&listener, listener_name, sizeof listener_name);
  int pid = (int)getpid();
  if (rc == 0) {
    if (listener_lost >= 0)
      molt__log(MOLT__EV_INFO, molt__gen_number_now(), NULL,
                "%s molt's control socket (fd %d): listening on @%s again (fd %d)",
                found_lost ? "the process closed or replaced" : "after losing",
                listener_lost, listener_name, listener.fd);
    else
      molt__log(MOLT__EV_INFO, molt__gen_number_now(), NULL,
                "control channel: listening on @%s (fd %d)", listener_name, listener.fd);
    listener_lost = -1;
    listener_missing = false;
    listen_err = 0;
    return retry;
  }
  if (found_lost)
    molt__log(MOLT__EV_INFO, molt__gen_number_now(), NULL,
              "the process closed or replaced molt's control socket (fd %d); cannot "
              "listen on @molt.%d again yet (%s): retrying every second",
              listener_lost, pid, molt_strerror(rc));
  listen_err = rc;
  return RETRY_MS;
}

static void *runtime_main(void *arg) {
  (void)arg;
  molt__requests_serve_here();
  molt__wake_serve_here();
  sem_post(&rt_running);
  int interval = -1; /* ms until the next reclamation pass; -1: none pending */
  for (;;) {
    int wake_fd;
    int timeout = keep_descriptors(&wake_fd);
    if (interval >= 0 && (timeout < 0 || interval < timeout))
      timeout = interval;
    if (molt__wake_pending())
      timeout = 0;
    /* The wake-up read end, then the control server's listener and
     * clients.  A negative fd (none right now) is ignored by poll. */
    struct pollfd fds[1 + MOLT__CONTROL_POLLFDS];
    fds[0] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
    molt__control_poll_prepare(&listener, fds + 1, &timeout);
    int n = poll(fds, 1 + MOLT__CONTROL_POLLFDS, timeout);
    if (n < 0 && errno != EINTR) {
      int e = errno;
      molt__requests_stop();
      molt__fail("runtime thread: poll failed: %s", strerror(e));
      return NULL;
    }
    if (molt__wake_drain(n > 0 ? fds[0].revents : 0))
      interval = RECLAIM_MIN_MS;
    /* Requests first: an application thread waits for each.  The control
     * server's clients are not timed for how long they take. */
    uint64_t t0 = molt__now_ns();
    molt__requests_drain();
    molt__control_held(molt__now_ns() - t0, NULL);
    if (n < 0) /* EINTR: nothing is ready, deadlines still count */
      for (size_t i = 0; i < 1 + MOLT__CONTROL_POLLFDS; i++)
        fds[i].revents = 0;
    /* Clients, then new connections (the listener is checked there). */
    molt__control_poll_done(&listener, fds + 1);
    if (interval >= 0) {
      bool held;
      if (reclaim_pass(&held) == 0)
        interval = -1;
      else if (held)
        /* Every updatable call of every thread takes the dispatch path
         * until the proof is complete, and the thread it waits for answers
         * on its next call: the pass that takes the answer comes 1 ms
         * later rather than after a doubled interval, which kept the hold
         * on about as long again as it had lasted when the answer came
         * (issue 14).  The hold ends after its second. */
        interval = RECLAIM_MIN_MS;
      else if ((interval *= 2) > RECLAIM_MAX_MS)
        interval = RECLAIM_MAX_MS; /* a thread still runs old code: back off */
    }
  }
  return NULL;
}

static void start_runtime_thread(void) {
  listen_err = molt__control_listen(&listener, listener_name, sizeof listener_name);
  char primary[sizeof listener_name];
  molt__proto_socket_name(getpid(), NULL, primary, sizeof primary);
  if (listen_err < 0) {
    /* Not fatal, and not for ever: the runtime loop tries again every
     * second (keep_descriptors). */
    listener_missing = true;
    molt__log(MOLT__EV_INFO, 0, NULL, "no control channel: %s; trying again every second",
              molt_strerror(listen_err));
  } else if (strcmp(listener_name, primary) != 0) {
    molt__log(MOLT__EV_INFO, 0, NULL,
              "another socket holds the name @%s (any local user can bind it): "
              "listening on @%s instead; molt finds it",
              primary, listener_name);
  }
  /* The runtime thread blocks every signal: signals sent to the process
   * must reach the application's threads, never ours. */
  sigset_t old;
  molt__block_async_signals(&old);
  molt__requests_open(); /* requests wait for the thread from now on */
  sem_init(&rt_running, 0, 0);
  bool started = pthread_create(&rt_thread, NULL, runtime_main, NULL) == 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (started) {
    pthread_setname_np(rt_thread, "molt-runtime");
    /* Start-up ends when the thread runs its loop, not when it is merely
     * created: a thread's first steps (the C library's and a sanitizer's
     * per-thread set-up) allocate, and a fork() by the host right after
     * start-up would copy the allocator's lock held by a thread the child
     * does not have.  glibc's malloc is locked around fork(); gcc 12's
     * AddressSanitizer allocator is not, and its child hung in its first
     * malloc (runtime_fds under ASan, about 1 run in 400 on a loaded
     * machine).  Waiting costs start-up one thread start. */
    while (sem_wait(&rt_running) != 0 && errno == EINTR)
      ;
  } else {
    molt__requests_stop();
    molt__fail("cannot start the runtime thread");
  }
}

/* ---- fork ----------------------------------------------------------------------*/

static void fork_prepare(void) {
  /* First, holding nothing: a barrier participant counts as waiting from
   * here on (switch/points.c).  A global update holds op_lock while it
   * waits for its participants; without this, a participant that calls
   * fork() would wait below for op_lock, the update for it, until the
   * update's timeout. */
  molt__point_fork_begin();
  /* Every lock of the lock table (base.h), in its order: shadow data's
   * (every shard, then its reclaim lock), op, bar, the modes' (prog), rt,
   * the registry (reg), req, log, fd.  No thread is then inside any of
   * them while fork() copies the process, and the child makes each anew.
   * (bar: a barrier holds op_lock throughout, so none is running once we
   * hold op; application threads hold bar only briefly.)
   *
   * An operation that forks -- a shadowed update forks its follower from
   * the runtime thread, inside its barrier step -- already holds op_lock:
   * it is not taken again, and neither are shadow data's locks, which
   * rank before it.  That fork happens only in a process running a program
   * image, which takes no hot patches and so keeps no shadow data, with
   * every program thread parked. */
  if (!op_mine) {
    molt__shadow_fork_prepare();
    molt__lock_acquire(&op_lock);
  }
  molt__switch_fork_prepare();
  molt__modes_fork_prepare();
  molt__rt_lock_acquire();
  molt__threads_lock();
  molt__requests_fork_prepare();
  /* The leaves last (the table's order): no thread is half-way through a
   * log entry, or between checking a descriptor and writing to it, while
   * fork() copies the process. */
  molt__log_fork_prepare();
  molt__fd_lock();
}

static void fork_parent(void) {
  molt__fd_unlock();
  molt__log_fork_parent();
  molt__requests_fork_parent();
  molt__threads_unlock();
  molt__rt_lock_release();
  molt__modes_fork_parent();
  molt__switch_fork_parent();
  if (!op_mine) {
    molt__lock_release(&op_lock);
    molt__shadow_fork_parent();
  }
  /* Back to program code: like passing an update point (a barrier that
   * started meanwhile holds this thread until it ends). */
  molt__point_fork_end();
}

static void start_in_child(void);

/* The child has one thread and copies of locked mutexes: reinitialize, and
 * give it its own runtime thread and control socket (named by its pid). */
static void fork_child(void) {
  /* The leaves first (held across fork()): anything below may log or keep
   * a descriptor. */
  molt__fd_after_fork_child();
  molt__log_after_fork_child();
  molt__threads_after_fork_child();
  molt__proof_after_fork_child();
  molt__switch_after_fork_child();
  molt__modes_fork_child();
  molt__requests_after_fork_child();
  molt__rt_lock_after_fork_child();
  /* A forking operation's thread (a shadowed update's follower) never
   * returns into the operation: it does not release op_lock.  Shadow
   * data's locks were not taken for that fork (fork_prepare). */
  bool forked_by_op = op_mine;
  op_mine = false;
  molt__lock_reinit(&op_lock);
  if (!forked_by_op)
    molt__shadow_fork_child();
  /* The parent's listener, unless the host closed it before fork() (then
   * the number is the host's: left alone). */
  molt__fd_close(&listener);
  molt__control_after_fork_child();
  listener_lost = -1;
  listener_missing = false;
  listen_err = 0;
  molt__wake_after_fork_child();
  /* No thread is started here: most children exec at once, and a thread
   * per fork() would tax every system() and popen().  The forking thread's
   * next updatable call takes the registration slow path, which starts the
   * child's runtime thread and control channel (molt__start_if_needed). */
  molt__start_arm(start_in_child);
  molt__self.viewp = NULL;
}

static void start_in_child(void) {
  molt__lock_acquire(&op_lock);
  if (molt__start_armed()) {
    molt__log(MOLT__EV_START, molt__gen_number_now(), NULL,
              "runtime started in pid %d, a child of a molt process", (int)getpid());
    start_runtime_thread();
    molt__start_disarm();
  }
  molt__lock_release(&op_lock);
}

/* ---- start-up ---------------------------------------------------------------------*/

/* Priority 102: after the modes registered themselves (101), before any
 * constructor of the program (the executable's run after libmolt's). */
__attribute__((constructor(102))) static void runtime_init(void) {
  molt__log_init();
  molt__threads_init();
  molt__gen_init();
  molt__proof_init();
  molt__switch_init();
  (void)molt__wake_init(); /* failing puts the runtime into the refusing state */
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  molt__log(MOLT__EV_START, 0, NULL, "molt %s runtime started in pid %d%s",
            MOLT_VERSION_STRING, (int)getpid(),
            molt__gen_reclaim_enabled()
                ? ""
                : " (membarrier unavailable: old versions are never unloaded)");
  start_runtime_thread();
}
