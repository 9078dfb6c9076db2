/* A plainly built multi-threaded server for the attach tests (gcc -O2, no
 * molt, nothing preloaded).
 *
 *   server [WORKERS [SPINNERS [CHURNERS]]]
 *                      prints "port N" and serves 127.0.0.1:N: each line
 *                      "N" is answered by "<answer(N)>\n"; the line "stats"
 *                      by the counters of the watcher threads below.
 *
 * Watcher threads sit in blocking calls all the time -- read, accept,
 * nanosleep, epoll_wait, futex -- and count each EINTR and each sleep or
 * timeout that ended early: an attach's stop must cause neither.  Spinner
 * threads call spin_copy(), whose first instruction (rep movsb) runs long,
 * and check that its copy is whole; branchy() and tiny() are functions an
 * attach must refuse.  The line "hello" is answered by "hello <banner()>"
 * (a second function a stacked patch replaces); "stats" also reports the
 * counters the attach callbacks of the tests change (cb_*).
 *
 * $SERVER_FORKS=N: the process forks N workers after it listens (each
 * serves the same socket with its own threads, and dies with its master);
 * $SERVER_PARK_WORKER=K: worker K (1..N; 0 the master) has a thread parked
 * in pause() inside the first bytes of park(), which no attach of park()
 * can ever get past (the attach --all tests); $SERVER_PTRACER_ANY: any
 * process of its user may trace it (Yama's ptrace_scope 1). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
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

static void serve(int c) {
  FILE *in = fdopen(c, "r");
  char line[128];
  while (in && fgets(line, sizeof line, in)) {
    char out[256];
    if (strlen(line) > 100) /* the program calls strlen: the patch may too */
      continue;
    if (strncmp(line, "stats", 5) == 0)
      snprintf(out, sizeof out,
               "eintr %ld early %ld spin %ld bad %ld new %ld branchy %ld "
               "tiny %ld churnbad %ld pre %ld post %ld presaw %ld postsaw %ld "
               "pid %ld\n",
               atomic_load(&eintr_count), atomic_load(&early_count),
               atomic_load(&spin_calls), atomic_load(&spin_bad), atomic_load(&spin_new),
               branchy(3), tiny(), atomic_load(&churn_bad), cb_pre, cb_post, cb_pre_saw,
               cb_post_saw, (long)getpid());
    else if (strncmp(line, "ask", 3) == 0)
      snprintf(out, sizeof out, "%ld\n", ask(strtol(line + 3, NULL, 10)));
    else if (strncmp(line, "hello", 5) == 0)
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

int main(int argc, char **argv) {
  int workers = argc > 1 ? atoi(argv[1]) : 8;
  int spinners = argc > 2 ? atoi(argv[2]) : 0;
  int churners = argc > 3 ? atoi(argv[3]) : 0;
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
  for (int i = 0; i < spinners; i++)
    pthread_create(&t, NULL, spinner, NULL);
  for (int i = 0; i < workers; i++)
    pthread_create(&t, NULL, worker, NULL);
  for (int i = 0; i < churners; i++)
    pthread_create(&t, NULL, churner, NULL);
  if (getenv("SERVER_PARK_WORKER") && atoi(getenv("SERVER_PARK_WORKER")) == index)
    pthread_create(&t, NULL, parker, NULL);
  if (index == 0) {
    printf("port %d\n", ntohs(a.sin_port));
    fflush(stdout);
  }
  if (getenv("SERVER_MAIN_EXITS")) /* the main thread ends, the others serve */
    pthread_exit(NULL);
  pause();
  return 0;
}
