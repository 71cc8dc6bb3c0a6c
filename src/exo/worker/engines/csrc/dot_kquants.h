/* K-quant dot products (llama.cpp's super-blocks of 256 values) against one activation row,
 * read from the file's bytes as they are; included by linear.c.
 *
 * Q4_K: sub-block j (32 values) is d * sc_j * q - dmin * m_j, q in 0..15; (sc, m) are 6-bit
 *   pairs packed in 12 bytes; 64-value chunk c holds sub-block 2c in the low nibbles of its 32
 *   bytes and 2c + 1 in the high ones.
 * Q5_K: Q4_K with a fifth bit: value l of sub-block j gets 16 * bit j of qh[l].
 * Q6_K: sub-block (16 values) i is d * sc_i * (q - 32), q in 0..63: low 4 bits in ql, high 2
 *   in qh. 32-value group g = 4n + k (half n, quarter k): low bits from ql[64n + 32(k & 1) + l]
 *   (low nibble for k < 2, high for k >= 2), high bits from qh[32n + l] >> 2k.
 */
#include "exo_kernels.h"

static inline void q4k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#if EXO_AVX2
static inline __m256i kq_madd(__m256i q, const BlockX* xb, int is_signed) {
    const __m128i lo16 = _mm256_castsi256_si128(q), hi16 = _mm256_extracti128_si256(q, 1);
    const __m256i a = is_signed ? _mm256_cvtepi8_epi16(lo16) : _mm256_cvtepu8_epi16(lo16);
    const __m256i b = is_signed ? _mm256_cvtepi8_epi16(hi16) : _mm256_cvtepu8_epi16(hi16);
    return _mm256_add_epi32(_mm256_madd_epi16(a, _mm256_loadu_si256((const __m256i*)xb->qs)),
                            _mm256_madd_epi16(b, _mm256_loadu_si256((const __m256i*)(xb->qs + 16))));
}
#else
/* sum_l q_l x_l over one 32-value sub-block */
static inline int32_t kq_isum(const uint8_t* q, const BlockX* xb, int offset) {
    int32_t s = 0;
    for (int l = 0; l < QK; l++) s += ((int32_t)q[l] - offset) * xb->qs[l];
    return s;
}
#endif

/* Q4_K and Q5_K (five: the fifth bit from qh) against R activation rows (x + r * nb blocks of
 * 32, nb = 8 nsb): each sub-block is unpacked once for all R rows. U accumulator chains per row
 * (two for one row: an FMA's latency exceeds a sub-block's work). */
#define DEFINE_DOT_Q45K(R)                                                                        \
static inline void dot_q45k_##R(const uint8_t* base, size_t stride, int nsb, const BlockX* x,   \
                                int five, float* out) {                                          \
    enum { U = (R) == 1 ? 2 : 1 };                                                               \
    const int nb = nsb * 8;                                                                      \
    float accf[R * U], accm[R];                                                                  \
    KQ_AVX2_DECLS(R * U)                                                                         \
    for (int r = 0; r < R; r++) accm[r] = 0.0f;                                                  \
    for (int r = 0; r < R * U; r++) accf[r] = 0.0f;                                              \
    for (int s = 0; s < nsb; s++) {                                                              \
        const uint8_t* blk = base + (size_t)s * stride;                                          \
        uint16_t d16, dmin16;                                                                    \
        memcpy(&d16, blk, 2);                                                                    \
        memcpy(&dmin16, blk + 2, 2);                                                             \
        const float d = exo_h2f(d16), dmin = exo_h2f(dmin16);                                    \
        const uint8_t* scales = blk + 4;                                                         \
        const uint8_t* qh = five ? blk + 16 : NULL;                                              \
        const uint8_t* qs = blk + 16 + (five ? 32 : 0);                                          \
        KQ45_LOAD_QH                                                                             \
        for (int c = 0; c < 4; c++) {                                                            \
            KQ45_LOAD_CHUNK                                                                      \
            for (int h = 0; h < 2; h++) {                                                        \
                const int j = 2 * c + h;                                                         \
                int sc, m;                                                                       \
                q4k_scale_min(scales, j, &sc, &m);                                               \
                KQ45_SUBBLOCK                                                                    \
                for (int r = 0; r < R; r++) {                                                    \
                    const BlockX* xb = x + (size_t)r * nb + (size_t)s * 8 + j;                   \
                    KQ45_ACCUMULATE(r * U + (h & (U - 1)))                                       \
                    accm[r] -= dmin * (float)m * xb->s;                                          \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    for (int r = 0; r < R; r++) {                                                                \
        float f = 0.0f;                                                                          \
        for (int u = 0; u < U; u++) f += KQ_TOTAL(r * U + u);                                    \
        out[r] = f + accm[r];                                                                    \
    }                                                                                            \
}

#if EXO_AVX2
#define KQ_AVX2_DECLS(n)                                                                          \
    const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);                      \
    __m256 acc[n];                                                                               \
    for (int i = 0; i < (n); i++) acc[i] = _mm256_setzero_ps();
#define KQ45_LOAD_QH                                                                              \
    const __m256i vqh = five ? _mm256_loadu_si256((const __m256i*)qh) : _mm256_setzero_si256();
#define KQ45_LOAD_CHUNK                                                                           \
    const __m256i bytes = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));                     \
    const __m256i nib[2] = {_mm256_and_si256(bytes, low),                                        \
                            _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low)};
/* the sub-block's 32 values widened to int16 once: a (values 0..15), b (16..31) */
#define KQ45_SUBBLOCK                                                                             \
    __m256i q = nib[h];                                                                          \
    if (five) {                                                                                  \
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(vqh, j), one);                     \
        q = _mm256_or_si256(q, _mm256_slli_epi16(hb, 4));                                        \
    }                                                                                            \
    const __m256i qa = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(q));                          \
    const __m256i qb = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1));                     \
    const float dsc = d * (float)sc;
#define KQ45_ACCUMULATE(i)                                                                        \
    acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(dsc * xb->d), _mm256_cvtepi32_ps(madd32(qa, qb, xb->qs)), acc[i]);
#define KQ_TOTAL(i) (accf[i] + exo_hsum8(acc[i]))
#else
#define KQ_AVX2_DECLS(n)
#define KQ45_LOAD_QH
#define KQ45_LOAD_CHUNK
#define KQ45_SUBBLOCK                                                                             \
    int16_t q[QK];                                                                               \
    for (int l = 0; l < QK; l++) {                                                               \
        const uint8_t v = qs[32 * c + l];                                                        \
        q[l] = (int16_t)(h ? v >> 4 : v & 15);                                                   \
        if (five) q[l] = (int16_t)(q[l] | (((qh[l] >> j) & 1) << 4));                            \
    }                                                                                            \
    const float dsc = d * (float)sc;
#define KQ45_ACCUMULATE(i)                                                                        \
    {                                                                                            \
        int32_t isum = 0;                                                                        \
        for (int l = 0; l < QK; l++) isum += (int32_t)q[l] * xb->qs[l];                          \
        accf[i] += dsc * xb->d * (float)isum;                                                    \
    }
#define KQ_TOTAL(i) (accf[i])
#endif

DEFINE_DOT_Q45K(1)
DEFINE_DOT_Q45K(4)

/* Q6_K against R activation rows (each row has two chains: the halves of a 32-value group). */
#define DEFINE_DOT_Q6K(R)                                                                         \
static inline void dot_q6k_##R(const BlockQ6K* w, const BlockX* x, int nsb, float* out) {       \
    enum { U = 1 };                                                                              \
    const int nb = nsb * 8;                                                                      \
    float accf[R * U];                                                                           \
    KQ6_AVX2_DECLS(R * U)                                                                        \
    for (int r = 0; r < R * U; r++) accf[r] = 0.0f;                                              \
    for (int s = 0; s < nsb; s++) {                                                              \
        const float d = exo_h2f(w[s].d);                                                         \
        for (int g = 0; g < 8; g++) {                                                            \
            const int n = g / 4, k = g % 4;                                                      \
            const uint8_t* ql = w[s].ql + 64 * n + 32 * (k & 1);                                 \
            const uint8_t* qh = w[s].qh + 32 * n;                                                \
            const float s0 = d * (float)w[s].scales[2 * g], s1 = d * (float)w[s].scales[2 * g + 1]; \
            KQ6_GROUP                                                                            \
            for (int r = 0; r < R; r++) {                                                        \
                const BlockX* xb = x + (size_t)r * nb + (size_t)s * 8 + g;                       \
                KQ6_ACCUMULATE(r * U + (g & (U - 1)))                                            \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    for (int r = 0; r < R; r++) {                                                                \
        float f = 0.0f;                                                                          \
        for (int u = 0; u < U; u++) f += KQ6_TOTAL(r * U + u);                                   \
        out[r] = f;                                                                              \
    }                                                                                            \
}

#if EXO_AVX2
/* two chains per accumulator slot: values 0..15 (scale s0) and 16..31 (scale s1) */
#define KQ6_AVX2_DECLS(n)                                                                         \
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);                      \
    const __m256i off = _mm256_set1_epi8(32);                                                    \
    __m256 acc[2 * (n)];                                                                         \
    for (int i = 0; i < 2 * (n); i++) acc[i] = _mm256_setzero_ps();
#define KQ6_GROUP                                                                                 \
    const __m256i vl = _mm256_loadu_si256((const __m256i*)ql);                                   \
    const __m256i vh = _mm256_loadu_si256((const __m256i*)qh);                                   \
    const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(vl, 4) : vl, m4);             \
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(vh, 2 * k), m2);                       \
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), off);       \
    const __m256i qa = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));                          \
    const __m256i qb = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
#define KQ6_ACCUMULATE(i)                                                                         \
    {                                                                                            \
        const __m256i p0 = _mm256_madd_epi16(qa, _mm256_loadu_si256((const __m256i*)xb->qs));    \
        const __m256i p1 = _mm256_madd_epi16(qb, _mm256_loadu_si256((const __m256i*)(xb->qs + 16))); \
        acc[2 * (i)] = _mm256_fmadd_ps(_mm256_set1_ps(s0 * xb->d), _mm256_cvtepi32_ps(p0), acc[2 * (i)]); \
        acc[2 * (i) + 1] = _mm256_fmadd_ps(_mm256_set1_ps(s1 * xb->d), _mm256_cvtepi32_ps(p1), acc[2 * (i) + 1]); \
    }
#define KQ6_TOTAL(i) (accf[i] + exo_hsum8(_mm256_add_ps(acc[2 * (i)], acc[2 * (i) + 1])))
#else
#define KQ6_AVX2_DECLS(n)
#define KQ6_GROUP                                                                                 \
    int16_t q[QK];                                                                               \
    for (int l = 0; l < QK; l++) {                                                               \
        const int lo = (k >= 2 ? ql[l] >> 4 : ql[l]) & 15;                                       \
        const int hi = (qh[l] >> (2 * k)) & 3;                                                   \
        q[l] = (int16_t)((lo | (hi << 4)) - 32);                                                 \
    }
#define KQ6_ACCUMULATE(i)                                                                         \
    {                                                                                            \
        int32_t p[2] = {0, 0};                                                                   \
        for (int l = 0; l < QK; l++) p[l / 16] += (int32_t)q[l] * xb->qs[l];                     \
        accf[i] += xb->d * (s0 * (float)p[0] + s1 * (float)p[1]);                                \
    }
#define KQ6_TOTAL(i) (accf[i])
#endif

DEFINE_DOT_Q6K(1)
DEFINE_DOT_Q6K(4)

static inline void dot_q4k(const BlockQ4K* w, const BlockX* x, int nsb, int R, float* out) {
    if (R == 4) dot_q45k_4((const uint8_t*)w, sizeof(BlockQ4K), nsb, x, 0, out);
    else dot_q45k_1((const uint8_t*)w, sizeof(BlockQ4K), nsb, x, 0, out);
}

static inline void dot_q5k(const BlockQ5K* w, const BlockX* x, int nsb, int R, float* out) {
    if (R == 4) dot_q45k_4((const uint8_t*)w, sizeof(BlockQ5K), nsb, x, 1, out);
    else dot_q45k_1((const uint8_t*)w, sizeof(BlockQ5K), nsb, x, 1, out);
}

static inline void dot_q6k(const BlockQ6K* w, const BlockX* x, int nsb, int R, float* out) {
    if (R == 4) dot_q6k_4(w, x, nsb, out);
    else dot_q6k_1(w, x, nsb, out);
}
