/* Weights re-laid at load in groups of 8 rows (Q4_1, Q5_0, Q8_0, Q4_K, Q6_K: KIND_*_G8),
 * dotted with 1 to 4 activation rows at a time; plain C (repack.c builds the groups).
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
 * shapes). From a few rows on (kinds.c: a repacked kind's tile_rows) a group is turned into a tile and used
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
 * Q8_0 the same way (KIND_Q8_0_G8), 272 bytes per group and block: the 8 rows' f16 d, then 256 bytes
 * of int8 values laid as a tile's (arch/x86/tile.c): pair j (values 2j, 2j + 1) of row c at byte
 * 32 (j % 8) + 16 (j / 8) + 2c. A tile already, it is read directly at any number of rows.
 *
 * Both builds sum a block's 32 products per row as integers, then add d_w d_x isum and m s_x
 * in the same order, so a row's result does not depend on how many rows are in the call.
 */
#include "kinds.h"
#include "quants.h"

#define G8_ROWS 8
#define G8_MAX_R 4 /* activation rows per pass over a group (registers) */
/* bytes of a group's block (exo_kernels.h) */
#define G8_BLOCK ((int)sizeof(BlockQ4_1x8))
#define G8_Q8_BLOCK ((int)sizeof(BlockQ8_0x8))
#define G8_Q5_BLOCK ((int)sizeof(BlockQ5_0x8))
#define G8_Q4K_BLOCK ((int)sizeof(BlockQ4Kx8))
#define G8_Q6K_BLOCK ((int)sizeof(BlockQ6Kx8))


/* Plain C: the layouts above read value by value. */

/* Value l (0..31) of block b of row c of the group, as the integer its scale multiplies. */
static inline int32_t g8_value(int kind, const uint8_t* grp, int b, int c, int l) {
    const int pair = l / 2, e = l % 2, high = l >= 16, i = pair % 8; /* i: the nibble word */
    switch (kind) {
        case KIND_Q8_0_G8:
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
            const size_t bytes = kind == KIND_Q8_0_G8 ? G8_Q8_BLOCK : kind == KIND_Q5_0_G8 ? G8_Q5_BLOCK : G8_BLOCK;
            const uint8_t* blk = grp + (size_t)b * bytes;
            memcpy(&h, blk + 2 * c, 2);
            d[0] = d[1] = exo_h2f(h);
            if (kind == KIND_Q4_1_G8) {
                memcpy(&h, blk + 16 + 2 * c, 2);
                *m = exo_h2f(h);
            }
        }
    }
}

/* out[r * 8 + c] = dot of row c of the group (a grouped layout `kind`) with activation row r,
 * for R = 1..G8_MAX_R rows. */
static inline void g8_dot(int kind, const uint8_t* grp, int nb, const BlockX* x, int R, float* out) {
    const int halves = kind == KIND_Q6_K_G8, has_m = kind == KIND_Q4_1_G8 || kind == KIND_Q4_K_G8;
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
}

/* The grouped strategy (kinds.h). */
int exo_generic_grouped(const Run* r) {
    for (int n = r->lo; n < r->hi; n += G8_ROWS) {
        const uint8_t* grp = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= G8_MAX_R ? G8_MAX_R : r->m1 - m;
            float o[G8_MAX_R * G8_ROWS];
            g8_dot(r->kind, grp, r->nb, r->x + (size_t)m * r->nb, R, o);
            for (int i = 0; i < R; i++)
                for (int c = 0; c < G8_ROWS; c++) run_store(r, m + i, n + c, o[G8_ROWS * i + c]);
            m += R;
        }
    }
    return 0;
}
