/* Helpers the AVX2 kernels share (arch/x86/: compiled where EXO_AVX2). */
#ifndef EXO_X86_H
#define EXO_X86_H

#include <string.h>

#include "exo_kernels.h"

/* Ask for the cache lines of the `bytes` bytes at address `at`, which may lie past the buffer a
 * pass reads (the block after its last one): an address computed as an integer, since C forms no
 * pointer past an object's end, and a prefetch never faults. */
static inline __attribute__((always_inline)) void x86_prefetch_at(uintptr_t at, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) _mm_prefetch((const char*)(at + off), _MM_HINT_T0);
}

/* Ask for the cache lines of the `bytes` bytes X86_AHEAD bytes past `at`, where a kernel streaming
 * its weights in order reads a few blocks later (the plain AVX2 build; nothing on the VNNI builds:
 * on a Zen 4 core asking for one row's next block gained nothing, and no machine here has measured
 * them further ahead). On a Zen 3
 * core (this build's machine) they did not: a pass reading its weights once, from memory, ran at
 * ~14 GB/s a core where a plain read of the same bytes runs at ~19. Asking 4 KB ahead took the
 * 1B-shaped file's gate | up at one activation row from 1,370-1,576 to 1,035-1,283 us a call in
 * Q4_K and Q4_0 (2 KB: 1,059-1,116; 8 KB and more: slower again), in Q8_0 from 2,322 to 1,649, and
 * 3-13% off the passes of 4 and 8 rows; at two threads as much (alternating in one process, weights
 * not in cache). Q6_K's decode asks for its own super-block instead (grouped8_q6k.c): asking ahead
 * gained nothing there. */
#define X86_AHEAD 4096
static inline __attribute__((always_inline)) void x86_ahead(const uint8_t* at, size_t bytes) {
#if EXO_AVX512VNNI || EXO_AVXVNNI
    (void)at;
    (void)bytes;
#else
    x86_prefetch_at((uintptr_t)at + X86_AHEAD, bytes);
#endif
}

/* acc + a_2i b_2i + a_2i+1 b_2i+1 per int32 lane (int16 a, b): one vpdpwssd in the VNNI builds,
 * else vpmaddwd and vpaddd. The same integers either way (neither saturates), so every x86 build
 * gives the same results. */
static inline __attribute__((always_inline)) __m256i dp16(__m256i acc, __m256i a, __m256i b) {
#if EXO_AVX512VNNI || EXO_AVXVNNI
    return X86_VNNI_DPWSSD(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* sum_j a_j b_j of 32 int16 pairs, as 8 int32 lanes */
static inline __m256i madd32(__m256i a0, __m256i a1, const int16_t* b) {
    return dp16(_mm256_madd_epi16(a0, _mm256_loadu_si256((const __m256i*)b)), a1,
                _mm256_loadu_si256((const __m256i*)(b + 16)));
}

/* acc + the 4 products of unsigned bytes a and signed bytes b per int32 lane: one vpdpbusd on the
 * VNNI builds, else vpmaddubsw (its int16 pair sums must not saturate: the caller's bound) and
 * vpmaddwd. The same integers on every build. */
static inline __attribute__((always_inline)) __m256i x86_dpbusd(__m256i acc, __m256i a, __m256i b) {
#if EXO_AVX512VNNI || EXO_AVXVNNI
    return X86_VNNI_DPBUSD(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
#endif
}

/* 8 int32 lanes summing to sum_j w_j x_j (unsigned w, signed x), from zero */
static inline __attribute__((always_inline)) __m256i x86_dot_u8s8(__m256i w, __m256i x) {
    return x86_dpbusd(_mm256_setzero_si256(), w, x);
}

/* Row c's bytes 4k .. 4k + 3 of a repacked 8-row chunk (row c's pairs of bytes at 2c of each 16)
 * in int32 lane c, from the 32 bytes at 32 k: their 8-byte quarters Q0 Q1 Q2 Q3 (Q0: the first 16's
 * rows 0-3, Q1 its rows 4-7, Q2 / Q3 the second 16's) must meet as Q0, Q2 in the low 128-bit lane
 * and Q1, Q3 in the high one, then a vpshufb interleaves each row's pairs.
 *
 * The VNNI builds move the quarters by vpermq. The plain AVX2 build (Zen 3) does it without a
 * cross-lane shuffle, which there costs 2 cycles of its one pipe a quad from memory (vpermq ymm, m256:
 * ~2.0 cycles each back to back, against 0.5 for a vpshufb): a 32-byte load from 8 bytes before
 * the quad (Q-1 Q0 | Q1 Q2) and the quad's second 16 bytes loaded into both lanes (Q2 Q3 | Q2 Q3)
 * give, by one vpblendd, Q2 Q0 | Q1 Q3, and the vpshufb's order is per lane. The same bytes in the
 * same lanes, so the same integers. It reads the 8 bytes before the quad: every chunk a kernel
 * passes lies at least that far into its block (after the block's scales), never at the start of
 * a buffer. 8 activation rows a pass over SmolLM2's Q4_1 groups (in cache, a Zen 3 core): 83 ->
 * 76 cycles a block. */
static inline __attribute__((always_inline)) __m256i x86_row_quad(const uint8_t* chunk, int k) {
#if EXO_AVX512VNNI || EXO_AVXVNNI
    const __m256i v = _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i*)(chunk + 32 * k)), 0xD8);
    const __m256i order = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15, 0, 1, 8, 9, 2, 3,
                                           10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
#else
    const __m256i before = _mm256_loadu_si256((const __m256i*)(chunk + 32 * k - 8));
    const __m256i second = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(chunk + 32 * k + 16)));
    const __m256i v = _mm256_blend_epi32(before, second, 0xC3);
    const __m256i order = _mm256_setr_epi8(8, 9, 0, 1, 10, 11, 2, 3, 12, 13, 4, 5, 14, 15, 6, 7, 0, 1, 8, 9, 2, 3,
                                           10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
#endif
    return _mm256_shuffle_epi8(v, order);
}

/* The 4 activation bytes at x in every int32 lane. */
static inline __attribute__((always_inline)) __m256i x86_bcast4(const int8_t* x) {
    int32_t v;
    memcpy(&v, x, sizeof v);
    return _mm256_set1_epi32(v);
}

#if EXO_AVX512VNNI
/* 64 bytes at 64 k of a repacked 8-row chunk, re-laid for 8-byte activation broadcasts: row c's
 * bytes 8k .. 8k + 3 in int32 lane 2c, 8k + 4 .. 8k + 7 in lane 2c + 1 (vpermd gathers row pair
 * c / 2's four 2-byte pieces into one 128-bit lane, vpshufb orders them). */
static inline __attribute__((always_inline)) __m512i x86_row_pair512(const uint8_t* chunk, int k) {
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i order = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
    return _mm512_shuffle_epi8(_mm512_permutexvar_epi32(idx, _mm512_loadu_si512((const void*)(chunk + 64 * k))), order);
}

/* The 8 activation bytes at x in every int64 lane. */
static inline __attribute__((always_inline)) __m512i x86_bcast8_512(const int8_t* x) {
    int64_t v;
    memcpy(&v, x, sizeof v);
    return _mm512_set1_epi64(v);
}
#endif

#endif
