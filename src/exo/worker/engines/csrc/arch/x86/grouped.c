/* Weights re-laid at load in groups of 8 rows (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K: KIND_*_G8),
 * dotted with 1 to 4 activation rows at a time (AVX2; repack.c builds the groups).
 *
 * Why: one weight row dotted with one activation row ends every 32-value block with a float tail
 * (convert the 8 int32 lanes, scale by d_w d_x, add the m s_x term) that costs as much as its
 * multiply-adds, and the tile path (tile.c) that shares the tail among 8 rows first has to
 * build its tile from 8 rows on every pass. Stored as a tile already, the weights need neither:
 * vector lane c is row c of the group, one multiply-add of a broadcast activation pair gives 8
 * rows' partial sums, and one convert and one or two FMAs finish a block for all 8 rows; decode
 * (one activation row) runs this way too. Measured against the per-row kernels with weights not
 * in cache, one thread, at 1 / 2 activation rows: Q4_1 1.9-2.2x / 1.7x, Q8_0 1.25x / 1.65x,
 * Q5_0 1.2x / 1.35x, Q4_K 1.7x / 2.3x, Q6_K 1.25x / 1.5x (SmolLM2's and Gemma 3's layer
 * shapes). From a few rows on (kinds.c: a repacked kind's tile_rows) a group is turned into a
 * tile and used there (exo_x86_tile_from_group): each pass then reads int8 pairs, and building
 * it needs no transpose.
 *
 * The layouts are the typed blocks of exo_kernels.h (BlockQ4_1x8, BlockQ5_0x8, BlockQ8_0x8,
 * BlockQ4Kx8, BlockQ6Kx8), built by repack.c; Q8_0's values are laid as a tile's already, so a
 * group of them is read directly at any number of rows.
 *
 * Both builds sum a block's 32 products per row as integers, then add d_w d_x isum and m s_x
 * in the same order, so a row's result does not depend on how many rows are in the call.
 */
#include "exo_kernels.h"
#if EXO_AVX2
#include <stddef.h>
#include "arch/x86/tile.h"
#include "arch/x86/x86.h"
#include "kinds.h"
#include "quants.h"

#define G8_ROWS 8
#define G8_MAX_R 4 /* activation rows per pass over a group (registers) */
/* bytes of a group's block (exo_kernels.h) */
#define G8_BLOCK ((int)sizeof(BlockQ4_1x8))
#define G8_Q8_BLOCK ((int)sizeof(BlockQ8_0x8))
#define G8_Q5_BLOCK ((int)sizeof(BlockQ5_0x8))
#define G8_Q40_BLOCK ((int)sizeof(BlockQ4_0x8))
#define G8_Q4K_BLOCK ((int)sizeof(BlockQ4Kx8))
#define G8_Q6K_BLOCK ((int)sizeof(BlockQ6Kx8))

/* An empty asm that "changes" v: the sums stay running chains in registers (see arch/x86/tile.c). */
#define G8_KEEP(v) __asm__("" : "+x"(v))

enum { G8_Q4_1 = 0, G8_Q5_0 = 1, G8_Q4_0 = 2 };

/* out[r] lane c = dot of row c of the group at `grp` with activation row r (x + r nb); `layout`
 * (G8_*, a constant at each call: the unpacking specialises): a Q4_1, Q5_0 or Q4_0 group. */
static inline __attribute__((always_inline)) void g8_rows(const uint8_t* grp, int nb, const BlockX* x, int R,
                                                          int layout, __m256* out) {
    const int five = layout == G8_Q5_0, zero = layout == G8_Q4_0; /* zero: Q4_0, q - 8 */
    const __m256i low = _mm256_set1_epi16(0x0F), minus16 = _mm256_set1_epi16(-16);
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                          (short)0x8000);
    __m256 acc[G8_MAX_R];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)b * (five ? G8_Q5_BLOCK : zero ? G8_Q40_BLOCK : G8_BLOCK);
        const uint8_t* nibbles = blk + (five   ? offsetof(BlockQ5_0x8, qs)
                                        : zero ? offsetof(BlockQ4_0x8, qs)
                                               : offsetof(BlockQ4_1x8, qs));
        __m256i s[G8_MAX_R];
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
        for (int i = 0; i < 8; i++) {
            /* byte 2c + e -> word 2c + e: its low nibble is row c's value 2i + e, its high one
             * value 2i + 16 + e */
            const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(nibbles + 16 * i)));
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_srli_epi16(v, 4);
            if (five) { /* q - 16 = nibble + (fifth bit ? 0 : -16), word 2c + e: bit 2c + e of h */
                uint32_t h;
                memcpy(&h, blk + offsetof(BlockQ5_0x8, qh) + 4 * i, sizeof h);
                const __m256i hl = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(h & 0xFFFF)), bit), bit);
                const __m256i hh = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(h >> 16)), bit), bit);
                lo = _mm256_add_epi16(lo, _mm256_andnot_si256(hl, minus16));
                hi = _mm256_add_epi16(hi, _mm256_andnot_si256(hh, minus16));
            }
            if (zero) {
                lo = _mm256_sub_epi16(lo, _mm256_set1_epi16(8));
                hi = _mm256_sub_epi16(hi, _mm256_set1_epi16(8));
            }
            for (int r = 0; r < R; r++) {
                int32_t x0, x1; /* activation pairs i and i + 8 */
                memcpy(&x0, x[(size_t)r * nb + b].qs + 2 * i, sizeof x0);
                memcpy(&x1, x[(size_t)r * nb + b].qs + 2 * i + 16, sizeof x1);
                const __m256i p = dp16(_mm256_madd_epi16(lo, _mm256_set1_epi32(x0)), hi, _mm256_set1_epi32(x1));
                s[r] = _mm256_add_epi32(s[r], p);
                G8_KEEP(s[r]);
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
        const int has_m = layout == G8_Q4_1;
        const __m256 m = has_m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ4_1x8, m)))) : d;
        for (int r = 0; r < R; r++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(s[r]), acc[r]);
            if (has_m) acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xb->s), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* The 8 rows' scale d sc_j and offset dmin m_j of sub-block j of a Q4_K group's super-block
 * (the 6-bit pairs unpacked for all rows at once, as quants.h's q4k_scale_min does one). */
static inline __attribute__((always_inline)) void g8_q4k_scales(const uint8_t* blk, int j, __m256* dsc, __m256* dm) {
    const uint8_t* bytes = blk + offsetof(BlockQ4Kx8, scales);
#define G8_SCALE_BYTE(k) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(bytes + 8 * (k))))
    const __m256i six = _mm256_set1_epi32(63), four = _mm256_set1_epi32(15);
    __m256i sc, mn;
    if (j < 4) {
        sc = _mm256_and_si256(G8_SCALE_BYTE(j), six);
        mn = _mm256_and_si256(G8_SCALE_BYTE(j + 4), six);
    } else {
        const __m256i b = G8_SCALE_BYTE(j + 4);
        sc = _mm256_or_si256(_mm256_and_si256(b, four), _mm256_slli_epi32(_mm256_srli_epi32(G8_SCALE_BYTE(j - 4), 6), 4));
        mn = _mm256_or_si256(_mm256_srli_epi32(b, 4), _mm256_slli_epi32(_mm256_srli_epi32(G8_SCALE_BYTE(j), 6), 4));
    }
#undef G8_SCALE_BYTE
    *dsc = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk)), _mm256_cvtepi32_ps(sc));
    *dm = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ4Kx8, dmin)))),
                        _mm256_cvtepi32_ps(mn));
}

/* The tile (tile.c) of a group, for many activation rows (prefill): the nibbles split into
 * int8 pairs, no transpose (the group is one already), and the scales as floats. */
void exo_x86_tile_from_group(int kind, const uint8_t* grp, int nb, Tile t) {
    const __m128i low = _mm_set1_epi8(0x0F);
    if (kind == KIND_Q5_1_G8 || kind == KIND_Q5_K_G8) { /* issue 22 q5g: grouped8_q5k.c */
        exo_x86_tile_from_group_q5g(kind, grp, nb, t);
        return;
    }
    if (kind == KIND_Q4_K_G8) { /* tile block 8 s + j: sub-block j of super-block s */
        for (int b = 0; b < nb; b++) {
            const uint8_t* blk = grp + (size_t)(b / 8) * G8_Q4K_BLOCK;
            const int j = b % 8, c = j / 2;
            int8_t* q = t.q + (size_t)b * 256;
            for (int i = 0; i < 16; i++) { /* pair i at 32 (i % 8) + 16 (i / 8) */
                const __m128i v = _mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ4Kx8, qs) + 16 * (16 * c + i)));
                const __m128i nib = j & 1 ? _mm_and_si128(_mm_srli_epi16(v, 4), low) : _mm_and_si128(v, low);
                _mm_storeu_si128((__m128i*)(q + 32 * (i % 8) + 16 * (i / 8)), nib);
            }
            __m256 dsc, dm;
            g8_q4k_scales(blk, j, &dsc, &dm);
            _mm256_storeu_ps(t.d + (size_t)b * TILE_COLS, dsc);
            _mm256_storeu_ps(t.m + (size_t)b * TILE_COLS, _mm256_sub_ps(_mm256_setzero_ps(), dm));
        }
        return;
    }
    if (kind == KIND_Q6_K_G8) { /* tile block 8 s + g: 32-value group g = 4 n + k of super-block s */
        const __m128i three = _mm_set1_epi8(3), m32 = _mm_set1_epi8(32);
        for (int b = 0; b < nb; b++) {
            const uint8_t* blk = grp + (size_t)(b / 8) * G8_Q6K_BLOCK;
            const int g = b % 8, n = g / 4, k = g % 4;
            const uint8_t* ql = blk + offsetof(BlockQ6Kx8, ql) + 256 * (2 * n + (k & 1));
            const uint8_t* qh = blk + offsetof(BlockQ6Kx8, qh) + 256 * n;
            int8_t* q = t.q + (size_t)b * 256;
            for (int i = 0; i < 16; i++) {
                const __m128i v = _mm_loadu_si128((const __m128i*)(ql + 16 * i));
                const __m128i lo = k >= 2 ? _mm_and_si128(_mm_srli_epi16(v, 4), low) : _mm_and_si128(v, low);
                const __m128i hi = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i*)(qh + 16 * i)), 2 * k), three);
                _mm_storeu_si128((__m128i*)(q + 32 * (i % 8) + 16 * (i / 8)), _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), m32));
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
            const __m256 sa = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + offsetof(BlockQ6Kx8, scales) + 8 * (2 * g)))));
            const __m256 sb = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + offsetof(BlockQ6Kx8, scales) + 8 * (2 * g + 1)))));
            _mm256_storeu_ps(t.d + (size_t)b * TILE_COLS, _mm256_mul_ps(d, sa));
            _mm256_storeu_ps(t.d2 + (size_t)b * TILE_COLS, _mm256_mul_ps(d, sb));
        }
        return;
    }
    if (kind == KIND_Q8_0_G8) { /* the values are a tile's already */
        for (int b = 0; b < nb; b++) {
            const uint8_t* blk = grp + (size_t)b * G8_Q8_BLOCK;
            memcpy(t.q + (size_t)b * 256, blk + offsetof(BlockQ8_0x8, qs), 256);
            _mm256_storeu_ps(t.d + (size_t)b * TILE_COLS, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk)));
        }
        return;
    }
    if (kind == KIND_Q5_0_G8) { /* int8 q - 16: the fifth bits spread to bytes */
        const __m128i bits = _mm_set1_epi64x((long long)0x8040201008040201ULL);
        const __m128i spread = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        for (int b = 0; b < nb; b++) {
            const uint8_t* blk = grp + (size_t)b * G8_Q5_BLOCK;
            int8_t* q = t.q + (size_t)b * 256;
            for (int i = 0; i < 8; i++) {
                uint32_t h;
                memcpy(&h, blk + offsetof(BlockQ5_0x8, qh) + 4 * i, sizeof h);
                const __m128i v = _mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ5_0x8, qs) + 16 * i));
                const __m128i hl = _mm_cmpeq_epi8(_mm_and_si128(_mm_shuffle_epi8(_mm_set1_epi16((short)(h & 0xFFFF)), spread), bits), bits);
                const __m128i hh = _mm_cmpeq_epi8(_mm_and_si128(_mm_shuffle_epi8(_mm_set1_epi16((short)(h >> 16)), spread), bits), bits);
                const __m128i m16 = _mm_set1_epi8(-16);
                _mm_storeu_si128((__m128i*)(q + 32 * i), _mm_add_epi8(_mm_and_si128(v, low), _mm_andnot_si128(hl, m16)));
                _mm_storeu_si128((__m128i*)(q + 32 * i + 16),
                                 _mm_add_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_andnot_si128(hh, m16)));
            }
            _mm256_storeu_ps(t.d + (size_t)b * TILE_COLS, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk)));
        }
        return;
    }
    if (kind == KIND_Q4_0_G8) { /* int8 q - 8 */
        const __m128i eight = _mm_set1_epi8(8);
        for (int b = 0; b < nb; b++) {
            const uint8_t* blk = grp + (size_t)b * G8_Q40_BLOCK;
            int8_t* q = t.q + (size_t)b * 256;
            for (int i = 0; i < 8; i++) {
                const __m128i v = _mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ4_0x8, qs) + 16 * i));
                _mm_storeu_si128((__m128i*)(q + 32 * i), _mm_sub_epi8(_mm_and_si128(v, low), eight));
                _mm_storeu_si128((__m128i*)(q + 32 * i + 16), _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), low), eight));
            }
            _mm256_storeu_ps(t.d + (size_t)b * TILE_COLS, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk)));
        }
        return;
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)b * G8_BLOCK;
        int8_t* q = t.q + (size_t)b * 256;
        for (int i = 0; i < 8; i++) { /* pair i at 32 i, pair i + 8 at 32 i + 16 */
            const __m128i v = _mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ4_1x8, qs) + 16 * i));
            _mm_storeu_si128((__m128i*)(q + 32 * i), _mm_and_si128(v, low));
            _mm_storeu_si128((__m128i*)(q + 32 * i + 16), _mm_and_si128(_mm_srli_epi16(v, 4), low));
        }
        _mm256_storeu_ps(t.d + (size_t)b * TILE_COLS, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk)));
        _mm256_storeu_ps(t.m + (size_t)b * TILE_COLS, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ4_1x8, m)))));
    }
}

/* As g8_rows, for Q8_0 groups. */
static inline __attribute__((always_inline)) void g8_q8_rows(const uint8_t* grp, int nb, const BlockX* x, int R,
                                                             __m256* out) {
    __m256 acc[G8_MAX_R];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)b * G8_Q8_BLOCK;
        __m256i s[G8_MAX_R];
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
        for (int j = 0; j < 16; j++) {
            const __m256i w = _mm256_cvtepi8_epi16(
                _mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ8_0x8, qs) + 32 * (j & 7) + 16 * (j >> 3))));
            for (int r = 0; r < R; r++) {
                int32_t xv;
                memcpy(&xv, x[(size_t)r * nb + b].qs + 2 * j, sizeof xv);
                s[r] = dp16(s[r], w, _mm256_set1_epi32(xv));
                G8_KEEP(s[r]);
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(x[(size_t)r * nb + b].d)),
                                     _mm256_cvtepi32_ps(s[r]), acc[r]);
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* As g8_rows, for Q4_K groups: nb blocks of 32 (8 per super-block). Per sub-block the same
 * operations, in the same order, as the tile path (tile.c), so a row's result does not depend
 * on which of the two a call takes. */
static inline __attribute__((always_inline)) void g8_q4k_rows(const uint8_t* grp, int nb, const BlockX* x, int R,
                                                              __m256* out) {
    const __m256i low = _mm256_set1_epi16(0x0F);
    __m256 acc[G8_MAX_R];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)(b / 8) * G8_Q4K_BLOCK;
        const int j = b % 8, c = j / 2;
        const uint8_t* words = blk + offsetof(BlockQ4Kx8, qs) + 16 * 16 * c;
        __m256i s[G8_MAX_R];
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
        for (int i = 0; i < 16; i++) {
            const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(words + 16 * i)));
            const __m256i q = j & 1 ? _mm256_srli_epi16(v, 4) : _mm256_and_si256(v, low);
            for (int r = 0; r < R; r++) {
                int32_t xv;
                memcpy(&xv, x[(size_t)r * nb + b].qs + 2 * i, sizeof xv);
                s[r] = dp16(s[r], q, _mm256_set1_epi32(xv));
                G8_KEEP(s[r]);
            }
        }
        __m256 dsc, dm;
        g8_q4k_scales(blk, j, &dsc, &dm);
        const __m256 neg_dm = _mm256_sub_ps(_mm256_setzero_ps(), dm);
        for (int r = 0; r < R; r++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dsc, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(s[r]), acc[r]);
            acc[r] = _mm256_fmadd_ps(neg_dm, _mm256_set1_ps(xb->s), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* As g8_rows, for Q6_K groups (nb blocks of 32, 8 per super-block; each half of a block has a
 * scale of its own). The same operations in the same order as the tile path (tile.c). */
static inline __attribute__((always_inline)) void g8_q6k_rows(const uint8_t* grp, int nb, const BlockX* x, int R,
                                                              __m256* out) {
    const __m256i low = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    __m256 acc[G8_MAX_R];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)(b / 8) * G8_Q6K_BLOCK;
        const int g = b % 8, n = g / 4, k = g % 4;
        const uint8_t* ql = blk + offsetof(BlockQ6Kx8, ql) + 256 * (2 * n + (k & 1));
        const uint8_t* qh = blk + offsetof(BlockQ6Kx8, qh) + 256 * n;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
        for (int half = 0; half < 2; half++) { /* pairs 0..7 (values 0..15), then 8..15 */
            __m256i s[G8_MAX_R];
            for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
            for (int i = 8 * half; i < 8 * half + 8; i += 2) { /* two pairs' vectors as bytes at once */
                const __m256i v = _mm256_loadu_si256((const __m256i*)(ql + 16 * i));
                const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(v, 4) : v, low);
                const __m256i h = _mm256_loadu_si256((const __m256i*)(qh + 16 * i));
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(h, 2 * k), three);
                const __m256i q8 = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), m32);
                const __m256i qa = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q8));
                const __m256i qb = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q8, 1));
                for (int r = 0; r < R; r++) {
                    int32_t xa, xb;
                    memcpy(&xa, x[(size_t)r * nb + b].qs + 2 * i, sizeof xa);
                    memcpy(&xb, x[(size_t)r * nb + b].qs + 2 * i + 2, sizeof xb);
                    s[r] = dp16(dp16(s[r], qa, _mm256_set1_epi32(xa)), qb, _mm256_set1_epi32(xb));
                    G8_KEEP(s[r]);
                }
            }
            const __m256 sc = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + offsetof(BlockQ6Kx8, scales) + 8 * (2 * g + half)))));
            const __m256 dsc = _mm256_mul_ps(d, sc);
            for (int r = 0; r < R; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dsc, _mm256_set1_ps(x[(size_t)r * nb + b].d)),
                                         _mm256_cvtepi32_ps(s[r]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* one copy per layout and R (not inlined into the caller's loop: measured faster so in tile.c) */
static __attribute__((noinline)) void g8_rows_1(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_rows(grp, nb, x, 1, G8_Q4_1, out);
}
static __attribute__((noinline)) void g8_rows_2(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_rows(grp, nb, x, 2, G8_Q4_1, out);
}
static __attribute__((noinline)) void g8_rows_3(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_rows(grp, nb, x, 3, G8_Q4_1, out);
}
static __attribute__((noinline)) void g8_rows_4(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_rows(grp, nb, x, 4, G8_Q4_1, out);
}
static __attribute__((noinline)) void g8_q5_rows_1(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_rows(grp, nb, x, 1, G8_Q5_0, out);
}
static __attribute__((noinline)) void g8_q5_rows_2(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_rows(grp, nb, x, 2, G8_Q5_0, out);
}
static __attribute__((noinline)) void g8_q5_rows_3(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_rows(grp, nb, x, 3, G8_Q5_0, out);
}
static __attribute__((noinline)) void g8_q5_rows_4(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_rows(grp, nb, x, 4, G8_Q5_0, out);
}
static __attribute__((noinline)) void g8_q40_rows_1(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_rows(grp, nb, x, 1, G8_Q4_0, out);
}
static __attribute__((noinline)) void g8_q40_rows_2(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_rows(grp, nb, x, 2, G8_Q4_0, out);
}
static __attribute__((noinline)) void g8_q40_rows_3(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_rows(grp, nb, x, 3, G8_Q4_0, out);
}
static __attribute__((noinline)) void g8_q40_rows_4(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_rows(grp, nb, x, 4, G8_Q4_0, out);
}
static __attribute__((noinline)) void g8_q8_rows_1(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_q8_rows(grp, nb, x, 1, out);
}
static __attribute__((noinline)) void g8_q8_rows_2(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_q8_rows(grp, nb, x, 2, out);
}
static __attribute__((noinline)) void g8_q8_rows_3(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_q8_rows(grp, nb, x, 3, out);
}
static __attribute__((noinline)) void g8_q8_rows_4(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_q8_rows(grp, nb, x, 4, out);
}
static __attribute__((noinline)) void g8_q4k_rows_1(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_q4k_rows(grp, nb, x, 1, out);
}
static __attribute__((noinline)) void g8_q4k_rows_2(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_q4k_rows(grp, nb, x, 2, out);
}
static __attribute__((noinline)) void g8_q4k_rows_3(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_q4k_rows(grp, nb, x, 3, out);
}
static __attribute__((noinline)) void g8_q4k_rows_4(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_q4k_rows(grp, nb, x, 4, out);
}
static __attribute__((noinline)) void g8_q6k_rows_1(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_q6k_rows(grp, nb, x, 1, out);
}
static __attribute__((noinline)) void g8_q6k_rows_2(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_q6k_rows(grp, nb, x, 2, out);
}
static __attribute__((noinline)) void g8_q6k_rows_3(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_q6k_rows(grp, nb, x, 3, out);
}
static __attribute__((noinline)) void g8_q6k_rows_4(const uint8_t* grp, int nb, const BlockX* x, __m256* out) {
    g8_q6k_rows(grp, nb, x, 4, out);
}

typedef void (*G8Rows)(const uint8_t* grp, int nb, const BlockX* x, __m256* out);
#define G8_BY_R(name) {name##_1, name##_2, name##_3, name##_4}

/* The grouped strategy (kinds.h) over a layout's kernels for 1..4 activation rows (index R - 1). */
static inline __attribute__((always_inline)) void run_groups(const Run* r, const G8Rows* k) {
    for (int n = r->lo; n < r->hi; n += G8_ROWS) {
        const uint8_t* grp = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= G8_MAX_R ? G8_MAX_R : r->m1 - m;
            __m256 acc[G8_MAX_R];
            float o[G8_MAX_R * G8_ROWS];
            k[R - 1](grp, r->nb, r->x + (size_t)m * r->nb, acc);
            for (int i = 0; i < R; i++) _mm256_storeu_ps(o + G8_ROWS * i, acc[i]);
            for (int i = 0; i < R; i++)
                for (int c = 0; c < G8_ROWS; c++) run_store(r, m + i, n + c, o[G8_ROWS * i + c]);
            m += R;
        }
    }
}

int exo_x86_grouped_q4_0(const Run* r) {
    static const G8Rows k[] = G8_BY_R(g8_q40_rows);
    run_groups(r, k);
    return 0;
}
int exo_x86_grouped_q4_1(const Run* r) {
    static const G8Rows k[] = G8_BY_R(g8_rows);
    run_groups(r, k);
    return 0;
}
int exo_x86_grouped_q5_0(const Run* r) {
    static const G8Rows k[] = G8_BY_R(g8_q5_rows);
    run_groups(r, k);
    return 0;
}
int exo_x86_grouped_q8_0(const Run* r) {
    static const G8Rows k[] = G8_BY_R(g8_q8_rows);
    run_groups(r, k);
    return 0;
}
int exo_x86_grouped_q4_k(const Run* r) {
    static const G8Rows k[] = G8_BY_R(g8_q4k_rows);
    run_groups(r, k);
    return 0;
}
int exo_x86_grouped_q6_k(const Run* r) {
    static const G8Rows k[] = G8_BY_R(g8_q6k_rows);
    run_groups(r, k);
    return 0;
}
#endif
