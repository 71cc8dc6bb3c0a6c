/* issue 22 q5dots: AVX2 / AVX-VNNI / AVX-512 VNNI dots of Q5_0, Q5_1 and Q5_K weights with 8-bit
 * activations, per row (1 or 4 activation rows a pass), in act8_q5.h's order. A block's values
 * 0..31 (nibble | fifth bit << 4) times the int8 activations by vpmaddubsw + vpmaddwd (AVX2) or
 * vpdpbusd (VNNI builds): an exact integer sum, then the scalar float steps. Q5_0's repacked
 * groups: arch/x86/grouped8_q5.c. */
#include "act8_q5.h"

#if EXO_AVX2
#include "arch/x86/x86.h"

/* 8 int32 lanes summing to sum_j w_j x_j (w unsigned <= 31, x in [-127, 127]: no saturation) */
static inline __attribute__((always_inline)) __m256i q5_dot(__m256i w, __m256i x) {
#if EXO_AVX512VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#elif EXO_AVXVNNI
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

static inline int32_t q5_hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* A Q5_0 / Q5_1 block's 32 values as bytes, in value order: byte j = 16 if bit j of qh is set,
 * or'ed with the nibbles. */
static inline __m256i q5_values(const uint8_t qh[4], const uint8_t qs[16]) {
    const __m128i b = _mm_loadu_si128((const __m128i*)qs);
    const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(15));
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)q5_bits(qh)),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                                                2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(16)));
}

/* One Q5_0 (or Q5_1 if has_m) weight row against R = 1 or 4 activation rows (stride nb). */
static inline __attribute__((always_inline)) void row_q5(const uint8_t* w, const BlockX8* x, int nb, int R,
                                                         int has_m, float* out) {
    float acc[4] = {0};
    for (int b = 0; b < nb; b++) {
        float d, m;
        __m256i wv;
        if (has_m) {
            const BlockQ5_1* wb = (const BlockQ5_1*)w + b;
            d = exo_h2f(wb->d), m = exo_h2f(wb->m), wv = q5_values(wb->qh, wb->qs);
        } else {
            const BlockQ5_0* wb = (const BlockQ5_0*)w + b;
            d = exo_h2f(wb->d), m = q5_0_min(wb), wv = q5_values(wb->qh, wb->qs);
        }
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
            acc[r] = act8_step(acc[r], d, m, xb, q5_hsum(q5_dot(wv, _mm256_loadu_si256((const __m256i*)xb->qs))));
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* One Q5_K weight row against R = 1 or 4 activation rows: a 32-byte chunk of nibbles is sub-blocks
 * j (low) and j + 1 (high); bits j and j + 1 of qh's 32 bytes are their fifth bits. */
static inline __attribute__((always_inline)) void row_q5k(const uint8_t* w, const BlockX8* x, int nb, int R,
                                                          float* out) {
    float acc[4] = {0};
    const __m256i low = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int b = 0; b < nb; b += 2) {
        const BlockQ5K* wb = (const BlockQ5K*)w + b / 8;
        const int j = b % 8;
        float d0, m0, d1, m1;
        q5k_sub(wb->scales, wb->d, wb->dmin, j, &d0, &m0);
        q5k_sub(wb->scales, wb->d, wb->dmin, j + 1, &d1, &m1);
        const __m256i v = _mm256_loadu_si256((const __m256i*)(wb->qs + 16 * j));
        const __m256i h = _mm256_loadu_si256((const __m256i*)wb->qh);
        const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j), one), 4);
        const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j + 1), one), 4);
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, low), h0);
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), h1);
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
            const int32_t i0 = q5_hsum(q5_dot(lo, _mm256_loadu_si256((const __m256i*)xb[0].qs)));
            const int32_t i1 = q5_hsum(q5_dot(hi, _mm256_loadu_si256((const __m256i*)xb[1].qs)));
            acc[r] = act8_step(act8_step(acc[r], d0, m0, xb, i0), d1, m1, xb + 1, i1);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* kind: 0 Q5_0, 1 Q5_1, 2 Q5_K (a constant at each use) */
static inline __attribute__((always_inline)) int run_q5(const Run* r, int kind) {
    float out[4];
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= 4 ? 4 : 1;
            const BlockX8* x = r->x8 + (size_t)m * r->nb;
            if (kind == 2) row_q5k(wr, x, r->nb, R, out);
            else row_q5(wr, x, r->nb, R, kind, out);
            for (int i = 0; i < R; i++) run_store(r, m + i, n, out[i]);
            m += R;
        }
    }
    return 0;
}

int exo_x86_dot8_q5_0(const Run* r) { return run_q5(r, 0); }
int exo_x86_dot8_q5_1(const Run* r) { return run_q5(r, 1); }
int exo_x86_dot8_q5_k(const Run* r) { return run_q5(r, 2); }

#endif
