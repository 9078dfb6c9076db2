/*
 * The `jmp rel32` of x86-64 (part of the common layer): reading and
 * retargeting the jump that is the whole body of a stable entry
 * (MOLT__ENTRY_STUB in molt/abi.h), and the 8-byte loads and stores that
 * rewrite it in place.  Everything architecture-specific about entries is
 * here; the runtime's entry table (src/runtime/core/entry.c) decides when
 * an entry jumps where.
 */
#ifndef MOLT_ARCH_X86_64_JUMP_H
#define MOLT_ARCH_X86_64_JUMP_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if !defined(__x86_64__)
#error "molt's entries are implemented for x86-64 only"
#endif

#define MOLT__JMP_OPCODE 0xe9
#define MOLT__JMP_LEN 5

/* Where the jump at `at` leads, or NULL if `at` does not hold a jmp rel32. */
static inline const uint8_t *molt__jmp_target(const uint8_t *at) {
  if (at[0] != MOLT__JMP_OPCODE)
    return NULL;
  int32_t d;
  memcpy(&d, at + 1, sizeof d);
  return at + MOLT__JMP_LEN + d;
}

/* The instruction can be rewritten with one aligned 8-byte store: its
 * displacement lies inside the aligned word that holds its first byte. */
static inline bool molt__jmp_in_one_word(const void *at) {
  return (uintptr_t)at % 8 <= 8 - MOLT__JMP_LEN;
}

/* -fcf-protection puts `endbr64` (f3 0f 1e fa) where the jump should be. */
static inline bool molt__is_endbr64(const uint8_t *at) {
  return at[0] == 0xf3 && at[1] == 0x0f && at[2] == 0x1e && at[3] == 0xfa;
}

/* One aligned 8-byte `mov`, which x86-64 performs as a single access.
 * Written in asm rather than as a C atomic because the word is code:
 * ThreadSanitizer keeps no shadow memory for text and faults on an
 * instrumented access to it.  No memory order is needed for the store
 * itself: the caller is the only writer of entries, and what orders the new
 * instruction before later calls of other threads is the core-serializing
 * membarrier the caller issues after its batch of stores. */
static inline uint64_t molt__code_load_word(const uint64_t *p) {
  uint64_t v;
  __asm__ volatile("movq %1, %0" : "=r"(v) : "m"(*p));
  return v;
}

static inline void molt__code_store_word(uint64_t *p, uint64_t v) {
  __asm__ volatile("movq %1, %0" : "=m"(*p) : "r"(v) : "memory");
}

/* Points the jump at `at` (molt__jmp_in_one_word) to `target`.  Only the
 * displacement changes; the opcode and the other bytes of the word are
 * stored back as they are, so instruction fetch on another CPU sees the old
 * or the new jump, never a mix.  The page must be writable. */
static inline void molt__jmp_retarget(uint8_t *at, const void *target) {
  uintptr_t word = (uintptr_t)at & ~(uintptr_t)7;
  unsigned off = (unsigned)((uintptr_t)at - word);
  int32_t rel = (int32_t)((intptr_t)target - (intptr_t)(at + MOLT__JMP_LEN));
  uint64_t v = molt__code_load_word((const uint64_t *)word);
  uint8_t bytes[8];
  memcpy(bytes, &v, 8);
  memcpy(bytes + off + 1, &rel, 4);
  memcpy(&v, bytes, 8);
  molt__code_store_word((uint64_t *)word, v);
}

#endif /* MOLT_ARCH_X86_64_JUMP_H */
