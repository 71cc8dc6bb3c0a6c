/* The K-quant grouped 8-bit kernels on x86 with their own files: Q6_K (grouped8_q6k.c, every x86
 * build) and Q4_K (grouped8_q4k.c, the AVX-512 VNNI build), and the Q4_K super-block helpers they
 * share with grouped8.c's. */
#ifndef EXO_X86_GROUPED8_KQ_H
#define EXO_X86_GROUPED8_KQ_H

#include <stddef.h>

#include "act8.h"
#include "arch/x86/x86.h"
#include "kinds.h"

/* The 8 rows' scales (sc[8 j + c]) and offsets (mn[8 j + c]) of sub-blocks j = 0..7 of a Q4_K group's
 * super-block, from its 12 x 8 packed bytes (q4k_scale_min's fields), all at once. */
static inline __attribute__((always_inline)) void q4k8_unpack(const uint8_t* blk, uint8_t sc[64], uint8_t mn[64]) {
    const uint8_t* p = blk + offsetof(BlockQ4Kx8, scales);
    const __m256i a = _mm256_loadu_si256((const __m256i*)p), b = _mm256_loadu_si256((const __m256i*)(p + 32));
    const __m256i c = _mm256_loadu_si256((const __m256i*)(p + 64));
    const __m256i six = _mm256_set1_epi8(63), four = _mm256_set1_epi8(15), top = _mm256_set1_epi8(48);
    _mm256_storeu_si256((__m256i*)sc, _mm256_and_si256(a, six));
    _mm256_storeu_si256((__m256i*)mn, _mm256_and_si256(b, six));
    _mm256_storeu_si256((__m256i*)(sc + 32),
                        _mm256_or_si256(_mm256_and_si256(c, four), _mm256_and_si256(_mm256_srli_epi16(a, 2), top)));
    _mm256_storeu_si256((__m256i*)(mn + 32), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), four),
                                                              _mm256_and_si256(_mm256_srli_epi16(b, 2), top)));
}

/* Sub-block j's d sc and dmin mn (q4k_sub's floats; sc, mn: its 8 rows' bytes, q4k8_unpack's). */
static inline __attribute__((always_inline)) void q4k8_scale(__m256 d, __m256 dmin, const uint8_t* sc,
                                                             const uint8_t* mn, __m256* dsc, __m256* dm) {
    *dsc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)sc))));
    *dm = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)mn))));
}

/* acc + (d sc) xd isum - (dmin mn) xs: a sub-block's step (act8.h; minus dm s is plus -(dm) s). */
static inline __attribute__((always_inline)) __m256 q4k8_step(__m256 acc, __m256 dsc, __m256 dm, const BlockX8* xb,
                                                              __m256i isum) {
    const __m256 t = _mm256_mul_ps(dsc, _mm256_set1_ps(xb->d));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(t, _mm256_cvtepi32_ps(isum)));
    return _mm256_sub_ps(acc, _mm256_mul_ps(dm, _mm256_set1_ps(xb->s)));
}

/* The super-block's d and dmin (its 8 rows' each) as floats. */
static inline __attribute__((always_inline)) void q4k8_d(const uint8_t* blk, __m256* d, __m256* dmin) {
    *d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
    *dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ4Kx8, dmin))));
}

/* acc after the steps of sub-blocks 2p and 2p + 1 (integer dots i0, i1; their activation blocks
 * xb[0], xb[1]), one activation row's. */
static inline __attribute__((always_inline)) __m256 q4k8_pair(__m256 acc, __m256 d, __m256 dmin, const uint8_t* sc,
                                                              const uint8_t* mn, int p, const BlockX8* xb, __m256i i0,
                                                              __m256i i1) {
    __m256 dsc0, dm0, dsc1, dm1;
    q4k8_scale(d, dmin, sc + 16 * p, mn + 16 * p, &dsc0, &dm0);
    q4k8_scale(d, dmin, sc + 16 * p + 8, mn + 16 * p + 8, &dsc1, &dm1);
    return q4k8_step(q4k8_step(acc, dsc0, dm0, xb, i0), dsc1, dm1, xb + 1, i1);
}

/* A pass of any number of activation rows over repacked Q4_K groups (the AVX-512 VNNI build only). */
int exo_x86_grouped8_q4_k_rows(const Run* r);

/* A pass of any number of activation rows over repacked Q6_K groups (grouped8_q6k.c); -1 (nothing
 * done) out of memory (the rows, re-laid, are on the heap). */
int exo_x86_grouped8_q6_k_rows(const Run* r);

#endif
