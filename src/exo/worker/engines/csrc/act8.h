/* 8-bit activations (ACT_X8, BlockX8): the float order every build and strategy shares.
 *
 * A weight row's dot with an activation row: per block b, the integer dot isum = sum q_w q_x
 * (exact: int32), then v = (d_w d_x) isum + m_w s_x (Q4_0: m_w = -8 d_w), four float operations in
 * that order, none fused; v goes into lane b % 8 of eight accumulators (blocks past the row's end
 * add 0); the lanes are summed as exo_hsum8 does: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
 * The AVX2 kernels (arch/x86/dot8.c) keep the lanes in one register; the generic ones
 * (act8.c) in an array. The files that hold these kernels are built without contraction of
 * multiply-adds (fp-contract off), so the same floats come out of every build.
 */
#ifndef EXO_ACT8_H
#define EXO_ACT8_H

#include "kinds.h"

/* The file blocks' scale and offset (Q4_0: w = d q - 8 d; Q4_1: w = d q + m). */
static inline float q4_0_min(const BlockQ4_0* b) { return -8.0f * exo_h2f(b->d); }
static inline float q4_1_min(const BlockQ4_1* b) { return exo_h2f(b->m); }

#endif
