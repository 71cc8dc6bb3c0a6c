/* Dot products of one q4 / q8 weight row with R activation rows (R = 1 or 4: the weights are
 * unpacked once for all R), included by linear.c.
 *
 *   q4 (GGUF Q4_1): w = d q + m, q in 0..15; byte j of a block holds element j in its low
 *       nibble and element j + 16 in its high one. A block's dot product with x = d_x q_x:
 *       sum_j w_j x_j = d d_x sum_j q_j q_xj + m (d_x sum_j q_xj) = d d_x isum + m s_x
 *   q8 (GGUF Q8_0): w = d q, q in -127..127: sum_j w_j x_j = d d_x sum_j q_j q_xj
 *   Q5_0 / Q5_1: q in 0..31 (a fifth bit from qh), w = d q + m with m = -16 d for Q5_0: the
 *       same sum as q4, d d_x isum + m s_x
 */
#include "exo_kernels.h"

#if EXO_AVX2
/* sum_j a_j b_j of 32 int16 pairs, as 8 int32 lanes */
static inline __m256i madd32(__m256i a0, __m256i a1, const int16_t* b) {
    return _mm256_add_epi32(_mm256_madd_epi16(a0, _mm256_loadu_si256((const __m256i*)b)),
                            _mm256_madd_epi16(a1, _mm256_loadu_si256((const __m256i*)(b + 16))));
}
#endif

#if EXO_AVX2
/* Accumulators: U independent chains per activation row (an FMA's latency is ~4 cycles, a
 * block's work ~2-3: one row with a single chain would wait on it), R rows. */
#define EXO_CHAINS(R) ((R) == 1 ? 2 : 1)

#define DEFINE_DOT_Q4(R)                                                                          \
static inline void dot_q4_##R(const BlockQ4* w, const BlockX* x, int nb, float* out) {          \
    enum { U = EXO_CHAINS(R) };                                                                  \
    const __m256i low = _mm256_set1_epi16(0x0F);                                                 \
    __m256 acc[R * U];                                                                           \
    float accm[R * U];                                                                           \
    for (int r = 0; r < R * U; r++) { acc[r] = _mm256_setzero_ps(); accm[r] = 0.0f; }            \
    for (int b0 = 0; b0 < nb; b0 += U)                                                           \
    for (int u = 0; u < U && b0 + u < nb; u++) {                                                 \
        const int b = b0 + u;                                                                    \
        const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)w[b].qs));    \
        const __m256i q0 = _mm256_and_si256(bytes, low);                                         \
        const __m256i q1 = _mm256_srli_epi16(bytes, 4);                                          \
        const float d = exo_h2f(w[b].d), m = exo_h2f(w[b].m);                                    \
        for (int r = 0; r < R; r++) {                                                            \
            const BlockX* xb = x + (size_t)r * nb + b;                                           \
            const __m256i p = madd32(q0, q1, xb->qs);                                            \
            acc[r * U + u] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r * U + u]); \
            accm[r * U + u] += m * xb->s;                                                        \
        }                                                                                        \
    }                                                                                            \
    for (int r = 0; r < R; r++) {                                                                \
        for (int u = 1; u < U; u++) { acc[r * U] = _mm256_add_ps(acc[r * U], acc[r * U + u]); accm[r * U] += accm[r * U + u]; } \
        out[r] = exo_hsum8(acc[r * U]) + accm[r * U];                                            \
    }                                                                                            \
}

#define DEFINE_DOT_Q8(R)                                                                          \
static inline void dot_q8_##R(const BlockQ8* w, const BlockX* x, int nb, float* out) {          \
    enum { U = EXO_CHAINS(R) };                                                                  \
    __m256 acc[R * U];                                                                           \
    for (int r = 0; r < R * U; r++) acc[r] = _mm256_setzero_ps();                                \
    for (int b0 = 0; b0 < nb; b0 += U)                                                           \
    for (int u = 0; u < U && b0 + u < nb; u++) {                                                 \
        const int b = b0 + u;                                                                    \
        const __m256i q0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w[b].qs));      \
        const __m256i q1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w[b].qs + 16))); \
        const float d = exo_h2f(w[b].d);                                                         \
        for (int r = 0; r < R; r++) {                                                            \
            const BlockX* xb = x + (size_t)r * nb + b;                                           \
            const __m256i p = madd32(q0, q1, xb->qs);                                            \
            acc[r * U + u] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r * U + u]); \
        }                                                                                        \
    }                                                                                            \
    for (int r = 0; r < R; r++) {                                                                \
        for (int u = 1; u < U; u++) acc[r * U] = _mm256_add_ps(acc[r * U], acc[r * U + u]);      \
        out[r] = exo_hsum8(acc[r * U]);                                                          \
    }                                                                                            \
}
#else
/* Plain C: the weights are unpacked once per block into int16, then integer dot products. */
/* acc[r] += block b of row r (xb + r * nb) dotted with the unpacked weights q, scaled: w = d q + m */
static inline void dot_block_rows(const int16_t* q, float d, float m, const BlockX* xb, int nb, int R,
                                  float* acc) {
    for (int r = 0; r < R; r++, xb += nb) {
        int32_t isum = 0;
        for (int j = 0; j < QK; j++) isum += (int32_t)q[j] * xb->qs[j];
        acc[r] += d * xb->d * (float)isum + m * xb->s;
    }
}
#define DEFINE_DOT_Q4(R)                                                                          \
static inline void dot_q4_##R(const BlockQ4* w, const BlockX* x, int nb, float* out) {          \
    float acc[R];                                                                                \
    for (int r = 0; r < R; r++) acc[r] = 0.0f;                                                   \
    for (int b = 0; b < nb; b++) {                                                               \
        int16_t q[QK];                                                                           \
        for (int j = 0; j < 16; j++) {                                                           \
            q[j] = (int16_t)(w[b].qs[j] & 15);                                                   \
            q[j + 16] = (int16_t)(w[b].qs[j] >> 4);                                              \
        }                                                                                        \
        const float d = exo_h2f(w[b].d), m = exo_h2f(w[b].m);                                    \
        dot_block_rows(q, d, m, x + b, nb, R, acc);                                              \
    }                                                                                            \
    for (int r = 0; r < R; r++) out[r] = acc[r];                                                 \
}

#define DEFINE_DOT_Q8(R)                                                                          \
static inline void dot_q8_##R(const BlockQ8* w, const BlockX* x, int nb, float* out) {          \
    float acc[R];                                                                                \
    for (int r = 0; r < R; r++) acc[r] = 0.0f;                                                   \
    for (int b = 0; b < nb; b++) {                                                               \
        const float d = exo_h2f(w[b].d);                                                         \
        for (int r = 0; r < R; r++) {                                                            \
            const BlockX* xb = x + (size_t)r * nb + b;                                           \
            int32_t isum = 0;                                                                    \
            for (int j = 0; j < QK; j++) isum += (int32_t)w[b].qs[j] * xb->qs[j];                \
            acc[r] += d * xb->d * (float)isum;                                                   \
        }                                                                                        \
    }                                                                                            \
    for (int r = 0; r < R; r++) out[r] = acc[r];                                                 \
}
#endif

/* Q5_0 (has_m 0: m = -16 d) and Q5_1 blocks of `stride` bytes: {f16 d, [f16 m], qh[4], qs[16]}. */
#if EXO_AVX2
#define DEFINE_DOT_Q5(R)                                                                          \
static inline void dot_q5_##R(const uint8_t* w, size_t stride, int has_m, const BlockX* x,       \
                              int nb, float* out) {                                              \
    enum { U = EXO_CHAINS(R) };                                                                  \
    const __m256i low = _mm256_set1_epi16(0x0F), sixteen = _mm256_set1_epi16(16);                \
    const __m256i minus16 = _mm256_set1_epi16(-16);                                              \
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,     \
                                          4096, 8192, 16384, (short)0x8000);                     \
    __m256 acc[R * U];                                                                           \
    float accm[R * U];                                                                           \
    for (int r = 0; r < R * U; r++) { acc[r] = _mm256_setzero_ps(); accm[r] = 0.0f; }            \
    const size_t hq = has_m ? 4 : 2;                                                             \
    for (int b0 = 0; b0 < nb; b0 += U)                                                           \
    for (int u = 0; u < U && b0 + u < nb; u++) {                                                 \
        const uint8_t* blk = w + (size_t)(b0 + u) * stride;                                      \
        uint16_t d16, m16;                                                                       \
        uint32_t qh;                                                                             \
        memcpy(&d16, blk, 2);                                                                    \
        memcpy(&m16, blk + 2, 2);                                                                \
        memcpy(&qh, blk + hq, 4);                                                                \
        const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(blk + hq + 4))); \
        const __m256i h0 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(qh & 0xFFFF)), bit), bit); \
        const __m256i h1 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(qh >> 16)), bit), bit); \
        /* Q5_1: q = nib | 16 h, plus m s_x; Q5_0: q - 16 = nib + (h ? 0 : -16) as signed int16 */ \
        const __m256i n0 = _mm256_and_si256(bytes, low), n1 = _mm256_srli_epi16(bytes, 4);       \
        const __m256i q0 = has_m ? _mm256_or_si256(n0, _mm256_and_si256(h0, sixteen))            \
                                 : _mm256_add_epi16(n0, _mm256_andnot_si256(h0, minus16));        \
        const __m256i q1 = has_m ? _mm256_or_si256(n1, _mm256_and_si256(h1, sixteen))            \
                                 : _mm256_add_epi16(n1, _mm256_andnot_si256(h1, minus16));        \
        const float d = exo_h2f(d16);                                                            \
        for (int r = 0; r < R; r++) {                                                            \
            const BlockX* xb = x + (size_t)r * nb + b0 + u;                                      \
            const __m256i p = madd32(q0, q1, xb->qs);                                            \
            acc[r * U + u] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r * U + u]); \
            if (has_m) accm[r * U + u] += exo_h2f(m16) * xb->s;                                  \
        }                                                                                        \
    }                                                                                            \
    for (int r = 0; r < R; r++) {                                                                \
        for (int u = 1; u < U; u++) { acc[r * U] = _mm256_add_ps(acc[r * U], acc[r * U + u]); accm[r * U] += accm[r * U + u]; } \
        out[r] = exo_hsum8(acc[r * U]) + accm[r * U];                                            \
    }                                                                                            \
}
#else
#define DEFINE_DOT_Q5(R)                                                                          \
static inline void dot_q5_##R(const uint8_t* w, size_t stride, int has_m, const BlockX* x,       \
                              int nb, float* out) {                                              \
    float acc[R];                                                                                \
    for (int r = 0; r < R; r++) acc[r] = 0.0f;                                                   \
    const size_t hq = has_m ? 4 : 2;                                                             \
    for (int b = 0; b < nb; b++) {                                                               \
        const uint8_t* blk = w + (size_t)b * stride;                                             \
        uint16_t d16, m16;                                                                       \
        uint32_t qh;                                                                             \
        memcpy(&d16, blk, 2);                                                                    \
        memcpy(&m16, blk + 2, 2);                                                                \
        memcpy(&qh, blk + hq, 4);                                                                \
        const uint8_t* qs = blk + hq + 4;                                                        \
        int16_t q[QK];                                                                           \
        for (int j = 0; j < 16; j++) {                                                           \
            q[j] = (int16_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));                             \
            q[j + 16] = (int16_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));                 \
        }                                                                                        \
        const float d = exo_h2f(d16), m = has_m ? exo_h2f(m16) : -16.0f * d;                     \
        dot_block_rows(q, d, m, x + b, nb, R, acc);                                              \
    }                                                                                            \
    for (int r = 0; r < R; r++) out[r] = acc[r];                                                 \
}
#endif

DEFINE_DOT_Q4(1)
DEFINE_DOT_Q4(4)
DEFINE_DOT_Q8(1)
DEFINE_DOT_Q8(4)
DEFINE_DOT_Q5(1)
DEFINE_DOT_Q5(4)

/* Two q8 weight rows against one activation row (decode): the activation blocks are loaded
 * once for both, and each row keeps its own chain; one reduction for both sums. */
static inline void dot_q8_1x2(const BlockQ8* w0, const BlockQ8* w1, const BlockX* x, int nb, float* out) {
#if EXO_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i*)x[b].qs);
        const __m256i x1 = _mm256_loadu_si256((const __m256i*)(x[b].qs + 16));
        const __m256i p0 = _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w0[b].qs)), x0),
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w0[b].qs + 16))), x1));
        const __m256i p1 = _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w1[b].qs)), x0),
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w1[b].qs + 16))), x1));
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(exo_h2f(w0[b].d) * x[b].d), _mm256_cvtepi32_ps(p0), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(exo_h2f(w1[b].d) * x[b].d), _mm256_cvtepi32_ps(p1), a1);
    }
    /* both horizontal sums at once: [a0 | a1] pairwise */
    const __m256 h = _mm256_hadd_ps(a0, a1); /* a0 01 23, a1 01 23 | a0 45 67, a1 45 67 */
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 r = _mm_hadd_ps(q, q); /* a0, a1, a0, a1 */
    out[0] = _mm_cvtss_f32(r);
    out[1] = _mm_cvtss_f32(_mm_shuffle_ps(r, r, 1));
#else
    dot_q8_1(w0, x, nb, out);
    dot_q8_1(w1, x, nb, out + 1);
#endif
}

/* Two Q5_0 weight rows against one activation row (decode), as dot_q8_1x2. */
static inline void dot_q5_0_1x2(const uint8_t* w0, const uint8_t* w1, const BlockX* x, int nb, float* out) {
#if EXO_AVX2
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
            const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(q0, x0), _mm256_madd_epi16(q1, x1));
            a[r] = _mm256_fmadd_ps(_mm256_set1_ps(exo_h2f(d16) * x[b].d), _mm256_cvtepi32_ps(p), a[r]);
        }
    }
    const __m256 h = _mm256_hadd_ps(a[0], a[1]);
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 r = _mm_hadd_ps(q, q);
    out[0] = _mm_cvtss_f32(r);
    out[1] = _mm_cvtss_f32(_mm_shuffle_ps(r, r, 1));
#else
    dot_q5_1(w0, sizeof(BlockQ5_0), 0, x, nb, out);
    dot_q5_1(w1, sizeof(BlockQ5_0), 0, x, nb, out + 1);
#endif
}
