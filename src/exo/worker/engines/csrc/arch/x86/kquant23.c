/* Q2_K and Q3_K dots (kquant23.h), AVX2: a group's 32 values widened to int16 once and scaled by
 * their sub-blocks' scales (vpmullw: |sc q| <= 128), then per activation row one vpmaddwd pair
 * (vpdpwssd in the VNNI builds, x86.h) and one FMA; Q2_K's mins once per super-block against the
 * activation rows' sub-block sums (two vectors of 8). Each row keeps two chains (Q2_K: scales |
 * mins; Q3_K: even | odd groups) at every row count, so R = 1 and R = 4 add the same floats in
 * the same order. */
#include "exo_kernels.h"
#if EXO_AVX2
#include "arch/x86/x86.h"
#include "kinds.h"
#include "kquant23.h"

/* the float order is the one written, in every x86 build (no multiply fused into an add) */
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

/* 2-bit plane j (0..3) of 32 bytes, as bytes 0..3 */
static inline __m256i plane(__m256i bytes, int j) {
    return _mm256_and_si256(_mm256_srli_epi16(bytes, 2 * j), _mm256_set1_epi8(3));
}

/* hs: the R rows' half sums (q2k_half_sums; 16 nsb floats a row) or NULL */
static inline __attribute__((always_inline)) void dot_q2k(const BlockQ2K* w, const BlockX* x, int nsb, int R,
                                                          const float* hs, float* out) {
    const int nb = nsb * 8;
    __m256 acc[4], accm[4];
    for (int r = 0; r < R; r++) acc[r] = accm[r] = _mm256_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const float d = exo_h2f(w[s].d), dmin = exo_h2f(w[s].dmin);
        for (int n = 0; n < 2; n++) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i*)(w[s].qs + 32 * n));
            for (int j = 0; j < 4; j++) {
                const int g = 4 * n + j;
                const __m256i q = plane(bytes, j);
                const __m256i qa = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(q)),
                                                      _mm256_set1_epi16((short)(w[s].scales[2 * g] & 15)));
                const __m256i qb = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1)),
                                                      _mm256_set1_epi16((short)(w[s].scales[2 * g + 1] & 15)));
                for (int r = 0; r < R; r++) {
                    const BlockX* xb = x + (size_t)r * nb + (size_t)s * 8 + g;
                    const __m256 p = _mm256_cvtepi32_ps(madd32(qa, qb, xb->qs));
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), p, acc[r]);
                }
            }
        }
        /* the mins against the sub-blocks' sums: 16 products in two vectors, one FMA */
        const __m128i mins = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i*)w[s].scales), 4),
                                           _mm_set1_epi8(15));
        const __m256 m0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mins));
        const __m256 m1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mins, 8)));
        for (int r = 0; r < R; r++) {
            float own[16];
            const float* h = hs ? hs + (size_t)r * nb * 2 + 16 * s : own;
            if (!hs) q2k_half_sums(x + (size_t)r * nb + (size_t)s * 8, 1, own);
            const __m256 t = _mm256_fmadd_ps(m1, _mm256_loadu_ps(h + 8), _mm256_mul_ps(m0, _mm256_loadu_ps(h)));
            accm[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), t, accm[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = exo_hsum8(acc[r]) - exo_hsum8(accm[r]);
}

/* A Q3_K super-block's 16 signed scales (kquant23.h's q3k_scales) with a few vector ops: low
 * nibbles of bytes 0..7 then their high nibbles; the top bits of scale i from byte 8 + i % 4,
 * shifted by 2 (i / 4). */
static inline void q3k_scales_x86(const uint8_t* s, int16_t* out) {
    uint32_t top;
    memcpy(&top, s + 8, 4);
    const __m128i v = _mm_loadl_epi64((const __m128i*)s);
    const __m128i m4 = _mm_set1_epi8(15);
    const __m128i low = _mm_unpacklo_epi64(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    const __m128i high = _mm_and_si128(_mm_set_epi32((int)(top >> 6), (int)(top >> 4), (int)(top >> 2), (int)top),
                                       _mm_set1_epi8(3));
    const __m128i sc = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
    _mm256_storeu_si256((__m256i*)out, _mm256_cvtepi8_epi16(sc));
}

/* group g's 32 values (q - 4 where bit g of hmask is clear), times their sub-blocks' scales */
static inline __attribute__((always_inline)) void q3k_group(__m256i bytes, __m256i hm, int g, const int16_t* sc,
                                                            __m256i* qa, __m256i* qb) {
    /* bit g of each byte moved to bit 2 (a shift within 16-bit lanes: bit 2 of each byte comes
     * from bit g of the same byte), 4 where it is clear */
    const __m256i h = g >= 2 ? _mm256_srli_epi16(hm, g - 2) : _mm256_slli_epi16(hm, 2 - g);
    const __m256i q = _mm256_sub_epi8(plane(bytes, g % 4), _mm256_andnot_si256(h, _mm256_set1_epi8(4)));
    *qa = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), _mm256_set1_epi16(sc[2 * g]));
    *qb = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)), _mm256_set1_epi16(sc[2 * g + 1]));
}

/* groups in pairs: the even group's products on one chain of each row, the odd one's on another */
static inline __attribute__((always_inline)) void dot_q3k(const BlockQ3K* w, const BlockX* x, int nsb, int R,
                                                          float* out) {
    const int nb = nsb * 8;
    __m256 even[4], odd[4];
    for (int r = 0; r < R; r++) even[r] = odd[r] = _mm256_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const float d = exo_h2f(w[s].d);
        int16_t sc[16];
        q3k_scales_x86(w[s].scales, sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i*)w[s].hmask);
        for (int g = 0; g < 8; g += 2) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i*)(w[s].qs + 32 * (g / 4)));
            __m256i qa0, qb0, qa1, qb1;
            q3k_group(bytes, hm, g, sc, &qa0, &qb0);
            q3k_group(bytes, hm, g + 1, sc, &qa1, &qb1);
            for (int r = 0; r < R; r++) {
                const BlockX* xb = x + (size_t)r * nb + (size_t)s * 8 + g;
                const __m256 p0 = _mm256_cvtepi32_ps(madd32(qa0, qb0, xb[0].qs));
                const __m256 p1 = _mm256_cvtepi32_ps(madd32(qa1, qb1, xb[1].qs));
                even[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb[0].d), p0, even[r]);
                odd[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb[1].d), p1, odd[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = exo_hsum8(_mm256_add_ps(even[r], odd[r]));
}

static inline __attribute__((always_inline)) void row_q3_k(const uint8_t* w, const BlockX* x, int nb, int R,
                                                           float* out) {
    if (R == 4) dot_q3k((const BlockQ3K*)w, x, nb / 8, 4, out);
    else dot_q3k((const BlockQ3K*)w, x, nb / 8, 1, out);
}

int exo_x86_dot_q2_k(const Run* r) { Q2K_RUN_ROWS(r, dot_q2k); return 0; }
int exo_x86_dot_q3_k(const Run* r) { run_rows(r, row_q3_k); return 0; }
#endif
