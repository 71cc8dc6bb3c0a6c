/* The Q6_K (grouped8_k1.c: one row on AVX-512 VNNI; grouped8_q6k.c: the rest) and AVX-512 Q4_K
 * (grouped8_q4k.c) grouped 8-bit kernels on x86. */
#ifndef EXO_X86_GROUPED8_K1_H
#define EXO_X86_GROUPED8_K1_H

#include "kinds.h"

/* activation blocks of 32 a row the single-row kernels take (their sums stay on the stack) */
#define K1_MAX_NB 2048

/* A pass of one activation row over repacked Q6_K groups (the AVX-512 VNNI build only); -1 (nothing
 * done) if the pass has several rows or more than K1_MAX_NB blocks. */
int exo_x86_grouped8_q6_k_one(const Run* r);

/* A pass of any number of activation rows over repacked Q4_K groups (the AVX-512 VNNI build only). */
int exo_x86_grouped8_q4_k_rows(const Run* r);

/* A pass of any number of activation rows over repacked Q6_K groups (grouped8_q6k.c); -1 (nothing
 * done) out of memory (the rows, re-laid, are on the heap). */
int exo_x86_grouped8_q6_k_rows(const Run* r);

#endif
