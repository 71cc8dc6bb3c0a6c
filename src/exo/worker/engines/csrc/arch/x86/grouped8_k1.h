/* The single-row (decode) grouped 8-bit kernels on x86 (grouped8_k1.c). */
#ifndef EXO_X86_GROUPED8_K1_H
#define EXO_X86_GROUPED8_K1_H

#include "kinds.h"

/* activation blocks of 32 a row the single-row kernels take (their sums stay on the stack) */
#define K1_MAX_NB 2048

/* A pass of one activation row over repacked Q6_K groups; -1 (nothing done) if the pass has
 * several rows or more than K1_MAX_NB blocks. */
int exo_x86_grouped8_q6_k_one(const Run* r);

/* The same over repacked Q4_K groups; -1 (nothing done) if the pass has several rows. */
int exo_x86_grouped8_q4_k_one(const Run* r);

#endif
