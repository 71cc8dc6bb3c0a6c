/* MXFP4, IQ4_NL and IQ4_XS rows against 16-bit activation rows, plain C (the portable build;
 * the float order: iq4.h). */
#include "iq4.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

/* A block's 32 codes (16 bytes) through `table` into int16 values, in value order. */
static inline void unpack_codes(const uint8_t* qs, const int8_t* table, int16_t* q) {
    for (int i = 0; i < 16; i++) {
        q[i] = table[qs[i] & 15];
        q[i + 16] = table[qs[i] >> 4];
    }
}

/* acc_l = acc_l + t p_l for one activation block (the lanes of iq4.h) */
static inline void block_lanes(const int16_t* q, const BlockX* xb, float s, float* acc) {
    const float t = s * xb->d;
    for (int l = 0; l < 8; l++) {
        const int i = 2 * l;
        const int32_t p = (int32_t)q[i] * xb->qs[i] + (int32_t)q[i + 1] * xb->qs[i + 1] +
                          ((int32_t)q[i + 16] * xb->qs[i + 16] + (int32_t)q[i + 17] * xb->qs[i + 17]);
        acc[l] = acc[l] + t * (float)p;
    }
}

enum { IQ4_MXFP4 = 0, IQ4_NL = 1, IQ4_XS = 2 };

/* Block b (of 32 values) of a row of `which`: its codes and scale. */
static inline const uint8_t* block_of(const uint8_t* w, int which, int b, float* s) {
    if (which == IQ4_MXFP4) {
        const BlockMXFP4* blk = (const BlockMXFP4*)w + b;
        *s = e8m0_half(blk->e);
        return blk->qs;
    }
    if (which == IQ4_NL) {
        const BlockIQ4NL* blk = (const BlockIQ4NL*)w + b;
        *s = exo_h2f(blk->d);
        return blk->qs;
    }
    const BlockIQ4XS* blk = (const BlockIQ4XS*)w + b / 8;
    *s = iq4xs_scale(blk, b % 8);
    return blk->qs + 16 * (b % 8);
}

/* One weight row against R = 1 or 4 activation rows (stride nb blocks). */
static inline __attribute__((always_inline)) void row_dot(const uint8_t* w, int which, const BlockX* x, int nb, int R,
                                                          float* out) {
    const int8_t* table = which == IQ4_MXFP4 ? MXFP4_VALUES : IQ4_NL_VALUES;
    float acc[4][2][8] = {{{0}}}; /* per row: the even blocks' lanes, the odd blocks' */
    for (int b = 0; b < nb; b++) {
        float s;
        const uint8_t* qs = block_of(w, which, b, &s);
        int16_t q[QK];
        unpack_codes(qs, table, q);
        for (int r = 0; r < R; r++) block_lanes(q, x + (size_t)r * nb + b, s, acc[r][b & 1]);
    }
    for (int r = 0; r < R; r++) {
        float c[8];
        for (int l = 0; l < 8; l++) c[l] = acc[r][0][l] + acc[r][1][l];
        out[r] = iq4_lanes_sum(c);
    }
}

static inline __attribute__((always_inline)) int run_iq4(const Run* r, int which) {
    float out[4];
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= 4 ? 4 : 1;
            if (R == 4) row_dot(wr, which, r->x + (size_t)m * r->nb, r->nb, 4, out);
            else row_dot(wr, which, r->x + (size_t)m * r->nb, r->nb, 1, out);
            for (int i = 0; i < R; i++) run_store(r, m + i, n, out[i]);
            m += R;
        }
    }
    return 0;
}

int exo_generic_dot_mxfp4(const Run* r) { return run_iq4(r, IQ4_MXFP4); }
int exo_generic_dot_iq4_nl(const Run* r) { return run_iq4(r, IQ4_NL); }
int exo_generic_dot_iq4_xs(const Run* r) { return run_iq4(r, IQ4_XS); }
