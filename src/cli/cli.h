/*
 * The `molt` command (src/cli/), a client of the control protocol, on the
 * common layer and the attach layer only (common/common.h: the table of operations, requests,
 * the codec).  It never sees a runtime structure.
 *
 *   main.c        the command table (generated from MOLT__OPS, plus the
 *                 local commands), argument parsing, `molt help`
 *   client.c      talking to a process: one request, one response; errors
 *                 and exit codes; the request of a changing operation
 *   output.c      the one output module: aligned tables and JSON, both from
 *                 the same descriptions of the protocol's records
 *   cmd_*.c       one file per command (cmd_attach.c: the attach layer's
 *                 commands, src/attach; rollback and status of an attached
 *                 process go there too)
 *
 * Every failure is ONE line on stderr, `molt: <what failed>: <why>; <what
 * to do>`, and an exit code below.  Whatever the outcome, the target keeps
 * running: the CLI only talks.
 */
#ifndef MOLT_CLI_H
#define MOLT_CLI_H

#include "common/common.h"

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

enum {
  EXIT_OK = 0,
  EXIT_FAILED = 1,  /* the target refused or failed; it runs unchanged */
  EXIT_USAGE = 2,   /* bad command line, missing local file */
  EXIT_CONNECT = 3, /* no such molt process, cannot connect, not permitted */
  EXIT_PROTO = 4    /* malformed or incompatible protocol messages */
};

#define CLIENT_SLACK_MS 5000 /* the client waits the request's timeout + this */
#define PS_TIMEOUT_MS 3000

/* ---- main.c: the parsed command line ----------------------------------------*/
typedef struct cli_args {
  const char *cmd;
  const char *pos[3];
  int npos;
  bool json;
  const char *policy;      /* NULL: not given */
  int timeout_ms;          /* -1: not given */
  int callback_timeout_ms; /* -1: not given */
  bool check_interior;
  bool all;            /* attach --all: pos[0] is a program, not a pid */
  bool check_active;   /* molt attach */
  long scan_limit_mib; /* molt rollback of an attached process; -1: not given */
  bool shadow;         /* update --shadow: the operation shadow */
  const char *rules;   /* update --shadow --rules FILE; NULL: none */
  int retries;         /* update --shadow --retries N; -1: not given */
  int retry_delay_ms;  /* update --shadow --retry-delay SEC; -1: not given */
  pid_t pid;           /* pos[0], for commands that take one */
  int argc;            /* the whole command line (molt run) */
  char **argv;
} cli_args;

/* ---- client.c -----------------------------------------------------------------*/
/* Prints "molt: <formatted>" as one sanitized line on stderr; returns code. */
int cli_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void *cli_xmalloc(size_t n);
void *cli_xrealloc(void *p, size_t n);
char *cli_xstrdup(const char *s);
/* Replaces control characters by '?' (text from the target or a file name
 * must not move the cursor or fake lines on a terminal). */
void cli_sanitize(char *s);
/* The name of process pid, "?" if unknown. */
void cli_comm(pid_t pid, char *buf, size_t len);
bool cli_parse_pid(const char *s, pid_t *out);

typedef struct cli_reply {
  int status; /* the response status: 0 or MOLT_E* */
  char *payload;
  molt__records recs;
} cli_reply;

void cli_reply_free(cli_reply *r);
/* Sends one request to pid and waits up to timeout_ms for the answer.  0
 * with *r filled (r->status: the target's verdict), or, printing nothing,
 * MOLT_ENOTMOLT, MOLT_ECONNECT, MOLT_ETIMEDOUT, MOLT_EPROTO, MOLT_EVERSION,
 * MOLT_ENOMEM with a one-line reason in err. */
int cli_call(pid_t pid, unsigned op, const molt__buf *body, int timeout_ms, cli_reply *r,
             char *err, size_t errlen);
/* cli_call with the open descriptor pass_fd (-1: none) sent along with the
 * request (SCM_RIGHTS): the file of an apply or update. */
int cli_call_fd(pid_t pid, unsigned op, const molt__buf *body, int pass_fd,
                int timeout_ms, cli_reply *r, char *err, size_t errlen);
/* cli_call, and a successful answer: 0, or the exit code after the
 * failure was printed (`what` names the command in the message). */
int cli_request(const char *what, pid_t pid, unsigned op, const molt__buf *body,
                int timeout_ms, cli_reply *r);
int cli_request_fd(const char *what, pid_t pid, unsigned op, const molt__buf *body,
                   int pass_fd, int timeout_ms, cli_reply *r);
/* A report (status, log): cli_request of op for the command's pid; 0 or
 * the exit code after the failure was printed. */
int cli_report(const cli_args *a, unsigned op, cli_reply *r);
/* A changing operation (apply, rollback, update): builds its request from
 * the command line (req->op and req->path set by the caller), sends it, and
 * prints `done` + ": now at generation N (message)" on success. */
int cli_change(const cli_args *a, const char *what, molt__request *req, const char *done);
/* Opens the local file a command sends (O_NONBLOCK, regular files only):
 * *fd open read-only (the caller closes it; it goes to the process with the
 * request), *abs the absolute path of what was opened (for messages); or
 * the exit code after a clear failure: `kind` names the file, `built_by`
 * says how to make one. */
int cli_file_arg(const char *what, const char *arg, const char *kind,
                 const char *built_by, char **abs, int *fd);
/* A changing operation that sends the file a->pos[1] (apply, update,
 * shadow): cli_file_arg, then cli_change with the open file in *req
 * (req->op, and anything else the operation sends, set by the caller).
 * `done` is a format given the pid and the file's absolute path as
 * positional arguments 1 (long) and 2 (string): "applied %2$s to %1$ld". */
int cli_change_with_file(const cli_args *a, const char *what, molt__request *req,
                         const char *kind, const char *built_by, const char *done);

/* ---- output.c -----------------------------------------------------------------*/
/* How a field of a record is shown in JSON. */
enum cli_type {
  CLI_STR = 's',   /* string */
  CLI_NUM = 'n',   /* number, null if the field is not one */
  CLI_BOOL = 'b',  /* true for "1" */
  CLI_OPT = 'e',   /* string, null if empty */
  CLI_PATCH = 'p', /* string, null if empty or "-" */
  CLI_VIEW = 't',  /* "global" / "generation N": members view and generation */
};
/* How a field is shown in a table cell. */
enum cli_show { CLI_AS_IS = 0, CLI_YESNO, CLI_TIME };

typedef struct cli_field {
  const char *json; /* member name */
  int index;        /* field of the record (0 is its key) */
  enum cli_type type;
} cli_field;

typedef struct cli_column {
  const char *header;
  int index;
  enum cli_show show;
} cli_column;

/* Records with one key, seen as a JSON array of objects and as a table. */
typedef struct cli_view {
  const char *key;   /* the records' first field */
  const char *json;  /* name of the JSON array */
  const char *title; /* heading of the table */
  const cli_field *fields;
  const cli_column *columns;
} cli_view;

#define CLI_FIELDS(...) ((const cli_field[]){__VA_ARGS__, {NULL, 0, 0}})
#define CLI_COLUMNS(...) ((const cli_column[]){__VA_ARGS__, {NULL, 0, 0}})

/* Field i of rec, "" if the record is shorter. */
const char *cli_field_of(const molt__record *rec, size_t i);
size_t cli_count(const molt__records *rs, const char *key);

/* An aligned table (the first row is the header); cells are copied and
 * sanitized when added, printed on stdout with `indent`, then freed. */
typedef struct cli_table {
  size_t ncols, nrows, cap;
  char **cells;
} cli_table;
void cli_table_init(cli_table *t, size_t ncols, const char *const *header);
void cli_table_add(cli_table *t, const char *const *row);
void cli_table_print(cli_table *t, const char *indent);
/* The records of view v as a table (no title). */
void cli_table_records(const molt__records *rs, const cli_view *v, const char *indent);

/* The JSON writer: containers nest; a compact container keeps its members
 * on one line, another puts each on a line of its own.  Strings are
 * escaped and always valid UTF-8. */
typedef struct cli_json {
  int depth;
  bool after_key;              /* the next value belongs to the key just written */
  char close[16];              /* per open container: its closing bracket, */
  bool compact[16], empty[16]; /* whether it is compact, still empty */
} cli_json;
void cli_json_object(cli_json *j, bool compact);
void cli_json_array(cli_json *j, bool compact);
void cli_json_end(cli_json *j);
void cli_json_key(cli_json *j, const char *key);
void cli_json_str(cli_json *j, const char *s);
void cli_json_num(cli_json *j, const char *s); /* null if s is not a number */
/* s is a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)? */
bool cli_is_number(const char *s);
void cli_json_bool(cli_json *j, bool b);
void cli_json_null(cli_json *j);
/* The field of rec per f's type (CLI_VIEW writes two members). */
void cli_json_field(cli_json *j, const molt__record *rec, const cli_field *f);
/* "key": [ objects of the records of v ] */
void cli_json_records(cli_json *j, const molt__records *rs, const cli_view *v);
/* The end of the whole document. */
void cli_json_done(cli_json *j);

/* ---- the commands (cmd_*.c) ---------------------------------------------------*/
int cli_cmd_help(const cli_args *a);
int cli_cmd_version(const cli_args *a);
int cli_cmd_ps(const cli_args *a);
int cli_cmd_run(const cli_args *a);
int cli_cmd_status(const cli_args *a);
int cli_cmd_apply(const cli_args *a);
int cli_cmd_rollback(const cli_args *a);
int cli_cmd_log(const cli_args *a);
int cli_cmd_update(const cli_args *a);
int cli_cmd_shadow(const cli_args *a);
int cli_cmd_promote(const cli_args *a);
int cli_cmd_commit(const cli_args *a);
int cli_cmd_attach(const cli_args *a);
/* cmd_attach.c: a process patched by `molt attach` (it has an attach
 * record), and what rollback and status do for it. */
bool cli_attached(pid_t pid);
/* molt's priority raised first thing for an attach or a rollback and kept
 * until it exits (molt__attach_raise says why), or put back (a rollback
 * of a molt process). */
void cli_attach_raise(void);
void cli_attach_lower(void);
int cli_attach_rollback(const cli_args *a);
int cli_attach_status(const cli_args *a);
/* Whether pid has an attach log (molt log shows it), and showing it. */
bool cli_attach_logged(pid_t pid);
int cli_attach_log(const cli_args *a);
/* The usage text (main.c, from the command table). */
void cli_usage(FILE *out);

#endif /* MOLT_CLI_H */
