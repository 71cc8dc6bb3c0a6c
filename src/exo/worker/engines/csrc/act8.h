/* 8-bit activations (ACT_X8, BlockX8): the float order every build and strategy shares.
 *
 * A weight row's dot with an activation row: per block b, eight int32 partial sums p_l (lane l:
 * the products of values 4l .. 4l + 3, exact; what vpmaddubsw + vpmaddwd and vpdpbusd give), then
 * t = d_w d_x and acc_l = acc_l + t p_l (a multiply, then an add: never fused); and, block by
 * block, c = c + m_w s_x (Q4_0: m_w = -8 d_w). The result: the lanes summed as exo_hsum8 does,
 * ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), plus c. The AVX2 kernels
 * (arch/x86/dot8.c) keep the lanes in one register, the generic ones (act8.c) in an array; both
 * files are built without contraction of multiply-adds (fp-contract off), so every build and
 * strategy gives the same floats.
 */
#ifndef EXO_ACT8_H
#define EXO_ACT8_H

#include "kinds.h"

/* The file blocks' scale and offset (Q4_0: w = d q - 8 d; Q4_1: w = d q + m). */
static inline float q4_0_min(const BlockQ4_0* b) { return -8.0f * exo_h2f(b->d); }
static inline float q4_1_min(const BlockQ4_1* b) { return exo_h2f(b->m); }

#endif
