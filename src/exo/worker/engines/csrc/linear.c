/* Quantised linear layers: y [M, N] = prologue(x) W^T (+ bias) (+ residual), or with a post-norm
 * y = residual + rmsnorm(prologue(x) W^T + bias) * post_g (Gemma 3's norms after attention / MLP).
 *
 * Activations are quantised on the fly to int16 blocks of 32 (15 bits keep the result within
 * ~1e-4 of float32), so a block's dot product is integer multiply-adds and one float
 * multiply-add. With exo_set_activations(8) (EXO_ACTIVATIONS=8), a linear whose parts all have
 * 8-bit dots (Q4_0, Q4_1: kinds.c's dot8) quantises each row to int8 blocks instead and runs the
 * dot8 strategy at every row count (act8.h). The weight rows come in up to MAX_PARTS parts stacked along the output
 * (q | k | v), each of its own kind; for each part and pass of activation rows, the kind's row in
 * the traits table (kinds.h, kinds.c) picks the strategy (per-row dot, pair, unpacked, tile,
 * grouped) and its entry point for this build's instruction set. Threads split the output rows:
 * each streams its own contiguous rows of the weights.
 */
#include <math.h>

#include "exo_kernels.h"
#include "kinds.h"

typedef struct {
    int M, N, nb;
    const BlockX* x;
    const BlockX8* x8; /* non-NULL: every part takes 8-bit activations (its dot8) */
    const LinearSpec* s;
    const float *bias, *residual;
    float* y;
    const KindTraits* traits[MAX_PARTS];
} LinearJob;

static inline int kind_of_part(const LinearSpec* s, int p) {
    return s->part_kind[p] ? s->part_kind[p] : s->kind;
}

/* Bytes of one weight row of kind t holding nb blocks of 32 values. */
static size_t row_bytes(const KindTraits* t, int nb) {
    return (size_t)nb * QK / (size_t)t->block_values * (size_t)t->block_bytes;
}

static inline int takes_rows(uint32_t mask, int rows) { return (int)(mask >> (rows < 31 ? rows : 31)) & 1; }

/* The ISA's entry point, else the generic one. */
#define OP(t, name) ((t)->ops[EXO_ISA].name ? (t)->ops[EXO_ISA].name : (t)->ops[EXO_ISA_GENERIC].name)

/* One part's rows of a pass: the strategy its traits pick for the pass's activation rows, falling
 * back to the per-row dot (or the groups) where one cannot run. */
static void run_part(const KindTraits* t, Run* r) {
    if (r->x8) { /* one strategy for every row count: a row's result is its own */
        (t->dot8[EXO_ISA] ? t->dot8[EXO_ISA] : t->dot8[EXO_ISA_GENERIC])(r);
        return;
    }
    const int rows = r->m1 - r->m0;
    const RunFn tile = t->ops[EXO_ISA].tile;
    if (tile && takes_rows(t->tile_rows, rows) && tile(r) == 0) return;
    if (t->kind != t->file_kind) {
        OP(t, grouped)(r);
        return;
    }
    r->dot = OP(t, dot);
    const RunFn unpacked = OP(t, unpacked);
    if (unpacked && rows >= t->unpack_from && unpacked(r) == 0) return;
    const RunFn pair = OP(t, pair);
    if (pair && rows < t->pair_below) {
        pair(r);
        return;
    }
    r->dot(r);
}

/* Output rows [N * part / parts, N * (part + 1) / parts) of a linear job. */
static void linear_part(void* ctx, int part, int parts) {
    const LinearJob* j = (const LinearJob*)ctx;
    const LinearSpec* s = j->s;
    /* part boundaries on multiples of 8 rows: a tile or a group never straddles two parts */
    const int n0 = (int)((long)j->N * part / parts) & ~7;
    const int n1 = part == parts - 1 ? j->N : (int)((long)j->N * (part + 1) / parts) & ~7;
    const int TM = 64; /* activation rows per pass over the weights (they stay in L2) */
    for (int m0 = 0; m0 < j->M; m0 += TM) {
        const int m1 = m0 + TM < j->M ? m0 + TM : j->M;
        int base = 0; /* first output row of part p */
        for (int p = 0; p < MAX_PARTS && base < n1; base += s->part_rows[p], p++) {
            const int lo = n0 > base ? n0 : base;
            const int hi = n1 < base + s->part_rows[p] ? n1 : base + s->part_rows[p];
            if (lo >= hi) continue;
            const KindTraits* t = j->traits[p];
            Run r = {(const uint8_t*)s->w[p], row_bytes(t, j->nb), t->kind, t->file_kind, base, lo, hi, m0, m1,
                     j->nb, j->N, j->x, j->bias, j->residual, j->y, NULL, j->x8};
            run_part(t, &r);
        }
    }
}

/* y[m] = residual[m] + rmsnorm(t[m]) * g, row by row (residual may be NULL or y itself). */
static void post_norm(const float* t, int M, int N, const float* g, float eps,
                      const float* residual, float* y) {
    for (int m = 0; m < M; m++) {
        const float* tr = t + (size_t)m * N;
        float ss = 0.0f;
        for (int n = 0; n < N; n++) ss += tr[n] * tr[n];
        const float scale = 1.0f / sqrtf(ss / (float)N + eps);
        for (int n = 0; n < N; n++) {
            const size_t i = (size_t)m * N + n;
            y[i] = (residual ? residual[i] : 0.0f) + tr[n] * scale * g[n];
        }
    }
}

/* 0 if the spec is one the kernel takes (each part's traits in `traits`), -2 if not. */
static int check_spec(const LinearSpec* s, const KindTraits** traits) {
    const int K = s->K, N = s->N;
    if (K <= 0 || N <= 0 || K % QK != 0) return -2;
    if (s->prologue < PROLOGUE_NONE || s->prologue > PROLOGUE_GEGLU) return -2;
    if (s->prologue == PROLOGUE_RMS_NORM && s->g == NULL) return -2;
    if (exo_kind_traits(s->kind) == NULL) return -2;
    int rows = 0;
    for (int p = 0; p < MAX_PARTS; p++) {
        const KindTraits* t = exo_kind_traits(kind_of_part(s, p));
        traits[p] = t;
        if (s->part_rows[p] < 0 || (s->part_rows[p] > 0 && s->w[p] == NULL)) return -2;
        if (t == NULL) return -2;
        if (s->part_rows[p] > 0 && K % t->block_values != 0) return -2;
        /* groups of 8 rows that start on a multiple of 8 (partitions split on those) */
        if (s->part_rows[p] > 0 && t->kind != t->file_kind && (s->part_rows[p] % 8 != 0 || rows % 8 != 0))
            return -2;
        if (s->part_rows[p] > N - rows) return -2;
        rows += s->part_rows[p];
    }
    return rows == N ? 0 : -2;
}

/* Whether every part of the spec takes 8-bit activations now (exo_set_activations). */
static int takes_x8(const LinearSpec* s, const KindTraits* const* traits) {
    if (exo_activation_bits() != 8) return 0;
    for (int p = 0; p < MAX_PARTS; p++)
        if (s->part_rows[p] > 0 && traits[p]->act8 != ACT_X8) return 0;
    return 1;
}

/* y [M, N] = prologue(x) W^T + bias + residual (or the post-norm form, see the top). x is
 * [M, K] ([M, 2K] for SwiGLU / GeGLU); residual [M, N] is optional (NULL) and may be y itself.
 * Returns 0 on success, -1 out of memory, -2 a spec the kernel does not take. */
int exo_qlinear(const LinearSpec* s, const float* x, int M, const float* residual, float* y) {
    const KindTraits* traits[MAX_PARTS];
    if (check_spec(s, traits) != 0 || M < 0) return -2;
    if (M == 0) return 0;
    const int K = s->K, N = s->N, nb = K / QK;
    float* scratch_f = exo_scratch(SCRATCH_PROLOGUE, (size_t)M * K * sizeof(float));
    const int x8 = takes_x8(s, traits);
    BlockX* scratch_x = exo_scratch(SCRATCH_QUANT, (size_t)M * nb * (x8 ? sizeof(BlockX8) : sizeof(BlockX)));
    float* raw = s->post_g ? exo_scratch(SCRATCH_POST, (size_t)M * N * sizeof(float)) : y;
    if (scratch_f == NULL || scratch_x == NULL || raw == NULL) return -1;
    const int glu = s->prologue == PROLOGUE_SWIGLU || s->prologue == PROLOGUE_GEGLU;
    const size_t x_stride = glu ? 2 * (size_t)K : (size_t)K;
    for (int m = 0; m < M; m++) {
        float* row = scratch_f + (size_t)m * K;
        exo_prologue_row(s->prologue, x + (size_t)m * x_stride, s->g, s->eps, K, row);
        if (x8)
            exo_quantize_row8(row, K, (BlockX8*)scratch_x + (size_t)m * nb);
        else
            exo_quantize_row(row, K, scratch_x + (size_t)m * nb);
    }
    LinearJob job = {M, N, nb, x8 ? NULL : scratch_x, x8 ? (const BlockX8*)scratch_x : NULL, s, s->bias, s->post_g ? NULL : residual, raw, {NULL}};
    for (int p = 0; p < MAX_PARTS; p++) job.traits[p] = traits[p];
    /* a part per thread, if each gets at least ~64k weight-rows of work */
    const long work = (long)M * N * K;
    const int parts = work >= (1L << 16) * 2 ? (int)(work >> 16 < MAX_THREADS ? work >> 16 : MAX_THREADS) : 1;
    exo_run_parallel(linear_part, &job, parts);
    if (s->post_g) post_norm(raw, M, N, s->post_g, s->post_eps, residual, y);
    return 0;
}
