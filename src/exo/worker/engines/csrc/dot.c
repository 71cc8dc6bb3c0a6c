/* Dot products of one q4 / q8 weight row with R activation rows (R = 1 or 4: the weights are
 * unpacked once for all R), plain C (the
 * portable build, and any kind an ISA has no kernel of).
 *
 *   q4 (GGUF Q4_1): w = d q + m, q in 0..15; byte j of a block holds element j in its low
 *       nibble and element j + 16 in its high one. A block's dot product with x = d_x q_x:
 *       sum_j w_j x_j = d d_x sum_j q_j q_xj + m (d_x sum_j q_xj) = d d_x isum + m s_x
 *   Q4_0: w = d (q - 8): the signed values' sum d d_x sum_j (q_j - 8) q_xj, no offset term
 *   q8 (GGUF Q8_0): w = d q, q in -127..127: sum_j w_j x_j = d d_x sum_j q_j q_xj
 *   Q5_0 / Q5_1: q in 0..31 (a fifth bit from qh), w = d q + m with m = -16 d for Q5_0: the
 *       same sum as q4, d d_x isum + m s_x
 */
#include "kinds.h"
#include "quants.h"


/* Plain C: the weights are unpacked once per block into int16, then integer dot products; R = 1
 * or 4 activation rows (a constant at each call). */
/* acc[r] += block b of row r (xb + r * nb) dotted with the unpacked weights q, scaled: w = d q + m */
static inline void dot_block_rows(const int16_t* q, float d, float m, const BlockX* xb, int nb, int R,
                                  float* acc) {
    for (int r = 0; r < R; r++, xb += nb) {
        int32_t isum = 0;
        for (int j = 0; j < QK; j++) isum += (int32_t)q[j] * xb->qs[j];
        acc[r] += d * xb->d * (float)isum + m * xb->s;
    }
}
static inline __attribute__((always_inline)) void dot_q4(const BlockQ4_1* w, const BlockX* x, int nb, int R, float* out) {
    float acc[4];
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        int16_t q[QK];
        for (int j = 0; j < 16; j++) {
            q[j] = (int16_t)(w[b].qs[j] & 15);
            q[j + 16] = (int16_t)(w[b].qs[j] >> 4);
        }
        const float d = exo_h2f(w[b].d), m = exo_h2f(w[b].m);
        dot_block_rows(q, d, m, x + b, nb, R, acc);
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* Q4_0: w = d (q - 8), the signed values' integer sums, no offset term (as the AVX2 kernels). */
static inline __attribute__((always_inline)) void dot_q4_0(const BlockQ4_0* w, const BlockX* x, int nb, int R, float* out) {
    float acc[4];
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        int16_t q[QK];
        for (int j = 0; j < 16; j++) {
            q[j] = (int16_t)((w[b].qs[j] & 15) - 8);
            q[j + 16] = (int16_t)((w[b].qs[j] >> 4) - 8);
        }
        dot_block_rows(q, exo_h2f(w[b].d), 0.0f, x + b, nb, R, acc);
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

static inline __attribute__((always_inline)) void dot_q8(const BlockQ8_0* w, const BlockX* x, int nb, int R, float* out) {
    float acc[4];
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const float d = exo_h2f(w[b].d);
        for (int r = 0; r < R; r++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            int32_t isum = 0;
            for (int j = 0; j < QK; j++) isum += (int32_t)w[b].qs[j] * xb->qs[j];
            acc[r] += d * xb->d * (float)isum;
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* Q5_0 (has_m 0: m = -16 d) and Q5_1 blocks of `stride` bytes: {f16 d, [f16 m], qh[4], qs[16]}. */
static inline __attribute__((always_inline)) void dot_q5(const uint8_t* w, size_t stride, int has_m, const BlockX* x, int nb, int R, float* out) {
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
        const uint8_t* qs = blk + hq + 4;
        int16_t q[QK];
        for (int j = 0; j < 16; j++) {
            q[j] = (int16_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));
            q[j + 16] = (int16_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        const float d = exo_h2f(d16), m = has_m ? exo_h2f(m16) : -16.0f * d;
        dot_block_rows(q, d, m, x + b, nb, R, acc);
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}


/* Two q8 weight rows against one activation row (decode): the activation blocks are loaded
 * once for both, and each row keeps its own chain; one reduction for both sums. */
static inline void dot_q8_1x2(const BlockQ8_0* w0, const BlockQ8_0* w1, const BlockX* x, int nb, float* out) {
    dot_q8(w0, x, nb, 1, out);
    dot_q8(w1, x, nb, 1, out + 1);
}

/* Two Q5_0 weight rows against one activation row (decode), as dot_q8_1x2. */
static inline void dot_q5_0_1x2(const uint8_t* w0, const uint8_t* w1, const BlockX* x, int nb, float* out) {
    dot_q5(w0, sizeof(BlockQ5_0), 0, x, nb, 1, out);
    dot_q5(w1, sizeof(BlockQ5_0), 0, x, nb, 1, out + 1);
}

/* K-quant dot products (llama.cpp's super-blocks of 256 values) against one activation row,
 * read from the file's bytes as they are.
 *
 * Q4_K: sub-block j (32 values) is d * sc_j * q - dmin * m_j, q in 0..15; (sc, m) are 6-bit
 *   pairs packed in 12 bytes; 64-value chunk c holds sub-block 2c in the low nibbles of its 32
 *   bytes and 2c + 1 in the high ones.
 * Q5_K: Q4_K with a fifth bit: value l of sub-block j gets 16 * bit j of qh[l].
 * Q6_K: sub-block (16 values) i is d * sc_i * (q - 32), q in 0..63: low 4 bits in ql, high 2
 *   in qh. 32-value group g = 4n + k (half n, quarter k): low bits from ql[64n + 32(k & 1) + l]
 *   (low nibble for k < 2, high for k >= 2), high bits from qh[32n + l] >> 2k.
 */

/* Q4_K and Q5_K (five: the fifth bit from qh) against R = 1 or 4 activation rows (x + r * nb
 * blocks of 32, nb = 8 nsb): each sub-block is unpacked once for all R rows; two chains per row
 * for one row, as the AVX2 kernel keeps. */
static inline __attribute__((always_inline)) void dot_q45k(const uint8_t* base, size_t stride, int nsb,
                                                           const BlockX* x, int five, int R, float* out) {
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
        const uint8_t* qh = five ? blk + 16 : NULL;
        const uint8_t* qs = blk + 16 + (five ? 32 : 0);
        for (int c = 0; c < 4; c++) {
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h;
                int sc, m;
                q4k_scale_min(scales, j, &sc, &m);
                int16_t q[QK];
                for (int l = 0; l < QK; l++) {
                    const uint8_t v = qs[32 * c + l];
                    q[l] = (int16_t)(h ? v >> 4 : v & 15);
                    if (five) q[l] = (int16_t)(q[l] | (((qh[l] >> j) & 1) << 4));
                }
                const float dsc = d * (float)sc;
                for (int r = 0; r < R; r++) {
                    const BlockX* xb = x + (size_t)r * nb + (size_t)s * 8 + j;
                    int32_t isum = 0;
                    for (int l = 0; l < QK; l++) isum += (int32_t)q[l] * xb->qs[l];
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

/* Q6_K against R = 1 or 4 activation rows (values 0..15 have scale s0, 16..31 scale s1). */
static inline __attribute__((always_inline)) void dot_q6k_rows(const BlockQ6K* w, const BlockX* x, int nsb, int R,
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
            int16_t q[QK];
            for (int l = 0; l < QK; l++) {
                const int lo = (k >= 2 ? ql[l] >> 4 : ql[l]) & 15;
                const int hi = (qh[l] >> (2 * k)) & 3;
                q[l] = (int16_t)((lo | (hi << 4)) - 32);
            }
            for (int r = 0; r < R; r++) {
                const BlockX* xb = x + (size_t)r * nb + (size_t)s * 8 + g;
                int32_t p[2] = {0, 0};
                for (int l = 0; l < QK; l++) p[l / 16] += (int32_t)q[l] * xb->qs[l];
                accf[r] += xb->d * (s0 * (float)p[0] + s1 * (float)p[1]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = 0.0f + accf[r];
}

static inline __attribute__((always_inline)) void dot_q4k(const BlockQ4K* w, const BlockX* x, int nsb, int R, float* out) {
    if (R == 4) dot_q45k((const uint8_t*)w, sizeof(BlockQ4K), nsb, x, 0, 4, out);
    else dot_q45k((const uint8_t*)w, sizeof(BlockQ4K), nsb, x, 0, 1, out);
}

static inline __attribute__((always_inline)) void dot_q5k(const BlockQ5K* w, const BlockX* x, int nsb, int R, float* out) {
    if (R == 4) dot_q45k((const uint8_t*)w, sizeof(BlockQ5K), nsb, x, 1, 4, out);
    else dot_q45k((const uint8_t*)w, sizeof(BlockQ5K), nsb, x, 1, 1, out);
}

static inline __attribute__((always_inline)) void dot_q6k(const BlockQ6K* w, const BlockX* x, int nsb, int R, float* out) {
    if (R == 4) dot_q6k_rows(w, x, nsb, 4, out);
    else dot_q6k_rows(w, x, nsb, 1, out);
}

/* ---- the dot and pair strategies (kinds.h) ---- */
static inline __attribute__((always_inline)) void row_q4_0(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) dot_q4_0((const BlockQ4_0*)w, x, nb, 4, out);
    else dot_q4_0((const BlockQ4_0*)w, x, nb, 1, out);
}
static inline __attribute__((always_inline)) void row_q4_1(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) dot_q4((const BlockQ4_1*)w, x, nb, 4, out);
    else dot_q4((const BlockQ4_1*)w, x, nb, 1, out);
}
static inline __attribute__((always_inline)) void row_q8_0(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) dot_q8((const BlockQ8_0*)w, x, nb, 4, out);
    else dot_q8((const BlockQ8_0*)w, x, nb, 1, out);
}
/* has_m a constant at each call: the unpacking specialises */
static inline __attribute__((always_inline)) void row_q5_0(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) dot_q5(w, sizeof(BlockQ5_0), 0, x, nb, 4, out);
    else dot_q5(w, sizeof(BlockQ5_0), 0, x, nb, 1, out);
}
static inline __attribute__((always_inline)) void row_q5_1(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    if (R == 4) dot_q5(w, sizeof(BlockQ5_1), 1, x, nb, 4, out);
    else dot_q5(w, sizeof(BlockQ5_1), 1, x, nb, 1, out);
}
static inline __attribute__((always_inline)) void row_q4_k(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    dot_q4k((const BlockQ4K*)w, x, nb / 8, R, out);
}
static inline __attribute__((always_inline)) void row_q5_k(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    dot_q5k((const BlockQ5K*)w, x, nb / 8, R, out);
}
static inline __attribute__((always_inline)) void row_q6_k(const uint8_t* w, const BlockX* x, int nb, int R, float* out) {
    dot_q6k((const BlockQ6K*)w, x, nb / 8, R, out);
}
static inline __attribute__((always_inline)) void pair_q8_0(const uint8_t* w0, const uint8_t* w1, const BlockX* x, int nb, float* out) {
    dot_q8_1x2((const BlockQ8_0*)w0, (const BlockQ8_0*)w1, x, nb, out);
}

int exo_generic_dot_q4_0(const Run* r) { run_rows(r, row_q4_0); return 0; }
int exo_generic_dot_q4_1(const Run* r) { run_rows(r, row_q4_1); return 0; }
int exo_generic_dot_q8_0(const Run* r) { run_rows(r, row_q8_0); return 0; }
int exo_generic_dot_q5_0(const Run* r) { run_rows(r, row_q5_0); return 0; }
int exo_generic_dot_q5_1(const Run* r) { run_rows(r, row_q5_1); return 0; }
int exo_generic_dot_q4_k(const Run* r) { run_rows(r, row_q4_k); return 0; }
int exo_generic_dot_q5_k(const Run* r) { run_rows(r, row_q5_k); return 0; }
int exo_generic_dot_q6_k(const Run* r) { run_rows(r, row_q6_k); return 0; }
int exo_generic_pair_q8_0(const Run* r) { run_pairs(r, pair_q8_0); return 0; }
int exo_generic_pair_q5_0(const Run* r) { run_pairs(r, dot_q5_0_1x2); return 0; }
