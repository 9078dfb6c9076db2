/*
 * full -- the mode of full updates (F1–F7 in docs/guarantees.md, docs/full-updates.md), on
 * switch/: a program image run by `molt run` is replaced as a whole, its
 * state migrated, its threads restarted in the new version.  It plugs into
 * the layers below as a molt__mode (program.c): the operation update,
 * hooks at parking, release and thread exit, around fork, records in
 * status.  Nothing outside this folder includes this header (but the tests
 * of the engine, tests/xf).
 *
 *   image.c    program images: loading, symbols, address ranges, the
 *              innermost call of the image on a thread's stack
 *   xf.c       the state transformation engine (molt__xf_*, the ABI of
 *              molt/program.h)
 *   program.c  the driver, program threads, restarts, migrated locals, the
 *              update operation, the mode
 */
#ifndef MOLT_FULL_H
#define MOLT_FULL_H

#include "switch/switch.h"

#include "molt/program.h"

/* ---- image.c ---------------------------------------------------------------*/
/* A loaded program image. */
typedef struct molt__image {
  void *handle;         /* dlopen handle */
  char *path;           /* as given by the user */
  uintptr_t base;       /* load bias */
  molt__symtab *symtab; /* its file symbol table (statics included) */
  char build_id[MOLT__BUILD_ID_HEX_MAX + 1];
  molt__file_identity ident;      /* the file it was copied from, the copy's hash */
  const molt__program_info *info; /* its molt__program */
  int (*main)(int, char **, char **);
  /* Mapped PT_LOAD segments, absolute addresses, sorted; prot = PF_* bits. */
  struct molt__range {
    uintptr_t lo, hi;
    unsigned prot;
  } * ranges;
  size_t nranges;
  /* The PT_GNU_RELRO pages, read-only once relocated (0, 0: none). */
  uintptr_t relro_lo, relro_hi;
} molt__image;

/* Checks and dlopens (RTLD_NOW | RTLD_LOCAL) a sealed copy of a program
 * image: the file open on fd (a request's, not closed here), or with fd -1
 * the one at path, opened by the calling thread (molt run: the process's
 * own argument).  MOLT_ENOTPROGRAM if it has no molt__program / main of
 * its own. */
MOLT__HIDDEN int molt__image_open(const char *path, int fd, molt__image **out, char *err,
                                  size_t errlen);
MOLT__HIDDEN void molt__image_close(molt__image *im); /* dlclose + free */
/* Absolute address of symbol (name, tu) of the image, or NULL. */
MOLT__HIDDEN void *molt__image_sym(const molt__image *im, const char *name,
                                   const char *tu);
/* The symbol containing absolute address a: its name, tu (NULL for a global),
 * start and size, and whether it is a function.  false if none. */
MOLT__HIDDEN bool molt__image_sym_at(const molt__image *im, uintptr_t a,
                                     const char **name, const char **tu, uintptr_t *start,
                                     size_t *size, bool *is_func);
/* The segment protection (PF_R|PF_W|PF_X) of absolute address a, 0 if a is
 * not inside the image. */
MOLT__HIDDEN unsigned molt__image_prot_at(const molt__image *im, uintptr_t a);
/* Whether [a, a + size) lies in one writable segment of the image and
 * outside its RELRO pages: a variable the compiler placed in .rodata or
 * .data.rel.ro (gcc does that with a static it sees never written, whatever
 * DWARF says about const) is not. */
MOLT__HIDDEN bool molt__image_writable(const molt__image *im, uintptr_t a, size_t size);
/* The function of the image whose call is innermost on the stack [sp, hi)
 * of a blocked thread of this process: the first word above sp that is a
 * return address into the image (it follows a call instruction).  A guess
 * from the stack's contents (a stale word can look like one): for
 * messages only.  false if none is found in the first 16 KiB. */
MOLT__HIDDEN bool molt__image_caller_on_stack(const molt__image *im, uintptr_t sp,
                                              uintptr_t hi, const char **name,
                                              const char **tu);

/* ---- xf.c --------------------------------------------------------------------*/
/* A migrated local (MOLT_MIGRATE_LOCAL) of one thread, saved at the update
 * point.  program.c owns the list; molt__xf_local fills new_value. */
typedef struct molt__saved_local {
  struct molt__saved_local *next;
  char *func, *name;
  const void *old_addr; /* where it lived in the old frame */
  void *old_copy;       /* its bytes at the update point */
  size_t old_size;
  void *new_value; /* malloc'ed new representation; NULL: dropped */
  size_t new_size;
} molt__saved_local;
/* Calls fn for every saved local of every program thread (during a
 * migration, on the runtime thread, while the program threads are
 * parked).  program.c provides it. */
MOLT__HIDDEN void molt__program_foreach_local(void (*fn)(void *arg, molt__saved_local *l),
                                              void *arg);

/* Prepares a migration from `old` to `new` (both loaded). */
MOLT__HIDDEN int molt__xf_begin(molt__image *old, molt__image *new, bool check_interior,
                                molt__xf_ctx **out);
/* Bounds the migration to ms milliseconds (0: no bound), counted from the
 * start of molt__xf_migrate: when they have passed, the migration fails
 * with MOLT_ETIMEDOUT ("migration timed out after N ms") and is undone
 * like after a fault (xf.c, "The deadline", says what can be interrupted). */
MOLT__HIDDEN void molt__xf_set_limit(molt__xf_ctx *cx, unsigned ms);
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

/* ---- program.c: for a shadowed update (shadow/, the layer above) -------------
 * A shadowed update is a full update rehearsed in a forked follower: the
 * shadow layer drives these steps, and the leader never switches. */
typedef struct molt__full_update molt__full_update;
/* Steps 1-4 of a full update (runtime thread, op_lock held): the new image
 * open, checked and loaded, the threads' entries resolved in it.  Logs a
 * refusal itself; nothing stays loaded on failure. */
MOLT__HIDDEN int molt__full_update_prepare(const char *path, int fd, int timeout_ms,
                                           molt__full_update **out, char *err,
                                           size_t errlen);
/* The migration and the commit (steps 6-8), as a barrier's step: in the
 * follower, after molt__program_keep_threads_at_fork and fork(), on the
 * forking (runtime) thread.  0 or MOLT_E* with a one-line err. */
MOLT__HIDDEN int molt__full_update_step(molt__full_update *u, char *err, size_t errlen);
/* In the leader after the fork (or after a failure): the parked threads'
 * snapshots dropped, the new image closed, u freed. */
MOLT__HIDDEN void molt__full_update_discard(molt__full_update *u);
/* The program threads' tids in the registry's order (the number of threads;
 * at most max stored). */
MOLT__HIDDEN size_t molt__program_tids(pid_t *tids, size_t max);
/* The child of the next fork() keeps every program-thread record (the
 * parent forgets the request when fork() returns). */
MOLT__HIDDEN void molt__program_keep_threads_at_fork(void);
/* In the follower, after molt__full_update_step: one new OS thread per
 * record, in the registry's order (index: the position molt__program_tids
 * gave its leader thread), each calling on_start(index, arg) and then the
 * new version's main (argc, argv of `molt run`; its return ends the
 * follower with _exit) or entry function. */
MOLT__HIDDEN int molt__program_relaunch(void (*on_start)(size_t index, void *arg),
                                        void *arg, char *err, size_t errlen);

/* Threads a program thread starts while a shadowed update runs (the
 * shadow layer follows them: docs/design.md §17, "Threads started after
 * the fork").  Called by __wrap_pthread_create, the trampoline of the new
 * thread and end_thread; every hook is set (or none). */
typedef struct molt__program_thread_hooks {
  /* The calling program thread is about to start a thread in its entry
   * function (entry_name: its name in the image, NULL if it has none).
   * 0: start it, and pass *token to the hooks below; an errno value: do
   * not start it, pthread_create returns that value (a follower replaying
   * a creation that failed in the leader). */
  int (*creating)(const char *entry_name, uintptr_t *token);
  /* pthread_create returned rc (0, or the errno value of a failure); tid:
   * the new thread's, if it started.  In the creating thread. */
  void (*created)(uintptr_t token, int rc, pid_t tid);
  /* In the new thread, after its creator was released and before its
   * entry function runs (never again at a restart). */
  void (*started)(uintptr_t token);
  /* A program thread exits: its entry function or main returned, or it
   * called pthread_exit (end_thread). */
  void (*exiting)(void);
} molt__program_thread_hooks;
/* Set once, from a constructor, before the image runs. */
MOLT__HIDDEN void molt__program_set_thread_hooks(const molt__program_thread_hooks *h);

#endif /* MOLT_FULL_H */
