/* issue 22 arm8: what the NEON + dotprod 8-bit dots (ACT_X8, BlockX8) share: the per-row runner
 * of the file layouts (dot8_k.c) and the grouped runner of the repacked layouts (grouped8.c).
 *
 * A block's integer dot is sdot's (vdotq_s32: four int8 products summed per int32 lane, exact),
 * its int32 lanes then summed (exact: the block's sum is the generic kernels' whatever the order);
 * the float terms are act8.h's steps in act8.h's order: per row, from acc = 0, block by block,
 * t = d_w d_x, acc = acc + t (float)i, then acc = acc + m_w s_x (kinds with an offset). The groups'
 * steps run 4 weight rows to a float32x4 lane each: vmulq / vaddq are the scalar IEEE operations
 * lane by lane, and every aarch64 build contracts nothing (kernel_build.py: -ffp-contract=off; the
 * pragma of act8.h), so each row's float is the portable build's bit for bit.
 *
 * Speed: not measured (no ARM machine here; qemu runs these for correctness only).
 */
#ifndef EXO_ARM8_H
#define EXO_ARM8_H

#include "act8.h"
#include "arch/arm/arm.h"

#if EXO_NEON_DOTPROD

/* How a block's float steps go: with an offset (act8_step: Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K), without one
 * (act8_step0: Q8_0), or as two offset-free halves of 16 values, each its own scale (Q6_K). */
enum { ARM8_MIN = 0, ARM8_NOMIN = 1, ARM8_HALVES = 2 };

/* Q6_K values (q - 32) of 16 ql bytes l and their qh bytes hb, for 32-value group g % 4 = k:
 * the low (k < 2) or high nibble of l, and bits 2k, 2k + 1 of hb as bits 4, 5. */
static inline __attribute__((always_inline)) int8x16_t arm_q6k_bytes(uint8x16_t l, uint8x16_t hb, int k) {
    const uint8x16_t lo = k >= 2 ? vshrq_n_u8(l, 4) : vandq_u8(l, vdupq_n_u8(15));
    const uint8x16_t hi = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(-2 * k))), vdupq_n_u8(3));
    return vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(hi, 4))), vdupq_n_s8(32));
}

/* 16 where bit j of a byte of qh is set, else 0 (Q5_K's fifth bit of sub-block j's values). */
static inline __attribute__((always_inline)) int8x16_t arm_bit_j(uint8x16_t qh, int j) {
    return vreinterpretq_s8_u8(vandq_u8(vtstq_u8(qh, vdupq_n_u8((uint8_t)(1u << j))), vdupq_n_u8(16)));
}

/* Nibbles of 16 bytes: the high ones if `high`, else the low ones (as int8). */
static inline __attribute__((always_inline)) int8x16_t arm_nibbles(uint8x16_t v, int high) {
    return high ? arm_high_nibbles(v) : arm_low_nibbles(v);
}

/* ---- per row (file layouts) ---- */

/* One weight row's block: values 0..15 in lo, 16..31 in hi (as int8), scale d and offset m
 * (ARM8_HALVES: m is the scale of values 16..31). */
typedef struct {
    int8x16_t lo, hi;
    float d, m;
} ArmRow8;

typedef void (*ArmRowUnpack)(const uint8_t* row, int b, ArmRow8* out);

static inline __attribute__((always_inline)) float arm_row_step(float acc, const ArmRow8* w, const BlockX8* xb,
                                                                int mode) {
    const int8x16_t xl = vld1q_s8(xb->qs), xh = vld1q_s8(xb->qs + 16);
    const int32x4_t zero = vdupq_n_s32(0);
    if (mode == ARM8_HALVES) {
        acc = act8_step0(acc, w->d, xb, vaddvq_s32(vdotq_s32(zero, w->lo, xl)));
        return act8_step0(acc, w->m, xb, vaddvq_s32(vdotq_s32(zero, w->hi, xh)));
    }
    const int32_t isum = vaddvq_s32(vdotq_s32(vdotq_s32(zero, w->lo, xl), w->hi, xh));
    return mode == ARM8_MIN ? act8_step(acc, w->d, w->m, xb, isum) : act8_step0(acc, w->d, xb, isum);
}

#define ARM8_PASS 64 /* activation rows sharing each unpacked weight block */

/* The dot8 strategy: each weight row's blocks unpacked once per pass of up to ARM8_PASS
 * activation rows, each activation row its own chain (act8.h's order). */
static inline __attribute__((always_inline)) int arm_run_rows8(const Run* r, ArmRowUnpack unpack, int mode) {
    float acc[ARM8_PASS];
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m0 = r->m0; m0 < r->m1; m0 += ARM8_PASS) {
            const int R = r->m1 - m0 < ARM8_PASS ? r->m1 - m0 : ARM8_PASS;
            for (int m = 0; m < R; m++) acc[m] = 0.0f;
            for (int b = 0; b < r->nb; b++) {
                ArmRow8 w;
                unpack(wr, b, &w);
                const BlockX8* xb = r->x8 + (size_t)m0 * r->nb + b;
                for (int m = 0; m < R; m++) acc[m] = arm_row_step(acc[m], &w, xb + (size_t)m * r->nb, mode);
            }
            for (int m = 0; m < R; m++) run_store(r, m0 + m, n, acc[m]);
        }
    }
    return 0;
}

/* ---- groups of 8 rows (repacked layouts, exo_kernels.h) ---- */

/* One block of a group, unpacked: w[p] (int32 lane c: row c's values 4p .. 4p + 3) for rows 0..3,
 * w[8 + p] for rows 4..7; d[h], m[h]: the scales and offsets of rows 4h .. 4h + 3 (ARM8_HALVES: m
 * is the scale of values 16..31). */
typedef struct {
    int8x16_t w[16];
    float32x4_t d[2], m[2];
} ArmGroup8;

typedef void (*ArmGroupUnpack)(const uint8_t* grp, int b, ArmGroup8* out);

/* Two 16-byte rows of a group's layout (byte 2c + e: row c's byte 2i + e, then 2i + 2 + e) zipped
 * by 16 bits: lane c of *r03 = row c's four bytes 2i .. 2i + 3, of *r47 row 4 + c's. */
static inline __attribute__((always_inline)) void arm_zip_rows(uint8x16_t a, uint8x16_t b, int8x16_t* r03,
                                                               int8x16_t* r47) {
    const uint16x8_t a16 = vreinterpretq_u16_u8(a), b16 = vreinterpretq_u16_u8(b);
    *r03 = vreinterpretq_s8_u16(vzip1q_u16(a16, b16));
    *r47 = vreinterpretq_s8_u16(vzip2q_u16(a16, b16));
}

/* The 8 rows' f16 values at p (scales, offsets) as floats: rows 0..3 in out[0], 4..7 in out[1]. */
static inline __attribute__((always_inline)) void arm_h2f8(const uint16_t* p, float32x4_t out[2]) {
    out[0] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
    out[1] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4)));
}

/* 8 unsigned bytes (one per row) as floats: rows 0..3 in out[0], 4..7 in out[1]. */
static inline __attribute__((always_inline)) void arm_u8f8(uint8x8_t v, float32x4_t out[2]) {
    const uint16x8_t w = vmovl_u8(v);
    out[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(w)));
    out[1] = vcvtq_f32_u32(vmovl_high_u16(w));
}

/* act8.h's step, a row a lane: t = d_w d_x; acc + t (float)i, then + m_w s_x if `min`. */
static inline __attribute__((always_inline)) float32x4_t arm_step4(float32x4_t acc, float32x4_t d_w, float32x4_t m_w,
                                                                   const BlockX8* xb, int32x4_t isum, int min) {
    const float32x4_t t = vmulq_n_f32(d_w, xb->d);
    acc = vaddq_f32(acc, vmulq_f32(t, vcvtq_f32_s32(isum)));
    return min ? vaddq_f32(acc, vmulq_n_f32(m_w, xb->s)) : acc;
}

/* One activation block's steps for the group's 8 rows (acc[0]: rows 0..3, acc[1]: 4..7). */
static inline __attribute__((always_inline)) void arm_group_step(float32x4_t acc[2], const ArmGroup8* g,
                                                                 const BlockX8* xb, int mode) {
    const int8x16_t xl = vld1q_s8(xb->qs), xh = vld1q_s8(xb->qs + 16);
    for (int h = 0; h < 2; h++) {
        const int8x16_t* w = g->w + 8 * h;
        int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);
        lo = vdotq_laneq_s32(lo, w[0], xl, 0), lo = vdotq_laneq_s32(lo, w[1], xl, 1);
        lo = vdotq_laneq_s32(lo, w[2], xl, 2), lo = vdotq_laneq_s32(lo, w[3], xl, 3);
        hi = vdotq_laneq_s32(hi, w[4], xh, 0), hi = vdotq_laneq_s32(hi, w[5], xh, 1);
        hi = vdotq_laneq_s32(hi, w[6], xh, 2), hi = vdotq_laneq_s32(hi, w[7], xh, 3);
        if (mode == ARM8_HALVES)
            acc[h] = arm_step4(arm_step4(acc[h], g->d[h], g->m[h], xb, lo, 0), g->m[h], g->m[h], xb, hi, 0);
        else
            acc[h] = arm_step4(acc[h], g->d[h], g->m[h], xb, vaddq_s32(lo, hi), mode == ARM8_MIN);
    }
}

/* R (a constant where inlined) activation rows from m0 against the group at grp: each block
 * unpacked once for the R rows. */
static inline __attribute__((always_inline)) void arm_group_pass(const Run* r, const uint8_t* grp, int n, int m0, int R,
                                                                 ArmGroupUnpack unpack, int mode) {
    float32x4_t acc[4][2];
    for (int m = 0; m < R; m++) acc[m][0] = acc[m][1] = vdupq_n_f32(0.0f);
    for (int b = 0; b < r->nb; b++) {
        ArmGroup8 g;
        unpack(grp, b, &g);
        const BlockX8* xb = r->x8 + (size_t)m0 * r->nb + b;
        for (int m = 0; m < R; m++) arm_group_step(acc[m], &g, xb + (size_t)m * r->nb, mode);
    }
    float out[8];
    for (int m = 0; m < R; m++) {
        vst1q_f32(out, acc[m][0]), vst1q_f32(out + 4, acc[m][1]);
        for (int c = 0; c < 8; c++) run_store(r, m0 + m, n + c, out[c]);
    }
}

/* The grouped8 strategy: the groups of rows [lo, hi) (multiples of 8), 4 activation rows a pass. */
static inline __attribute__((always_inline)) int arm_run_groups8(const Run* r, ArmGroupUnpack unpack, int mode) {
    for (int n = r->lo; n < r->hi; n += 8) {
        const uint8_t* grp = run_row(r, n);
        int m0 = r->m0;
        for (; m0 + 4 <= r->m1; m0 += 4) arm_group_pass(r, grp, n, m0, 4, unpack, mode);
        for (; m0 < r->m1; m0++) arm_group_pass(r, grp, n, m0, 1, unpack, mode);
    }
    return 0;
}

#endif
#endif
