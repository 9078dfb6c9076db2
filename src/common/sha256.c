/* SHA-256 (FIPS 180-4), for the identity of a loaded file: `molt status`
 * and `molt log` show the digest of the sealed copy the runtime loaded, so
 * an operator can compare it with `sha256sum` of the file they meant; and
 * for the patch digest (elf.c) checked before a patch is trusted.
 * Small and allocation-free: it runs inside the host.
 *
 * An apply hashes the patch twice on the runtime thread (the copy's
 * identity, and the digest with its own bytes read as zeros: different
 * bytes, so one cannot stand in for the other), and the portable
 * compression function was about 2/3 of the runtime thread's instructions
 * per apply (issue 14).  Where the CPU has the SHA extensions (Intel
 * SHA-NI, AMD Zen), blocks go through them instead: the same function,
 * several times fewer cycles.  Which one runs is decided per call from
 * CPUID (the result cached); both give the same digest, which the
 * sha256 test checks on every length and split it tries. */
#include "common/common.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SHA_NI_PATH 1
#include <cpuid.h>
#include <immintrin.h>
#endif

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/* The portable compression function, one 64-byte block into h. */
static void block_portable(uint32_t hs[8], const unsigned char *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
           (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = hs[0], b = hs[1], c = hs[2], d = hs[3], e = hs[4], f = hs[5], g = hs[6],
           h = hs[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 =
        h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
    uint32_t t2 =
        (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  hs[0] += a;
  hs[1] += b;
  hs[2] += c;
  hs[3] += d;
  hs[4] += e;
  hs[5] += f;
  hs[6] += g;
  hs[7] += h;
}

#ifdef HAVE_SHA_NI_PATH
/* The same compression function with the SHA extensions, n blocks.
 *
 * sha256rnds2 does two rounds on a state split in two registers, lanes
 * from high to low: {A, B, E, F} and {C, D, G, H}; its third operand's low
 * two lanes are W[t] + K[t] for the two rounds.  It returns the new
 * {A, B, E, F}, and the old one is then the new {C, D, G, H}: four words
 * of W + K are two calls, the roles of the registers swapping after each.
 * The message schedule for W[16..63] four words at a time: sha256msg1
 * adds sigma0 of the next word to each of W[t-16..t-13], W[t-7..t-4] is
 * added by hand (alignr of the two groups that hold it), and sha256msg2
 * adds sigma1 of W[t-2] and W[t-1], including the two it just made. */
__attribute__((target("sha,sse4.1,ssse3"))) static void
blocks_sha_ni(uint32_t hs[8], const unsigned char *p, size_t n) {
  /* Big-endian words: reverse the bytes within each 32-bit lane. */
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  /* h[0..3] = {D, C, B, A} and h[4..7] = {H, G, F, E} (high to low) into
   * {A, B, E, F} and {C, D, G, H}. */
  __m128i abcd = _mm_loadu_si128((const __m128i *)&hs[0]);
  __m128i efgh = _mm_loadu_si128((const __m128i *)&hs[4]);
  __m128i badc = _mm_shuffle_epi32(abcd, 0xB1); /* {C, D, A, B} */
  __m128i hgfe = _mm_shuffle_epi32(efgh, 0x1B); /* {E, F, G, H} */
  __m128i abef = _mm_alignr_epi8(badc, hgfe, 8);
  __m128i cdgh = _mm_blend_epi16(hgfe, badc, 0xF0);
  for (; n > 0; n--, p += 64) {
    const __m128i abef0 = abef, cdgh0 = cdgh;
    __m128i m[4];
    for (int g = 0; g < 16; g++) {
      __m128i *cur = &m[g & 3];
      if (g < 4) {
        *cur = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * g)), bswap);
      } else {
        /* cur holds W[t-16..t-13]; the next slots W[t-12..], W[t-8..],
         * W[t-4..t-1]. */
        const __m128i w12 = m[(g + 1) & 3], w8 = m[(g + 2) & 3], w4 = m[(g + 3) & 3];
        __m128i t = _mm_sha256msg1_epu32(*cur, w12);
        t = _mm_add_epi32(t, _mm_alignr_epi8(w4, w8, 4)); /* + W[t-7..t-4] */
        *cur = _mm_sha256msg2_epu32(t, w4);
      }
      __m128i wk = _mm_add_epi32(*cur, _mm_loadu_si128((const __m128i *)&K[4 * g]));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk); /* new ABEF */
      abef =
          _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E)); /* and again */
    }
    abef = _mm_add_epi32(abef, abef0);
    cdgh = _mm_add_epi32(cdgh, cdgh0);
  }
  /* Back to h[0..7] = {D, C, B, A} and {H, G, F, E}. */
  __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  _mm_storeu_si128((__m128i *)&hs[0], _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128((__m128i *)&hs[4], _mm_alignr_epi8(dchg, feba, 8));
}

/* 1: the CPU has SHA, SSE4.1 and SSSE3; 0: it has not; -1: not asked yet.
 * Relaxed: every thread that asks computes the same answer, so a race only
 * repeats the question. */
static _Atomic int sha_ni_state = -1;
/* Tests: compare the two paths (molt__sha256_portable_only). */
static _Atomic bool portable_only;

static bool cpu_has_sha_ni(void) {
  int st = atomic_load_explicit(&sha_ni_state, memory_order_relaxed);
  if (st < 0) {
    unsigned a, b, c, d;
    bool sse = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSE4_1) && (c & bit_SSSE3);
    bool sha = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA);
    st = sse && sha;
    atomic_store_explicit(&sha_ni_state, st, memory_order_relaxed);
  }
  return st == 1;
}

static bool use_sha_ni(void) {
  /* Relaxed: a test switch, set before the hashing it is about. */
  return !atomic_load_explicit(&portable_only, memory_order_relaxed) && cpu_has_sha_ni();
}
#endif

/* n whole blocks into h. */
static void blocks(uint32_t hs[8], const unsigned char *p, size_t n) {
#ifdef HAVE_SHA_NI_PATH
  if (use_sha_ni()) {
    blocks_sha_ni(hs, p, n);
    return;
  }
#endif
  for (; n > 0; n--, p += 64)
    block_portable(hs, p);
}

bool molt__sha256_portable_only(bool on) {
#ifdef HAVE_SHA_NI_PATH
  atomic_store_explicit(&portable_only, on, memory_order_relaxed);
  return cpu_has_sha_ni();
#else
  (void)on;
  return false;
#endif
}

void molt__sha256_init(molt__sha256 *s) {
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, iv, sizeof iv);
  s->len = 0;
  s->used = 0;
}

void molt__sha256_add(molt__sha256 *s, const void *data, size_t n) {
  const unsigned char *p = data;
  s->len += n;
  if (s->used > 0) { /* complete the buffered block first */
    size_t k = 64 - s->used < n ? 64 - s->used : n;
    memcpy(s->buf + s->used, p, k);
    s->used += k;
    p += k;
    n -= k;
    if (s->used < 64)
      return;
    blocks(s->h, s->buf, 1);
    s->used = 0;
  }
  /* Whole blocks straight from the caller's data. */
  if (n >= 64)
    blocks(s->h, p, n / 64);
  p += n / 64 * 64;
  n %= 64;
  memcpy(s->buf, p, n);
  s->used = n;
}

void molt__sha256_final(molt__sha256 *s, unsigned char out[32]) {
  uint64_t bits = s->len * 8;
  unsigned char pad = 0x80;
  molt__sha256_add(s, &pad, 1);
  pad = 0;
  while (s->used != 56)
    molt__sha256_add(s, &pad, 1);
  unsigned char len[8];
  for (int i = 0; i < 8; i++)
    len[i] = (unsigned char)(bits >> (56 - 8 * i));
  molt__sha256_add(s, len, 8);
  for (int i = 0; i < 32; i++)
    out[i] = (unsigned char)(s->h[i / 4] >> (24 - 8 * (i % 4)));
}

void molt__sha256_hex(molt__sha256 *s, char hex[65]) {
  unsigned char d[32];
  molt__sha256_final(s, d);
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    hex[2 * i] = digits[d[i] >> 4];
    hex[2 * i + 1] = digits[d[i] & 15];
  }
  hex[64] = '\0';
}
