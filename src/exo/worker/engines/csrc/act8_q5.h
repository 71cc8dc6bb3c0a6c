/* issue 22 q5dots: 8-bit activation dots of Q5_0, Q5_1 and Q5_K, in act8.h's float order.
 *
 * A Q5 value is q = nibble | fifth bit << 4, 0..31, unsigned: a block's integer dot is sum q_j x_j
 * (vpmaddubsw pairs reach 2 x 31 x 127: no saturation; vpdpbusd exact), then
 *     Q5_0: acc = acc + (d d_x) i;  acc = acc + (-16 d) s_x
 *     Q5_1: acc = acc + (d d_x) i;  acc = acc + m s_x
 *     Q5_K: sub-block j of a super-block as Q4_K's: d_w = d sc_j, m_w = -(dmin m_j) (floats).
 * The generic dots (act8_q5.c) and the x86 ones (arch/x86/dot8_q5.c: the file's rows 8 at a
 * time, a lane per row, the rows left one by one; arch/x86/grouped8_q5.c: Q5_0's and Q5_1's repacked
 * groups, a lane per row; arch/x86/grouped8_q5k.c: Q5_K's; act8_q5.c's generic groups: issue 22 q5g) compute exactly this, so a row's result is the same in every build,
 * strategy and row count.
 */
#ifndef EXO_ACT8_Q5_H
#define EXO_ACT8_Q5_H

#include "act8.h"

static inline float q5_0_min(const BlockQ5_0* b) { return -16.0f * exo_h2f(b->d); }

static inline uint32_t q5_bits(const uint8_t qh[4]) {
    uint32_t h;
    memcpy(&h, qh, sizeof h);
    return h;
}

/* The integer dot of a Q5_0 / Q5_1 block's 32 values (qh's bit j: value j's fifth bit; byte j of
 * qs: values j, j + 16) with x's. */
static inline int32_t q5_isum8(const uint8_t qh[4], const uint8_t qs[16], const int8_t* x) {
    const uint32_t h = q5_bits(qh);
    int32_t s = 0;
    for (int j = 0; j < 16; j++) {
        const int lo = (qs[j] & 15) | (int)(((h >> j) & 1u) << 4);
        const int hi = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1u) << 4);
        s += lo * x[j] + hi * x[j + 16];
    }
    return s;
}

/* Sub-block j's scale and offset of a Q5_K super-block (its 12 packed scale bytes). */
static inline void q5k_sub(const uint8_t* packed, uint16_t d, uint16_t dmin, int j, float* d_w, float* m_w) {
    int sc, mn;
    q4k_scale_min(packed, j, &sc, &mn);
    *d_w = exo_h2f(d) * (float)sc;
    *m_w = -(exo_h2f(dmin) * (float)mn);
}

/* The integer dot of sub-block j (0..7) of a Q5_K super-block with x's 32 values. */
static inline int32_t q5k_isum8(const BlockQ5K* w, int j, const int8_t* x) {
    const uint8_t* ql = w->qs + 32 * (j / 2);
    int32_t s = 0;
    for (int l = 0; l < 32; l++) {
        const int q = ((j & 1 ? ql[l] >> 4 : ql[l]) & 15) | (((w->qh[l] >> j) & 1) << 4);
        s += q * x[l];
    }
    return s;
}

#endif
