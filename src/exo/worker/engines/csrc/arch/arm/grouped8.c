/* issue 22 arm8: the grouped strategy at 8-bit activations with NEON + dotprod, for every repacked
 * layout (KIND_*_G8: Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; exo_kernels.h has the layouts).
 *
 * A group's block keeps byte 2i + e of its 8 rows' values at [i][2c + e]: two such 16-byte rows
 * (i, i + 1) zipped by 16 bits give, per int32 lane c, row c's four values 2i .. 2i + 3, so one
 * vdotq_laneq_s32 with the activation's matching four bytes (a lane of its 16-byte half) sums four
 * products for each of 4 weight rows (arm8.h: arm_zip_rows, arm_group_step). Each row's integer
 * block sums are the generic kernels' (grouped8.c, act8_q5.c: exact) and the float steps, a row a
 * lane, are act8.h's in its order, so every row's result is the portable build's and the per-row
 * dots' bit for bit, at every row count (the harness's digest and act8 checks, under qemu).
 * Speed: not measured (no ARM machine here).
 */
#include "act8_q5.h"
#include "arch/arm/arm8.h"

#if EXO_NEON_DOTPROD

/* g->w from the value bytes of a 32-value block's 8 rows: lo[i] (values 2i + e), hi[i] (values
 * 16 + 2i + e), i = 0..7, each laid as the group's rows. */
static inline __attribute__((always_inline)) void lay32(const int8x16_t lo[8], const int8x16_t hi[8], ArmGroup8* g) {
    for (int p = 0; p < 4; p++) {
        arm_zip_rows(vreinterpretq_u8_s8(lo[2 * p]), vreinterpretq_u8_s8(lo[2 * p + 1]), &g->w[p], &g->w[8 + p]);
        arm_zip_rows(vreinterpretq_u8_s8(hi[2 * p]), vreinterpretq_u8_s8(hi[2 * p + 1]), &g->w[4 + p], &g->w[12 + p]);
    }
}

/* g->w from the value bytes v[i] (values 2i + e, i = 0..15) of one 32-value sub-block of 8 rows. */
static inline __attribute__((always_inline)) void lay_sub(const int8x16_t v[16], ArmGroup8* g) {
    for (int p = 0; p < 8; p++)
        arm_zip_rows(vreinterpretq_u8_s8(v[2 * p]), vreinterpretq_u8_s8(v[2 * p + 1]), &g->w[p], &g->w[8 + p]);
}

static inline __attribute__((always_inline)) void scale_by(float32x4_t out[2], const float32x4_t d[2], float k) {
    out[0] = vmulq_n_f32(d[0], k), out[1] = vmulq_n_f32(d[1], k);
}

/* Q4_0 (m = -8 d) and Q4_1 groups. */
static inline __attribute__((always_inline)) void unpack_q4(const uint8_t* grp, int b, int has_m, ArmGroup8* g) {
    const uint8_t(*qs)[16];
    if (has_m) {
        const BlockQ4_1x8* blk = (const BlockQ4_1x8*)grp + b;
        arm_h2f8(blk->d, g->d), arm_h2f8(blk->m, g->m);
        qs = blk->qs;
    } else {
        const BlockQ4_0x8* blk = (const BlockQ4_0x8*)grp + b;
        arm_h2f8(blk->d, g->d), scale_by(g->m, g->d, -8.0f);
        qs = blk->qs;
    }
    int8x16_t lo[8], hi[8];
    for (int i = 0; i < 8; i++) {
        const uint8x16_t v = vld1q_u8(qs[i]);
        lo[i] = arm_low_nibbles(v), hi[i] = arm_high_nibbles(v);
    }
    lay32(lo, hi, g);
}

static inline __attribute__((always_inline)) void unpack_q4_0(const uint8_t* grp, int b, ArmGroup8* g) { unpack_q4(grp, b, 0, g); }
static inline __attribute__((always_inline)) void unpack_q4_1(const uint8_t* grp, int b, ArmGroup8* g) { unpack_q4(grp, b, 1, g); }

/* Q8_0: values 2j, 2j + 1 of the 8 rows at qs + 32 (j % 8) + 16 (j / 8). */
static inline __attribute__((always_inline)) void unpack_q8_0(const uint8_t* grp, int b, ArmGroup8* g) {
    const BlockQ8_0x8* blk = (const BlockQ8_0x8*)grp + b;
    arm_h2f8(blk->d, g->d);
    g->m[0] = g->m[1] = vdupq_n_f32(0.0f);
    int8x16_t v[16];
    for (int j = 0; j < 16; j++) v[j] = vld1q_s8(blk->qs + 32 * (j % 8) + 16 * (j / 8));
    lay_sub(v, g);
}

/* Q5_0 (m = -16 d) and Q5_1 groups: nibbles | fifth bit << 4 (word qh[i]: bit 2c + e of value
 * 2i + e, bit 16 + 2c + e of value 2i + 16 + e, as the group's bytes lie). */
static inline __attribute__((always_inline)) void q5_lay(const uint8_t (*qh)[4], const uint8_t (*qs)[16], ArmGroup8* g) {
    int8x16_t lo[8], hi[8];
    for (int i = 0; i < 8; i++) {
        const uint8x16_t v = vld1q_u8(qs[i]);
        const uint32_t h = q5_bits(qh[i]);
        lo[i] = vorrq_s8(arm_low_nibbles(v), arm_fifth_bits(h));
        hi[i] = vorrq_s8(arm_high_nibbles(v), arm_fifth_bits(h >> 16));
    }
    lay32(lo, hi, g);
}

static inline __attribute__((always_inline)) void unpack_q5_0(const uint8_t* grp, int b, ArmGroup8* g) {
    const BlockQ5_0x8* blk = (const BlockQ5_0x8*)grp + b;
    arm_h2f8(blk->d, g->d), scale_by(g->m, g->d, -16.0f);
    q5_lay(blk->qh, blk->qs, g);
}

static inline __attribute__((always_inline)) void unpack_q5_1(const uint8_t* grp, int b, ArmGroup8* g) {
    const BlockQ5_1x8* blk = (const BlockQ5_1x8*)grp + b;
    arm_h2f8(blk->d, g->d), arm_h2f8(blk->m, g->m);
    q5_lay(blk->qh, blk->qs, g);
}

/* Sub-block j's scales d sc and offsets -(dmin mn) of a Q4_K / Q5_K group's 8 rows (q4k_sub's
 * floats; s[k]: byte k of the 8 rows' packed scales, q4k_scale_min's fields lane by lane). */
static inline __attribute__((always_inline)) void k_scales(const uint16_t* d, const uint16_t* dmin, const uint8_t (*s)[8],
                                                           int j, ArmGroup8* g) {
    const uint8x8_t six = vdup_n_u8(63), four = vdup_n_u8(15);
    uint8x8_t sc, mn;
    if (j < 4) {
        sc = vand_u8(vld1_u8(s[j]), six), mn = vand_u8(vld1_u8(s[j + 4]), six);
    } else {
        const uint8x8_t a = vld1_u8(s[j + 4]), lo = vld1_u8(s[j - 4]), hi = vld1_u8(s[j]);
        sc = vorr_u8(vand_u8(a, four), vshl_n_u8(vshr_n_u8(lo, 6), 4));
        mn = vorr_u8(vshr_n_u8(a, 4), vshl_n_u8(vshr_n_u8(hi, 6), 4));
    }
    float32x4_t dd[2], dm[2], scf[2], mnf[2];
    arm_h2f8(d, dd), arm_h2f8(dmin, dm), arm_u8f8(sc, scf), arm_u8f8(mn, mnf);
    for (int h = 0; h < 2; h++) {
        g->d[h] = vmulq_f32(dd[h], scf[h]);
        g->m[h] = vnegq_f32(vmulq_f32(dm[h], mnf[h]));
    }
}

/* Q4_K: block b is sub-block j = b % 8 of super-block b / 8: the low (j even) or high nibbles of
 * chunk j / 2. */
static inline __attribute__((always_inline)) void unpack_q4_k(const uint8_t* grp, int b, ArmGroup8* g) {
    const BlockQ4Kx8* blk = (const BlockQ4Kx8*)grp + b / 8;
    const int j = b % 8;
    k_scales(blk->d, blk->dmin, blk->scales, j, g);
    int8x16_t v[16];
    for (int i = 0; i < 16; i++) v[i] = arm_nibbles(vld1q_u8(blk->qs[j / 2][i]), j & 1);
    lay_sub(v, g);
}

/* Q5_K: as Q4_K's, value l's fifth bit = bit j of qh byte l (qh[i] lies as qs[ch][i]). */
static inline __attribute__((always_inline)) void unpack_q5_k(const uint8_t* grp, int b, ArmGroup8* g) {
    const BlockQ5Kx8* blk = (const BlockQ5Kx8*)grp + b / 8;
    const int j = b % 8;
    k_scales(blk->d, blk->dmin, blk->scales, j, g);
    int8x16_t v[16];
    for (int i = 0; i < 16; i++)
        v[i] = vorrq_s8(arm_nibbles(vld1q_u8(blk->qs[j / 2][i]), j & 1), arm_bit_j(vld1q_u8(blk->qh[i]), j));
    lay_sub(v, g);
}

/* 8 rows' int8 scales as floats times d (rows 0..3 in out[0], 4..7 in out[1]). */
static inline __attribute__((always_inline)) void q6k_scale(const float32x4_t d[2], const int8_t* s, float32x4_t out[2]) {
    const int16x8_t w = vmovl_s8(vld1_s8(s));
    out[0] = vmulq_f32(d[0], vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))));
    out[1] = vmulq_f32(d[1], vcvtq_f32_s32(vmovl_high_s16(w)));
}

/* Q6_K: block b is 32-value group gi = b % 8 of super-block b / 8 (ql chunk 2 (gi / 4) + gi % 2,
 * qh chunk gi / 4); values 0..15 scaled by scales[2 gi], 16..31 by scales[2 gi + 1] (in g->m). */
static inline __attribute__((always_inline)) void unpack_q6_k(const uint8_t* grp, int b, ArmGroup8* g) {
    const BlockQ6Kx8* blk = (const BlockQ6Kx8*)grp + b / 8;
    const int gi = b % 8, n = gi / 4, k = gi % 4;
    float32x4_t d[2];
    arm_h2f8(blk->d, d);
    q6k_scale(d, blk->scales[2 * gi], g->d), q6k_scale(d, blk->scales[2 * gi + 1], g->m);
    int8x16_t v[16];
    for (int i = 0; i < 16; i++) v[i] = arm_q6k_bytes(vld1q_u8(blk->ql[2 * n + (k & 1)][i]), vld1q_u8(blk->qh[n][i]), k);
    lay_sub(v, g);
}

int exo_arm_grouped8_q4_0(const Run* r) { return arm_run_groups8(r, unpack_q4_0, ARM8_MIN); }
int exo_arm_grouped8_q4_1(const Run* r) { return arm_run_groups8(r, unpack_q4_1, ARM8_MIN); }
int exo_arm_grouped8_q8_0(const Run* r) { return arm_run_groups8(r, unpack_q8_0, ARM8_NOMIN); }
int exo_arm_grouped8_q5_0(const Run* r) { return arm_run_groups8(r, unpack_q5_0, ARM8_MIN); }
int exo_arm_grouped8_q5_1(const Run* r) { return arm_run_groups8(r, unpack_q5_1, ARM8_MIN); }
int exo_arm_grouped8_q4_k(const Run* r) { return arm_run_groups8(r, unpack_q4_k, ARM8_MIN); }
int exo_arm_grouped8_q5_k(const Run* r) { return arm_run_groups8(r, unpack_q5_k, ARM8_MIN); }
int exo_arm_grouped8_q6_k(const Run* r) { return arm_run_groups8(r, unpack_q6_k, ARM8_HALVES); }

#endif
