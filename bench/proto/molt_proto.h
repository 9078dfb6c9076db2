/*
 * molt_proto.h — prototypes of other dispatch fast paths, for measurement.
 *
 * NOT part of molt.  These are copies of the shape of MOLT__FUNCTION in
 * include/molt.h with a different entry sequence, built against the real
 * libmolt (same descriptors, same generation tables, same TLS block), so the
 * numbers say what a change of molt.h would buy on the P1/P2 loops.  The
 * bench never patches a program built with them.  Every variant keeps its
 * rare paths (first call of a thread, a retry during an update) in a
 * separate cold function (`name##__molt_slow`, today's molt__enter/leave),
 * so that the hot path needs few registers in both gcc and clang.
 *
 *   MOLT_PROTO_LEAN_FUNCTION   today's protocol, fewer instructions: the
 *       counter slot comes from the immutable g->slot field (molt__gens is
 *       a static array that is never freed, so reading g->slot before the
 *       recheck is safe) instead of (g - molt__gens) >> 6 with a GOT load,
 *       and the rare paths are out of line.  Drop-in: the runtime would
 *       not change.
 *
 *   MOLT_PROTO_HP_FUNCTION     no counter on the fast path ("the outermost
 *       call owns a hazard pointer"): a thread publishes the generation it
 *       runs in a per-thread hazard word (a plain store) and clears it when
 *       the outermost updatable call returns; a nested call that finds its
 *       generation already in the hazard word is pinned by the outer call
 *       and runs without touching memory (tail call); anything else (a
 *       nested call into a newer generation during an update) takes today's
 *       counted path.  There is no read-modify-write of a counter, so no
 *       store-to-load dependency from one call to the next.  Needs the
 *       reclaimer to read the hazard word next to the counters (a runtime
 *       change); here the word lives in libmoltproto.so (initial-exec TLS,
 *       the same access cost as molt__self), which the real reclaimer does
 *       not scan — fine for timing, not for patching.
 *
 *   MOLT_PROTO_TAIL_FUNCTION   load the generation, jump to the version (a
 *       tail call), no pinning at all: what a wrapper-based table
 *       indirection costs at the least.  Not a correct design by itself
 *       (nothing would stop the runtime from unloading a running version);
 *       it is the fast path of a design that pins with quiescent states
 *       (userspace-RCU QSBR) instead of per-call counters.
 *
 *   MOLT_PROTO_SITE_CALL       the same dispatch done at the call site (what
 *       moltcc could emit for direct calls inside the program): no wrapper
 *       frame, no pinning; &f stays the stable entry for pointers.
 *
 *   MOLT_PROTO_PTR_CALL        one global pointer per function, called from
 *       the call site (`call *f_ptr(%rip)`): the floor of any indirection
 *       (it gives up per-thread views, so policy `local` would need more).
 *
 *   proto-jmp (in bench/src/fcall_target.c, no macro): the stable entry is a
 *       single direct `jmp` to the current version, rewritten by an update
 *       (text patching at the entry, as POLUS and kpatch do): the floor of a
 *       code-patching design.
 */
#ifndef MOLT_PROTO_H
#define MOLT_PROTO_H

#include "molt.h"

/* The hazard word of the HP prototype (libmoltproto.so). */
extern __thread _Atomic(molt__gen *) molt_proto_hz
    __attribute__((tls_model("initial-exec")));

/* The cold path shared by all variants: today's entry protocol, which pins
 * with the per-thread counters that the real reclaimer scans. */
#define MOLT_PROTO__SLOW(ret, name, params, args)                              \
  static __attribute__((noinline, cold)) ret name##__molt_slow params {        \
    molt__gen *molt__g = molt__enter();                                        \
    ret molt__r =                                                              \
        ((ret(*) params)molt__g->table[name##__molt_desc.index]) args;         \
    molt__leave(molt__g);                                                      \
    return molt__r;                                                            \
  }

#define MOLT_PROTO__HEAD(ret, name, params, args)                              \
  ret name params;                                                             \
  static ret name##__molt_v0 params;                                           \
  MOLT__DESC(, name, 0);                                                       \
  MOLT_PROTO__SLOW(ret, name, params, args)

#define MOLT_PROTO__CALL(ret, name, params, args, g)                           \
  ((ret(*) params)(g)->table[name##__molt_desc.index]) args

/* LEAN: today's hazard-counter protocol (see molt__enter in molt.h). */
#define MOLT_PROTO_LEAN_FUNCTION(ret, name, params, args)                      \
  MOLT_PROTO__HEAD(ret, name, params, args)                                    \
  ret name params {                                                            \
    molt__thread *molt__t = &molt__self;                                       \
    _Atomic(molt__gen *) *molt__vp = molt__t->viewp;                           \
    if (__builtin_expect(molt__vp != NULL, 1)) {                               \
      molt__gen *molt__g = atomic_load_explicit(molt__vp, memory_order_relaxed); \
      uint32_t molt__s = molt__g->slot; /* immutable */                        \
      _Atomic uint32_t *molt__a = &molt__t->active[molt__s];                   \
      uint32_t molt__c = atomic_load_explicit(molt__a, memory_order_relaxed);  \
      atomic_store_explicit(molt__a, molt__c + 1, memory_order_relaxed);       \
      atomic_signal_fence(memory_order_seq_cst);                               \
      if (__builtin_expect(                                                    \
              atomic_load_explicit(molt__vp, memory_order_acquire) == molt__g, 1)) { \
        ret molt__r = MOLT_PROTO__CALL(ret, name, params, args, molt__g);      \
        molt__a = &molt__self.active[molt__s];                                 \
        atomic_store_explicit(                                                 \
            molt__a, atomic_load_explicit(molt__a, memory_order_relaxed) - 1,  \
            memory_order_release);                                             \
        return molt__r;                                                        \
      }                                                                        \
      atomic_store_explicit(molt__a, molt__c, memory_order_relaxed);           \
    }                                                                          \
    return name##__molt_slow args;                                             \
  }                                                                            \
  static ret name##__molt_v0 params

/* HP: the outermost call owns the per-thread hazard word. */
#define MOLT_PROTO_HP_FUNCTION(ret, name, params, args)                        \
  MOLT_PROTO__HEAD(ret, name, params, args)                                    \
  ret name params {                                                            \
    _Atomic(molt__gen *) *molt__vp = molt__self.viewp;                         \
    if (__builtin_expect(molt__vp != NULL, 1)) {                               \
      molt__gen *molt__g = atomic_load_explicit(molt__vp, memory_order_relaxed); \
      molt__gen *molt__h = atomic_load_explicit(&molt_proto_hz, memory_order_relaxed); \
      if (__builtin_expect(molt__h == NULL, 1)) {                              \
        /* relaxed store + compiler barrier + acquire recheck: the protocol   \
         * of molt__enter; the reclaimer's membarrier() is the CPU fence. */  \
        atomic_store_explicit(&molt_proto_hz, molt__g, memory_order_relaxed);  \
        atomic_signal_fence(memory_order_seq_cst);                             \
        if (__builtin_expect(                                                  \
                atomic_load_explicit(molt__vp, memory_order_acquire) == molt__g, 1)) { \
          ret molt__r = MOLT_PROTO__CALL(ret, name, params, args, molt__g);    \
          /* release: the call's accesses happen before the reclaimer sees  \
           * the word cleared. */                                            \
          atomic_store_explicit(&molt_proto_hz, NULL, memory_order_release);   \
          return molt__r;                                                      \
        }                                                                      \
        atomic_store_explicit(&molt_proto_hz, NULL, memory_order_relaxed);     \
      } else if (molt__h == molt__g) {                                         \
        /* nested in a call that published g and saw it current: pinned     \
         * until that call returns, i.e. after this one. */                  \
        return MOLT_PROTO__CALL(ret, name, params, args, molt__g);             \
      }                                                                        \
    }                                                                          \
    return name##__molt_slow args;                                             \
  }                                                                            \
  static ret name##__molt_v0 params

/* TAIL: no pinning (see above). */
#define MOLT_PROTO_TAIL_FUNCTION(ret, name, params, args)                      \
  MOLT_PROTO__HEAD(ret, name, params, args)                                    \
  ret name params {                                                            \
    _Atomic(molt__gen *) *molt__vp = molt__self.viewp;                         \
    if (__builtin_expect(molt__vp != NULL, 1))                                 \
      return MOLT_PROTO__CALL(ret, name, params, args,                         \
                              atomic_load_explicit(molt__vp, memory_order_acquire)); \
    return name##__molt_slow args;                                             \
  }                                                                            \
  static ret name##__molt_v0 params

/* SITE: `name##__molt_indexp` points at the descriptor's index (exported by
 * the defining TU in this prototype; a link-time constant in a real
 * design). */
#define MOLT_PROTO_SITE_CALL(ret, name, types, args)                           \
  ({                                                                           \
    _Atomic(molt__gen *) *molt__vp = molt__self.viewp;                         \
    __builtin_expect(molt__vp != NULL, 1)                                      \
        ? ((ret(*) types)atomic_load_explicit(molt__vp, memory_order_acquire)  \
               ->table[*name##__molt_indexp]) args                             \
        : name args;                                                           \
  })

/* PTR: one global pointer per function (see above). */
#define MOLT_PROTO_PTR_CALL(ret, name, types, args) (name##__molt_ptr) args

#endif /* MOLT_PROTO_H */
