/* Repacked Q4_K groups (KIND_Q4_K_G8) against 8-bit activation rows on the AVX-512 VNNI build, in
 * act8.h's order: the same floats as grouped8.c's kernels (which the other x86 builds run) and the
 * per-row dots, faster at every row count.
 *
 * A super-block's 8 x 12 packed scale bytes are unpacked at once (q4k8_unpack). Each 64 bytes of a
 * chunk (quads 2k, 2k + 1: row c's nibble bytes 8k .. 8k + 7) are re-laid by one vpermd + vpshufb so
 * that int32 lanes 2c, 2c + 1 hold row c's bytes 8k .. 8k + 3 and 8k + 4 .. 8k + 7: one broadcast of
 * the activation's 8 matching bytes then serves a vpdpbusd of 64 products a row, and each row's two
 * lanes are added at the end of the sub-block (exact integers).
 */
#include "exo_kernels.h"
#if EXO_AVX512VNNI
#include "arch/x86/grouped8_kq.h"

/* The super-block after `blk` (its group's next, or the next group's first: they follow one
 * another) asked for while `blk` runs, in the batched passes: at 8 rows the 1B-shaped file's q | k
 * | v took 917 -> 744 us a call and gate | up 5.0 -> 4.2 ms with it (weights not in cache, Zen 4,
 * alternating in one process); one row (k1_q4k_group, a pass a few times shorter) gained
 * nothing from it or from asking for the block's own lines, and keeps neither. */
static inline __attribute__((always_inline)) void k1_q4k_prefetch_next(const uint8_t* blk) {
    x86_prefetch_at((uintptr_t)blk + sizeof(BlockQ4Kx8), sizeof(BlockQ4Kx8));
}

/* Lanes 2c + 2c + 1 of s added: row c's sum in lane c. */
static inline __attribute__((always_inline)) __m256i k1_fold(__m512i s) {
    return _mm512_cvtepi64_epi32(_mm512_add_epi32(s, _mm512_srli_epi64(s, 32)));
}

/* Sub-blocks 2p and 2p + 1's integer dots of one Q4_K chunk (k1_q4k_group's, 64 bytes a step). */
static inline __attribute__((always_inline)) void k1_q4k_chunk(const uint8_t* qs, const BlockX8* xb, __m256i* i0,
                                                               __m256i* i1) {
    const __m512i low = _mm512_set1_epi8(15);
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, t0 = s0, t1 = s0;
    for (int k = 0; k < 4; k += 2) {
        const __m512i q = x86_row_pair512(qs, k), r = x86_row_pair512(qs, k + 1);
        s0 = _mm512_dpbusd_epi32(s0, _mm512_and_si512(q, low), x86_bcast8_512(xb[0].qs + 8 * k));
        s1 = _mm512_dpbusd_epi32(s1, _mm512_and_si512(_mm512_srli_epi16(q, 4), low), x86_bcast8_512(xb[1].qs + 8 * k));
        t0 = _mm512_dpbusd_epi32(t0, _mm512_and_si512(r, low), x86_bcast8_512(xb[0].qs + 8 * k + 8));
        t1 = _mm512_dpbusd_epi32(t1, _mm512_and_si512(_mm512_srli_epi16(r, 4), low), x86_bcast8_512(xb[1].qs + 8 * k + 8));
    }
    *i0 = k1_fold(_mm512_add_epi32(s0, t0));
    *i1 = k1_fold(_mm512_add_epi32(s1, t1));
}

/* Lane c = row c of the Q4_K group at `grp` dotted with the activation row x: sub-blocks 2p (low
 * nibbles of chunk p) and 2p + 1 (high ones) share each quad's load. */
static __attribute__((noinline)) __m256 k1_q4k_group(const uint8_t* grp, int nb, const BlockX8* x) {
    __m256 acc = _mm256_setzero_ps();
    uint8_t sc[64], mn[64];
    for (int b0 = 0; b0 < nb; b0 += 8) {
        const uint8_t* blk = grp + (size_t)(b0 / 8) * sizeof(BlockQ4Kx8);
        __m256 d, dmin;
        q4k8_d(blk, &d, &dmin);
        q4k8_unpack(blk, sc, mn);
        for (int p = 0; p < 4; p++) {
            const BlockX8* xb = x + b0 + 2 * p;
            __m256i i0, i1;
            k1_q4k_chunk(blk + offsetof(BlockQ4Kx8, qs) + 256 * p, xb, &i0, &i1);
            acc = q4k8_pair(acc, d, dmin, sc, mn, p, xb, i0, i1);
        }
    }
    return acc;
}

/* out[r] lane c = row c of the Q4_K group at `grp` dotted with activation row r (x + r nb), r < R:
 * k1_q4k_group's steps, each 64-byte re-laid pair of quads serving the R rows. */
static inline __attribute__((always_inline)) void k1_q4k_rows(const uint8_t* grp, int nb, const BlockX8* x, int R,
                                                              __m256* out) {
    const __m512i low = _mm512_set1_epi8(15);
    __m256 acc[8];
    uint8_t sc[64], mn[64];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += 8) {
        const uint8_t* blk = grp + (size_t)(b0 / 8) * sizeof(BlockQ4Kx8);
        k1_q4k_prefetch_next(blk);
        __m256 d, dmin;
        q4k8_d(blk, &d, &dmin);
        q4k8_unpack(blk, sc, mn);
        for (int p = 0; p < 4; p++) {
            const uint8_t* qs = blk + offsetof(BlockQ4Kx8, qs) + 256 * p;
            __m512i s0[8], s1[8];
            for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) {
                const __m512i q = x86_row_pair512(qs, k);
                const __m512i lo = _mm512_and_si512(q, low), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
                for (int r = 0; r < R; r++) {
                    const BlockX8* xb = x + (size_t)r * nb + b0 + 2 * p;
                    s0[r] = _mm512_dpbusd_epi32(s0[r], lo, x86_bcast8_512(xb[0].qs + 8 * k));
                    s1[r] = _mm512_dpbusd_epi32(s1[r], hi, x86_bcast8_512(xb[1].qs + 8 * k));
                }
            }
            __m256 dsc0, dm0, dsc1, dm1;
            q4k8_scale(d, dmin, sc + 16 * p, mn + 16 * p, &dsc0, &dm0);
            q4k8_scale(d, dmin, sc + 16 * p + 8, mn + 16 * p + 8, &dsc1, &dm1);
            for (int r = 0; r < R; r++) {
                const BlockX8* xb = x + (size_t)r * nb + b0 + 2 * p;
                acc[r] = q4k8_step(acc[r], dsc0, dm0, xb, k1_fold(s0[r]));
                acc[r] = q4k8_step(acc[r], dsc1, dm1, xb + 1, k1_fold(s1[r]));
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

typedef void (*K1Q4KRows)(const uint8_t* grp, int nb, const BlockX8* x, __m256* out);
#define K1_Q4K_COPY(R)                                                                                 \
    static __attribute__((noinline)) void k1_q4k_##R(const uint8_t* grp, int nb, const BlockX8* x, __m256* out) { \
        k1_q4k_rows(grp, nb, x, R, out);                                                               \
    }
static __attribute__((noinline)) void k1_q4k_1(const uint8_t* grp, int nb, const BlockX8* x, __m256* out) {
    out[0] = k1_q4k_group(grp, nb, x);
}
K1_Q4K_COPY(2)
K1_Q4K_COPY(3)
K1_Q4K_COPY(4)
K1_Q4K_COPY(5)
K1_Q4K_COPY(6)
K1_Q4K_COPY(7)
K1_Q4K_COPY(8)

int exo_x86_grouped8_q4_k_rows(const Run* r) {
    static const K1Q4KRows k[8] = {k1_q4k_1, k1_q4k_2, k1_q4k_3, k1_q4k_4, k1_q4k_5, k1_q4k_6, k1_q4k_7, k1_q4k_8};
    __m256 acc[8];
    float o[8 * 8];
    for (int n = r->lo; n < r->hi; n += 8) {
        const uint8_t* grp = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= 8 ? 8 : r->m1 - m;
            k[R - 1](grp, r->nb, r->x8 + (size_t)m * r->nb, acc);
            for (int i = 0; i < R; i++) _mm256_storeu_ps(o + 8 * i, acc[i]);
            for (int i = 0; i < R; i++)
                for (int c = 0; c < 8; c++) run_store(r, m + i, n + c, o[8 * i + c]);
            m += R;
        }
    }
    return 0;
}
#endif
