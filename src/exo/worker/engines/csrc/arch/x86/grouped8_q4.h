/* The AVX-512 VNNI build's Q4_0 / Q4_1 / Q8_0 grouped 8-bit kernels (grouped8_q4.c). */
#ifndef EXO_X86_GROUPED8_Q4_H
#define EXO_X86_GROUPED8_Q4_H

#include "kinds.h"

enum { Q4P_Q4_0 = 0, Q4P_Q4_1 = 1, Q4P_Q8_0 = 2 };

/* A pass of any number of activation rows over repacked groups of a layout (Q4P_*). */
int exo_x86_grouped8_q4_pairs(const Run* r, int layout);

#endif
