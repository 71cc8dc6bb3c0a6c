/* The grouped strategy at 8-bit activations (ACT_X8), plain C: the repacked Q4_0 / Q4_1 / Q8_0 /
 * Q4_K / Q6_K groups (KIND_*_G8; exo_kernels.h) against 8-bit activation rows, in act8.h's order
 * (the same floats as the per-row dots of the file's rows, act8.c). */
#include "act8.h"

/* Row c's 16 nibble bytes of a group's block: byte 2i + e of the row at qs[i][2c + e]. */
static inline void row_nibbles(const uint8_t (*qs)[16], int c, uint8_t out[16]) {
    for (int j = 0; j < 16; j++) out[j] = qs[j / 2][2 * c + j % 2];
}

/* out[c] = row c of the group at `grp` (nb blocks) dotted with the activation row x. */
static void group_dot(int has_m, const uint8_t* grp, const BlockX8* x, int nb, float out[8]) {
    float acc[8] = {0};
    uint8_t qs[16];
    for (int b = 0; b < nb; b++)
        for (int c = 0; c < 8; c++) {
            float d, m;
            if (has_m) {
                const BlockQ4_1x8* blk = (const BlockQ4_1x8*)grp + b;
                d = exo_h2f(blk->d[c]), m = exo_h2f(blk->m[c]);
                row_nibbles(blk->qs, c, qs);
            } else {
                const BlockQ4_0x8* blk = (const BlockQ4_0x8*)grp + b;
                d = exo_h2f(blk->d[c]), m = -8.0f * d;
                row_nibbles(blk->qs, c, qs);
            }
            acc[c] = act8_step(acc[c], d, m, x + b, q4_isum8(qs, x[b].qs));
        }
    for (int c = 0; c < 8; c++) out[c] = acc[c];
}

/* The same for a Q8_0 group (value 2j + e of row c at qs[32 (j % 8) + 16 (j / 8) + 2c + e]). */
static void group_dot_q8_0(const uint8_t* grp, const BlockX8* x, int nb, float out[8]) {
    float acc[8] = {0};
    int8_t qs[32];
    for (int b = 0; b < nb; b++) {
        const BlockQ8_0x8* blk = (const BlockQ8_0x8*)grp + b;
        for (int c = 0; c < 8; c++) {
            for (int v = 0; v < 32; v++) qs[v] = blk->qs[32 * ((v / 2) % 8) + 16 * (v / 16) + 2 * c + v % 2];
            acc[c] = act8_step0(acc[c], exo_h2f(blk->d[c]), x + b, q8_isum8(qs, x[b].qs));
        }
    }
    for (int c = 0; c < 8; c++) out[c] = acc[c];
}

/* The same for a Q4_K group (per super-block: scales[k][c], qs[ch][i][2c + e]: exo_kernels.h). */
static void group_dot_q4_k(const uint8_t* grp, const BlockX8* x, int nb, float out[8]) {
    float acc[8] = {0};
    uint8_t packed[12], qs[32];
    for (int b = 0; b < nb; b++) {
        const BlockQ4Kx8* blk = (const BlockQ4Kx8*)grp + b / 8;
        const int j = b % 8;
        for (int c = 0; c < 8; c++) {
            for (int k = 0; k < 12; k++) packed[k] = blk->scales[k][c];
            for (int v = 0; v < 32; v++) qs[v] = blk->qs[j / 2][v / 2][2 * c + v % 2];
            float d, m;
            q4k_sub(packed, blk->d[c], blk->dmin[c], j, &d, &m);
            acc[c] = act8_step(acc[c], d, m, x + b, nibbles_isum8(qs, j & 1, x[b].qs));
        }
    }
    for (int c = 0; c < 8; c++) out[c] = acc[c];
}

/* The same for a Q6_K group (per super-block: d[c], scales[k][c], ql[q][i][2c + e], qh[h][i][2c + e]):
 * row c's bytes gathered into a file block, then its values as the per-row dot reads them. */
static void group_dot_q6_k(const uint8_t* grp, const BlockX8* x, int nb, float out[8]) {
    float acc[8] = {0};
    BlockQ6K row;
    for (int b = 0; b < nb; b++) {
        const BlockQ6Kx8* blk = (const BlockQ6Kx8*)grp + b / 8;
        const int g = b % 8;
        for (int c = 0; c < 8; c++) {
            for (int v = 0; v < 128; v++) row.ql[v] = blk->ql[v / 32][(v % 32) / 2][2 * c + v % 2];
            for (int v = 0; v < 64; v++) row.qh[v] = blk->qh[v / 32][(v % 32) / 2][2 * c + v % 2];
            for (int h = 0; h < 2; h++) {
                int32_t isum = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) isum += q6k_value(&row, g, l) * x[b].qs[l];
                acc[c] = act8_step0(acc[c], exo_h2f(blk->d[c]) * (float)blk->scales[2 * g + h][c], x + b, isum);
            }
        }
    }
    for (int c = 0; c < 8; c++) out[c] = acc[c];
}

int exo_generic_grouped8(const Run* r) {
    const int has_m = r->kind == KIND_Q4_1_G8;
    float out[8];
    for (int n = r->lo; n < r->hi; n += 8) {
        const uint8_t* grp = run_row(r, n);
        for (int m = r->m0; m < r->m1; m++) {
            if (r->kind == KIND_Q8_0_G8)
                group_dot_q8_0(grp, r->x8 + (size_t)m * r->nb, r->nb, out);
            else if (r->kind == KIND_Q6_K_G8)
                group_dot_q6_k(grp, r->x8 + (size_t)m * r->nb, r->nb, out);
            else if (r->kind == KIND_Q4_K_G8)
                group_dot_q4_k(grp, r->x8 + (size_t)m * r->nb, r->nb, out);
            else
                group_dot(has_m, grp, r->x8 + (size_t)m * r->nb, r->nb, out);
            for (int c = 0; c < 8; c++) run_store(r, m, n + c, out[c]);
        }
    }
    return 0;
}
