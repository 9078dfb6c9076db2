/* Talking to a process: one request on its control socket, one response
 * (docs/protocol.md); what each failure means for the user (one line, an
 * exit code); and the request of a changing operation. */
#include "cli/cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers ---------------------------------------------------------- */

void cli_sanitize(char *s) {
  for (unsigned char *p = (unsigned char *)s; *p != '\0'; p++)
    if (*p < 0x20 || *p == 0x7f)
      *p = '?';
}

int cli_fail(int code, const char *fmt, ...) {
  char line[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  cli_sanitize(line);
  fprintf(stderr, "molt: %s\n", line);
  return code;
}

void *cli_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL) {
    cli_fail(EXIT_FAILED, "out of memory; free some memory and retry");
    exit(EXIT_FAILED);
  }
  return p;
}

void *cli_xrealloc(void *p, size_t n) {
  p = realloc(p, n ? n : 1);
  if (p == NULL) {
    cli_fail(EXIT_FAILED, "out of memory; free some memory and retry");
    exit(EXIT_FAILED);
  }
  return p;
}

char *cli_xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(cli_xmalloc(n), s, n);
}

void cli_comm(pid_t pid, char *buf, size_t len) {
  if (!molt__proc_name(pid, 0, buf, len) && len)
    snprintf(buf, len, "?");
}

bool cli_parse_pid(const char *s, pid_t *out) {
  if (*s < '1' || *s > '9')
    return false;
  long v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9')
      return false;
    v = v * 10 + (*s - '0');
    if (v > INT_MAX) /* pid_t is int on Linux */
      return false;
  }
  *out = (pid_t)v;
  return true;
}

/* ---- one request, one response ----------------------------------------------- */

void cli_reply_free(cli_reply *r) {
  free(r->payload);
  molt__tsv_free(&r->recs);
  memset(r, 0, sizeof *r);
}

/*
 * Sends one request to pid and waits up to timeout_ms for the response.
 * Returns 0 with *r filled (r->status tells whether the target succeeded)
 * or, without printing anything:
 *   MOLT_ENOTMOLT  nobody listens on molt.<pid>
 *   MOLT_ECONNECT  cannot connect, impostor, connection closed
 *   MOLT_ETIMEDOUT no (complete) answer in time
 *   MOLT_EPROTO / MOLT_EVERSION  malformed or incompatible response
 *   MOLT_ENOMEM
 * with a one-line reason in err.
 */
/* One attempt of cli_call on the socket named `name` (pid's primary name
 * or a fallback), sending pass_fd with the request when it is not -1.
 * *unread: the connection broke before any answer in a way that proves the
 * process never read the whole request (see cli_call).  *impostor: another
 * process serves that name. */
static int call_once(pid_t pid, const char *name, unsigned op, const molt__buf *body,
                     int pass_fd, int timeout_ms, cli_reply *r, char *err, size_t errlen,
                     bool *unread, bool *impostor) {
  memset(r, 0, sizeof *r);
  *unread = false;
  *impostor = false;
  uint64_t deadline = molt__proto_deadline(timeout_ms);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    molt__errmsg(err, errlen, "cannot create a socket: %s", strerror(errno));
    return MOLT_ECONNECT;
  }
  /* connect() on a Unix socket blocks only while the listener's backlog is
   * full; SO_SNDTIMEO bounds that wait (Linux honours it for connect). */
  struct timeval tv = {.tv_sec = timeout_ms / 1000,
                       .tv_usec = (timeout_ms % 1000) * 1000};
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_un sa;
  socklen_t salen = molt__proto_sockaddr_named(name, &sa);
  if (connect(fd, (struct sockaddr *)&sa, salen) < 0) {
    int e = errno;
    close(fd);
    if (e == ECONNREFUSED || e == ENOENT) {
      molt__errmsg(err, errlen, "nothing listens on socket %s", name);
      return MOLT_ENOTMOLT;
    }
    if (e == EAGAIN || e == EWOULDBLOCK || e == EINPROGRESS) {
      molt__errmsg(err, errlen,
                   "the process does not accept control connections (its "
                   "queue is full)");
      return MOLT_ETIMEDOUT;
    }
    molt__errmsg(err, errlen, "cannot connect to socket %s: %s", name, strerror(e));
    return MOLT_ECONNECT;
  }

  /* Anyone can bind an abstract name, so the name proves nothing: the
   * kernel's record of who listens does. */
  struct ucred cred;
  socklen_t clen = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 || clen != sizeof cred) {
    close(fd);
    molt__errmsg(err, errlen, "cannot verify who serves socket %s: %s", name,
                 strerror(errno));
    return MOLT_ECONNECT;
  }
  if (cred.pid != pid) {
    close(fd);
    molt__errmsg(err, errlen,
                 "refusing to talk to pid %ld: socket %s is served by pid %ld", (long)pid,
                 name, (long)cred.pid);
    *impostor = true;
    return MOLT_ECONNECT;
  }

  molt__frame_hdr h = {.magic = MOLT__PROTO_MAGIC,
                       .version = MOLT__PROTO_VERSION,
                       .kind = (uint16_t)op,
                       .status = 0,
                       .length = body != NULL ? (uint32_t)body->len : 0};
  int send_rc =
      molt__proto_send_fd(fd, &h, body != NULL ? body->data : NULL, deadline, pass_fd);
  int send_errno = errno;
  /* Even if sending failed, the process may have answered before closing
   * (a refusal, say): read whatever it said. */
  char why[512] = "";
  int rc = molt__proto_recv(fd, MOLT__FRAME_RESPONSE, &h, &r->payload, deadline, why,
                            sizeof why);
  int recv_errno = errno;
  close(fd);
  /* Reset with our request unread, or the peer gone before all of it was
   * sent: the process cannot have carried it out. */
  *unread = rc != 0 && h.magic == 0 &&
            (recv_errno == ECONNRESET ||
             (send_rc == MOLT_EIO && (send_errno == EPIPE || send_errno == ECONNRESET)));
  if (rc == MOLT_ECONNECT || (rc != 0 && send_rc == MOLT_EIO)) {
    if (send_rc == MOLT_EIO)
      molt__errmsg(err, errlen, "sending the request failed: %s", strerror(send_errno));
    else
      molt__errmsg(err, errlen, "the process closed the connection without answering");
    return MOLT_ECONNECT;
  }
  if (rc == MOLT_ETIMEDOUT) {
    molt__errmsg(err, errlen, "no answer within %d.%03d s", timeout_ms / 1000,
                 timeout_ms % 1000);
    return rc;
  }
  if (rc == MOLT_EIO) {
    molt__errmsg(err, errlen, "%s", why);
    return MOLT_ECONNECT;
  }
  if (rc != 0) {
    molt__errmsg(err, errlen, "malformed response: %s", why);
    return rc;
  }
  rc = molt__tsv_parse(r->payload, h.length, MOLT__PROTO_MAX_RESPONSE_RECORDS, &r->recs,
                       why, sizeof why);
  if (rc != 0) {
    molt__errmsg(err, errlen, "malformed response: %s", why);
    free(r->payload);
    r->payload = NULL;
    return rc;
  }
  r->status = h.status;
  return 0;
}

/* Whether pid has libmolt mapped: a molt process, with or without a
 * control socket right now.  false where its maps cannot be read. */
static bool runs_libmolt(pid_t pid) {
  char path[64], line[4096];
  snprintf(path, sizeof path, "/proc/%ld/maps", (long)pid);
  FILE *f = fopen(path, "re");
  bool found = false;
  while (f != NULL && !found && fgets(line, sizeof line, f) != NULL)
    found = strstr(line, "/libmolt.so") != NULL;
  if (f != NULL)
    fclose(f);
  return found;
}

/* The inodes of the sockets pid holds (from /proc/<pid>/fd), sorted;
 * false if its descriptors cannot be listed (another user's process). */
static bool socket_inodes(pid_t pid, unsigned long **out, size_t *n) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/fd", (long)pid);
  DIR *d = opendir(path);
  *out = NULL;
  *n = 0;
  if (d == NULL)
    return false;
  size_t cap = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    char link[PATH_MAX], target[64];
    snprintf(link, sizeof link, "%s/%s", path, de->d_name);
    ssize_t k = readlink(link, target, sizeof target - 1);
    unsigned long ino;
    if (k <= 0)
      continue;
    target[k] = '\0';
    if (sscanf(target, "socket:[%lu]", &ino) != 1)
      continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 64;
      *out = cli_xrealloc(*out, cap * sizeof **out);
    }
    (*out)[(*n)++] = ino;
  }
  closedir(d);
  return true;
}

/* A process whose name "molt.<pid>" another socket holds listens on
 * "molt.<pid>.<random>" instead (docs/protocol.md).  Such names are found
 * among the listening Unix sockets of /proc/net/unix; where pid's
 * descriptors can be listed, only sockets it holds count (anyone can bind
 * such a name).  Either way the kernel's peer credentials decide
 * (call_once).  Returns how many names went into names[]. */
#define FALLBACK_MAX 8
static size_t fallback_names(pid_t pid, char names[][108], size_t max) {
  char prefix[64];
  molt__proto_socket_name(pid, "", prefix, sizeof prefix);
  size_t plen = strlen(prefix);
  unsigned long *inodes;
  size_t ninodes;
  bool filter = socket_inodes(pid, &inodes, &ninodes);
  FILE *f = fopen("/proc/net/unix", "re");
  size_t n = 0;
  char line[512];
  while (f != NULL && n < max && fgets(line, sizeof line, f) != NULL) {
    unsigned long flags, ino;
    unsigned type, st;
    char path[256];
    /* Num RefCount Protocol Flags Type St Inode Path */
    if (sscanf(line, "%*s %*s %*s %lx %x %x %lu %255s", &flags, &type, &st, &ino, path) !=
        5)
      continue;
    /* 0x10000: __SO_ACCEPTCON, a listening socket; '@': an abstract name. */
    if (!(flags & 0x10000) || path[0] != '@' || strncmp(path + 1, prefix, plen) != 0 ||
        strlen(path + 1) >= sizeof names[0])
      continue;
    bool held = !filter;
    for (size_t i = 0; i < ninodes && !held; i++)
      held = inodes[i] == ino;
    if (held)
      snprintf(names[n++], sizeof names[0], "%s", path + 1);
  }
  if (f != NULL)
    fclose(f);
  free(inodes);
  return n;
}

/* One attempt on pid's primary name, then, if nothing (or an impostor)
 * listens there, on its fallback names.  The primary's error is kept when
 * no fallback answers. */
static int call_any(pid_t pid, unsigned op, const molt__buf *body, int pass_fd,
                    int timeout_ms, cli_reply *r, char *err, size_t errlen,
                    bool *unread) {
  char primary[64];
  molt__proto_socket_name(pid, NULL, primary, sizeof primary);
  bool impostor;
  int rc = call_once(pid, primary, op, body, pass_fd, timeout_ms, r, err, errlen, unread,
                     &impostor);
  if (rc != MOLT_ENOTMOLT && !impostor)
    return rc;
  char names[FALLBACK_MAX][108];
  size_t n = fallback_names(pid, names, FALLBACK_MAX);
  for (size_t i = 0; i < n; i++) {
    char why[512];
    bool u, imp;
    cli_reply_free(r);
    int rc2 = call_once(pid, names[i], op, body, pass_fd, timeout_ms, r, why, sizeof why,
                        &u, &imp);
    if (rc2 != MOLT_ENOTMOLT && !imp) {
      *unread = u;
      molt__errmsg(err, errlen, "%s", why);
      return rc2;
    }
  }
  return rc;
}

int cli_call(pid_t pid, unsigned op, const molt__buf *body, int timeout_ms, cli_reply *r,
             char *err, size_t errlen) {
  return cli_call_fd(pid, op, body, -1, timeout_ms, r, err, errlen);
}

int cli_call_fd(pid_t pid, unsigned op, const molt__buf *body, int pass_fd,
                int timeout_ms, cli_reply *r, char *err, size_t errlen) {
  /* Tried again for up to a second (and within the timeout): a connection
   * the process dropped without reading our request, and a molt process
   * that nothing listens for.  Both happen while the runtime makes its
   * control socket anew after the process closed it behind its back
   * (daemons close every inherited descriptor): the old socket may take
   * one last connection before the runtime notices, and the name is
   * unbound for a moment.  Only a request never read is repeated, so
   * nothing is carried out twice. */
  uint64_t deadline = molt__proto_deadline(timeout_ms);
  uint64_t give_up =
      molt__proto_deadline(timeout_ms >= 0 && timeout_ms < 1000 ? timeout_ms : 1000);
  int molt_process = -1; /* runs_libmolt(pid), once asked */
  for (;;) {
    bool unread;
    int rc = call_any(pid, op, body, pass_fd, timeout_ms, r, err, errlen, &unread);
    if (rc == MOLT_ENOTMOLT && molt_process < 0)
      molt_process = runs_libmolt(pid);
    bool again = unread || (rc == MOLT_ENOTMOLT && molt_process == 1);
    /* Every slot of the control channel was taken (by other clients of
     * the owner or root: others are refused before they take one), and
     * the process said so without reading our request: tried again for as
     * long as the caller's timeout allows, not only the second above. */
    bool full = rc == 0 && r->status == MOLT_EFULL;
    uint64_t until = full ? deadline : give_up;
    if (!(again || full) || molt__proto_deadline(0) + 50000000u > until)
      return rc;
    cli_reply_free(r);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (deadline != UINT64_MAX) /* at least as far off as give_up */
      timeout_ms = (int)((deadline - molt__proto_deadline(0)) / 1000000u);
  }
}

/* ---- what a failure means for the user ---------------------------------------- */

static int exit_code_of_call_error(int rc) {
  switch (rc) {
  case MOLT_EPROTO:
  case MOLT_EVERSION:
    return EXIT_PROTO;
  case MOLT_ENOMEM:
    return EXIT_FAILED;
  default:
    return EXIT_CONNECT;
  }
}

static int exit_code_of_status(int status) {
  switch (status) {
  case 0:
    return EXIT_OK;
  case MOLT_EPERM:
    return EXIT_CONNECT;
  case MOLT_EPROTO:
  case MOLT_EVERSION:
    return EXIT_PROTO;
  default:
    return EXIT_FAILED;
  }
}

/* Reports a failed cli_call() as one line; returns the exit code. */
static int report_call_error(const char *what, pid_t pid, int rc, const char *err) {
  if (rc == MOLT_ENOTMOLT) {
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%ld", (long)pid);
    if (stat(path, &st) < 0 && errno == ENOENT)
      return cli_fail(EXIT_CONNECT,
                      "%s: no such process %ld; check the pid with 'molt ps'", what,
                      (long)pid);
    char comm[64];
    cli_comm(pid, comm, sizeof comm);
    if (runs_libmolt(pid))
      return cli_fail(EXIT_CONNECT,
                      "%s: process %ld (%s) runs molt, but nothing listens on its "
                      "control socket molt.%ld; if another process holds the name "
                      "('ss -xlp' shows it), stop it",
                      what, (long)pid, comm, (long)pid);
    return cli_fail(EXIT_CONNECT,
                    "%s: process %ld (%s) is not a molt process or has no control "
                    "channel; only programs linked with libmolt (built with "
                    "moltcc) can be controlled, and only from their network "
                    "namespace: 'molt ps' lists them",
                    what, (long)pid, comm);
  }
  const char *todo;
  switch (rc) {
  case MOLT_ETIMEDOUT:
    todo = "the process may be busy or stuck; the operation may or may not "
           "have taken effect, check with 'molt status'";
    break;
  case MOLT_EPROTO:
  case MOLT_EVERSION:
    todo = "use a molt CLI from the same molt release as the process's "
           "libmolt";
    break;
  case MOLT_ECONNECT:
    if (strstr(err, "refusing to talk") != NULL) {
      todo = "another process took the name of the socket; find it with "
             "'ss -xlp' and stop it";
      break;
    }
    todo = "check that the process is still running with 'molt ps'";
    break;
  default:
    todo = "retry";
  }
  return cli_fail(exit_code_of_call_error(rc), "%s: %s; %s", what, err, todo);
}

/* What to do about an error reported by the target. */
static const char *advice(int status) {
  switch (status) {
  case MOLT_EINVAL:
    return "check the command line with 'molt help'";
  case MOLT_ENOMEM:
    return "the process is short of memory; retry later";
  case MOLT_ENOENT:
    return "check that the patch file exists and the process can read it";
  case MOLT_EPERM:
    return "run molt as the process's owner or as root";
  case MOLT_EUNSAFE:
    return "make the patch owned by the process owner or root and not "
           "writable by others (chown, chmod go-w)";
  case MOLT_ENOTPATCH:
    return "build patches with 'moltcc --molt-patch'";
  case MOLT_ECORRUPT:
    return "rebuild the patch";
  case MOLT_EBUILDID:
    return "rebuild it with --molt-target pointing at the running binary";
  case MOLT_EABI:
    return "rebuild the patch with the moltcc of the process's molt release";
  case MOLT_ENOSYM:
  case MOLT_EAMBIGUOUS:
    return "rebuild the patch from the sources of the running program";
  case MOLT_ENOFUNC:
    return "only functions built as updatable can be patched; make it "
           "updatable and restart the program once";
  case MOLT_EDLOPEN:
    return "check the patch's dependencies with ldd";
  case MOLT_EBUSY:
    return "wait until old calls return ('molt status' shows them) and retry";
  case MOLT_ENOHISTORY:
    return "no patch is applied, nothing to undo";
  case MOLT_ETIMEDOUT:
    return "retry with a longer --timeout or another --policy; 'molt status' "
           "shows which threads are busy";
  case MOLT_EREFUSING:
    return "see 'molt status' and 'molt log'; restart the process when "
           "convenient";
  case MOLT_EPROTO:
  case MOLT_EVERSION:
    return "use a molt CLI from the same molt release as the process's "
           "libmolt";
  case MOLT_EPOLICY:
    return "use --policy immediate, local or global";
  case MOLT_ENOTSUP:
    return "see 'molt help'";
  case MOLT_ENOTPROGRAM:
    return "build program images with 'moltcc --molt-program'";
  case MOLT_ENOPROGRAM:
    return "start the program with 'molt run <image.so>' to update it as a "
           "whole";
  case MOLT_EFULL:
    return "other clients of the process's owner or root hold its control "
           "channel; retry with a longer --timeout or find them with 'ss -xp'";
  case MOLT_ECALLBACK:
    return "nothing changed; the patch's pre-update callback said no ('molt log' "
           "has its outcomes)";
  case MOLT_EXFORM:
    return "the old version goes on unchanged; fix the migration rules (.xf) "
           "and rebuild the new image";
  default:
    return "see 'molt log' for details";
  }
}

/* Reports a response with a non-zero status; returns the exit code. */
static int report_status_error(const char *what, const cli_reply *r) {
  const char *why = molt__tsv_field(molt__tsv_find(&r->recs, "error"), 1);
  if (why[0] == '\0')
    why = molt_strerror(r->status);
  /* The runtime may already say what to do ("<why>; <what to do>"): it
   * knows better than a generic hint, and one hint is enough. */
  if (strstr(why, "; ") != NULL)
    return cli_fail(exit_code_of_status(r->status), "%s: %s", what, why);
  return cli_fail(exit_code_of_status(r->status), "%s: %s; %s", what, why,
                  advice(r->status));
}

/* Runs a request that needs no arguments and a successful answer: returns
 * 0, or the exit code after printing the failure. */
int cli_request(const char *what, pid_t pid, unsigned op, const molt__buf *body,
                int timeout_ms, cli_reply *r) {
  return cli_request_fd(what, pid, op, body, -1, timeout_ms, r);
}

int cli_request_fd(const char *what, pid_t pid, unsigned op, const molt__buf *body,
                   int pass_fd, int timeout_ms, cli_reply *r) {
  char err[1024];
  int rc = cli_call_fd(pid, op, body, pass_fd, timeout_ms, r, err, sizeof err);
  if (rc != 0)
    return report_call_error(what, pid, rc, err);
  if (r->status != 0) {
    int code = report_status_error(what, r);
    cli_reply_free(r);
    return code;
  }
  return 0;
}

/* ---- reports and changing operations ------------------------------------------ */

int cli_report(const cli_args *a, unsigned op, cli_reply *r) {
  char what[64];
  snprintf(what, sizeof what, "%s %ld", a->cmd, (long)a->pid);
  return cli_request(what, a->pid, op, NULL, MOLT__DEFAULT_TIMEOUT_MS + CLIENT_SLACK_MS,
                     r);
}

int cli_change(const cli_args *a, const char *what, molt__request *req,
               const char *done) {
  if (a->policy && !molt__policy_parse(a->policy, &req->policy))
    return cli_fail(EXIT_USAGE, "%s: unknown policy '%s'; use immediate, local or global",
                    what, a->policy);
  req->timeout_ms = a->timeout_ms >= 0 ? a->timeout_ms : MOLT__DEFAULT_TIMEOUT_MS;
  req->check_interior = a->check_interior;
  req->callback_timeout_ms = a->callback_timeout_ms > 0 ? a->callback_timeout_ms : 0;
  molt__buf body;
  molt__buf_init(&body);
  molt__request_encode(req, &body);
  if (body.oom) {
    molt__buf_free(&body);
    return cli_fail(EXIT_FAILED, "%s: out of memory; retry", what);
  }
  if (body.len > MOLT__PROTO_MAX_REQUEST) {
    molt__buf_free(&body);
    return cli_fail(EXIT_USAGE, "%s: the file path is too long; use a shorter path",
                    what);
  }
  cli_reply r;
  /* A full update may take the timeout twice: once waiting for the
   * threads, once migrating (docs/full-updates.md, "The time limit"). */
  int wait_ms = req->timeout_ms * (req->op == MOLT__OP_UPDATE ? 2 : 1) + CLIENT_SLACK_MS;
  /* An apply also waits for the patch's pre- and post-update callbacks,
   * each up to its timeout: read from the file the runtime gets. */
  molt__patch_callbacks cbs;
  char ignored[256];
  const molt__op_info *oi = molt__op_find(req->op);
  if (oi && (oi->flags & MOLT__OPF_CALLBACKS) && req->has_fd &&
      molt__elf_read_callbacks(req->fd, &cbs, ignored, sizeof ignored) == 0)
    wait_ms += (cbs.pre.present + cbs.post.present) *
               (req->callback_timeout_ms > 0 ? req->callback_timeout_ms
                                             : MOLT__DEFAULT_CALLBACK_TIMEOUT_MS);
  int code = cli_request_fd(what, a->pid, req->op, &body, req->has_fd ? req->fd : -1,
                            wait_ms, &r);
  molt__buf_free(&body);
  if (code != 0)
    return code;
  const molt__record *g = molt__tsv_find(&r.recs, "generation");
  const molt__record *m = molt__tsv_find(&r.recs, "message");
  char line[4096];
  snprintf(line, sizeof line, "%s", done);
  size_t n = strlen(line);
  if (g != NULL)
    snprintf(line + n, sizeof line - n, ": now at generation %s", cli_field_of(g, 1));
  n = strlen(line);
  if (m != NULL && cli_field_of(m, 1)[0] != '\0')
    snprintf(line + n, sizeof line - n, " (%s)", cli_field_of(m, 1));
  cli_sanitize(line);
  puts(line);
  /* What the runtime saw right after the change (molt apply: threads still
   * inside a version 0 the patch replaced). */
  for (size_t i = 0; i < r.recs.count; i++)
    if (strcmp(cli_field_of(&r.recs.recs[i], 0), "warning") == 0) {
      snprintf(line, sizeof line, "%s", cli_field_of(&r.recs.recs[i], 1));
      cli_sanitize(line);
      fprintf(stderr, "molt: warning: %s\n", line);
    }
  cli_reply_free(&r);
  return EXIT_OK;
}

int cli_file_arg(const char *what, const char *arg, const char *kind,
                 const char *built_by, char **abs, int *fd) {
  /* Opened here, as the operator, who may name a symlink; the process gets
   * this open file (SCM_RIGHTS) and never resolves a path itself (issue
   * 16).  O_NONBLOCK: a FIFO at the path must not block the CLI either;
   * the type is checked on the open file. */
  *fd = open(arg, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (*fd < 0)
    return cli_fail(EXIT_USAGE, "%s: %s; check the path of the %s", what, strerror(errno),
                    kind);
  struct stat st;
  if (fstat(*fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(*fd);
    *fd = -1;
    return cli_fail(EXIT_USAGE, "%s: not a regular file; give the .so file built by '%s'",
                    what, built_by);
  }
  /* The path of the file actually opened, for messages, status and log. */
  char proc[64], buf[PATH_MAX];
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", *fd);
  ssize_t n = readlink(proc, buf, sizeof buf - 1);
  if (n > 0) {
    buf[n] = '\0';
    *abs = strdup(buf);
  } else {
    *abs = realpath(arg, NULL);
  }
  if (*abs == NULL) {
    close(*fd);
    *fd = -1;
    return cli_fail(EXIT_USAGE, "%s: cannot resolve the path: %s; check the path", what,
                    strerror(errno));
  }
  if (strlen(*abs) >= sizeof((molt__request *)0)->path) {
    free(*abs);
    close(*fd);
    *fd = -1;
    return cli_fail(EXIT_USAGE, "%s: the file path is too long; use a shorter path",
                    what);
  }
  return 0;
}

int cli_change_with_file(const cli_args *a, const char *what, molt__request *req,
                         const char *kind, const char *built_by, const char *done) {
  char *abs;
  int fd;
  int code = cli_file_arg(what, a->pos[1], kind, built_by, &abs, &fd);
  if (code != 0)
    return code;
  snprintf(req->path, sizeof req->path, "%s", abs);
  char msg[PATH_MAX + 64];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  snprintf(msg, sizeof msg, done, (long)a->pid, abs);
#pragma GCC diagnostic pop
  free(abs);
  req->has_fd = true;
  req->fd = fd;
  code = cli_change(a, what, req, msg);
  close(fd);
  return code;
}
