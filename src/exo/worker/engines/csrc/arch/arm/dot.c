/* NEON per-row dots (the `dot` strategy, and Q8_0's and Q5_0's `pair`) of every file layout's
 * weight rows (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) with 16-bit activations (BlockX), R = 1 or 4 activation rows per pass (the weights
 * are unpacked once for all R). Each block's integer sum is computed with widening
 * multiply-adds (vmlal_s16: exact), then its float terms are added exactly as the generic kernels
 * (dot.c) add them, chain for chain and in the same order; the aarch64 builds contract no
 * multiply-adds (kernel_build.py: -ffp-contract=off), so a row's result is the portable build's
 * bit for bit (the harness's digest checks it). The other 16-bit strategies (unpacked, grouped)
 * stay generic on ARM; the 8-bit ones are all NEON + dotprod (dot8.c, dot8_k.c, grouped8.c).
 *
 * Speed: not measured (no ARM machine here; the harness runs these under qemu for correctness).
 */
#include "arch/arm/arm.h"
#include "kinds.h"
#include "quants.h"

#if EXO_NEON

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

/* Q4_1 (has_m: w = d q + m) and Q4_0 (w = d (q - 8), m = 0 as the generic dot passes it). */
static inline __attribute__((always_inline)) void q4_rows(const uint8_t* w, int has_m, const BlockX* x, int nb,
                                                          int R, float* out) {
    float acc[4];
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        float d, m;
        int8x16_t lo, hi;
        if (has_m) {
            const BlockQ4_1* wb = (const BlockQ4_1*)w + b;
            const uint8x16_t v = vld1q_u8(wb->qs);
            lo = arm_low_nibbles(v), hi = arm_high_nibbles(v);
            d = exo_h2f(wb->d), m = exo_h2f(wb->m);
        } else {
            const BlockQ4_0* wb = (const BlockQ4_0*)w + b;
            const uint8x16_t v = vld1q_u8(wb->qs);
            lo = vsubq_s8(arm_low_nibbles(v), vdupq_n_s8(8)), hi = vsubq_s8(arm_high_nibbles(v), vdupq_n_s8(8));
            d = exo_h2f(wb->d), m = 0.0f;
        }
        for (int r = 0; r < R; r++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            const int32_t isum = arm_dot32(lo, hi, xb->qs);
            acc[r] += d * xb->d * (float)isum + m * xb->s;
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* Q5_0 (has_m 0: m = -16 d, q in 0..31) and Q5_1 blocks of `stride` bytes: {f16 d, [f16 m], qh[4],
 * qs[16]}, as the generic dot reads them. */
static inline __attribute__((always_inline)) void q5_rows(const uint8_t* w, size_t stride, int has_m, const BlockX* x,
                                                          int nb, int R, float* out) {
    float acc[4];
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    const size_t hq = has_m ? 4 : 2;
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = w + (size_t)b * stride;
        uint16_t d16, m16;
        uint32_t qh;
        memcpy(&d16, blk, 2);
        memcpy(&m16, blk + 2, 2);
        memcpy(&qh, blk + hq, 4);
        const uint8x16_t v = vld1q_u8(blk + hq + 4);
        const int8x16_t lo = vorrq_s8(arm_low_nibbles(v), arm_fifth_bits(qh));
        const int8x16_t hi = vorrq_s8(arm_high_nibbles(v), arm_fifth_bits(qh >> 16));
        const float d = exo_h2f(d16), m = has_m ? exo_h2f(m16) : -16.0f * d;
        for (int r = 0; r < R; r++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            const int32_t isum = arm_dot32(lo, hi, xb->qs);
            acc[r] += d * xb->d * (float)isum + m * xb->s;
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

static inline __attribute__((always_inline)) void q8_rows(const BlockQ8_0* w, const BlockX* x, int nb, int R,
                                                          float* out) {
    float acc[4];
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const float d = exo_h2f(w[b].d);
        const int8x16_t lo = vld1q_s8(w[b].qs), hi = vld1q_s8(w[b].qs + 16);
        for (int r = 0; r < R; r++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            const int32_t isum = arm_dot32(lo, hi, xb->qs);
            acc[r] += d * xb->d * (float)isum;
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* Q4_K and Q5_K (five: value l of sub-block j gets 16 if bit j of qh[l]), super-blocks of `stride`
 * bytes: two chains (by sub-block parity) for one row, one per row for four, as the generic dot. */
static inline __attribute__((always_inline)) void q45k_rows(const uint8_t* base, size_t stride, int five,
                                                            const BlockX* x, int nsb, int R, float* out) {
    const int U = R == 1 ? 2 : 1;
    const int nb = nsb * 8;
    float accf[4], accm[4];
    for (int r = 0; r < R; r++) accm[r] = 0.0f;
    for (int r = 0; r < R * U; r++) accf[r] = 0.0f;
    for (int s = 0; s < nsb; s++) {
        const uint8_t* blk = base + (size_t)s * stride;
        uint16_t d16, dmin16;
        memcpy(&d16, blk, 2);
        memcpy(&dmin16, blk + 2, 2);
        const float d = exo_h2f(d16), dmin = exo_h2f(dmin16);
        const uint8_t* scales = blk + 4;
        const uint8_t* qs = blk + 16 + (five ? 32 : 0);
        const uint8x16_t h0 = five ? vld1q_u8(blk + 16) : vdupq_n_u8(0), h1 = five ? vld1q_u8(blk + 32) : vdupq_n_u8(0);
        for (int c = 0; c < 4; c++) {
            const uint8x16_t v0 = vld1q_u8(qs + 32 * c), v1 = vld1q_u8(qs + 32 * c + 16);
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h;
                int sc, m;
                q4k_scale_min(scales, j, &sc, &m);
                int8x16_t q0 = h ? arm_high_nibbles(v0) : arm_low_nibbles(v0);
                int8x16_t q1 = h ? arm_high_nibbles(v1) : arm_low_nibbles(v1);
                if (five) {
                    const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << j)), sixteen = vdupq_n_u8(16);
                    q0 = vorrq_s8(q0, vreinterpretq_s8_u8(vandq_u8(vtstq_u8(h0, bit), sixteen)));
                    q1 = vorrq_s8(q1, vreinterpretq_s8_u8(vandq_u8(vtstq_u8(h1, bit), sixteen)));
                }
                const float dsc = d * (float)sc;
                for (int r = 0; r < R; r++) {
                    const BlockX* xb = x + (size_t)r * nb + (size_t)s * 8 + j;
                    const int32_t isum = arm_dot32(q0, q1, xb->qs);
                    accf[r * U + (h & (U - 1))] += dsc * xb->d * (float)isum;
                    accm[r] -= dmin * (float)m * xb->s;
                }
            }
        }
    }
    for (int r = 0; r < R; r++) {
        float f = 0.0f;
        for (int u = 0; u < U; u++) f += accf[r * U + u];
        out[r] = f + accm[r];
    }
}

/* Q6_K group g's values 16 half .. 16 half + 15 (q - 32, q = low 4 bits | high 2 bits << 4) */
static inline __attribute__((always_inline)) int8x16_t q6k_values(const uint8_t* ql, const uint8_t* qh, int k) {
    const uint8x16_t l = vld1q_u8(ql), hb = vld1q_u8(qh);
    const uint8x16_t lo = k >= 2 ? vshrq_n_u8(l, 4) : vandq_u8(l, vdupq_n_u8(15));
    const uint8x16_t hi = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(-2 * k))), vdupq_n_u8(3));
    return vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(hi, 4))), vdupq_n_s8(32));
}

/* Q6_K: values 0..15 of a group have scale s0, 16..31 scale s1. */
static inline __attribute__((always_inline)) void q6k_rows(const BlockQ6K* w, const BlockX* x, int nsb, int R,
                                                           float* out) {
    const int nb = nsb * 8;
    float accf[4];
    for (int r = 0; r < R; r++) accf[r] = 0.0f;
    for (int s = 0; s < nsb; s++) {
        const float d = exo_h2f(w[s].d);
        for (int g = 0; g < 8; g++) {
            const int n = g / 4, k = g % 4;
            const uint8_t* ql = w[s].ql + 64 * n + 32 * (k & 1);
            const uint8_t* qh = w[s].qh + 32 * n;
            const float s0 = d * (float)w[s].scales[2 * g], s1 = d * (float)w[s].scales[2 * g + 1];
            const int8x16_t q0 = q6k_values(ql, qh, k), q1 = q6k_values(ql + 16, qh + 16, k);
            for (int r = 0; r < R; r++) {
                const BlockX* xb = x + (size_t)r * nb + (size_t)s * 8 + g;
                const int32_t p0 = arm_dot16(q0, xb->qs), p1 = arm_dot16(q1, xb->qs + 16);
                accf[r] += xb->d * (s0 * (float)p0 + s1 * (float)p1);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = 0.0f + accf[r];
}

/* ---- the dot and pair strategies (kinds.h); R a constant in each branch ---- */
static inline __attribute__((always_inline)) void row_q4_0(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) q4_rows(w, 0, x, nb, 4, out);
    else q4_rows(w, 0, x, nb, 1, out);
}
static inline __attribute__((always_inline)) void row_q4_1(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) q4_rows(w, 1, x, nb, 4, out);
    else q4_rows(w, 1, x, nb, 1, out);
}
static inline __attribute__((always_inline)) void row_q8_0(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) q8_rows((const BlockQ8_0*)w, x, nb, 4, out);
    else q8_rows((const BlockQ8_0*)w, x, nb, 1, out);
}
static inline __attribute__((always_inline)) void row_q5_0(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) q5_rows(w, sizeof(BlockQ5_0), 0, x, nb, 4, out);
    else q5_rows(w, sizeof(BlockQ5_0), 0, x, nb, 1, out);
}
static inline __attribute__((always_inline)) void row_q5_1(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) q5_rows(w, sizeof(BlockQ5_1), 1, x, nb, 4, out);
    else q5_rows(w, sizeof(BlockQ5_1), 1, x, nb, 1, out);
}
static inline __attribute__((always_inline)) void row_q4_k(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) q45k_rows(w, sizeof(BlockQ4K), 0, x, nb / 8, 4, out);
    else q45k_rows(w, sizeof(BlockQ4K), 0, x, nb / 8, 1, out);
}
static inline __attribute__((always_inline)) void row_q5_k(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) q45k_rows(w, sizeof(BlockQ5K), 1, x, nb / 8, 4, out);
    else q45k_rows(w, sizeof(BlockQ5K), 1, x, nb / 8, 1, out);
}
static inline __attribute__((always_inline)) void row_q6_k(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) q6k_rows((const BlockQ6K*)w, x, nb / 8, 4, out);
    else q6k_rows((const BlockQ6K*)w, x, nb / 8, 1, out);
}
/* two Q8_0 rows against one activation row: each its own chain, as the generic pair */
static inline __attribute__((always_inline)) void pair_q8_0(const uint8_t* w0, const uint8_t* w1, const BlockX* x,
                                                            int nb, float* out) {
    q8_rows((const BlockQ8_0*)w0, x, nb, 1, out);
    q8_rows((const BlockQ8_0*)w1, x, nb, 1, out + 1);
}

/* two Q5_0 rows against one activation row, as the generic pair */
static inline __attribute__((always_inline)) void pair_q5_0(const uint8_t* w0, const uint8_t* w1, const BlockX* x,
                                                            int nb, float* out) {
    q5_rows(w0, sizeof(BlockQ5_0), 0, x, nb, 1, out);
    q5_rows(w1, sizeof(BlockQ5_0), 0, x, nb, 1, out + 1);
}

int exo_arm_dot_q4_0(const Run* r) { run_rows(r, row_q4_0); return 0; }
int exo_arm_dot_q4_1(const Run* r) { run_rows(r, row_q4_1); return 0; }
int exo_arm_dot_q8_0(const Run* r) { run_rows(r, row_q8_0); return 0; }
int exo_arm_dot_q5_0(const Run* r) { run_rows(r, row_q5_0); return 0; }
int exo_arm_dot_q5_1(const Run* r) { run_rows(r, row_q5_1); return 0; }
int exo_arm_dot_q4_k(const Run* r) { run_rows(r, row_q4_k); return 0; }
int exo_arm_dot_q5_k(const Run* r) { run_rows(r, row_q5_k); return 0; }
int exo_arm_dot_q6_k(const Run* r) { run_rows(r, row_q6_k); return 0; }
int exo_arm_pair_q8_0(const Run* r) { run_pairs(r, pair_q8_0); return 0; }
int exo_arm_pair_q5_0(const Run* r) { run_pairs(r, pair_q5_0); return 0; }

#endif
