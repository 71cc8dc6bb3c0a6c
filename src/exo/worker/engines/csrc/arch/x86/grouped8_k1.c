/* Repacked Q6_K groups (KIND_Q6_K_G8) against 8-bit activation rows on x86, in act8.h's order: the
 * same floats as grouped8.c's kernels and the per-row dots, faster (grouped8.c's exo_x86_grouped8_q6_k
 * hands its passes here).
 *
 * grouped8.c reads, for each 32-value group g = 4n + k of a super-block, ql chunk 2n + (k & 1) and
 * qh chunk n again and re-lays them (vpermq + vpshufb) for every group; here each quad of the three
 * chunks that groups 4n .. 4n + 3 share is loaded and re-laid once and gives all four groups' values
 * (the low and high nibbles of the two ql chunks, the four bit pairs of the qh chunk). The values are
 * taken unsigned (q, 0..63) and the half's integer dot is sum q x - 32 sum x: the same integer as
 * sum (q - 32) x (exact in int32), with the activation row's 16-value sums computed once a call.
 */
#include "exo_kernels.h"
#if EXO_AVX2
#include <stddef.h>
#include <stdlib.h>

#include "act8.h"
#include "arch/x86/grouped8_k1.h"
#include "arch/x86/x86.h"

/* sx[2b + h] = 32 x the sum of values 16h .. 16h + 15 of activation block b. */
static void k1_sums(const BlockX8* x, int nb, int32_t* sx) {
    for (int b = 0; b < nb; b++)
        for (int h = 0; h < 2; h++) {
            int32_t s = 0;
            for (int l = 16 * h; l < 16 * h + 16; l++) s += x[b].qs[l];
            sx[2 * b + h] = 32 * s;
        }
}

/* Half h of groups 4n .. 4n + 3 (quads 4h .. 4h + 3 of each) of super-block `blk`: s[k] lane c =
 * row c's unsigned-value dot with group 4n + k's activations (xs: the super-block's 8 blocks). */
static inline __attribute__((always_inline)) void k1_half(const uint8_t* blk, int n, int h, const BlockX8* xs,
                                                          __m256i s[4]) {
    const uint8_t* ql0 = blk + offsetof(BlockQ6Kx8, ql) + 256 * (2 * n);
    const uint8_t* ql1 = ql0 + 256;
    const uint8_t* qh = blk + offsetof(BlockQ6Kx8, qh) + 256 * n;
    const __m256i low = _mm256_set1_epi8(15), b01 = _mm256_set1_epi8(3), b23 = _mm256_set1_epi8(12);
    const __m256i b45 = _mm256_set1_epi8(48);
    for (int k = 0; k < 4; k++) s[k] = _mm256_setzero_si256();
    for (int quad = 4 * h; quad < 4 * h + 4; quad++) {
        const __m256i a = x86_row_quad(ql0, quad), b = x86_row_quad(ql1, quad), hb = x86_row_quad(qh, quad);
        /* groups 4n + k: low nibbles of ql0 / ql1 (k = 0, 1), high ones (k = 2, 3); qh bits 2k, 2k + 1 */
        const __m256i q0 = _mm256_or_si256(_mm256_and_si256(a, low), _mm256_slli_epi16(_mm256_and_si256(hb, b01), 4));
        const __m256i q1 = _mm256_or_si256(_mm256_and_si256(b, low), _mm256_slli_epi16(_mm256_and_si256(hb, b23), 2));
        const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low), _mm256_and_si256(hb, b45));
        const __m256i q3 =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), low), _mm256_and_si256(_mm256_srli_epi16(hb, 2), b45));
        s[0] = x86_dpbusd(s[0], q0, x86_bcast4(xs[4 * n + 0].qs + 4 * quad));
        s[1] = x86_dpbusd(s[1], q1, x86_bcast4(xs[4 * n + 1].qs + 4 * quad));
        s[2] = x86_dpbusd(s[2], q2, x86_bcast4(xs[4 * n + 2].qs + 4 * quad));
        s[3] = x86_dpbusd(s[3], q3, x86_bcast4(xs[4 * n + 3].qs + 4 * quad));
    }
}

/* Lane c = row c of the group at `grp` (nb blocks of 32) dotted with the activation row x (sx: its
 * sums, k1_sums). The steps run in act8.h's order: block by block, half by half. */
static __attribute__((noinline)) __m256 k1_q6k_group(const uint8_t* grp, int nb, const BlockX8* x, const int32_t* sx) {
    __m256 acc = _mm256_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += 8) {
        const uint8_t* blk = grp + (size_t)(b0 / 8) * sizeof(BlockQ6Kx8);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
        for (int n = 0; n < 2; n++) {
            __m256i s[2][4];
            k1_half(blk, n, 0, x + b0, s[0]);
            k1_half(blk, n, 1, x + b0, s[1]);
            for (int k = 0; k < 4; k++) {
                const int g = 4 * n + k;
                for (int h = 0; h < 2; h++) {
                    const __m256i isum = _mm256_sub_epi32(s[h][k], _mm256_set1_epi32(sx[2 * (b0 + g) + h]));
                    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                        _mm_loadl_epi64((const __m128i*)(blk + offsetof(BlockQ6Kx8, scales) + 8 * (2 * g + h)))));
                    const __m256 t = _mm256_mul_ps(_mm256_mul_ps(d, sc), _mm256_set1_ps(x[b0 + g].d));
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(t, _mm256_cvtepi32_ps(isum)));
                }
            }
        }
    }
    return acc;
}

int exo_x86_grouped8_q6_k_one(const Run* r) {
    if (r->m1 - r->m0 != 1 || r->nb > K1_MAX_NB) return -1;
    int32_t sx[2 * K1_MAX_NB];
    const BlockX8* x = r->x8 + (size_t)r->m0 * r->nb;
    k1_sums(x, r->nb, sx);
    float o[8];
    for (int n = r->lo; n < r->hi; n += 8) {
        _mm256_storeu_ps(o, k1_q6k_group(run_row(r, n), r->nb, x, sx));
        for (int c = 0; c < 8; c++) run_store(r, r->m0, n + c, o[c]);
    }
    return 0;
}
/* activation rows a pass of the batched Q6_K kernel (the AVX-512 builds have 32 vector registers) */
#if EXO_AVX512VNNI
#define K1_MAX_R 8
#else
#define K1_MAX_R 4
#endif

/* out[r] lane c = row c of the Q6_K group at `grp` dotted with activation row r (x + r nb; sx + 2 r nb:
 * its sums), r < R: per 32-value group and half, the values' quads re-laid once for the R rows, each
 * row's sum started at -32 sum x (the same integer as sum (q - 32) x at the end). */
static inline __attribute__((always_inline)) void k1_q6k_rows(const uint8_t* grp, int nb, const BlockX8* x,
                                                              const int32_t* sx, int R, __m256* out) {
    const __m256i low = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3);
    __m256 acc[K1_MAX_R];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)(b / 8) * sizeof(BlockQ6Kx8);
        const int g = b % 8, n = g / 4, k = g % 4;
        const uint8_t* ql = blk + offsetof(BlockQ6Kx8, ql) + 256 * (2 * n + (k & 1));
        const uint8_t* qh = blk + offsetof(BlockQ6Kx8, qh) + 256 * n;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
        for (int h = 0; h < 2; h++) {
            __m256i s[K1_MAX_R];
            for (int r = 0; r < R; r++) s[r] = _mm256_set1_epi32(-sx[2 * ((size_t)r * nb + b) + h]);
            for (int quad = 4 * h; quad < 4 * h + 4; quad++) {
                const __m256i l4 = x86_row_quad(ql, quad), h2 = x86_row_quad(qh, quad);
                const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(l4, 4) : l4, low);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(h2, 2 * k), three);
                const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
                for (int r = 0; r < R; r++) s[r] = x86_dpbusd(s[r], q, x86_bcast4(x[(size_t)r * nb + b].qs + 4 * quad));
            }
            const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i*)(blk + offsetof(BlockQ6Kx8, scales) + 8 * (2 * g + h)))));
            const __m256 dsc = _mm256_mul_ps(d, sc);
            for (int r = 0; r < R; r++) {
                const __m256 t = _mm256_mul_ps(dsc, _mm256_set1_ps(x[(size_t)r * nb + b].d));
                acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(t, _mm256_cvtepi32_ps(s[r])));
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

typedef void (*K1Rows)(const uint8_t* grp, int nb, const BlockX8* x, const int32_t* sx, __m256* out);
#define K1_Q6K_COPY(R)                                                                                \
    static __attribute__((noinline)) void k1_q6k_##R(const uint8_t* grp, int nb, const BlockX8* x,     \
                                                     const int32_t* sx, __m256* out) {                \
        k1_q6k_rows(grp, nb, x, sx, R, out);                                                          \
    }
static __attribute__((noinline)) void k1_q6k_1(const uint8_t* grp, int nb, const BlockX8* x, const int32_t* sx,
                                               __m256* out) {
    out[0] = k1_q6k_group(grp, nb, x, sx);
}
K1_Q6K_COPY(2)
K1_Q6K_COPY(3)
K1_Q6K_COPY(4)
#if EXO_AVX512VNNI
K1_Q6K_COPY(5)
K1_Q6K_COPY(6)
K1_Q6K_COPY(7)
K1_Q6K_COPY(8)
static const K1Rows K1_Q6K[K1_MAX_R] = {k1_q6k_1, k1_q6k_2, k1_q6k_3, k1_q6k_4, k1_q6k_5, k1_q6k_6, k1_q6k_7, k1_q6k_8};
#else
static const K1Rows K1_Q6K[K1_MAX_R] = {k1_q6k_1, k1_q6k_2, k1_q6k_3, k1_q6k_4};
#endif

/* The pass's rows over the part's groups, K1_MAX_R rows at a time (sx: their sums, k1_sums). */
static void k1_q6k_run(const Run* r, const int32_t* sx) {
    __m256 acc[K1_MAX_R];
    float o[8 * K1_MAX_R];
    for (int n = r->lo; n < r->hi; n += 8) {
        const uint8_t* grp = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= K1_MAX_R ? K1_MAX_R : r->m1 - m;
            K1_Q6K[R - 1](grp, r->nb, r->x8 + (size_t)m * r->nb, sx + 2 * (size_t)(m - r->m0) * r->nb, acc);
            for (int i = 0; i < R; i++) _mm256_storeu_ps(o + 8 * i, acc[i]);
            for (int i = 0; i < R; i++)
                for (int c = 0; c < 8; c++) run_store(r, m + i, n + c, o[8 * i + c]);
            m += R;
        }
    }
}

int exo_x86_grouped8_q6_k_rows(const Run* r) {
    const size_t per_row = 2 * (size_t)r->nb, rows = (size_t)(r->m1 - r->m0);
    int32_t* sx = malloc(sizeof(int32_t) * per_row * rows);
    if (sx == NULL) return -1;
    for (size_t i = 0; i < rows; i++) k1_sums(r->x8 + (r->m0 + i) * (size_t)r->nb, r->nb, sx + i * per_row);
    k1_q6k_run(r, sx);
    free(sx);
    return 0;
}
#endif
