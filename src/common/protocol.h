/*
 * protocol.h -- the control protocol (part of the common layer, included by
 * common.h): the table of operations, requests, framing and the TSV codec,
 * shared by libmolt (service/control.c) and the `molt` CLI.
 *
 * The wire format is described in docs/protocol.md.  In short: one request
 * and one response per connection on the abstract Unix socket
 * "\0molt.<pid>"; each message is a 16-byte little-endian header followed by
 * a payload of TSV records (fields separated by tabs, records ended by a
 * newline, backslash/tab/newline inside a field escaped as \\ \t \n).
 *
 * Nothing here prints, exits or aborts: everything returns 0 or a negative
 * MOLT_E* code, because the same code runs inside the host process.
 */
#ifndef MOLT_PROTOCOL_H
#define MOLT_PROTOCOL_H

#include "common/common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

/* ---- operations ----------------------------------------------------------- */

/* Process modes: the ways a process is updated (src/runtime/<mode>/).  A
 * process is in exactly one at a time; each operation names the modes in
 * which the runtime accepts it. */
/* clang-format off */
#define MOLT__MODE_HOT 1u   /* linked with libmolt: hot patches (hot/)       */
#define MOLT__MODE_FULL 2u  /* runs a program image (`molt run`): full/      */
#define MOLT__MODES_ANY 0xffu

/* What an operation does and what its request carries. */
#define MOLT__OPF_CHANGES 1u  /* changes the program: refused in the refusing
                                 state, run under the operation lock        */
#define MOLT__OPF_REPORT 2u   /* answers with records to show (--json)       */
#define MOLT__OPF_POLICY 4u   /* request record "policy" (immediate, ...)    */
#define MOLT__OPF_TIMEOUT 8u  /* request record "timeout_ms"                 */
#define MOLT__OPF_INTERIOR 16u /* request record "check_interior" (0 or 1)   */
#define MOLT__OPF_CALLBACKS 32u /* request record "callback_timeout_ms"      */
#define MOLT__OPF_RULES 64u   /* request records "rules_name", "rules" (text) */
#define MOLT__OPF_RETRIES 128u /* request records "retries", "retry_delay_ms" */
/* clang-format on */

/*
 * The operations: one line each.  This table is the only place an operation
 * is spelled out: the op codes, their names on the wire and on the command
 * line, what a request carries, the runtime's dispatch table (flags, modes)
 * and the CLI's commands and `molt help` all derive from it.  Adding an
 * operation is one line here plus its handlers: in the runtime a mode's
 * ops[] entry (or the service's own), in the CLI cli_cmd_<name>
 * (src/cli/cmd_<name>.c), which the generated command table names.
 *
 *   XX(NAME, name, code, flags, modes, file, summary)
 *     code     the frame header's kind; codes ascend, are never reused
 *     flags    MOLT__OPF_*
 *     modes    MOLT__MODE_* in which the runtime carries it out
 *     file     what its "path" record names ("patch", "image"); NULL: none
 *     summary  one line for `molt help`
 */
/* clang-format off */
#define MOLT__OPS(XX)                                                          \
  XX(STATUS, status, 1, MOLT__OPF_REPORT, MOLT__MODES_ANY, NULL,               \
     "generation, patches, functions, threads")                               \
  XX(APPLY, apply, 2, MOLT__OPF_CHANGES | MOLT__OPF_POLICY | MOLT__OPF_TIMEOUT | \
     MOLT__OPF_CALLBACKS,                                                     \
     MOLT__MODE_HOT, "patch", "apply a hot patch (default: immediate, 10 s)")  \
  XX(ROLLBACK, rollback, 3, MOLT__OPF_CHANGES | MOLT__OPF_POLICY | MOLT__OPF_TIMEOUT, \
     MOLT__MODE_HOT | MOLT__MODE_FULL, NULL,                                   \
     "return to the previous generation; in a program image, end a "         \
     "shadowed update's follower (after promote: the old version leads again)")                                             \
  XX(LOG, log, 4, MOLT__OPF_REPORT, MOLT__MODES_ANY, NULL,                     \
     "the process's update log")                                              \
  XX(UPDATE, update, 5, MOLT__OPF_CHANGES | MOLT__OPF_TIMEOUT | MOLT__OPF_INTERIOR, \
     MOLT__MODE_FULL, "image",                                                 \
     "full update: replace the running program image, migrate its state "     \
     "and restart its threads in the new version (default 10 s)")             \
  XX(SHADOW, shadow, 6, MOLT__OPF_CHANGES | MOLT__OPF_TIMEOUT | MOLT__OPF_RULES |  \
     MOLT__OPF_RETRIES, MOLT__MODE_FULL,                                       \
     "image",                                                                  \
     "shadowed full update (also 'molt update --shadow'): a forked follower "  \
     "updates and replays the leader's calls, the leader serves on")           \
  XX(PROMOTE, promote, 7, MOLT__OPF_CHANGES | MOLT__OPF_TIMEOUT,                 \
     MOLT__MODE_FULL, NULL,                                                    \
     "a shadowed update's new version leads, the old one follows (rollback "  \
     "returns to it, commit keeps the new one)")                               \
  XX(COMMIT, commit, 8, MOLT__OPF_CHANGES | MOLT__OPF_TIMEOUT,                   \
     MOLT__MODE_FULL, NULL,                                                    \
     "keep a shadowed update's new version: the follower ends, the process "  \
     "updates in place (keeps its pid)")
/* clang-format on */

typedef enum {
#define MOLT__OP_ENUM(NAME, name, code, ...) MOLT__OP_##NAME = (code),
  MOLT__OPS(MOLT__OP_ENUM)
#undef MOLT__OP_ENUM
} molt__op;

/* One past the last (and, codes ascending, highest) code: the size of
 * tables indexed by op.  Not a molt__op, so that a switch over the
 * operations need not name it. */
/* clang-format off */
enum {
#define MOLT__OP_AFTER(NAME, name, code, ...) MOLT__OP_AFTER_##NAME = (code),
  MOLT__OPS(MOLT__OP_AFTER)
#undef MOLT__OP_AFTER
  MOLT__OP_END
};
/* clang-format on */

typedef struct molt__op_info {
  molt__op op;
  const char *name;    /* on the wire (messages) and on the command line */
  unsigned flags;      /* MOLT__OPF_* */
  unsigned modes;      /* MOLT__MODE_* */
  const char *file;    /* what the path names; NULL: the request has none */
  const char *summary; /* for `molt help` */
} molt__op_info;

/* The table entry of op code `op`, or NULL if there is no such operation. */
MOLT__HIDDEN const molt__op_info *molt__op_find(unsigned op);
/* Every operation, in code order (n: their number). */
MOLT__HIDDEN const molt__op_info *molt__op_all(size_t *n);

/* ---- requests ------------------------------------------------------------- */

#define MOLT__DEFAULT_TIMEOUT_MS 10000
/* How long an apply waits for each callback of the patch (molt.h). */
#define MOLT__DEFAULT_CALLBACK_TIMEOUT_MS 5000
/* A shadowed update's retries (docs/design.md §17, **Retries**): at most
 * this many after the first attempt, each started this long (by default)
 * after the last attempt's follower ended, the delay at most a hour. */
#define MOLT__MAX_RETRIES 100
#define MOLT__DEFAULT_RETRY_DELAY_MS 1000
#define MOLT__MAX_RETRY_DELAY_MS 3600000

/* One operation with its arguments, as the runtime carries it out. */
typedef struct molt__request {
  molt__op op;
  molt_policy_t policy;
  int timeout_ms;          /* < 0: MOLT__DEFAULT_TIMEOUT_MS */
  int callback_timeout_ms; /* <= 0: MOLT__DEFAULT_CALLBACK_TIMEOUT_MS */
  bool check_interior;     /* update: refuse interior pointers into objects */
  char path[4096];         /* absolute; "" for operations without a file */
  /* The open file of an apply or update (issue 16): received with the
   * request (SCM_RIGHTS) or opened by the calling thread (molt_apply); the
   * runtime reads only this, never `path` (kept for messages).  Owned by
   * whoever built the request, who closes it; has_fd false: none. */
  bool has_fd;
  int fd;
  int open_errno; /* !has_fd: why the caller could not open path (0: no try) */
  /* shadow: the rule file's text (rules_len bytes, not NUL-terminated;
   * 0: none) and its name for messages.  Parsed by the runtime again. */
  size_t rules_len;
  char rules_name[256];
  char rules[8192]; /* MOLT__RULES_MAX_TEXT (common.h) */
  /* shadow: how many times a follower that diverged or failed is replaced
   * by a new one (0: none, the default), and how long after its end the
   * next one forks (< 0: MOLT__DEFAULT_RETRY_DELAY_MS). */
  int retries;
  int retry_delay_ms;
} molt__request;

/* "immediate", "local", "global", or NULL for anything else. */
MOLT__HIDDEN const char *molt__policy_name(molt_policy_t p);
/* The policy named s; false if s names none. */
MOLT__HIDDEN bool molt__policy_parse(const char *s, molt_policy_t *out);
/* Appends the request records of req, as its operation's flags say (path,
 * policy or check_interior, timeout_ms, callback_timeout_ms, rules,
 * retries and retry_delay_ms -- the last two only when retries > 0, so
 * that a request without retries is what older runtimes read). */
MOLT__HIDDEN void molt__request_encode(const molt__request *req, molt__buf *out);
struct molt__records; /* the parsed TSV payload, below */
/* Builds *req from the records of a request for operation `op` (already
 * known to exist).  Unknown keys are ignored so that newer clients can add
 * optional fields; records an operation does not take are ignored too.
 * MOLT_EPOLICY, MOLT_EPROTO or MOLT_EINVAL with a one-line reason. */
MOLT__HIDDEN int molt__request_decode(unsigned op, const struct molt__records *recs,
                                      molt__request *req, char *err, size_t errlen);

/* ---- framing -------------------------------------------------------------- */

#define MOLT__PROTO_MAGIC 0x544c4f4du /* "MOLT" as little-endian bytes */
#define MOLT__PROTO_VERSION 1u
#define MOLT__PROTO_HDR_SIZE 16u
#define MOLT__PROTO_MAX_REQUEST (64u * 1024u)
#define MOLT__PROTO_MAX_RESPONSE (16u * 1024u * 1024u)
/* Parser bounds.  A request never needs more than a handful of records; a
 * response (status of a program with --molt-updatable=all, the whole log)
 * may have many, so the caller chooses the record bound. */
#define MOLT__PROTO_MAX_RECORDS 4096u
#define MOLT__PROTO_MAX_RESPONSE_RECORDS (1u << 20)
#define MOLT__PROTO_MAX_FIELDS 64u
/* Abstract socket name without its leading NUL: "molt.<pid>". */
#define MOLT__PROTO_NAME_PREFIX "molt."
/* How long the server gives one client to send its request and to take
 * the response (each), counted by the runtime's poll loop for each client
 * on its own (service/control.c). */
#define MOLT__PROTO_SERVER_IO_MS 2000

typedef struct molt__frame_hdr {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;   /* request: molt__op; response: 0 */
  int32_t status;  /* request: 0; response: 0 or MOLT_E* */
  uint32_t length; /* payload bytes that follow the header */
} molt__frame_hdr;

typedef enum { MOLT__FRAME_REQUEST, MOLT__FRAME_RESPONSE } molt__frame_type;

/* Writes h into 16 bytes, little endian. */
MOLT__HIDDEN void molt__proto_encode_hdr(const molt__frame_hdr *h,
                                         unsigned char out[MOLT__PROTO_HDR_SIZE]);
/*
 * Decodes and validates 16 header bytes.  h is filled even on failure (as
 * far as it was read) so the caller can report what it saw.
 *   MOLT_EPROTO    bad magic, unknown op (request) or kind != 0 (response),
 *                  non-zero status in a request or positive status in a
 *                  response, payload longer than the maximum for `type`
 *   MOLT_EVERSION  magic fine, version != MOLT__PROTO_VERSION
 * The magic is checked first (garbage is EPROTO, not EVERSION), the version
 * second (a newer peer may have new ops).  err gets a one-line reason.
 */
MOLT__HIDDEN int molt__proto_decode_hdr(const unsigned char in[MOLT__PROTO_HDR_SIZE],
                                        molt__frame_type type, molt__frame_hdr *h,
                                        char *err, size_t errlen);

/* ---- TSV payloads ------------------------------------------------------ */

typedef struct molt__record {
  size_t nfields;      /* >= 1: an empty line is one empty field */
  const char **fields; /* NUL-terminated, unescaped */
} molt__record;

typedef struct molt__records {
  molt__record *recs;
  size_t count;
  char *text;          /* owned: the unescaped copy fields point into */
  const char **fieldv; /* owned: all field pointers */
} molt__records;

/*
 * Parses a payload of `len` bytes into records (the input is not modified
 * and need not be NUL-terminated).  MOLT_EPROTO when: a NUL byte appears
 * anywhere (fields are C strings), the last record lacks its newline, a
 * record has more than MOLT__PROTO_MAX_FIELDS fields, there are more than
 * max_records records, or an escape is not one of \\ \t \n.  MOLT_ENOMEM
 * if memory runs out.  On failure *out is empty and needs no free.
 */
MOLT__HIDDEN int molt__tsv_parse(const char *data, size_t len, size_t max_records,
                                 molt__records *out, char *err, size_t errlen);
MOLT__HIDDEN void molt__tsv_free(molt__records *r);
/* First record whose first field equals key, or NULL. */
MOLT__HIDDEN const molt__record *molt__tsv_find(const molt__records *r, const char *key);
/* Field i of rec, or "" if the record is shorter (old peers send fewer
 * fields; newer peers may send more, which are ignored). */
MOLT__HIDDEN const char *molt__tsv_field(const molt__record *rec, size_t i);

/* Appends s (n bytes) escaped for use inside one field. */
MOLT__HIDDEN void molt__tsv_escape(molt__buf *b, const char *s, size_t n);
/* Unescapes in place; returns the new length or MOLT_EPROTO on a bad
 * escape (a backslash at the end or before anything but \ t n).  The
 * result is NUL-terminated when the input had room (new length < n, or
 * the caller put a NUL at s[n]). */
MOLT__HIDDEN long molt__tsv_unescape(char *s, size_t n);

/* ---- I/O with deadlines ------------------------------------------------ */

/* CLOCK_MONOTONIC now + ms, in ns (the deadline form used below). */
MOLT__HIDDEN uint64_t molt__proto_deadline(int64_t ms);
/*
 * Reads exactly n bytes from socket fd by poll + recv(MSG_DONTWAIT), so the
 * deadline holds whatever the socket's blocking mode.  Returns 0,
 * MOLT_ETIMEDOUT, MOLT_EPROTO (end of stream before n bytes; *got tells
 * how many arrived, so 0 means the peer closed cleanly), or MOLT_EIO
 * (socket error; errno is kept).  got may be NULL.
 */
MOLT__HIDDEN int molt__proto_read_full(int fd, void *buf, size_t n, uint64_t deadline_ns,
                                       size_t *got);
/* Writes exactly n bytes with send(MSG_NOSIGNAL) (a vanished peer is an
 * error, never SIGPIPE).  0, MOLT_ETIMEDOUT or MOLT_EIO (errno kept). */
MOLT__HIDDEN int molt__proto_write_full(int fd, const void *buf, size_t n,
                                        uint64_t deadline_ns);

/* The runtime's check that a descriptor is still its own (the host may
 * close it and reuse the number: runtime/base/base.h).  The guarded
 * variants below call ours(arg) before every recv and send and stop with
 * MOLT_EIO (errno EBADF) when it says no; the plain ones use no guard. */
typedef struct molt__io_guard {
  bool (*ours)(const void *arg);
  const void *arg;
} molt__io_guard;
MOLT__HIDDEN int molt__proto_write_full_guarded(int fd, const void *buf, size_t n,
                                                uint64_t deadline_ns,
                                                const molt__io_guard *guard);

/* Sends header + payload. */
MOLT__HIDDEN int molt__proto_send(int fd, const molt__frame_hdr *h, const void *payload,
                                  uint64_t deadline_ns);
/* The same with the open descriptor `pass` attached to the header
 * (SCM_RIGHTS; -1: none): how the CLI hands over the file of an apply or
 * update (docs/protocol.md). */
MOLT__HIDDEN int molt__proto_send_fd(int fd, const molt__frame_hdr *h,
                                     const void *payload, uint64_t deadline_ns, int pass);
/*
 * Reads and validates one message: header, then its payload into a malloc'd
 * buffer (*payload, NUL-terminated for convenience; NULL when empty).
 * Errors: those of molt__proto_decode_hdr and molt__proto_read_full, except
 * that a peer closing before sending a single byte is MOLT_ECONNECT (not a
 * malformed message: it said nothing at all), and MOLT_ENOMEM.  On a header
 * error *h holds what was decoded.
 */
MOLT__HIDDEN int molt__proto_recv(int fd, molt__frame_type type, molt__frame_hdr *h,
                                  char **payload, uint64_t deadline_ns, char *err,
                                  size_t errlen);
MOLT__HIDDEN int molt__proto_recv_guarded(int fd, molt__frame_type type,
                                          molt__frame_hdr *h, char **payload,
                                          uint64_t deadline_ns, char *err, size_t errlen,
                                          const molt__io_guard *guard);

/* One recv (MSG_DONTWAIT) that also takes the descriptors the peer sent
 * with SCM_RIGHTS (recvmsg, MSG_CMSG_CLOEXEC: a received descriptor never
 * leaks into a child the host execs): the first goes to *passed if it is
 * still -1; any other is closed at once and *extra set, as is *extra when
 * the kernel had to drop some (MSG_CTRUNC).  passed NULL: a plain recv.
 * The control server reads every request with it (control.c). */
MOLT__HIDDEN ssize_t molt__proto_recv_passing(int fd, void *buf, size_t n, int *passed,
                                              bool *extra);

/* ---- addressing -------------------------------------------------------- */

/* The abstract name (without its leading NUL) of pid's control socket:
 * "molt.<pid>", or with a suffix the fallback "molt.<pid>.<suffix>" that
 * a process takes when another socket holds its name (docs/protocol.md:
 * the CLI finds it in /proc/net/unix and checks the peer's pid). */
MOLT__HIDDEN void molt__proto_socket_name(pid_t pid, const char *suffix, char *buf,
                                          size_t len);
/* Fills the abstract address named `name` (without its NUL); returns the
 * address length to pass to bind/connect (abstract names are length-exact:
 * no trailing NUL is part of the name). */
MOLT__HIDDEN socklen_t molt__proto_sockaddr_named(const char *name,
                                                  struct sockaddr_un *sa);
/* The same for pid's primary name "molt.<pid>". */
MOLT__HIDDEN socklen_t molt__proto_sockaddr(pid_t pid, struct sockaddr_un *sa);

#endif /* MOLT_PROTOCOL_H */
