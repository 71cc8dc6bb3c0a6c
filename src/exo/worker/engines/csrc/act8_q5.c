/* issue 22 q5dots: the generic 8-bit activation dots of Q5_0, Q5_1, Q5_K (per row) and of Q5_0's
 * repacked groups (KIND_Q5_0_G8), in act8_q5.h's order. */
#include "act8_q5.h"

static float row_dot_q5_0(const uint8_t* w, const BlockX8* x, int nb) {
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        const BlockQ5_0* wb = (const BlockQ5_0*)w + b;
        acc = act8_step(acc, exo_h2f(wb->d), q5_0_min(wb), x + b, q5_isum8(wb->qh, wb->qs, x[b].qs));
    }
    return acc;
}

static float row_dot_q5_1(const uint8_t* w, const BlockX8* x, int nb) {
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        const BlockQ5_1* wb = (const BlockQ5_1*)w + b;
        acc = act8_step(acc, exo_h2f(wb->d), exo_h2f(wb->m), x + b, q5_isum8(wb->qh, wb->qs, x[b].qs));
    }
    return acc;
}

static float row_dot_q5_k(const uint8_t* w, const BlockX8* x, int nb) {
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        const BlockQ5K* wb = (const BlockQ5K*)w + b / 8;
        const int j = b % 8;
        float d, m;
        q5k_sub(wb->scales, wb->d, wb->dmin, j, &d, &m);
        acc = act8_step(acc, d, m, x + b, q5k_isum8(wb, j, x[b].qs));
    }
    return acc;
}

typedef float (*Q5RowDot)(const uint8_t* w, const BlockX8* x, int nb);

static inline __attribute__((always_inline)) int run_q5(const Run* r, Q5RowDot dot) {
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1; m++) run_store(r, m, n, dot(wr, r->x8 + (size_t)m * r->nb, r->nb));
    }
    return 0;
}

int exo_generic_dot8_q5_0(const Run* r) { return run_q5(r, row_dot_q5_0); }
int exo_generic_dot8_q5_1(const Run* r) { return run_q5(r, row_dot_q5_1); }
int exo_generic_dot8_q5_k(const Run* r) { return run_q5(r, row_dot_q5_k); }

/* Row c's block b of a Q5_0 group (exo_kernels.h: bit 2c + e of word qh[i] is value 2i + e's
 * fifth bit, bit 16 + 2c + e value 2i + 16 + e's; nibble byte 2i + e at qs[i][2c + e]) as the file
 * lays it. */
static void q5_0_group_row(const BlockQ5_0x8* blk, int c, BlockQ5_0* out) {
    uint32_t h = 0;
    for (int i = 0; i < 8; i++) {
        const uint32_t word = q5_bits(blk->qh[i]);
        for (int half = 0; half < 2; half++)
            for (int e = 0; e < 2; e++)
                h |= ((word >> (16 * half + 2 * c + e)) & 1u) << (2 * i + 16 * half + e);
    }
    memcpy(out->qh, &h, sizeof h);
    for (int j = 0; j < 16; j++) out->qs[j] = blk->qs[j / 2][2 * c + j % 2];
    out->d = blk->d[c];
}

int exo_generic_grouped8_q5_0(const Run* r) {
    BlockQ5_0 row;
    for (int n = r->lo; n < r->hi; n += 8) {
        const BlockQ5_0x8* grp = (const BlockQ5_0x8*)run_row(r, n);
        for (int m = r->m0; m < r->m1; m++) {
            const BlockX8* x = r->x8 + (size_t)m * r->nb;
            for (int c = 0; c < 8; c++) {
                float acc = 0.0f;
                for (int b = 0; b < r->nb; b++) {
                    q5_0_group_row(grp + b, c, &row);
                    acc = act8_step(acc, exo_h2f(row.d), q5_0_min(&row), x + b, q5_isum8(row.qh, row.qs, x[b].qs));
                }
                run_store(r, m, n + c, acc);
            }
        }
    }
    return 0;
}

/* issue 22 q5g: the generic 8-bit dots of Q5_1's and Q5_K's repacked groups (KIND_Q5_1_G8,
 * KIND_Q5_K_G8): each block of a group's 8 rows read back in the file's layout (repack.c's
 * exo_unrepack_rows on that one block), then the per-row dots' steps above, so the floats are
 * theirs. Passes of up to Q5G_PASS activation rows share each block's read-back. */
#define Q5G_PASS 64

static void q5g_block_steps(int kind, const uint8_t* rows, int b, const BlockX8* x, int nb, int R, float (*acc)[8]) {
    for (int c = 0; c < 8; c++) {
        if (kind == KIND_Q5_1_G8) {
            const BlockQ5_1* wb = (const BlockQ5_1*)rows + c;
            for (int m = 0; m < R; m++) {
                const BlockX8* xb = x + (size_t)m * nb + b;
                acc[m][c] = act8_step(acc[m][c], exo_h2f(wb->d), exo_h2f(wb->m), xb, q5_isum8(wb->qh, wb->qs, xb->qs));
            }
            continue;
        }
        const BlockQ5K* wb = (const BlockQ5K*)rows + c; /* super-block b / 8 of row c */
        for (int j = 0; j < 8; j++) {
            float d, mw;
            q5k_sub(wb->scales, wb->d, wb->dmin, j, &d, &mw);
            for (int m = 0; m < R; m++) {
                const BlockX8* xb = x + (size_t)m * nb + b + j;
                acc[m][c] = act8_step(acc[m][c], d, mw, xb, q5k_isum8(wb, j, xb->qs));
            }
        }
    }
}

int exo_generic_grouped8_q5g(const Run* r) {
    static const int64_t lanes[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const int k = r->kind == KIND_Q5_1_G8, file = k ? KIND_Q5_1 : KIND_Q5_K, bv = k ? 32 : 256;
    const size_t gb = k ? sizeof(BlockQ5_1x8) : sizeof(BlockQ5Kx8); /* a group's block */
    float acc[Q5G_PASS][8];
    uint8_t rows[sizeof(BlockQ5Kx8)]; /* the 8 rows' block, file layout */
    for (int n = r->lo; n < r->hi; n += 8) {
        const uint8_t* grp = run_row(r, n);
        for (int m0 = r->m0; m0 < r->m1; m0 += Q5G_PASS) {
            const int R = r->m1 - m0 < Q5G_PASS ? r->m1 - m0 : Q5G_PASS;
            memset(acc, 0, sizeof acc);
            for (int b = 0; b < r->nb; b += bv / 32) {
                exo_unrepack_rows(file, grp + (size_t)(b / (bv / 32)) * gb, 8, bv, lanes, 8, rows);
                q5g_block_steps(r->kind, rows, b, r->x8 + (size_t)m0 * r->nb, r->nb, R, acc);
            }
            for (int m = 0; m < R; m++)
                for (int c = 0; c < 8; c++) run_store(r, m0 + m, n + c, acc[m][c]);
        }
    }
    return 0;
}
