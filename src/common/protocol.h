/*
 * protocol.h — the control protocol codec, shared by libmolt (control.c) and
 * the `molt` CLI, which compiles protocol.c, buf.c and errors.c directly.
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

/* The CLI and the tests compile this without the runtime: they must not
 * emit molt.h's module constructor, which calls into libmolt. */
#ifndef MOLT__NO_AUTO_REGISTER
#define MOLT__NO_AUTO_REGISTER 1
#endif

#include "internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

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
 * the response (each); also SO_RCVTIMEO/SO_SNDTIMEO of accepted sockets. */
#define MOLT__PROTO_SERVER_IO_MS 2000

typedef struct molt__frame_hdr {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;   /* request: molt__op; response: 0 */
  int32_t status;  /* request: 0; response: 0 or MOLT_E* */
  uint32_t length; /* payload bytes that follow the header */
} molt__frame_hdr;

typedef enum {
  MOLT__FRAME_REQUEST,
  MOLT__FRAME_RESPONSE
} molt__frame_type;

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
                                        molt__frame_type type,
                                        molt__frame_hdr *h, char *err,
                                        size_t errlen);
/* Name of an op code for messages ("status", "apply", ...), or NULL. */
MOLT__HIDDEN const char *molt__proto_op_name(unsigned op);

/* ---- TSV payloads ------------------------------------------------------ */

typedef struct molt__record {
  size_t nfields;      /* >= 1: an empty line is one empty field */
  const char **fields; /* NUL-terminated, unescaped */
} molt__record;

typedef struct molt__records {
  molt__record *recs;
  size_t count;
  char *text;           /* owned: the unescaped copy fields point into */
  const char **fieldv;  /* owned: all field pointers */
} molt__records;

/*
 * Parses a payload of `len` bytes into records (the input is not modified
 * and need not be NUL-terminated).  MOLT_EPROTO when: a NUL byte appears
 * anywhere (fields are C strings), the last record lacks its newline, a
 * record has more than MOLT__PROTO_MAX_FIELDS fields, there are more than
 * max_records records, or an escape is not one of \\ \t \n.  MOLT_ENOMEM
 * if memory runs out.  On failure *out is empty and needs no free.
 */
MOLT__HIDDEN int molt__tsv_parse(const char *data, size_t len,
                                 size_t max_records, molt__records *out,
                                 char *err, size_t errlen);
MOLT__HIDDEN void molt__tsv_free(molt__records *r);
/* First record whose first field equals key, or NULL. */
MOLT__HIDDEN const molt__record *molt__tsv_find(const molt__records *r,
                                                const char *key);
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
MOLT__HIDDEN int molt__proto_read_full(int fd, void *buf, size_t n,
                                       uint64_t deadline_ns, size_t *got);
/* Writes exactly n bytes with send(MSG_NOSIGNAL) (a vanished peer is an
 * error, never SIGPIPE).  0, MOLT_ETIMEDOUT or MOLT_EIO (errno kept). */
MOLT__HIDDEN int molt__proto_write_full(int fd, const void *buf, size_t n,
                                        uint64_t deadline_ns);

/* Sends header + payload. */
MOLT__HIDDEN int molt__proto_send(int fd, const molt__frame_hdr *h,
                                  const void *payload, uint64_t deadline_ns);
/*
 * Reads and validates one message: header, then its payload into a malloc'd
 * buffer (*payload, NUL-terminated for convenience; NULL when empty).
 * Errors: those of molt__proto_decode_hdr and molt__proto_read_full, except
 * that a peer closing before sending a single byte is MOLT_ECONNECT (not a
 * malformed message: it said nothing at all), and MOLT_ENOMEM.  On a header
 * error *h holds what was decoded.
 */
MOLT__HIDDEN int molt__proto_recv(int fd, molt__frame_type type,
                                  molt__frame_hdr *h, char **payload,
                                  uint64_t deadline_ns, char *err,
                                  size_t errlen);

/* ---- addressing -------------------------------------------------------- */

/* Fills the abstract address of pid's control socket; returns the address
 * length to pass to bind/connect (abstract names are length-exact: no
 * trailing NUL is part of the name). */
MOLT__HIDDEN socklen_t molt__proto_sockaddr(pid_t pid, struct sockaddr_un *sa);

#endif /* MOLT_PROTOCOL_H */
