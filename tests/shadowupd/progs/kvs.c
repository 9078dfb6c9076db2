/* kvs: a small multi-threaded TCP key-value server for shadowed updates
 * (tests/shadowupd).  Every worker accepts its own connections on the
 * shared listening socket and serves each to its end, so no connection
 * passes between threads (the follower of a shadowed update compares each
 * thread's calls in that thread's order only, docs/design.md §17).
 *
 *   molt run kvs.so PORTFILE [WORKERS]
 *
 * With KVS_IO=vec in its environment it reads requests with recvmsg,
 * readv and recvfrom in turn (each worker) and replies to GET with writev,
 * to SET with sendmsg and to anything else with sendto, instead of recv
 * and send.
 * Requests, one line each: "SET k v" -> "OK", "GET k" -> "VALUE v" or
 * "NONE", "PING" -> "PONG", "NOW" -> "NOW" with the clocks' values and
 * random bytes, "WRITEV" -> "WV" sent with writev, "MMSG" -> "MM" sent with
 * sendmmsg (not followed: a follower's backstop ends it), "FDPASS" ->
 * "FDPASS ok" once a descriptor went through a socketpair with sendmsg
 * and came back with recvmsg (SCM_RIGHTS: a follower ends), "URING" ->
 * "URING fd" after opening an io_uring (kept open: a shadowed update is
 * then refused at the barrier; a negative fd is the kernel's -errno),
 * "HOLD" -> "HELD" once the file named by the environment's KVS_HOLD is
 * gone (the worker passes no update point meanwhile: a barrier times out).
 * With KVS_LOG=PATH it appends a line per accepted connection to PATH
 * with fprintf and fflush (libc's own write, which no wrapper sees).  Its
 * main reads the clock before it skips the start-up on an update, as
 * mosquitto's does (a follower's restarting thread makes that call itself:
 * the leader has none to compare it with).  With KVS_SIGMASK=1 each worker
 * blocks every signal (sigprocmask) around its poll, as mosquitto blocks
 * its own around epoll_wait, and yields the CPU (sched_yield, a call the
 * follower's backstop traps and lets through) while they are blocked.  Built with -DKVS_VARIANT=N for the versions a
 * test updates to: 1 answers "GET magic" differently, 2 crashes on "GET
 * crash", 3 sleeps a minute on "GET slow", 4 adds a field whose
 * transformer faults (kvs-fail.xf), 5 accepts a new command "INCR k" ->
 * "VALUE n" (which the others answer "ERROR"), 6 sends "PONG" in two
 * pieces ("PO", "NG\n") and answers nothing to "QUIET" (which the others
 * answer "ERROR"), 7 answers "GET magic" differently while the file named
 * by its environment's KVS_FLAKY exists (a divergence the test can make
 * go away between two attempts of a shadowed update: a stand-in for a
 * race that does not repeat), 8 has a migration hook that forgets the
 * values of every odd slot (a state transformation error that shows only
 * when such a key is read), 9 answers "GET magic" differently in a process
 * whose migration hook drew "unlucky" from its pid (about one follower in
 * two: a stand-in for an update timed badly, which a retry may escape;
 * bench/shadowupd/faults.py). */
#define _GNU_SOURCE
#include <errno.h>
#include <molt.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/io_uring.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef KVS_VARIANT
#define KVS_VARIANT 0
#endif

#define WORKERS_MAX 8
#define SLOTS 1024

struct worker {
  int conn;       /* the connection it serves, -1: none */
  size_t len;     /* bytes in buf */
  unsigned reads; /* KVS_IO=vec: which call reads next */
  char buf[4096]; /* a request line not complete yet */
};

struct slot {
  char key[64];
  char val[64];
#if KVS_VARIANT == 4
  int hits; /* new: its transformer (kvs-fail.xf) faults */
#endif
};

int listen_fd = -1;
FILE *log_file; /* KVS_LOG */
int sig_mask;   /* KVS_SIGMASK */
int nworkers;
int vec_io;                  /* KVS_IO=vec */
int pass_pair[2] = {-1, -1}; /* FDPASS: a unix socketpair made at the start */
struct worker workers[WORKERS_MAX];
struct slot store[SLOTS];
pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_t threads[WORKERS_MAX];

static unsigned hash(const char *s) {
  unsigned h = 5381;
  while (*s)
    h = h * 33 + (unsigned char)*s++;
  return h % SLOTS;
}

static void set(const char *k, const char *v) {
  pthread_mutex_lock(&store_lock);
  unsigned h = hash(k);
  for (unsigned i = 0; i < SLOTS; i++) {
    struct slot *s = &store[(h + i) % SLOTS];
    if (!s->key[0] || strcmp(s->key, k) == 0) {
      snprintf(s->key, sizeof s->key, "%s", k);
      snprintf(s->val, sizeof s->val, "%s", v);
      break;
    }
  }
  pthread_mutex_unlock(&store_lock);
}

#if KVS_VARIANT == 8
int molt_on_migrated(char *why, size_t len) {
  (void)why;
  (void)len;
  for (unsigned i = 1; i < SLOTS; i += 2)
    store[i].val[0] = '\0'; /* "forgot" to carry these values over */
  return 0;
}
#elif KVS_VARIANT == 9
static int unlucky; /* drawn once, by the migration hook */
int molt_on_migrated(char *why, size_t len) {
  (void)why;
  (void)len;
  unsigned x = (unsigned)getpid() * 2654435761u; /* Knuth's multiplicative hash */
  unlucky = (int)((x >> 16) & 1);
  return 0;
}
#endif

static int get(const char *k, char *out, size_t len) {
  int found = 0;
  pthread_mutex_lock(&store_lock);
  unsigned h = hash(k);
  for (unsigned i = 0; i < SLOTS; i++) {
    struct slot *s = &store[(h + i) % SLOTS];
    if (!s->key[0])
      break;
    if (strcmp(s->key, k) == 0) {
      snprintf(out, len, "%s", s->val);
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&store_lock);
  return found;
}

static int pass_fd(void);

/* One request line -> its reply. */
static void execute(char *line, char *reply, size_t len) {
  char *save = NULL; /* strtok_r: the workers parse at the same time */
  char *cmd = strtok_r(line, " ", &save), *k = strtok_r(NULL, " ", &save),
       *v = strtok_r(NULL, " ", &save);
  char val[64];
  if (cmd && strcmp(cmd, "PING") == 0) {
    snprintf(reply, len, "PONG\n");
  } else if (cmd && strcmp(cmd, "FDPASS") == 0) {
    snprintf(reply, len, pass_fd() == 0 ? "FDPASS ok\n" : "FDPASS failed\n");
  } else if (cmd && strcmp(cmd, "URING") == 0) {
    struct io_uring_params params;
    memset(&params, 0, sizeof params);
    long fd = syscall(SYS_io_uring_setup, 4, &params);
    snprintf(reply, len, "URING %ld\n", fd >= 0 ? fd : -(long)errno);
  } else if (cmd && strcmp(cmd, "HOLD") == 0) {
    const char *hold = getenv("KVS_HOLD");
    while (hold && access(hold, F_OK) == 0)
      usleep(10000);
    snprintf(reply, len, "HELD\n");
  } else if (cmd && strcmp(cmd, "NOW") == 0) {
    /* time and randomness: a follower gets the leader's (shadow/calls.c) */
    struct timespec ts;
    struct timeval tv;
    unsigned char rnd[8] = {0};
    clock_gettime(CLOCK_REALTIME, &ts);
    gettimeofday(&tv, NULL);
    long t = (long)time(NULL);
    ssize_t got = getrandom(rnd, sizeof rnd, 0);
    snprintf(reply, len,
             "NOW %ld.%09ld %ld.%06ld %ld %zd %02x%02x%02x%02x%02x%02x%02x%02x\n",
             (long)ts.tv_sec, ts.tv_nsec, (long)tv.tv_sec, (long)tv.tv_usec, t, got,
             rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
  } else if (cmd && k && v && strcmp(cmd, "SET") == 0) {
    set(k, v);
    snprintf(reply, len, "OK\n");
  } else if (cmd && k && strcmp(cmd, "GET") == 0) {
#if KVS_VARIANT == 1
    if (strcmp(k, "magic") == 0) {
      snprintf(reply, len, "VALUE changed-by-v2\n");
      return;
    }
#elif KVS_VARIANT == 2
    if (strcmp(k, "crash") == 0)
      *(volatile int *)(uintptr_t)8 = 1;
#elif KVS_VARIANT == 7
    const char *flag = getenv("KVS_FLAKY");
    if (strcmp(k, "magic") == 0 && flag && access(flag, F_OK) == 0) {
      snprintf(reply, len, "VALUE changed-by-v7\n");
      return;
    }
#elif KVS_VARIANT == 9
    if (strcmp(k, "magic") == 0 && unlucky) {
      snprintf(reply, len, "VALUE changed-by-v9\n");
      return;
    }
#elif KVS_VARIANT == 3
    if (strcmp(k, "slow") == 0)
      sleep(60); /* not a followed call: the follower falls behind */
#endif
    if (get(k, val, sizeof val))
      snprintf(reply, len, "VALUE %s\n", val);
    else
      snprintf(reply, len, "NONE\n");
#if KVS_VARIANT == 5
  } else if (cmd && k && strcmp(cmd, "INCR") == 0) {
    long n = get(k, val, sizeof val) ? atol(val) + 1 : 1;
    snprintf(val, sizeof val, "%ld", n);
    set(k, val);
    snprintf(reply, len, "VALUE %ld\n", n);
#endif
  } else {
    snprintf(reply, len, "ERROR\n");
  }
}

/* FDPASS: the socketpair's one end sent through itself (SCM_RIGHTS) and
 * received as a new descriptor, then closed. */
static int pass_fd(void) {
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } out, in;
  memset(&out, 0, sizeof out);
  memset(&in, 0, sizeof in);
  struct iovec one = {"x", 1};
  struct msghdr m = {.msg_iov = &one,
                     .msg_iovlen = 1,
                     .msg_control = out.buf,
                     .msg_controllen = sizeof out.buf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &pass_pair[0], sizeof(int));
  if (sendmsg(pass_pair[0], &m, 0) != 1)
    return -1;
  char got;
  struct iovec back = {&got, 1};
  struct msghdr r = {.msg_iov = &back,
                     .msg_iovlen = 1,
                     .msg_control = in.buf,
                     .msg_controllen = sizeof in.buf};
  if (recvmsg(pass_pair[1], &r, MSG_CMSG_CLOEXEC) != 1)
    return -1;
  struct cmsghdr *h = CMSG_FIRSTHDR(&r);
  int fd = -1;
  if (h && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
    memcpy(&fd, CMSG_DATA(h), sizeof fd);
  if (fd < 0)
    return -1;
  close(fd);
  return 0;
}

static void drop(struct worker *w) {
  close(w->conn);
  w->conn = -1;
  w->len = 0;
}

/* KVS_IO=vec: a read of the connection with recvmsg, readv or recvfrom
 * in turn, in two pieces (the second a quarter of the room). */
static ssize_t vec_read(struct worker *w) {
  char *at = w->buf + w->len;
  size_t room = sizeof w->buf - w->len, second = room / 4;
  struct iovec iov[2] = {{at, room - second}, {at + room - second, second}};
  struct sockaddr_storage from;
  socklen_t from_len = sizeof from;
  switch (w->reads++ % 3) {
  case 0: {
    char control[64];
    struct msghdr m = {.msg_name = &from,
                       .msg_namelen = sizeof from,
                       .msg_iov = iov,
                       .msg_iovlen = 2,
                       .msg_control = control,
                       .msg_controllen = sizeof control};
    return recvmsg(w->conn, &m, 0);
  }
  case 1:
    return readv(w->conn, iov, 2);
  default:
    return recvfrom(w->conn, at, room, 0, (struct sockaddr *)&from, &from_len);
  }
}

/* KVS_IO=vec: a reply with writev (GET), sendmsg (SET) or sendto, its
 * bytes in two pieces. */
static ssize_t vec_send(int fd, const char *req, const char *reply, size_t n) {
  struct iovec iov[2] = {{(void *)reply, n / 2}, {(void *)(reply + n / 2), n - n / 2}};
  if (strncmp(req, "GET ", 4) == 0)
    return writev(fd, iov, 2);
  if (strncmp(req, "SET ", 4) == 0) {
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
    return sendmsg(fd, &m, MSG_NOSIGNAL);
  }
  return sendto(fd, reply, n, MSG_NOSIGNAL, NULL, 0);
}

/* Reads what the connection has and answers every complete line. */
static void serve(struct worker *w) {
  ssize_t r =
      vec_io ? vec_read(w) : recv(w->conn, w->buf + w->len, sizeof w->buf - w->len, 0);
  if (r <= 0) {
    if (r == 0 || (errno != EAGAIN && errno != EINTR))
      drop(w);
    return;
  }
  w->len += (size_t)r;
  char *nl;
  while (w->conn >= 0 && (nl = memchr(w->buf, '\n', w->len))) {
    *nl = '\0';
    char reply[160];
    char req[16];
    snprintf(req, sizeof req, "%s", w->buf); /* execute() cuts the line up */
    if (strcmp(w->buf, "WRITEV") == 0) {
      struct iovec iov[2] = {{"W", 1}, {"V\n", 2}};
      if (writev(w->conn, iov, 2) != 3) {
        drop(w);
        return;
      }
      reply[0] = '\0';
    } else if (strcmp(w->buf, "MMSG") == 0) {
      /* a reply sent with a call shadowed updates do not wrap: a
       * follower's copy would send it again (its backstop ends it) */
      struct iovec iov[2] = {{"M", 1}, {"M\n", 2}};
      struct mmsghdr mm = {.msg_hdr = {.msg_iov = iov, .msg_iovlen = 2}};
      if (sendmmsg(w->conn, &mm, 1, MSG_NOSIGNAL) != 1 || mm.msg_len != 3) {
        drop(w);
        return;
      }
      reply[0] = '\0';
    } else {
      execute(w->buf, reply, sizeof reply);
    }
#if KVS_VARIANT == 6
    if (strcmp(w->buf, "QUIET") == 0)
      reply[0] = '\0';
    if (strcmp(reply, "PONG\n") == 0) {
      if (send(w->conn, "PO", 2, MSG_NOSIGNAL) != 2) {
        drop(w);
        return;
      }
      snprintf(reply, sizeof reply, "NG\n");
    }
#endif
    size_t n = strlen(reply);
    if (n && (vec_io ? vec_send(w->conn, req, reply, n)
                     : send(w->conn, reply, n, MSG_NOSIGNAL)) != (ssize_t)n) {
      drop(w);
      return;
    }
    size_t used = (size_t)(nl + 1 - w->buf);
    memmove(w->buf, nl + 1, w->len - used);
    w->len -= used;
  }
  if (w->len == sizeof w->buf)
    drop(w);
}

static void *worker_main(void *arg) {
  struct worker *w = &workers[(intptr_t)arg];
  for (;;) {
    molt_update_point("worker");
    struct pollfd p = {w->conn >= 0 ? w->conn : listen_fd, POLLIN, 0};
    sigset_t all, was;
    if (sig_mask) {
      sigfillset(&all);
      sigprocmask(SIG_BLOCK, &all, &was);
      sched_yield();
    }
    int ready = poll(&p, 1, 50);
    if (sig_mask)
      pthread_sigmask(SIG_SETMASK, &was, NULL);
    if (ready <= 0)
      continue;
    if (w->conn >= 0) {
      serve(w);
      continue;
    }
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      w->conn = fd;
      w->len = 0;
      if (log_file) {
        static _Atomic int logged;
        fprintf(log_file, "connection %d: worker %d, fd %d\n", ++logged,
                (int)(intptr_t)arg, fd);
        fflush(log_file);
      }
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  struct timeval started;
  gettimeofday(&started, NULL);
  srand((unsigned)(started.tv_sec ^ started.tv_usec));
  if (!molt_is_updating()) {
    if (argc < 2)
      return 2;
    nworkers = argc > 2 ? atoi(argv[2]) : 3;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pass_pair) != 0)
      return 3;
    const char *io = getenv("KVS_IO");
    vec_io = io && strcmp(io, "vec") == 0;
    sig_mask = getenv("KVS_SIGMASK") != NULL;
    const char *log_path = getenv("KVS_LOG");
    if (log_path && !(log_file = fopen(log_path, "a")))
      return 3;
    if (nworkers < 1 || nworkers > WORKERS_MAX)
      return 2;
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t alen = sizeof a;
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(listen_fd, 64) != 0 ||
        getsockname(listen_fd, (struct sockaddr *)&a, &alen))
      return 3;
    for (int i = 0; i < nworkers; i++) {
      workers[i].conn = -1;
      if (pthread_create(&threads[i], NULL, worker_main, (void *)(intptr_t)i) != 0)
        return 4;
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    FILE *f = fopen(tmp, "w");
    if (!f)
      return 5;
    fprintf(f, "%d\n", ntohs(a.sin_port));
    fclose(f);
    rename(tmp, argv[1]);
  }
  /* The main thread only passes update points; the workers serve. */
  for (;;) {
    molt_update_point("main");
    poll(NULL, 0, 50);
  }
  return 0;
}
