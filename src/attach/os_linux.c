/* The OS axis of attach, Linux: /proc (threads, maps, memory, start
 * time), ptrace (seize and interrupt every thread; one system call run on
 * a stopped thread) and the fix-ups that keep a stop invisible to the
 * program.
 *
 * PTRACE_SEIZE + PTRACE_INTERRUPT, unlike PTRACE_ATTACH, sends no SIGSTOP:
 * a thread blocked in a system call leaves it with -ERESTART* and the
 * kernel restarts the call when the thread resumes (nanosleep and futex
 * with the time that was left).  The few calls that end with EINTR on any
 * stop (epoll_wait and its siblings, sigtimedwait, semtimedop, io_getevents
 * and io_pgetevents) are entered
 * again by putting the ip back on their `syscall` instruction, unless a
 * real signal is pending (then the EINTR is the program's). */
#include "attach/internal.h"

#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

uint64_t molt__os_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- /proc ------------------------------------------------------------------- */

/* "/proc/PID/task/TID/<what>" for a thread of pid that is alive: the
 * per-process files of a process whose main thread has exited
 * (pthread_exit; a zombie) are empty or refuse to open, those of its
 * other threads are the process's (memory, maps, exe, descriptors). */
void molt__os_path(pid_t pid, const char *what, char *buf, size_t len) {
  static pid_t cached_pid;
  static pid_t cached_tid;
  char path[96];
  pid_t tid = pid;
  snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)pid, (int)pid);
  if (cached_pid == pid) {
    tid = cached_tid;
  } else {
    char stat[512] = "";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ssize_t n = read(fd, stat, sizeof stat - 1);
      stat[n > 0 ? n : 0] = '\0';
      close(fd);
    }
    const char *p = strrchr(stat, ')');
    if (p && p[1] == ' ' && p[2] == 'Z') {
      snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
      DIR *d = opendir(path);
      struct dirent *e;
      while (d && (e = readdir(d))) {
        pid_t t = (pid_t)atoi(e->d_name);
        if (t > 0 && t != pid) {
          tid = t;
          break;
        }
      }
      if (d)
        closedir(d);
      /* the thread found may end too: look again next time */
    } else {
      cached_pid = pid;
      cached_tid = pid;
    }
  }
  snprintf(buf, len, "/proc/%d/task/%d/%s", (int)pid, (int)tid, what);
}

unsigned long long molt__os_start_time(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return 0;
  buf[n] = '\0';
  /* The name may hold spaces and parentheses: fields count from the last ')'. */
  char *p = strrchr(buf, ')');
  if (!p)
    return 0;
  p++;
  /* p is at the space before field 3 (the state); field 22 is the start
   * time */
  for (int field = 3; field < 22 && p; field++)
    p = strchr(p + 1, ' ');
  return p ? strtoull(p + 1, NULL, 10) : 0;
}

int molt__os_maps(pid_t pid, attach_map **out, size_t *n) {
  char path[64];
  molt__os_path(pid, "maps", path, sizeof path);
  FILE *f = fopen(path, "re");
  if (!f)
    return errno == ENOENT ? MOLT_ENOENT : molt__from_errno(errno);
  attach_map *m = NULL;
  size_t cnt = 0, cap = 0;
  char line[1024];
  int rc = 0;
  while (fgets(line, sizeof line, f)) {
    if (cnt == cap) {
      cap = cap ? cap * 2 : 64;
      attach_map *nm = realloc(m, cap * sizeof *m);
      if (!nm) {
        rc = MOLT_ENOMEM;
        break;
      }
      m = nm;
    }
    attach_map *e = &m[cnt];
    char perms[8] = "";
    unsigned long long s, en, off;
    int pos = 0;
    if (sscanf(line, "%llx-%llx %7s %llx %*s %*s%n", &s, &en, perms, &off, &pos) < 4)
      continue;
    e->start = s;
    e->end = en;
    e->offset = off;
    e->r = perms[0] == 'r';
    e->w = perms[1] == 'w';
    e->x = perms[2] == 'x';
    e->shared = perms[3] == 's';
    const char *p = line + pos;
    while (*p == ' ')
      p++;
    snprintf(e->path, sizeof e->path, "%s", p);
    e->path[strcspn(e->path, "\n")] = '\0';
    cnt++;
  }
  fclose(f);
  if (rc) {
    free(m);
    return rc;
  }
  *out = m;
  *n = cnt;
  return 0;
}

bool molt__os_bias_of(const char *path, const attach_map *maps, size_t n,
                      uint64_t *bias) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  Elf64_Ehdr eh;
  bool ok = pread(fd, &eh, sizeof eh, 0) == (ssize_t)sizeof eh &&
            memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
            eh.e_phentsize == sizeof(Elf64_Phdr);
  uint64_t first = 0;
  bool found = false;
  for (unsigned i = 0; ok && i < eh.e_phnum && !found; i++) {
    Elf64_Phdr ph;
    if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + i * sizeof ph)) !=
        (ssize_t)sizeof ph)
      ok = false;
    else if (ph.p_type == PT_LOAD) {
      first = ph.p_vaddr & ~(uint64_t)(ATTACH_PAGE - 1);
      found = true;
    }
  }
  close(fd);
  if (!ok || !found)
    return false;
  for (size_t i = 0; i < n; i++) {
    if (maps[i].offset == 0 && strcmp(maps[i].path, path) == 0) {
      *bias = maps[i].start - first;
      return true;
    }
  }
  return false;
}

int molt__os_exe(pid_t pid, const attach_map *maps, size_t n, char *path, size_t pathlen,
                 uint64_t *bias, char *err, size_t errlen) {
  char link[64];
  molt__os_path(pid, "exe", link, sizeof link);
  ssize_t k = readlink(link, path, pathlen - 1);
  if (k < 0) {
    molt__errmsg(err, errlen, "cannot read %s: %s", link, strerror(errno));
    return errno == ENOENT ? MOLT_ENOENT : MOLT_EPERM;
  }
  path[k] = '\0';
  /* The file may have been replaced or deleted since: its mapping still
   * has the old inode; /proc/PID/exe opens that one.  The maps name the
   * path as it was. */
  char mapped[600];
  snprintf(mapped, sizeof mapped, "%s", path);
  int fd = open(link, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    molt__errmsg(err, errlen, "cannot open %s: %s", link, strerror(errno));
    return MOLT_EPERM;
  }
  close(fd);
  for (size_t i = 0; i < n; i++) {
    if (maps[i].offset == 0 && strcmp(maps[i].path, mapped) == 0) {
      /* the program headers of the file behind /proc/PID/exe */
      attach_map one = maps[i];
      snprintf(one.path, sizeof one.path, "%s", link);
      if (molt__os_bias_of(link, &one, 1, bias))
        return 0;
    }
  }
  molt__errmsg(err, errlen, "cannot find where %s is loaded in process %d", path,
               (int)pid);
  return MOLT_EIO;
}

int molt__os_read(pid_t pid, uint64_t addr, void *buf, size_t n) {
  char path[64];
  molt__os_path(pid, "mem", path, sizeof path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? MOLT_ENOENT : molt__from_errno(errno);
  ssize_t k = pread(fd, buf, n, (off_t)addr);
  close(fd);
  return k == (ssize_t)n ? 0 : MOLT_EIO;
}

int molt__os_write(pid_t pid, uint64_t addr, const void *buf, size_t n) {
  char path[64];
  molt__os_path(pid, "mem", path, sizeof path);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? MOLT_ENOENT : molt__from_errno(errno);
  /* One write: the kernel copies the bytes with the tracee stopped (the
   * callers stop every thread first); text pages are written through
   * FOLL_FORCE, as a debugger sets a breakpoint. */
  ssize_t k = pwrite(fd, buf, n, (off_t)addr);
  close(fd);
  return k == (ssize_t)n ? 0 : MOLT_EIO;
}

int molt__os_find_syscall(pid_t pid, const attach_map *maps, size_t n, uint64_t *insn,
                          char *err, size_t errlen) {
  /* The vdso first (its fallback paths enter the kernel), then libc's text:
   * both are executable and stay mapped for the life of the process. */
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < n; i++) {
      const attach_map *m = &maps[i];
      if (!m->x || !m->r)
        continue;
      if (pass == 0 ? strcmp(m->path, "[vdso]") != 0 : !strstr(m->path, "/libc."))
        continue;
      size_t len = m->end - m->start;
      if (len > (64u << 20))
        len = 64u << 20;
      uint8_t *buf = malloc(len);
      if (!buf)
        return MOLT_ENOMEM;
      if (molt__os_read(pid, m->start, buf, len) == 0) {
        for (size_t k = 0; k + ATTACH_SYSCALL_LEN <= len; k++) {
          if (molt__arch_is_syscall(buf + k)) {
            *insn = m->start + k;
            free(buf);
            return 0;
          }
        }
      }
      free(buf);
    }
  }
  molt__errmsg(err, errlen,
               "found no system call instruction in process %d (no vdso, no libc)",
               (int)pid);
  return MOLT_ENOTSUP;
}

/* Why ptrace refused: Yama's setting, else the usual reason. */
static void ptrace_refused(pid_t pid, int e, char *err, size_t errlen) {
  int scope = -1;
  FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
  if (f) {
    if (fscanf(f, "%d", &scope) != 1)
      scope = -1;
    fclose(f);
  }
  if (scope >= 1)
    molt__errmsg(err, errlen,
                 "ptrace of process %d refused (%s): kernel.yama.ptrace_scope is %d; "
                 "run molt as root%s",
                 (int)pid, strerror(e), scope,
                 scope == 3 ? " after setting it to 1 or 0 (3 forbids ptrace until "
                              "reboot)"
                            : " or with CAP_SYS_PTRACE");
  else
    molt__errmsg(err, errlen,
                 "ptrace of process %d refused (%s): only its owner and root may "
                 "attach, and not while another debugger traces it",
                 (int)pid, strerror(e));
}

int molt__os_check_traceable(pid_t pid, char *err, size_t errlen) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d", (int)pid);
  if (access(path, F_OK) != 0) {
    molt__errmsg(err, errlen, "no process %d", (int)pid);
    return MOLT_ENOENT;
  }
  if (pid == getpid()) {
    molt__errmsg(err, errlen, "process %d is molt itself", (int)pid);
    return MOLT_EINVAL;
  }
  /* Opening its memory takes the permission ptrace takes (the uid, the
   * capabilities, Yama): a refusal is told here, before anything else. */
  molt__os_path(pid, "mem", path, sizeof path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT || e == ESRCH) {
      molt__errmsg(err, errlen, "no process %d", (int)pid);
      return MOLT_ENOENT;
    }
    ptrace_refused(pid, e, err, errlen);
    return MOLT_EPERM;
  }
  close(fd);
  return 0;
}

/* ---- stopping threads ----------------------------------------------------------- */

static attach_thread *find_thread(attach_stop *s, pid_t tid) {
  for (size_t i = 0; i < s->n; i++)
    if (s->t[i].tid == tid)
      return &s->t[i];
  return NULL;
}

static attach_thread *add_thread(attach_stop *s, pid_t tid) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 16;
    attach_thread *t = realloc(s->t, cap * sizeof *t);
    if (!t)
      return NULL;
    s->t = t;
    s->cap = cap;
  }
  attach_thread *t = &s->t[s->n++];
  memset(t, 0, sizeof *t);
  t->tid = tid;
  return t;
}

static void drop_thread(attach_stop *s, attach_thread *t) { *t = s->t[--s->n]; }

/* The signals pending for thread tid (its own and the process's), not
 * blocked by it. */
static bool signal_pending(pid_t pid, pid_t tid) {
  char path[96], line[256];
  snprintf(path, sizeof path, "/proc/%d/task/%d/status", (int)pid, (int)tid);
  FILE *f = fopen(path, "re");
  if (!f)
    return false;
  unsigned long long pnd = 0, shd = 0, blk = 0;
  while (fgets(line, sizeof line, f)) {
    sscanf(line, "SigPnd: %llx", &pnd);
    sscanf(line, "ShdPnd: %llx", &shd);
    sscanf(line, "SigBlk: %llx", &blk);
  }
  fclose(f);
  return ((pnd | shd) & ~blk) != 0;
}

static bool eintr_on_stop(long nr) {
  switch (nr) {
  case SYS_epoll_wait:
  case SYS_epoll_pwait:
#ifdef SYS_epoll_pwait2
  case SYS_epoll_pwait2:
#endif
  case SYS_rt_sigtimedwait:
  case SYS_semtimedop:
  case SYS_io_getevents: /* read_events() ends with EINTR on any stop */
#ifdef SYS_io_pgetevents
  case SYS_io_pgetevents:
#endif
    return true;
  default:
    return false;
  }
}

/* Thread tid's tracer and state letter (/proc/PID/task/TID/status);
 * false if it is gone. */
static bool thread_status(pid_t pid, pid_t tid, int *tracer, char *state) {
  char path[96], line[256];
  snprintf(path, sizeof path, "/proc/%d/task/%d/status", (int)pid, (int)tid);
  FILE *f = fopen(path, "re");
  if (!f)
    return false;
  *tracer = -1;
  *state = '?';
  while (fgets(line, sizeof line, f)) {
    sscanf(line, "State: %c", state);
    sscanf(line, "TracerPid: %d", tracer);
  }
  fclose(f);
  return true;
}

static bool asleep_in_kernel(pid_t pid, pid_t tid) {
  int tracer;
  char state = '?';
  return thread_status(pid, tid, &tracer, &state) && state == 'D';
}

/* A thread whose call the stop ended with EINTR enters it again. */
static void keep_call(attach_stop *s, attach_thread *t) {
  long nr = molt__arch_syscall_nr(&t->regs);
  if (nr < 0 || molt__arch_syscall_ret(&t->regs) != -EINTR || !eintr_on_stop(nr) ||
      t->sig != 0)
    return;
  uint8_t insn[ATTACH_SYSCALL_LEN];
  uint64_t ip = molt__arch_ip(&t->regs);
  if (molt__os_read(s->pid, ip - ATTACH_SYSCALL_LEN, insn, sizeof insn) != 0 ||
      !molt__arch_is_syscall(insn) || signal_pending(s->pid, t->tid))
    return;
  molt__arch_restart_syscall(&t->regs, nr);
  t->regs_changed = true;
}

/* How long one stop waits for a thread to stop.  A thread in an
 * uninterruptible sleep (D: a disk or NFS wait, vfork) stops only when it
 * wakes, and every thread stopped before it waits with it: past
 * STOP_WAIT_MS, a thread in that state makes the stop give up and release
 * every thread (the caller may try again).  Any other thread is on its
 * way to the stop (runnable, waiting for a CPU on a loaded machine): it is
 * waited for up to STOP_WAIT_MAX_MS. */
#define STOP_WAIT_MS 200
#define STOP_WAIT_MAX_MS 2000

/* Whether thread tid is in an uninterruptible sleep. */
static bool asleep_in_kernel(pid_t pid, pid_t tid);

/* Why thread tid has not stopped: its state and where it sleeps. */
static void not_stopping(pid_t pid, pid_t tid, char *err, size_t errlen) {
  char path[96], wchan[64] = "", comm[64];
  snprintf(path, sizeof path, "/proc/%d/task/%d/wchan", (int)pid, (int)tid);
  FILE *f = fopen(path, "re");
  if (f) {
    if (!fgets(wchan, sizeof wchan, f))
      wchan[0] = '\0';
    fclose(f);
  }
  int tracer;
  char state = '?';
  thread_status(pid, tid, &tracer, &state);
  molt__proc_name(pid, tid, comm, sizeof comm);
  bool where = wchan[0] && strcmp(wchan, "0") != 0;
  molt__errmsg(err, errlen, "thread %d (%s) did not stop within %d ms (state %c%s%s%s)",
               (int)tid, comm, state == 'D' ? STOP_WAIT_MS : STOP_WAIT_MAX_MS, state,
               state == 'D' ? ": uninterruptible sleep" : "", where ? " in " : "",
               where ? wchan : "");
}

/* Waits for thread t's stop until deadline_ns.  0 stopped (regs read), 1
 * the thread is gone, 2 not stopped by the deadline, or a MOLT_E* code. */
static int wait_stop(attach_stop *s, attach_thread *t, uint64_t deadline_ns, char *err,
                     size_t errlen) {
  long nap_ns = 10000;
  for (;;) {
    int st;
    pid_t r = waitpid(t->tid, &st, __WALL | WNOHANG);
    if (r < 0 && errno == EINTR)
      continue;
    if (r == 0) {
      uint64_t now = molt__os_now_ns();
      if (now >= deadline_ns &&
          (asleep_in_kernel(s->pid, t->tid) ||
           now >= deadline_ns + (uint64_t)(STOP_WAIT_MAX_MS - STOP_WAIT_MS) * 1000000u))
        return 2;
      /* most threads have stopped by the time they are waited for: the
       * naps grow only for one that has not */
      struct timespec ts = {0, nap_ns};
      nanosleep(&ts, NULL);
      if (nap_ns < 500000)
        nap_ns *= 2;
      continue;
    }
    if (r < 0)
      return 1; /* ECHILD: it exited and was reaped */
    if (WIFEXITED(st) || WIFSIGNALED(st))
      return 1;
    if (!WIFSTOPPED(st))
      continue;
    int event = st >> 16, sig = WSTOPSIG(st);
    if (event == PTRACE_EVENT_CLONE) {
      unsigned long child = 0;
      /* The new thread is traced already (PTRACE_O_TRACECLONE) and will
       * report its own stop: wait for it like the others. */
      if (ptrace(PTRACE_GETEVENTMSG, t->tid, 0, &child) == 0 && child &&
          !find_thread(s, (pid_t)child)) {
        attach_thread *c = add_thread(s, (pid_t)child);
        if (!c)
          return MOLT_ENOMEM;
        c->sig = -1;           /* seized by the kernel, not yet seen stopped */
        t = find_thread(s, r); /* add_thread may move the array */
      }
      /* Stopped inside clone(): its registers are not the thread's own yet
       * (the kernel writes clone's result into rax when it goes on), so
       * running a system call on it, or restoring them later, would change
       * what clone returns to the program.  Let it finish the call and
       * stop it again, at the interrupt stop every other thread gives. */
      if (ptrace(PTRACE_CONT, t->tid, 0, 0) != 0 ||
          ptrace(PTRACE_INTERRUPT, t->tid, 0, 0) != 0) {
        if (errno == ESRCH)
          return 1;
        molt__errmsg(err, errlen, "cannot let thread %d finish creating a thread: %s",
                     (int)t->tid, strerror(errno));
        return MOLT_EIO;
      }
      continue;
    } else if (event == 0) {
      /* A signal-delivery stop: the signal reaches the thread on resume. */
      t->sig = sig;
    }
    if (ptrace(PTRACE_GETREGS, t->tid, 0, &t->regs) != 0) {
      if (errno == ESRCH)
        return 1;
      molt__errmsg(err, errlen, "cannot read the registers of thread %d: %s", (int)t->tid,
                   strerror(errno));
      return MOLT_EIO;
    }
    t->stopped = true;
    return 0;
  }
}

/* molt runs ahead of the target's threads.  While every thread is
 * stopped, resuming is one detach per thread, and each detached thread of a
 * busy program is runnable at once: on a machine with fewer cores than
 * threads, molt at the threads' priority shares a core with those it
 * resumed already, and the last ones stay stopped for as many time slices
 * (measured: 100 busy threads on 2 cores, 120-600 ms from the first
 * interrupt to the last detach).  Outside the stop the same holds for
 * molt's own work: it needs about 10 ms of CPU for an attach, which the
 * scheduler spread over more than a second among 100 busy threads of the
 * target (measured: 0.9-1.5 s to prepare a one-function patch).  So for a
 * whole attach or rollback (molt__os_hurry ... molt__os_unhurry, nested:
 * the stop takes it too) molt takes the lowest real-time priority
 * (SCHED_FIFO 1), else the highest nice, else (neither allowed) stays as
 * it is.  Only a molt under the normal policy (SCHED_OTHER) is raised: one
 * started real-time (chrt) is fast already, one started as batch or idle
 * was put there on purpose.  It never spins: between its bursts of work
 * it sleeps (waiting for a thread, the back-off, naps of bounded length),
 * so it takes a core away only for the CPU time it needs.  Its own policy
 * comes back when the outermost run ends; a child it forks does not
 * inherit the priority (SCHED_RESET_ON_FORK). */
static int hurry_depth;
static int hurried; /* 0, 1 real-time, 2 nice */
static int old_policy, old_nice;
static struct sched_param old_param;

void molt__os_hurry(void) {
  if (hurry_depth++ > 0)
    return;
  old_policy = sched_getscheduler(0);
  if (old_policy < 0 || sched_getparam(0, &old_param) != 0)
    return;
  errno = 0;
  old_nice = getpriority(PRIO_PROCESS, 0);
  if (errno || (old_policy & ~SCHED_RESET_ON_FORK) != SCHED_OTHER)
    return;
  struct sched_param rt = {.sched_priority = 1};
  if (sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &rt) == 0)
    hurried = 1;
  else if (setpriority(PRIO_PROCESS, 0, -20) == 0)
    hurried = 2;
}

void molt__os_unhurry(void) {
  if (hurry_depth == 0 || --hurry_depth > 0)
    return;
  if (hurried == 1)
    sched_setscheduler(0, old_policy, &old_param);
  else if (hurried == 2)
    setpriority(PRIO_PROCESS, 0, old_nice);
  hurried = 0;
}

/* The CLI's raise (attach.h).  After the raise, molt's schedstat says how
 * long its process had run and waited for a CPU since it was created:
 * under a crowd of runnable threads of the same scheduling group, nearly
 * all of a run's time at the normal policy is that wait (measured: 100
 * busy threads of a target in molt's session on 2 cores: 15-500 ms before
 * main, for 0.1-1.5 ms on a CPU; the same again to print and exit once
 * the priority was put back -- so the CLI keeps it until it exits). */
void molt__attach_raise(molt__attach_priority *p) {
  memset(p, 0, sizeof *p);
  p->start_ms = p->waited_ms = -1;
  molt__os_hurry();
  char buf[128];
  int fd = open("/proc/self/schedstat", O_RDONLY | O_CLOEXEC);
  ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
  if (fd >= 0)
    close(fd);
  unsigned long long on_cpu, waited;
  buf[n > 0 ? n : 0] = '\0';
  if (n > 0 && sscanf(buf, "%llu %llu", &on_cpu, &waited) == 2) {
    p->start_ms = (double)(on_cpu + waited) / 1e6;
    p->waited_ms = (double)waited / 1e6;
  }
  int base = old_policy & ~SCHED_RESET_ON_FORK;
  p->raised = hurried != 0;
  if (hurried == 1) {
    snprintf(p->how, sizeof p->how, "SCHED_FIFO 1");
  } else if (hurried == 2) {
    snprintf(p->how, sizeof p->how, "nice -20 (SCHED_FIFO not permitted)");
  } else if (old_policy >= 0 && (base == SCHED_FIFO || base == SCHED_RR)) {
    snprintf(p->how, sizeof p->how, "%s %d, as molt was started",
             base == SCHED_FIFO ? "SCHED_FIFO" : "SCHED_RR", old_param.sched_priority);
    p->raised = true;
  } else if (old_policy >= 0 && base != SCHED_OTHER) {
    snprintf(p->how, sizeof p->how, "%s, as molt was started (not raised)",
             base == SCHED_BATCH  ? "SCHED_BATCH"
             : base == SCHED_IDLE ? "SCHED_IDLE"
                                  : "its own policy");
  } else {
    p->not_permitted = true;
    snprintf(p->how, sizeof p->how,
             "normal: molt may not raise it (root, CAP_SYS_NICE or RLIMIT_RTPRIO >= 1 "
             "needed); the target's busy threads may delay it");
  }
}

void molt__attach_lower(void) { molt__os_unhurry(); }

/* How many times thread tid has been given a CPU (the third field of its
 * schedstat); false if unknown (gone, or a kernel without it). */
bool molt__os_runs(pid_t pid, pid_t tid, uint64_t *runs) {
  char path[96], buf[128];
  snprintf(path, sizeof path, "/proc/%d/task/%d/schedstat", (int)pid, (int)tid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  unsigned long long on_cpu, waited, count;
  buf[n > 0 ? n : 0] = '\0';
  if (n <= 0 || sscanf(buf, "%llu %llu %llu", &on_cpu, &waited, &count) != 3)
    return false;
  *runs = count;
  return true;
}

void molt__os_wait_ran(pid_t pid, pid_t tid, uint64_t runs, uint64_t min_ns,
                       uint64_t max_ns) {
  long nap_us = 200;
  for (;;) {
    uint64_t now = molt__os_now_ns(), r = runs;
    if (now >= max_ns || molt__interrupt_pending())
      return;
    bool ran = !tid || !molt__os_runs(pid, tid, &r) || r != runs;
    if (now >= min_ns && ran)
      return;
    uint64_t until = now < min_ns ? min_ns : now + (uint64_t)nap_us * 1000u;
    if (until > max_ns)
      until = max_ns;
    struct timespec ts = {(time_t)((until - now) / 1000000000u),
                          (long)((until - now) % 1000000000u)};
    nanosleep(&ts, NULL);
    if (now >= min_ns && nap_us < 10000)
      nap_us *= 2;
  }
}

/* The hijacked thread of the staging step.  It runs a few system calls,
 * each a round trip: molt sets its registers and single-steps it, the
 * thread must get a core to run the call, then molt must get one to read
 * the result.  A busy thread at its own priority waits for its turn among
 * the target's other runnable threads each time -- to take the interrupt
 * that stops it, and again for the first call (measured: 100 busy
 * threads on 2 cores, 0.2-0.7 s to stop it, 0.3-0.4 s more for
 * memfd_create; once, 2 s without stopping at all).  So for the staging
 * window only, from before the interrupt until before it is let go, the
 * thread takes the lowest real-time priority (SCHED_FIFO 1, reset on
 * fork); its own policy and parameters come back before it is detached,
 * on every path (an interrupted run goes through the same path).  Only a
 * thread under a normal policy (other, batch, idle) is raised; one under a
 * real-time or deadline policy is left as it is, and so is any thread when
 * molt may not raise it (no CAP_SYS_NICE): the staging is slower then,
 * not different.
 *
 * A molt killed (SIGKILL) inside the window cannot put the policy back:
 * before raising it, molt forks a guardian that holds the read end of a
 * pipe; molt writes one byte once the policy is back.  The guardian reads
 * end of file instead when molt died, and then puts the thread's policy
 * back itself -- if the thread still has the priority molt gave it (else
 * someone changed it since, and it is left alone). */
static bool boosted_now(pid_t tid) {
  struct sched_param p;
  return sched_getscheduler(tid) == (SCHED_FIFO | SCHED_RESET_ON_FORK) &&
         sched_getparam(tid, &p) == 0 && p.sched_priority == 1;
}

static void guard(const attach_boost *b, int fd) {
  prctl(PR_SET_NAME, "molt-guard", 0, 0, 0);
  /* nothing of molt's but the pipe: the per-process lock goes with molt */
  if (fd > 3)
    close_range(3, (unsigned)fd - 1, 0);
  close_range((unsigned)fd + 1, ~0u, 0);
  char c;
  ssize_t n;
  do
    n = read(fd, &c, 1);
  while (n < 0 && errno == EINTR);
  if (n == 0 && boosted_now(b->tid))
    sched_setscheduler(b->tid, b->policy, &b->param);
  _exit(0);
}

void molt__os_boost(pid_t tid, attach_boost *b) {
  memset(b, 0, sizeof *b);
  b->tid = tid;
  b->policy = sched_getscheduler(tid);
  int base = b->policy & ~SCHED_RESET_ON_FORK;
  if (b->policy < 0 || sched_getparam(tid, &b->param) != 0 ||
      (base != SCHED_OTHER && base != SCHED_BATCH && base != SCHED_IDLE))
    return;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return;
  pid_t g = fork();
  if (g == 0)
    guard(b, fds[0]);
  close(fds[0]);
  if (g < 0) {
    close(fds[1]);
    return;
  }
  b->guard = g;
  b->fd = fds[1];
  struct sched_param rt = {.sched_priority = 1};
  /* The guardian at molt's priority too (the fork reset it): it must run
   * at once when molt ends it or dies, not after the target's busy threads
   * (a new process waits its turn among them: measured, 60-250 ms). */
  sched_setscheduler(g, SCHED_FIFO | SCHED_RESET_ON_FORK, &rt);
  b->on = sched_setscheduler(tid, SCHED_FIFO | SCHED_RESET_ON_FORK, &rt) == 0;
}

void molt__os_unboost(attach_boost *b) {
  if (b->on && boosted_now(b->tid))
    sched_setscheduler(b->tid, b->policy, &b->param);
  b->on = false;
  if (b->guard > 0) {
    /* the policy is back: the guardian ends without touching it */
    ssize_t n = write(b->fd, "k", 1);
    (void)n;
    close(b->fd);
    while (waitpid(b->guard, NULL, 0) < 0 && errno == EINTR)
      ;
    b->guard = 0;
  }
}

/* Seizes and interrupts thread tid (not yet in s).  0, 1 if gone, or a
 * MOLT_E* code. */
static int seize(attach_stop *s, pid_t tid, char *err, size_t errlen) {
  if (ptrace(PTRACE_SEIZE, tid, 0, (void *)(long)PTRACE_O_TRACECLONE) != 0) {
    int e = errno, tracer;
    char state;
    if (e == ESRCH)
      return 1;
    if (e == EPERM) {
      /* Another thread may be exiting (the kernel refuses to seize a
       * zombie), or be one the kernel traced for us already: a thread
       * created by a seized one (PTRACE_O_TRACECLONE) before its creator's
       * clone event is read. */
      if (!thread_status(s->pid, tid, &tracer, &state) || state == 'Z' || state == 'X')
        return 1;
      if (tracer == (int)getpid()) {
        attach_thread *t = add_thread(s, tid);
        if (!t)
          return MOLT_ENOMEM;
        t->sig = -1; /* it reports its own stop */
        return 0;
      }
    }
    ptrace_refused(s->pid, e, err, errlen);
    return MOLT_EPERM;
  }
  attach_thread *t = add_thread(s, tid);
  if (!t) {
    ptrace(PTRACE_DETACH, tid, 0, 0);
    return MOLT_ENOMEM;
  }
  if (ptrace(PTRACE_INTERRUPT, tid, 0, 0) != 0 && errno == ESRCH)
    return 0; /* exiting: wait_stop sees it go */
  return 0;
}

/* Every stopped thread of s waited for; gone ones dropped.  MOLT_ETIMEDOUT
 * naming a thread that has not stopped by s->t0_ns + STOP_WAIT_MS. */
static int wait_all(attach_stop *s, char *err, size_t errlen) {
  uint64_t deadline = s->t0_ns + (uint64_t)STOP_WAIT_MS * 1000000u;
  for (size_t i = 0; i < s->n;) {
    if (s->t[i].stopped) {
      i++;
      continue;
    }
    if (s->t[i].sig < 0)
      s->t[i].sig = 0;
    int rc = wait_stop(s, &s->t[i], deadline, err, errlen);
    if (rc == 2) {
      not_stopping(s->pid, s->t[i].tid, err, errlen);
      return MOLT_ETIMEDOUT;
    }
    if (rc < 0)
      return rc;
    if (rc == 1)
      drop_thread(s, &s->t[i]);
    /* restart: the array may have grown or moved */
    i = 0;
  }
  return 0;
}

static int list_and_seize(attach_stop *s, bool *added, char *err, size_t errlen) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)s->pid);
  DIR *d = opendir(path);
  if (!d) {
    molt__errmsg(err, errlen, "no process %d", (int)s->pid);
    return MOLT_ENOENT;
  }
  struct dirent *e;
  int rc = 0;
  *added = false;
  while (rc == 0 && (e = readdir(d))) {
    pid_t tid = (pid_t)atoi(e->d_name);
    if (tid <= 0 || find_thread(s, tid))
      continue;
    rc = seize(s, tid, err, errlen);
    if (rc == 1)
      rc = 0;
    else if (rc == 0)
      *added = true;
  }
  closedir(d);
  return rc;
}

int molt__os_stop_all(pid_t pid, attach_stop *s, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  s->pid = pid;
  molt__os_hurry();
  s->hurried = true;
  s->t0_ns = molt__os_now_ns();
  bool added = true;
  int rc = 0;
  /* Until a listing finds no thread we do not hold: a thread created
   * before its creator was seized appears in a later listing, one created
   * after is traced by the kernel (PTRACE_O_TRACECLONE). */
  while (rc == 0 && added) {
    rc = list_and_seize(s, &added, err, errlen);
    if (rc == 0)
      rc = wait_all(s, err, errlen);
  }
  if (rc == 0 && s->n == 0) {
    molt__errmsg(err, errlen, "process %d has exited", (int)pid);
    rc = MOLT_ENOENT;
  }
  if (rc) {
    molt__os_resume_all(s);
    return rc;
  }
  for (size_t i = 0; i < s->n; i++)
    keep_call(s, &s->t[i]);
  return 0;
}

int molt__os_stop_one(pid_t pid, pid_t tid, attach_stop *s, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  s->pid = pid;
  s->t0_ns = molt__os_now_ns();
  int rc = seize(s, tid, err, errlen);
  if (rc == 1) {
    molt__errmsg(err, errlen, "thread %d of process %d has exited", (int)tid, (int)pid);
    rc = MOLT_ENOENT;
  }
  if (rc == 0)
    rc = wait_all(s, err, errlen);
  if (rc == 0 && s->n == 0) {
    molt__errmsg(err, errlen, "thread %d of process %d has exited", (int)tid, (int)pid);
    rc = MOLT_ENOENT;
  }
  if (rc) {
    molt__os_resume_all(s);
    return rc;
  }
  keep_call(s, &s->t[0]);
  return 0;
}

void molt__os_resume_all(attach_stop *s) {
  uint64_t grace = molt__os_now_ns() + 20 * 1000000u;
  for (size_t i = 0; i < s->n; i++) {
    attach_thread *t = &s->t[i];
    if (t->stopped && t->regs_changed)
      ptrace(PTRACE_SETREGS, t->tid, 0, &t->regs);
    /* Detaching resumes the thread, with the signal its stop held back.
     * A thread seized but not stopped yet (the stop gave up on it) cannot
     * be detached until it stops: if it has not, it stays traced until it
     * stops and a later stop of this molt takes it, or until molt exits
     * (the kernel then detaches it and drops the pending interrupt). */
    if (!t->stopped) {
      /* one about to stop (a new thread's first stop) is let stop, for 20
       * ms at most in all: one asleep in the kernel is not waited for */
      int st;
      pid_t w;
      while ((w = waitpid(t->tid, &st, __WALL | WNOHANG)) == 0 &&
             molt__os_now_ns() < grace) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
      }
      if (w <= 0 || !WIFSTOPPED(st))
        continue;
      if ((st >> 16) == 0)
        t->sig = WSTOPSIG(st);
    }
    ptrace(PTRACE_DETACH, t->tid, 0, (void *)(long)(t->sig > 0 ? t->sig : 0));
  }
  s->ms = (double)(molt__os_now_ns() - s->t0_ns) / 1e6;
  if (s->hurried)
    molt__os_unhurry();
  s->hurried = false;
  free(s->t);
  s->t = NULL;
  s->n = s->cap = 0;
}

int molt__os_syscall(attach_thread *t, uint64_t insn, long nr, const uint64_t args[6],
                     long *ret, char *err, size_t errlen) {
  attach_regs r = t->regs;
  molt__arch_set_syscall(&r, insn, nr, args);
  if (ptrace(PTRACE_SETREGS, t->tid, 0, &r) != 0) {
    molt__errmsg(err, errlen, "cannot set the registers of thread %d: %s", (int)t->tid,
                 strerror(errno));
    return MOLT_EIO;
  }
  int rc = MOLT_EIO;
  for (int tries = 0; tries < 16; tries++) {
    /* One instruction: the system call, then the single-step trap. */
    if (ptrace(PTRACE_SINGLESTEP, t->tid, 0, 0) != 0)
      break;
    int st;
    pid_t w;
    do
      w = waitpid(t->tid, &st, __WALL);
    while (w < 0 && errno == EINTR);
    if (w < 0 || !WIFSTOPPED(st))
      break;
    if (ptrace(PTRACE_GETREGS, t->tid, 0, &r) != 0)
      break;
    if (WSTOPSIG(st) != SIGTRAP && (st >> 16) == 0)
      t->sig = WSTOPSIG(st); /* a signal came in: delivered on resume */
    if (molt__arch_ip(&r) == insn + ATTACH_SYSCALL_LEN) {
      *ret = molt__arch_syscall_result(&r);
      rc = 0;
      break;
    }
  }
  /* Back to where it was: its own system call is restarted on resume if
   * the stop interrupted one. */
  if (ptrace(PTRACE_SETREGS, t->tid, 0, &t->regs) != 0 && rc == 0)
    rc = MOLT_EIO;
  if (rc)
    molt__errmsg(err, errlen, "running a system call on thread %d failed", (int)t->tid);
  return rc;
}

/* The steps of molt__os_step_while, on a thread already checked. */
static int step_loop(pid_t pid, attach_thread *t, bool (*still)(uint64_t ip, void *arg),
                     void *arg, int max_steps, int *steps) {
  while (still(molt__arch_ip(&t->regs), arg)) {
    /* A system call is never stepped: it may block (pause, read), and the
     * step with it, while every other thread waits. */
    uint8_t insn[ATTACH_SYSCALL_LEN];
    if (*steps >= max_steps ||
        molt__os_read(pid, molt__arch_ip(&t->regs), insn, sizeof insn) != 0 ||
        molt__arch_is_syscall(insn))
      return 1;
    if (ptrace(PTRACE_SINGLESTEP, t->tid, 0, 0) != 0)
      return 1;
    (*steps)++;
    int st;
    pid_t w;
    do
      w = waitpid(t->tid, &st, __WALL);
    while (w < 0 && errno == EINTR);
    if (w < 0 || !WIFSTOPPED(st)) {
      t->stopped = false; /* gone (killed meanwhile): nothing to resume */
      return 1;
    }
    if (ptrace(PTRACE_GETREGS, t->tid, 0, &t->regs) != 0)
      return 1;
    if ((st >> 16) == 0 && WSTOPSIG(st) != SIGTRAP) {
      /* a signal came in before the instruction ran: kept for the resume
       * (its frame would save an ip inside the bytes: the caller backs
       * off and a later stop sees the handler's frame) */
      t->sig = WSTOPSIG(st);
      return 1;
    }
    if ((st >> 16) != 0)
      return 1; /* an event stop (clone): not stepped further */
  }
  return 0;
}

int molt__os_step_while(pid_t pid, attach_thread *t,
                        bool (*still)(uint64_t ip, void *arg), void *arg, int max_steps,
                        int *steps) {
  *steps = 0;
  if (!t->stopped || t->sig != 0)
    return 1; /* a signal held back by its stop: a frame would be pushed */
  if (t->regs_changed && ptrace(PTRACE_SETREGS, t->tid, 0, &t->regs) != 0)
    return 1;
  t->regs_changed = false;
  if (!still(molt__arch_ip(&t->regs), arg))
    return 0;
  /* Each step is a round trip: the thread must get a CPU to run its one
   * instruction while every other thread waits stopped.  At its own
   * priority it waits for its turn among the machine's other runnable
   * threads at each step (measured: 266 ms for one thread's steps, the
   * stop of 100 busy threads 330 ms instead of 5).  So it is raised as the
   * staging thread is (molt__os_boost: SCHED_FIFO 1, a guardian puts it
   * back if molt dies), and put back before the caller resumes it.  It is
   * ptrace-stopped between steps and runs one instruction per step, at
   * most max_steps: it cannot hold a CPU. */
  attach_boost b;
  molt__os_boost(t->tid, &b);
  molt__test_pause("stepping"); /* raised, about to step */
  int rc = step_loop(pid, t, still, arg, max_steps, steps);
  molt__os_unboost(&b);
  return rc;
}

/* ---- running code on a stopped thread (callback.c) ------------------------------ */

/* A signal the kernel raises for the instruction a thread runs: a crash of
 * the code run on it (the asynchronous ones are blocked meanwhile). */
static bool synchronous(int sig) {
  return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE ||
         sig == SIGTRAP || sig == SIGSYS;
}

/* A thread created by the code run on t: traced by the kernel (the seize
 * asked for it); let go at its first stop. */
static void let_go(pid_t child) {
  int st;
  for (int tries = 0; tries < 1000; tries++) {
    pid_t w = waitpid(child, &st, __WALL | WNOHANG);
    if (w == child || (w < 0 && errno != EINTR))
      break;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  ptrace(PTRACE_DETACH, child, 0, 0);
}

int molt__os_run_until(attach_thread *t, const attach_regs *r, uint64_t trap,
                       int timeout_ms, attach_regs *out, int *sig, char *err,
                       size_t errlen) {
  if (ptrace(PTRACE_SETREGS, t->tid, 0, r) != 0 ||
      ptrace(PTRACE_CONT, t->tid, 0, 0) != 0) {
    molt__errmsg(err, errlen, "cannot run code on thread %d: %s", (int)t->tid,
                 strerror(errno));
    return MOLT_EIO;
  }
  uint64_t deadline = molt__os_now_ns() + (uint64_t)timeout_ms * 1000000u;
  long nap_us = 20;
  bool interrupted = false;
  for (;;) {
    int st;
    pid_t w = waitpid(t->tid, &st, __WALL | (interrupted ? 0 : WNOHANG));
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 || (w == t->tid && (WIFEXITED(st) || WIFSIGNALED(st)))) {
      molt__errmsg(err, errlen, "the process ended while code ran on its thread %d",
                   (int)t->tid);
      return MOLT_ENOENT;
    }
    if (w == 0) {
      if (molt__os_now_ns() >= deadline) {
        /* Not back in time: stop it where it is; the caller puts its own
         * registers back. */
        if (ptrace(PTRACE_INTERRUPT, t->tid, 0, 0) != 0) {
          molt__errmsg(err, errlen, "cannot interrupt thread %d: %s", (int)t->tid,
                       strerror(errno));
          return MOLT_EIO;
        }
        interrupted = true;
        continue;
      }
      struct timespec ts = {0, nap_us * 1000};
      nanosleep(&ts, NULL);
      if (nap_us < 1000)
        nap_us *= 2;
      continue;
    }
    if (!WIFSTOPPED(st))
      continue;
    int event = st >> 16, s = WSTOPSIG(st);
    if (ptrace(PTRACE_GETREGS, t->tid, 0, out) != 0) {
      molt__errmsg(err, errlen, "cannot read the registers of thread %d: %s", (int)t->tid,
                   strerror(errno));
      return MOLT_EIO;
    }
    if (event == PTRACE_EVENT_CLONE) {
      unsigned long child = 0;
      if (ptrace(PTRACE_GETEVENTMSG, t->tid, 0, &child) == 0 && child)
        let_go((pid_t)child);
    } else if (event == 0 && s == SIGSEGV && molt__arch_ip(out) == trap) {
      *sig = 0; /* returned: the fault of its return, kept from the program */
      return 0;
    } else if (event == 0 && synchronous(s)) {
      *sig = s;
      return 1;
    } else if (event == 0) {
      t->sig = s; /* SIGSTOP (not blockable): the program's, given back at detach */
    } else if (interrupted) {
      return 2; /* the interrupt's stop */
    }
    if (ptrace(PTRACE_CONT, t->tid, 0, 0) != 0) {
      molt__errmsg(err, errlen, "cannot resume thread %d: %s", (int)t->tid,
                   strerror(errno));
      return MOLT_EIO;
    }
  }
}
