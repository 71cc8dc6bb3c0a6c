/* Helpers the NEON kernels share (arch/arm/: compiled where EXO_NEON, the aarch64 builds above
 * portable). Every integer sum here is exact (int8 or int16 weights times int16 or int8
 * activations, widened to int32 before any addition), so a block's sum is the generic kernels'
 * whatever the order of its additions; the float terms are then added in the generic order. */
#ifndef EXO_ARM_H
#define EXO_ARM_H

#include "exo_kernels.h"

#if EXO_NEON

/* acc + w_j x_j summed per int32 lane, for 16 int8 weights w and 16 int16 activations x */
static inline __attribute__((always_inline)) int32x4_t arm_mla16(int32x4_t acc, int8x16_t w, const int16_t* x) {
    const int16x8_t w0 = vmovl_s8(vget_low_s8(w)), w1 = vmovl_high_s8(w);
    const int16x8_t x0 = vld1q_s16(x), x1 = vld1q_s16(x + 8);
    acc = vmlal_s16(acc, vget_low_s16(w0), vget_low_s16(x0));
    acc = vmlal_high_s16(acc, w0, x0);
    acc = vmlal_s16(acc, vget_low_s16(w1), vget_low_s16(x1));
    return vmlal_high_s16(acc, w1, x1);
}

/* sum_j w_j x_j of a block of 32: values 0..15 in w0, 16..31 in w1 */
static inline __attribute__((always_inline)) int32_t arm_dot32(int8x16_t w0, int8x16_t w1, const int16_t* x) {
    return vaddvq_s32(arm_mla16(arm_mla16(vdupq_n_s32(0), w0, x), w1, x + 16));
}

/* sum_j w_j x_j of 16 values */
static inline __attribute__((always_inline)) int32_t arm_dot16(int8x16_t w, const int16_t* x) {
    return vaddvq_s32(arm_mla16(vdupq_n_s32(0), w, x));
}

/* The low and high nibbles of 16 bytes (a Q4 block's values 0..15 and 16..31), as int8 */
static inline __attribute__((always_inline)) int8x16_t arm_low_nibbles(uint8x16_t v) {
    return vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15)));
}
static inline __attribute__((always_inline)) int8x16_t arm_high_nibbles(uint8x16_t v) {
    return vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
}

/* 16 or 0 per byte j: bit j of the 16 `bits` (the fifth bit of Q5_0 / Q5_1 values) */
static inline __attribute__((always_inline)) int8x16_t arm_fifth_bits(uint32_t bits) {
    static const uint8_t lanes[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)bits), vdup_n_u8((uint8_t)(bits >> 8)));
    return vreinterpretq_s8_u8(vandq_u8(vtstq_u8(v, vld1q_u8(lanes)), vdupq_n_u8(16)));
}

#endif
#endif
