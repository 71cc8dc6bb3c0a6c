/* The AVX-512 VNNI build's Q4_0 / Q4_1 grouped 8-bit kernels (grouped8_q4.c). */
#ifndef EXO_X86_GROUPED8_Q4_H
#define EXO_X86_GROUPED8_Q4_H

#include "kinds.h"

/* A pass of any number of activation rows over repacked Q4_1 (has_m) or Q4_0 groups. */
int exo_x86_grouped8_q4_pairs(const Run* r, int has_m);

#endif
