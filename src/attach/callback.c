/* The patch's pre- and post-update callbacks (issue 13 item 5), run inside
 * the target, which has no runtime to run them: on one of its own threads,
 * borrowed at a safe point.
 *
 * The same declaration as a hot patch's (molt.h MOLT_PATCH_PRE/POST: a
 * hidden wrapper `int w(void)` and a `.note.molt.callback` note; moltcc
 * --molt-attach --molt-callbacks FILE.c), read by common/elf.c.
 *
 * The thread: one stopped inside a system call (blocked in read, accept,
 * epoll_wait...), so it is between two statements of the program, not
 * half way through one of its own critical sections' instructions --
 * though it may hold a lock, which a callback that needs it waits for
 * until the timeout.  A thread whose call the kernel restarts through its
 * restart block (nanosleep) is taken only if no other will do: a callback
 * interrupted at its timeout inside a sleep of its own would overwrite it.
 *
 * The borrowing, all while only that thread is stopped:
 *   1. its signal mask: every asynchronous signal blocked (rt_sigprocmask
 *      run on the thread, its old mask kept), so no handler of the program
 *      runs on the borrowed frame; the synchronous ones (SIGSEGV, SIGBUS,
 *      SIGILL, SIGFPE, SIGTRAP, SIGSYS) stay open, as they report a crash
 *      of the callback and its return;
 *   2. a call frame below the red zone, aligned, whose return address is
 *      the state page of the patch's staged mapping: readable, not
 *      executable, so the callback's `ret` faults exactly there, and
 *      molt, its tracer, sees the fault before the program could
 *      (os_linux.c molt__os_run_until) and delivers nothing;
 *   3. run with a deadline; a callback that crashes or does not return in
 *      time is stopped where it is and abandoned (what it did so far
 *      stays, a lock it took stays taken);
 *   4. its old signal mask, then its registers exactly as they were at the
 *      stop (its interrupted system call restarted as the stop alone would
 *      restart it: no EINTR), and it is let go.
 * molt holds back SIGINT, SIGTERM, SIGHUP and SIGQUIT meanwhile (as for
 * its whole run: interrupt.c); a SIGKILL
 * of molt while a callback runs kills the target when the callback
 * returns into the trap with no tracer (design §16, killed half way). */
#include "attach/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ERESTART_RESTARTBLOCK 516 /* the kernel's, not in the user headers */

/* The signal mask the callback runs with: all but the synchronous signals
 * (the kernel's sigset_t: one bit per signal, signal n at bit n - 1). */
static uint64_t callback_mask(void) {
  uint64_t open = 0;
  const int sync[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS};
  for (size_t i = 0; i < sizeof sync / sizeof sync[0]; i++)
    open |= 1ull << (sync[i] - 1);
  return ~open;
}

/* Whether the process ignores SIGSEGV: then the fault of the callback's
 * return would make the kernel reset that to the default action. */
static bool ignores_segv(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f)
    return false;
  unsigned long long ign = 0;
  while (fgets(line, sizeof line, f))
    sscanf(line, "SigIgn: %llx", &ign);
  fclose(f);
  return (ign >> (SIGSEGV - 1)) & 1;
}

/* The system call thread tid is blocked in (/proc/PID/task/TID/syscall),
 * or -1 (running, or not in one). */
static long blocked_in(pid_t pid, pid_t tid) {
  char path[96], buf[64] = "";
  snprintf(path, sizeof path, "/proc/%d/task/%d/syscall", (int)pid, (int)tid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  buf[n > 0 ? n : 0] = '\0';
  char *end;
  long nr = strtol(buf, &end, 10);
  return end != buf && nr >= 0 ? nr : -1;
}

/* One look for a thread of pid that is inside a system call: the main
 * thread first, then the others, those restarted through the restart
 * block last.  0 with s holding it stopped, MOLT_ENOENT, or MOLT_EBUSY
 * (none is). */
static int borrow_once(pid_t pid, attach_stop *s, char *err, size_t errlen) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  for (int pass = 0; pass < 2; pass++) {
    DIR *d = opendir(path);
    if (!d) {
      molt__errmsg(err, errlen, "no process %d", (int)pid);
      return MOLT_ENOENT;
    }
    pid_t tids[256];
    size_t n = 0;
    tids[n++] = pid;
    struct dirent *e;
    while ((e = readdir(d)) && n < sizeof tids / sizeof tids[0]) {
      pid_t tid = (pid_t)atoi(e->d_name);
      if (tid > 0 && tid != pid)
        tids[n++] = tid;
    }
    closedir(d);
    for (size_t i = 0; i < n; i++) {
      if (blocked_in(pid, tids[i]) < 0)
        continue;
      char ignored[256];
      if (molt__os_stop_one(pid, tids[i], s, ignored, sizeof ignored) != 0)
        continue;
      const attach_regs *r = &s->t[0].regs;
      bool in_call = molt__arch_syscall_nr(r) >= 0;
      bool restart_block = molt__arch_syscall_ret(r) == -ERESTART_RESTARTBLOCK;
      if (in_call && (pass == 1 || !restart_block))
        return 0;
      molt__os_resume_all(s);
    }
  }
  return MOLT_EBUSY;
}

/* Stops a thread of pid that is inside a system call (borrow_once).  Right
 * after a stop -- the post-update callback runs just after the jumps --
 * every thread is re-entering its call and may not be asleep yet, and on
 * a loaded machine one may stay runnable for a while: look again, backing
 * off, until timeout_ms.  0 with s holding it stopped, or an error. */
static int borrow_thread(pid_t pid, int timeout_ms, attach_stop *s, char *err,
                         size_t errlen) {
  uint64_t deadline = molt__os_now_ns() + (uint64_t)timeout_ms * 1000000u;
  long backoff_us = 200;
  int rc;
  while ((rc = borrow_once(pid, s, err, errlen)) == MOLT_EBUSY &&
         molt__os_now_ns() < deadline) {
    struct timespec ts = {0, backoff_us * 1000};
    nanosleep(&ts, NULL);
    if (backoff_us < 50000)
      backoff_us *= 2;
  }
  if (rc != MOLT_EBUSY)
    return rc;
  molt__errmsg(err, errlen,
               "no thread of process %d was blocked in a system call to run the "
               "callback on within %.1f s (every thread is busy); try again",
               (int)pid, timeout_ms / 1000.0);
  return MOLT_EBUSY;
}

/* rt_sigprocmask(SIG_SETMASK, *set, old) on the borrowed thread, through
 * the word at `scratch` of its stack. */
static int set_mask(attach_thread *t, pid_t pid, uint64_t insn, uint64_t scratch,
                    uint64_t set, uint64_t *old, char *err, size_t errlen) {
  int rc = molt__os_write(pid, scratch, &set, sizeof set);
  if (rc) {
    molt__errmsg(err, errlen, "cannot write into the stack of thread %d", (int)t->tid);
    return rc;
  }
  const uint64_t args[6] = {SIG_SETMASK, scratch, old ? scratch + 8 : 0, 8, 0, 0};
  long ret = 0;
  rc = molt__os_syscall(t, insn, SYS_rt_sigprocmask, args, &ret, err, errlen);
  if (rc == 0 && ret != 0) {
    molt__errmsg(err, errlen, "rt_sigprocmask in thread %d failed: %s", (int)t->tid,
                 strerror((int)-ret));
    rc = MOLT_EIO;
  }
  if (rc == 0 && old)
    rc = molt__os_read(pid, scratch + 8, old, sizeof *old);
  return rc;
}

int molt__callback_run(pid_t pid, uint64_t fn, uint64_t trap, int timeout_ms, int *result,
                       double *ms, char *err, size_t errlen) {
  if (ignores_segv(pid)) {
    molt__errmsg(err, errlen,
                 "process %d ignores SIGSEGV, which molt needs to see the callback "
                 "return; its callbacks cannot run",
                 (int)pid);
    return MOLT_ENOTSUP;
  }
  attach_map *maps = NULL;
  size_t nmaps = 0;
  uint64_t insn = 0;
  int rc = molt__os_maps(pid, &maps, &nmaps);
  if (rc == 0)
    rc = molt__os_find_syscall(pid, maps, nmaps, &insn, err, errlen);
  free(maps);
  if (rc)
    return rc;
  /* Killed while the callback runs, molt would leave the thread to return
   * into the trap with no tracer to catch the fault: the process would die
   * of it.  SIGKILL cannot be held back; the signals of an operator or a
   * service manager (Ctrl-C, SIGTERM...) are: molt__attach blocks them for
   * its whole run (interrupt.c) and takes them only at its safe points,
   * none of which is inside a callback. */
  attach_stop s;
  rc = borrow_thread(pid, timeout_ms, &s, err, errlen);
  if (rc)
    return rc;
  attach_thread *t = &s.t[0];
  uint64_t t0 = molt__os_now_ns();
  /* scratch words for the masks: below the red zone, above the frame */
  uint64_t scratch = (molt__arch_sp(&t->regs) - 128 - 64) & ~(uint64_t)15;
  uint64_t old_mask = 0;
  rc = set_mask(t, pid, insn, scratch, callback_mask(), &old_mask, err, errlen);
  if (rc == 0) {
    attach_regs call = t->regs, out;
    uint64_t ret_slot = molt__arch_prepare_call(&call, fn, scratch - 64);
    rc = molt__os_write(pid, ret_slot, &trap, sizeof trap);
    int sig = 0;
    if (rc == 0)
      rc = molt__os_run_until(t, &call, trap, timeout_ms, &out, &sig, err, errlen);
    if (rc == 0) {
      *result = molt__arch_call_result(&out);
    } else if (rc == 1) {
      molt__errmsg(err, errlen, "crashed (signal %d at %#llx) on thread %d", sig,
                   (unsigned long long)molt__arch_ip(&out), (int)t->tid);
      rc = MOLT_ECALLBACK;
    } else if (rc == 2) {
      molt__errmsg(err, errlen,
                   "did not return within %.1f s; stopped and abandoned on thread %d "
                   "(what it did so far stays)",
                   timeout_ms / 1000.0, (int)t->tid);
      rc = MOLT_ECALLBACK;
    }
    /* Its own mask and registers back, whatever happened (the process
     * gone aside). */
    char e2[128];
    if (rc != MOLT_ENOENT &&
        set_mask(t, pid, insn, scratch, old_mask, NULL, e2, sizeof e2) != 0 && rc == 0) {
      molt__errmsg(err, errlen, "%s", e2);
      rc = MOLT_EIO;
    }
  }
  /* molt__os_syscall put t->regs back; resume_all writes them again if
   * the stop changed them (a call re-entered) and lets the thread go. */
  t->regs_changed = true;
  molt__os_resume_all(&s);
  *ms = (double)(molt__os_now_ns() - t0) / 1e6;
  return rc;
}

int molt__callbacks_read(const char *path, molt__patch_callbacks *cbs, char *err,
                         size_t errlen) {
  memset(cbs, 0, sizeof *cbs);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    molt__errmsg(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return molt__from_errno(errno);
  }
  char why[256];
  int rc = molt__elf_read_callbacks(fd, cbs, why, sizeof why);
  close(fd);
  if (rc)
    molt__errmsg(err, errlen, "%s: %s", path, why);
  return rc;
}

/* Runs callback cb of the patch staged at base (st); appends what it did
 * to st->callbacks.  0 (returned 0), or MOLT_ECALLBACK with err saying
 * what it did instead, or another MOLT_E* code. */
static int run_one(pid_t pid, molt__attach_state *st, const molt__patch_callback *cb,
                   const char *what, uint64_t base, int timeout_ms, char *err,
                   size_t errlen) {
  if (timeout_ms <= 0)
    timeout_ms = MOLT__DEFAULT_CALLBACK_TIMEOUT_MS;
  int result = 0;
  double ms = 0;
  char why[300] = "";
  int rc = molt__callback_run(pid, base + cb->vaddr, ATTACH_STATE_PAGE(st), timeout_ms,
                              &result, &ms, why, sizeof why);
  size_t used = strlen(st->callbacks);
  const char *sep = used ? "; " : "";
  if (rc == 0 && result == 0) {
    snprintf(st->callbacks + used, sizeof st->callbacks - used, "%s%s %s: 0 in %.1f ms",
             sep, what, cb->name, ms);
    return 0;
  }
  if (rc == 0) {
    snprintf(st->callbacks + used, sizeof st->callbacks - used, "%s%s %s: returned %d",
             sep, what, cb->name, result);
    molt__errmsg(err, errlen, "%s-update callback %s of %s returned %d", what, cb->name,
                 st->patch, result);
    return MOLT_ECALLBACK;
  }
  snprintf(st->callbacks + used, sizeof st->callbacks - used, "%s%s %s: failed", sep,
           what, cb->name);
  molt__errmsg(err, errlen, "%s-update callback %s of %s %s", what, cb->name, st->patch,
               why);
  return rc == MOLT_ECALLBACK ? rc : MOLT_ECALLBACK;
}

int molt__callbacks_pre(pid_t pid, molt__attach_state *st,
                        const molt__patch_callbacks *cbs, uint64_t base, int timeout_ms,
                        char *err, size_t errlen) {
  if (!cbs->pre.present)
    return 0;
  return run_one(pid, st, &cbs->pre, "pre", base, timeout_ms, err, errlen);
}

void molt__callbacks_post(pid_t pid, molt__attach_state *st,
                          const molt__patch_callbacks *cbs, uint64_t base,
                          int timeout_ms) {
  if (!cbs->post.present)
    return;
  char why[400];
  if (run_one(pid, st, &cbs->post, "post", base, timeout_ms, why, sizeof why) != 0)
    snprintf(st->note, sizeof st->note, "%.200s (the patch stays applied)", why);
}
