/* Helpers the AVX2 kernels share (arch/x86/: compiled where EXO_AVX2). */
#ifndef EXO_X86_H
#define EXO_X86_H

#include "exo_kernels.h"

/* acc + a_2i b_2i + a_2i+1 b_2i+1 per int32 lane (int16 a, b): one vpdpwssd in the VNNI builds,
 * else vpmaddwd and vpaddd. The same integers either way (neither saturates), so every x86 build
 * gives the same results. */
static inline __attribute__((always_inline)) __m256i dp16(__m256i acc, __m256i a, __m256i b) {
#if EXO_AVX512VNNI
    return _mm256_dpwssd_epi32(acc, a, b);
#elif EXO_AVXVNNI
    return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* sum_j a_j b_j of 32 int16 pairs, as 8 int32 lanes */
static inline __m256i madd32(__m256i a0, __m256i a1, const int16_t* b) {
    return dp16(_mm256_madd_epi16(a0, _mm256_loadu_si256((const __m256i*)b)), a1,
                _mm256_loadu_si256((const __m256i*)(b + 16)));
}

#endif
