/*
 * molt/abi.h -- the ABI between generated code and libmolt (not an API).
 *
 * What moltcc generates into a program (and what the manual interface of
 * molt.h expands to) meets the runtime here: generation slots and the
 * per-thread counters that the inline dispatch fast path reads, descriptors
 * of updatable functions and their registration, the records of a patch and
 * its ELF note.  Program authors never name any of this; molt.h includes it
 * because its macros expand to it.  Everything here is versioned by
 * MOLT__ABI: libmolt refuses a module (molt__register_module) or a patch
 * (its header and note) built against another version.
 */
#ifndef MOLT_ABI_H
#define MOLT_ABI_H

#include "../molt.h"

#include <stddef.h>
#include <stdint.h>

/* The counters below are C11 atomics for the runtime (built as C11).  A
 * program may include this header from C89/C99 or C++, where _Atomic does
 * not exist: there the same fields are plain types (same size and alignment
 * on x86-64) and the inline fast path uses the compiler's __atomic builtins,
 * which give the same orderings. */
#if !defined(__cplusplus) && defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && \
    !defined(__STDC_NO_ATOMICS__)
#include <stdatomic.h>
#define MOLT__ATOMIC(T) _Atomic(T)
#define MOLT__LOAD(p, mo) atomic_load_explicit(p, memory_order_##mo)
#define MOLT__STORE(p, v, mo) atomic_store_explicit(p, v, memory_order_##mo)
#define MOLT__SIGNAL_FENCE() atomic_signal_fence(memory_order_seq_cst)
#else
#define MOLT__ATOMIC(T) T
#define MOLT__LOAD(p, mo) __atomic_load_n(p, MOLT__MO_##mo)
#define MOLT__STORE(p, v, mo) __atomic_store_n(p, v, MOLT__MO_##mo)
#define MOLT__SIGNAL_FENCE() __atomic_signal_fence(__ATOMIC_SEQ_CST)
#define MOLT__MO_relaxed __ATOMIC_RELAXED
#define MOLT__MO_acquire __ATOMIC_ACQUIRE
#define MOLT__MO_release __ATOMIC_RELEASE
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Version of everything in this header.  3: molt__register_module takes the
 * version its caller was built with.  4: patches reach the program through
 * their own GOT (import table of symbols, resolved by the runtime from the
 * patch's dynamic relocations) instead of slots, and the patch header is
 * version 2 (provenance, pinned).  5: molt__thread ends with the proof
 * fields and molt__enter answers a pending proof round (core/proof.c). */
#define MOLT__ABI 5u
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
  MOLT__ATOMIC(molt__gen *) * viewp;
  MOLT__ATOMIC(molt__gen *) view;
  MOLT__ATOMIC(uint32_t) active[MOLT__SLOTS];
  /* Proofs that this thread runs no superseded patch code (core/proof.c):
   * the last proof round it answered (only this thread reads or writes
   * it), and its answer, written by this thread and read by the runtime
   * thread: the version of the table of superseded patches it checked, in
   * the high 32 bits, and in the low 32 bits the patches of that table its
   * stack still named. */
  uint32_t proof_round;
  uint32_t proof_pad;
  MOLT__ATOMIC(uint64_t) proof_answer;
} molt__thread;

/* Descriptor of one updatable function of the program (section molt_fns).
 *
 * The stable entry is a 5-byte `jmp rel32` in an 8-byte aligned word
 * (MOLT__ENTRY_STUB).  While no live generation replaces version 0 it jumps
 * straight to `direct` (version 0 itself: an updatable call then costs one
 * direct jump); once a patch replaces the function the runtime rewrites the
 * jump to `dispatch`, the generation-table path below (molt__enter/leave),
 * for the transition; once every live generation maps the function to the
 * patch's version, to a trampoline slot near the entry that jumps into the
 * patch (two jumps, not counted: src/runtime/core/proof.c proves the patch
 * unused before it is unloaded); and back to `direct` when the last
 * generation that replaced it is reclaimed (src/runtime/core/entry.c). */
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

/*
 * An import: a symbol of the patch that stands for an object or function of
 * the running program (section molt_imports of the patch).  Patch code is
 * compiled -fPIC and refers to `symbol` like to any undefined symbol
 * (through its GOT, or a data word for an address in an initializer);
 * moltstamp marks it weak in .dynsym so that dlopen leaves it 0, and the
 * runtime, before the patch can run, writes the address of (name, tu) in
 * the target module into every dynamic relocation against it.  Globals are
 * usually their own import symbol ("counter"); a static needs a symbol of
 * its own per (tu, name), MOLT__IMPORT_PREFIX followed by anything.  A
 * symbol with that prefix that the table does not list makes the runtime
 * refuse the patch.
 */
typedef struct molt__import {
  const char *symbol; /* the undefined symbol of the patch */
  const char *name;   /* the symbol of the running program */
  const char *tu;     /* NULL: global symbol; else the static's source file */
} molt__import;
#define MOLT__IMPORT_PREFIX "molt.imp."

/* Layout version of molt__patch_header within MOLT__ABI: 2 added version,
 * flags, provenance and pinned_reasons at its end. */
#define MOLT__PATCH_HEADER_VERSION 2u
/* The runtime never unloads a pinned patch once it has been loaded (the
 * program may keep pointers into its code or data: pinned_reasons). */
#define MOLT__PATCH_PINNED 1u

typedef struct molt__patch_header {
  uint32_t magic;
  uint32_t abi;
  const char *id;
  const char *description;
  const molt__patch_fn *fns, *fns_end;
  const molt__import *imports, *imports_end;
  uint32_t version; /* MOLT__PATCH_HEADER_VERSION */
  uint32_t flags;   /* MOLT__PATCH_PINNED */
  /* What the patch was built from ("diff fix.patch sha256:...; files: a.c"),
   * "" if not known. */
  const char *provenance;
  /* Why it is pinned, one reason per line ("file:line: what"); "" if not. */
  const char *pinned_reasons;
} molt__patch_header;

/*
 * ELF note that identifies a patch before it is loaded: owner "molt",
 * type MOLT__NOTE_TYPE, descriptor below.  The target build-id (hex) is
 * written into the file after linking by `moltstamp` (all zeros = unstamped).
 */
#define MOLT__NOTE_NAME "molt"
#define MOLT__NOTE_TYPE 0x4d50u /* "MP" */
/* A second note (owner "molt", this type, 32 bytes): the SHA-256 of the
 * whole file with these 32 bytes read as zeros, written by moltstamp last.
 * The runtime refuses a patch whose contents do not match it: a damaged
 * byte anywhere, even in code no format check can judge (issue 16). */
#define MOLT__NOTE_DIGEST_TYPE 0x4d44u /* "MD" */
#define MOLT__DIGEST_SIZE 32
#define MOLT__BUILD_ID_HEX_MAX 128
typedef struct molt__patch_note {
  uint32_t abi;
  uint32_t reserved;
  char target_build_id[MOLT__BUILD_ID_HEX_MAX + 8]; /* hex, NUL-terminated */
} molt__patch_note;

/*
 * A pre- or post-update callback of a patch (molt.h MOLT_PATCH_PRE/POST):
 * one ELF note each (owner "molt", this type, in section
 * .note.molt.callback), so that the runtime learns where the callbacks are
 * from the file, before dlopen and without running anything of it.  The
 * descriptor: kind, 0, the callback's address minus the address of the
 * `target` field itself (a link-time constant: the note is position
 * independent and needs no relocation), then the callback's name,
 * NUL-terminated (at most MOLT__CALLBACK_NAME_MAX bytes with the NUL).
 * At most one note of each kind; the target must lie in an executable
 * PT_LOAD segment of the patch (common/elf.c refuses anything else).
 */
#define MOLT__NOTE_CALLBACK_TYPE 0x4d43u /* "MC" */
#define MOLT__CALLBACK_PRE 1u
#define MOLT__CALLBACK_POST 2u
#define MOLT__CALLBACK_NAME_MAX 128
typedef struct molt__callback_note {
  uint32_t kind; /* MOLT__CALLBACK_PRE or MOLT__CALLBACK_POST */
  uint32_t reserved;
  int64_t target; /* callback address - address of this field */
  /* char name[]: follows, NUL-terminated */
} molt__callback_note;

MOLT_EXTERN extern molt__gen molt__gens[MOLT__SLOTS];
MOLT_EXTERN extern MOLT__ATOMIC(molt__gen *) molt__current;
MOLT_EXTERN extern __thread molt__thread molt__self
    __attribute__((tls_model("initial-exec")));
MOLT_EXTERN void molt__thread_register(void);
/* The runtime asks every thread that runs the dispatch path to check its
 * own stack for superseded patch code, once per round: molt__proof_round
 * changes while such a proof is pending (core/proof.c).  relaxed: a stale
 * value only delays the answer to the next call. */
MOLT_EXTERN extern MOLT__ATOMIC(uint32_t) molt__proof_round;
MOLT_EXTERN void molt__thread_prove(void);
/* Registers the descriptors [start, stop) of one module (from the module's
 * constructor, below).  `abi` is the MOLT__ABI the module was built with:
 * a module of another version is refused (its functions stay version 0 and
 * the runtime enters the refusing state, naming the module and both
 * versions), because its descriptors and entries may not have the layout
 * this runtime reads. */
MOLT_EXTERN void molt__register_module(uint32_t abi, molt__fn_desc *start,
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
static __inline__ __attribute__((always_inline)) molt__gen *molt__enter(void) {
  /* (Declarations first and __inline__: C89 programs include this too.) */
  molt__thread *t = &molt__self;
  MOLT__ATOMIC(molt__gen *) * vp;
  molt__gen *g;
  size_t s;
  uint32_t c;
  /* A proof round is open (a patch that calls reached by a direct jump
   * was superseded): say whether this thread's stack still holds its
   * code.  Costs two loads and a branch while no round is open. */
  if (__builtin_expect(t->proof_round != MOLT__LOAD(&molt__proof_round, relaxed), 0))
    molt__thread_prove();
  for (;;) {
    vp = t->viewp;
    if (__builtin_expect(vp == NULL, 0)) {
      molt__thread_register();
      continue;
    }
    /* relaxed: the value is only trusted after the acquire recheck below. */
    g = MOLT__LOAD(vp, relaxed);
    s = (size_t)(g - molt__gens);
    /* Only this thread writes its counters, so load+store is a correct
     * increment (a signal handler that calls updatable functions nests and
     * restores the value before we resume).  relaxed: the CPU-level ordering
     * against the recheck is supplied by the reclaimer's membarrier(). */
    c = MOLT__LOAD(&t->active[s], relaxed);
    MOLT__STORE(&t->active[s], c + 1, relaxed);
    /* Compiler barrier: keep the increment before the recheck load.  Not a
     * CPU fence: membarrier() in the reclaimer turns this into a full fence
     * exactly when it matters. */
    MOLT__SIGNAL_FENCE();
    /* acquire: pairs with the release that published g, so g->table is the
     * published table (also when the slot was reused: see the comment). */
    if (__builtin_expect(MOLT__LOAD(vp, acquire) == g, 1))
      return g;
    MOLT__STORE(&t->active[s], c, relaxed);
  }
}

/*
 * Fast path, part 2: the call has returned.  release: every access the call
 * made to the generation's code and data happens before the reclaimer (which
 * reads the counter with acquire) sees the count drop and unloads it.
 */
static __inline__ __attribute__((always_inline)) void molt__leave(molt__gen *g) {
  molt__thread *t = &molt__self;
  size_t s = (size_t)(g - molt__gens);
  uint32_t c = MOLT__LOAD(&t->active[s], relaxed);
  MOLT__STORE(&t->active[s], c - 1, release);
}

#if defined(__FILE_NAME__)
#define MOLT__TU __FILE_NAME__
#else
#define MOLT__TU __FILE__
#endif

#define MOLT__SECTION(s) __attribute__((used, section(s), aligned(8)))

/* (__extension__ on the casts: ISO C has no conversion between function and
 * object pointers, and programs built with -pedantic include this.) */
#define MOLT__DESC(linkage, name)                                                        \
  static molt__fn_desc name##__molt_desc MOLT__SECTION("molt_fns") = {                   \
      MOLT__DESC_MAGIC,                                                                  \
      UINT32_MAX,                                                                        \
      #name,                                                                             \
      MOLT__TU,                                                                          \
      __extension__(void *) & name,                                                      \
      __extension__(void *) & name##__molt_v0,                                           \
      __extension__(void *) & name##__molt_dispatch,                                     \
      __extension__(void *) & name##__molt_v0,                                           \
      MOLT__IS_STATIC_##linkage,                                                         \
      0}
/* linkage is `static` or `extern` (C89 has no empty macro arguments; an
 * empty one is still read as extern). */
#define MOLT__IS_STATIC_static 1u
#define MOLT__IS_STATIC_extern 0u
#define MOLT__IS_STATIC_ 0u

/*
 * The stable entry's body: one `jmp rel32` (opcode e9 and a 4-byte
 * displacement), spelled out so that the assembler cannot pick the 2-byte
 * form.  The function holding it is naked and 8-byte aligned, so the
 * displacement lies inside one aligned 8-byte word, which the runtime
 * rewrites with a single atomic store (src/runtime/core/entry.c).  Version 0 is
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
#define MOLT__ENTRY_ATTRS                                                                \
  __attribute__((naked, aligned(8), noinline, no_instrument_function,                    \
                 MOLT__NO_PROFILE MOLT__NO_SPLIT MOLT__NO_SSP MOLT__NO_PATCHABLE used,   \
                 section(".text.molt_entries")))
#ifdef __cplusplus
#define MOLT__ENTRY_DEF_ATTRS
#else
#define MOLT__ENTRY_DEF_ATTRS MOLT__ENTRY_ATTRS
#endif
/* Naked functions leave their parameters unused by construction. */
/* clang-format off */
#define MOLT__DIAG_PUSH                                                                  \
  _Pragma("GCC diagnostic push")                                                         \
  _Pragma("GCC diagnostic ignored \"-Wunused-parameter\"")
/* clang-format on */
#define MOLT__DIAG_POP _Pragma("GCC diagnostic pop")

/* The entry is declared with its attributes first (a prototype for
 * -Wmissing-prototypes, and C++ accepts the attributes only on the first
 * declaration: MOLT__ENTRY_DEF_ATTRS repeats them for C only). */
#define MOLT__FUNCTION(linkage, ret, name, params, args)                                 \
  linkage MOLT__ENTRY_ATTRS ret name params;                                             \
  static ret name##__molt_v0 params;                                                     \
  static ret name##__molt_dispatch params;                                               \
  MOLT__DESC(linkage, name);                                                             \
  MOLT__DIAG_PUSH                                                                        \
  linkage MOLT__ENTRY_DEF_ATTRS ret name params { MOLT__ENTRY_STUB(name##__molt_v0); }   \
  MOLT__DIAG_POP                                                                         \
  static __attribute__((used)) ret name##__molt_dispatch params {                        \
    molt__gen *molt__g = molt__enter();                                                  \
    ret molt__r =                                                                        \
        (__extension__(ret(*) params) molt__g->table[name##__molt_desc.index])args;      \
    molt__leave(molt__g);                                                                \
    return molt__r;                                                                      \
  }                                                                                      \
  static ret name##__molt_v0 params

#define MOLT__VOID_FUNCTION(linkage, name, params, args)                                 \
  linkage MOLT__ENTRY_ATTRS void name params;                                            \
  static void name##__molt_v0 params;                                                    \
  static void name##__molt_dispatch params;                                              \
  MOLT__DESC(linkage, name);                                                             \
  MOLT__DIAG_PUSH                                                                        \
  linkage MOLT__ENTRY_DEF_ATTRS void name params { MOLT__ENTRY_STUB(name##__molt_v0); }  \
  MOLT__DIAG_POP                                                                         \
  static __attribute__((used)) void name##__molt_dispatch params {                       \
    molt__gen *molt__g = molt__enter();                                                  \
    (__extension__(void(*) params) molt__g->table[name##__molt_desc.index]) args;        \
    molt__leave(molt__g);                                                                \
  }                                                                                      \
  static void name##__molt_v0 params

#define MOLT__PATCH_NOTE                                                                 \
  __attribute__((used, section(".note.molt"), aligned(4))) static const struct {         \
    uint32_t namesz, descsz, type;                                                       \
    char name[8];                                                                        \
    molt__patch_note desc;                                                               \
    uint32_t digest_namesz, digest_descsz, digest_type;                                  \
    char digest_name[8];                                                                 \
    unsigned char digest[MOLT__DIGEST_SIZE];                                             \
  } molt__note = {                                                                       \
      5, sizeof(molt__patch_note), MOLT__NOTE_TYPE,        "molt", {MOLT__ABI, 0, {0}},  \
      5, MOLT__DIGEST_SIZE,        MOLT__NOTE_DIGEST_TYPE, "molt", {0}}

/* A callback of kind `kind` (1 pre, 2 post): a hidden wrapper
 * molt__patch_<k>_<fn> (which also checks that fn is int (void)) and its
 * note, whose target is the wrapper (hidden: `wrapper - .` is resolved by
 * the static linker, whatever fn's visibility). */
#define MOLT__PATCH_CALLBACK(kind, k, fn)                                                \
  __attribute__((used, visibility("hidden"))) int molt__patch_##k##_##fn(void);          \
  int molt__patch_##k##_##fn(void) { return fn(); }                                      \
  __asm__(".pushsection .note.molt.callback,\"a\",@note\n"                               \
          "\t.balign 4\n"                                                                \
          "\t.long 5\n"                                                                  \
          "\t.long 2f - 1f\n"                                                            \
          "\t.long 0x4d43\n" /* MOLT__NOTE_CALLBACK_TYPE */                              \
          "\t.asciz \"molt\"\n"                                                          \
          "\t.balign 4\n"                                                                \
          "1:\t.long " #kind "\n"                                                        \
          "\t.long 0\n"                                                                  \
          "\t.quad molt__patch_" #k "_" #fn " - .\n"                                     \
          "\t.asciz \"" #fn "\"\n"                                                       \
          "2:\t.balign 4\n"                                                              \
          "\t.popsection")

#define MOLT__PATCH_FUNCTION(ret, name, params, tu)                                      \
  static ret name##__molt_p params;                                                      \
  static const molt__patch_fn name##__molt_pfn MOLT__SECTION("molt_pfns") = {            \
      #name, tu, __extension__(void *) & name##__molt_p};                                \
  static ret name##__molt_p params

/* An import record of the manual interface (molt.h MOLT_IMPORT...): the C
 * identifier molt__imp_<name> is declared with the asm label
 * MOLT__IMPORT_PREFIX "<name>", which the record maps to (name, tu). */
#define MOLT__IMPORT_RECORD(name, tu)                                                    \
  static const molt__import name##__molt_imp MOLT__SECTION("molt_imports") = {           \
      MOLT__IMPORT_PREFIX #name, #name, tu}

#define MOLT__IMPORT(type, name, tu)                                                     \
  extern type molt__imp_##name __asm__(MOLT__IMPORT_PREFIX #name);                       \
  MOLT__IMPORT_RECORD(name, tu)

#define MOLT__PATCH_HEADER(id, description, provenance, flags, reasons)                  \
  MOLT__PATCH_NOTE;                                                                      \
  extern char molt__pfns_start[] __asm__("__start_molt_pfns")                            \
      __attribute__((weak, visibility("hidden")));                                       \
  extern char molt__pfns_stop[] __asm__("__stop_molt_pfns")                              \
      __attribute__((weak, visibility("hidden")));                                       \
  extern char molt__imps_start[] __asm__("__start_molt_imports")                         \
      __attribute__((weak, visibility("hidden")));                                       \
  extern char molt__imps_stop[] __asm__("__stop_molt_imports")                           \
      __attribute__((weak, visibility("hidden")));                                       \
  /* (declared extern first: a const definition is internal in C++) */                   \
  MOLT_EXTERN extern const molt__patch_header molt_patch_header;                         \
  const molt__patch_header molt_patch_header = {                                         \
      MOLT__PATCH_MAGIC,                                                                 \
      MOLT__ABI,                                                                         \
      (id),                                                                              \
      (description),                                                                     \
      (const molt__patch_fn *)molt__pfns_start,                                          \
      (const molt__patch_fn *)molt__pfns_stop,                                           \
      (const molt__import *)molt__imps_start,                                            \
      (const molt__import *)molt__imps_stop,                                             \
      MOLT__PATCH_HEADER_VERSION,                                                        \
      (flags),                                                                           \
      (provenance),                                                                      \
      (reasons)}

/*
 * Every TU that includes molt.h (and so this header) registers its module's molt_fns section
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
    molt__register_module(MOLT__ABI, molt__fns_start, molt__fns_stop);
}
#endif

#ifdef __cplusplus
}
#endif
#endif /* MOLT_ABI_H */
