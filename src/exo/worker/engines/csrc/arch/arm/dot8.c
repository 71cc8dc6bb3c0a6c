/* NEON + dotprod dots of 4-bit weights (Q4_0, Q4_1) with 8-bit activations (ACT_X8, BlockX8):
 * per block two sdot (vdotq_s32) give the eight int32 lanes of act8.h (lane l < 4: the low
 * nibbles of bytes 4l .. 4l + 3 times values 4l .. 4l + 3; lane 4 + l: their high nibbles times
 * values 16 + 4l ..), then the float order of act8.h (the generic dots' in act8.c): a multiply,
 * then an add, per lane; the lanes summed ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)); the
 * offset term c block by block. Built without contracted multiply-adds, so the results are the
 * portable build's bit for bit. Speed: not measured (no ARM machine here; qemu runs it). */
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
    float32x4_t lo_acc = vdupq_n_f32(0.0f), hi_acc = vdupq_n_f32(0.0f);
    float c = 0.0f;
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
        const int32x4_t lo = vdotq_s32(vdupq_n_s32(0), arm_low_nibbles(v), vld1q_s8(x[b].qs));
        const int32x4_t hi = vdotq_s32(vdupq_n_s32(0), arm_high_nibbles(v), vld1q_s8(x[b].qs + 16));
        const float t = d * x[b].d;
        lo_acc = vaddq_f32(lo_acc, vmulq_n_f32(vcvtq_f32_s32(lo), t));
        hi_acc = vaddq_f32(hi_acc, vmulq_n_f32(vcvtq_f32_s32(hi), t));
        c = c + m * x[b].s;
    }
    const float32x4_t v = vaddq_f32(lo_acc, hi_acc); /* a0 + a4, a1 + a5, a2 + a6, a3 + a7 */
    const float even = vgetq_lane_f32(v, 0) + vgetq_lane_f32(v, 2), odd = vgetq_lane_f32(v, 1) + vgetq_lane_f32(v, 3);
    return (even + odd) + c;
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
