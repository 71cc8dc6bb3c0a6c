/* Helpers the AVX2 kernels share (arch/x86/: compiled where EXO_AVX2). */
#ifndef EXO_X86_H
#define EXO_X86_H

#include "exo_kernels.h"

/* sum_j a_j b_j of 32 int16 pairs, as 8 int32 lanes */
static inline __m256i madd32(__m256i a0, __m256i a1, const int16_t* b) {
    return _mm256_add_epi32(_mm256_madd_epi16(a0, _mm256_loadu_si256((const __m256i*)b)),
                            _mm256_madd_epi16(a1, _mm256_loadu_si256((const __m256i*)(b + 16))));
}

#endif
