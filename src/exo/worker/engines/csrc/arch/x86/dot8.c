/* AVX2 / AVX-VNNI / AVX-512 VNNI dots of 4-bit weights with 8-bit activations (ACT_X8): unsigned
 * nibbles x signed int8 by vpmaddubsw + vpmaddwd (AVX2) or vpdpbusd (VNNI builds), an exact
 * integer sum per block, then the float order of act8.h (the generic dots' in act8.c). */
#include "act8.h"

#if EXO_AVX2
#include "x86.h"

/* a Q4 block's 32 nibbles as bytes, in value order */
static inline __m256i unpack_nibbles(const uint8_t* qs) {
    const __m128i b = _mm_loadu_si128((const __m128i*)qs);
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

/* the sum of 8 int32 lanes */
static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* One weight row (nb Q4 blocks; Q4_1 if has_m) against R = 1..4 activation rows (stride nb). */
static inline __attribute__((always_inline)) void row_dot(const uint8_t* w, const BlockX8* x, int nb, int R,
                                                          int has_m, float* out) {
    float acc[4] = {0};
    for (int b = 0; b < nb; b++) {
        float d, m;
        __m256i wv;
        if (has_m) {
            const BlockQ4_1* wb = (const BlockQ4_1*)w + b;
            d = exo_h2f(wb->d), m = q4_1_min(wb), wv = unpack_nibbles(wb->qs);
        } else {
            const BlockQ4_0* wb = (const BlockQ4_0*)w + b;
            d = exo_h2f(wb->d), m = q4_0_min(wb), wv = unpack_nibbles(wb->qs);
        }
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
            const int32_t isum = hsum_epi32(x86_dot_u8s8(wv, _mm256_loadu_si256((const __m256i*)xb->qs)));
            acc[r] = act8_step(acc[r], d, m, xb, isum);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

static inline __attribute__((always_inline)) int run_dot8(const Run* r, int has_m) {
    float out[4];
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= 4 ? 4 : 1;
            row_dot(wr, r->x8 + (size_t)m * r->nb, r->nb, R, has_m, out);
            for (int i = 0; i < R; i++) run_store(r, m + i, n, out[i]);
            m += R;
        }
    }
    return 0;
}

/* One Q8_0 weight row against R = 1..4 activation rows: |w| times x with w's sign (exact: x is
 * never -128). */
static inline __attribute__((always_inline)) void row_dot_q8_0(const uint8_t* w, const BlockX8* x, int nb, int R,
                                                               float* out) {
    float acc[4] = {0};
    for (int b = 0; b < nb; b++) {
        const BlockQ8_0* wb = (const BlockQ8_0*)w + b;
        const __m256i wv = _mm256_loadu_si256((const __m256i*)wb->qs), u = _mm256_abs_epi8(wv);
        const float d = exo_h2f(wb->d);
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
            const __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)xb->qs), wv);
            acc[r] = act8_step0(acc[r], d, xb, hsum_epi32(x86_dot_u8s8(u, sx)));
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

int exo_x86_dot8_q8_0(const Run* r) {
    float out[4];
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= 4 ? 4 : 1;
            row_dot_q8_0(wr, r->x8 + (size_t)m * r->nb, r->nb, R, out);
            for (int i = 0; i < R; i++) run_store(r, m + i, n, out[i]);
            m += R;
        }
    }
    return 0;
}

/* One Q4_K weight row against R = 1..4 activation rows: a 32-byte chunk is sub-blocks j (low
 * nibbles) and j + 1 (high), each its own step. */
static inline __attribute__((always_inline)) void row_dot_q4_k(const uint8_t* w, const BlockX8* x, int nb, int R,
                                                               float* out) {
    float acc[4] = {0};
    const __m256i low = _mm256_set1_epi8(15);
    for (int b = 0; b < nb; b += 2) {
        const BlockQ4K* wb = (const BlockQ4K*)w + b / 8;
        const int j = b % 8;
        float d0, m0, d1, m1;
        q4k_sub(wb->scales, wb->d, wb->dmin, j, &d0, &m0);
        q4k_sub(wb->scales, wb->d, wb->dmin, j + 1, &d1, &m1);
        const __m256i v = _mm256_loadu_si256((const __m256i*)(wb->qs + 16 * j));
        const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
            const int32_t i0 = hsum_epi32(x86_dot_u8s8(lo, _mm256_loadu_si256((const __m256i*)xb[0].qs)));
            const int32_t i1 = hsum_epi32(x86_dot_u8s8(hi, _mm256_loadu_si256((const __m256i*)xb[1].qs)));
            acc[r] = act8_step(act8_step(acc[r], d0, m0, xb, i0), d1, m1, xb + 1, i1);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

int exo_x86_dot8_q4_k(const Run* r) {
    float out[4];
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= 4 ? 4 : 1;
            row_dot_q4_k(wr, r->x8 + (size_t)m * r->nb, r->nb, R, out);
            for (int i = 0; i < R; i++) run_store(r, m + i, n, out[i]);
            m += R;
        }
    }
    return 0;
}

/* One Q6_K weight row against R = 1..4 activation rows: a block's 32 values q - 32 as int8, |w|
 * times x with w's sign, each 16-value half (4 lanes) its own step. */
static inline __attribute__((always_inline)) void row_dot_q6_k(const uint8_t* w, const BlockX8* x, int nb, int R,
                                                               float* out) {
    float acc[4] = {0};
    const __m256i low = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    for (int b = 0; b < nb; b++) {
        const BlockQ6K* wb = (const BlockQ6K*)w + b / 8;
        const int g = b % 8, n = g / 4, k = g % 4;
        const __m256i l4 = _mm256_loadu_si256((const __m256i*)(wb->ql + 64 * n + 32 * (k & 1)));
        const __m256i h2 = _mm256_loadu_si256((const __m256i*)(wb->qh + 32 * n));
        const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(l4, 4) : l4, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(h2, 2 * k), three);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), m32);
        const __m256i u = _mm256_abs_epi8(q);
        const float d = exo_h2f(wb->d), d0 = d * (float)wb->scales[2 * g], d1 = d * (float)wb->scales[2 * g + 1];
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
            const __m256i p = x86_dot_u8s8(u, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)xb->qs), q));
            __m128i h0 = _mm256_castsi256_si128(p), h1 = _mm256_extracti128_si256(p, 1);
            h0 = _mm_add_epi32(h0, _mm_shuffle_epi32(h0, 0x4E));
            h1 = _mm_add_epi32(h1, _mm_shuffle_epi32(h1, 0x4E));
            h0 = _mm_add_epi32(h0, _mm_shuffle_epi32(h0, 0xB1));
            h1 = _mm_add_epi32(h1, _mm_shuffle_epi32(h1, 0xB1));
            acc[r] = act8_step0(act8_step0(acc[r], d0, xb, _mm_cvtsi128_si32(h0)), d1, xb, _mm_cvtsi128_si32(h1));
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

int exo_x86_dot8_q6_k(const Run* r) {
    float out[4];
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= 4 ? 4 : 1;
            row_dot_q6_k(wr, r->x8 + (size_t)m * r->nb, r->nb, R, out);
            for (int i = 0; i < R; i++) run_store(r, m + i, n, out[i]);
            m += R;
        }
    }
    return 0;
}

int exo_x86_dot8_q4_0(const Run* r) { return run_dot8(r, 0); }
int exo_x86_dot8_q4_1(const Run* r) { return run_dot8(r, 1); }

#endif
