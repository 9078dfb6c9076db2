/*
 * attach -- hot patches for running processes that were never built with
 * molt (`molt attach`, issue 13).  A layer of its own on the common layer:
 * the CLI calls it, libmolt never does (the target has no libmolt).
 *
 *   attach.c      the operations: attach, rollback, status; their order of
 *                 steps and what each one checks
 *   patch.c       the attach patch: reading it, resolving its references
 *                 through the target's symbol tables, relocating it in the
 *                 tool for the address it will have in the target
 *   state.c       where an attached process's state lives (a page in the
 *                 target and a record under /run/molt/attach/<pid>)
 *   os_linux.c    the OS axis: /proc, ptrace (stop every thread, run one
 *                 system call on a stopped thread), the target's memory
 *   arch_x86_64.c the architecture axis: instruction decoding (capstone),
 *                 the jump, the registers of a system call
 *   internal.h    what these files offer each other
 *
 * Nothing here prints or exits: failures are a MOLT_E* code and a one-line
 * message in err.  Whatever fails, the target keeps running, untouched or
 * (when it failed after the jumps were written) fully patched.
 */
#ifndef MOLT_ATTACH_H
#define MOLT_ATTACH_H

#include "common/common.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define MOLT__ATTACH_MAX_FUNCS 64
#define MOLT__ATTACH_MAX_BYTES 16 /* rewritten bytes per function, at most */

/* One replaced function of an attached process. */
typedef struct molt__attach_func {
  char name[128];
  uint64_t addr;                        /* the function's entry in the target */
  uint64_t at;                          /* where the jump is written (after endbr64) */
  unsigned len;                         /* bytes written at `at` */
  uint8_t orig[MOLT__ATTACH_MAX_BYTES]; /* what was there */
  uint8_t jump[MOLT__ATTACH_MAX_BYTES]; /* what the attach wrote */
  uint64_t new_addr;                    /* the new version, in the staged code */
  /* the whole function, for --check-active (not kept in the record) */
  uint64_t size;
  uint64_t cold, cold_size; /* its gcc .cold part, if any */
} molt__attach_func;

/* The state of an attached process, as the record and the state page in
 * the target hold it (state.c). */
typedef struct molt__attach_state {
  char phase[16];                /* staged | applying | applied | rolled-back */
  unsigned long long start_time; /* the target's start (/proc/PID/stat field 22) */
  char build_id[81];
  char patch[4096];              /* the patch file, absolute */
  uint64_t code_start, code_end; /* the staged mapping, state page included */
  double stop_ms;                /* how long the threads were stopped */
  int threads;                   /* how many were stopped */
  int attempts;                  /* stops until no thread was in the way */
  long long time;                /* of the last change (Unix time) */
  char note[256];                /* e.g. why the staged code is kept mapped */
  size_t nfuncs;
  molt__attach_func funcs[MOLT__ATTACH_MAX_FUNCS];
} molt__attach_state;

typedef struct molt__attach_opts {
  pid_t pid;
  const char *patch; /* path of the patch file */
  int timeout_ms;    /* for threads in the way; < 0: 10 s */
  bool check_active; /* no thread may be inside or return into a function */
} molt__attach_opts;

/* Attaches the patch to process o->pid.  On success *st is the new state.
 * 0, or MOLT_EPERM (ptrace refused), MOLT_ENOENT (no such process or
 * file), MOLT_EBUILDID, MOLT_ENOTPATCH, MOLT_ECORRUPT, MOLT_ENOSYM,
 * MOLT_EAMBIGUOUS, MOLT_ENOFUNC (a function cannot take the jump),
 * MOLT_ETIMEDOUT (a thread stayed in the way), MOLT_EBUSY (already
 * attached), MOLT_EIO, MOLT_ENOMEM, with a one-line message in err. */
MOLT__HIDDEN int molt__attach(const molt__attach_opts *o, molt__attach_state *st,
                              char *err, size_t errlen);

/* Restores the original bytes of every replaced function of pid and
 * unmaps the staged code if no thread can run it any more (else keeps it
 * and says why in st->note).  0, MOLT_ENOHISTORY (not attached), or the
 * errors of molt__attach. */
MOLT__HIDDEN int molt__attach_rollback(pid_t pid, int timeout_ms, molt__attach_state *st,
                                       char *err, size_t errlen);

/* The signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) that interrupted the last
 * molt__attach or molt__attach_rollback at a safe point, or 0.  They are
 * blocked while either runs; the caller reports the interruption and may
 * then end with the signal. */
MOLT__HIDDEN int molt__attach_interrupted(void);

/* One entry of an attached process's log (log.c). */
typedef struct molt__attach_event {
  unsigned long seq;
  long long time;       /* Unix time */
  char event[16];       /* attach | rollback | reclaim | refused | interrupted */
  char patch[1024];     /* the patch file */
  char functions[1024]; /* comma-separated */
  double stop_ms;       /* how long the threads were stopped */
  int threads;
  char message[512];
} molt__attach_event;
/* The log of pid, oldest first (*ev malloc'ed): 0, MOLT_ENOHISTORY (no
 * log, or one of an earlier process with that pid), MOLT_ENOMEM. */
MOLT__HIDDEN int molt__attach_log_read(pid_t pid, molt__attach_event **ev, size_t *n);

/* The attach state of pid: 0, MOLT_ENOHISTORY (never attached, or the
 * record belongs to an earlier process with the same pid), MOLT_ECORRUPT. */
MOLT__HIDDEN int molt__attach_state_load(pid_t pid, molt__attach_state *st, char *err,
                                         size_t errlen);

/* Whether function f of the state is patched now, read from the target's
 * memory: 1 patched, 0 original bytes, -1 neither (or unreadable). */
MOLT__HIDDEN int molt__attach_func_live(pid_t pid, const molt__attach_func *f);

#endif /* MOLT_ATTACH_H */
