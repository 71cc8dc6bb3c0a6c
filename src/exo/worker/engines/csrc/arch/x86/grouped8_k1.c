/* Repacked Q6_K groups (KIND_Q6_K_G8) against one 8-bit activation row on x86, in act8.h's order: the
 * same floats as grouped8.c's kernels and the per-row dots, faster (grouped8.c's exo_x86_grouped8_q6_k
 * hands its passes of one row here, those of several rows to grouped8_q6k.c).
 *
 * grouped8.c reads, for each 32-value group g = 4n + k of a super-block, ql chunk 2n + (k & 1) and
 * qh chunk n again and re-lays them (vpermq + vpshufb) for every group; here each quad of the three
 * chunks that groups 4n .. 4n + 3 share is loaded and re-laid once and gives all four groups' values
 * (the low and high nibbles of the two ql chunks, the four bit pairs of the qh chunk). The values are
 * taken unsigned (q, 0..63) and the half's integer dot is sum q x - 32 sum x: the same integer as
 * sum (q - 32) x (exact in int32), with the activation row's 16-value sums computed once a call.
 *
 * The AVX-512 VNNI build only: its eight sums and the four re-laid groups want more than the 16
 * vector registers of the AVX2 / AVX-VNNI builds, where gcc spills them every quad (both builds'
 * code) and the AVX2 build's kernel ran at 0.4x of grouped8_q6k.c's at one row (a Zen 3 core):
 * those builds hand one row to grouped8_q6k.c too.
 */
#include "exo_kernels.h"
#if EXO_AVX512VNNI
#include <stddef.h>

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
#endif
