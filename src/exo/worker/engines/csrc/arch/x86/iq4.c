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

/* The table (vpshufb looks up 16 bytes). */
static inline __m128i table_of(int which) {
    return _mm_loadu_si128((const __m128i*)(which == IQ4_MXFP4 ? MXFP4_VALUES : IQ4_NL_VALUES));
}

/* A block's 16 bytes of codes -> its values 0..15 (lo) and 16..31 (hi) as int16. */
static inline __attribute__((always_inline)) void lookup(const uint8_t* qs, __m128i table, __m256i* lo, __m256i* hi) {
    const __m128i b = _mm_loadu_si128((const __m128i*)qs), low = _mm_set1_epi8(15);
    *lo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(table, _mm_and_si128(b, low)));
    *hi = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(b, 4), low)));
}

/* Block b's 32 values (codes qs, scale s) against R activation rows (xb: row 0's block b,
 * stride nb): the lanes of iq4.h into acc[r][u]. */
static inline __attribute__((always_inline)) void block_step(const uint8_t* qs, float s, const BlockX* xb, int nb,
                                                             int R, __m128i table, __m256 (*acc)[2], int u) {
    __m256i lo, hi;
    lookup(qs, table, &lo, &hi);
    for (int r = 0; r < R; r++, xb += nb) {
        const __m256 p = _mm256_cvtepi32_ps(madd32(lo, hi, xb->qs));
        acc[r][u] = _mm256_add_ps(acc[r][u], _mm256_mul_ps(_mm256_set1_ps(s * xb->d), p));
    }
}

/* One weight row against R = 1 or 4 activation rows (stride nb blocks). */
static inline __attribute__((always_inline)) void row_dot(const uint8_t* w, int which, const BlockX* x, int nb, int R,
                                                          float* out) {
    const __m128i table = table_of(which);
    __m256 acc[4][2]; /* per row: the even blocks' lanes, the odd blocks' */
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    if (which == IQ4_XS) { /* a super-block's 8 scales first */
        for (int sb = 0; sb < nb / 8; sb++) {
            const BlockIQ4XS* blk = (const BlockIQ4XS*)w + sb;
            float sc[8];
            for (int j = 0; j < 8; j++) sc[j] = iq4xs_scale(blk, j);
            for (int j = 0; j < 8; j++) block_step(blk->qs + 16 * j, sc[j], x + 8 * sb + j, nb, R, table, acc, j & 1);
        }
    } else {
        for (int b0 = 0; b0 < nb; b0 += 2)
            for (int u = 0; u < 2 && b0 + u < nb; u++) {
                const int b = b0 + u;
                if (which == IQ4_MXFP4) {
                    const BlockMXFP4* blk = (const BlockMXFP4*)w + b;
                    block_step(blk->qs, e8m0_half(blk->e), x + b, nb, R, table, acc, u);
                } else {
                    const BlockIQ4NL* blk = (const BlockIQ4NL*)w + b;
                    block_step(blk->qs, exo_h2f(blk->d), x + b, nb, R, table, acc, u);
                }
            }
    }
    for (int r = 0; r < R; r++) out[r] = exo_hsum8(_mm256_add_ps(acc[r][0], acc[r][1]));
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
