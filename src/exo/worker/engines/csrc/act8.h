/* 8-bit activations (ACT_X8, BlockX8): the float order every build and strategy shares.
 *
 * A weight row's dot with an activation row, block by block (b = 0, 1, ...): the block's integer
 * dot i_b = sum_j q_j x_j (q: the weight's stored integers, unsigned nibbles for Q4_0 / Q4_1, int8
 * for Q8_0; exact in int32: what vpmaddubsw + vpmaddwd or vpdpbusd sum), then
 *     acc = acc + (d_w d_x) (float)i_b     (t = d_w d_x first; a multiply, then an add)
 *     acc = acc + m_w s_x                  (Q4_1: m_w = m; Q4_0: m_w = -8 d_w; Q8_0: no such step)
 * Q4_K runs its super-blocks as 8 such blocks (BlockX8s of 32 values, no 256-value activation
 * format): sub-block j's d_w = d sc_j and m_w = -(dmin m_j), in floats. Q6_K's blocks of 32 take
 * two steps without offset, one per 16-value half h (its q - 32 signed): d_w = d sc_h.
 * from acc = 0, never fused (the files are built with fp-contract off). The per-row dots (act8.c,
 * arch/x86/dot8.c) and the grouped ones (grouped8.c, arch/x86/grouped8.c: a lane per weight row)
 * do exactly this, so a row's result is the same in every build, strategy and row count.
 */
#ifndef EXO_ACT8_H
#define EXO_ACT8_H

#include "kinds.h"
#include "quants.h"

/* Every file that includes this one computes the order above without contraction. */
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

/* The file blocks' scale and offset (Q4_0: w = d q - 8 d; Q4_1: w = d q + m). */
static inline float q4_0_min(const BlockQ4_0* b) { return -8.0f * exo_h2f(b->d); }
static inline float q4_1_min(const BlockQ4_1* b) { return exo_h2f(b->m); }

/* One block's step of the order above (scalar: the generic kernels). */
static inline float act8_step(float acc, float d_w, float m_w, const BlockX8* x, int32_t isum) {
    const float t = d_w * x->d;
    acc = acc + t * (float)isum;
    return acc + m_w * x->s;
}

/* The step of a kind without an offset (Q8_0). */
static inline float act8_step0(float acc, float d_w, const BlockX8* x, int32_t isum) {
    const float t = d_w * x->d;
    return acc + t * (float)isum;
}

/* The integer dot of a Q8_0 block's 32 values with x's. */
static inline int32_t q8_isum8(const int8_t* qs, const int8_t* x) {
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += qs[j] * x[j];
    return s;
}

/* Sub-block j's scale and offset of a Q4_K super-block (packed: its 12 scale bytes). */
static inline void q4k_sub(const uint8_t* packed, uint16_t d, uint16_t dmin, int j, float* d_w, float* m_w) {
    int sc, mn;
    q4k_scale_min(packed, j, &sc, &mn);
    *d_w = exo_h2f(d) * (float)sc;
    *m_w = -(exo_h2f(dmin) * (float)mn);
}

/* Value l (0..31) of 32-value group g (0..7) of a Q6_K super-block, q - 32. */
static inline int q6k_value(const BlockQ6K* w, int g, int l) {
    const int n = g / 4, k = g % 4;
    const uint8_t lb = w->ql[64 * n + 32 * (k & 1) + l];
    return ((k >= 2 ? lb >> 4 : lb & 15) | (((w->qh[32 * n + l] >> (2 * k)) & 3) << 4)) - 32;
}

/* The integer dot of 32 nibbles (the low ones of 32 bytes, or the high ones) with x's values. */
static inline int32_t nibbles_isum8(const uint8_t* q, int high, const int8_t* x) {
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (high ? q[j] >> 4 : q[j] & 15) * x[j];
    return s;
}

/* The integer dot of a Q4 block's 16 nibble bytes (byte j: values j, j + 16) with x's 32 values. */
static inline int32_t q4_isum8(const uint8_t* qs, const int8_t* x) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++) s += (qs[j] & 15) * x[j] + (qs[j] >> 4) * x[j + 16];
    return s;
}

#endif
