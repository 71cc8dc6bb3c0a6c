/* MXFP4, IQ4_NL and IQ4_XS rows against 16-bit activation rows, AVX2 (and the VNNI builds, whose
 * vpdpwssd the madd32 helper uses): a block's 32 codes looked up in the 16-entry table by one
 * vpshufb, widened to int16, multiplied with the activations by vpmaddwd; the float order of
 * iq4.h (the generic dots' in iq4.c) bit for bit. */
#include "iq4.h"

#if EXO_AVX2
#include "x86.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

enum { IQ4_MXFP4 = 0, IQ4_NL = 1, IQ4_XS = 2 };

/* The table in both 128-bit halves (vpshufb looks up within each half). */
static inline __m256i table_of(int which) {
    const __m128i t = _mm_loadu_si128((const __m128i*)(which == IQ4_MXFP4 ? MXFP4_VALUES : IQ4_NL_VALUES));
    return _mm256_set_m128i(t, t);
}

/* A block's 16 bytes of codes -> its values 0..15 (lo) and 16..31 (hi) as int16. */
static inline __attribute__((always_inline)) void lookup(const uint8_t* qs, __m256i table, __m256i* lo, __m256i* hi) {
    const __m128i b = _mm_loadu_si128((const __m128i*)qs);
    const __m256i codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(15));
    const __m256i v = _mm256_shuffle_epi8(table, codes);
    *lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
    *hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
}

/* Block b (of 32 values) of a row of `which`: its codes and scale. */
static inline __attribute__((always_inline)) const uint8_t* block_of(const uint8_t* w, int which, int b, float* s) {
    if (which == IQ4_MXFP4) {
        const BlockMXFP4* blk = (const BlockMXFP4*)w + b;
        *s = e8m0_half(blk->e);
        return blk->qs;
    }
    if (which == IQ4_NL) {
        const BlockIQ4NL* blk = (const BlockIQ4NL*)w + b;
        *s = exo_h2f(blk->d);
        return blk->qs;
    }
    const BlockIQ4XS* blk = (const BlockIQ4XS*)w + b / 8;
    *s = iq4xs_scale(blk, b % 8);
    return blk->qs + 16 * (b % 8);
}

/* One weight row against R = 1 or 4 activation rows (stride nb blocks). */
static inline __attribute__((always_inline)) void row_dot(const uint8_t* w, int which, const BlockX* x, int nb, int R,
                                                          float* out) {
    const __m256i table = table_of(which);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int b = 0; b < nb; b++) {
        float s;
        const uint8_t* qs = block_of(w, which, b, &s);
        __m256i lo, hi;
        lookup(qs, table, &lo, &hi);
        for (int r = 0; r < R; r++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            const __m256 p = _mm256_cvtepi32_ps(madd32(lo, hi, xb->qs));
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_set1_ps(s * xb->d), p));
        }
    }
    for (int r = 0; r < R; r++) out[r] = exo_hsum8(acc[r]);
}

static inline __attribute__((always_inline)) int run_iq4(const Run* r, int which) {
    float out[4];
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= 4 ? 4 : 1;
            if (R == 4) row_dot(wr, which, r->x + (size_t)m * r->nb, r->nb, 4, out);
            else row_dot(wr, which, r->x + (size_t)m * r->nb, r->nb, 1, out);
            for (int i = 0; i < R; i++) run_store(r, m + i, n, out[i]);
            m += R;
        }
    }
    return 0;
}

int exo_x86_dot_mxfp4(const Run* r) { return run_iq4(r, IQ4_MXFP4); }
int exo_x86_dot_iq4_nl(const Run* r) { return run_iq4(r, IQ4_NL); }
int exo_x86_dot_iq4_xs(const Run* r) { return run_iq4(r, IQ4_XS); }

#endif
