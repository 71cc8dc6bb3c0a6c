/* The AVX-512 VNNI build's Q4_0 / Q4_1 / Q8_0 grouped 8-bit kernels (grouped8_q4.c). */
#ifndef EXO_X86_GROUPED8_Q4_H
#define EXO_X86_GROUPED8_Q4_H

#include "kinds.h"

/* activation rows from which a pass takes these kernels: below, the one-group kernels of grouped8.c
 * are faster (a row or two do not repay the re-lay of a block, and with weights streamed from memory
 * one group's single stream is read faster than two groups' two) */
#define Q4P_FROM_ROWS 4

enum { Q4P_Q4_0 = 0, Q4P_Q4_1 = 1, Q4P_Q8_0 = 2 };

/* A pass of any number of activation rows over repacked groups of a layout (Q4P_*). */
int exo_x86_grouped8_q4_pairs(const Run* r, int layout);

#endif
