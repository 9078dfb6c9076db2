/*
 * control.c -- the control socket server.
 *
 * Runs only on the runtime thread: the runtime's event loop polls the
 * listening fd and calls molt__control_serve() when it is readable.  One
 * connection carries one request and one response (docs/protocol.md); the
 * request is carried out by molt__execute, right here on the runtime
 * thread, the one path of every request (request.c).
 *
 * The runtime thread also performs updates and reclamation, so a client
 * must never be able to hold it: every read and write on a client socket
 * has a deadline of MOLT__PROTO_SERVER_IO_MS (enforced with poll, since
 * SO_RCVTIMEO alone restarts its clock on every byte and a client dripping
 * one byte a second could stretch a 64 KiB request over hours), and the
 * request is bounded to 64 KiB before anything is allocated.
 *
 * The host may close any of the runtime's descriptors and reuse the
 * numbers (base.h, "descriptors the host may close"): the listener is
 * checked before accept, a client's socket before each recv, send and
 * socket option, so nothing ever reads or writes a socket of the host.
 *
 * Like all runtime code this never prints, exits or aborts; failures of a
 * single connection are answered (best effort) and logged, never fatal.
 */
#include "service/service.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define ERRLEN 1024

int molt__control_listen(molt__fd *out) {
  /* NONBLOCK on the listener: if a client gives up between the runtime's
   * poll and our accept, accept4 must return EAGAIN rather than block the
   * runtime thread until the next client arrives. */
  *out = (molt__fd)MOLT__FD_NONE;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return molt__from_errno(errno);
  /* Out of the host's way (fd.c) before anything else happens to it. */
  molt__fd l;
  int rc = molt__fd_keep(&l, fd);
  if (rc < 0)
    return rc;
  struct sockaddr_un sa;
  socklen_t len = molt__proto_sockaddr(getpid(), &sa);
  if (bind(l.fd, (struct sockaddr *)&sa, len) < 0 || listen(l.fd, 16) < 0) {
    /* EADDRINUSE: another socket already has our name (a squatter, a
     * second runtime in this process, or our own old listener that the
     * host closed while something still holds it); all map to a plain I/O
     * error. */
    int e = errno;
    molt__fd_close(&l);
    return molt__from_errno(e);
  }
  /* Kept anew: its identity now includes its name. */
  return molt__fd_keep(out, l.fd);
}

static bool still_ours(const void *fd) { return molt__fd_ours(fd); }

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

/* Sends a response: header, then the error record (status != 0), then
 * body.  Best effort: a client that has gone away just makes it fail. */
static void respond(const molt__fd *c, int status, const char *errmsg, const char *body,
                    size_t body_len, uint64_t deadline) {
  molt__io_guard guard = {still_ours, c};
  char rec[2 * ERRLEN + 16];
  size_t rec_len = 0;
  if (status != 0)
    rec_len = error_record(rec, sizeof rec,
                           errmsg != NULL && errmsg[0] != '\0' ? errmsg
                                                               : molt_strerror(status));
  molt__frame_hdr h = {.magic = MOLT__PROTO_MAGIC,
                       .version = MOLT__PROTO_VERSION,
                       .kind = 0,
                       .status = status,
                       .length = (uint32_t)(rec_len + body_len)};
  unsigned char hdr[MOLT__PROTO_HDR_SIZE];
  molt__proto_encode_hdr(&h, hdr);
  if (molt__proto_write_full_guarded(c->fd, hdr, sizeof hdr, deadline, &guard) != 0)
    return;
  if (rec_len > 0 &&
      molt__proto_write_full_guarded(c->fd, rec, rec_len, deadline, &guard) != 0)
    return;
  if (body_len > 0)
    (void)molt__proto_write_full_guarded(c->fd, body, body_len, deadline, &guard);
}

static void serve_request(const molt__fd *c, molt__fd *file_fd);

static void serve_client(const molt__fd *c) {
  molt__fd file_fd = MOLT__FD_NONE;
  serve_request(c, &file_fd);
  /* Every path: a descriptor received with the request is never leaked. */
  molt__fd_close(&file_fd);
}

static void serve_request(const molt__fd *c, molt__fd *file_fd) {
  uint64_t deadline = molt__proto_deadline(MOLT__PROTO_SERVER_IO_MS);
  char err[ERRLEN] = "";
  molt__io_guard guard = {still_ours, c};

  struct ucred cred;
  socklen_t clen = sizeof cred;
  bool have_cred = molt__fd_ours(c) &&
                   getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0 &&
                   clen == sizeof cred;
  uid_t owner = geteuid();
  /* SO_PEERCRED reports the effective uid the client had at connect(). */
  bool allowed = have_cred && (cred.uid == 0 || cred.uid == owner);

  /* The request is read before a refusal is sent: a client still writing
   * its request when we close would get EPIPE and never see our answer. */
  molt__frame_hdr h;
  char *payload = NULL;
  /* The file of an apply or update comes open with the request (issue 16:
   * the runtime never resolves a path a client names).  Moved to the band
   * and kept like any runtime descriptor (fd.c); closed below on every
   * path (file_fd.fd -1 after molt__fd_close). */
  int passed = -1;
  int rc = molt__proto_recv_fd_guarded(c->fd, MOLT__FRAME_REQUEST, &h, &payload, deadline,
                                       err, sizeof err, &guard, &passed);
  if (passed >= 0 && molt__fd_keep(file_fd, passed) < 0 && rc == 0) {
    molt__errmsg(err, sizeof err, "cannot keep the file descriptor of the request");
    rc = MOLT_EIO;
  }

  if (!allowed) {
    if (have_cred) {
      molt__log(MOLT__EV_DENIED, molt__gen_number_now(), NULL,
                "control connection from pid %ld uid %u refused: only uid %u "
                "and root may control this process",
                (long)cred.pid, (unsigned)cred.uid, (unsigned)owner);
      molt__errmsg(err, sizeof err,
                   "uid %u is not allowed to control this process (owner uid "
                   "%u)",
                   (unsigned)cred.uid, (unsigned)owner);
    } else {
      molt__log(MOLT__EV_DENIED, molt__gen_number_now(), NULL,
                "control connection refused: peer credentials unavailable");
      molt__errmsg(err, sizeof err,
                   "cannot verify the client's credentials (owner uid %u)",
                   (unsigned)owner);
    }
    respond(c, MOLT_EPERM, err, NULL, 0, deadline);
    free(payload);
    return;
  }

  if (rc == MOLT_ECONNECT || rc == MOLT_EIO) {
    /* Connected and closed without a word, or the socket broke: nobody is
     * left to answer, and it is not worth a log entry. */
    free(payload);
    return;
  }
  if (rc != 0) {
    if (rc == MOLT_ETIMEDOUT) {
      molt__errmsg(err, sizeof err, "no complete request within %d ms",
                   MOLT__PROTO_SERVER_IO_MS);
      rc = MOLT_EPROTO;
    }
    molt__log(MOLT__EV_INFO, molt__gen_number_now(), NULL,
              "malformed control request from pid %ld: %s", (long)cred.pid, err);
    respond(c, rc, err, NULL, 0, deadline);
    free(payload);
    return;
  }

  molt__records recs;
  rc =
      molt__tsv_parse(payload, h.length, MOLT__PROTO_MAX_RECORDS, &recs, err, sizeof err);
  free(payload);
  if (rc != 0) {
    molt__log(MOLT__EV_INFO, molt__gen_number_now(), NULL,
              "malformed control request from pid %ld: %s", (long)cred.pid, err);
    respond(c, rc, err, NULL, 0, deadline);
    return;
  }

  /* 4 KiB path: keep it off the runtime thread's stack. */
  molt__request *req = malloc(sizeof *req);
  if (req == NULL) {
    molt__tsv_free(&recs);
    respond(c, MOLT_ENOMEM, "out of memory for the request", NULL, 0, deadline);
    return;
  }
  rc = molt__request_decode(h.kind, &recs, req, err, sizeof err);
  molt__tsv_free(&recs);
  if (rc == 0 && molt__fd_ours(file_fd)) {
    req->has_fd = true;
    req->fd = file_fd->fd;
  }
  if (rc != 0) {
    free(req);
    respond(c, rc, err, NULL, 0, deadline);
    return;
  }

  molt__buf out;
  molt__buf_init(&out);
  err[0] = '\0';
  rc = molt__execute(req, &out, err, sizeof err);

  const char *body = out.data;
  size_t body_len = out.len;
  if (out.oom || body_len > MOLT__PROTO_MAX_RESPONSE - 2 * ERRLEN - 16) {
    bool too_big = !out.oom;
    body = NULL;
    body_len = 0;
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
  /* The response gets its own deadline: the request may legitimately have
   * taken long (a global update waits for threads). */
  respond(c, rc, err, body, body_len, molt__proto_deadline(MOLT__PROTO_SERVER_IO_MS));
  molt__buf_free(&out);
  free(req);
}

void molt__control_serve(const molt__fd *listener) {
  /* Touched only by the runtime thread. */
  static bool accept_failing;

  /* Lost since the runtime thread last looked: the number may be a
   * listening socket of the host now, whose clients are not ours to take
   * (the runtime loop makes a new listener). */
  if (!molt__fd_ours(listener))
    return;
  int fd = accept4(listener->fd, NULL, NULL, SOCK_CLOEXEC);
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
    /* EAGAIN, EINTR, ECONNABORTED: the client is gone; nothing to do. */
    return;
  }
  accept_failing = false;
  /* Moved to the band (fd.c) like the listener: a request may take as long
   * as an update does, and a client socket on a small number would both
   * hold a number the host expects to get, and be the likeliest to be
   * reused by the host right after it closes everything -- the runtime
   * sends the response there. */
  molt__fd client;
  if (molt__fd_keep(&client, fd) < 0)
    return;

  /* Belt and braces: the I/O helpers use poll deadlines, but should any
   * blocking call slip in, the socket itself bounds it too. */
  struct timeval tv = {.tv_sec = MOLT__PROTO_SERVER_IO_MS / 1000,
                       .tv_usec = (MOLT__PROTO_SERVER_IO_MS % 1000) * 1000};
  if (molt__fd_ours(&client)) {
    (void)setsockopt(client.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)setsockopt(client.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }

  serve_client(&client);
  molt__fd_close(&client);
}
