/* The backstop of a shadowed update's follower (shadow.h): a system call
 * the wrappers do not follow, made by a follower's program thread, is
 * trapped (Syscall User Dispatch, PR_SET_SYSCALL_USER_DISPATCH, Linux
 * 5.11+), and one that would do I/O on the leader's behalf ends the
 * follower with its name and arguments instead of repeating the leader's
 * I/O (a reply sent twice, a file written twice).
 *
 * Each program thread of the follower turns dispatch on for itself when it
 * starts (molt__shadow_trap_arm, from its ring's hook) with a selector
 * byte of its own set to BLOCK.  After molt promote the old version's
 * threads in the original process do the same as each starts to follow
 * (ring.c, sync_backstop), under the reverse rules, and turn it off again
 * (molt__shadow_trap_disarm) when the lead comes back or they run alone: from then on every system call it makes
 * outside the allowed region raises SIGSYS before it runs.  The wrappers
 * (calls.c) set the selector to ALLOW while they replay, so their own
 * calls (the ring's futex, a descriptor received and placed) run
 * untrapped.  The allowed region is this file's section .text.molt_sud,
 * three instructions long:
 *
 *   resume:    syscall; jmp *cont   -- runs a trapped call the handler let
 *                                      through (cont: the instruction after
 *                                      the trapped one, popped from a small
 *                                      stack per thread)
 *   restorer:  rt_sigreturn         -- returns from the handler itself
 *
 * The handler (on_sigsys) sorts the trapped call:
 *  - I/O that would act for the leader: reading or writing a descriptor
 *    the follower did not open itself (writes to 1 and 2 excepted: the
 *    follower's messages and a sanitizer's report show; and the runtime's
 *    own descriptors, in the band of base/fd.c), connecting,
 *    accepting, binding, files opened for writing or changed by name,
 *    io_uring and AIO submissions, epoll calls (the instances are shared
 *    with the leader; epoll.c follows the wrapped ones): the follower ends ("the follower made
 *    a system call molt does not follow: writev(5, ...)").
 *  - A new thread or process (clone, fork, exec): the follower ends too --
 *    a thread the program image starts with pthread_create is followed
 *    (ring.c, threads) and its clone runs while the wrapper allows calls;
 *    one a library starts on its own, or a raw clone, is not.
 *  - A file opened read-only (a library reading /proc/self/maps, locale
 *    files): made by the handler, and the descriptor remembered as the
 *    follower's own, whose reads and close are then let through.
 *  - rt_sigprocmask that would block SIGSYS: emulated with SIGSYS left
 *    unblocked (keeps_sigsys), so that a call trapped later is named.
 *  - Anything else (memory, futexes, signals, sleeps, time): let through
 *    -- the handler points the interrupted context at `resume`, which
 *    makes the same call with the same registers (the kernel left the
 *    call's number in rax) and jumps back.  It costs a signal per call
 *    (~2-3 us), in the follower only.
 * Syscalls made inside the vDSO (clock_gettime) never trap.
 *
 * The handler is installed with the raw rt_sigaction call so that its
 * return goes through `restorer` in the allowed region (glibc's would be
 * trapped like any other call).  A program that installs its own SIGSYS
 * handler in the follower replaces the backstop. */
#include "shadow/shadow.h"

#include "molt.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef PR_SET_SYSCALL_USER_DISPATCH
#define PR_SET_SYSCALL_USER_DISPATCH 59
#define PR_SYS_DISPATCH_OFF 0
#define PR_SYS_DISPATCH_ON 1
#define SYSCALL_DISPATCH_FILTER_ALLOW 0
#define SYSCALL_DISPATCH_FILTER_BLOCK 1
#endif

#ifndef SYS_epoll_pwait2
#define SYS_epoll_pwait2 441
#endif

#if defined(__x86_64__)

/* The calling thread's selector (read by the kernel at each system call). */
MOLT__HIDDEN __thread volatile char molt__sud_selector
    __attribute__((tls_model("initial-exec")));
/* Where `resume` returns to: a stack per thread ([0] its depth, then the
 * continuations), since a signal handler of the program may trap and be
 * resumed between the handler's return and `resume`'s own jump. */
#define CONTS_MAX 8
MOLT__HIDDEN __thread uintptr_t molt__sud_conts[1 + CONTS_MAX]
    __attribute__((tls_model("initial-exec")));
/* The thread turned dispatch on. */
static __thread bool armed __attribute__((tls_model("initial-exec")));

extern const char molt__sud_begin[], molt__sud_resume[], molt__sud_restorer[],
    molt__sud_end[];

__asm__(".pushsection .text.molt_sud,\"ax\",@progbits\n"
        ".globl molt__sud_begin\n"
        ".hidden molt__sud_begin\n"
        "molt__sud_begin:\n"
        ".globl molt__sud_resume\n"
        ".hidden molt__sud_resume\n"
        "molt__sud_resume:\n"
        "  syscall\n"
        /* rcx and r11 are the kernel's after syscall: free, as after any
         * system call.  Pop the continuation the handler pushed. */
        "  movq molt__sud_conts@gottpoff(%rip), %r11\n"
        "  movq %fs:(%r11), %rcx\n"
        "  subq $1, %rcx\n"
        "  movq %rcx, %fs:(%r11)\n"
        "  movq %fs:8(%r11,%rcx,8), %rcx\n"
        "  jmp *%rcx\n"
        ".globl molt__sud_restorer\n"
        ".hidden molt__sud_restorer\n"
        "molt__sud_restorer:\n"
        "  movl $15, %eax\n" /* rt_sigreturn */
        "  syscall\n"
        /* the kernel checks the address after the syscall instruction */
        "  ud2\n"
        ".globl molt__sud_end\n"
        ".hidden molt__sud_end\n"
        "molt__sud_end:\n"
        ".popsection\n");

/* Descriptors the follower opened itself through a trapped open (their
 * reads and writes are its own business).  Relaxed: a descriptor's open
 * and its use are ordered by the program. */
#define OWN_MAX 4096
static _Atomic unsigned char own[OWN_MAX];

/* Where the runtime's kept descriptors start (the update points' own
 * wake-ups write there from program threads): read before the threads are
 * armed. */
static int band = -1;

static bool is_own(long long fd) {
  if (band > 0 && fd >= band && fd < 1024)
    return true;
  return fd >= 0 && fd < OWN_MAX && atomic_load_explicit(&own[fd], memory_order_relaxed);
}

/* The names of the calls refused() may refuse. */
#define N(x)                                                                             \
  { SYS_##x, #x }
static const struct {
  long nr;
  const char *name;
} names[] = {N(read),
             N(write),
             N(pread64),
             N(pwrite64),
             N(readv),
             N(writev),
             N(preadv),
             N(pwritev),
             N(preadv2),
             N(pwritev2),
             N(recvfrom),
             N(sendto),
             N(recvmsg),
             N(sendmsg),
             N(recvmmsg),
             N(sendmmsg),
             N(sendfile),
             N(splice),
             N(tee),
             N(vmsplice),
             N(copy_file_range),
             N(connect),
             N(accept),
             N(accept4),
             N(bind),
             N(listen),
             N(shutdown),
             N(open),
             N(openat),
             N(creat),
             N(unlink),
             N(unlinkat),
             N(rename),
             N(renameat),
             N(renameat2),
             N(mkdir),
             N(mkdirat),
             N(rmdir),
             N(truncate),
             N(ftruncate),
             N(fallocate),
             N(link),
             N(linkat),
             N(symlink),
             N(symlinkat),
             N(fsync),
             N(fdatasync),
             N(io_submit),
             N(io_uring_enter),
             N(epoll_create),
             N(epoll_create1),
             N(epoll_ctl),
             N(epoll_wait),
             N(epoll_pwait),
             N(epoll_pwait2),
             N(clone),
             N(clone3),
             N(fork),
             N(vfork),
             N(execve),
             N(execveat)};
#undef N

static const char *sys_name(long nr) {
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].nr == nr)
      return names[i].name;
  return NULL;
}

/* Why the follower must not make call nr with arguments a (NULL: it may). */
static const char *refused(long nr, const long long *a) {
  switch (nr) {
  case SYS_read:
  case SYS_pread64:
  case SYS_readv:
  case SYS_preadv:
  case SYS_preadv2:
  case SYS_recvfrom:
  case SYS_recvmsg:
  case SYS_recvmmsg:
    return is_own(a[0]) ? NULL : "it would take input the leader reads";
  case SYS_write:
  case SYS_pwrite64:
  case SYS_writev:
  case SYS_pwritev:
  case SYS_pwritev2:
  case SYS_sendto:
  case SYS_sendmsg:
  case SYS_sendmmsg:
    if (a[0] == 1 || a[0] == 2 || is_own(a[0]))
      return NULL;
    return "it would repeat output the leader makes";
  case SYS_sendfile:
  case SYS_splice:
  case SYS_tee:
  case SYS_vmsplice:
  case SYS_copy_file_range:
  case SYS_connect:
  case SYS_accept:
  case SYS_accept4:
  case SYS_bind:
  case SYS_listen:
  case SYS_shutdown:
  case SYS_io_submit:
  case SYS_io_uring_enter:
    return "it would do I/O the leader does";
  case SYS_epoll_create:
  case SYS_epoll_create1:
  case SYS_epoll_ctl:
  case SYS_epoll_wait:
  case SYS_epoll_pwait:
  case SYS_epoll_pwait2:
    /* the instances are the leader's (shared by the fork): only the
     * wrappers of epoll.c may use them, emulated */
    return "it would use an epoll instance outside the followed calls";
  case SYS_open:
  case SYS_creat:
  case SYS_openat: {
    long long flags = nr == SYS_openat ? a[2] : nr == SYS_creat ? O_WRONLY : a[1];
    if (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND))
      return "it would open a file for writing";
    return NULL;
  }
  case SYS_unlink:
  case SYS_unlinkat:
  case SYS_rename:
  case SYS_renameat:
  case SYS_renameat2:
  case SYS_mkdir:
  case SYS_mkdirat:
  case SYS_rmdir:
  case SYS_truncate:
  case SYS_ftruncate:
  case SYS_fallocate:
  case SYS_link:
  case SYS_linkat:
  case SYS_symlink:
  case SYS_symlinkat:
  case SYS_fsync:
  case SYS_fdatasync:
    return "it would change files the leader changes";
  case SYS_clone:
  case SYS_clone3:
  case SYS_fork:
  case SYS_vfork:
  case SYS_execve:
  case SYS_execveat:
    return "threads and processes started outside the program image's pthread_create "
           "(which molt follows) are not followed";
  default:
    return NULL;
  }
}

/* rt_sigprocmask(how, set, oldset, 8) of an armed thread that would block
 * SIGSYS -- glibc's pthread_create blocks every signal around its clone, a
 * sanitizer around its own work: a call trapped then would be SIGSYS
 * forced to its default action, the follower killed without a word (a
 * thread started outside the followed pthread_create, say by a library,
 * could not be named).  Emulated here on the mask sigreturn restores, with
 * SIGSYS left out: the thread's mask is what it asked for but SIGSYS
 * (true, result in rax).  false: not such a call, made as any other. */
__attribute__((no_sanitize("address", "thread", "undefined"))) static bool
keeps_sigsys(ucontext_t *uc, const long long *a) {
  const uint64_t sys = 1ull << (SIGSYS - 1);
  const uint64_t *set = (const uint64_t *)(uintptr_t)a[1];
  uint64_t *old = (uint64_t *)(uintptr_t)a[2];
  long long how = a[0];
  if (a[3] != 8 || !set || (how != SIG_BLOCK && how != SIG_SETMASK) || !(*set & sys))
    return false;
  uint64_t want = *set, cur;
  memcpy(&cur, &uc->uc_sigmask, sizeof cur);
  if (old)
    *old = cur;
  cur = how == SIG_BLOCK ? cur | want : want;
  /* as the kernel does: SIGKILL and SIGSTOP cannot be blocked */
  cur &= ~(sys | 1ull << (SIGKILL - 1) | 1ull << (SIGSTOP - 1));
  memcpy(&uc->uc_sigmask, &cur, sizeof cur);
  uc->uc_mcontext.gregs[REG_RAX] = 0;
  return true;
}

/* The path a refused call names (NULL: none): the file the follower
 * would have changed, for its report. */
static const char *path_of(long nr, const long long *a) {
  switch (nr) {
  case SYS_open:
  case SYS_creat:
  case SYS_unlink:
  case SYS_rename:
  case SYS_mkdir:
  case SYS_rmdir:
  case SYS_truncate:
  case SYS_link:
    return (const char *)(uintptr_t)a[0];
  case SYS_openat:
  case SYS_unlinkat:
  case SYS_renameat:
  case SYS_renameat2:
  case SYS_mkdirat:
  case SYS_linkat:
    return (const char *)(uintptr_t)a[1];
  case SYS_symlink:
    return (const char *)(uintptr_t)a[1];
  case SYS_symlinkat:
    return (const char *)(uintptr_t)a[2];
  default:
    return NULL;
  }
}

/* A system call made from C inside the allowed region's rules: the
 * selector is ALLOW while the handler runs. */
__attribute__((no_sanitize("address", "thread", "undefined"))) static void
on_sigsys(int sig, siginfo_t *si, void *ucv) {
  (void)sig;
  char was = molt__sud_selector;
  if (si->si_code != 2 /* SYS_USER_DISPATCH: else not ours (kill -SYS) */)
    return;
  molt__sud_selector = SYSCALL_DISPATCH_FILTER_ALLOW;
  int saved_errno = errno;
  ucontext_t *uc = ucv;
  greg_t *g = uc->uc_mcontext.gregs;
  long nr = si->si_syscall;
  long long a[6] = {g[REG_RDI], g[REG_RSI], g[REG_RDX], g[REG_R10], g[REG_R8], g[REG_R9]};
  /* A thread whose other side died (the old version's whose new version
   * died, it leads again once its ring is drained; a follower's whose
   * leader died, it took over): its calls are real from now on, trapped
   * only in the moment between its last replay and its next followed
   * call, which would disarm it.  Let through, and disarmed here: a thread of the
   * process that serves must not stop (park) nor keep paying a trap a
   * call. */
  bool runs_alone = molt__shadow_trap_passes();
  if (runs_alone) {
    molt__shadow_trap_disarm();
    was = SYSCALL_DISPATCH_FILTER_ALLOW;
  }
  const char *why = runs_alone ? NULL : refused(nr, a);
  if (why && (nr == SYS_write || nr == SYS_writev)) {
    /* A `drop` rule may cover it (a log written inside libc; forward in
     * the follower, reverse in the old version following after a
     * promotion): skipped, its length returned (the kernel made no call:
     * rax is ours). */
    long long len = 0;
    if (nr == SYS_write) {
      len = a[2];
    } else if (a[2] >= 0 && a[2] <= IOV_MAX) {
      const struct iovec *iov = (const struct iovec *)(uintptr_t)a[1];
      for (long long i = 0; i < a[2]; i++)
        len += (long long)iov[i].iov_len;
    }
    if (len >= 0 &&
        molt__shadow_trap_drops(nr == SYS_write ? MOLT__SC_WRITE : MOLT__SC_WRITEV, a[0],
                                nr == SYS_write ? (const void *)(uintptr_t)a[1] : NULL,
                                (size_t)len)) {
      g[REG_RAX] = len;
      errno = saved_errno;
      molt__sud_selector = was;
      return;
    }
  }
  if (why) {
    const char *name = sys_name(nr);
    char num[24];
    if (!name) {
      snprintf(num, sizeof num, "system call %ld", nr);
      name = num;
    }
    /* the path it names, up to 160 bytes (the program's own string) */
    char on[192] = "";
    const char *path = path_of(nr, a);
    if (path)
      snprintf(on, sizeof on, " on \"%.160s\"", path);
    /* In the original process the old version follows the promoted new
     * one: its thread stops there for good (ring.c, park_for_good) -- with
     * the program's own signal mask, as a thread that diverged does, not
     * with every signal blocked as this handler runs: else a signal sent
     * to end the process (SIGTERM, to restart it) stays pending for ever
     * when this was the one thread not blocking it (mosquitto's one
     * program thread; a handler the program installed still decides). */
    bool old = !molt__shadow_in_follower();
    if (old)
      syscall(SYS_rt_sigprocmask, SIG_SETMASK, &uc->uc_sigmask, NULL, sizeof(uint64_t));
    molt__shadow_follower_fail(
        MOLT__SHADOW_END_FAILED,
        "the %s's thread %d made a system call molt does not "
        "follow: %s(%lld, %lld, %lld, ...)%s at %p, which %s; %s before it ran "
        "(call it through a covered function, or cover a write with a %s `drop` "
        "rule, docs/design.md §17)%s",
        old ? "old version" : "follower", (int)molt__gettid(), name, a[0], a[1], a[2], on,
        si->si_call_addr, why,
        old ? "its thread stopped following" : "the follower was ended",
        old ? "reverse" : "forward",
        molt_is_updating()
            ? "; the thread was restarting in the new version (before its "
              "first update point, where the leader has no call to compare)"
            : "");
  }
  if (nr == SYS_rt_sigprocmask && keeps_sigsys(uc, a)) {
    /* emulated on the interrupted context's mask */
  } else if (nr == SYS_open || nr == SYS_openat) {
    /* Read-only: made here, so that the descriptor is known as its own. */
    long fd = syscall(nr, a[0], a[1], a[2], a[3]);
    if (fd >= 0 && fd < OWN_MAX)
      atomic_store_explicit(&own[fd], 1, memory_order_relaxed);
    g[REG_RAX] = fd < 0 ? -errno : fd;
  } else {
    if (nr == SYS_close && is_own(a[0]))
      atomic_store_explicit(&own[a[0]], 0, memory_order_relaxed);
    /* Let it through: `resume` makes it with the interrupted registers. */
    uintptr_t d = molt__sud_conts[0];
    if (d >= CONTS_MAX)
      molt__shadow_follower_fail(
          MOLT__SHADOW_END_FAILED,
          "the follower's thread %d trapped system calls nested %d "
          "deep (signal handlers): the backstop gives up",
          (int)molt__gettid(), CONTS_MAX);
    molt__sud_conts[1 + d] = (uintptr_t)g[REG_RIP];
    molt__sud_conts[0] = d + 1;
    g[REG_RIP] = (greg_t)(uintptr_t)molt__sud_resume;
  }
  errno = saved_errno;
  molt__sud_selector = was;
}

/* The kernel's struct sigaction (rt_sigaction). */
struct ksigaction {
  void (*handler)(int, siginfo_t *, void *);
  unsigned long flags;
  void (*restorer)(void);
  uint64_t mask;
};

#ifndef SA_RESTORER
#define SA_RESTORER 0x04000000
#endif

/* Fatal signals whose handler (a sanitizer's report, the program's own)
 * runs with SIGSYS blocked: a trapped call in it would be SIGSYS forced to
 * its default action, the report lost.  Their handlers are wrapped: the
 * thread's calls are let through from the fault on (it is dying or
 * handling its own fault), then the handler that was there runs. */
static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP};
#define NFATAL (sizeof fatal / sizeof fatal[0])
static struct ksigaction chained[NFATAL];

__attribute__((no_sanitize("address", "thread", "undefined"))) static void
on_fatal(int sig, siginfo_t *si, void *uc) {
  molt__sud_selector = SYSCALL_DISPATCH_FILTER_ALLOW;
  for (size_t i = 0; i < NFATAL; i++)
    if (fatal[i] == sig) {
      if (chained[i].flags & SA_SIGINFO)
        chained[i].handler(sig, si, uc);
      else
        ((void (*)(int))(uintptr_t)chained[i].handler)(sig);
      return;
    }
}

int molt__shadow_trap_install(void) {
  band = molt__fd_band();
  /* No thread of this process is armed yet (the follower's start; the
   * original process at a promotion, every thread leading): the
   * descriptors a previous promotion's or the original's trapped opens
   * noted, whose closes may have run untrapped since, are forgotten. */
  for (size_t fd = 0; fd < OWN_MAX; fd++)
    atomic_store_explicit(&own[fd], 0, memory_order_relaxed);
  struct ksigaction sa = {on_sigsys, SA_SIGINFO | SA_RESTORER,
                          (void (*)(void))(uintptr_t)molt__sud_restorer, ~0ull};
  if (syscall(SYS_rt_sigaction, SIGSYS, &sa, NULL, sizeof sa.mask) != 0)
    return -errno;
  for (size_t i = 0; i < NFATAL; i++) {
    struct ksigaction old;
    if (syscall(SYS_rt_sigaction, fatal[i], NULL, &old, sizeof old.mask) != 0)
      continue;
    uintptr_t h = (uintptr_t)old.handler;
    if (h == (uintptr_t)SIG_DFL || h == (uintptr_t)SIG_IGN)
      continue; /* the default kills without a system call */
    /* Installed once per process image: again in the original process at
     * its next promotion, and in a follower forked from a process that
     * had installed it, whose chained[] came with the fork.  Wrapping
     * on_fatal again would chain it to itself. */
    if (h == (uintptr_t)on_fatal)
      continue;
    chained[i] = old;
    /* its flags (SA_ONSTACK, SA_NODEFER, ...) and mask, our entry and a
     * return through the allowed region */
    struct ksigaction mine = {on_fatal, old.flags | SA_SIGINFO | SA_RESTORER,
                              (void (*)(void))(uintptr_t)molt__sud_restorer, old.mask};
    syscall(SYS_rt_sigaction, fatal[i], &mine, NULL, sizeof mine.mask);
  }
  return 0;
}

int molt__shadow_trap_arm(void) {
  if (armed)
    return 0;
  /* A blocked SIGSYS would be forced to its default action: death. */
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGSYS);
  pthread_sigmask(SIG_UNBLOCK, &s, NULL);
  molt__sud_selector = SYSCALL_DISPATCH_FILTER_ALLOW;
  if (prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_ON,
            (unsigned long)(uintptr_t)molt__sud_begin,
            (unsigned long)(molt__sud_end - molt__sud_begin),
            (unsigned long)(uintptr_t)&molt__sud_selector) != 0)
    return -errno;
  armed = true;
  molt__sud_selector = SYSCALL_DISPATCH_FILTER_BLOCK;
  return 0;
}

/* From the SIGSYS handler too (no sanitizer's hooks there). */
__attribute__((no_sanitize("address", "thread", "undefined"))) void
molt__shadow_trap_disarm(void) {
  if (!armed)
    return;
  /* ALLOW first: the prctl below is made outside the allowed region. */
  molt__sud_selector = SYSCALL_DISPATCH_FILTER_ALLOW;
  prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_OFF, 0, 0, 0);
  armed = false;
}

bool molt__shadow_trap_armed(void) { return armed; }

void molt__shadow_trap_allow(void) {
  if (armed)
    molt__sud_selector = SYSCALL_DISPATCH_FILTER_ALLOW;
}

void molt__shadow_trap_block(void) {
  if (armed)
    molt__sud_selector = SYSCALL_DISPATCH_FILTER_BLOCK;
}

#else /* not x86-64: no backstop */

int molt__shadow_trap_install(void) { return -ENOSYS; }
int molt__shadow_trap_arm(void) { return -ENOSYS; }
void molt__shadow_trap_disarm(void) {}
bool molt__shadow_trap_armed(void) { return false; }
void molt__shadow_trap_allow(void) {}
void molt__shadow_trap_block(void) {}

#endif
