/* The K-quant grouped 8-bit kernels on x86 with their own files: Q6_K (grouped8_q6k.c, every x86
 * build) and Q4_K (grouped8_q4k.c, the AVX-512 VNNI build). */
#ifndef EXO_X86_GROUPED8_KQ_H
#define EXO_X86_GROUPED8_KQ_H

#include "kinds.h"

/* A pass of any number of activation rows over repacked Q4_K groups (the AVX-512 VNNI build only). */
int exo_x86_grouped8_q4_k_rows(const Run* r);

/* A pass of any number of activation rows over repacked Q6_K groups (grouped8_q6k.c); -1 (nothing
 * done) out of memory (the rows, re-laid, are on the heap). */
int exo_x86_grouped8_q6_k_rows(const Run* r);

#endif
