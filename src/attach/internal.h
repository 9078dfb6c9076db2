/*
 * What the files of the attach layer offer each other (attach.h says who
 * does what).  One axis per file: the architecture (arch_x86_64.c), the OS
 * (os_linux.c), the patch file (patch.c), the state (state.c).
 */
#ifndef MOLT_ATTACH_INTERNAL_H
#define MOLT_ATTACH_INTERNAL_H

#include "attach/attach.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sched.h>
#include <sys/types.h>
#include <sys/user.h>

typedef struct user_regs_struct attach_regs;

/* ---- arch_x86_64.c: instructions, the jump, registers --------------------- */

#define ATTACH_JUMP_LEN 5 /* jmp rel32 */

/* Where and how much of a function's entry a jump replaces. */
typedef struct attach_site {
  uint64_t at;  /* first rewritten byte: the entry, or after its endbr64 */
  unsigned len; /* whole instructions from `at`, >= ATTACH_JUMP_LEN */
} attach_site;

/* Decodes the entry of the function whose code (size bytes, read from the
 * target) is at addr: the site of the jump, refusing a function too short
 * for it, a call whose return address would fall inside the rewritten
 * bytes, and any direct branch of the function into them.  0, MOLT_ENOFUNC
 * (refused, err says why), MOLT_ENOMEM. */
MOLT__HIDDEN int molt__arch_plan(const uint8_t *code, size_t size, uint64_t addr,
                                 attach_site *site, char *err, size_t errlen);
/* Refuses a direct branch in [code, code+size) (at addr) whose target lies
 * in (lo, hi): the other parts of a function (gcc's .cold).  0 or
 * MOLT_ENOFUNC. */
MOLT__HIDDEN int molt__arch_check_branches(const uint8_t *code, size_t size,
                                           uint64_t addr, uint64_t lo, uint64_t hi,
                                           char *err, size_t errlen);
/* The jump from `from` to `to` in out[len]: the rest of the rewritten
 * instructions is filled with int3.  false if `to` is out of reach. */
MOLT__HIDDEN bool molt__arch_jump(uint64_t from, uint64_t to, uint8_t *out, unsigned len);
/* The instruction that enters the kernel (syscall: 0f 05) at p. */
MOLT__HIDDEN bool molt__arch_is_syscall(const uint8_t *p);
#define ATTACH_SYSCALL_LEN 2
/* A signal handler returns to libc's restorer, which runs rt_sigreturn
 * (mov $15, %rax; syscall): a word of a stack pointing at those bytes is
 * the first word of a signal frame, whose saved ip (where the interrupted
 * code goes on when the handler returns) is ATTACH_SIGFRAME_IP_WORD words
 * further up. */
#define ATTACH_RESTORER_LEN 9
MOLT__HIDDEN bool molt__arch_is_restorer(const uint8_t *p);
#define ATTACH_SIGFRAME_IP_WORD 22
#define ATTACH_SIGFRAME_SP_WORD 21 /* the interrupted code's stack pointer */

/* Registers: instruction and stack pointer; a system call's number and
 * arguments set up to run at `insn`; its result. */
MOLT__HIDDEN uint64_t molt__arch_ip(const attach_regs *r);
MOLT__HIDDEN uint64_t molt__arch_sp(const attach_regs *r);
MOLT__HIDDEN void molt__arch_set_syscall(attach_regs *r, uint64_t insn, long nr,
                                         const uint64_t args[6]);
MOLT__HIDDEN long molt__arch_syscall_result(const attach_regs *r);
/* A thread stopped inside a system call (the kernel restarts it on resume
 * or it returned): its number, else -1. */
MOLT__HIDDEN long molt__arch_syscall_nr(const attach_regs *r);
MOLT__HIDDEN long molt__arch_syscall_ret(const attach_regs *r);
/* Makes the thread enter system call nr again on resume (its arguments are
 * still in their registers): ip back onto the syscall instruction. */
MOLT__HIDDEN void molt__arch_restart_syscall(attach_regs *r, long nr);

/* A call of fn() set up in r (callback.c): the stack pointer below the red
 * zone and below `below`, aligned; returns the stack address where the
 * return address must be written.  The int fn returned, once it has. */
MOLT__HIDDEN uint64_t molt__arch_prepare_call(attach_regs *r, uint64_t fn,
                                              uint64_t below);
MOLT__HIDDEN int molt__arch_call_result(const attach_regs *r);

/* ---- os_linux.c: /proc, ptrace, memory ------------------------------------- */

typedef struct attach_thread {
  pid_t tid;
  int sig;           /* a signal its stop held back, delivered on resume */
  bool stopped;      /* seized and stopped (regs valid) */
  attach_regs regs;  /* as stopped */
  bool regs_changed; /* regs must be written back before resume */
} attach_thread;

typedef struct attach_stop {
  pid_t pid;
  attach_thread *t;
  size_t n, cap;
  double ms; /* from the first interrupt to the last resume */
  uint64_t t0_ns;
  bool hurried; /* took molt__os_hurry (a stop of every thread) */
} attach_stop;

/* Seizes and interrupts every thread of pid, including threads created in
 * the meantime, until all are stopped; fixes up system calls the stop
 * would end with EINTR.  0, MOLT_EPERM, MOLT_ENOENT, MOLT_EIO, MOLT_ENOMEM
 * (then nothing is left stopped). */
MOLT__HIDDEN int molt__os_stop_all(pid_t pid, attach_stop *s, char *err, size_t errlen);
/* Seizes and interrupts one thread only (the staging step). */
MOLT__HIDDEN int molt__os_stop_one(pid_t pid, pid_t tid, attach_stop *s, char *err,
                                   size_t errlen);
/* molt's own priority raised (SCHED_FIFO 1, else nice -20) for a run, and
 * put back; nested calls count (os_linux.c says why). */
MOLT__HIDDEN void molt__os_hurry(void);
MOLT__HIDDEN void molt__os_unhurry(void);
/* A thread that was in the way at a stop must run to get out of it, and
 * a stop interrupts it as soon as it gets a CPU: a stop taken again before
 * it has run finds it where it was, and takes its turn again (measured:
 * 100 busy threads on 2 cores, the same thread at the same ip for 60 stops
 * in a row, 128 ms apart).  molt__os_runs reads how many times thread tid
 * has been given a CPU (false: unknown).  molt__os_wait_ran sleeps until
 * min_ns has passed and the count has passed `runs` (the thread has run
 * since it was resumed; tid 0 or a count unknown: at once), or max_ns, or
 * a SIGINT/SIGTERM of molt is pending (molt__interrupt_pending). */
MOLT__HIDDEN bool molt__os_runs(pid_t pid, pid_t tid, uint64_t *runs);
MOLT__HIDDEN void molt__os_wait_ran(pid_t pid, pid_t tid, uint64_t runs, uint64_t min_ns,
                                    uint64_t max_ns);
/* A thread of the target at SCHED_FIFO 1 for the staging window (only a
 * thread under a normal policy, and only if molt may), with a guardian
 * process that puts its policy back if molt dies inside the window;
 * unboost puts it back and ends the guardian (os_linux.c says why). */
typedef struct attach_boost {
  pid_t tid;
  int policy; /* as sched_getscheduler returned it */
  struct sched_param param;
  pid_t guard; /* the guardian, 0: none */
  int fd;      /* molt's end of the guardian's pipe */
  bool on;     /* raised */
} attach_boost;
MOLT__HIDDEN void molt__os_boost(pid_t tid, attach_boost *b);
MOLT__HIDDEN void molt__os_unboost(attach_boost *b);
/* Writes back changed registers and detaches from every stopped thread;
 * sets s->ms.  Frees s. */
MOLT__HIDDEN void molt__os_resume_all(attach_stop *s);
/* Runs system call nr on stopped thread t, its registers restored after.
 * 0 with *ret (the kernel's result, -errno on failure) or MOLT_EIO. */
MOLT__HIDDEN int molt__os_syscall(attach_thread *t, uint64_t insn, long nr,
                                  const uint64_t args[6], long *ret, char *err,
                                  size_t errlen);
/* Single-steps stopped thread t (PTRACE_SINGLESTEP) while still(its ip)
 * holds, at most max_steps instructions (*steps: how many ran); t->regs
 * follow.  0 once still() is false; 1 if it is not after max_steps, or t
 * holds a signal its stop kept back, or a signal came in, or the next
 * instruction is a system call (never stepped: it may block).  The
 * thread stays stopped; while it is stepped it runs at SCHED_FIFO 1 (as
 * molt__os_boost raises it), its own policy back before this returns. */
MOLT__HIDDEN int molt__os_step_while(pid_t pid, attach_thread *t,
                                     bool (*still)(uint64_t ip, void *arg), void *arg,
                                     int max_steps, int *steps);
/* Runs stopped thread t from registers r until it stops with SIGSEGV at
 * `trap` (0: returned, *out its registers), a synchronous signal of its
 * own (1: crashed, *sig the signal, *out where), or timeout_ms passes (2:
 * interrupted and stopped again).  Threads it creates are let go; a
 * SIGSTOP is kept for the detach.  The thread is left stopped, its
 * registers those of the stop (the caller restores them), the signal of
 * the stop never delivered.  Or MOLT_EIO, MOLT_ENOENT (the process ended). */
MOLT__HIDDEN int molt__os_run_until(attach_thread *t, const attach_regs *r, uint64_t trap,
                                    int timeout_ms, attach_regs *out, int *sig, char *err,
                                    size_t errlen);
/* The path of the target's /proc file `what` (mem, maps, exe, fd/N)
 * through a live thread: /proc/PID/task/TID/what. */
MOLT__HIDDEN void molt__os_path(pid_t pid, const char *what, char *buf, size_t len);
/* The target's memory through /proc/PID/mem (writes reach read-only
 * text).  0 or a MOLT_E* code. */
MOLT__HIDDEN int molt__os_read(pid_t pid, uint64_t addr, void *buf, size_t n);
MOLT__HIDDEN int molt__os_write(pid_t pid, uint64_t addr, const void *buf, size_t n);
/* The process's start time (/proc/PID/stat field 22); 0 if gone. */
MOLT__HIDDEN unsigned long long molt__os_start_time(pid_t pid);
/* A clear refusal if pid cannot be traced by us (no such process, Yama,
 * other uid): 0, MOLT_ENOENT, MOLT_EPERM. */
MOLT__HIDDEN int molt__os_check_traceable(pid_t pid, char *err, size_t errlen);
MOLT__HIDDEN uint64_t molt__os_now_ns(void);

/* One line of /proc/PID/maps. */
typedef struct attach_map {
  uint64_t start, end, offset;
  bool r, w, x;
  bool shared;    /* MAP_SHARED ('s'), else private */
  char path[512]; /* "" for anonymous mappings */
} attach_map;
/* 0 with *maps (malloc'ed, *n of them) or a MOLT_E* code. */
MOLT__HIDDEN int molt__os_maps(pid_t pid, attach_map **maps, size_t *n);
/* The executable of pid (/proc/PID/exe resolved) and its load bias. */
MOLT__HIDDEN int molt__os_exe(pid_t pid, const attach_map *maps, size_t n, char *path,
                              size_t pathlen, uint64_t *bias, char *err, size_t errlen);
/* The load bias of the ELF file `path` mapped in the process: start of
 * its mapping at file offset 0 minus the first PT_LOAD's page. */
MOLT__HIDDEN bool molt__os_bias_of(const char *path, const attach_map *maps, size_t n,
                                   uint64_t *bias);
/* An existing syscall instruction in executable memory of pid (the vdso,
 * else libc's text). */
MOLT__HIDDEN int molt__os_find_syscall(pid_t pid, const attach_map *maps, size_t n,
                                       uint64_t *insn, char *err, size_t errlen);

/* ---- stack.c: what a stopped thread's stack holds ----------------------------- */

/* The words of a stopped thread's stack, from its stack pointer (8-byte
 * aligned down) to the top of the mapping holding it. */
typedef struct attach_stack {
  uint64_t at; /* address of w[0] */
  uint64_t *w;
  size_t n;
} attach_stack;
/* The target's mappings, read again when a stack pointer lies in none of
 * them (a thread created since they were read has a new stack). */
typedef struct attach_view {
  pid_t pid;
  attach_map *maps;
  size_t n;
  bool fresh;          /* read during this stop */
  int mem;             /* the target's memory, open for the whole check (-1: not) */
  uint64_t (*exec)[2]; /* the executable mappings' [start, end), in order */
  size_t nexec;
  /* addresses known to be (or not be) a signal restorer */
  uint64_t restorer[8], other[256];
  size_t nrestorer, nother;
} attach_view;
MOLT__HIDDEN int molt__view_open(pid_t pid, attach_view *v);
MOLT__HIDDEN void molt__view_close(attach_view *v);
/* 0, or MOLT_ENOENT (sp lies in no mapping, even after reading the maps
 * again), MOLT_EIO, MOLT_ENOMEM. */
MOLT__HIDDEN int molt__stack_read(attach_view *v, uint64_t sp, attach_stack *out);
MOLT__HIDDEN void molt__stack_free(attach_stack *s);
/* The saved ips of the signal frames on the stack (handlers that have
 * not returned yet): up to max in ips; their count. */
MOLT__HIDDEN size_t molt__stack_signal_ips(attach_view *v, const attach_stack *s,
                                           uint64_t *ips, size_t max);
/* The same for the word `word` of each frame (ATTACH_SIGFRAME_SP_WORD: the
 * stack pointer the interrupted code goes back to). */
/* The mapping of v holding addr (and its index in v->maps, if index), or
 * NULL. */
MOLT__HIDDEN const attach_map *molt__attach_map_at(const attach_view *v, uint64_t addr,
                                                   size_t *index);
MOLT__HIDDEN size_t molt__stack_signal_words(attach_view *v, const attach_stack *s,
                                             unsigned word, uint64_t *out, size_t max);

/* ---- scan.c: pointers into the staged code kept in the target's memory ------ */

/* Before a patch's staged code is unmapped: does any 8-byte word of the
 * target's memory (its heap, its images' data, anonymous and writable
 * file mappings, the live part of its stacks) point into it?  A function
 * pointer the patched code stored in a table, or a pointer to one of its
 * string literals, would dangle after the unmap.  Two passes (scan.c says
 * why they are sound): molt__scan_begin while the threads run (the
 * soft-dirty bits cleared first), molt__scan_finish in the stop (the pages
 * written since, the words found by the first pass read again); without
 * soft-dirty tracking everything is read in the stop. */
typedef struct attach_scan {
  pid_t pid;
  uint64_t lo, hi; /* looked for: words with a value in [lo, hi) */
  /* not looked in: the staged range itself, every level's state pages */
  uint64_t skip[MOLT__ATTACH_MAX_LEVELS + 1][2];
  size_t nskip;
  bool concurrent; /* soft-dirty cleared, the first pass read with threads running */
  bool all_dirty;  /* test: pass 2 takes every page as written */
  uint64_t *hits;  /* the first pass's: addresses of words pointing into [lo, hi) */
  size_t nhits, cap;
  uint64_t *unread; /* pages the first pass could not read */
  size_t nunread, capunread;
  /* what it cost: bytes read and time, while running and while stopped */
  uint64_t bytes_run, bytes_stop;
  double ms_run, ms_stop;
  uint64_t over_limit; /* the stop's limit (bytes) it gave up at; 0: did not */
  int mem, pagemap;    /* the target's /proc files (-1: not open) */
} attach_scan;
/* The first live pointer found: where it is, in which mapping, its value. */
typedef struct attach_found {
  uint64_t at, value;
  char where[96]; /* "[heap]", "the stack of thread N", a file's name, ... */
} attach_found;
/* Clears the target's soft-dirty bits and reads its memory once, threads
 * running (or, soft-dirty tracking unavailable or $MOLT_ATTACH_TEST_SCAN=
 * stopped, nothing: the stop reads everything).  skip: ranges not looked
 * in.  0 or MOLT_ENOMEM / MOLT_EIO. */
MOLT__HIDDEN int molt__scan_begin(attach_scan *sc, pid_t pid, uint64_t lo, uint64_t hi,
                                  const uint64_t (*skip)[2], size_t nskip);
/* With every thread of s stopped: 1 with *found if a word still points
 * into the range, 0 if none, SCAN_OVER_LIMIT if it would read more than
 * molt__attach_scan_limit's bytes stopped, or a MOLT_E* code (then the
 * caller keeps the code mapped). */
#define SCAN_OVER_LIMIT 2
MOLT__HIDDEN int molt__scan_finish(attach_scan *sc, const attach_stop *s,
                                   attach_found *found);
MOLT__HIDDEN void molt__scan_end(attach_scan *sc);

/* ---- libs.c: the target's libraries ------------------------------------------ */

typedef struct attach_lib {
  char name[512]; /* as the loader names it */
  char path[600]; /* what molt opens: /proc/PID/map_files/... or root/... */
  uint64_t bias;
} attach_lib;
/* The libraries of pid in the loader's order (its link map; the order of
 * the mappings if there is none), the program `exe` excluded, each with
 * a path that opens the file the target mapped.  0 with *libs (malloc'ed)
 * or MOLT_ENOMEM. */
MOLT__HIDDEN int molt__libs_list(pid_t pid, uint64_t exe_bias, const char *exe,
                                 const attach_map *maps, size_t n, attach_lib **libs,
                                 size_t *nlibs);

/* ---- seccomp.c: the target's seccomp filters -------------------------------- */

/* A system call molt means to run in the target. */
typedef struct attach_call {
  long nr;
  uint64_t args[6];
} attach_call;
/* Whether thread tid (stopped by molt) may run each call at the syscall
 * instruction insn: 0 if it is under no filter or every filter allows
 * them all; else MOLT_ENOTSUP (strict mode, or a filter refuses one),
 * MOLT_EPERM (filters molt may not read), MOLT_EIO, MOLT_ENOMEM, with a
 * one-line message saying which call, what the filter does and what to
 * do.  Nothing is run. */
MOLT__HIDDEN int molt__seccomp_check(pid_t pid, pid_t tid, uint64_t insn,
                                     const attach_call *calls, size_t n, char *err,
                                     size_t errlen);

/* ---- log.c: the log of an attached process ---------------------------------- */

/* Appends an entry (event, st's patch, functions, stop and threads,
 * message) to pid's log; called with the process's lock held. */
MOLT__HIDDEN void molt__log_append(pid_t pid, const char *event,
                                   const molt__attach_state *st, const char *message);

/* ---- interrupt.c: molt's own SIGINT and SIGTERM ------------------------------ */

#include <signal.h>
/* Blocks SIGINT, SIGTERM, SIGHUP and SIGQUIT for a run (the old mask in
 * *old), and puts the old mask back. */
MOLT__HIDDEN void molt__interrupt_block(sigset_t *old);
MOLT__HIDDEN void molt__interrupt_restore(const sigset_t *old);
/* Whether one of them is pending; takes it (a safe point honours it):
 * the signal, or 0. */
MOLT__HIDDEN bool molt__interrupt_pending(void);
/* $MOLT_ATTACH_TEST_PAUSE: the tests kill molt at a named point (attach.c). */
MOLT__HIDDEN void molt__test_pause(const char *point);
MOLT__HIDDEN int molt__interrupt_take(void);

/* ---- patch.c: the patch file ------------------------------------------------- */

typedef struct attach_patch {
  char build_id[81]; /* of the target it was built for */
  uint8_t *image;    /* the relocated memory image */
  size_t size;       /* its size, page-aligned */
  uint8_t *prot;     /* per page: PROT_* */
  size_t nfuncs;
  struct {
    char name[128];
    uint64_t offset; /* of the new version in the image */
    uint64_t target; /* link-time address of the function it replaces in the
                        target (a `replace` line), 0: found by name */
  } funcs[MOLT__ATTACH_MAX_FUNCS];
  /* The patch's references that moltcc resolved against the target (its
   * `import` lines): symbol -> link-time address in the target.  Relocation
   * binds them to target_bias + address, before any lookup by name. */
  struct attach_import *imports;
  size_t nimports;
  uint64_t target_bias; /* set by the caller before molt__patch_relocate */
  /* what relocation needs: */
  void *priv;
} attach_patch;

typedef struct attach_import {
  char name[128];
  uint64_t target;
} attach_import;

/* Reads and checks the patch file (without resolving anything). */
MOLT__HIDDEN int molt__patch_open(const char *path, attach_patch *p, char *err,
                                  size_t errlen);
/* Resolves the patch's references with `resolve` and relocates its image
 * for `base` in the target.  `library`: the patch's link bound the name to
 * a library (its symbol carries the library's version). */
typedef int (*attach_resolver)(const char *name, bool weak, bool library, uint64_t *value,
                               void *arg, char *err, size_t errlen);
MOLT__HIDDEN int molt__patch_relocate(attach_patch *p, uint64_t base,
                                      attach_resolver resolve, void *arg, char *err,
                                      size_t errlen);
MOLT__HIDDEN void molt__patch_close(attach_patch *p);
/* The GOT slots of an ELF file (JUMP_SLOT and GLOB_DAT relocations): visit
 * gets each symbol name and link-time slot address until it returns
 * true.  0 or a MOLT_E* code. */
typedef bool (*attach_got_visit)(const char *name, uint64_t slot, void *arg);
MOLT__HIDDEN int molt__elf_got_slots(const char *path, attach_got_visit visit, void *arg);

/* ---- state.c ------------------------------------------------------------------- */

/* The record's path (/run/molt/attach/<pid>, or $MOLT_ATTACH_DIR/<pid>);
 * of a stacked patch (level >= 2): <dir>/<pid>.<level>. */
MOLT__HIDDEN void molt__state_path(pid_t pid, char *path, size_t len);
MOLT__HIDDEN void molt__state_level_path(pid_t pid, int level, char *path, size_t len);
MOLT__HIDDEN const char *molt__state_dir(void);
/* The state of patch `level` of pid: its record, else (no record, e.g.
 * /run was cleared) the state page of its staged mapping.  0,
 * MOLT_ENOHISTORY, MOLT_ECORRUPT, MOLT_ENOMEM. */
/* The state in the state page of staged mapping m of pid: 0, MOLT_ENOHISTORY
 * (not a staged mapping), MOLT_EIO, MOLT_ECORRUPT. */
MOLT__HIDDEN int molt__state_from_page(pid_t pid, const attach_map *m,
                                       molt__attach_state *st);
MOLT__HIDDEN int molt__state_load_level(pid_t pid, int level, molt__attach_state *st,
                                        char *err, size_t errlen);
/* The state as text (the record and the state page hold the same). */
MOLT__HIDDEN void molt__state_format(const molt__attach_state *st, molt__buf *b);
MOLT__HIDDEN int molt__state_parse(const char *text, molt__attach_state *st);
/* Writes the record of st->level (atomically: temporary file, rename) and, when
 * page != 0, the state page in the target.  0 or MOLT_EIO. */
MOLT__HIDDEN int molt__state_save(pid_t pid, const molt__attach_state *st, uint64_t page,
                                  char *err, size_t errlen);
MOLT__HIDDEN void molt__state_remove(pid_t pid, int level);
/* Takes the per-process lock (<dir>/<pid>.lock, flock) that keeps two molt
 * runs from attaching to or rolling back one process at once: its
 * descriptor (close it to release), or a MOLT_E* code (MOLT_EBUSY: taken). */
MOLT__HIDDEN int molt__state_lock(pid_t pid, char *err, size_t errlen);

/* ---- levels.c: patches stacked on one process ----------------------------------- */

/* Whether patch st is still applied (not rolled back). */
MOLT__HIDDEN bool molt__levels_active(const molt__attach_state *st);
/* Before a new patch is attached on top of stack s: refuses (MOLT_EBUSY)
 * when the newest applied patch is unfinished (staging, staged, applying:
 * an attach killed half way) or the stack is full; else the level the new
 * patch takes. */
MOLT__HIDDEN int molt__levels_next(pid_t pid, const molt__attach_stack *s, int *level,
                                   char *err, size_t errlen);
/* Function f (its name set; its addr too when the patch says where: then
 * it is matched by address) of a new patch on top of s: if a patch of s
 * still applied replaced it already, f takes that patch's site (at, len,
 * addr) and that patch's jump as its bytes before (checked against the
 * target's memory): 1; not replaced by any: 0; a MOLT_E* code (the entry
 * holds something else). */
MOLT__HIDDEN int molt__levels_inherit(pid_t pid, const molt__attach_stack *s,
                                      molt__attach_func *f, char *err, size_t errlen);

/* ---- callback.c: the patch's pre/post-update callbacks, run in the target ---- */

/* Runs callback fn (its address in the target; int fn(void)) on a thread of
 * pid stopped in a system call, returning to `trap` (an address that is
 * not executable: the return faults there, and molt takes the thread
 * back).  Waits at most timeout_ms.  0 with *result, or MOLT_ECALLBACK
 * (it crashed or did not return in time: its thread was taken back and
 * runs on as before), MOLT_ENOENT, MOLT_EIO, with err saying what. */
MOLT__HIDDEN int molt__callback_run(pid_t pid, uint64_t fn, uint64_t trap, int timeout_ms,
                                    int *result, double *ms, char *err, size_t errlen);

/* The callbacks the patch file declares (none: both absent).  0 or the
 * refusal of a malformed note (MOLT_ECORRUPT...). */
MOLT__HIDDEN int molt__callbacks_read(const char *path, molt__patch_callbacks *cbs,
                                      char *err, size_t errlen);
/* Runs the pre-update callback, if any, of patch st staged at base: 0, or
 * MOLT_ECALLBACK (nonzero, crashed, timed out; err says which) and the
 * like.  What it did is added to st->callbacks. */
MOLT__HIDDEN int molt__callbacks_pre(pid_t pid, molt__attach_state *st,
                                     const molt__patch_callbacks *cbs, uint64_t base,
                                     int timeout_ms, char *err, size_t errlen);
/* Runs the post-update callback, if any: a failure is a warning, in
 * st->note; what it did is added to st->callbacks. */
MOLT__HIDDEN void molt__callbacks_post(pid_t pid, molt__attach_state *st,
                                       const molt__patch_callbacks *cbs, uint64_t base,
                                       int timeout_ms);

#define ATTACH_PAGE 4096u
#define ATTACH_STATE_PAGE(st) ((st)->code_end - ATTACH_STATE_SIZE)
/* The state pages at the end of the staged mapping: room for the longest
 * record -- MOLT__ATTACH_MAX_FUNCS functions of at most 256 bytes each (a
 * 127-character name, three addresses, 16 bytes twice in hex), plus 8 KiB
 * for the rest (a 4095-character patch path, a full note, the callbacks):
 * 264 KiB for 1024 functions; molt__state_save refuses a longer one rather
 * than cut it.  The memfd is sparse: only the pages the record fills take
 * memory in the target (two for a small patch, about 64 KiB for 256
 * functions). */
#define ATTACH_STATE_SIZE                                                                \
  ((((unsigned)MOLT__ATTACH_MAX_FUNCS * 256u + 8192u) + ATTACH_PAGE - 1) / ATTACH_PAGE * \
   ATTACH_PAGE)

#endif /* MOLT_ATTACH_INTERNAL_H */
