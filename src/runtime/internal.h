/*
 * Internal interfaces between the files of libmolt.  One file per concern:
 *
 *   errors.c    error table -> strings
 *   buf.c       growable text buffer, TSV record writer
 *   log.c       the update log (ring + optional file)
 *   platform.c  membarrier and other Linux specifics
 *   entry.c     the jump at each updatable function's address (x86-64)
 *   elf.c       reading ELF files and loaded modules (build-ids, symbols, notes)
 *   thread.c    the thread registry
 *   gen.c       generations: slots, tables, publication, reclamation
 *   module.c    registered program modules and their updatable functions
 *   patch.c     checking and loading patch files, resolving imports
 *   runtime.c   the runtime thread, the request queue, public API, state
 *   timing.c    update timing: molt_quiesce, molt_update_point, policies
 *   control.c   the control socket server (runs on the runtime thread)
 *   protocol.c  control protocol framing (shared with the CLI)
 *   file.c      opening update files once and checking them (R7), memfd copies
 *   image.c     program images (full updates): loading, symbols, address ranges
 *   xf.c        the state transformation engine of full updates (molt__xf_*)
 *   program.c   running a program image: driver, program threads, restarts,
 *               migrated locals, the full-update operation
 *
 * Lock order (outer first):  runtime state mutex (molt__rt_lock)
 *                            -> registry mutex (thread.c)
 *                            -> log mutex (log.c)
 * The registry mutex is also taken by a thread that registers or exits;
 * nothing that could block on an application thread is ever done under it.
 * Full updates add (runtime.c has the whole order): op_lock -> bar_lock
 * (timing.c) -> prog_lock (program.c, a leaf: never held together with
 * molt__rt_lock, across dlopen/dlclose, or while waiting). 
 */
#ifndef MOLT_INTERNAL_H
#define MOLT_INTERNAL_H

#include "molt.h"
#include "molt/program.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MOLT__HIDDEN __attribute__((visibility("hidden")))

/* ---- errors.c ------------------------------------------------------------*/
/* The MOLT_E* code for a failed system call's errno (file operations). */
MOLT__HIDDEN int molt__from_errno(int e);

/* ---- buf.c ---------------------------------------------------------------*/
typedef struct molt__buf {
  char *data;
  size_t len, cap;
  bool oom; /* an allocation failed: contents are truncated */
} molt__buf;

MOLT__HIDDEN void molt__buf_init(molt__buf *b);
MOLT__HIDDEN void molt__buf_free(molt__buf *b);
MOLT__HIDDEN void molt__buf_add(molt__buf *b, const void *p, size_t n);
MOLT__HIDDEN void molt__buf_printf(molt__buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* One TSV record: fields separated by tabs, a newline at the end.  Tabs,
 * newlines and backslashes inside a field are escaped as \t \n \\. */
MOLT__HIDDEN void molt__buf_record(molt__buf *b, int nfields,
                                   const char *const *fields);
/* snprintf into a fixed buffer of an error message; never overflows. */
MOLT__HIDDEN void molt__errmsg(char *dst, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- log.c ---------------------------------------------------------------*/
typedef enum {
  MOLT__EV_START,   /* runtime started                         */
  MOLT__EV_LOAD,    /* patch object loaded                     */
  MOLT__EV_SWITCH,  /* a new generation became current         */
  MOLT__EV_ROLLBACK,/* switch back to an earlier state         */
  MOLT__EV_UNLOAD,  /* patch object unloaded                   */
  MOLT__EV_RECLAIM, /* generation reclaimed                    */
  MOLT__EV_REFUSE,  /* a request was refused (bad patch, ...)  */
  MOLT__EV_DENIED,  /* control connection refused (uid)        */
  MOLT__EV_FAIL,    /* internal failure: refusing state        */
  MOLT__EV_INFO,
  MOLT__EV_UPDATE,  /* a full update committed                 */
  MOLT__EV_ABORT    /* a full update aborted after the barrier */
} molt__event;

MOLT__HIDDEN void molt__log_init(void);
MOLT__HIDDEN void molt__log(molt__event ev, uint64_t gen, const char *patch_id,
                            const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Appends the ring as TSV records: log <seq> <unix time> <event> <gen> <patch id> <message> */
MOLT__HIDDEN void molt__log_dump(molt__buf *out);
MOLT__HIDDEN const char *molt__event_name(molt__event ev);

/* ---- platform.c ----------------------------------------------------------*/
/* Prepares process-wide memory barriers. false if the kernel lacks them. */
MOLT__HIDDEN bool molt__membarrier_init(void);
/* Full memory barrier on every running thread of the process. */
MOLT__HIDDEN int molt__membarrier(void);
/* After code was rewritten: no thread keeps running stale instructions. */
MOLT__HIDDEN void molt__sync_core(void);

/* ---- entry.c (molt__rt_lock held for all) -------------------------------*/
/* Checks and records the entries of start[0..n), function indices first..;
 * on failure `why` names the function. */
MOLT__HIDDEN int molt__entries_add(const molt__fn_desc *start, uint32_t first,
                                   uint32_t n, char *why, size_t whylen);
/* Before g is published: every entry g maps to another version than
 * version 0 jumps to its dispatch path. */
MOLT__HIDDEN int molt__entries_prepare(const molt__gen *g, char *err, size_t errlen);
/* After reclamation: entries no live generation replaces jump direct again. */
MOLT__HIDDEN void molt__entries_relax(void);
MOLT__HIDDEN bool molt__entry_dispatching(uint32_t index);
MOLT__HIDDEN pid_t molt__gettid(void);
MOLT__HIDDEN uint64_t molt__now_ns(void);      /* CLOCK_MONOTONIC */
MOLT__HIDDEN uint64_t molt__realtime_ns(void); /* CLOCK_REALTIME  */

/* ---- thread.c ------------------------------------------------------------*/
typedef struct molt__thread_info molt__thread_info;
/* Calls fn for each registered thread, under the registry lock. */
MOLT__HIDDEN void molt__threads_foreach(
    void (*fn)(void *arg, const molt__thread *t, pid_t tid, const char *name),
    void *arg);
MOLT__HIDDEN void molt__threads_init(void);
MOLT__HIDDEN void molt__threads_after_fork_child(void);
MOLT__HIDDEN size_t molt__threads_count(void);
/* For fork handlers only: hold the registry across fork(). */
MOLT__HIDDEN void molt__threads_lock(void);
/* Points the view of every thread that has one at g (immediate and global
 * switches).  Caller holds molt__rt_lock. */
MOLT__HIDDEN void molt__threads_set_views(molt__gen *g);
MOLT__HIDDEN void molt__threads_unlock(void);

/* ---- module.c ------------------------------------------------------------*/
typedef struct molt__module {
  molt__fn_desc *start, *stop;
  uintptr_t base;        /* load bias of the module          */
  char *path;            /* file the module was loaded from */
  char build_id[MOLT__BUILD_ID_HEX_MAX + 1]; /* hex; "" if none */
  uint32_t first_index;  /* index of start[0] in generation tables */
  /* Open-addressing index (name, tu of statics) -> descriptor, built on the
   * first lookup so that start-up does not pay for it (P4). */
  molt__fn_desc **index;
  size_t index_mask;
} molt__module;

MOLT__HIDDEN size_t molt__modules_count(void);
MOLT__HIDDEN molt__module *molt__module_at(size_t i);
MOLT__HIDDEN molt__module *molt__module_by_build_id(const char *hex);
/* The descriptor of updatable function (name, tu) in module m, or NULL.
 * tu is matched by basename; tu == NULL matches external functions only. */
MOLT__HIDDEN molt__fn_desc *molt__module_find_fn(molt__module *m,
                                                 const char *name,
                                                 const char *tu);
MOLT__HIDDEN uint32_t molt__fn_count(void); /* all modules */
MOLT__HIDDEN uintptr_t molt__main_base(void); /* load bias of the executable */
MOLT__HIDDEN molt__fn_desc *molt__fn_at(uint32_t index);

/* ---- elf.c ---------------------------------------------------------------*/
/* Build-id (hex) of the loaded module that contains addr. 0 or MOLT_E*. */
MOLT__HIDDEN int molt__elf_build_id_of_loaded(const void *addr, char *hex,
                                              size_t hexlen, uintptr_t *base,
                                              char *path, size_t pathlen);
/* Validates the ELF file behind fd (bounds-checks headers), reads its molt
 * patch note.  0, MOLT_ENOTPATCH, MOLT_ECORRUPT, MOLT_EABI. */
MOLT__HIDDEN int molt__elf_read_patch_note(int fd, molt__patch_note *note,
                                           char *err, size_t errlen);
/* Symbol lookup in a module's file symbol table (.symtab, then .dynsym):
 * name with tu == NULL finds a global symbol, with tu a local symbol of
 * that source file (STT_FILE grouping, matched by basename).  Returns the
 * link-time value (add the module base).  0, MOLT_ENOSYM, MOLT_EAMBIGUOUS. */
typedef struct molt__symtab molt__symtab;
MOLT__HIDDEN int molt__symtab_open(const char *path, molt__symtab **out);
MOLT__HIDDEN int molt__symtab_lookup(const molt__symtab *st, const char *name,
                                     const char *tu, uintptr_t *value);
MOLT__HIDDEN void molt__symtab_close(molt__symtab *st);
/* Reverse lookup: the function or object symbol whose [start, start+size)
 * holds link-time address `value` (a zero-sized symbol holds its own
 * address only).  name and tu point into st (tu: basename of the source
 * file of a local symbol, NULL for a global); at one address a global is
 * preferred.  Any out pointer may be NULL.  0 or MOLT_ENOSYM. */
MOLT__HIDDEN int molt__symtab_at(const molt__symtab *st, uintptr_t value,
                                 const char **name, const char **tu,
                                 uintptr_t *start, size_t *size, bool *is_func);
/* Validates the ELF file behind fd as loadable by ld.so on this machine: a
 * 64-bit shared object (ET_DYN) whose headers, segments and dynamic tables
 * lie within the file.  0, MOLT_ENOTPROGRAM (not ELF / not a shared object
 * of this machine), MOLT_ECORRUPT, MOLT_EIO. */
MOLT__HIDDEN int molt__elf_check_shared_object(int fd, char *err, size_t errlen);
/* Build-id (hex) of the ELF64 file behind fd, read from its notes (SHT_NOTE
 * sections, else PT_NOTE segments).  0, MOLT_ENOSYM (no build-id),
 * MOLT_ECORRUPT, MOLT_ENOTSUP (not an ELF64 little-endian file), MOLT_EIO,
 * MOLT_EINVAL (hexlen too small). */
MOLT__HIDDEN int molt__elf_file_build_id(int fd, char *hex, size_t hexlen,
                                         char *err, size_t errlen);
/* Like molt__elf_read_patch_note, but does not require the note to be
 * stamped: returns the note as it is and the file offset of its descriptor
 * (where moltstamp writes).  desc_off and note may be NULL. */
MOLT__HIDDEN int molt__elf_patch_note_offset(int fd, uint64_t *desc_off,
                                             molt__patch_note *note, char *err,
                                             size_t errlen);

/* ---- gen.c ---------------------------------------------------------------*/
typedef struct molt__object molt__object; /* a loaded patch (patch.c) */

/* Private side of a generation slot. */
typedef struct molt__gen_priv {
  bool in_use;
  bool retired;            /* no longer current (may still run) */
  void **table;            /* owned copy (molt__gens[s].table aliases it) */
  molt__object **entry_owner; /* per entry: patch object, NULL = program */
  molt__object **owners;   /* distinct patch objects the table points into */
  size_t nowners;
  uint64_t retired_at_ns;
} molt__gen_priv;

MOLT__HIDDEN int molt__gen_init(void);
/* Allocates a slot and a table of molt__fn_count() entries copied from
 * `from` (NULL: version 0 bodies). MOLT_EBUSY if no slot is free. */
MOLT__HIDDEN int molt__gen_new(const molt__gen *from, molt__gen **out);
MOLT__HIDDEN void molt__gen_set(molt__gen *g, uint32_t index, void *impl,
                                molt__object *owner);
MOLT__HIDDEN void molt__gen_discard(molt__gen *g); /* never published */
/* Makes g current (immediate policy); the old current is retired. */
MOLT__HIDDEN void molt__gen_publish(molt__gen *g);
/* Same, reporting an allocation failure (then nothing changed). */
MOLT__HIDDEN int molt__gen_publish_checked(molt__gen *g);
/* One reclamation pass (runtime thread, molt__rt_lock held): retired
 * generations that no thread runs are freed.  Objects no generation uses
 * any more are moved to *to_close; the caller dlcloses them with
 * molt__objects_close() AFTER releasing molt__rt_lock (lock order: the
 * dynamic loader's lock is taken outside molt__rt_lock, because a module
 * registers itself from a constructor while dlopen holds the loader lock).
 * Returns the number of retired generations still alive. */
MOLT__HIDDEN size_t molt__gen_reclaim(molt__object **to_close);
MOLT__HIDDEN bool molt__gen_reclaim_enabled(void);
MOLT__HIDDEN molt__gen_priv *molt__gen_priv_of(const molt__gen *g);
/* Republishes the current generation with the entries of newly registered
 * functions (version 0); the generation number does not change. */
MOLT__HIDDEN int molt__gen_extend_current(void);
MOLT__HIDDEN molt__gen *molt__gen_current(void);
/* True if a live generation maps function `index` to something else than
 * `body` (its version 0). */
MOLT__HIDDEN bool molt__gen_any_replaces(uint32_t index, const void *body);
/* Per-generation statistics from one scan of the thread registry. */
typedef struct molt__gen_usage {
  uint32_t active[MOLT__SLOTS]; /* calls in progress per slot */
  uint32_t views[MOLT__SLOTS];  /* threads whose local view is the slot */
} molt__gen_usage;
MOLT__HIDDEN void molt__gen_scan(molt__gen_usage *u);

/* ---- patch.c -------------------------------------------------------------*/
struct molt__object {
  void *handle;        /* dlopen handle; NULL while not loaded */
  const molt__patch_header *hdr; /* inside the loaded object */
  char *id, *description, *path;
  int fd;              /* the patch file, opened once (R7); kept for reload */
  size_t module;       /* index of the program module it patches */
  uint64_t gen;        /* generation its apply created */
  size_t refs;         /* live generations whose table points into it */
  bool in_history;     /* on the rollback stack */
  /* What this patch replaced, for rollback: entry index and the object that
   * supplied the previous version (NULL = the program's version 0).  Each
   * named object has prev_refs counted, so it outlives this record. */
  struct molt__prev { uint32_t index; uint32_t rec; molt__object *owner; } *prev;
  size_t nprev;
  size_t prev_refs;
  /* (table index, position in hdr->fns) of each function it brings, sorted
   * by table index: finds "this object's version of entry i" in O(log n)
   * (rec is stable across reloads: the file does not change). */
  struct molt__by_index { uint32_t index, rec; } *by_index;
  size_t nby_index;
  uint64_t mark;       /* scratch for owner-set computation (gen.c) */
  molt__object *close_next; /* list of objects to dlclose */
  molt__object *all_next, *all_prev; /* all objects not yet freed */
};

/* Opens and checks a patch file and loads it (no molt__rt_lock held; the
 * operation lock is held).  On failure nothing is loaded. */
MOLT__HIDDEN int molt__patch_open(const char *path, molt__object **out,
                                  char *err, size_t errlen);
/* dlopens obj's file again (rollback to an unloaded object). */
MOLT__HIDDEN int molt__patch_reload(molt__object *obj, char *err, size_t errlen);
/* With molt__rt_lock: resolves imports and functions and fills a new
 * generation = from + obj's functions. */
MOLT__HIDDEN int molt__patch_build_gen(molt__object *obj, const molt__gen *from,
                                       molt__gen **out, char *err,
                                       size_t errlen);
/* Reference counting by live generations (molt__rt_lock held).  unref
 * returns true when the object must be dlclosed (it is then unloaded by
 * molt__objects_close, outside molt__rt_lock). */
MOLT__HIDDEN void molt__object_ref(molt__object *obj);
MOLT__HIDDEN bool molt__object_unref(molt__object *obj);
MOLT__HIDDEN void molt__objects_close(molt__object *list);
/* Frees an object that is neither loaded, referenced nor in history. */
MOLT__HIDDEN void molt__object_free_if_unused(molt__object *obj);
/* obj leaves the rollback stack (popped or beyond its depth). */
MOLT__HIDDEN void molt__object_leave_history(molt__object *obj);
MOLT__HIDDEN molt__object *molt__objects_head(void);

/* ---- runtime.c -----------------------------------------------------------*/
typedef enum {
  MOLT__OP_STATUS = 1,
  MOLT__OP_APPLY,
  MOLT__OP_ROLLBACK,
  MOLT__OP_LOG,
  MOLT__OP_UPDATE /* full update: path, timeout_ms, check_interior */
} molt__op;

typedef struct molt__request {
  molt__op op;
  molt_policy_t policy;
  int timeout_ms;
  bool check_interior; /* update: refuse interior pointers into objects */
  char path[4096];
} molt__request;

/* Runs a request on the runtime thread (the caller must BE the runtime
 * thread: control.c calls it from there).  Writes the response records
 * into out; on failure a one-line message into err.  Returns 0 or MOLT_E*. */
MOLT__HIDDEN int molt__execute(const molt__request *req, molt__buf *out,
                               char *err, size_t errlen);
/* Enters the refusing state (R3): later apply/rollback fail with
 * MOLT_EREFUSING and status reports the reason. */
MOLT__HIDDEN void molt__fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
MOLT__HIDDEN bool molt__refusing(char *reason, size_t len);
/* molt__rt_lock: the runtime state (modules, generations, objects, history). */
MOLT__HIDDEN void molt__rt_lock_acquire(void);
MOLT__HIDDEN void molt__rt_lock_release(void);
/* In a forked child, starts the runtime thread and control channel on the
 * first registration (cheap no-op otherwise). */
MOLT__HIDDEN void molt__runtime_started(void);
/* Asks the runtime thread to run a reclamation pass soon. */
MOLT__HIDDEN void molt__runtime_kick(void);
/* A full update commits (op_lock held, program threads parked): publishes
 * a copy of the current generation numbered one higher, so that patches
 * and full updates share one generation count.  Returns the new number
 * in *number, or MOLT_EBUSY / MOLT_ENOMEM (nothing changed). */
MOLT__HIDDEN int molt__runtime_next_generation(uint64_t *number);
MOLT__HIDDEN uint64_t molt__runtime_generation(void); /* current number */

/* ---- timing.c ------------------------------------------------------------*/
#define MOLT__DEFAULT_TIMEOUT_MS 10000
MOLT__HIDDEN void molt__timing_init(void);
/* Makes g current under `policy` (op_lock held, molt__rt_lock not held):
 * immediate: now, for every thread; local: now for threads without a view,
 * at their next quiescence point for the others; global: once every
 * participant waits at an update point, else MOLT_ETIMEDOUT with the
 * missing threads in err and nothing changed (g is not published). */
MOLT__HIDDEN int molt__timing_switch(molt__gen *g, molt_policy_t policy,
                                     int timeout_ms, char *err, size_t errlen);
/* How the participants leave a barrier. */
typedef enum {
  MOLT__VERDICT_NONE = 0, /* timeout or failure: molt_update_point returns 0 */
  MOLT__VERDICT_UPDATED,  /* hot patch switched in: it returns 1 */
  MOLT__VERDICT_RESTART   /* full update committed: program threads restart
                             (molt__program_restart_self), others return 1 */
} molt__verdict;
/* The global barrier (op_lock held, molt__rt_lock and bar_lock not held):
 * raises the pending flag, calls the molt_on_update_pending callback,
 * waits until every participant waits at an update point (else
 * MOLT_ETIMEDOUT, missing threads named in err), then runs
 * while_parked(arg) WITHOUT bar_lock while they stay parked, and releases
 * them with on_success if it returned 0, else with MOLT__VERDICT_NONE.
 * Returns 0 or the error of the wait or of while_parked. */
MOLT__HIDDEN int molt__timing_barrier(int timeout_ms,
                                      int (*while_parked)(void *arg, char *err,
                                                          size_t errlen),
                                      void *arg, molt__verdict on_success,
                                      char *err, size_t errlen);
/* The calling thread is a barrier participant from now on (last point
 * "(none)"): program threads join from their first instruction. */
MOLT__HIDDEN void molt__timing_join(void);
/* The calling thread restarts in a new image: forget its last point (a
 * literal of the old image). */
MOLT__HIDDEN void molt__timing_restarted(void);
/* The molt_on_update_pending callback, and forgetting it if it is still cb
 * (a full update clears a callback that lives in the image it unloads). */
MOLT__HIDDEN void (*molt__timing_pending_cb(void))(void *);
MOLT__HIDDEN void molt__timing_forget_pending_cb(void (*cb)(void *));
MOLT__HIDDEN void molt__timing_thread_exit(void);
MOLT__HIDDEN void molt__timing_after_fork_child(void);
MOLT__HIDDEN void molt__timing_foreach(
    void (*fn)(void *arg, pid_t tid, const char *point, bool parked), void *arg);

/* ---- control.c -----------------------------------------------------------*/
/* Creates the listening socket for this process (abstract name
 * "\0molt.<pid>").  Returns the fd or a negative MOLT_E* code. */
MOLT__HIDDEN int molt__control_listen(void);
/* The listening fd is readable: accept one client, check its credentials,
 * serve its request(s) with molt__execute, close it.  Never blocks longer
 * than the per-client I/O timeout. */
MOLT__HIDDEN void molt__control_serve(int listen_fd);

/* ---- file.c --------------------------------------------------------------*/
/* Opens `path` once, checks it (regular file, owned by the process owner or
 * root, not writable by group/others: R7) and returns a sealed memfd copy
 * (>= 0) that everything later reads, or a negative MOLT_E* with err set. */
MOLT__HIDDEN int molt__file_open_checked(const char *path, size_t max_bytes,
                                         char *err, size_t errlen);

/* ---- image.c -------------------------------------------------------------*/
/* A loaded program image (full updates). */
typedef struct molt__image {
  void *handle;            /* dlopen handle */
  char *path;              /* as given by the user */
  int fd;                  /* sealed memfd copy it was loaded from */
  uintptr_t base;          /* load bias */
  molt__symtab *symtab;    /* its file symbol table (statics included) */
  char build_id[MOLT__BUILD_ID_HEX_MAX + 1];
  const molt__program_info *info; /* its molt__program */
  int (*main)(int, char **, char **);
  /* Mapped PT_LOAD segments, absolute addresses, sorted; prot = PF_* bits. */
  struct molt__range { uintptr_t lo, hi; unsigned prot; } *ranges;
  size_t nranges;
} molt__image;

/* Opens, checks and dlopens (RTLD_NOW | RTLD_LOCAL) a program image.
 * MOLT_ENOTPROGRAM if it has no molt__program / main of its own. */
MOLT__HIDDEN int molt__image_open(const char *path, molt__image **out,
                                  char *err, size_t errlen);
MOLT__HIDDEN void molt__image_close(molt__image *im); /* dlclose + free */
/* Absolute address of symbol (name, tu) of the image, or NULL. */
MOLT__HIDDEN void *molt__image_sym(const molt__image *im, const char *name,
                                   const char *tu);
/* The symbol containing absolute address a: its name, tu (NULL for a global),
 * start and size, and whether it is a function.  false if none. */
MOLT__HIDDEN bool molt__image_sym_at(const molt__image *im, uintptr_t a,
                                     const char **name, const char **tu,
                                     uintptr_t *start, size_t *size,
                                     bool *is_func);
/* The segment protection (PF_R|PF_W|PF_X) of absolute address a, 0 if a is
 * not inside the image. */
MOLT__HIDDEN unsigned molt__image_prot_at(const molt__image *im, uintptr_t a);

/* ---- program.c -----------------------------------------------------------*/
/* True while the calling program thread's record is still in the program
 * thread registry: program.c then takes it out of the barrier itself
 * (end_thread), after it has left the registry, so that an update never
 * commits while an exiting thread may still run old code. */
MOLT__HIDDEN bool molt__program_owns_exit(void);
/* A program thread: the main thread of `molt run`, or a thread the image
 * started with pthread_create (__wrap_pthread_create).  Lives from the
 * thread's start to its exit; linked into program.c's registry (prog_lock).
 * Fields marked (parked) are written by the runtime thread only while the
 * thread is parked in a barrier, and read by the thread after it wakes
 * (bar_lock orders both). */
typedef struct molt__pthread molt__pthread;
struct molt__pthread {
  pid_t tid;
  bool is_main;
  void *(*entry)(void *);   /* entry of the running version (parked) */
  void *arg;                /* its argument (parked) */
  int (*main_fn)(int, char **, char **); /* main thread: main (parked) */
  char *entry_name, *entry_tu; /* (name, tu) of entry in its image; NULL:
                                  not a function of the image */
  uintptr_t stack_lo, stack_hi; /* the thread's stack, for frame walks */
  /* Written by the thread (under prog_lock) and by the runtime thread
   * (parked, under prog_lock); read without lock by the thread itself and
   * by molt_update_point's fast path: relaxed atomic. */
  _Atomic bool updating;
  char *from_point;         /* point the old version parked at (copy) */
  char *parked_point;       /* point of the current park (copy, bar_lock) */
  bool snap_failed;         /* snapshot of its locals ran out of memory */
  bool restart;             /* (parked) restart when released */
  void *(*next_entry)(void *); /* (parked) resolved in the new image */
  struct molt__reg *regs;   /* MOLT_MIGRATE_LOCAL registrations (own) */
  size_t nregs;
  struct molt__saved_local *saved; /* snapshot at the update point */
  void *restart_env;        /* sigjmp_buf of its restart frame */
  molt__pthread *next, *prev;
};
/* The calling thread's record, or NULL if it is not a program thread. */
MOLT__HIDDEN extern __thread molt__pthread *molt__pthread_self
    __attribute__((tls_model("initial-exec")));
/* Hooks of molt_update_point (timing.c) for program threads: */
/* me->updating was set: this is its first update point in the new version. */
MOLT__HIDDEN void molt__program_first_point(molt__pthread *me);
/* Parking for a full update (bar_lock held): snapshot the live migrated
 * locals along the frame-pointer chain from `frame`; remember `point`. */
MOLT__HIDDEN void molt__program_park(molt__pthread *me, void *frame,
                                     const char *point);
/* Released with MOLT__VERDICT_RESTART: siglongjmps to the restart frame if
 * the update gave the thread a restart target, else returns. */
MOLT__HIDDEN void molt__program_restart_self(molt__pthread *me);
/* true if this process runs a program image (molt run). */
MOLT__HIDDEN bool molt__program_active(void);
/* The full update (runtime thread, op_lock held): docs/full-updates.md. */
MOLT__HIDDEN int molt__program_update(const char *path, int timeout_ms,
                                      bool check_interior, molt__buf *out,
                                      char *err, size_t errlen);
/* Status records of the program image and its threads (op_lock held). */
MOLT__HIDDEN void molt__program_status(molt__buf *out);
/* Runtime thread, op_lock held: unloads the old image once every
 * restarted thread reached an update point in the new version (F7). */
MOLT__HIDDEN void molt__program_reclaim(void);
/* fork(): hold / release the registry; in the child keep only the caller. */
MOLT__HIDDEN void molt__program_fork_prepare(void);
MOLT__HIDDEN void molt__program_fork_parent(void);
MOLT__HIDDEN void molt__program_fork_child(void);

/* ---- program.c <-> xf.c ----------------------------------------------------*/
/* A migrated local (MOLT_MIGRATE_LOCAL) of one thread, saved at the update
 * point.  program.c owns the list; molt__xf_local fills new_value. */
typedef struct molt__saved_local {
  struct molt__saved_local *next;
  char *func, *name;
  const void *old_addr;    /* where it lived in the old frame */
  void *old_copy;          /* its bytes at the update point */
  size_t old_size;
  void *new_value;         /* malloc'ed new representation; NULL: dropped */
  size_t new_size;
} molt__saved_local;
/* Calls fn for every saved local of every program thread (during a
 * migration, on the runtime thread, while the program threads are parked). */
MOLT__HIDDEN void molt__program_foreach_local(
    void (*fn)(void *arg, molt__saved_local *l), void *arg);

/* ---- xf.c ----------------------------------------------------------------*/
/* Prepares a migration from `old` to `new` (both loaded). */
MOLT__HIDDEN int molt__xf_begin(molt__image *old, molt__image *new,
                                bool check_interior, molt__xf_ctx **out);
/* Runs new->info->migrate under the fault guard, then drains the work
 * list.  0, or MOLT_EXFORM (or MOLT_ENOSYM ...) with a one-line message;
 * on failure the old state has already been restored. */
MOLT__HIDDEN int molt__xf_migrate(molt__xf_ctx *cx, char *err, size_t errlen);
/* The new value of an old untyped pointer after a successful migration
 * (thread arguments): mapped object, redirected old-image address, or the
 * value itself.  Never fails. */
MOLT__HIDDEN void *molt__xf_redirect(molt__xf_ctx *cx, void *old);
/* Ends the migration.  commit: frees the old heap objects that were
 * replaced; !commit: undoes every in-place write and frees every new
 * object.  Frees cx. */
MOLT__HIDDEN void molt__xf_end(molt__xf_ctx *cx, bool commit);
/* For the log and benchmarks: objects transformed or visited, and ns spent. */
MOLT__HIDDEN void molt__xf_stats(const molt__xf_ctx *cx, uint64_t *objects,
                                 uint64_t *bytes, uint64_t *ns);

#endif /* MOLT_INTERNAL_H */
