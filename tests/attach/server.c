/* A plainly built multi-threaded server for the attach tests (gcc -O2, no
 * molt, nothing preloaded).
 *
 *   server [WORKERS [SPINNERS [CHURNERS]]]
 *                      prints "port N" and serves 127.0.0.1:N: each line
 *                      "N" is answered by "<answer(N)>\n"; the line "stats"
 *                      by the counters of the watcher threads below.
 *
 * Watcher threads sit in blocking calls all the time -- read, accept,
 * nanosleep, epoll_wait, futex, io_getevents, io_pgetevents -- and count
 * each EINTR and each sleep or timeout that ended early: an attach's stop must cause neither.  Spinner
 * threads call spin_copy(), whose first instruction (rep movsb) runs long,
 * and check that its copy is whole; branchy() and tiny() are functions an
 * attach must refuse.  The line "hello" is answered by "hello <banner()>"
 * (a second function a stacked patch replaces); "stats" also reports the
 * counters the attach callbacks of the tests change (cb_*).  "deep N [AT
 * MS]" is answered by deep(N, AT, MS), a recursive function; "op K N" by
 * ops[K](N), a call through a pointer the program stored at start; "reg
 * K", "call K N" and "drop K" a table of handlers registered at run time;
 * "reap" the thread an attach patch started.
 *
 * $SERVER_FORKS=N: the process forks N workers after it listens (each
 * serves the same socket with its own threads, and dies with its master);
 * $SERVER_PARK_WORKER=K: worker K (1..N; 0 the master) has a thread parked
 * in pause() inside the first bytes of park(), which no attach of park()
 * can ever get past (the attach --all tests); $SERVER_PTRACER_ANY: any
 * process of its user may trace it (Yama's ptrace_scope 1); $SERVER_HEAP_MB=N:
 * N MiB of heap, filled; $SERVER_RESERVE_GB=N: N GiB of address space
 * reserved. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/aio_abi.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef VARIANT
#define VARIANT 1
#endif

static long multiplier = 2; /* a static the patch reads ($SERVER_MULTIPLIER) */
static atomic_long eintr_count, early_count, spin_calls, spin_bad, spin_new;
static int listen_fd;

/* The function the patches replace (the patch answers differently). */
__attribute__((noinline)) long answer(long n) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", n * multiplier + VARIANT - 1);
  return strtol(buf, NULL, 10);
}

/* A build of its own (-DSERVER_TAG="..."): a build-id no other copy of this
 * file has, so that attach --all finds only the test's processes. */
#ifdef SERVER_TAG
__attribute__((used)) static const char server_tag[] = SERVER_TAG;
#endif

/* The second function a stacked patch replaces. */
__attribute__((noipa)) const char *banner(void) { return "original"; }

/* What the attach callbacks of the tests change (test_attach.py). */
long cb_pre, cb_post, cb_pre_saw, cb_post_saw;

/* answer() called through the program's own entry: what a callback sees
 * of it (the patch's own answer() is the new version). */
__attribute__((noipa)) long ask(long n) { return answer(n); }

/* A recursive function: N + 1 levels, each adding 1 (the patch's version
 * adds 1 + 2^20, so the answer counts the levels each version ran), level
 * AT sleeping MS ms on its way down (deep_naps counts the naps begun: a
 * test attaches while a recursion is half way down).  Each level checks
 * its own frame once its callee returned; the check after the call also
 * keeps the compiler from turning the recursion into a loop. */
static atomic_long deep_naps;
__attribute__((noinline)) long deep(long n, long at, long ms) {
  volatile long mark = n ^ 0x5a5a;
  if (n == at && ms > 0) {
    atomic_fetch_add(&deep_naps, 1);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
  }
  long below = n > 0 ? deep(n - 1, at, ms) : 0;
  if (mark != (n ^ 0x5a5a) || below < 0)
    return -1;
  return below + 1;
}

/* Functions reached only through a table the program fills at start (a
 * stored pointer, so no call site names them): "op 0 N" is N + 1000,
 * "op 1 N" scale(N), 5N (the patch's version 7N). */
static volatile long scale_factor = 5;
__attribute__((noipa)) long shift(long n) { return n + 1000; }
__attribute__((noipa)) long scale(long n) { return n * scale_factor; }
static long (*ops[2])(long);

/* Handlers the program registers at run time, as a server registers its
 * callbacks: "reg K" has setup(K) fill slot K -- slots 0-3 in a global
 * table, 4-7 in a table on the heap -- with a function and a label; "call
 * K N" answers "<label> <fn(N)>" ("none" for an empty slot); "drop K"
 * empties it.  A patched setup() stores pointers into the patch there,
 * which the program keeps calling and reading after a rollback. */
struct handler {
  long (*fn)(long);
  const char *label;
};
static struct handler handler_table[4];
static struct handler *handler_heap;
__attribute__((noipa)) long twice(long n) { return 2 * n; }
__attribute__((noipa)) struct handler *handler_slot(long k) {
  if (k >= 0 && k < 4)
    return &handler_table[k];
  return k >= 4 && k < 8 ? &handler_heap[k - 4] : NULL;
}
__attribute__((noipa)) long setup(long k) {
  struct handler *h = handler_slot(k);
  if (!h)
    return -1;
  h->fn = twice;
  h->label = "plain";
  return 0;
}

/* A thread an attach patch starts on a stack it maps itself
 * (fix_helper.c): "reap" joins it and unmaps its stack, as a program frees
 * the stack it gave a thread. */
pthread_t helper_thread;
void *helper_stack;
size_t helper_stack_size;

/* A system call in its first bytes: a thread blocked in it has its
 * restart address (ip - 2) there. */
long park(long nr);
__asm__(".text\n"
        ".globl park\n"
        ".type park, @function\n"
        "park:\n"
        "  mov %rdi, %rax\n"
        "  syscall\n"
        "  ret\n"
        ".size park, .-park\n");

static void *parker(void *arg) {
  for (;;)
    park(SYS_pause);
  return NULL;
}

/* rep movsb first: rdi = dst, rsi = src, rcx = n (the 4th argument); then a
 * busy loop of rdx rounds; returns 1 (the patch's version returns 2). */
long spin_copy(void *dst, const void *src, long rounds, size_t n);
__asm__(".text\n"
        ".globl spin_copy\n"
        ".type spin_copy, @function\n"
        "spin_copy:\n"
        "  rep movsb\n"
        "  mov %rdx, %rcx\n"
        "1:\n"
        "  dec %rcx\n"
        "  jnz 1b\n"
        "  mov $1, %eax\n"
        "  ret\n"
        ".size spin_copy, .-spin_copy\n");

/* A loop back into its own first bytes (+2): no jump can go there. */
long branchy(long n);
__asm__(".text\n"
        ".globl branchy\n"
        ".type branchy, @function\n"
        "branchy:\n"
        "  xor %eax, %eax\n"
        "2:\n"
        "  inc %rax\n"
        "  cmp %rdi, %rax\n"
        "  jl 2b\n"
        "  ret\n"
        ".size branchy, .-branchy\n");

/* Three bytes: too short for a jump. */
long tiny(void);
__asm__(".text\n"
        ".globl tiny\n"
        ".type tiny, @function\n"
        "tiny:\n"
        "  xor %eax, %eax\n"
        "  ret\n"
        ".size tiny, .-tiny\n");

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void count(long r, double t0, double want_ms) {
  if (r < 0 && errno == EINTR)
    atomic_fetch_add(&eintr_count, 1);
  else if (want_ms > 0 && now_ms() - t0 < want_ms - 0.5)
    atomic_fetch_add(&early_count, 1);
}

static void *sleeper(void *arg) {
  for (;;) {
    struct timespec ts = {0, 40 * 1000000};
    double t0 = now_ms();
    count(nanosleep(&ts, NULL), t0, 40);
  }
  return NULL;
}

static void *epoller(void *arg) {
  int p[2], ep = epoll_create1(0);
  if (pipe(p) != 0 || ep < 0)
    abort();
  struct epoll_event ev = {.events = EPOLLIN};
  epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &ev);
  for (;;) {
    double t0 = now_ms();
    count(epoll_wait(ep, &ev, 1, 60), t0, 60);
  }
  return NULL;
}

static void *futexer(void *arg) {
  static int word;
  for (;;) {
    struct timespec ts = {0, 50 * 1000000};
    double t0 = now_ms();
    long r = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &ts, NULL, 0);
    if (r < 0 && errno == ETIMEDOUT)
      r = 0;
    count(r, t0, 50);
  }
  return NULL;
}

/* io_getevents and io_pgetevents (raw system calls: glibc has no
 * wrapper) on a context with nothing submitted: each waits its timeout. */
static aio_context_t aio_ctx[2]; /* set up by main before "port": the maps
                                   * do not change after it */
static void *aio_waiter(void *arg) {
  long nr = arg ? SYS_io_pgetevents : SYS_io_getevents;
  aio_context_t ctx = aio_ctx[arg ? 1 : 0];
  for (;;) {
    struct io_event ev;
    struct timespec ts = {0, 45 * 1000000};
    double t0 = now_ms();
    long r = syscall(nr, ctx, 1, 1, &ev, &ts, NULL);
    count(r, t0, 45);
  }
  return NULL;
}

static int pipe_fds[2];
static void *writer(void *arg) {
  for (;;) {
    usleep(30000);
    if (write(pipe_fds[1], "x", 1) != 1)
      abort();
  }
  return NULL;
}
static void *reader(void *arg) {
  char c;
  for (;;)
    count(read(pipe_fds[0], &c, 1), 0, 0);
  return NULL;
}

static void *accepter(void *arg) {
  /* a second listening socket nobody connects to: accept blocks forever */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 1) != 0)
    abort();
  for (;;)
    count(accept(fd, NULL, NULL), 0, 0);
  return NULL;
}

static void *spinner(void *arg) {
  enum { N = 1 << 20 };
  char *src = malloc(N), *dst = malloc(N);
  for (long i = 0;; i++) {
    memset(src, (int)(i & 0x7f) + 1, N);
    memset(dst, 0, N);
    /* mostly inside the first instruction: four copies per check */
    long r = 0;
    for (int k = 0; k < 4; k++)
      r |= spin_copy(dst, src, 1, N);
    atomic_fetch_add(&spin_calls, 1);
    if (memcmp(dst, src, N) != 0 || r < 1 || r > 3)
      atomic_fetch_add(&spin_bad, 1);
    if (r & 2)
      atomic_fetch_add(&spin_new, 1);
  }
  return NULL;
}

/* $SERVER_SIGPARK: a thread copies with spin_copy() and is sent SIGUSR1
 * until the signal lands on spin_copy's first instruction; that handler
 * then stays (its frame on the stack holds spin_copy's first byte as the
 * ip to go back to) until the request "release".  "parked" answers 1 while
 * it stays. */
static atomic_int sig_parked, sig_release, sig_done;
static pthread_t sig_thread;

static void on_usr1(int sig, siginfo_t *si, void *ctx) {
  ucontext_t *uc = ctx;
  if (atomic_load(&sig_done) ||
      uc->uc_mcontext.gregs[REG_RIP] != (greg_t)(uintptr_t)spin_copy)
    return;
  atomic_store(&sig_parked, 1);
  while (!atomic_load(&sig_release)) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  atomic_store(&sig_parked, 0);
  atomic_store(&sig_done, 1);
}

static void *sig_copier(void *arg) {
  enum { N = 1 << 22 };
  char *src = malloc(N), *dst = malloc(N);
  for (long i = 0;; i++) {
    memset(src, (int)(i & 0x7f) + 1, N);
    long r = spin_copy(dst, src, 1, N);
    if (memcmp(dst, src, N) != 0 || r < 1 || r > 2)
      atomic_fetch_add(&spin_bad, 1);
  }
  return NULL;
}

static void *sig_sender(void *arg) {
  while (!atomic_load(&sig_parked) && !atomic_load(&sig_done)) {
    struct timespec ts = {0, 300000};
    nanosleep(&ts, NULL);
    pthread_kill(sig_thread, SIGUSR1);
  }
  return NULL;
}

/* The request "park" calls park_here(1), which waits inside (its return
 * address on the worker's stack) until the request "unpark": a function a
 * thread is inside, for --check-active.  "inside" answers 1 meanwhile. */
static atomic_int park_flag, park_inside;
__attribute__((noinline)) long park_here(long n) {
  atomic_store(&park_inside, 1);
  while (atomic_load(&park_flag)) {
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  atomic_store(&park_inside, 0);
  return n + 1;
}

/* Threads that come and go: each calls answer() once and exits, so
 * attaches meet threads created and ending while the others are stopped. */
static atomic_long churn_bad;
static void *short_lived(void *arg) {
  long a = answer(5);
  if (a != 10 && a != 15)
    atomic_fetch_add(&churn_bad, 1);
  return NULL;
}
static void *churner(void *arg) {
  for (;;) {
    pthread_t t;
    if (pthread_create(&t, NULL, short_lived, NULL) == 0)
      pthread_join(t, NULL);
  }
  return NULL;
}

#define SC_LOAD(field)                                                                   \
  BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, field))
#define SC_RET(v) BPF_STMT(BPF_RET | BPF_K, (v))
#define SC_EPERM (SECCOMP_RET_ERRNO | EPERM)
/* The request "guard-unmap": a filter, installed now (after an attach),
 * that kills the process on a munmap of the attach's staged code (found in
 * /proc/self/maps): a rollback must find out before it runs one.  "1" if
 * installed. */
static int guard_unmap(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  unsigned long long start = 0;
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, "molt-attach") && !start)
      start = strtoull(line, NULL, 16);
  if (f)
    fclose(f);
  if (!start)
    return 0;
  struct sock_filter guard[] = {
      SC_LOAD(arch),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      SC_RET(SECCOMP_RET_ALLOW),
      SC_LOAD(nr),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_munmap, 0, 5),
      SC_LOAD(args[0]),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)start, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]) + 4),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)(start >> 32), 0, 1),
      SC_RET(SECCOMP_RET_KILL_PROCESS),
      SC_RET(SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {sizeof guard / sizeof guard[0], guard};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC,
                 &prog) == 0;
}

static int may_mprotect_exec(void) {
  void *p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  int ok = p != MAP_FAILED && mprotect(p, 4096, PROT_READ | PROT_EXEC) == 0;
  if (p != MAP_FAILED)
    munmap(p, 4096);
  return ok;
}

static void serve(int c) {
  FILE *in = fdopen(c, "r");
  char line[128];
  while (in && fgets(line, sizeof line, in)) {
    char out[512];
    if (strlen(line) > 100) /* the program calls strlen: the patch may too */
      continue;
    if (strcmp(line, "park\n") == 0) {
      atomic_store(&park_flag, 1);
      snprintf(out, sizeof out, "%ld\n", park_here(1));
    } else if (strncmp(line, "unpark", 6) == 0) {
      atomic_store(&park_flag, 0);
      snprintf(out, sizeof out, "ok\n");
    } else if (strncmp(line, "guard-unmap", 11) == 0) {
      snprintf(out, sizeof out, "%d\n", guard_unmap());
    } else if (strncmp(line, "mprotect-exec", 13) == 0) {
      snprintf(out, sizeof out, "%d\n", may_mprotect_exec());
    } else if (strncmp(line, "inside", 6) == 0) {
      snprintf(out, sizeof out, "%d\n", atomic_load(&park_inside));
    } else if (strncmp(line, "vfork ", 6) == 0) {
      /* this thread waits in vfork (uninterruptible) while the child
       * sleeps N ms: a thread no stop can stop meanwhile */
      long ms = strtol(line + 6, NULL, 10);
      pid_t child = vfork();
      if (child == 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
        syscall(SYS_nanosleep, &ts, NULL);
        _exit(0);
      }
      snprintf(out, sizeof out, "%d\n", child > 0 ? 0 : -1);
    } else if (strncmp(line, "parked", 6) == 0)
      snprintf(out, sizeof out, "%d\n", atomic_load(&sig_parked));
    else if (strncmp(line, "release", 7) == 0) {
      atomic_store(&sig_release, 1);
      snprintf(out, sizeof out, "ok\n");
    } else if (strncmp(line, "stats", 5) == 0)
      snprintf(out, sizeof out,
               "eintr %ld early %ld spin %ld bad %ld new %ld branchy %ld "
               "tiny %ld churnbad %ld pre %ld post %ld presaw %ld postsaw %ld "
               "deepnap %ld pid %ld\n",
               atomic_load(&eintr_count), atomic_load(&early_count),
               atomic_load(&spin_calls), atomic_load(&spin_bad), atomic_load(&spin_new),
               branchy(3), tiny(), atomic_load(&churn_bad), cb_pre, cb_post, cb_pre_saw,
               cb_post_saw, atomic_load(&deep_naps), (long)getpid());
    else if (strncmp(line, "ask", 3) == 0)
      snprintf(out, sizeof out, "%ld\n", ask(strtol(line + 3, NULL, 10)));
    else if (strncmp(line, "deep", 4) == 0) {
      long n = 0, at = -1, ms = 0;
      sscanf(line + 4, "%ld %ld %ld", &n, &at, &ms);
      snprintf(out, sizeof out, "%ld\n", n >= 0 && n <= 100000 ? deep(n, at, ms) : -2);
    } else if (strncmp(line, "op", 2) == 0) {
      long k = 0, n = 0;
      sscanf(line + 2, "%ld %ld", &k, &n);
      snprintf(out, sizeof out, "%ld\n", k == 0 || k == 1 ? ops[k](n) : -2);
    } else if (strncmp(line, "reg ", 4) == 0) {
      snprintf(out, sizeof out, "%ld\n", setup(strtol(line + 4, NULL, 10)));
    } else if (strncmp(line, "call ", 5) == 0) {
      long k = -1, n = 0;
      sscanf(line + 5, "%ld %ld", &k, &n);
      struct handler *h = handler_slot(k);
      if (h && h->fn)
        snprintf(out, sizeof out, "%s %ld\n", h->label, h->fn(n));
      else
        snprintf(out, sizeof out, "none\n");
    } else if (strncmp(line, "drop ", 5) == 0) {
      struct handler *h = handler_slot(strtol(line + 5, NULL, 10));
      if (h)
        *h = (struct handler){NULL, NULL};
      snprintf(out, sizeof out, "ok\n");
    } else if (strncmp(line, "reap", 4) == 0) {
      int joined = 0;
      if (helper_stack) {
        joined = pthread_join(helper_thread, NULL) == 0;
        munmap(helper_stack, helper_stack_size);
        helper_stack = NULL;
      }
      snprintf(out, sizeof out, "%d\n", joined);
    } else if (strncmp(line, "hello", 5) == 0)
      snprintf(out, sizeof out, "hello %s\n", banner());
    else
      snprintf(out, sizeof out, "%ld\n", answer(strtol(line, NULL, 10)));
    size_t len = strlen(out), off = 0;
    while (off < len) {
      ssize_t k = write(c, out + off, len - off);
      if (k < 0 && errno == EINTR) {
        atomic_fetch_add(&eintr_count, 1);
        continue;
      }
      if (k <= 0)
        break;
      off += (size_t)k;
    }
  }
  if (in)
    fclose(in);
  else
    close(c);
}

static void *worker(void *arg) {
  for (;;) {
    int c = accept(listen_fd, NULL, NULL);
    if (c < 0) {
      if (errno == EINTR)
        atomic_fetch_add(&eintr_count, 1);
      continue;
    }
    serve(c);
  }
  return NULL;
}

/* $SERVER_SECCOMP: a seccomp filter on every thread, raw BPF --
 *   memfd     memfd_create refused with EPERM
 *   killexec  an executable mmap kills the process
 *   mdwe      what systemd's MemoryDenyWriteExecute=yes installs (mmap
 *             both writable and executable, mprotect or pkey_mprotect to
 *             executable: EPERM), and the kernel's PR_SET_MDWE too.
 * "mprotect-exec" answers whether the process may still make a page
 * executable (0: refused, as the filter wants). */
static int install_filter(const char *kind) {
  struct sock_filter memfd[] = {
      SC_LOAD(arch),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      SC_RET(SECCOMP_RET_ALLOW),
      SC_LOAD(nr),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_memfd_create, 0, 1),
      SC_RET(SC_EPERM),
      SC_RET(SECCOMP_RET_ALLOW),
  };
  struct sock_filter killexec[] = {
      SC_LOAD(arch),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      SC_RET(SECCOMP_RET_ALLOW),
      SC_LOAD(nr),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 0, 3),
      SC_LOAD(args[2]),
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 1),
      SC_RET(SECCOMP_RET_KILL_PROCESS),
      SC_RET(SECCOMP_RET_ALLOW),
  };
  struct sock_filter mdwe[] = {
      SC_LOAD(arch),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      SC_RET(SECCOMP_RET_ALLOW),
      SC_LOAD(nr),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 0, 4),
      SC_LOAD(args[2]),
      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, PROT_WRITE | PROT_EXEC),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PROT_WRITE | PROT_EXEC, 0, 6),
      SC_RET(SC_EPERM),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mprotect, 1, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pkey_mprotect, 0, 3),
      SC_LOAD(args[2]),
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 1),
      SC_RET(SC_EPERM),
      SC_RET(SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog;
  if (strcmp(kind, "memfd") == 0)
    prog = (struct sock_fprog){sizeof memfd / sizeof memfd[0], memfd};
  else if (strcmp(kind, "killexec") == 0)
    prog = (struct sock_fprog){sizeof killexec / sizeof killexec[0], killexec};
  else if (strcmp(kind, "mdwe") == 0)
    prog = (struct sock_fprog){sizeof mdwe / sizeof mdwe[0], mdwe};
  else
    return -1;
  if (strcmp(kind, "mdwe") == 0 && prctl(65 /* PR_SET_MDWE */, 1, 0, 0, 0) != 0)
    return -1;
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
                 prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0
             ? 0
             : -1;
}

int main(int argc, char **argv) {
  int workers = argc > 1 ? atoi(argv[1]) : 8;
  int spinners = argc > 2 ? atoi(argv[2]) : 0;
  int churners = argc > 3 ? atoi(argv[3]) : 0;
  ops[0] = shift;
  ops[1] = scale;
  handler_heap = calloc(4, sizeof *handler_heap);
  if (!handler_heap)
    return 1;
  /* $SERVER_HEAP_MB=N: N MiB of heap in 64 KiB blocks, every word written
   * (none a pointer): what a rollback's scan for pointers into the patch
   * reads */
  for (long i = 0; getenv("SERVER_HEAP_MB") && i < atol(getenv("SERVER_HEAP_MB")) * 16;
       i++) {
    uint64_t *block = malloc(64 << 10);
    if (!block)
      return 1;
    for (size_t k = 0; k < (64 << 10) / 8; k++)
      block[k] = (i * 8192 + k) * 0x9e3779b97f4a7c15ull;
  }
  /* $SERVER_RESERVE_GB=N: N GiB of address space reserved, one page of it
   * touched (a sanitizer's shadow, a runtime's heap cage) */
  if (getenv("SERVER_RESERVE_GB")) {
    size_t size = (size_t)atol(getenv("SERVER_RESERVE_GB")) << 30;
    char *r = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED)
      return 1;
    r[size / 2] = 1;
  }
  if (getenv("SERVER_MULTIPLIER"))
    multiplier = atol(getenv("SERVER_MULTIPLIER"));
  listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (getenv("SERVER_PTRACER_ANY")) /* Yama ptrace_scope 1: any process of its uid */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      listen(listen_fd, 64) != 0 ||
      getsockname(listen_fd, (struct sockaddr *)&a, &len) != 0)
    return 1;
  /* the workers, before any thread is created */
  int forks = getenv("SERVER_FORKS") ? atoi(getenv("SERVER_FORKS")) : 0;
  int index = 0;
  for (int i = 1; i <= forks; i++) {
    pid_t child = fork();
    if (child == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      index = i;
      break;
    }
  }
  if (pipe(pipe_fds) != 0)
    return 1;
  void *(*watchers[])(void *) = {sleeper, epoller, futexer, writer, reader, accepter};
  pthread_t t;
  for (size_t i = 0; i < sizeof watchers / sizeof watchers[0]; i++)
    pthread_create(&t, NULL, watchers[i], NULL);
  if (getenv("SERVER_SECCOMP") && install_filter(getenv("SERVER_SECCOMP")) != 0)
    return 2;
  if (syscall(SYS_io_setup, 4, &aio_ctx[0]) != 0 || syscall(SYS_io_setup, 4, &aio_ctx[1]))
    return 1;
  pthread_create(&t, NULL, aio_waiter, NULL);
  pthread_create(&t, NULL, aio_waiter, (void *)1);
  for (int i = 0; i < spinners; i++)
    pthread_create(&t, NULL, spinner, NULL);
  for (int i = 0; i < workers; i++)
    pthread_create(&t, NULL, worker, NULL);
  for (int i = 0; i < churners; i++)
    pthread_create(&t, NULL, churner, NULL);
  if (getenv("SERVER_PARK_WORKER") && atoi(getenv("SERVER_PARK_WORKER")) == index)
    pthread_create(&t, NULL, parker, NULL);
  if (getenv("SERVER_SIGPARK")) {
    struct sigaction sa = {.sa_sigaction = on_usr1, .sa_flags = SA_SIGINFO | SA_RESTART};
    sigaction(SIGUSR1, &sa, NULL);
    pthread_create(&sig_thread, NULL, sig_copier, NULL);
    pthread_create(&t, NULL, sig_sender, NULL);
  }
  if (index == 0) {
    printf("port %d\n", ntohs(a.sin_port));
    fflush(stdout);
  }
  if (getenv("SERVER_MAIN_EXITS")) /* the main thread ends, the others serve */
    pthread_exit(NULL);
  pause();
  return 0;
}
