/* Dot products of one q4 / q8 weight row with R activation rows (R = 1 or 4: the weights are
 * unpacked once for all R), AVX2.
 *
 *   q4 (GGUF Q4_1): w = d q + m, q in 0..15; byte j of a block holds element j in its low
 *       nibble and element j + 16 in its high one. A block's dot product with x = d_x q_x:
 *       sum_j w_j x_j = d d_x sum_j q_j q_xj + m (d_x sum_j q_xj) = d d_x isum + m s_x
 *   Q4_0: w = d (q - 8): the signed values' sum d d_x sum_j (q_j - 8) q_xj, no offset term
 *   q8 (GGUF Q8_0): w = d q, q in -127..127: sum_j w_j x_j = d d_x sum_j q_j q_xj
 *   Q5_0 / Q5_1: q in 0..31 (a fifth bit from qh), w = d q + m with m = -16 d for Q5_0: the
 *       same sum as q4, d d_x isum + m s_x
 */
#include "exo_kernels.h"
#if EXO_AVX2
#include "arch/x86/x86.h"
#include "kinds.h"
#include "quants.h"

/* R = 1 or 4 activation rows (a constant at each call: the loops unroll, the arrays stay in
 * registers). Accumulators: U independent chains per activation row (an FMA's latency is ~4
 * cycles, a block's work ~2-3: one row with a single chain would wait on it). */

static inline __attribute__((always_inline)) void dot_q4(const BlockQ4_1* w, const BlockX* x, int nb, int R, float* out) {
    const int U = R == 1 ? 2 : 1;
    const __m256i low = _mm256_set1_epi16(0x0F);
    __m256 acc[4];
    float accm[4];
    for (int r = 0; r < R * U; r++) { acc[r] = _mm256_setzero_ps(); accm[r] = 0.0f; }
    for (int b0 = 0; b0 < nb; b0 += U)
    for (int u = 0; u < U && b0 + u < nb; u++) {
        const int b = b0 + u;
        const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)w[b].qs));
        const __m256i q0 = _mm256_and_si256(bytes, low);
        const __m256i q1 = _mm256_srli_epi16(bytes, 4);
        const float d = exo_h2f(w[b].d), m = exo_h2f(w[b].m);
        for (int r = 0; r < R; r++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            const __m256i p = madd32(q0, q1, xb->qs);
            acc[r * U + u] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r * U + u]);
            accm[r * U + u] += m * xb->s;
        }
    }
    for (int r = 0; r < R; r++) {
        for (int u = 1; u < U; u++) { acc[r * U] = _mm256_add_ps(acc[r * U], acc[r * U + u]); accm[r * U] += accm[r * U + u]; }
        out[r] = exo_hsum8(acc[r * U]) + accm[r * U];
    }
}

/* Q4_0: w = d (q - 8): the nibbles less 8 as signed int16, no offset term. */
static inline __attribute__((always_inline)) void dot_q4_0(const BlockQ4_0* w, const BlockX* x, int nb, int R, float* out) {
    const int U = R == 1 ? 2 : 1;
    const __m256i low = _mm256_set1_epi16(0x0F), eight = _mm256_set1_epi16(8);
    __m256 acc[4];
    for (int r = 0; r < R * U; r++) acc[r] = _mm256_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += U)
    for (int u = 0; u < U && b0 + u < nb; u++) {
        const int b = b0 + u;
        const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)w[b].qs));
        const __m256i q0 = _mm256_sub_epi16(_mm256_and_si256(bytes, low), eight);
        const __m256i q1 = _mm256_sub_epi16(_mm256_srli_epi16(bytes, 4), eight);
        const float d = exo_h2f(w[b].d);
        for (int r = 0; r < R; r++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            const __m256i p = madd32(q0, q1, xb->qs);
            acc[r * U + u] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r * U + u]);
        }
    }
    for (int r = 0; r < R; r++) {
        for (int u = 1; u < U; u++) acc[r * U] = _mm256_add_ps(acc[r * U], acc[r * U + u]);
        out[r] = exo_hsum8(acc[r * U]);
    }
}

static inline __attribute__((always_inline)) void dot_q8(const BlockQ8_0* w, const BlockX* x, int nb, int R, float* out) {
    const int U = R == 1 ? 2 : 1;
    __m256 acc[4];
    for (int r = 0; r < R * U; r++) acc[r] = _mm256_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += U)
    for (int u = 0; u < U && b0 + u < nb; u++) {
        const int b = b0 + u;
        const __m256i q0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w[b].qs));
        const __m256i q1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w[b].qs + 16)));
        const float d = exo_h2f(w[b].d);
        for (int r = 0; r < R; r++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            const __m256i p = madd32(q0, q1, xb->qs);
            acc[r * U + u] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r * U + u]);
        }
    }
    for (int r = 0; r < R; r++) {
        for (int u = 1; u < U; u++) acc[r * U] = _mm256_add_ps(acc[r * U], acc[r * U + u]);
        out[r] = exo_hsum8(acc[r * U]);
    }
}

/* Q5_0 (has_m 0: m = -16 d) and Q5_1 blocks of `stride` bytes: {f16 d, [f16 m], qh[4], qs[16]}. */
static inline __attribute__((always_inline)) void dot_q5(const uint8_t* w, size_t stride, int has_m, const BlockX* x, int nb, int R, float* out) {
    const int U = R == 1 ? 2 : 1;
    const __m256i low = _mm256_set1_epi16(0x0F), sixteen = _mm256_set1_epi16(16);
    const __m256i minus16 = _mm256_set1_epi16(-16);
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                          4096, 8192, 16384, (short)0x8000);
    __m256 acc[4];
    float accm[4];
    for (int r = 0; r < R * U; r++) { acc[r] = _mm256_setzero_ps(); accm[r] = 0.0f; }
    const size_t hq = has_m ? 4 : 2;
    for (int b0 = 0; b0 < nb; b0 += U)
    for (int u = 0; u < U && b0 + u < nb; u++) {
        const uint8_t* blk = w + (size_t)(b0 + u) * stride;
        uint16_t d16, m16;
        uint32_t qh;
        memcpy(&d16, blk, 2);
        memcpy(&m16, blk + 2, 2);
        memcpy(&qh, blk + hq, 4);
        const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(blk + hq + 4)));
        const __m256i h0 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(qh & 0xFFFF)), bit), bit);
        const __m256i h1 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(qh >> 16)), bit), bit);
        /* Q5_1: q = nib | 16 h, plus m s_x; Q5_0: q - 16 = nib + (h ? 0 : -16) as signed int16 */
        const __m256i n0 = _mm256_and_si256(bytes, low), n1 = _mm256_srli_epi16(bytes, 4);
        const __m256i q0 = has_m ? _mm256_or_si256(n0, _mm256_and_si256(h0, sixteen))
                                 : _mm256_add_epi16(n0, _mm256_andnot_si256(h0, minus16));
        const __m256i q1 = has_m ? _mm256_or_si256(n1, _mm256_and_si256(h1, sixteen))
                                 : _mm256_add_epi16(n1, _mm256_andnot_si256(h1, minus16));
        const float d = exo_h2f(d16);
        for (int r = 0; r < R; r++) {
            const BlockX* xb = x + (size_t)r * nb + b0 + u;
            const __m256i p = madd32(q0, q1, xb->qs);
            acc[r * U + u] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r * U + u]);
            if (has_m) accm[r * U + u] += exo_h2f(m16) * xb->s;
        }
    }
    for (int r = 0; r < R; r++) {
        for (int u = 1; u < U; u++) { acc[r * U] = _mm256_add_ps(acc[r * U], acc[r * U + u]); accm[r * U] += accm[r * U + u]; }
        out[r] = exo_hsum8(acc[r * U]) + accm[r * U];
    }
}


/* Two q8 weight rows against one activation row (decode): the activation blocks are loaded
 * once for both, and each row keeps its own chain; one reduction for both sums. */
static inline void dot_q8_1x2(const BlockQ8_0* w0, const BlockQ8_0* w1, const BlockX* x, int nb, float* out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i*)x[b].qs);
        const __m256i x1 = _mm256_loadu_si256((const __m256i*)(x[b].qs + 16));
        const __m256i p0 =
            dp16(_mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w0[b].qs)), x0),
                 _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w0[b].qs + 16))), x1);
        const __m256i p1 =
            dp16(_mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w1[b].qs)), x0),
                 _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w1[b].qs + 16))), x1);
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(exo_h2f(w0[b].d) * x[b].d), _mm256_cvtepi32_ps(p0), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(exo_h2f(w1[b].d) * x[b].d), _mm256_cvtepi32_ps(p1), a1);
    }
    /* both horizontal sums at once: [a0 | a1] pairwise */
    const __m256 h = _mm256_hadd_ps(a0, a1); /* a0 01 23, a1 01 23 | a0 45 67, a1 45 67 */
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 r = _mm_hadd_ps(q, q); /* a0, a1, a0, a1 */
    out[0] = _mm_cvtss_f32(r);
    out[1] = _mm_cvtss_f32(_mm_shuffle_ps(r, r, 1));
}

/* Two Q5_0 weight rows against one activation row (decode), as dot_q8_1x2. */
static inline void dot_q5_0_1x2(const uint8_t* w0, const uint8_t* w1, const BlockX* x, int nb, float* out) {
    const __m256i low = _mm256_set1_epi16(0x0F), minus16 = _mm256_set1_epi16(-16);
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                          4096, 8192, 16384, (short)0x8000);
    __m256 a[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int b = 0; b < nb; b++) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i*)x[b].qs);
        const __m256i x1 = _mm256_loadu_si256((const __m256i*)(x[b].qs + 16));
        for (int r = 0; r < 2; r++) {
            const uint8_t* blk = (r ? w1 : w0) + (size_t)b * sizeof(BlockQ5_0);
            uint16_t d16;
            uint32_t qh;
            memcpy(&d16, blk, 2);
            memcpy(&qh, blk + 2, 4);
            const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(blk + 6)));
            const __m256i h0 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(qh & 0xFFFF)), bit), bit);
            const __m256i h1 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(qh >> 16)), bit), bit);
            const __m256i q0 = _mm256_add_epi16(_mm256_and_si256(bytes, low), _mm256_andnot_si256(h0, minus16));
            const __m256i q1 = _mm256_add_epi16(_mm256_srli_epi16(bytes, 4), _mm256_andnot_si256(h1, minus16));
            const __m256i p = dp16(_mm256_madd_epi16(q0, x0), q1, x1);
            a[r] = _mm256_fmadd_ps(_mm256_set1_ps(exo_h2f(d16) * x[b].d), _mm256_cvtepi32_ps(p), a[r]);
        }
    }
    const __m256 h = _mm256_hadd_ps(a[0], a[1]);
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 r = _mm_hadd_ps(q, q);
    out[0] = _mm_cvtss_f32(r);
    out[1] = _mm_cvtss_f32(_mm_shuffle_ps(r, r, 1));
}

/* K-quant dot products (llama.cpp's super-blocks of 256 values) against one activation row,
 * read from the file's bytes as they are (AVX2).
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
 * blocks of 32, nb = 8 nsb; R a constant at each call): each sub-block is unpacked once for all R
 * rows. U accumulator chains per row (two for one row: an FMA's latency exceeds a sub-block's
 * work). */
static inline __attribute__((always_inline)) void dot_q45k(const uint8_t* base, size_t stride, int nsb,
                                                           const BlockX* x, int five, int R, float* out) {
    const int U = R == 1 ? 2 : 1;
    const int nb = nsb * 8;
    float accf[4], accm[4];
    const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256 acc[4];
    for (int i = 0; i < R * U; i++) acc[i] = _mm256_setzero_ps();
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
        const __m256i vqh = five ? _mm256_loadu_si256((const __m256i*)qh) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
            const __m256i nib[2] = {_mm256_and_si256(bytes, low), _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low)};
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h;
                int sc, m;
                q4k_scale_min(scales, j, &sc, &m);
                /* the sub-block's 32 values widened to int16 once: a (values 0..15), b (16..31) */
                __m256i q = nib[h];
                if (five) {
                    const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(vqh, j), one);
                    q = _mm256_or_si256(q, _mm256_slli_epi16(hb, 4));
                }
                const __m256i qa = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(q));
                const __m256i qb = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1));
                const float dsc = d * (float)sc;
                for (int r = 0; r < R; r++) {
                    const BlockX* xb = x + (size_t)r * nb + (size_t)s * 8 + j;
                    const int i = r * U + (h & (U - 1));
                    acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(dsc * xb->d), _mm256_cvtepi32_ps(madd32(qa, qb, xb->qs)),
                                             acc[i]);
                    accm[r] -= dmin * (float)m * xb->s;
                }
            }
        }
    }
    for (int r = 0; r < R; r++) {
        float f = 0.0f;
        for (int u = 0; u < U; u++) f += accf[r * U + u] + exo_hsum8(acc[r * U + u]);
        out[r] = f + accm[r];
    }
}

/* Q6_K against R = 1 or 4 activation rows (each row has two chains: the halves of a 32-value
 * group; values 0..15 have scale s0, 16..31 scale s1). */
static inline __attribute__((always_inline)) void dot_q6k_rows(const BlockQ6K* w, const BlockX* x, int nsb, int R,
                                                               float* out) {
    const int nb = nsb * 8;
    float accf[4];
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
    const __m256i off = _mm256_set1_epi8(32);
    __m256 acc[8];
    for (int i = 0; i < 2 * R; i++) acc[i] = _mm256_setzero_ps();
    for (int r = 0; r < R; r++) accf[r] = 0.0f;
    for (int s = 0; s < nsb; s++) {
        const float d = exo_h2f(w[s].d);
        for (int g = 0; g < 8; g++) {
            const int n = g / 4, k = g % 4;
            const uint8_t* ql = w[s].ql + 64 * n + 32 * (k & 1);
            const uint8_t* qh = w[s].qh + 32 * n;
            const float s0 = d * (float)w[s].scales[2 * g], s1 = d * (float)w[s].scales[2 * g + 1];
            const __m256i vl = _mm256_loadu_si256((const __m256i*)ql);
            const __m256i vh = _mm256_loadu_si256((const __m256i*)qh);
            const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(vl, 4) : vl, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(vh, 2 * k), m2);
            const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), off);
            const __m256i qa = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
            const __m256i qb = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
            for (int r = 0; r < R; r++) {
                const BlockX* xb = x + (size_t)r * nb + (size_t)s * 8 + g;
                const __m256i p0 = _mm256_madd_epi16(qa, _mm256_loadu_si256((const __m256i*)xb->qs));
                const __m256i p1 = _mm256_madd_epi16(qb, _mm256_loadu_si256((const __m256i*)(xb->qs + 16)));
                acc[2 * r] = _mm256_fmadd_ps(_mm256_set1_ps(s0 * xb->d), _mm256_cvtepi32_ps(p0), acc[2 * r]);
                acc[2 * r + 1] = _mm256_fmadd_ps(_mm256_set1_ps(s1 * xb->d), _mm256_cvtepi32_ps(p1), acc[2 * r + 1]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = 0.0f + (accf[r] + exo_hsum8(_mm256_add_ps(acc[2 * r], acc[2 * r + 1])));
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
/* (out of line: measured ~8% faster so in the shared library) */
static __attribute__((noinline)) void pair_q8_0(const uint8_t* w0, const uint8_t* w1, const BlockX* x, int nb, float* out) {
    dot_q8_1x2((const BlockQ8_0*)w0, (const BlockQ8_0*)w1, x, nb, out);
}

int exo_x86_dot_q4_0(const Run* r) { run_rows(r, row_q4_0); return 0; }
int exo_x86_dot_q4_1(const Run* r) { run_rows(r, row_q4_1); return 0; }
int exo_x86_dot_q8_0(const Run* r) { run_rows(r, row_q8_0); return 0; }
int exo_x86_dot_q5_0(const Run* r) { run_rows(r, row_q5_0); return 0; }
int exo_x86_dot_q5_1(const Run* r) { run_rows(r, row_q5_1); return 0; }
int exo_x86_dot_q4_k(const Run* r) { run_rows(r, row_q4_k); return 0; }
int exo_x86_dot_q5_k(const Run* r) { run_rows(r, row_q5_k); return 0; }
int exo_x86_dot_q6_k(const Run* r) { run_rows(r, row_q6_k); return 0; }
int exo_x86_pair_q8_0(const Run* r) { run_pairs(r, pair_q8_0); return 0; }
int exo_x86_pair_q5_0(const Run* r) { run_pairs(r, dot_q5_0_1x2); return 0; }
#endif
