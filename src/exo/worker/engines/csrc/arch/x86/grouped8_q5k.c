/* issue 22 q5g: Q5_K's repacked groups (KIND_Q5_K_G8; exo_kernels.h) against 8-bit activation rows
 * on x86, 1 to Q5KG_MAX_R activation rows a pass, a vector lane per weight row, in act8_q5.h's order
 * (bit for bit the per-row dots' floats); and the tile (tile.c) of a Q5_1 or Q5_K group, which the
 * 16-bit activations take at every row count (kinds.c).
 *
 * A super-block's chunk ch (qs[ch]) holds sub-blocks 2 ch (low nibbles) and 2 ch + 1 (high), as a
 * Q4_K group's; x86_row_quad gives lane c row c's nibble bytes 4k .. 4k + 3 and, from qh, its qh
 * bytes 4k .. 4k + 3, whose bits j and j + 1 are those values' fifth bits: shifted right by j (one
 * vpsrlw for the chunk), bit 0 goes to bit 4 of the low values, bit 1 to bit 4 of the high ones.
 * Values 0..31 against the activation's 4 matching bytes: vpdpbusd (VNNI builds), or vpmaddubsw
 * (AVX2: two quads' pair sums, 4 products of at most 31 x 127 a lane, < 2^15) widened by vpmaddwd.
 */
#include "exo_kernels.h"
#if EXO_AVX2
#include <stddef.h>

#include "act8_q5.h"
#include "arch/x86/tile.h"
#include "arch/x86/x86.h"

#if EXO_AVX512VNNI
#define Q5KG_MAX_R 8
#else
#define Q5KG_MAX_R 4
#endif

#define Q5KG_KEEP(v) __asm__("" : "+x"(v))

/* The 8 rows' d sc_j and dmin m_j of sub-block j of a Q5_K group's super-block (q5k_sub's floats;
 * the step subtracts dm s). */
static inline __attribute__((always_inline)) void q5kg_scales(const uint8_t* blk, int j, __m256* dsc, __m256* dm) {
    const uint8_t* bytes = blk + offsetof(BlockQ5Kx8, scales);
#define Q5KG_BYTE(k) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(bytes + 8 * (k))))
    const __m256i six = _mm256_set1_epi32(63), four = _mm256_set1_epi32(15);
    __m256i sc, mn;
    if (j < 4) {
        sc = _mm256_and_si256(Q5KG_BYTE(j), six);
        mn = _mm256_and_si256(Q5KG_BYTE(j + 4), six);
    } else {
        const __m256i b = Q5KG_BYTE(j + 4);
        sc = _mm256_or_si256(_mm256_and_si256(b, four), _mm256_slli_epi32(_mm256_srli_epi32(Q5KG_BYTE(j - 4), 6), 4));
        mn = _mm256_or_si256(_mm256_srli_epi32(b, 4), _mm256_slli_epi32(_mm256_srli_epi32(Q5KG_BYTE(j), 6), 4));
    }
#undef Q5KG_BYTE
    *dsc = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk)), _mm256_cvtepi32_ps(sc));
    *dm = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ5Kx8, dmin)))),
                        _mm256_cvtepi32_ps(mn));
}

/* acc + (dsc d_x) isum - dm s_x (act8_step's order; minus dm s is plus -(dm) s exactly) */
static inline __attribute__((always_inline)) __m256 q5kg_step(__m256 acc, __m256 dsc, __m256 dm, const BlockX8* xb,
                                                              __m256i isum) {
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dsc, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(isum)));
    return _mm256_sub_ps(acc, _mm256_mul_ps(dm, _mm256_set1_ps(xb->s)));
}

/* Quad k of chunk `qs`: row c's values 4k .. 4k + 3 of the low sub-block (lo) and of the high one
 * (hi) in lane c, their fifth bits from qh's quad k shifted right by j (`shift`). */
static inline __attribute__((always_inline)) void q5kg_quad(const uint8_t* qs, const uint8_t* qh, int k, __m128i shift,
                                                            __m256i* lo, __m256i* hi) {
    const __m256i low = _mm256_set1_epi8(15), bit4 = _mm256_set1_epi8(16);
    const __m256i q = x86_row_quad(qs, k), h = _mm256_srl_epi16(x86_row_quad(qh, k), shift);
    *lo = _mm256_or_si256(_mm256_and_si256(q, low), _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), _mm256_and_si256(_mm256_slli_epi16(h, 3), bit4));
}

/* acc + the products of (a1, b1) and (a2, b2) per int32 lane (unsigned a, signed b) */
static inline __attribute__((always_inline)) __m256i q5kg_dp2(__m256i acc, __m256i a1, __m256i b1, __m256i a2, __m256i b2) {
#if EXO_AVX512VNNI || EXO_AVXVNNI
    return x86_dpbusd(x86_dpbusd(acc, a1, b1), a2, b2);
#else
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(a1, b1), _mm256_maddubs_epi16(a2, b2));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

/* out[r] lane c = row c of the Q5_K group at `grp` dotted with activation row r (x + r nb), r < R. */
static inline __attribute__((always_inline)) void q5kg_rows(const uint8_t* grp, int nb, const BlockX8* x, int R,
                                                            __m256* out) {
    __m256 acc[8]; /* R <= 8 (a constant in each copy) */
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b += 2) {
        const uint8_t* blk = grp + (size_t)(b / 8) * sizeof(BlockQ5Kx8);
        if (b % 8 == 0) x86_ahead(blk, sizeof(BlockQ5Kx8));
        const int j = b % 8;
        const uint8_t* qs = blk + offsetof(BlockQ5Kx8, qs) + 256 * (j / 2);
        const uint8_t* qh = blk + offsetof(BlockQ5Kx8, qh);
        const __m128i shift = _mm_cvtsi32_si128(j);
        __m256i s0[8], s1[8];
        for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm256_setzero_si256();
        for (int k = 0; k < 8; k += 2) { /* quads k, k + 1 */
            __m256i lo, hi, lo2, hi2;
            q5kg_quad(qs, qh, k, shift, &lo, &hi);
            q5kg_quad(qs, qh, k + 1, shift, &lo2, &hi2);
            for (int r = 0; r < R; r++) {
                const BlockX8* xb = x + (size_t)r * nb + b;
                const int8_t *x0 = xb[0].qs + 4 * k, *x1 = xb[1].qs + 4 * k;
                s0[r] = q5kg_dp2(s0[r], lo, x86_bcast4(x0), lo2, x86_bcast4(x0 + 4));
                s1[r] = q5kg_dp2(s1[r], hi, x86_bcast4(x1), hi2, x86_bcast4(x1 + 4));
                Q5KG_KEEP(s0[r]);
                Q5KG_KEEP(s1[r]);
            }
        }
        __m256 dsc0, dm0, dsc1, dm1;
        q5kg_scales(blk, j, &dsc0, &dm0);
        q5kg_scales(blk, j + 1, &dsc1, &dm1);
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
            acc[r] = q5kg_step(q5kg_step(acc[r], dsc0, dm0, xb, s0[r]), dsc1, dm1, xb + 1, s1[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* one copy per R (not inlined into the caller's loop; the AVX-512 VNNI build runs q5kz's below) */
#if !EXO_AVX512VNNI
#define Q5KG_COPY(R)                                                                              \
    static __attribute__((noinline)) void q5kg_##R(const uint8_t* grp, int nb, const BlockX8* x, \
                                                   __m256* out) {                                \
        q5kg_rows(grp, nb, x, R, out);                                                           \
    }
Q5KG_COPY(1)
Q5KG_COPY(2)
Q5KG_COPY(3)
Q5KG_COPY(4)
Q5KG_COPY(5)
Q5KG_COPY(6)
Q5KG_COPY(7)
Q5KG_COPY(8)
#endif

typedef void (*Q5KGRows)(const uint8_t* grp, int nb, const BlockX8* x, __m256* out);

#if EXO_AVX512VNNI
/* The AVX-512 VNNI build: 64 bytes a step, as grouped8_q4k.c's Q4_K groups. x86_row_pair512 puts
 * row c's nibble bytes 8k .. 8k + 7 of a chunk in int32 lanes 2c, 2c + 1, and the same of its qh
 * bytes (the 4 such vectors of a super-block serve its 4 chunks); one broadcast of the activation's
 * 8 matching bytes serves a vpdpbusd of 64 products a row; each row's two lanes are added at the end
 * of the sub-block (exact integers), then the same float steps as above. */

/* lanes 2c and 2c + 1 of s added: row c's sum in lane c */
static inline __attribute__((always_inline)) __m256i q5kz_fold(__m512i s) {
    return _mm512_cvtepi64_epi32(_mm512_add_epi32(s, _mm512_srli_epi64(s, 32)));
}

static inline __attribute__((always_inline)) void q5kz_rows(const uint8_t* grp, int nb, const BlockX8* x, int R,
                                                            __m256* out) {
    const __m512i low = _mm512_set1_epi8(15), bit4 = _mm512_set1_epi8(16);
    __m256 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += 8) {
        const uint8_t* blk = grp + (size_t)(b0 / 8) * sizeof(BlockQ5Kx8);
        __m512i h[4];
        for (int k = 0; k < 4; k++) h[k] = x86_row_pair512(blk + offsetof(BlockQ5Kx8, qh), k);
        for (int p = 0; p < 4; p++) { /* chunk p: sub-blocks 2p (low nibbles), 2p + 1 (high) */
            const uint8_t* qs = blk + offsetof(BlockQ5Kx8, qs) + 256 * p;
            const __m128i shift = _mm_cvtsi32_si128(2 * p);
            __m512i s0[8], s1[8];
            for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) {
                const __m512i q = x86_row_pair512(qs, k), hs = _mm512_srl_epi16(h[k], shift);
                const __m512i lo = _mm512_or_si512(_mm512_and_si512(q, low), _mm512_and_si512(_mm512_slli_epi16(hs, 4), bit4));
                const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q, 4), low),
                                                   _mm512_and_si512(_mm512_slli_epi16(hs, 3), bit4));
                for (int r = 0; r < R; r++) {
                    const BlockX8* xb = x + (size_t)r * nb + b0 + 2 * p;
                    s0[r] = _mm512_dpbusd_epi32(s0[r], lo, x86_bcast8_512(xb[0].qs + 8 * k));
                    s1[r] = _mm512_dpbusd_epi32(s1[r], hi, x86_bcast8_512(xb[1].qs + 8 * k));
                }
            }
            __m256 dsc0, dm0, dsc1, dm1;
            q5kg_scales(blk, 2 * p, &dsc0, &dm0);
            q5kg_scales(blk, 2 * p + 1, &dsc1, &dm1);
            for (int r = 0; r < R; r++) {
                const BlockX8* xb = x + (size_t)r * nb + b0 + 2 * p;
                acc[r] = q5kg_step(acc[r], dsc0, dm0, xb, q5kz_fold(s0[r]));
                acc[r] = q5kg_step(acc[r], dsc1, dm1, xb + 1, q5kz_fold(s1[r]));
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

#define Q5KZ_COPY(R)                                                                              \
    static __attribute__((noinline)) void q5kz_##R(const uint8_t* grp, int nb, const BlockX8* x, \
                                                   __m256* out) {                                \
        q5kz_rows(grp, nb, x, R, out);                                                           \
    }
Q5KZ_COPY(1)
Q5KZ_COPY(2)
Q5KZ_COPY(3)
Q5KZ_COPY(4)
Q5KZ_COPY(5)
Q5KZ_COPY(6)
Q5KZ_COPY(7)
Q5KZ_COPY(8)
#endif

int exo_x86_grouped8_q5_k(const Run* r) {
#if EXO_AVX512VNNI
    static const Q5KGRows k[] = {q5kz_1, q5kz_2, q5kz_3, q5kz_4, q5kz_5, q5kz_6, q5kz_7, q5kz_8};
#else
    static const Q5KGRows k[] = {q5kg_1, q5kg_2, q5kg_3, q5kg_4, q5kg_5, q5kg_6, q5kg_7, q5kg_8};
#endif
    __m256 acc[8];
    float o[8 * 8];
    for (int n = r->lo; n < r->hi; n += 8) {
        const uint8_t* grp = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= Q5KG_MAX_R ? Q5KG_MAX_R : r->m1 - m;
            k[R - 1](grp, r->nb, r->x8 + (size_t)m * r->nb, acc);
            for (int i = 0; i < R; i++) _mm256_storeu_ps(o + 8 * i, acc[i]);
            for (int i = 0; i < R; i++)
                for (int c = 0; c < 8; c++) run_store(r, m + i, n + c, o[8 * i + c]);
            m += R;
        }
    }
    return 0;
}

/* ---- the tile of a Q5_1 or Q5_K group (16-bit activations: tile.c reads it as the file rows'
 * tile, so the floats are the file rows' tile's) ---- */

/* 16 bytes of nibbles v and the 16 bytes' fifth bits (bit 4 of f) -> the values, low and high */
static inline __m128i q5kg_low(__m128i v, __m128i f) {
    return _mm_or_si128(_mm_and_si128(v, _mm_set1_epi8(15)), _mm_and_si128(f, _mm_set1_epi8(16)));
}

static void q5kg_tile_q5_1(const uint8_t* grp, int nb, Tile t) {
    const __m128i bits = _mm_set1_epi64x((long long)0x8040201008040201ULL);
    const __m128i spread = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)b * sizeof(BlockQ5_1x8);
        int8_t* q = t.q + (size_t)b * 256;
        for (int i = 0; i < 8; i++) { /* pair i at 32 i, pair i + 8 at 32 i + 16 */
            uint32_t h;
            memcpy(&h, blk + offsetof(BlockQ5_1x8, qh) + 4 * i, sizeof h);
            const __m128i v = _mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ5_1x8, qs) + 16 * i));
            const __m128i hl = _mm_cmpeq_epi8(_mm_and_si128(_mm_shuffle_epi8(_mm_set1_epi16((short)(h & 0xFFFF)), spread), bits), bits);
            const __m128i hh = _mm_cmpeq_epi8(_mm_and_si128(_mm_shuffle_epi8(_mm_set1_epi16((short)(h >> 16)), spread), bits), bits);
            _mm_storeu_si128((__m128i*)(q + 32 * i), q5kg_low(v, hl));
            _mm_storeu_si128((__m128i*)(q + 32 * i + 16), q5kg_low(_mm_srli_epi16(v, 4), hh));
        }
        _mm256_storeu_ps(t.d + (size_t)b * TILE_COLS, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk)));
        _mm256_storeu_ps(t.m + (size_t)b * TILE_COLS,
                         _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ5_1x8, m)))));
    }
}

static void q5kg_tile_q5_k(const uint8_t* grp, int nb, Tile t) {
    for (int b = 0; b < nb; b++) { /* tile block 8 s + j: sub-block j of super-block s */
        const uint8_t* blk = grp + (size_t)(b / 8) * sizeof(BlockQ5Kx8);
        const int j = b % 8;
        const __m128i shift = _mm_cvtsi32_si128(j);
        int8_t* q = t.q + (size_t)b * 256;
        for (int i = 0; i < 16; i++) { /* pair i at 32 (i % 8) + 16 (i / 8) */
            const __m128i v = _mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ5Kx8, qs) + 256 * (j / 2) + 16 * i));
            const __m128i h = _mm_srl_epi16(_mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ5Kx8, qh) + 16 * i)), shift);
            const __m128i nib = j & 1 ? _mm_srli_epi16(v, 4) : v;
            _mm_storeu_si128((__m128i*)(q + 32 * (i % 8) + 16 * (i / 8)), q5kg_low(nib, _mm_slli_epi16(h, 4)));
        }
        __m256 dsc, dm;
        q5kg_scales(blk, j, &dsc, &dm);
        _mm256_storeu_ps(t.d + (size_t)b * TILE_COLS, dsc);
        _mm256_storeu_ps(t.m + (size_t)b * TILE_COLS, _mm256_sub_ps(_mm256_setzero_ps(), dm));
    }
}

void exo_x86_tile_from_group_q5g(int kind, const uint8_t* grp, int nb, Tile t) {
    if (kind == KIND_Q5_1_G8) q5kg_tile_q5_1(grp, nb, t);
    else q5kg_tile_q5_k(grp, nb, t);
}
#endif
