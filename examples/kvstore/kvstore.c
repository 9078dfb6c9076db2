/*
 * kvstore.c — a multi-threaded TCP key-value server, the live-update demo
 * program of molt.
 *
 *   kvstore [--port N] [--threads N] [--buckets N]
 *
 * Binds 127.0.0.1 only.  --port 0 picks a free port; the server then prints
 * "listening on 127.0.0.1:PORT" on stdout (flushed), which is how scripts
 * find it.  SIGINT/SIGTERM shut it down cleanly (exit status 0).
 *
 * Threads: the main thread accepts; N workers service connections through
 * one epoll set with EPOLLONESHOT, so any worker may serve any connection
 * but never two workers the same one.  Connections stay open for as long as
 * the client wants, in particular across live patches of the command layer.
 */
#define _GNU_SOURCE /* accept4 */
#include "kv.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <poll.h>
#include <unistd.h>
#include <arpa/inet.h>

/*
 * Update points for molt's `local` and `global` policies (guarantees H3, H4).
 * Nothing else in this file knows about molt: updatable functions are marked
 * in kv_commands.c, and threads register themselves on their first call.
 *
 * The calls are weak references bound by asm label to the runtime's symbols,
 * so the same source builds and runs as a plain gcc program (no libmolt: the
 * addresses are NULL and the calls are skipped) and with a runtime that does
 * not provide them (yet).  Private C names keep these declarations
 * independent of however molt.h declares the functions.
 *
 * Where they are called, and why there:
 *   quiesce:      by a worker right after epoll_wait() returns, before it
 *                 touches a connection.  Under `local` a worker thus serves
 *                 every request with the generation current when it picked
 *                 the request up, so the replies of one connection (which
 *                 may move between workers) never go back to an older
 *                 version once a newer one answered.
 *   update point: by every thread once per loop; the waits time out after
 *                 UPDATE_POINT_MS so that idle threads reach their update
 *                 point too and a `global` patch is not held up by them.
 */
extern void kv_molt_quiesce(void) __asm__("molt_quiesce") __attribute__((weak));
extern void kv_molt_update_point(const char *name) __asm__("molt_update_point")
    __attribute__((weak));
extern void kv_molt_on_update_pending(void (*cb)(void *),
                                      void *arg) __asm__("molt_on_update_pending")
    __attribute__((weak));
#define UPDATE_POINT_MS 100

/* A global update wakes every thread at once through this eventfd (in the
 * workers' epoll set and the accept loop's poll set) instead of waiting for
 * their timeouts.  It is a semaphore holding one token per thread: a thread
 * that is woken by it takes exactly one token, so no thread can swallow the
 * wake-up meant for another one that is still asleep.  Tokens left over by
 * threads that reached their update point without sleeping only cause one
 * spurious wake-up each. */
static int wakefd = -1;
static char wake_marker;
static long wake_tokens = 1; /* threads that may sleep: workers + acceptor */

static void wake_for_update(void *arg) {
  (void)arg;
  uint64_t n = (uint64_t)wake_tokens;
  if (write(wakefd, &n, sizeof n) < 0) {
    /* EAGAIN: the counter is saturated, everybody will wake anyway */
  }
}

static void take_wake_token(void) {
  uint64_t v;
  if (read(wakefd, &v, sizeof v) < 0) {
    /* EAGAIN: another thread took the last token */
  }
}

static void update_point(const char *where) {
  if (kv_molt_update_point)
    kv_molt_update_point(where);
}

static int wait_timeout_ms(void) { return kv_molt_update_point ? UPDATE_POINT_MS : -1; }

atomic_long kv_active_connections;

static int epfd = -1;
/* Written by the signal handler, watched by the accept loop and every
 * worker (level-triggered, never reset: once stopping, always stopping). */
static int stopfd = -1;
static atomic_int stopping;

static void on_signal(int sig) {
  (void)sig;
  uint64_t one = 1;
  int saved = errno; /* the handler must not clobber the interrupted errno */
  atomic_store(&stopping, 1);
  if (write(stopfd, &one, sizeof one) < 0) {
    /* nothing useful to do in a signal handler */
  }
  errno = saved;
}

static void usage(FILE *f) {
  fprintf(f, "usage: kvstore [--port N] [--threads N] [--buckets N]\n"
             "  --port N     TCP port on 127.0.0.1 (0: pick a free one; default 7070)\n"
             "  --threads N  worker threads (default 4)\n"
             "  --buckets N  hash buckets (default 65536)\n");
}

static long parse_num(const char *opt, const char *s, long lo, long hi) {
  char *end;
  errno = 0;
  long v = strtol(s ? s : "", &end, 10);
  if (!s || !*s || *end || errno || v < lo || v > hi) {
    fprintf(stderr, "kvstore: %s needs a number between %ld and %ld\n", opt, lo, hi);
    exit(2);
  }
  return v;
}

static void *worker_main(void *arg) {
  (void)arg;
  for (;;) {
    struct epoll_event ev;
    update_point("worker");
    int n = epoll_wait(epfd, &ev, 1, wait_timeout_ms());
    if (n < 0) {
      if (errno == EINTR)
        continue;
      perror("kvstore: epoll_wait");
      return NULL;
    }
    if (n == 0)
      continue;
    if (ev.data.ptr == NULL) /* the stop eventfd */
      return NULL;
    if (ev.data.ptr == &wake_marker) { /* a global update is waiting for us */
      take_wake_token();
      continue;
    }
    if (kv_molt_quiesce)
      kv_molt_quiesce();
    if (kv_conn_service(ev.data.ptr, epfd))
      atomic_fetch_sub(&kv_active_connections, 1);
  }
}

int main(int argc, char **argv) {
  long port = 7070, nthreads = 4, nbuckets = 65536;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--port")) {
      port = parse_num(a, v, 0, 65535);
      i++;
    } else if (!strcmp(a, "--threads")) {
      nthreads = parse_num(a, v, 1, 1024);
      i++;
    } else if (!strcmp(a, "--buckets")) {
      nbuckets = parse_num(a, v, 1, 1L << 26);
      i++;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "kvstore: unknown option %s\n", a);
      usage(stderr);
      return 2;
    }
  }

  struct kv_store *store = kv_store_new((size_t)nbuckets, 1024);
  if (!store) {
    fprintf(stderr, "kvstore: out of memory\n");
    return 1;
  }

  stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epfd = epoll_create1(EPOLL_CLOEXEC);
  if (stopfd < 0 || epfd < 0) {
    perror("kvstore: eventfd/epoll");
    return 1;
  }
  /* Not ONESHOT: every worker must see it. data.ptr NULL marks it. */
  struct epoll_event sev = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(epfd, EPOLL_CTL_ADD, stopfd, &sev);
  wake_tokens = nthreads + 1;
  wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE);
  struct epoll_event wev = {.events = EPOLLIN, .data.ptr = &wake_marker};
  if (wakefd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, wakefd, &wev) < 0) {
    perror("kvstore: eventfd");
    return 1;
  }
  if (kv_molt_on_update_pending)
    kv_molt_on_update_pending(wake_for_update, NULL);

  /* No SA_RESTART: poll() in the accept loop returns EINTR; the eventfd
   * covers a signal that arrives just before poll() starts. */
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0) {
    perror("kvstore: socket");
    return 1;
  }
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 512) < 0) {
    fprintf(stderr, "kvstore: cannot listen on 127.0.0.1:%ld: %s\n", port,
            strerror(errno));
    return 1;
  }
  socklen_t alen = sizeof addr;
  getsockname(lfd, (struct sockaddr *)&addr, &alen);

  pthread_t *workers = calloc((size_t)nthreads, sizeof *workers);
  for (long i = 0; i < nthreads; i++) {
    int err = pthread_create(&workers[i], NULL, worker_main, NULL);
    if (err) {
      fprintf(stderr, "kvstore: pthread_create: %s\n", strerror(err));
      return 1;
    }
  }

  printf("listening on 127.0.0.1:%u\n", ntohs(addr.sin_port));
  fflush(stdout);
  fprintf(stderr, "kvstore: pid %d, %ld worker threads, command layer %s\n",
          (int)getpid(), nthreads, kv_version_string());

  unsigned long next_id = 1;
  while (!atomic_load(&stopping)) {
    struct pollfd pfd[3] = {{.fd = lfd, .events = POLLIN},
                            {.fd = stopfd, .events = POLLIN},
                            {.fd = wakefd, .events = POLLIN}};
    update_point("accept");
    if (poll(pfd, 3, wait_timeout_ms()) < 0) {
      if (errno == EINTR)
        continue;
      perror("kvstore: poll");
      break;
    }
    if (pfd[1].revents)
      break;
    if (pfd[2].revents & POLLIN)
      take_wake_token();
    if (!(pfd[0].revents & POLLIN))
      continue;
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      /* EMFILE and friends: the client sees a refused connection; keep
       * serving everyone else. */
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
        perror("kvstore: accept");
      if (errno == EMFILE || errno == ENFILE)
        usleep(10000);
      continue;
    }
    /* Request/reply protocol: do not let Nagle hold back small replies. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct kv_conn *c = kv_conn_new(fd, store, next_id++);
    if (!c) {
      close(fd);
      continue;
    }
    atomic_fetch_add(&kv_active_connections, 1);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = c};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
      perror("kvstore: epoll_ctl(ADD)");
      kv_conn_free(c);
      atomic_fetch_sub(&kv_active_connections, 1);
    }
  }

  fprintf(stderr, "kvstore: shutting down\n");
  close(lfd);
  for (long i = 0; i < nthreads; i++)
    pthread_join(workers[i], NULL);
  free(workers);
  /* Connections still open are simply dropped by exit (their sockets close);
   * the store is freed to keep leak checkers quiet. */
  kv_store_free(store);
  return 0;
}
