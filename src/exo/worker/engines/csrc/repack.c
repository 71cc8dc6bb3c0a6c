/* The repacked layouts (exo_kernels.h: BlockQ4_1x8 ...) built from the file's rows, and rows read
 * back from them (an embedding's lookups in a tied head's groups). One function says where each
 * byte of a row goes in its group's blocks (`place`); both directions use it, so they cannot
 * disagree. The test harness checks the groups against its own reference (harness/reference.c). */
#include <stdlib.h>
#include <string.h>

#include "kinds.h"

/* Copy n bytes between a row's bytes and a group's: to the group when `in`, else back. */
static inline void move(uint8_t* row, uint8_t* grp, size_t n, int in) {
    if (in) memcpy(grp, row, n);
    else memcpy(row, grp, n);
}

/* Q5_0's fifth bits: row c's word qh (bit v: its value v) <-> bits 2c + e and 16 + 2c + e of the
 * group's words i (values 2i + e and 2i + 16 + e). */
static void move_q5_bits(uint8_t row_qh[4], uint8_t grp_qh[8][4], int c, int in) {
    uint32_t row = 0, words[8];
    memcpy(&row, row_qh, 4);
    memcpy(words, grp_qh, sizeof words);
    for (int i = 0; i < 8; i++)
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++) {
                const int v = 2 * i + 16 * h + e, at = 16 * h + 2 * c + e;
                if (in) words[i] = (words[i] & ~(1u << at)) | (((row >> v) & 1u) << at);
                else row = (row & ~(1u << v)) | (((words[i] >> at) & 1u) << v);
            }
    if (in) memcpy(grp_qh, words, sizeof words);
    else memcpy(row_qh, &row, 4);
}

/* The 16-bit words of a row's run of bytes (2w bytes) <-> word i of it at grp[i][2c]. */
static inline void move_words(uint8_t* row, uint8_t (*grp)[16], int words, int c, int in) {
    for (int i = 0; i < words; i++) move(row + 2 * i, &grp[i][2 * c], 2, in);
}

/* Block b of row c (`row`: the row's bytes) <-> its places in block b of its group (`blk`). */
static void place(int kind, uint8_t* row, uint8_t* blk, int b, int c, int in) {
    switch (kind) {
        case KIND_Q4_1: {
            BlockQ4_1* w = (BlockQ4_1*)row + b;
            BlockQ4_1x8* g = (BlockQ4_1x8*)blk + b;
            move((uint8_t*)&w->d, (uint8_t*)&g->d[c], 2, in);
            move((uint8_t*)&w->m, (uint8_t*)&g->m[c], 2, in);
            move_words(w->qs, g->qs, 8, c, in);
            return;
        }
        case KIND_Q4_0: {
            BlockQ4_0* w = (BlockQ4_0*)row + b;
            BlockQ4_0x8* g = (BlockQ4_0x8*)blk + b;
            move((uint8_t*)&w->d, (uint8_t*)&g->d[c], 2, in);
            move_words(w->qs, g->qs, 8, c, in);
            return;
        }
        case KIND_Q5_0: {
            BlockQ5_0* w = (BlockQ5_0*)row + b;
            BlockQ5_0x8* g = (BlockQ5_0x8*)blk + b;
            move((uint8_t*)&w->d, (uint8_t*)&g->d[c], 2, in);
            move_q5_bits(w->qh, g->qh, c, in);
            move_words(w->qs, g->qs, 8, c, in);
            return;
        }
        case KIND_Q8_0: {
            BlockQ8_0* w = (BlockQ8_0*)row + b;
            BlockQ8_0x8* g = (BlockQ8_0x8*)blk + b;
            move((uint8_t*)&w->d, (uint8_t*)&g->d[c], 2, in);
            for (int j = 0; j < 16; j++)
                move((uint8_t*)w->qs + 2 * j, (uint8_t*)g->qs + 32 * (j % 8) + 16 * (j / 8) + 2 * c, 2, in);
            return;
        }
        case KIND_Q4_K: {
            BlockQ4K* w = (BlockQ4K*)row + b;
            BlockQ4Kx8* g = (BlockQ4Kx8*)blk + b;
            move((uint8_t*)&w->d, (uint8_t*)&g->d[c], 2, in);
            move((uint8_t*)&w->dmin, (uint8_t*)&g->dmin[c], 2, in);
            for (int k = 0; k < 12; k++) move(&w->scales[k], &g->scales[k][c], 1, in);
            for (int ch = 0; ch < 4; ch++) move_words(w->qs + 32 * ch, g->qs[ch], 16, c, in);
            return;
        }
        /* issue 22 q5g: Q5_1 (Q5_0's with m), Q5_K (Q4_K's with qh's words) */
        case KIND_Q5_1: {
            BlockQ5_1* w = (BlockQ5_1*)row + b;
            BlockQ5_1x8* g = (BlockQ5_1x8*)blk + b;
            move((uint8_t*)&w->d, (uint8_t*)&g->d[c], 2, in);
            move((uint8_t*)&w->m, (uint8_t*)&g->m[c], 2, in);
            move_q5_bits(w->qh, g->qh, c, in);
            move_words(w->qs, g->qs, 8, c, in);
            return;
        }
        case KIND_Q5_K: {
            BlockQ5K* w = (BlockQ5K*)row + b;
            BlockQ5Kx8* g = (BlockQ5Kx8*)blk + b;
            move((uint8_t*)&w->d, (uint8_t*)&g->d[c], 2, in);
            move((uint8_t*)&w->dmin, (uint8_t*)&g->dmin[c], 2, in);
            for (int k = 0; k < 12; k++) move(&w->scales[k], &g->scales[k][c], 1, in);
            move_words(w->qh, g->qh, 16, c, in);
            for (int ch = 0; ch < 4; ch++) move_words(w->qs + 32 * ch, g->qs[ch], 16, c, in);
            return;
        }
        default: { /* KIND_Q6_K */
            BlockQ6K* w = (BlockQ6K*)row + b;
            BlockQ6Kx8* g = (BlockQ6Kx8*)blk + b;
            move((uint8_t*)&w->d, (uint8_t*)&g->d[c], 2, in);
            for (int k = 0; k < 16; k++) move((uint8_t*)&w->scales[k], (uint8_t*)&g->scales[k][c], 1, in);
            for (int q = 0; q < 4; q++) move_words(w->ql + 32 * q, g->ql[q], 16, c, in);
            for (int h = 0; h < 2; h++) move_words(w->qh + 32 * h, g->qh[h], 16, c, in);
        }
    }
}

/* The file layout of a kind with a repacked layout, its row bytes and blocks per row; 0 if the
 * arguments are not ones repacking takes. */
static size_t repack_args(int kind, int n_rows, int K, int* blocks) {
    const KindTraits* t = exo_kind_traits(kind);
    if (t == NULL || t->grouped == 0 || n_rows < 0 || n_rows % 8 != 0 || K <= 0 || K % t->block_values != 0)
        return 0;
    *blocks = K / t->block_values;
    return (size_t)*blocks * (size_t)t->block_bytes;
}

int exo_repack_rows(int kind, const uint8_t* rows, int n_rows, int K, uint8_t* out) {
    int blocks = 0;
    const size_t rb = repack_args(kind, n_rows, K, &blocks);
    if (rb == 0 || rows == NULL || out == NULL) return -2;
    uint8_t* group = malloc(8 * rb); /* one group's rows (out may be rows itself) */
    if (group == NULL) return -1;
    for (int g = 0; g < n_rows / 8; g++) {
        memcpy(group, rows + (size_t)g * 8 * rb, 8 * rb);
        uint8_t* blk = out + (size_t)g * 8 * rb;
        for (int c = 0; c < 8; c++)
            for (int b = 0; b < blocks; b++) place(kind, group + (size_t)c * rb, blk, b, c, 1);
    }
    free(group);
    return 0;
}

int exo_unrepack_rows(int kind, const uint8_t* grouped, int n_rows, int K, const int64_t* index, int n,
                      uint8_t* out) {
    int blocks = 0;
    const size_t rb = repack_args(kind, n_rows, K, &blocks);
    if (rb == 0 || grouped == NULL || n < 0 || (n > 0 && (index == NULL || out == NULL))) return -2;
    for (int i = 0; i < n; i++)
        if (index[i] < 0 || index[i] >= n_rows) return -2;
    for (int i = 0; i < n; i++) {
        const int64_t row = index[i];
        /* `place` reads the group when copying out: it does not write it */
        uint8_t* blk = (uint8_t*)grouped + (size_t)(row / 8) * 8 * rb;
        for (int b = 0; b < blocks; b++) place(kind, out + (size_t)i * rb, blk, b, (int)(row % 8), 0);
    }
    return 0;
}
