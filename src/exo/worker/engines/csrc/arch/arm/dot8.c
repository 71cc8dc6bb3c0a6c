/* NEON + dotprod dots of 4-bit weights (Q4_0, Q4_1) with 8-bit activations (ACT_X8, BlockX8; the
 * other file layouts: dot8_k.c, the repacked groups: grouped8.c):
 * per block two sdot (vdotq_s32) give the block's integer dot i_b exactly (int32 lanes summed),
 * then act8.h's float order, the generic dots' (act8.c): acc = acc + (d_w d_x) i_b, then
 * acc = acc + m_w s_x, block by block. Built without contracted multiply-adds, so the results are
 * the portable build's bit for bit. Speed: not measured (no ARM machine here; qemu runs it). */
#include "act8.h"
#include "arch/arm/arm.h"

#if EXO_NEON_DOTPROD

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

/* One weight row of nb Q4 blocks (Q4_1 if `has_m`, else Q4_0) against one activation row. */
static inline __attribute__((always_inline)) float row_dot8(const uint8_t* w, const BlockX8* x, int nb, int has_m) {
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        float d, m;
        const uint8_t* qs;
        if (has_m) {
            const BlockQ4_1* wb = (const BlockQ4_1*)w + b;
            d = exo_h2f(wb->d), m = q4_1_min(wb), qs = wb->qs;
        } else {
            const BlockQ4_0* wb = (const BlockQ4_0*)w + b;
            d = exo_h2f(wb->d), m = q4_0_min(wb), qs = wb->qs;
        }
        const uint8x16_t v = vld1q_u8(qs);
        int32x4_t lanes = vdotq_s32(vdupq_n_s32(0), arm_low_nibbles(v), vld1q_s8(x[b].qs));
        lanes = vdotq_s32(lanes, arm_high_nibbles(v), vld1q_s8(x[b].qs + 16));
        acc = act8_step(acc, d, m, x + b, vaddvq_s32(lanes));
    }
    return acc;
}

static inline __attribute__((always_inline)) int run_dot8(const Run* r, int has_m) {
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1; m++) run_store(r, m, n, row_dot8(wr, r->x8 + (size_t)m * r->nb, r->nb, has_m));
    }
    return 0;
}

int exo_arm_dot8_q4_0(const Run* r) { return run_dot8(r, 0); }
int exo_arm_dot8_q4_1(const Run* r) { return run_dot8(r, 1); }

#endif
