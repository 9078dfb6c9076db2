/*
 * molt.h — the one public header of molt, live updates for running C programs.
 *
 * A program includes this header, marks functions as updatable and links with
 * libmolt (moltcc does all of this for you).  While the program runs, `molt
 * apply <pid> patch.so` replaces updatable functions; calls that have already
 * started finish on the code they started with, and code that no thread can
 * run any more is unloaded.
 *
 * Layout of this file:
 *   1. export macro, error codes (one table), version
 *   2. the public API callable from application code
 *   3. the manual interface: declaring updatable functions and writing
 *      patches by hand (moltcc generates the same shapes automatically)
 *   4. the ABI between generated code and the runtime (molt__ names): not an
 *      API, but it lives here because the dispatch fast path is inline.
 */
#ifndef MOLT_H
#define MOLT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* 1. Export macro, errors, version                                          */
/* ------------------------------------------------------------------------ */

#define MOLT_EXTERN __attribute__((visibility("default")))

#define MOLT_VERSION_MAJOR 0
#define MOLT_VERSION_MINOR 1
#define MOLT_VERSION_STRING "0.1.0"

/*
 * Every function of molt returns 0 or one of these negative codes.  This
 * table is the only place where codes and messages are defined: the runtime,
 * the CLI (its exit codes) and the protocol all derive from it.
 *      XX(NAME,        value, "message")
 */
#define MOLT_ERRNO_MAP(XX)                                                     \
  XX(EINVAL,       -1,  "invalid argument")                                    \
  XX(ENOMEM,       -2,  "out of memory")                                       \
  XX(EIO,          -3,  "input/output error")                                  \
  XX(ENOENT,       -4,  "no such file")                                        \
  XX(EPERM,        -5,  "permission denied")                                   \
  XX(EUNSAFE,      -6,  "patch file is writable by another user or not owned by the process owner or root") \
  XX(ENOTPATCH,    -7,  "not a molt patch")                                    \
  XX(ECORRUPT,     -8,  "corrupt or truncated file")                           \
  XX(EBUILDID,     -9,  "patch was built for a different program (build-id mismatch)") \
  XX(EABI,         -10, "patch was built for an incompatible molt ABI")        \
  XX(ENOSYM,       -11, "symbol not found in the running program")             \
  XX(ENOFUNC,      -12, "patch replaces a function that is not updatable in the running program") \
  XX(EDLOPEN,      -13, "the dynamic loader rejected the patch")               \
  XX(EBUSY,        -14, "too many generations are still running; try again when old calls have returned") \
  XX(ENOHISTORY,   -15, "nothing to roll back")                                \
  XX(ETIMEDOUT,    -16, "timed out")                                           \
  XX(EREFUSING,    -17, "the runtime is in a refusing state after an internal failure; see molt status") \
  XX(EPROTO,       -18, "malformed control message")                           \
  XX(EVERSION,     -19, "unsupported control protocol version")                \
  XX(ENOTMOLT,     -20, "process is not a molt process or has no control channel") \
  XX(ECONNECT,     -21, "cannot reach the process's control channel")          \
  XX(EPOLICY,      -22, "unknown update policy")                               \
  XX(EAMBIGUOUS,   -23, "symbol name is ambiguous in the running program")     \
  XX(ENOTSUP,      -24, "operation not supported")                             \
  XX(EINTERNAL,    -25, "internal error")                                    \
  XX(ENOTPROGRAM,  -26, "not a molt program image (build it with moltcc --molt-program)") \
  XX(ENOPROGRAM,   -27, "process does not run a program image (start it with molt run)") \
  XX(EXFORM,       -28, "state transformation failed; the update was aborted")

typedef enum {
#define MOLT__ERR_ENUM(name, val, msg) MOLT_##name = (val),
  MOLT_ERRNO_MAP(MOLT__ERR_ENUM)
#undef MOLT__ERR_ENUM
  MOLT__ERRNO_MIN = -28
} molt_errno_t;

/* Message for a code ("unknown error" for anything else); never NULL. */
MOLT_EXTERN const char *molt_strerror(int err);
/* Symbolic name for a code, e.g. "MOLT_EBUILDID"; never NULL. */
MOLT_EXTERN const char *molt_err_name(int err);

/* ------------------------------------------------------------------------ */
/* 2. Public API                                                              */
/* ------------------------------------------------------------------------ */

/* How a new generation reaches the threads (SPEC H2-H4). */
typedef enum {
  MOLT_POLICY_IMMEDIATE = 0, /* every call that starts after the switch */
  MOLT_POLICY_LOCAL = 1,     /* each thread at its own molt_quiesce()    */
  MOLT_POLICY_GLOBAL = 2     /* all threads at molt_update_point()       */
} molt_policy_t;

/*
 * Applies the patch at `path` from inside the process, exactly as `molt apply`
 * does (the work runs on the runtime thread; the caller waits for the result).
 * `timeout_ms` < 0 means the default.  On failure, `err_msg` (if not NULL,
 * `err_len` bytes) receives a one-line explanation.  Returns 0 or a MOLT_E*
 * code; on failure nothing has changed.
 */
MOLT_EXTERN int molt_apply(const char *path, molt_policy_t policy,
                           int timeout_ms, char *err_msg, size_t err_len);

/* Returns to the previous generation, as `molt rollback` does. */
MOLT_EXTERN int molt_rollback(molt_policy_t policy, int timeout_ms,
                              char *err_msg, size_t err_len);

/* Number of the generation new calls of the calling thread run (0 = the
 * program as built). Increases by one on every apply and every rollback. */
MOLT_EXTERN uint64_t molt_generation(void);

/*
 * Update timing (SPEC H3, H4).  A thread takes part simply by calling these.
 *
 * molt_quiesce(): the calling thread is at a local quiescence point (it
 *   holds no pointers into code or data that an update could change, e.g.
 *   between two requests).  From its first call on, the thread runs one
 *   generation as a whole between two quiescence points and moves to the
 *   newest generation here.  Never blocks.  Under policy `local` this is the
 *   only place the thread switches; under `immediate` it switches at once.
 *
 * molt_update_point(name): the thread is at an update point.  Normally
 *   returns 0 at once.  While a `global` update is pending, the thread waits
 *   here until every participating thread (every thread that has called
 *   molt_update_point) has arrived, the update is switched in, and all are
 *   released; it then returns 1.  If some thread does not arrive within the
 *   update's timeout, everyone is released, nothing changes, and it returns
 *   0.  An update point is also a quiescence point.  `name` must be a string
 *   that lives as long as the thread (a literal).
 *   In a program image (`molt run`), a full update waits here too; if it
 *   commits, molt_update_point() does NOT return in a program thread: the
 *   thread starts again in the new version (see "Full updates" below).
 *   If the update fails or times out it returns 0 and the old version goes
 *   on.  Threads of a program image take part from their first
 *   instruction, so each one must reach update points regularly (use
 *   molt_on_update_pending to wake those that block).
 *
 * molt_on_update_pending(cb, arg): cb(arg) is called (on the thread that runs
 *   the update) when a global update starts waiting, so that the program can
 *   wake threads blocked in I/O or on condition variables and let them reach
 *   an update point.  NULL removes the callback.
 */
MOLT_EXTERN void molt_quiesce(void);
MOLT_EXTERN int molt_update_point(const char *name);
MOLT_EXTERN void molt_on_update_pending(void (*cb)(void *arg), void *arg);

/*
 * Full updates (SPEC F1-F7): the whole program is built as an image
 * (`moltcc --molt-program -o prog.so *.c`), started with `molt run prog.so`
 * and replaced with `molt update <pid> prog2.so`.  These calls only matter
 * in a program image; elsewhere they return 0.
 *
 * In a program image every thread started with pthread_create (moltcc links
 * images with --wrap=pthread_create) takes part in full updates.  An update
 * waits until every such thread waits in molt_update_point(); then the
 * state is migrated while they wait.  If that succeeds, molt_update_point()
 * does not return: each thread starts again in the new version -- the main
 * thread in the new `main` (same argc/argv), every other thread in the new
 * version's function of the same name as its entry function, with the same
 * argument (redirected if it pointed to migrated data).  If it fails, every
 * thread returns 0 from molt_update_point() and the old version goes on.
 *
 * molt_is_updating(): true in a thread that was restarted by a full update
 *   until it reaches its first update point in the new version.
 * molt_is_updating_from(point): true if, in addition, the old version
 *   stopped this thread at update point `point` (compared by string).
 * MOLT_MIGRATE_LOCAL(var): in the old version, records that `var` (a local
 *   of the calling function) is to be carried across an update while the
 *   function's frame is live; in a restarted thread, sets `var` to the old
 *   value (transformed to the new type) and returns 1.  Returns 0 when there
 *   is nothing to migrate.  The frame is identified by the frame pointer
 *   (moltcc builds images with -fno-omit-frame-pointer).
 */
MOLT_EXTERN int molt_is_updating(void);
/* The driver behind `molt run` (bin/molt-run): loads the program image at
 * `path` and runs its main(argc, argv, environ) as the main program thread
 * until it returns; returns its status, or 127 (after one line on stderr)
 * if the image cannot be loaded. */
MOLT_EXTERN int molt__program_run(const char *path, int argc, char **argv);
MOLT_EXTERN int molt_is_updating_from(const char *point);
MOLT_EXTERN int molt_migrate_local(const char *func, const char *name,
                                   void *addr, size_t size, void *frame);
#define MOLT_MIGRATE_LOCAL(var)                                                \
  molt_migrate_local(__func__, #var, &(var), sizeof(var),                      \
                     __builtin_frame_address(0))

/*
 * Type annotations for the state traversal of full updates (Kitsune's
 * E_* annotations, SPEC F5).  moltcc reads them through libclang; a plain
 * compiler sees nothing.  Put them after the declarator:
 *
 *   static int cache[64] MOLT_NO_MIGRATE;          // re-initialised, not migrated
 *   struct table { size_t n; struct entry *slots MOLT_PTRARRAY(n); };
 *   struct conn  { SSL *ssl MOLT_OPAQUE; };         // copied, never followed
 *   struct list  { void *val MOLT_VAR(t); struct list *next MOLT_INST(t); } MOLT_FORALL(t);
 *   struct list *users MOLT_INST(struct user);      // a list of struct user
 *
 * MOLT_PTRARRAY(n): the pointer addresses n elements; n is an integer or a
 *   field of the same struct.  Pointers default to one element.
 * MOLT_OPAQUE: the pointer value is kept as it is and not followed.
 * MOLT_FORALL(t) / MOLT_VAR(t) / MOLT_INST(type): a struct generic in type
 *   variable t, a void * field holding a t *, and an instantiation.
 * An unannotated void * is followed only if it points into the old image
 * (function, variable, string literal) or to an object already migrated.
 */
#if defined(__clang__)
#define MOLT__ANNOTATE(s) __attribute__((annotate(s)))
#else
#define MOLT__ANNOTATE(s)
#endif
#define MOLT_NO_MIGRATE MOLT__ANNOTATE("molt_no_migrate")
#define MOLT_PTRARRAY(n) MOLT__ANNOTATE("molt_ptrarray:" #n)
#define MOLT_OPAQUE MOLT__ANNOTATE("molt_opaque")
#define MOLT_FORALL(t) MOLT__ANNOTATE("molt_forall:" #t)
#define MOLT_VAR(t) MOLT__ANNOTATE("molt_var:" #t)
#define MOLT_INST(type) MOLT__ANNOTATE("molt_inst:" #type)

/*
 * Marks the next function definition as updatable for moltcc
 * (`MOLT_UPDATABLE int handle(struct req *r) { ... }`).  moltcc reads the
 * mark through libclang; a plain compiler sees nothing.
 */
#if defined(__clang__)
#define MOLT_UPDATABLE __attribute__((annotate("molt_updatable")))
#else
#define MOLT_UPDATABLE
#endif

/* ------------------------------------------------------------------------ */
/* 3. Manual interface                                                       */
/* ------------------------------------------------------------------------ */
/*
 * Declaring an updatable function by hand (what moltcc generates from
 * MOLT_UPDATABLE / DSU_FUNC tags):
 *
 *     MOLT_FUNCTION(int, add, (int a, int b), (a, b)) {
 *         return a + b;
 *     }
 *     MOLT_VOID_FUNCTION(reset, (struct state *s), (s)) { s->n = 0; }
 *     MOLT_STATIC_FUNCTION(int, helper, (int x), (x)) { return x * 2; }
 *
 * `add` keeps its name and its address for the whole life of the process
 * (it is the stable entry); the body above becomes version 0.  Prototypes
 * elsewhere stay ordinary (`int add(int a, int b);`).  Variadic functions are
 * not supported by these macros (moltcc handles them).
 *
 * Writing a patch by hand (one TU per patch, compiled with -fPIC -shared and
 * stamped with the target's build-id by `moltstamp`):
 *
 *     MOLT_PATCH("fix-1", "add saturates at INT_MAX");
 *     MOLT_IMPORT(int, counter);                  // the program's global
 *     MOLT_IMPORT_STATIC(int, hits, "server.c");  // a static of server.c
 *     MOLT_IMPORT_FUNCTION(int, helper, (int), "server.c");
 *     MOLT_PATCH_FUNCTION(int, add, (int a, int b)) {
 *         MOLT_REF(counter)++;
 *         return MOLT_REF(helper)(a) + b;
 *     }
 *     MOLT_PATCH_STATIC_FUNCTION(int, helper, (int x), "server.c") { ... }
 *
 * MOLT_REF(x) is the live object of the running program, never a copy.
 */

#define MOLT_FUNCTION(ret, name, params, args)                                 \
  MOLT__FUNCTION(, ret, name, params, args)
#define MOLT_STATIC_FUNCTION(ret, name, params, args)                          \
  MOLT__FUNCTION(static, ret, name, params, args)
#define MOLT_VOID_FUNCTION(name, params, args)                                 \
  MOLT__VOID_FUNCTION(, name, params, args)
#define MOLT_STATIC_VOID_FUNCTION(name, params, args)                          \
  MOLT__VOID_FUNCTION(static, name, params, args)

#define MOLT_PATCH(id, description)                                            \
  MOLT__PATCH_NOTE;                                                            \
  extern char molt__pfns_start[] __asm__("__start_molt_pfns")                  \
      __attribute__((weak, visibility("hidden")));                             \
  extern char molt__pfns_stop[] __asm__("__stop_molt_pfns")                    \
      __attribute__((weak, visibility("hidden")));                             \
  extern char molt__imps_start[] __asm__("__start_molt_imports")               \
      __attribute__((weak, visibility("hidden")));                             \
  extern char molt__imps_stop[] __asm__("__stop_molt_imports")                 \
      __attribute__((weak, visibility("hidden")));                             \
  MOLT_EXTERN const molt__patch_header molt_patch_header = {                   \
      MOLT__PATCH_MAGIC, MOLT__ABI, (id), (description),                       \
      (const molt__patch_fn *)molt__pfns_start,                                \
      (const molt__patch_fn *)molt__pfns_stop,                                 \
      (const molt__import *)molt__imps_start,                                  \
      (const molt__import *)molt__imps_stop}

#define MOLT_PATCH_FUNCTION(ret, name, params)                                 \
  MOLT__PATCH_FUNCTION(ret, name, params, NULL)
#define MOLT_PATCH_STATIC_FUNCTION(ret, name, params, tu)                      \
  MOLT__PATCH_FUNCTION(ret, name, params, tu)

#define MOLT_IMPORT(type, name) MOLT__IMPORT(type, name, NULL)
#define MOLT_IMPORT_STATIC(type, name, tu) MOLT__IMPORT(type, name, tu)
#define MOLT_IMPORT_FUNCTION(ret, name, params, tu)                            \
  static ret(*molt__imp_##name) params;                                        \
  MOLT__IMPORT_RECORD(name, tu)
#define MOLT_REF(name) (*molt__imp_##name)

/* ------------------------------------------------------------------------ */
/* 4. ABI between generated code and the runtime (not an API)                */
/* ------------------------------------------------------------------------ */

#define MOLT__ABI 2u
#define MOLT__DESC_MAGIC 0x6d6f6c74u  /* "molt" */
#define MOLT__PATCH_MAGIC 0x4d4f4c54u /* "MOLT" */

/*
 * Generation slots.  A generation is one immutable table "function index ->
 * current version".  At most MOLT__SLOTS generations are alive at once (the
 * current one plus old ones some thread still runs); a generation lives in
 * slot `g - molt__gens`, so the fast path can find a generation's counter
 * slot without dereferencing a generation that might just have been retired.
 */
#define MOLT__SLOTS 128

typedef struct molt__gen {
  void *const *table; /* version of each function, indexed by desc.index */
  uint64_t number;    /* generation number (0 = program as built)         */
  uint32_t size;      /* entries in table                                 */
  uint32_t slot;      /* == this - molt__gens                             */
  char pad[40];       /* one cache line per slot                          */
} molt__gen;

/*
 * Per-thread state read by the fast path.  It lives in static TLS of
 * libmolt (initial-exec model, so the access is one %fs-relative
 * instruction even from the executable).  `active[s]` counts the calls of
 * this thread that run code of the generation in slot s.  Only the owning
 * thread writes its counters; the runtime thread reads them.
 */
typedef struct molt__thread {
  /* Where this thread reads its generation: &molt__current for threads that
   * follow the global generation, &view for threads that switch at their own
   * quiescence points.  NULL until the thread is registered. */
  _Atomic(molt__gen *) *viewp;
  _Atomic(molt__gen *) view;
  _Atomic uint32_t active[MOLT__SLOTS];
} molt__thread;

/* Descriptor of one updatable function of the program (section molt_fns).
 *
 * The stable entry is a 5-byte `jmp rel32` in an 8-byte aligned word
 * (MOLT__ENTRY_STUB).  While no live generation replaces version 0 it jumps
 * straight to `direct` (version 0 itself: an updatable call then costs one
 * direct jump); once a patch replaces the function the runtime rewrites the
 * jump to `dispatch`, the generation-table path below (molt__enter/leave),
 * and back to `direct` when the last generation that replaced it is
 * reclaimed (src/runtime/entry.c). */
typedef struct molt__fn_desc {
  uint32_t magic;   /* MOLT__DESC_MAGIC                                    */
  uint32_t index;   /* position in generation tables, set at registration */
  const char *name; /* function name                                       */
  const char *tu;   /* source file (static functions: part of the key)    */
  void *entry;      /* the stable entry (the function's own address)       */
  void *body;       /* version 0, as generation tables call it             */
  void *dispatch;   /* the generation-table path                           */
  void *direct;     /* entry target while version 0 is the only one alive;
                       NULL: always dispatch (variadic functions, whose
                       version 0 takes a va_list)                          */
  uint32_t is_static;
  uint32_t reserved;
} molt__fn_desc;

/* A new version brought by a patch (section molt_pfns of the patch). */
typedef struct molt__patch_fn {
  const char *name;
  const char *tu; /* NULL for external functions */
  void *impl;
} molt__patch_fn;

/* A reference from patch code to an object of the running program. */
typedef struct molt__import {
  const char *name;
  const char *tu; /* NULL: global symbol; else the static's source file */
  void **slot;    /* filled by the runtime before the patch is switched in */
} molt__import;

typedef struct molt__patch_header {
  uint32_t magic;
  uint32_t abi;
  const char *id;
  const char *description;
  const molt__patch_fn *fns, *fns_end;
  const molt__import *imports, *imports_end;
} molt__patch_header;

/*
 * ELF note that identifies a patch before it is loaded: owner "molt",
 * type MOLT__NOTE_TYPE, descriptor below.  The target build-id (hex) is
 * written into the file after linking by `moltstamp` (all zeros = unstamped).
 */
#define MOLT__NOTE_NAME "molt"
#define MOLT__NOTE_TYPE 0x4d50u /* "MP" */
#define MOLT__BUILD_ID_HEX_MAX 128
typedef struct molt__patch_note {
  uint32_t abi;
  uint32_t reserved;
  char target_build_id[MOLT__BUILD_ID_HEX_MAX + 8]; /* hex, NUL-terminated */
} molt__patch_note;

MOLT_EXTERN extern molt__gen molt__gens[MOLT__SLOTS];
MOLT_EXTERN extern _Atomic(molt__gen *) molt__current;
MOLT_EXTERN extern __thread molt__thread molt__self
    __attribute__((tls_model("initial-exec")));
MOLT_EXTERN void molt__thread_register(void);
MOLT_EXTERN void molt__register_module(molt__fn_desc *start,
                                       molt__fn_desc *stop);

/*
 * Fast path, part 1: pin the generation this call will run and return it.
 *
 * Protocol (hazard-pointer style, asymmetric fences):
 *   reader:    g = *viewp; active[slot(g)]++; compiler barrier; recheck *viewp == g
 *   reclaimer: publish a new generation; membarrier(); read every active[]
 * membarrier() executes a full fence on every running thread of the process,
 * so for each reader either (a) its increment is visible to the reclaimer's
 * scan, or (b) its recheck load happens after the new generation was
 * published and fails, and the reader undoes the increment and retries.
 * So once the reclaimer has seen a zero counter for a retired generation, no
 * thread can start running that generation again: there is no window between
 * "read the counter location" and "read the function" (PSU 4.2.6), because
 * both are derived from the same pinned generation.  The slot index is
 * computed from the pointer value alone, so a stale pointer is never
 * dereferenced before the recheck succeeds.
 */
static inline __attribute__((always_inline)) molt__gen *molt__enter(void) {
  molt__thread *t = &molt__self;
  for (;;) {
    _Atomic(molt__gen *) *vp = t->viewp;
    if (__builtin_expect(vp == NULL, 0)) {
      molt__thread_register();
      continue;
    }
    /* relaxed: the value is only trusted after the acquire recheck below. */
    molt__gen *g = atomic_load_explicit(vp, memory_order_relaxed);
    size_t s = (size_t)(g - molt__gens);
    /* Only this thread writes its counters, so load+store is a correct
     * increment (a signal handler that calls updatable functions nests and
     * restores the value before we resume).  relaxed: the CPU-level ordering
     * against the recheck is supplied by the reclaimer's membarrier(). */
    uint32_t c = atomic_load_explicit(&t->active[s], memory_order_relaxed);
    atomic_store_explicit(&t->active[s], c + 1, memory_order_relaxed);
    /* Compiler barrier: keep the increment before the recheck load.  Not a
     * CPU fence: membarrier() in the reclaimer turns this into a full fence
     * exactly when it matters. */
    atomic_signal_fence(memory_order_seq_cst);
    /* acquire: pairs with the release that published g, so g->table is the
     * published table (also when the slot was reused: see the comment). */
    if (__builtin_expect(atomic_load_explicit(vp, memory_order_acquire) == g, 1))
      return g;
    atomic_store_explicit(&t->active[s], c, memory_order_relaxed);
  }
}

/*
 * Fast path, part 2: the call has returned.  release: every access the call
 * made to the generation's code and data happens before the reclaimer (which
 * reads the counter with acquire) sees the count drop and unloads it.
 */
static inline __attribute__((always_inline)) void molt__leave(molt__gen *g) {
  molt__thread *t = &molt__self;
  size_t s = (size_t)(g - molt__gens);
  uint32_t c = atomic_load_explicit(&t->active[s], memory_order_relaxed);
  atomic_store_explicit(&t->active[s], c - 1, memory_order_release);
}

#if defined(__FILE_NAME__)
#define MOLT__TU __FILE_NAME__
#else
#define MOLT__TU __FILE__
#endif

#define MOLT__SECTION(s) __attribute__((used, section(s), aligned(8)))

#define MOLT__DESC(linkage, name, is_static)                                   \
  static molt__fn_desc name##__molt_desc MOLT__SECTION("molt_fns") = {         \
      MOLT__DESC_MAGIC, UINT32_MAX, #name, MOLT__TU, (void *)&name,            \
      (void *)&name##__molt_v0, (void *)&name##__molt_dispatch,                \
      (void *)&name##__molt_v0, is_static, 0}

/*
 * The stable entry's body: one `jmp rel32` (opcode e9 and a 4-byte
 * displacement), spelled out so that the assembler cannot pick the 2-byte
 * form.  The function holding it is naked and 8-byte aligned, so the
 * displacement lies inside one aligned 8-byte word, which the runtime
 * rewrites with a single atomic store (src/runtime/entry.c).  Version 0 is
 * named by its symbol: the TU must not be compiled with -flto, which may
 * rename static functions.
 */
#if !defined(__x86_64__)
#error "molt's updatable functions are implemented for x86-64 only"
#endif
#define MOLT__ENTRY_STUB(target) __asm__(".byte 0xe9\n\t.long " #target " - . - 4")
/* Instrumentation options (-pg, -finstrument-functions, --coverage,
 * -fpatchable-function-entry, -fsplit-stack, -fstack-protector-all) would
 * put code before the jump; these attributes keep it out of the entry. */
#if defined(__has_attribute)
#if __has_attribute(no_profile_instrument_function)
#define MOLT__NO_PROFILE no_profile_instrument_function,
#endif
#if __has_attribute(no_split_stack)
#define MOLT__NO_SPLIT no_split_stack,
#endif
#if __has_attribute(no_stack_protector)
#define MOLT__NO_SSP no_stack_protector,
#endif
#if __has_attribute(patchable_function_entry)
#define MOLT__NO_PATCHABLE patchable_function_entry(0, 0),
#endif
#endif
#ifndef MOLT__NO_PROFILE
#define MOLT__NO_PROFILE
#endif
#ifndef MOLT__NO_SPLIT
#define MOLT__NO_SPLIT
#endif
#ifndef MOLT__NO_SSP
#define MOLT__NO_SSP
#endif
#ifndef MOLT__NO_PATCHABLE
#define MOLT__NO_PATCHABLE
#endif
/* All entries of a module share one section: a patch then rewrites (and
 * copies on write) a few pages of entries instead of one page per function
 * scattered through the text. */
#define MOLT__ENTRY_ATTRS                                                      \
  __attribute__((naked, aligned(8), noinline, no_instrument_function,          \
                 MOLT__NO_PROFILE MOLT__NO_SPLIT MOLT__NO_SSP MOLT__NO_PATCHABLE \
                 used, section(".text.molt_entries")))
/* Naked functions leave their parameters unused by construction. */
#define MOLT__DIAG_PUSH                                                        \
  _Pragma("GCC diagnostic push")                                               \
      _Pragma("GCC diagnostic ignored \"-Wunused-parameter\"")
#define MOLT__DIAG_POP _Pragma("GCC diagnostic pop")

#define MOLT__FUNCTION(linkage, ret, name, params, args)                       \
  linkage ret name params;                                                     \
  static ret name##__molt_v0 params;                                           \
  static ret name##__molt_dispatch params;                                     \
  MOLT__DESC(linkage, name, sizeof(#linkage) > 1);                             \
  MOLT__DIAG_PUSH                                                              \
  linkage MOLT__ENTRY_ATTRS ret name params { MOLT__ENTRY_STUB(name##__molt_v0); } \
  MOLT__DIAG_POP                                                               \
  static __attribute__((used)) ret name##__molt_dispatch params {              \
    molt__gen *molt__g = molt__enter();                                        \
    ret molt__r =                                                              \
        ((ret(*) params)molt__g->table[name##__molt_desc.index]) args;         \
    molt__leave(molt__g);                                                      \
    return molt__r;                                                            \
  }                                                                            \
  static ret name##__molt_v0 params

#define MOLT__VOID_FUNCTION(linkage, name, params, args)                       \
  linkage void name params;                                                    \
  static void name##__molt_v0 params;                                          \
  static void name##__molt_dispatch params;                                    \
  MOLT__DESC(linkage, name, sizeof(#linkage) > 1);                             \
  MOLT__DIAG_PUSH                                                              \
  linkage MOLT__ENTRY_ATTRS void name params { MOLT__ENTRY_STUB(name##__molt_v0); } \
  MOLT__DIAG_POP                                                               \
  static __attribute__((used)) void name##__molt_dispatch params {             \
    molt__gen *molt__g = molt__enter();                                        \
    ((void(*) params)molt__g->table[name##__molt_desc.index]) args;            \
    molt__leave(molt__g);                                                      \
  }                                                                            \
  static void name##__molt_v0 params

#define MOLT__PATCH_NOTE                                                       \
  __attribute__((used, section(".note.molt"), aligned(4))) static const struct { \
    uint32_t namesz, descsz, type;                                             \
    char name[8];                                                              \
    molt__patch_note desc;                                                     \
  } molt__note = {5, sizeof(molt__patch_note), MOLT__NOTE_TYPE, "molt",        \
                  {MOLT__ABI, 0, {0}}}

#define MOLT__PATCH_FUNCTION(ret, name, params, tu)                            \
  static ret name##__molt_p params;                                            \
  static const molt__patch_fn name##__molt_pfn MOLT__SECTION("molt_pfns") = {  \
      #name, tu, (void *)&name##__molt_p};                                     \
  static ret name##__molt_p params

#define MOLT__IMPORT_RECORD(name, tu)                                          \
  static const molt__import name##__molt_imp MOLT__SECTION("molt_imports") = { \
      #name, tu, (void **)&molt__imp_##name}

#define MOLT__IMPORT(type, name, tu)                                           \
  static type *molt__imp_##name;                                               \
  MOLT__IMPORT_RECORD(name, tu)

/*
 * Full updates: the ABI between the code moltcc generates into a program
 * image (tools/moltcc, from DWARF and the .xf file) and the runtime
 * (src/runtime/xf.c, program.c).  See docs/full-updates.md.
 *
 * Every program image defines `const molt__program_info molt__program`.
 * The runtime calls `migrate` of the NEW image on the runtime thread while
 * every thread of the old version waits at an update point; it reads the
 * old version through `in` pointers and writes the new one through `out`.
 * Any molt__xf_* call may abort the migration (it does not return then);
 * a fault inside `migrate` aborts it too.  On abort every in-place write is
 * undone, everything allocated is freed and the old version continues.
 */
#define MOLT__PROGRAM_ABI 1u

typedef struct molt__xf_ctx molt__xf_ctx; /* runtime-private */

/* Transforms (or, for unchanged types, fixes the pointers of) one object:
 * in = old object, out = new object (in == out when fixed in place). */
typedef void (*molt__xf_fn)(molt__xf_ctx *cx, const void *in, void *out);

enum {
  /* The new representation differs: a migrated heap object is replaced by a
   * new one (calloc'ed, then fn(in, out)); the old one is freed after the
   * update commits. */
  MOLT__XF_CHANGED = 1u,
  /* The type (transitively) contains pointers: objects must be visited.
   * Unchanged types without this flag are copied as bytes, never visited. */
  MOLT__XF_TRAVERSE = 2u,
};

/* One (old type -> new type) pair, generated once per pair. */
typedef struct molt__xf_type {
  const char *name;       /* for messages, e.g. "struct entry" */
  size_t old_size, new_size;
  molt__xf_fn fn;         /* NULL: nothing to do beyond copying bytes */
  uint32_t flags;         /* MOLT__XF_* */
} molt__xf_type;

typedef struct molt__program_info {
  uint32_t abi;                /* MOLT__PROGRAM_ABI */
  uint32_t reserved;
  /* Hex build-id of the image this version was built from (--molt-from);
   * NULL for a first version, which cannot be an update target. */
  const char *from_build_id;
  /* Migrates the state from the old version; NULL for a first version. */
  void (*migrate)(molt__xf_ctx *cx);
} molt__program_info;

/* Address of variable or function `name` (tu: source file basename of a
 * static, NULL for a global) in the old / new image.  Aborts the migration
 * with a message naming the symbol if it does not exist. */
MOLT_EXTERN void *molt__xf_oldsym(molt__xf_ctx *cx, const char *name,
                                  const char *tu);
MOLT_EXTERN void *molt__xf_newsym(molt__xf_ctx *cx, const char *name,
                                  const char *tu);
/* Records that the old variable at `in` (count objects of t) lives at `out`
 * in the new version: later pointers into it are redirected (element-wise
 * when t changed).  Does not transform it. */
MOLT_EXTERN void molt__xf_map_var(molt__xf_ctx *cx, const void *in, void *out,
                                  const molt__xf_type *t, size_t count);
/* molt__xf_map_var + queues the transformation: unchanged types are copied
 * byte for byte and then visited (TRAVERSE); changed types run t->fn per
 * element (the new variable keeps its initializer where fn writes nothing). */
MOLT_EXTERN void molt__xf_var(molt__xf_ctx *cx, const void *in, void *out,
                              const molt__xf_type *t, size_t count);
/* The new value of an old pointer to `count` objects of type t (t NULL: an
 * untyped pointer -- void *, char *, function pointer).  NULL stays NULL;
 * an already migrated object maps to its new address (sharing and cycles
 * are kept); a pointer into the old image is redirected to the new image
 * (functions and variables by name, string literals copied to memory the
 * runtime keeps); a heap object of a CHANGED type is replaced; one of an
 * unchanged TRAVERSE type is queued to be visited in place.  The transform
 * itself runs later from the work list (no deep recursion). */
MOLT_EXTERN void *molt__xf_ptr(molt__xf_ctx *cx, const void *old,
                               const molt__xf_type *t, size_t count);
/* Stores a pointer into an object being fixed in place (undone on abort).
 * Generated fixers for unchanged types store every pointer this way. */
MOLT_EXTERN void molt__xf_setp(molt__xf_ctx *cx, void *slot, void *value);
/* Runs queued transformations until none is left. */
MOLT_EXTERN void molt__xf_run(molt__xf_ctx *cx);
/* Migrates the saved copies of local `var` of function `func` (registered
 * with MOLT_MIGRATE_LOCAL by the old version) of every thread to type t. */
MOLT_EXTERN void molt__xf_local(molt__xf_ctx *cx, const char *func,
                                const char *var, const molt__xf_type *t);
/* Frees an old heap object after the update commits; never on abort (the
 * old version goes on with it).  Same safety rules as replaced objects:
 * only an object in the heap or an anonymous private mapping is freed, once
 * (also when it was replaced too, or asked for twice), and never one that
 * lies inside another freed or replaced object.  For rule bodies
 * (MOLT_XF_FREE_OLD) that drop old data the runtime does not replace. */
MOLT_EXTERN void molt__xf_free_old(molt__xf_ctx *cx, const void *old);
/* Aborts the migration with a one-line message (never returns). */
MOLT_EXTERN void molt__xf_fail(molt__xf_ctx *cx, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 2, 3)));

/*
 * Every TU that includes molt.h registers its module's molt_fns section
 * before any user constructor runs (priority 101).  The runtime deduplicates
 * calls from several TUs of one module.  In a module without updatable
 * functions the weak section bounds are NULL and the call does nothing.
 */
#ifndef MOLT__NO_AUTO_REGISTER
extern molt__fn_desc molt__fns_start[] __asm__("__start_molt_fns")
    __attribute__((weak, visibility("hidden")));
extern molt__fn_desc molt__fns_stop[] __asm__("__stop_molt_fns")
    __attribute__((weak, visibility("hidden")));
__attribute__((constructor(101), used)) static void molt__module_ctor(void) {
  if ((void *)molt__fns_start != (void *)molt__fns_stop)
    molt__register_module(molt__fns_start, molt__fns_stop);
}
#endif

#ifdef __cplusplus
}
#endif
#endif /* MOLT_H */
