/* Weights re-laid at load in groups of 8 rows (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K: KIND_*_G8),
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
#include "kinds.h"
#include "quants.h"

#define G8_ROWS 8
#define G8_MAX_R 4 /* activation rows per pass over a group (registers) */


/* Plain C: the layouts above read value by value. */

/* Value l (0..31) of block b of row c of the group, as the integer its scale multiplies. */
static inline int32_t g8_value(int kind, const uint8_t* grp, int b, int c, int l) {
    const int pair = l / 2, e = l % 2, high = l >= 16, i = pair % 8; /* i: the nibble word */
    switch (kind) {
        case KIND_Q8_0_G8:
            return ((const BlockQ8_0x8*)grp)[b].qs[32 * (pair % 8) + 16 * (pair / 8) + 2 * c + e];
        case KIND_Q4_K_G8: { /* sub-block j of the super-block: chunk j / 2, high nibbles if j is odd */
            const int j = b % 8;
            const uint8_t byte = ((const BlockQ4Kx8*)grp)[b / 8].qs[j / 2][pair][2 * c + e];
            return j & 1 ? byte >> 4 : byte & 15;
        }
        case KIND_Q6_K_G8: { /* 32-value group g = 4 n + k of the super-block */
            const BlockQ6Kx8* blk = (const BlockQ6Kx8*)grp + b / 8;
            const int g = b % 8, n = g / 4, k = g % 4;
            const uint8_t l4 = blk->ql[2 * n + (k & 1)][pair][2 * c + e];
            const uint8_t h2 = blk->qh[n][pair][2 * c + e];
            return ((k >= 2 ? l4 >> 4 : l4 & 15) | (((h2 >> (2 * k)) & 3) << 4)) - 32;
        }
        case KIND_Q5_0_G8: { /* q - 16 */
            const BlockQ5_0x8* blk = (const BlockQ5_0x8*)grp + b;
            const uint8_t byte = blk->qs[i][2 * c + e];
            uint32_t h;
            memcpy(&h, blk->qh[i], sizeof h);
            return (high ? byte >> 4 : byte & 15) - (((h >> (16 * high + 2 * c + e)) & 1) ? 0 : 16);
        }
        case KIND_Q5_1_G8: { /* issue 22 q5g: q, 0..31 */
            const BlockQ5_1x8* blk = (const BlockQ5_1x8*)grp + b;
            const uint8_t byte = blk->qs[i][2 * c + e];
            uint32_t h;
            memcpy(&h, blk->qh[i], sizeof h);
            return (high ? byte >> 4 : byte & 15) | (int32_t)(((h >> (16 * high + 2 * c + e)) & 1u) << 4);
        }
        case KIND_Q5_K_G8: { /* issue 22 q5g: Q4_K's nibble | bit j of the value's qh byte << 4 */
            const BlockQ5Kx8* blk = (const BlockQ5Kx8*)grp + b / 8;
            const int j = b % 8;
            const uint8_t byte = blk->qs[j / 2][l / 2][2 * c + e];
            return (j & 1 ? byte >> 4 : byte & 15) | (((blk->qh[l / 2][2 * c + e] >> j) & 1) << 4);
        }
        case KIND_Q4_0_G8: { /* q - 8 */
            const uint8_t byte = ((const BlockQ4_0x8*)grp)[b].qs[i][2 * c + e];
            return (high ? byte >> 4 : byte & 15) - 8;
        }
        default: { /* Q4_1 */
            const uint8_t byte = ((const BlockQ4_1x8*)grp)[b].qs[i][2 * c + e];
            return high ? byte >> 4 : byte & 15;
        }
    }
}

/* The scales of block b of row c: w = d[l / 16] q + m (d[0] == d[1] but for Q6_K; m is 0 but for
 * Q4_1 and Q4_K). */
static inline void g8_scales(int kind, const uint8_t* grp, int b, int c, float d[2], float* m) {
    *m = 0.0f;
    switch (kind) {
        case KIND_Q4_K_G8: {
            const BlockQ4Kx8* blk = (const BlockQ4Kx8*)grp + b / 8;
            uint8_t packed[12];
            for (int k = 0; k < 12; k++) packed[k] = blk->scales[k][c];
            int sc, mn;
            q4k_scale_min(packed, b % 8, &sc, &mn);
            d[0] = d[1] = exo_h2f(blk->d[c]) * (float)sc;
            *m = -(exo_h2f(blk->dmin[c]) * (float)mn);
            return;
        }
        case KIND_Q6_K_G8: {
            const BlockQ6Kx8* blk = (const BlockQ6Kx8*)grp + b / 8;
            const int g = b % 8;
            for (int half = 0; half < 2; half++) d[half] = exo_h2f(blk->d[c]) * (float)blk->scales[2 * g + half][c];
            return;
        }
        case KIND_Q5_K_G8: { /* issue 22 q5g: as Q4_K's */
            const BlockQ5Kx8* blk = (const BlockQ5Kx8*)grp + b / 8;
            uint8_t packed[12];
            for (int k = 0; k < 12; k++) packed[k] = blk->scales[k][c];
            int sc, mn;
            q4k_scale_min(packed, b % 8, &sc, &mn);
            d[0] = d[1] = exo_h2f(blk->d[c]) * (float)sc;
            *m = -(exo_h2f(blk->dmin[c]) * (float)mn);
            return;
        }
        case KIND_Q5_1_G8: { /* issue 22 q5g */
            const BlockQ5_1x8* blk = (const BlockQ5_1x8*)grp + b;
            d[0] = d[1] = exo_h2f(blk->d[c]);
            *m = exo_h2f(blk->m[c]);
            return;
        }
        case KIND_Q8_0_G8: d[0] = d[1] = exo_h2f(((const BlockQ8_0x8*)grp)[b].d[c]); return;
        case KIND_Q5_0_G8: d[0] = d[1] = exo_h2f(((const BlockQ5_0x8*)grp)[b].d[c]); return;
        case KIND_Q4_0_G8: d[0] = d[1] = exo_h2f(((const BlockQ4_0x8*)grp)[b].d[c]); return;
        default: { /* Q4_1 */
            const BlockQ4_1x8* blk = (const BlockQ4_1x8*)grp + b;
            d[0] = d[1] = exo_h2f(blk->d[c]);
            *m = exo_h2f(blk->m[c]);
        }
    }
}

/* out[r * 8 + c] = dot of row c of the group (a grouped layout `kind`) with activation row r,
 * for R = 1..G8_MAX_R rows. */
static inline void g8_dot(int kind, const uint8_t* grp, int nb, const BlockX* x, int R, float* out) {
    const int halves = kind == KIND_Q6_K_G8, has_m = kind == KIND_Q4_1_G8 || kind == KIND_Q4_K_G8 ||
                                                  kind == KIND_Q5_1_G8 || kind == KIND_Q5_K_G8; /* issue 22 q5g */
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
