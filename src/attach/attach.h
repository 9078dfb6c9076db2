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
 *   levels.c      patches stacked on one process: levels, what a patch
 *                 on top takes from the one below, what status shows
 *   callback.c    the patch's pre/post-update callbacks, run in the
 *                 target on a borrowed thread
 *   all.c         attach --all: every process of a program, all or none
 *   os_linux.c    the OS axis: /proc, ptrace (stop every thread, run one
 *                 system call, or code until a trap, on a stopped
 *                 thread), the target's memory
 *   arch_x86_64.c the architecture axis: instruction decoding (capstone),
 *                 the jump, the registers of a system call and of a call
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

#define MOLT__ATTACH_MAX_FUNCS 1024
#define MOLT__ATTACH_MAX_BYTES 16  /* rewritten bytes per function, at most */
#define MOLT__ATTACH_MAX_LEVELS 16 /* patches stacked on one process, at most */

/* One replaced function of an attached process. */
typedef struct molt__attach_func {
  char name[128];
  uint64_t addr;                        /* the function's entry in the target */
  uint64_t at;                          /* where the jump is written (after endbr64) */
  unsigned len;                         /* bytes written at `at` */
  uint8_t orig[MOLT__ATTACH_MAX_BYTES]; /* what was there: the original bytes, or
                                           the jump of the patch below (levels.c) */
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
  int level;                     /* its place in the stack: 1 the first patch */
  unsigned long long start_time; /* the target's start (/proc/PID/stat field 22) */
  char build_id[81];
  char patch[4096];              /* the patch file, absolute */
  uint64_t code_start, code_end; /* the staged mapping, state page included */
  double stop_ms;                /* how long the threads were stopped */
  int threads;                   /* how many were stopped */
  int attempts;                  /* stops until no thread was in the way */
  int stepped;                   /* threads single-stepped out of the bytes */
  long long time;                /* of the last change (Unix time) */
  char note[256];                /* e.g. why the staged code is kept mapped */
  char callbacks[256];           /* what its pre/post-update callbacks did */
  size_t nfuncs;
  molt__attach_func funcs[MOLT__ATTACH_MAX_FUNCS];
  /* Where this run's time went (not saved in the record): its steps in
   * order, each with its wall time (attach: prepare, staging, pre, stop,
   * finish; rollback: prepare, stop, finish). */
  size_t nphases;
  struct {
    const char *name;
    double ms;
  } phases[8];
} molt__attach_state;

typedef struct molt__attach_opts {
  pid_t pid;
  const char *patch;       /* path of the patch file */
  int timeout_ms;          /* for threads in the way; < 0: 10 s */
  int callback_timeout_ms; /* for each callback of the patch; <= 0: 5 s */
  bool check_active;       /* no thread may be inside or return into a function */
} molt__attach_opts;

/* Attaches the patch to process o->pid.  On success *st is the new state.
 * 0, or MOLT_EPERM (ptrace refused), MOLT_ENOENT (no such process or
 * file), MOLT_EBUILDID, MOLT_ENOTPATCH, MOLT_ECORRUPT, MOLT_ENOSYM,
 * MOLT_EAMBIGUOUS, MOLT_ENOFUNC (a function cannot take the jump),
 * MOLT_ETIMEDOUT (a thread stayed in the way), MOLT_EBUSY (an unfinished
 * attach below, or the stack full), MOLT_ECALLBACK (the pre-update
 * callback refused, crashed or timed out: nothing changed), MOLT_EIO,
 * MOLT_ENOMEM, with a one-line message in err.  A process with patches
 * attached already gets this one stacked on top (levels.c). */
MOLT__HIDDEN int molt__attach(const molt__attach_opts *o, molt__attach_state *st,
                              char *err, size_t errlen);

/* Pops the newest patch of pid's stack: restores the bytes every function
 * it replaced had before it (the original bytes, or the jump of the patch
 * below) and unmaps its staged code if no thread can run it any more
 * (else keeps it and says why in st->note; a later rollback or attach
 * tries again).  *st is the popped patch.  0, MOLT_ENOHISTORY (not
 * attached), or the errors of molt__attach. */
MOLT__HIDDEN int molt__attach_rollback(pid_t pid, int timeout_ms, molt__attach_state *st,
                                       char *err, size_t errlen);

/* The most memory a rollback's (or a reclamation's) scan for pointers into
 * the patch reads while every thread is stopped, in bytes (default
 * MOLT__ATTACH_SCAN_LIMIT_MIB MiB; scan.c).  Past it the code stays mapped
 * and the note says so. */
#define MOLT__ATTACH_SCAN_LIMIT_MIB 64
MOLT__HIDDEN void molt__attach_scan_limit(uint64_t bytes);

/* The signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) that interrupted the last
 * molt__attach or molt__attach_rollback at a safe point, or 0.  They are
 * blocked while either runs; the caller reports the interruption and may
 * then end with the signal. */
MOLT__HIDDEN int molt__attach_interrupted(void);

/* molt's own priority for the rest of its run (os_linux.c says why):
 * raised to SCHED_FIFO 1 (else nice -20) when molt runs under the normal
 * policy and may raise it (root, CAP_SYS_NICE, RLIMIT_RTPRIO >= 1), else
 * left as it is.  The CLI calls it first thing in `molt attach` and `molt
 * rollback` and keeps the priority until it exits (the attach and rollback
 * take it again, nested); molt__attach_lower puts it back (a rollback of a
 * molt process, which goes through its control socket). */
typedef struct molt__attach_priority {
  char how[160];      /* "SCHED_FIFO 1", "nice -20 (...)", "normal: ..." */
  bool raised;        /* above the normal policy now (raised, or started so) */
  bool not_permitted; /* under the normal policy and may not leave it */
  double start_ms;    /* from its process's creation to the raise: on a CPU
                         and waiting for one (not blocked); < 0 unknown */
  double waited_ms;   /* of which waiting for a CPU; < 0 unknown */
} molt__attach_priority;
MOLT__HIDDEN void molt__attach_raise(molt__attach_priority *p);
MOLT__HIDDEN void molt__attach_lower(void);

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

/* The attach state of pid: the newest patch still applied (else the
 * newest rolled-back one whose code is kept mapped).  0, MOLT_ENOHISTORY
 * (never attached, or the record belongs to an earlier process with the
 * same pid), MOLT_ECORRUPT. */
MOLT__HIDDEN int molt__attach_state_load(pid_t pid, molt__attach_state *st, char *err,
                                         size_t errlen);

/* molt attach --all (all.c): what happened to each process of the program. */
typedef enum molt__attach_outcome {
  MOLT__ATTACH_NOT_TRIED,       /* after the one that failed: untouched */
  MOLT__ATTACH_DONE,            /* patched (and stays so: all succeeded) */
  MOLT__ATTACH_FAILED,          /* the failure that stopped the run */
  MOLT__ATTACH_ROLLED_BACK,     /* patched, then its patch popped again */
  MOLT__ATTACH_ROLLBACK_FAILED, /* patched, and popping it failed (err) */
  MOLT__ATTACH_GONE,            /* exited before it was patched */
} molt__attach_outcome;
typedef struct molt__attach_one {
  pid_t pid;
  molt__attach_outcome outcome;
  int rc;
  char err[512];
  molt__attach_state st; /* as attached (DONE, ROLLED_BACK) */
} molt__attach_one;
/* Attaches the patch o->patch (o->pid ignored) to every running process
 * whose program has the build-id of the file `program`, in pid order; the
 * first failure rolls back those patched before it.  *out (malloc'ed, *n
 * entries, also on failure once processes were found) says what happened
 * to each.  0; or the first failure's code, err naming its process; or,
 * before any process is touched, MOLT_ENOENT (no program, no process of
 * it), MOLT_EBUILDID (the patch is for another program), the patch file's
 * refusals. */
MOLT__HIDDEN int molt__attach_all(const char *program, const molt__attach_opts *o,
                                  molt__attach_one **out, size_t *n, char *err,
                                  size_t errlen);

/* Every patch of pid's stack, the first (level 1) first, rolled-back ones
 * whose code is still mapped included: 0 with s->n >= 1, MOLT_ENOHISTORY,
 * MOLT_ECORRUPT, MOLT_ENOMEM.  Free it with molt__attach_stack_free. */
typedef struct molt__attach_stack {
  size_t n;
  molt__attach_state *levels;
} molt__attach_stack;
MOLT__HIDDEN int molt__attach_stack_load(pid_t pid, molt__attach_stack *s, char *err,
                                         size_t errlen);
MOLT__HIDDEN void molt__attach_stack_free(molt__attach_stack *s);
/* Whether function f of patch s->levels[i] runs now, read from the
 * target: "patched" (its entry jumps to it), "replaced by N" (a patch
 * stacked above, level N, replaced it again), "original" (its bytes from
 * before the patch), "changed" (neither: someone else wrote there). */
MOLT__HIDDEN void molt__attach_stack_func_state(pid_t pid, const molt__attach_stack *s,
                                                size_t i, const molt__attach_func *f,
                                                char *buf, size_t len);

/* Whether function f of the state is patched now, read from the target's
 * memory: 1 patched, 0 original bytes, -1 neither (or unreadable). */
MOLT__HIDDEN int molt__attach_func_live(pid_t pid, const molt__attach_func *f);

#endif /* MOLT_ATTACH_H */
