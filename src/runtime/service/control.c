/*
 * control.c -- the control socket server.
 *
 * Runs only on the runtime thread: the runtime's event loop polls the
 * listening socket and every client this server holds (the poll entries
 * come from molt__control_poll_prepare) and calls molt__control_poll_done
 * after each poll.  One connection carries one request and one response
 * (docs/protocol.md); the request is carried out by molt__execute, right
 * here on the runtime thread, the one path of every request (request.c).
 *
 * The runtime thread also performs updates and reclamation, so no client
 * may hold it (docs/security.md):
 *   - Peer credentials are checked at accept, before a byte is read.  A
 *     client of another uid (not the owner, not root) is refused there and
 *     then: at most one non-blocking send of the refusal, then close.  It
 *     never gets a slot, so it cannot hold anything.  The refusal is
 *     answered with a message at most DENY_ANSWERS_PER_S times a second per
 *     uid; beyond that the connection is just closed.
 *   - Refusals are counted per uid (DENY_UIDS of them, the rest together):
 *     the first is a `denied` log entry, later ones are summed up in one
 *     entry per uid at most every DENY_LOG_MS, and `molt status` shows the
 *     counts.  A flood of connections therefore adds a bounded number of
 *     lines to the log ring and to $MOLT_LOG_FILE (log.c keeps `denied`
 *     entries out of the ring of update history).
 *   - An admitted client (owner or root) gets one of SLOTS slots: its
 *     socket is non-blocking and the slot is a small state machine
 *     (reading the request, writing the response), each phase with its own
 *     deadline of MOLT__PROTO_SERVER_IO_MS, driven by the runtime's poll.
 *     A client that sends half a frame holds its own slot until its
 *     deadline, nothing else; a new admitted client that finds every slot
 *     taken evicts the oldest one still reading its request, so the owner's
 *     next request always gets through.
 *   - The request is bounded to 64 KiB before anything is allocated.
 *
 * The host may close any of the runtime's descriptors and reuse the
 * numbers (base.h, "descriptors the host may close"): the listener is
 * checked before accept, a client's socket before each recv and send, so
 * nothing ever reads or writes a socket of the host.
 *
 * All state here belongs to the runtime thread (no lock); status.c reads
 * the refusal counts from the same thread (molt__execute runs there).  In
 * a forked child molt__control_after_fork_child drops the parent's clients.
 *
 * Like all runtime code this never prints, exits or aborts; failures of a
 * single connection are answered (best effort) and logged, never fatal.
 */
#include "service/service.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define ERRLEN 1024
#define NS_PER_MS 1000000u
/* Connections taken from the listener per wake-up: a flood of refused
 * connections is worked off in batches between the runtime's other work. */
#define ACCEPT_BATCH 64
/* Refusals answered with a message per uid and second (a burst of as many
 * at once); the others are closed without a word. */
#define DENY_ANSWERS_PER_S 20
/* uids whose refusals are counted one by one; the rest share one count. */
#define DENY_UIDS 8
/* A uid's refusals are summed up in the log at most this often. */
#define DENY_LOG_MS 60000

/* ---- the listener ------------------------------------------------------------*/

/* Binds and listens on the abstract name `name` (without its NUL); on
 * failure *why is the errno. */
static int listen_on(const char *name, molt__fd *out, int *why) {
  /* NONBLOCK on the listener: if a client gives up between the runtime's
   * poll and our accept, accept4 must return EAGAIN rather than block the
   * runtime thread until the next client arrives. */
  *out = (molt__fd)MOLT__FD_NONE;
  *why = 0;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return molt__from_errno(*why = errno);
  /* Out of the host's way (fd.c) before anything else happens to it. */
  molt__fd l;
  int rc = molt__fd_keep(&l, fd);
  if (rc < 0)
    return rc;
  struct sockaddr_un sa;
  socklen_t len = molt__proto_sockaddr_named(name, &sa);
  if (bind(l.fd, (struct sockaddr *)&sa, len) < 0 || listen(l.fd, 64) < 0) {
    *why = errno;
    molt__fd_close(&l);
    return molt__from_errno(*why);
  }
  /* Kept anew: its identity now includes its name. */
  return molt__fd_keep(out, l.fd);
}

int molt__control_listen(molt__fd *out, char *name, size_t namelen) {
  char primary[sizeof((struct sockaddr_un *)0)->sun_path];
  molt__proto_socket_name(getpid(), NULL, primary, sizeof primary);
  int why;
  int rc = listen_on(primary, out, &why);
  if (rc == 0 || why != EADDRINUSE) {
    snprintf(name, namelen, "%s", primary);
    return rc;
  }
  /* Another socket has our name: a squatter (any local user can bind any
   * abstract name), a second runtime in this process, or our own old
   * listener that the host closed while something still holds it.  A name
   * nobody can guess instead: "molt.<pid>.<64 random bits>", which the CLI
   * finds among the listening sockets (/proc/net/unix) and accepts only if
   * the kernel says it is served by the pid it wants (docs/protocol.md). */
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
    r = molt__now_ns() ^ ((uint64_t)molt__gettid() << 32) ^ (uint64_t)(uintptr_t)&r;
  char suffix[24];
  snprintf(suffix, sizeof suffix, "%016" PRIx64, r);
  char fallback[sizeof primary];
  molt__proto_socket_name(getpid(), suffix, fallback, sizeof fallback);
  rc = listen_on(fallback, out, &why);
  snprintf(name, namelen, "%s", rc == 0 ? fallback : primary);
  return rc;
}

/* ---- responses ---------------------------------------------------------------*/

/* Writes "error\t<msg>\n" (msg escaped) into dst without allocating, so an
 * error can be reported even when memory has run out.  Returns the length. */
static size_t error_record(char *dst, size_t cap, const char *msg) {
  static const char key[] = "error\t";
  size_t n = sizeof key - 1;
  memcpy(dst, key, n);
  /* Leave room for one escape pair and the final newline. */
  for (const char *p = msg; *p != '\0' && n + 3 < cap; p++) {
    char c = *p;
    if (c == '\\' || c == '\t' || c == '\n') {
      dst[n++] = '\\';
      c = c == '\t' ? 't' : c == '\n' ? 'n' : '\\';
    }
    dst[n++] = c;
  }
  dst[n++] = '\n';
  return n;
}

#define HEAD_MAX (MOLT__PROTO_HDR_SIZE + 2 * ERRLEN + 16)

/* The header and error record of a response (into head, HEAD_MAX bytes)
 * for a body of body_len bytes.  Returns the length. */
static size_t response_head(unsigned char *head, int status, const char *errmsg,
                            size_t body_len) {
  size_t rec_len = 0;
  if (status != 0)
    rec_len = error_record(
        (char *)head + MOLT__PROTO_HDR_SIZE, HEAD_MAX - MOLT__PROTO_HDR_SIZE,
        errmsg != NULL && errmsg[0] != '\0' ? errmsg : molt_strerror(status));
  molt__frame_hdr h = {.magic = MOLT__PROTO_MAGIC,
                       .version = MOLT__PROTO_VERSION,
                       .kind = 0,
                       .status = status,
                       .length = (uint32_t)(rec_len + body_len)};
  molt__proto_encode_hdr(&h, head);
  return MOLT__PROTO_HDR_SIZE + rec_len;
}

/* One non-blocking send of a short answer to a client we are about to
 * close (a refusal, an eviction).  Best effort: a full socket buffer or a
 * vanished client just loses it. */
static void answer_once(const molt__fd *c, int status, const char *errmsg) {
  unsigned char head[HEAD_MAX];
  size_t n = response_head(head, status, errmsg, 0);
  if (molt__fd_ours(c)) {
    ssize_t w = send(c->fd, head, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)w;
  }
}

/* ---- slots -------------------------------------------------------------------*/

typedef enum { SLOT_FREE, SLOT_READING, SLOT_WRITING } slot_state;

typedef struct slot {
  slot_state state;
  molt__fd fd;
  /* The file of an apply or update comes open with the request
   * (SCM_RIGHTS): the runtime never resolves a path a client names.  Kept
   * like any runtime descriptor (fd.c) from its arrival; closed by
   * slot_free on every path. */
  molt__fd file;
  bool extra_fds; /* more than one descriptor came (each extra one closed) */
  pid_t pid;
  uid_t uid;
  uint64_t order;    /* how many clients were admitted before it: eviction order */
  uint64_t deadline; /* of the request, then of the response */
  /* The request: header, then payload. */
  unsigned char hdr[MOLT__PROTO_HDR_SIZE];
  size_t got; /* bytes of header + payload received */
  molt__frame_hdr h;
  char *payload; /* h.length + 1 bytes, once the header is valid */
  /* The response: head (header, error record), then body. */
  unsigned char head[HEAD_MAX];
  size_t head_len;
  molt__buf body;
  size_t sent;
} slot;

static slot slots[MOLT__CONTROL_SLOTS];

/* Frees what a slot holds and closes its socket.  Each pointer is cleared
 * before it is freed: a fork() in between (another thread) leaves the
 * child a slot it can free again safely (molt__control_after_fork_child). */
static void slot_free(slot *s) {
  char *p = s->payload;
  s->payload = NULL;
  free(p);
  molt__buf b = s->body;
  molt__buf_init(&s->body);
  molt__buf_free(&b);
  molt__fd_close(&s->fd);
  molt__fd_close(&s->file);
  s->state = SLOT_FREE;
}

/* Reads what has arrived of the request (the one place that reads from a
 * client).  Returns 0 when the whole frame is in (s->h, s->payload), 1
 * when more is to come, or a MOLT_E* code with a reason in err:
 * MOLT_ECONNECT (closed before a byte), MOLT_EPROTO (truncated, bad
 * header), MOLT_EIO (socket error or lost), MOLT_ENOMEM. */
static int read_frame(slot *s, char *err, size_t errlen) {
  for (;;) {
    size_t want;
    void *dst;
    if (s->got < MOLT__PROTO_HDR_SIZE) {
      dst = s->hdr + s->got;
      want = MOLT__PROTO_HDR_SIZE - s->got;
    } else {
      size_t off = s->got - MOLT__PROTO_HDR_SIZE;
      dst = s->payload + off;
      want = s->h.length - off;
    }
    if (!molt__fd_ours(&s->fd)) {
      molt__errmsg(err, errlen, "the process closed the connection's descriptor");
      return MOLT_EIO;
    }
    int passed = -1;
    ssize_t n = molt__proto_recv_passing(s->fd.fd, dst, want, &passed, &s->extra_fds);
    if (passed >= 0) {
      if (molt__fd_ours(&s->file)) {
        close(passed); /* a second descriptor, in a later piece */
        s->extra_fds = true;
      } else if (molt__fd_keep(&s->file, passed) < 0) {
        s->extra_fds = true; /* cannot keep it: refused below like a bad request */
      }
    }
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 1;
      molt__errmsg(err, errlen, "receive failed: %s", strerror(errno));
      return MOLT_EIO;
    }
    if (n == 0) {
      if (s->got == 0) {
        molt__errmsg(err, errlen, "connection closed before a message arrived");
        return MOLT_ECONNECT;
      }
      if (s->got < MOLT__PROTO_HDR_SIZE)
        molt__errmsg(err, errlen, "truncated header (%zu of %u bytes)", s->got,
                     MOLT__PROTO_HDR_SIZE);
      else
        molt__errmsg(err, errlen, "truncated payload (%zu of %u bytes)",
                     s->got - MOLT__PROTO_HDR_SIZE, (unsigned)s->h.length);
      return MOLT_EPROTO;
    }
    s->got += (size_t)n;
    if (s->got == MOLT__PROTO_HDR_SIZE) {
      /* Validated (64 KiB bound included) before anything is allocated. */
      int rc = molt__proto_decode_hdr(s->hdr, MOLT__FRAME_REQUEST, &s->h, err, errlen);
      if (rc != 0)
        return rc;
      if (s->h.length > 0) {
        char *p = malloc((size_t)s->h.length + 1);
        if (p == NULL) {
          molt__errmsg(err, errlen, "out of memory for a %u-byte payload",
                       (unsigned)s->h.length);
          return MOLT_ENOMEM;
        }
        s->payload = p;
      }
    }
    if (s->got >= MOLT__PROTO_HDR_SIZE && s->got == MOLT__PROTO_HDR_SIZE + s->h.length) {
      if (s->payload)
        s->payload[s->h.length] = '\0';
      if (s->extra_fds) {
        molt__errmsg(err, errlen, "more than one file descriptor came with the request");
        return MOLT_EPROTO;
      }
      return 0;
    }
  }
}

/* Sends what the socket takes of the response.  0: all sent; 1: more to
 * send; MOLT_EIO: the client is gone (or the socket lost). */
static int write_some(slot *s) {
  size_t total = s->head_len + s->body.len;
  while (s->sent < total) {
    if (!molt__fd_ours(&s->fd))
      return MOLT_EIO;
    struct iovec iov[2];
    int n = 0;
    if (s->sent < s->head_len)
      iov[n++] = (struct iovec){s->head + s->sent, s->head_len - s->sent};
    size_t body_off = s->sent > s->head_len ? s->sent - s->head_len : 0;
    if (s->body.len > body_off)
      iov[n++] = (struct iovec){s->body.data + body_off, s->body.len - body_off};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w = sendmsg(s->fd.fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 1;
      return MOLT_EIO;
    }
    s->sent += (size_t)w;
  }
  return 0;
}

/* Starts the response (status, its error message, the body taken over from
 * *body if not NULL) with a deadline of its own -- the request may
 * legitimately have taken long (a global update waits for threads) -- and
 * sends what it can at once; the slot is freed when all is sent. */
static void respond(slot *s, int status, const char *errmsg, molt__buf *body) {
  char *p = s->payload;
  s->payload = NULL;
  free(p);
  if (body != NULL) {
    s->body = *body;
    molt__buf_init(body);
  }
  s->head_len = response_head(s->head, status, errmsg, s->body.len);
  s->sent = 0;
  s->state = SLOT_WRITING;
  s->deadline = molt__now_ns() + (uint64_t)MOLT__PROTO_SERVER_IO_MS * NS_PER_MS;
  if (write_some(s) != 1)
    slot_free(s);
}

void molt__control_held(uint64_t ns, const void *except) {
  for (size_t i = 0; i < MOLT__CONTROL_SLOTS; i++)
    if (slots[i].state != SLOT_FREE && &slots[i] != except)
      slots[i].deadline += ns;
}

/* The whole request is in: parse it, carry it out, start the response. */
static void serve(slot *s) {
  char err[ERRLEN] = "";
  molt__records recs;
  int rc = molt__tsv_parse(s->payload, s->h.length, MOLT__PROTO_MAX_RECORDS, &recs, err,
                           sizeof err);
  if (rc != 0) {
    molt__log(MOLT__EV_INFO, molt__gen_number_now(), NULL,
              "malformed control request from pid %ld: %s", (long)s->pid, err);
    respond(s, rc, err, NULL);
    return;
  }
  /* 4 KiB path: keep it off the runtime thread's stack. */
  molt__request *req = malloc(sizeof *req);
  if (req == NULL) {
    molt__tsv_free(&recs);
    respond(s, MOLT_ENOMEM, "out of memory for the request", NULL);
    return;
  }
  rc = molt__request_decode(s->h.kind, &recs, req, err, sizeof err);
  molt__tsv_free(&recs);
  if (rc == 0 && molt__fd_ours(&s->file)) {
    req->has_fd = true;
    req->fd = s->file.fd;
  }
  if (rc != 0) {
    free(req);
    respond(s, rc, err, NULL);
    return;
  }

  molt__buf out;
  molt__buf_init(&out);
  err[0] = '\0';
  uint64_t t0 = molt__now_ns();
  rc = molt__execute(req, &out, err, sizeof err);
  /* The other clients waited for this one (a global update may take
   * seconds): their deadlines are for their own slowness. */
  molt__control_held(molt__now_ns() - t0, s);

  if (out.oom || out.len > MOLT__PROTO_MAX_RESPONSE - 2 * ERRLEN - 16) {
    bool too_big = !out.oom;
    molt__buf_free(&out);
    molt__buf_init(&out);
    /* An apply or rollback has happened (or not) whatever its report says:
     * keep its status so the CLI tells the truth, and drop only the
     * records.  A status or log without its records is a failure. */
    if (rc == 0 && (molt__op_find(req->op)->flags & MOLT__OPF_REPORT)) {
      rc = too_big ? MOLT_ENOTSUP : MOLT_ENOMEM;
      if (too_big)
        molt__errmsg(err, sizeof err,
                     "the %s report exceeds the protocol limit of %u bytes",
                     molt__op_find(req->op)->name, MOLT__PROTO_MAX_RESPONSE);
      else
        molt__errmsg(err, sizeof err, "out of memory while building the %s report",
                     molt__op_find(req->op)->name);
    }
  }
  free(req);
  respond(s, rc, err, &out);
  molt__buf_free(&out);
}

/* A reading slot has data, an error, or has reached its deadline. */
static void slot_read(slot *s, uint64_t now) {
  char err[ERRLEN] = "";
  int rc = read_frame(s, err, sizeof err);
  if (rc == 1 && now < s->deadline)
    return;
  if (rc == 0) {
    serve(s);
    return;
  }
  if (rc == MOLT_ECONNECT || rc == MOLT_EIO) {
    /* Connected and closed without a word, or the socket broke: nobody is
     * left to answer, and it is not worth a log entry. */
    slot_free(s);
    return;
  }
  if (rc == 1) {
    molt__errmsg(err, sizeof err, "no complete request within %d ms",
                 MOLT__PROTO_SERVER_IO_MS);
    rc = MOLT_EPROTO;
  }
  molt__log(MOLT__EV_INFO, molt__gen_number_now(), NULL,
            "malformed control request from pid %ld: %s", (long)s->pid, err);
  respond(s, rc, err, NULL);
}

/* A slot for a newly admitted client: a free one, else the oldest that is
 * still reading its request (told so, best effort), else none. */
static slot *slot_claim(void) {
  slot *oldest = NULL;
  for (size_t i = 0; i < MOLT__CONTROL_SLOTS; i++) {
    slot *s = &slots[i];
    if (s->state == SLOT_FREE)
      return s;
    if (s->state == SLOT_READING && (oldest == NULL || s->order < oldest->order))
      oldest = s;
  }
  if (oldest != NULL) {
    molt__log(MOLT__EV_INFO, molt__gen_number_now(), NULL,
              "control connection from pid %ld dropped before its request was "
              "complete: every one of the %d slots was taken",
              (long)oldest->pid, MOLT__CONTROL_SLOTS);
    answer_once(&oldest->fd, MOLT_EFULL,
                "too many control connections at once; this one was the oldest "
                "without a complete request");
    slot_free(oldest);
  }
  return oldest;
}

/* ---- refusals ----------------------------------------------------------------*/

typedef struct deny {
  bool used;
  bool other; /* the shared count of uids beyond the first DENY_UIDS */
  bool known; /* the uid is known (peer credentials were available) */
  uid_t uid;
  pid_t last_pid;
  uint64_t count, logged;     /* refusals, and how many the log has told of */
  uint64_t first_rt, last_rt; /* CLOCK_REALTIME ns */
  uint64_t last_log;          /* CLOCK_MONOTONIC ns of its last log entry */
  uint64_t answer_at;         /* GCRA: when the next answer is due (CLOCK_MONOTONIC ns) */
} deny;

static deny denies[DENY_UIDS + 1]; /* the last: every other uid */

static deny *deny_of(bool known, uid_t uid) {
  for (size_t i = 0; i < DENY_UIDS; i++) {
    deny *d = &denies[i];
    if (!d->used) {
      *d = (deny){.used = true, .known = known, .uid = uid};
      return d;
    }
    if (d->known == known && (!known || d->uid == uid))
      return d;
  }
  deny *d = &denies[DENY_UIDS];
  if (!d->used)
    *d = (deny){.used = true, .other = true};
  return d;
}

static void format_time(uint64_t rt_ns, char *buf, size_t len) {
  time_t t = (time_t)(rt_ns / 1000000000u);
  struct tm tm;
  if (gmtime_r(&t, &tm) == NULL || strftime(buf, len, "%Y-%m-%d %H:%M:%S UTC", &tm) == 0)
    snprintf(buf, len, "%" PRIu64, rt_ns / 1000000000u);
}

static void deny_who(const deny *d, char *buf, size_t len) {
  if (d->other)
    snprintf(buf, len, "uids beyond the first %d", DENY_UIDS);
  else if (d->known)
    snprintf(buf, len, "uid %u", (unsigned)d->uid);
  else
    snprintf(buf, len, "clients whose credentials were unavailable");
}

/* Logs the refusals of d not told yet (one entry). */
static void deny_summary(deny *d, uint64_t now) {
  char who[64], first[40], last[40];
  deny_who(d, who, sizeof who);
  format_time(d->first_rt, first, sizeof first);
  format_time(d->last_rt, last, sizeof last);
  molt__log(MOLT__EV_DENIED, molt__gen_number_now(), NULL,
            "%" PRIu64 " more control connections from %s refused (%" PRIu64
            " since %s; the last at %s, from pid %ld)",
            d->count - d->logged, who, d->count, first, last, (long)d->last_pid);
  d->logged = d->count;
  d->last_log = now;
}

/* A client that may not control this process (fd: just accepted). */
static void refuse(int fd, bool have_cred, const struct ucred *cred, uint64_t now) {
  uid_t owner = geteuid();
  deny *d = deny_of(have_cred, have_cred ? cred->uid : (uid_t)-1);
  d->count++;
  d->last_rt = molt__realtime_ns();
  if (d->count == 1)
    d->first_rt = d->last_rt;
  d->last_pid = have_cred ? cred->pid : 0;

  /* Answered at DENY_ANSWERS_PER_S per second with a burst of as many
   * (generic cell rate: answer_at runs ahead of now by at most the burst). */
  const uint64_t interval = 1000000000u / DENY_ANSWERS_PER_S;
  uint64_t at = d->answer_at > now ? d->answer_at : now;
  if (at - now <= (uint64_t)DENY_ANSWERS_PER_S * interval) {
    d->answer_at = at + interval;
    char err[ERRLEN];
    if (have_cred)
      molt__errmsg(err, sizeof err,
                   "uid %u is not allowed to control this process (owner uid %u)",
                   (unsigned)cred->uid, (unsigned)owner);
    else
      molt__errmsg(err, sizeof err,
                   "cannot verify the client's credentials (owner uid %u)",
                   (unsigned)owner);
    molt__fd c;
    if (molt__fd_take(&c, fd) == 0)
      answer_once(&c, MOLT_EPERM, err);
  }

  if (d->count == 1) {
    char who[64];
    deny_who(d, who, sizeof who);
    if (have_cred)
      molt__log(MOLT__EV_DENIED, molt__gen_number_now(), NULL,
                "control connection from pid %ld uid %u refused: only uid %u and root "
                "may control this process; further refusals of %s are counted (molt "
                "status) and summed up here at most once a minute",
                (long)cred->pid, (unsigned)cred->uid, (unsigned)owner, who);
    else
      molt__log(MOLT__EV_DENIED, molt__gen_number_now(), NULL,
                "control connection refused: peer credentials unavailable; further "
                "such refusals are counted (molt status) and summed up here at most "
                "once a minute");
    d->logged = 1;
    d->last_log = now;
  }
}

/* Due summaries; returns the ms until the next one is due (-1: none). */
static int deny_tick(uint64_t now) {
  int next = -1;
  for (size_t i = 0; i <= DENY_UIDS; i++) {
    deny *d = &denies[i];
    if (!d->used || d->count == d->logged)
      continue;
    uint64_t due = d->last_log + (uint64_t)DENY_LOG_MS * NS_PER_MS;
    if (now >= due) {
      deny_summary(d, now);
      continue;
    }
    int ms = (int)((due - now) / NS_PER_MS) + 1;
    if (next < 0 || ms < next)
      next = ms;
  }
  return next;
}

void molt__control_status(molt__buf *out) {
  for (size_t i = 0; i <= DENY_UIDS; i++) {
    const deny *d = &denies[i];
    if (!d->used)
      continue;
    char uid[24], count[24], first[24], last[24], pid[24];
    if (d->other)
      snprintf(uid, sizeof uid, "other");
    else if (d->known)
      snprintf(uid, sizeof uid, "%u", (unsigned)d->uid);
    else
      snprintf(uid, sizeof uid, "unknown");
    snprintf(count, sizeof count, "%" PRIu64, d->count);
    snprintf(first, sizeof first, "%" PRIu64, d->first_rt / 1000000000u);
    snprintf(last, sizeof last, "%" PRIu64, d->last_rt / 1000000000u);
    snprintf(pid, sizeof pid, "%ld", (long)d->last_pid);
    const char *f[] = {"denied", uid, count, first, last, pid};
    molt__buf_record(out, 6, f);
  }
}

/* ---- accepting ---------------------------------------------------------------*/

static void accept_clients(const molt__fd *listener, uint64_t now) {
  /* Touched only by the runtime thread. */
  static bool accept_failing;
  static uint64_t admitted;
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    /* Lost since the runtime thread last looked: the number may be a
     * listening socket of the host now, whose clients are not ours to take
     * (the runtime loop makes a new listener). */
    if (!molt__fd_ours(listener))
      return;
    int fd = accept4(listener->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      int e = errno;
      if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        /* The connection stays queued, so the listener stays readable and
         * the runtime loop would spin at full speed.  Pausing the runtime
         * thread briefly caps that at ten wake-ups a second; it holds no
         * lock here, so application threads are not affected. */
        if (!accept_failing)
          molt__log(MOLT__EV_INFO, molt__gen_number_now(), NULL,
                    "cannot accept control connections: %s", strerror(e));
        accept_failing = true;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
      }
      /* EAGAIN, EINTR, ECONNABORTED: nobody (else) is waiting. */
      return;
    }
    accept_failing = false;

    /* Who it is, before anything is read: SO_PEERCRED reports the
     * effective uid the client had at connect(). */
    struct ucred cred;
    socklen_t clen = sizeof cred;
    bool have_cred =
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0 && clen == sizeof cred;
    if (!have_cred || (cred.uid != 0 && cred.uid != geteuid())) {
      /* Refused here and now; closing with its request unread makes its
       * further sends fail, but what we sent stays readable for it. */
      refuse(fd, have_cred, &cred, now);
      close(fd);
      continue;
    }

    /* Moved to the band (fd.c) like the listener: a request may take as
     * long as an update does, and a client socket on a small number would
     * both hold a number the host expects to get, and be the likeliest to
     * be reused by the host right after it closes everything -- the
     * runtime sends the response there. */
    molt__fd client;
    if (molt__fd_keep(&client, fd) < 0)
      continue;
    slot *s = slot_claim();
    if (s == NULL) {
      /* Every slot is writing a response (each bounded by its deadline). */
      answer_once(&client, MOLT_EFULL,
                  "too many control connections at once; try again in a moment");
      molt__fd_close(&client);
      continue;
    }
    *s = (slot){.state = SLOT_READING,
                .fd = client,
                .file = MOLT__FD_NONE,
                .pid = cred.pid,
                .uid = cred.uid,
                .order = admitted++,
                .deadline = now + (uint64_t)MOLT__PROTO_SERVER_IO_MS * NS_PER_MS};
    molt__buf_init(&s->body);
  }
}

/* ---- the runtime loop's side ---------------------------------------------------*/

static int ms_until(uint64_t deadline, uint64_t now) {
  return deadline <= now ? 0 : (int)((deadline - now + NS_PER_MS - 1) / NS_PER_MS);
}

void molt__control_poll_prepare(const molt__fd *listener, struct pollfd *fds,
                                int *timeout_ms) {
  uint64_t now = molt__now_ns();
  int t = deny_tick(now);
  fds[0] = (struct pollfd){.fd = listener->fd, .events = POLLIN};
  for (size_t i = 0; i < MOLT__CONTROL_SLOTS; i++) {
    slot *s = &slots[i];
    struct pollfd *p = &fds[1 + i];
    *p = (struct pollfd){.fd = -1};
    if (s->state == SLOT_FREE)
      continue;
    /* A lost descriptor is not polled (its number is the host's); its
     * deadline brings the slot back to poll_done. */
    if (molt__fd_ours(&s->fd))
      *p = (struct pollfd){.fd = s->fd.fd,
                           .events = s->state == SLOT_READING ? POLLIN : POLLOUT};
    int ms = ms_until(s->deadline, now);
    if (t < 0 || ms < t)
      t = ms;
  }
  if (t >= 0 && (*timeout_ms < 0 || t < *timeout_ms))
    *timeout_ms = t;
}

void molt__control_poll_done(const molt__fd *listener, const struct pollfd *fds) {
  uint64_t now = molt__now_ns();
  for (size_t i = 0; i < MOLT__CONTROL_SLOTS; i++) {
    slot *s = &slots[i];
    const struct pollfd *p = &fds[1 + i];
    /* Only the entry polled for this very slot counts: a slot freed and
     * taken again since has its own. */
    bool ready = p->fd >= 0 && p->fd == s->fd.fd && p->revents != 0;
    if (s->state == SLOT_READING && (ready || now >= s->deadline)) {
      slot_read(s, now);
    } else if (s->state == SLOT_WRITING && (ready || now >= s->deadline)) {
      int rc = write_some(s);
      if (rc != 1 || molt__now_ns() >= s->deadline)
        slot_free(s); /* sent, the client gone, or too slow to take it */
    }
  }
  if (fds[0].fd >= 0 && (fds[0].revents & POLLIN))
    accept_clients(listener, molt__now_ns());
}

void molt__control_after_fork_child(void) {
  /* The parent's clients are the parent's: their descriptors are closed
   * here (if still ours), their buffers freed, the counts start anew.  The
   * runtime thread may have been anywhere in this file at fork(); slot_free
   * clears each pointer before freeing it, so at worst a buffer leaks. */
  for (size_t i = 0; i < MOLT__CONTROL_SLOTS; i++) {
    slot *s = &slots[i];
    if (s->state != SLOT_FREE || s->fd.fd >= 0)
      slot_free(s);
  }
  memset(denies, 0, sizeof denies);
}
