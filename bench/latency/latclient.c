/*
 * latclient.c — open-loop load client for the kvstore latency benchmark
 * (guarantee P8, the WFPATCH section 4.3 experiment).
 *
 *   latclient --port P[,P2,...] [--conns 8] [--rate 8000] [--duration 60]
 *             [--segment S --order I,J,...] [--start-ns T] [--keys 1000]
 *             [--get-ratio 0.9] [--value-size 32] [--drain 2] --out FILE
 *
 * Request i is due at  start + i / rate  (one fixed-rate stream, dealt
 * round-robin over the connections).
 *
 * Several servers: the client keeps --conns connections open to each, and
 * the stream goes to one server at a time: during segment k (due time in
 * [start + k*S, start + (k+1)*S)) to server order[k].  The benchmark runs
 * one server per policy this way, switching every few seconds, so that the
 * background noise of a shared machine falls on all policies alike.  It is sent when due whether or not
 * earlier replies on its connection have arrived (the protocol is
 * line-by-line, so requests simply pipeline), and its latency is measured
 * from the time it was *due*, not from when it went out.  That is what an
 * open-loop client sees and it avoids coordinated omission: a closed-loop
 * client that waits for each reply stops sending while the server stalls,
 * so a 50 ms stall costs it one slow sample instead of 50 ms worth of them.
 * The actual send time is kept as well, so the analysis can tell a late
 * server from a late client (on a 2-CPU machine the client shares the CPUs
 * with the server and with `molt apply`).
 *
 * One thread, one epoll set, absolute deadlines with nanosecond epoll
 * timeouts and 1 ns timer slack: the client must not add its own jitter to
 * the tail it is measuring.
 *
 * Output: FILE gets a 16-byte header ("MOLTLAT1", u64 count) followed by
 * `count` records (struct rec below, little endian); stdout gets a one-line
 * JSON summary.  All times are CLOCK_MONOTONIC nanoseconds, the same clock
 * as Python's time.monotonic_ns(), so the driver's patch-request
 * timestamps line up with these without any conversion.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Reply kinds checked per request: a broken server must not post a good
 * latency.  F_LOST: no reply by the end of the drain period. */
enum { F_SET = 1, F_ERR = 2, F_LOST = 4 };

struct rec {
  int64_t sched_ns; /* when the request was due            */
  int64_t send_ns;  /* when send() was called for it         */
  int64_t recv_ns;  /* when its reply line was read (0: lost) */
  uint32_t conn;    /* server index << 16 | connection index  */
  uint32_t flags;
};

/* Outstanding requests of one connection: replies come back in order, so a
 * FIFO of record indices matches each reply line to its request. */
#define FIFO_CAP 8192
#define IN_CAP 65536
#define OUT_CAP 65536

struct conn {
  int fd;
  uint32_t fifo[FIFO_CAP];
  unsigned head, tail; /* head: oldest outstanding */
  char in[IN_CAP];
  size_t inlen;
  char out[OUT_CAP]; /* bytes send() did not take yet (rare) */
  size_t outlen;
  int want_out;
};

#define MAX_SERVERS 16
#define MAX_SEGMENTS 100000
static int ports[MAX_SERVERS], nservers;
static int order[MAX_SEGMENTS], nsegments;
static int opt_conns = 8, opt_keys = 1000, opt_vsize = 32;
static double opt_rate = 8000, opt_duration = 60, opt_get_ratio = 0.9, opt_drain = 2;
static double opt_segment;
static int64_t opt_start_ns, start_ns, segment_ns;
static const char *opt_out;

static struct conn *conns; /* nservers * opt_conns, server-major */
static struct rec *recs;
static uint64_t nrecs;
static int epfd;
static uint64_t n_err, n_done, n_fifo_full;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void die(const char *what) {
  fprintf(stderr, "latclient: %s: %s\n", what, strerror(errno));
  exit(1);
}

static uint64_t rnd_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64: cheap and good enough for keys */
  rnd_state ^= rnd_state << 13;
  rnd_state ^= rnd_state >> 7;
  rnd_state ^= rnd_state << 17;
  return rnd_state;
}

static int connect_server(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    die("socket");
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
    die("connect");
  int one = 1;
  /* Small request lines must go out at once, not wait for Nagle. */
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static void blocking_write(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      die("send (prefill)");
    p += w;
    n -= (size_t)w;
  }
}

/* Fills every key once before the measurement, so GETs hit from the first
 * request on and the workload is the same in every run. */
static void prefill(int fd) {
  char val[1024];
  memset(val, 'v', (size_t)opt_vsize);
  val[opt_vsize] = 0;
  char line[1200];
  for (int k = 0; k < opt_keys; k++) {
    int n = snprintf(line, sizeof line, "SET key:%d %s\r\n", k, val);
    blocking_write(fd, line, (size_t)n);
  }
  /* One "OK" per key; count newlines. */
  int got = 0;
  char buf[4096];
  while (got < opt_keys) {
    ssize_t r = recv(fd, buf, sizeof buf, 0);
    if (r <= 0)
      die("recv (prefill)");
    for (ssize_t i = 0; i < r; i++)
      got += buf[i] == '\n';
  }
}

static void set_events(struct conn *c, int idx) {
  struct epoll_event ev = {.events = EPOLLIN | (c->want_out ? EPOLLOUT : 0),
                           .data.u32 = (uint32_t)idx};
  if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0)
    die("epoll_ctl");
}

static void flush_out(struct conn *c, int idx) {
  while (c->outlen) {
    ssize_t w = send(c->fd, c->out, c->outlen, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (w <= 0)
      die("send");
    memmove(c->out, c->out + w, c->outlen - (size_t)w);
    c->outlen -= (size_t)w;
  }
  int want = c->outlen > 0;
  if (want != c->want_out) {
    c->want_out = want;
    set_events(c, idx);
  }
}

static int server_of(int64_t sched) {
  if (nsegments == 0)
    return 0;
  int64_t k = (sched - start_ns) / segment_ns;
  return order[k < nsegments ? k : nsegments - 1];
}

static void send_request(uint64_t i) {
  struct rec *r = &recs[i];
  int srv = server_of(r->sched_ns);
  int ci = (int)(i % (uint64_t)opt_conns);
  int idx = srv * opt_conns + ci;
  struct conn *c = &conns[idx];
  r->conn = (uint32_t)srv << 16 | (uint32_t)ci;
  if (c->tail - c->head >= FIFO_CAP || c->outlen + 1200 > OUT_CAP) {
    /* Far past saturation; never expected below it.  Count it as lost. */
    n_fifo_full++;
    r->flags |= F_LOST;
    r->send_ns = now_ns();
    return;
  }
  int key = (int)(rnd() % (uint64_t)opt_keys);
  int is_get = (double)(rnd() >> 11) * 0x1.0p-53 < opt_get_ratio;
  char *p = c->out + c->outlen;
  int n;
  if (is_get) {
    n = snprintf(p, 64, "GET key:%d\r\n", key);
  } else {
    n = snprintf(p, 64, "SET key:%d ", key);
    memset(p + n, 'w', (size_t)opt_vsize);
    n += opt_vsize;
    p[n++] = '\r';
    p[n++] = '\n';
    r->flags |= F_SET;
  }
  c->outlen += (size_t)n;
  c->fifo[c->tail++ % FIFO_CAP] = (uint32_t)i;
  r->send_ns = now_ns();
  flush_out(c, idx);
}

/* Checks the kind of a reply: GET -> VALUE.../NOT_FOUND (1.2 answers
 * "VALUE <len> v", so only the prefix is checked), SET -> OK. */
static int reply_ok(const char *line, size_t len, uint32_t flags) {
  if (flags & F_SET)
    return len >= 2 && !memcmp(line, "OK", 2);
  return (len >= 6 && !memcmp(line, "VALUE ", 6)) ||
         (len >= 9 && !memcmp(line, "NOT_FOUND", 9));
}

static void read_replies(struct conn *c) {
  for (;;) {
    ssize_t r = recv(c->fd, c->in + c->inlen, IN_CAP - c->inlen, MSG_DONTWAIT);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (r == 0) {
      fprintf(stderr, "latclient: server closed a connection\n");
      exit(1);
    }
    if (r < 0)
      die("recv");
    /* One timestamp per read: every reply line in this chunk arrived by
     * now.  (Several lines in one chunk means they arrived together.) */
    int64_t t = now_ns();
    c->inlen += (size_t)r;
    size_t start = 0;
    for (size_t i = 0; i < c->inlen; i++) {
      if (c->in[i] != '\n')
        continue;
      size_t len = i - start;
      if (len && c->in[start + len - 1] == '\r')
        len--;
      if (c->head == c->tail) {
        fprintf(stderr, "latclient: reply without a request\n");
        exit(1);
      }
      struct rec *q = &recs[c->fifo[c->head++ % FIFO_CAP]];
      q->recv_ns = t;
      if (!reply_ok(c->in + start, len, q->flags)) {
        q->flags |= F_ERR;
        if (n_err++ < 5)
          fprintf(stderr, "latclient: unexpected reply: %.*s\n", (int)len, c->in + start);
      }
      n_done++;
      start = i + 1;
    }
    memmove(c->in, c->in + start, c->inlen - start);
    c->inlen -= start;
    if (c->inlen == IN_CAP) {
      fprintf(stderr, "latclient: reply line too long\n");
      exit(1);
    }
  }
}

/* "1,2,3" -> ints; returns how many (exits on garbage or overflow). */
static int parse_list(const char *s, int *out, int max) {
  int n = 0;
  while (*s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || n == max || (*end && *end != ','))
      return -1;
    out[n++] = (int)v;
    s = *end ? end + 1 : end;
  }
  return n;
}

static void usage(void) {
  fprintf(
      stderr,
      "usage: latclient --port P[,P2...] --out FILE [--conns 8] [--rate 8000]\n"
      "                 [--duration 60] [--segment S --order I,J,...] [--start-ns T]\n"
      "                 [--keys 1000] [--get-ratio 0.9] [--value-size 32] [--drain 2]\n");
  exit(2);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (i + 1 >= argc)
      usage();
    const char *v = argv[++i];
    if (!strcmp(a, "--port"))
      nservers = parse_list(v, ports, MAX_SERVERS);
    else if (!strcmp(a, "--order"))
      nsegments = parse_list(v, order, MAX_SEGMENTS);
    else if (!strcmp(a, "--segment"))
      opt_segment = atof(v);
    else if (!strcmp(a, "--conns"))
      opt_conns = atoi(v);
    else if (!strcmp(a, "--rate"))
      opt_rate = atof(v);
    else if (!strcmp(a, "--duration"))
      opt_duration = atof(v);
    else if (!strcmp(a, "--start-ns"))
      opt_start_ns = strtoll(v, NULL, 10);
    else if (!strcmp(a, "--keys"))
      opt_keys = atoi(v);
    else if (!strcmp(a, "--get-ratio"))
      opt_get_ratio = atof(v);
    else if (!strcmp(a, "--value-size"))
      opt_vsize = atoi(v);
    else if (!strcmp(a, "--drain"))
      opt_drain = atof(v);
    else if (!strcmp(a, "--out"))
      opt_out = v;
    else
      usage();
  }
  if (nservers < 1 || !opt_out || opt_conns < 1 || opt_conns > 65535 || opt_rate <= 0 ||
      opt_duration <= 0 || opt_keys < 1 || opt_vsize < 1 || opt_vsize > 1000 ||
      nsegments < 0 || (nservers > 1 && (nsegments < 1 || opt_segment <= 0)))
    usage();
  for (int k = 0; k < nsegments; k++)
    if (order[k] < 0 || order[k] >= nservers)
      usage();

  /* Default 50 us timer slack would be added to every wake-up. */
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);

  nrecs = (uint64_t)(opt_rate * opt_duration);
  recs = calloc(nrecs ? nrecs : 1, sizeof *recs);
  conns = calloc((size_t)(nservers * opt_conns), sizeof *conns);
  if (!recs || !conns)
    die("calloc");
  /* Touch every page of the records now (calloc gives untouched zero
   * pages): otherwise the measurement itself takes a page fault every 128
   * requests.  mlockall keeps them resident; it needs privileges, so it is
   * only an attempt. */
  memset(recs, 0, (nrecs ? nrecs : 1) * sizeof *recs);
  (void)mlockall(MCL_CURRENT | MCL_FUTURE);
  epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0)
    die("epoll_create1");
  for (int i = 0; i < nservers * opt_conns; i++) {
    conns[i].fd = connect_server(ports[i / opt_conns]);
    if (i % opt_conns == 0)
      prefill(conns[i].fd);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, conns[i].fd, &ev) < 0)
      die("epoll_ctl");
  }

  int64_t start = opt_start_ns ? opt_start_ns : now_ns() + 200000000;
  start_ns = start;
  segment_ns = (int64_t)(opt_segment * 1e9);
  double period = 1e9 / opt_rate;
  for (uint64_t i = 0; i < nrecs; i++)
    recs[i].sched_ns = start + (int64_t)((double)i * period);
  int64_t end = start + (int64_t)(opt_duration * 1e9);
  int64_t drain_deadline = end + (int64_t)(opt_drain * 1e9);

  uint64_t next = 0;
  struct epoll_event evs[64];
  for (;;) {
    int64_t t = now_ns();
    /* Send everything that is due.  If the client was descheduled, the
     * overdue requests go out now and their latency still counts from
     * their due time. */
    while (next < nrecs && recs[next].sched_ns <= t)
      send_request(next++);
    if (next >= nrecs && (n_done + n_fifo_full >= nrecs || t >= drain_deadline))
      break;
    int64_t until = next < nrecs ? recs[next].sched_ns : drain_deadline;
    int64_t wait = until - now_ns();
    if (wait < 0)
      wait = 0;
    struct timespec ts = {.tv_sec = wait / 1000000000, .tv_nsec = wait % 1000000000};
    int n = epoll_pwait2(epfd, evs, 64, &ts, NULL);
    if (n < 0 && errno != EINTR)
      die("epoll_pwait2");
    for (int k = 0; k < n; k++) {
      int idx = (int)evs[k].data.u32;
      if (evs[k].events & EPOLLOUT)
        flush_out(&conns[idx], idx);
      if (evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
        read_replies(&conns[idx]);
    }
  }

  uint64_t lost = 0;
  int64_t max_lag = 0;
  for (uint64_t i = 0; i < nrecs; i++) {
    if (!recs[i].recv_ns)
      recs[i].flags |= F_LOST;
    lost += (recs[i].flags & F_LOST) != 0;
    int64_t lag = recs[i].send_ns - recs[i].sched_ns;
    if (lag > max_lag)
      max_lag = lag;
  }

  FILE *f = fopen(opt_out, "wb");
  if (!f)
    die(opt_out);
  uint64_t count = nrecs;
  if (fwrite("MOLTLAT1", 1, 8, f) != 8 || fwrite(&count, sizeof count, 1, f) != 1 ||
      fwrite(recs, sizeof *recs, nrecs, f) != nrecs || fclose(f) != 0)
    die("write");

  printf("{\"requests\": %llu, \"completed\": %llu, \"errors\": %llu, \"lost\": %llu, "
         "\"start_ns\": %lld, \"end_ns\": %lld, \"rate\": %g, \"conns\": %d, "
         "\"servers\": %d, "
         "\"max_send_lag_us\": %.1f}\n",
         (unsigned long long)nrecs, (unsigned long long)n_done, (unsigned long long)n_err,
         (unsigned long long)lost, (long long)start, (long long)end, opt_rate, opt_conns,
         nservers, (double)max_lag / 1e3);
  return n_err || lost ? 1 : 0;
}
