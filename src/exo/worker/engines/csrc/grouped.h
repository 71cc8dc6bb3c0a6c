/* Weights re-laid at load in groups of 8 rows (Q4_1, Q5_0, Q8_0, Q4_K, Q6_K: KIND_*_G8),
 * dotted with 1 to 4 activation rows at a time; included by linear.c.
 *
 * Why: one weight row dotted with one activation row ends every 32-value block with a float tail
 * (convert the 8 int32 lanes, scale by d_w d_x, add the m s_x term) that costs as much as its
 * multiply-adds, and the tile path (tile.h) that shares the tail among 8 rows first has to
 * build its tile from 8 rows on every pass. Stored as a tile already, the weights need neither:
 * vector lane c is row c of the group, one multiply-add of a broadcast activation pair gives 8
 * rows' partial sums, and one convert and one or two FMAs finish a block for all 8 rows; decode
 * (one activation row) runs this way too. Measured against the per-row kernels with weights not
 * in cache, one thread, at 1 / 2 activation rows: Q4_1 1.9-2.2x / 1.7x, Q8_0 1.25x / 1.65x,
 * Q5_0 1.2x / 1.35x, Q4_K 1.7x / 2.3x, Q6_K 1.25x / 1.5x (SmolLM2's and Gemma 3's layer
 * shapes). From a few rows on (linear.c: G8_*_TILE_ROWS) a group is turned into a tile and used
 * there (tile_from_group): each pass then reads int8 pairs, and building it needs no transpose.
 *
 * The layout, per group of 8 rows (rows 8g .. 8g + 7 of a part) and per block b of 32 values,
 * 160 bytes at (g nb + b) 160: the 8 rows' f16 d (16 bytes, row c at 2c), their 8 f16 m, then 8
 * vectors of 16 bytes: vector i holds word i of each row's 16 bytes of nibbles (bytes 2i, 2i + 1
 * of row c at bytes 2c, 2c + 1). Word i's low nibbles are the row's values 2i, 2i + 1 (pair i),
 * its high nibbles values 2i + 16, 2i + 17 (pair i + 8). A group has the bytes of its 8 rows,
 * so offsets by rows stay those of Q4_1; a part so laid has a multiple of 8 rows.
 *
 * Q5_0 (KIND_Q5_0_G8), 176 bytes per group and block: the 8 rows' f16 d, then for i = 0..7 a
 * 32-bit word of fifth bits (bit 2c + e: row c's value 2i + e, bit 16 + 2c + e: its value
 * 2i + 16 + e), then the nibbles as Q4_1's; the values are signed, q - 16, with no offset.
 *
 * Q4_K (KIND_Q4_K_G8), 1152 bytes per group and super-block of 256 values: the 8 rows' f16 d,
 * their f16 dmin, their 12 bytes of packed 6-bit scales and mins transposed (byte k of row c at
 * 32 + 8k + c: one load gives a byte of all 8 rows), then for each 64-value chunk c and word i
 * of its 32 bytes the 8 rows' words (as Q4_1's: low nibbles are sub-block 2c's pair i, high
 * nibbles sub-block 2c + 1's).
 *
 * Q6_K (KIND_Q6_K_G8), 1680 bytes per group and super-block: the 8 rows' f16 d, their 16 int8
 * scales transposed (scale k of row c at 16 + 8k + c), then for each of ql's four 32-byte chunks
 * and word i the 8 rows' words, then the same for qh's two 32-byte halves.
 *
 * Q8_0 the same way (KIND_Q8_G8), 272 bytes per group and block: the 8 rows' f16 d, then 256 bytes
 * of int8 values laid as a tile's (tile.h): pair j (values 2j, 2j + 1) of row c at byte
 * 32 (j % 8) + 16 (j / 8) + 2c. A tile already, it is read directly at any number of rows.
 *
 * Both builds sum a block's 32 products per row as integers, then add d_w d_x isum and m s_x
 * in the same order, so a row's result does not depend on how many rows are in the call.
 */
#include "exo_kernels.h"

#define G8_ROWS 8
#define G8_BLOCK 160 /* bytes of a group's block: 8 d, 8 m (f16), 8 x 16 bytes of nibbles */
#define G8_MAX_R 4   /* activation rows per pass over a group (registers) */
#define G8_Q8_BLOCK 272 /* Q8_0: 8 d (f16), 256 bytes of values */
#define G8_Q5_BLOCK 176 /* Q5_0: 8 d (f16), 8 words of fifth bits, 128 bytes of nibbles */
#define G8_Q4K_BLOCK 1152 /* Q4_K, per super-block: 8 d, 8 dmin (f16), 12 x 8 scale bytes, nibbles */
#define G8_Q6K_BLOCK 1680 /* Q6_K, per super-block: 8 d (f16), 16 x 8 scales, low 4 bits, high 2 */

static inline int is_grouped(int kind) {
    return kind == KIND_Q4_G8 || kind == KIND_Q8_G8 || kind == KIND_Q5_0_G8 || kind == KIND_Q4_K_G8 ||
           kind == KIND_Q6_K_G8;
}

/* The file's layout of a grouped one (the tile of a group is that layout's); others as they are. */
static inline int g8_file_kind(int kind) {
    switch (kind) {
        case KIND_Q4_G8: return KIND_Q4;
        case KIND_Q8_G8: return KIND_Q8;
        case KIND_Q5_0_G8: return KIND_Q5_0;
        case KIND_Q4_K_G8: return KIND_Q4_K;
        case KIND_Q6_K_G8: return KIND_Q6_K;
        default: return kind;
    }
}

#if EXO_AVX2
/* An empty asm that "changes" v: the sums stay running chains in registers (see tile.h). */
#define G8_KEEP(v) __asm__("" : "+x"(v))

/* out[r] lane c = dot of row c of the group at `grp` with activation row r (x + r nb); `five`:
 * a Q5_0 group (a constant at each call: the unpacking specialises), else Q4_1. */
static inline __attribute__((always_inline)) void g8_rows(const uint8_t* grp, int nb, const BlockX* x, int R,
                                                          int five, __m256* out) {
    const __m256i low = _mm256_set1_epi16(0x0F), minus16 = _mm256_set1_epi16(-16);
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                          (short)0x8000);
    __m256 acc[G8_MAX_R];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)b * (five ? G8_Q5_BLOCK : G8_BLOCK);
        const uint8_t* nibbles = blk + (five ? 48 : 32);
        __m256i s[G8_MAX_R];
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
        for (int i = 0; i < 8; i++) {
            /* byte 2c + e -> word 2c + e: its low nibble is row c's value 2i + e, its high one
             * value 2i + 16 + e */
            const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(nibbles + 16 * i)));
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_srli_epi16(v, 4);
            if (five) { /* q - 16 = nibble + (fifth bit ? 0 : -16), word 2c + e: bit 2c + e of h */
                uint32_t h;
                memcpy(&h, blk + 16 + 4 * i, sizeof h);
                const __m256i hl = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(h & 0xFFFF)), bit), bit);
                const __m256i hh = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(h >> 16)), bit), bit);
                lo = _mm256_add_epi16(lo, _mm256_andnot_si256(hl, minus16));
                hi = _mm256_add_epi16(hi, _mm256_andnot_si256(hh, minus16));
            }
            for (int r = 0; r < R; r++) {
                int32_t x0, x1; /* activation pairs i and i + 8 */
                memcpy(&x0, x[(size_t)r * nb + b].qs + 2 * i, sizeof x0);
                memcpy(&x1, x[(size_t)r * nb + b].qs + 2 * i + 16, sizeof x1);
                const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_set1_epi32(x0)),
                                                   _mm256_madd_epi16(hi, _mm256_set1_epi32(x1)));
                s[r] = _mm256_add_epi32(s[r], p);
                G8_KEEP(s[r]);
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
        const __m256 m = five ? d : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + 16)));
        for (int r = 0; r < R; r++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(s[r]), acc[r]);
            if (!five) acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xb->s), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* The 8 rows' scale d sc_j and offset dmin m_j of sub-block j of a Q4_K group's super-block
 * (the 6-bit pairs unpacked for all rows at once, as dot_kquants.h's q4k_scale_min does one). */
static inline __attribute__((always_inline)) void g8_q4k_scales(const uint8_t* blk, int j, __m256* dsc, __m256* dm) {
    const uint8_t* bytes = blk + 32;
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
    *dm = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + 16))), _mm256_cvtepi32_ps(mn));
}

/* The tile (tile.h) of a group, for many activation rows (prefill): the nibbles split into
 * int8 pairs, no transpose (the group is one already), and the scales as floats. */
static void tile_from_group(int kind, const uint8_t* grp, int nb, Tile t) {
    const __m128i low = _mm_set1_epi8(0x0F);
    if (kind == KIND_Q4_K_G8) { /* tile block 8 s + j: sub-block j of super-block s */
        for (int b = 0; b < nb; b++) {
            const uint8_t* blk = grp + (size_t)(b / 8) * G8_Q4K_BLOCK;
            const int j = b % 8, c = j / 2;
            int8_t* q = t.q + (size_t)b * 256;
            for (int i = 0; i < 16; i++) { /* pair i at 32 (i % 8) + 16 (i / 8) */
                const __m128i v = _mm_loadu_si128((const __m128i*)(blk + 128 + 16 * (16 * c + i)));
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
            const uint8_t* ql = blk + 144 + 256 * (2 * n + (k & 1));
            const uint8_t* qh = blk + 1168 + 256 * n;
            int8_t* q = t.q + (size_t)b * 256;
            for (int i = 0; i < 16; i++) {
                const __m128i v = _mm_loadu_si128((const __m128i*)(ql + 16 * i));
                const __m128i lo = k >= 2 ? _mm_and_si128(_mm_srli_epi16(v, 4), low) : _mm_and_si128(v, low);
                const __m128i hi = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i*)(qh + 16 * i)), 2 * k), three);
                _mm_storeu_si128((__m128i*)(q + 32 * (i % 8) + 16 * (i / 8)), _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), m32));
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
            const __m256 sa = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 16 + 8 * (2 * g)))));
            const __m256 sb = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 16 + 8 * (2 * g + 1)))));
            _mm256_storeu_ps(t.d + (size_t)b * TILE_COLS, _mm256_mul_ps(d, sa));
            _mm256_storeu_ps(t.d2 + (size_t)b * TILE_COLS, _mm256_mul_ps(d, sb));
        }
        return;
    }
    if (kind == KIND_Q8_G8) { /* the values are a tile's already */
        for (int b = 0; b < nb; b++) {
            const uint8_t* blk = grp + (size_t)b * G8_Q8_BLOCK;
            memcpy(t.q + (size_t)b * 256, blk + 16, 256);
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
                memcpy(&h, blk + 16 + 4 * i, sizeof h);
                const __m128i v = _mm_loadu_si128((const __m128i*)(blk + 48 + 16 * i));
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
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)b * G8_BLOCK;
        int8_t* q = t.q + (size_t)b * 256;
        for (int i = 0; i < 8; i++) { /* pair i at 32 i, pair i + 8 at 32 i + 16 */
            const __m128i v = _mm_loadu_si128((const __m128i*)(blk + 32 + 16 * i));
            _mm_storeu_si128((__m128i*)(q + 32 * i), _mm_and_si128(v, low));
            _mm_storeu_si128((__m128i*)(q + 32 * i + 16), _mm_and_si128(_mm_srli_epi16(v, 4), low));
        }
        _mm256_storeu_ps(t.d + (size_t)b * TILE_COLS, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk)));
        _mm256_storeu_ps(t.m + (size_t)b * TILE_COLS, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + 16))));
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
                _mm_loadu_si128((const __m128i*)(blk + 16 + 32 * (j & 7) + 16 * (j >> 3))));
            for (int r = 0; r < R; r++) {
                int32_t xv;
                memcpy(&xv, x[(size_t)r * nb + b].qs + 2 * j, sizeof xv);
                s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(w, _mm256_set1_epi32(xv)));
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
 * operations, in the same order, as the tile path (tile.h), so a row's result does not depend
 * on which of the two a call takes. */
static inline __attribute__((always_inline)) void g8_q4k_rows(const uint8_t* grp, int nb, const BlockX* x, int R,
                                                              __m256* out) {
    const __m256i low = _mm256_set1_epi16(0x0F);
    __m256 acc[G8_MAX_R];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)(b / 8) * G8_Q4K_BLOCK;
        const int j = b % 8, c = j / 2;
        const uint8_t* words = blk + 128 + 16 * 16 * c;
        __m256i s[G8_MAX_R];
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
        for (int i = 0; i < 16; i++) {
            const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(words + 16 * i)));
            const __m256i q = j & 1 ? _mm256_srli_epi16(v, 4) : _mm256_and_si256(v, low);
            for (int r = 0; r < R; r++) {
                int32_t xv;
                memcpy(&xv, x[(size_t)r * nb + b].qs + 2 * i, sizeof xv);
                s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(q, _mm256_set1_epi32(xv)));
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
 * scale of its own). The same operations in the same order as the tile path (tile.h). */
static inline __attribute__((always_inline)) void g8_q6k_rows(const uint8_t* grp, int nb, const BlockX* x, int R,
                                                              __m256* out) {
    const __m256i low = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    __m256 acc[G8_MAX_R];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)(b / 8) * G8_Q6K_BLOCK;
        const int g = b % 8, n = g / 4, k = g % 4;
        const uint8_t* ql = blk + 144 + 256 * (2 * n + (k & 1));
        const uint8_t* qh = blk + 1168 + 256 * n;
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
                    s[r] = _mm256_add_epi32(s[r], _mm256_add_epi32(_mm256_madd_epi16(qa, _mm256_set1_epi32(xa)),
                                                                   _mm256_madd_epi16(qb, _mm256_set1_epi32(xb))));
                    G8_KEEP(s[r]);
                }
            }
            const __m256 sc = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 16 + 8 * (2 * g + half)))));
            const __m256 dsc = _mm256_mul_ps(d, sc);
            for (int r = 0; r < R; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dsc, _mm256_set1_ps(x[(size_t)r * nb + b].d)),
                                         _mm256_cvtepi32_ps(s[r]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* one copy per layout and R (not inlined into the caller's loop: measured faster so in tile.h) */
#define G8_ROWS_FOR(R)                                                                            \
static __attribute__((noinline)) void g8_rows_##R(const uint8_t* grp, int nb, const BlockX* x, __m256* out) { \
    g8_rows(grp, nb, x, R, 0, out);                                                              \
}                                                                                                \
static __attribute__((noinline)) void g8_q5_rows_##R(const uint8_t* grp, int nb, const BlockX* x, __m256* out) { \
    g8_rows(grp, nb, x, R, 1, out);                                                              \
}                                                                                                \
static __attribute__((noinline)) void g8_q8_rows_##R(const uint8_t* grp, int nb, const BlockX* x, __m256* out) { \
    g8_q8_rows(grp, nb, x, R, out);                                                              \
}                                                                                                \
static __attribute__((noinline)) void g8_q4k_rows_##R(const uint8_t* grp, int nb, const BlockX* x, __m256* out) { \
    g8_q4k_rows(grp, nb, x, R, out);                                                             \
}                                                                                                \
static __attribute__((noinline)) void g8_q6k_rows_##R(const uint8_t* grp, int nb, const BlockX* x, __m256* out) { \
    g8_q6k_rows(grp, nb, x, R, out);                                                             \
}
G8_ROWS_FOR(1)
G8_ROWS_FOR(2)
G8_ROWS_FOR(3)
G8_ROWS_FOR(4)

typedef void (*G8Rows)(const uint8_t* grp, int nb, const BlockX* x, __m256* out);
#define G8_BY_R(name) {name##_1, name##_2, name##_3, name##_4}

/* The kernel of a grouped layout for 1..4 activation rows (index R - 1). */
static const G8Rows* g8_kernels(int kind) {
    static const G8Rows q4[] = G8_BY_R(g8_rows), q5[] = G8_BY_R(g8_q5_rows), q8[] = G8_BY_R(g8_q8_rows),
                        q4k[] = G8_BY_R(g8_q4k_rows), q6k[] = G8_BY_R(g8_q6k_rows);
    switch (kind) {
        case KIND_Q8_G8: return q8;
        case KIND_Q5_0_G8: return q5;
        case KIND_Q4_K_G8: return q4k;
        case KIND_Q6_K_G8: return q6k;
        default: return q4;
    }
}
#endif

#if !EXO_AVX2
/* Plain C: the layouts above read value by value. */

/* Value l (0..31) of block b of row c of the group, as the integer its scale multiplies. */
static inline int32_t g8_value(int kind, const uint8_t* grp, int b, int c, int l) {
    const int pair = l / 2, e = l % 2, high = l >= 16, i = pair % 8; /* i: the nibble word */
    switch (kind) {
        case KIND_Q8_G8:
            return (int8_t)grp[(size_t)b * G8_Q8_BLOCK + 16 + 32 * (pair % 8) + 16 * (pair / 8) + 2 * c + e];
        case KIND_Q4_K_G8: { /* sub-block j of the super-block: chunk j / 2, high nibbles if j is odd */
            const int j = b % 8;
            const uint8_t byte = grp[(size_t)(b / 8) * G8_Q4K_BLOCK + 128 + 16 * (16 * (j / 2) + pair) + 2 * c + e];
            return j & 1 ? byte >> 4 : byte & 15;
        }
        case KIND_Q6_K_G8: { /* 32-value group g = 4 n + k of the super-block */
            const uint8_t* blk = grp + (size_t)(b / 8) * G8_Q6K_BLOCK;
            const int g = b % 8, n = g / 4, k = g % 4;
            const uint8_t l4 = blk[144 + 256 * (2 * n + (k & 1)) + 16 * pair + 2 * c + e];
            const uint8_t h2 = blk[1168 + 256 * n + 16 * pair + 2 * c + e];
            return ((k >= 2 ? l4 >> 4 : l4 & 15) | (((h2 >> (2 * k)) & 3) << 4)) - 32;
        }
        case KIND_Q5_0_G8: { /* q - 16 */
            const uint8_t* blk = grp + (size_t)b * G8_Q5_BLOCK;
            const uint8_t byte = blk[48 + 16 * i + 2 * c + e];
            uint32_t h;
            memcpy(&h, blk + 16 + 4 * i, sizeof h);
            return (high ? byte >> 4 : byte & 15) - (((h >> (16 * high + 2 * c + e)) & 1) ? 0 : 16);
        }
        default: { /* Q4_1 */
            const uint8_t byte = grp[(size_t)b * G8_BLOCK + 32 + 16 * i + 2 * c + e];
            return high ? byte >> 4 : byte & 15;
        }
    }
}

/* The scales of block b of row c: w = d[l / 16] q + m (d[0] == d[1] but for Q6_K; m is 0 but for
 * Q4_1 and Q4_K). */
static inline void g8_scales(int kind, const uint8_t* grp, int b, int c, float d[2], float* m) {
    uint16_t h;
    *m = 0.0f;
    switch (kind) {
        case KIND_Q4_K_G8: {
            const uint8_t* blk = grp + (size_t)(b / 8) * G8_Q4K_BLOCK;
            uint8_t packed[12];
            for (int k = 0; k < 12; k++) packed[k] = blk[32 + 8 * k + c];
            int sc, mn;
            q4k_scale_min(packed, b % 8, &sc, &mn);
            memcpy(&h, blk + 2 * c, 2);
            d[0] = d[1] = exo_h2f(h) * (float)sc;
            memcpy(&h, blk + 16 + 2 * c, 2);
            *m = -(exo_h2f(h) * (float)mn);
            return;
        }
        case KIND_Q6_K_G8: {
            const uint8_t* blk = grp + (size_t)(b / 8) * G8_Q6K_BLOCK;
            const int g = b % 8;
            memcpy(&h, blk + 2 * c, 2);
            for (int half = 0; half < 2; half++) d[half] = exo_h2f(h) * (float)(int8_t)blk[16 + 8 * (2 * g + half) + c];
            return;
        }
        default: { /* d first in every 32-value group block; Q4_1's m after the 8 d */
            const size_t bytes = kind == KIND_Q8_G8 ? G8_Q8_BLOCK : kind == KIND_Q5_0_G8 ? G8_Q5_BLOCK : G8_BLOCK;
            const uint8_t* blk = grp + (size_t)b * bytes;
            memcpy(&h, blk + 2 * c, 2);
            d[0] = d[1] = exo_h2f(h);
            if (kind == KIND_Q4_G8) {
                memcpy(&h, blk + 16 + 2 * c, 2);
                *m = exo_h2f(h);
            }
        }
    }
}
#endif

/* out[r * 8 + c] = dot of row c of the group (a grouped layout `kind`) with activation row r,
 * for R = 1..G8_MAX_R rows. */
static inline void g8_dot(int kind, const uint8_t* grp, int nb, const BlockX* x, int R, float* out) {
#if EXO_AVX2
    __m256 acc[G8_MAX_R];
    g8_kernels(kind)[R - 1](grp, nb, x, acc);
    for (int r = 0; r < R; r++) _mm256_storeu_ps(out + G8_ROWS * r, acc[r]);
#else
    const int halves = kind == KIND_Q6_K_G8, has_m = kind == KIND_Q4_G8 || kind == KIND_Q4_K_G8;
    for (int r = 0; r < R; r++) {
        float acc[G8_ROWS] = {0.0f};
        for (int b = 0; b < nb; b++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            for (int c = 0; c < G8_ROWS; c++) {
                float d[2], m;
                g8_scales(kind, grp, b, c, d, &m);
                int32_t isum[2] = {0, 0}; /* values 0..15, 16..31 */
                for (int l = 0; l < QK; l++) isum[l / 16] += g8_value(kind, grp, b, c, l) * xb->qs[l];
                if (halves) {
                    acc[c] += d[0] * xb->d * (float)isum[0];
                    acc[c] += d[1] * xb->d * (float)isum[1];
                } else {
                    acc[c] += d[0] * xb->d * (float)(isum[0] + isum[1]);
                }
                if (has_m) acc[c] += m * xb->s;
            }
        }
        for (int c = 0; c < G8_ROWS; c++) out[G8_ROWS * r + c] = acc[c];
    }
#endif
}
