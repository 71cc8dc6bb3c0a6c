/* The weight kinds' traits: one row per kind (kinds.c) says its block, its repacked layout, the
 * activation format its dot products consume, when each strategy pays, and, per instruction set,
 * the entry point of each strategy. linear.c picks a strategy from the row and calls through it.
 *
 * A strategy computes a Run: one part's output rows [lo, hi) against activation rows [m0, m1).
 *   dot      rows one at a time, 1 or 4 activation rows per pass (every file layout has one);
 *   pair     two rows far apart at once (decode: two streams the prefetchers follow);
 *   unpacked each row unpacked once for many activation rows (prefill, 32-value layouts);
 *   tile     8 rows interleaved into a tile, lanes = rows (batched decode, prefill; x86);
 *   grouped  a repacked layout's groups of 8 rows (exo_kernels.h), read as they lie.
 * Every strategy sums a block's products as integers and adds the float terms in one order, so a
 * row's result does not depend on which strategy (so on how many rows) a call takes.
 *
 * Adding a kind: its enum value (exo_kernels.h), its row in kinds.c, its row in engines/kinds.py;
 * a generic dot first (dot.c), ISA entry points when they pay.
 */
#ifndef EXO_KINDS_H
#define EXO_KINDS_H

#include "exo_kernels.h"

/* The instruction sets a row has entry points for (one library is built per ISA; a NULL entry
 * of the library's ISA falls back to the generic one). */
enum { EXO_ISA_GENERIC = 0, EXO_ISA_AVX2 = 1,
#if defined(__aarch64__) /* arm: the NEON column (arch/arm/), in aarch64 builds only */
       EXO_ISA_NEON = 2,
#endif
       EXO_ISAS };
#define EXO_ISA (EXO_AVX2 ? EXO_ISA_AVX2 : EXO_ISA_GENERIC)
#if EXO_NEON /* arm */
#undef EXO_ISA
#define EXO_ISA EXO_ISA_NEON
#endif

/* Activation formats a kind's dot products consume (ggml's vec_dot_type). */
enum {
    ACT_X16 = 0, /* BlockX: blocks of 32 int16 values, d and d sum(q) (exo_quantize_row) */
    ACT_X8 = 1,  /* BlockX8: blocks of 32 int8 values, d and d sum(q) (exo_quantize_row8) */
};

typedef struct Run Run;
/* 0 when done; -1 when it could not run (no scratch memory): the caller falls back. */
typedef int (*RunFn)(const Run* r);

struct Run {
    const uint8_t* w; /* output row n's weights at w + (n - base) * rb */
    size_t rb;        /* bytes per row */
    int kind, file_kind;
    int base, lo, hi; /* the part's first output row; the rows to compute */
    int m0, m1, nb, N;
    const BlockX* x; /* activation row m at x + m * nb */
    const float *bias, *residual;
    float* y; /* [M, N] */
    RunFn dot; /* the kind's per-row dot, for the rows a strategy leaves (file layouts) */
    const BlockX8* x8; /* the 8-bit activation rows (ACT_X8), as x */
};

typedef struct {
    RunFn dot, pair, unpacked, tile, grouped;
} KindOps;

typedef struct {
    int kind;      /* KIND_* */
    const char* name;
    int file_kind; /* the file's layout (the kind itself, or what a repacked one repacks) */
    int grouped;   /* the repacked layout of a file layout, 0 if none */
    int block_values, block_bytes;
    int act;            /* ACT_* */
    uint32_t tile_rows; /* bit r: r activation rows take the tile (bit 31: 31 and more) */
    int unpack_from;    /* activation rows from which the unpacked strategy runs */
    int pair_below;     /* activation rows below which the pair strategy runs */
    KindOps ops[EXO_ISAS];
    int act8;                 /* ACT_X8 if the kind has 8-bit dots (dot8), else ACT_X16 */
    RunFn dot8[EXO_ISAS];     /* its one strategy on ACT_X8 rows, for every row count */
} KindTraits;

/* The activation bits exo_set_activations last set (act8.c). */
int exo_activation_bits(void);

/* The row of `kind`, or NULL. */
const KindTraits* exo_kind_traits(int kind);

/* Entry points (generic: dot.c, grouped.c, unpacked.c; x86: arch/x86/). */
int exo_generic_dot_q4_0(const Run* r);
int exo_generic_dot_q4_1(const Run* r);
int exo_generic_dot_q8_0(const Run* r);
int exo_generic_dot_q5_0(const Run* r);
int exo_generic_dot_q5_1(const Run* r);
int exo_generic_dot_q4_k(const Run* r);
int exo_generic_dot_q5_k(const Run* r);
int exo_generic_dot_q6_k(const Run* r);
int exo_generic_pair_q8_0(const Run* r);
int exo_generic_pair_q5_0(const Run* r);
int exo_generic_unpacked(const Run* r);
int exo_generic_grouped(const Run* r);
int exo_generic_dot8_q4_0(const Run* r);
int exo_generic_dot8_q4_1(const Run* r);
int exo_x86_dot8_q4_0(const Run* r);
int exo_x86_dot8_q4_1(const Run* r);
int exo_x86_dot_q4_0(const Run* r);
int exo_x86_dot_q4_1(const Run* r);
int exo_x86_dot_q8_0(const Run* r);
int exo_x86_dot_q5_0(const Run* r);
int exo_x86_dot_q5_1(const Run* r);
int exo_x86_dot_q4_k(const Run* r);
int exo_x86_dot_q5_k(const Run* r);
int exo_x86_dot_q6_k(const Run* r);
int exo_x86_pair_q8_0(const Run* r);
int exo_x86_pair_q5_0(const Run* r);
int exo_x86_unpacked(const Run* r);
int exo_x86_tile(const Run* r);
int exo_x86_grouped_q4_0(const Run* r);
int exo_x86_grouped_q4_1(const Run* r);
int exo_x86_grouped_q8_0(const Run* r);
int exo_x86_grouped_q5_0(const Run* r);
int exo_x86_grouped_q4_k(const Run* r);
int exo_x86_grouped_q6_k(const Run* r);
/* arm: arch/arm/ (NEON: dot.c; NEON + dotprod: dot8.c) */
int exo_arm_dot_q4_0(const Run* r);
int exo_arm_dot_q4_1(const Run* r);
int exo_arm_dot_q8_0(const Run* r);
int exo_arm_dot_q5_0(const Run* r);
int exo_arm_dot_q5_1(const Run* r);
int exo_arm_dot_q4_k(const Run* r);
int exo_arm_dot_q5_k(const Run* r);
int exo_arm_dot_q6_k(const Run* r);
int exo_arm_pair_q8_0(const Run* r);
int exo_arm_pair_q5_0(const Run* r);
int exo_arm_dot8_q4_0(const Run* r);
int exo_arm_dot8_q4_1(const Run* r);
/* MXFP4, IQ4_NL, IQ4_XS (iq4.h: iq4.c, arch/x86/iq4.c) */
int exo_generic_dot_mxfp4(const Run* r);
int exo_generic_dot_iq4_nl(const Run* r);
int exo_generic_dot_iq4_xs(const Run* r);
int exo_x86_dot_mxfp4(const Run* r);
int exo_x86_dot_iq4_nl(const Run* r);
int exo_x86_dot_iq4_xs(const Run* r);
/* issue 23: Q2_K, Q3_K (kquant23.c, arch/x86/kquant23.c) */
int exo_generic_dot_q2_k(const Run* r);
int exo_generic_dot_q3_k(const Run* r);
int exo_x86_dot_q2_k(const Run* r);
int exo_x86_dot_q3_k(const Run* r);
/* 8-bit activations' grouped strategy (issue 22: grouped8.c, arch/x86/grouped8.c) */
int exo_generic_grouped8(const Run* r);
int exo_x86_grouped8_q4_0(const Run* r);
int exo_x86_grouped8_q4_1(const Run* r);
int exo_generic_dot8_q8_0(const Run* r);
int exo_x86_dot8_q8_0(const Run* r);
int exo_x86_grouped8_q8_0(const Run* r);
int exo_generic_dot8_q4_k(const Run* r);
int exo_x86_dot8_q4_k(const Run* r);
int exo_x86_grouped8_q4_k(const Run* r);
int exo_generic_dot8_q6_k(const Run* r);
int exo_x86_dot8_q6_k(const Run* r);
int exo_x86_grouped8_q6_k(const Run* r);
/* issue 22 q5dots: Q5_0 / Q5_1 / Q5_K 8-bit dots, Q5_0's groups (act8_q5.c, arch/x86/dot8_q5.c, grouped8_q5.c) */
int exo_generic_dot8_q5_0(const Run* r);
int exo_generic_dot8_q5_1(const Run* r);
int exo_generic_dot8_q5_k(const Run* r);
int exo_generic_grouped8_q5_0(const Run* r);
int exo_x86_dot8_q5_0(const Run* r);
int exo_x86_dot8_q5_1(const Run* r);
int exo_x86_dot8_q5_k(const Run* r);
int exo_x86_grouped8_q5_0(const Run* r);
/* issue 22 q5g: Q5_1's and Q5_K's groups (act8_q5.c; arch/x86/grouped8_q5.c, grouped8_q5k.c; 16 bits: grouped.c, the tile) */
int exo_generic_grouped8_q5g(const Run* r);
int exo_x86_grouped8_q5_1(const Run* r);
int exo_x86_grouped8_q5_k(const Run* r);
/* issue 22 arm8: NEON + dotprod 8-bit dots of the other file layouts (arch/arm/dot8_k.c) and of
 * every repacked layout's groups (arch/arm/grouped8.c) */
int exo_arm_dot8_q8_0(const Run* r);
int exo_arm_dot8_q4_k(const Run* r);
int exo_arm_dot8_q6_k(const Run* r);
int exo_arm_dot8_q5_0(const Run* r);
int exo_arm_dot8_q5_1(const Run* r);
int exo_arm_dot8_q5_k(const Run* r);
int exo_arm_grouped8_q4_0(const Run* r);
int exo_arm_grouped8_q4_1(const Run* r);
int exo_arm_grouped8_q8_0(const Run* r);
int exo_arm_grouped8_q4_k(const Run* r);
int exo_arm_grouped8_q6_k(const Run* r);
int exo_arm_grouped8_q5_0(const Run* r);
int exo_arm_grouped8_q5_1(const Run* r);
int exo_arm_grouped8_q5_k(const Run* r);

/* ---- helpers the strategies share ---- */
static inline const uint8_t* run_row(const Run* r, int n) { return r->w + (size_t)(n - r->base) * r->rb; }

/* y[m, n] = v + bias[n] + residual[m, n] (residual may be y itself: read before the write) */
static inline void run_store(const Run* r, int m, int n, float v) {
    const size_t i = (size_t)m * r->N + n;
    r->y[i] = v + (r->bias ? r->bias[n] : 0.0f) + (r->residual ? r->residual[i] : 0.0f);
}

/* One weight row against R = 1 or 4 activation rows. */
typedef void (*RowDot)(const uint8_t* w, const BlockX* x, int nb, int R, float* out);

/* The dot strategy over a row dot (inlined: `dot` is a constant at each use). */
static inline __attribute__((always_inline)) void run_rows(const Run* r, RowDot dot) {
    float out[4];
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= 4 ? 4 : 1;
            dot(wr, r->x + (size_t)m * r->nb, r->nb, R, out);
            for (int i = 0; i < R; i++) run_store(r, m + i, n, out[i]);
            m += R;
        }
    }
}

/* Two weight rows against one activation row. */
typedef void (*PairDot)(const uint8_t* w0, const uint8_t* w1, const BlockX* x, int nb, float* out);

/* The pair strategy: rows n and n + half in one pass (two streams far apart: adjacent rows
 * interleaved defeat the prefetchers); an odd last row by r->dot. */
static inline __attribute__((always_inline)) void run_pairs(const Run* r, PairDot pair) {
    const int half = (r->hi - r->lo) / 2;
    float out[2];
    for (int n = r->lo; n < r->lo + half; n++) {
        const uint8_t *w0 = run_row(r, n), *w1 = run_row(r, n + half);
        for (int m = r->m0; m < r->m1; m++) {
            pair(w0, w1, r->x + (size_t)m * r->nb, r->nb, out);
            run_store(r, m, n, out[0]);
            run_store(r, m, n + half, out[1]);
        }
    }
    if (r->lo + 2 * half < r->hi) {
        Run rest = *r;
        rest.lo = r->lo + 2 * half;
        r->dot(&rest);
    }
}

#endif
