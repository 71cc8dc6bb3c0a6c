/* Quantised linear layers: y [M, N] = prologue(x) W^T (+ bias) (+ residual).
 *
 * Activations are quantised on the fly to int16 blocks of 32 (15 bits keep the result within
 * ~1e-4 of float32), so a block's dot product is integer multiply-adds and one float
 * multiply-add (dot_q.h, dot_kquants.h). Threads split the output columns: each streams its
 * own contiguous rows of the weights.
 */
#include "exo_kernels.h"
#include "dot_q.h"
#include "dot_kquants.h"

typedef struct {
    int kind, M, N, nb;
    const BlockX* x;
    const void* const* w;   /* [MAX_PARTS] row blocks of each part, stacked along the output */
    const int* part_rows;   /* [MAX_PARTS] rows of each part (0 for unused parts) */
    const float *bias, *residual;
    float* y;
} LinearJob;

/* The blocks of output row n: a row of the part that holds it. */
static inline const void* weight_row(const LinearJob* j, int n, size_t row_bytes) {
    int p = 0;
    while (p < MAX_PARTS - 1 && n >= j->part_rows[p]) n -= j->part_rows[p++];
    return (const char*)j->w[p] + (size_t)n * row_bytes;
}

/* Output columns [N * part / parts, N * (part + 1) / parts) of a linear job. */
static void linear_part(void* ctx, int part, int parts) {
    const LinearJob* j = (const LinearJob*)ctx;
    const int n0 = (int)((long)j->N * part / parts), n1 = (int)((long)j->N * (part + 1) / parts);
    const int TM = 64; /* activation rows per pass over the weights (they stay in L2) */
    const int nb = j->nb;
    float out[4];
    for (int m0 = 0; m0 < j->M; m0 += TM) {
        const int m1 = m0 + TM < j->M ? m0 + TM : j->M;
        for (int n = n0; n < n1; n++) {
            const float bn = j->bias ? j->bias[n] : 0.0f;
            for (int m = m0; m < m1;) {
                const int R = j->kind < 100 && m1 - m >= 4 ? 4 : 1;
                const BlockX* xr = j->x + (size_t)m * nb;
                if (j->kind == KIND_Q4_K) {
                    out[0] = dot_q4k((const BlockQ4K*)weight_row(j, n, nb / 8 * sizeof(BlockQ4K)), xr, nb / 8);
                } else if (j->kind == KIND_Q5_K) {
                    out[0] = dot_q5k((const BlockQ5K*)weight_row(j, n, nb / 8 * sizeof(BlockQ5K)), xr, nb / 8);
                } else if (j->kind == KIND_Q6_K) {
                    out[0] = dot_q6k((const BlockQ6K*)weight_row(j, n, nb / 8 * sizeof(BlockQ6K)), xr, nb / 8);
                } else if (j->kind == KIND_Q4) {
                    const BlockQ4* wr = (const BlockQ4*)weight_row(j, n, nb * sizeof(BlockQ4));
                    if (R == 4) dot_q4_4(wr, xr, nb, out); else dot_q4_1(wr, xr, nb, out);
                } else {
                    const BlockQ8* wr = (const BlockQ8*)weight_row(j, n, nb * sizeof(BlockQ8));
                    if (R == 4) dot_q8_4(wr, xr, nb, out); else dot_q8_1(wr, xr, nb, out);
                }
                for (int r = 0; r < R; r++) {
                    const size_t i = (size_t)(m + r) * j->N + n;
                    j->y[i] = out[r] + bn + (j->residual ? j->residual[i] : 0.0f);
                }
                m += R;
            }
        }
    }
}

/* y [M, N] = prologue(x) W^T + bias + residual. x is [M, K] ([M, 2K] for SwiGLU); residual
 * [M, N] is optional (NULL) and may be y itself. Returns 0 on success, -1 out of memory, -2 a
 * spec the kernel does not take. */
int exo_qlinear(const LinearSpec* s, const float* x, int M, const float* residual, float* y) {
    const int K = s->K, N = s->N;
    const int kquant = s->kind == KIND_Q4_K || s->kind == KIND_Q5_K || s->kind == KIND_Q6_K;
    if (K <= 0 || N <= 0 || M < 0 || K % (kquant ? QK_K : QK) != 0) return -2;
    if (!kquant && s->kind != KIND_Q4 && s->kind != KIND_Q8) return -2;
    if (s->prologue < PROLOGUE_NONE || s->prologue > PROLOGUE_SWIGLU) return -2;
    if (s->prologue == PROLOGUE_RMS_NORM && s->g == NULL) return -2;
    int rows = 0;
    for (int p = 0; p < MAX_PARTS; p++) {
        if (s->part_rows[p] < 0 || (s->part_rows[p] > 0 && s->w[p] == NULL)) return -2;
        rows += s->part_rows[p];
    }
    if (rows != N) return -2;
    if (M == 0) return 0;
    const int nb = K / QK;
    float* scratch_f = exo_scratch(SCRATCH_PROLOGUE, (size_t)M * K * sizeof(float));
    BlockX* scratch_x = exo_scratch(SCRATCH_QUANT, (size_t)M * nb * sizeof(BlockX));
    if (scratch_f == NULL || scratch_x == NULL) return -1;
    const size_t x_stride = s->prologue == PROLOGUE_SWIGLU ? 2 * (size_t)K : (size_t)K;
    for (int m = 0; m < M; m++) {
        float* row = scratch_f + (size_t)m * K;
        exo_prologue_row(s->prologue, x + (size_t)m * x_stride, s->g, s->eps, K, row);
        exo_quantize_row(row, K, scratch_x + (size_t)m * nb);
    }
    LinearJob job = {s->kind, M, N, nb, scratch_x, s->w, s->part_rows, s->bias, residual, y};
    /* a part per thread, if each gets at least ~64k weight-rows of work */
    const long work = (long)M * N * K;
    const int parts = work >= (1L << 16) * 2 ? (int)(work >> 16 < MAX_THREADS ? work >> 16 : MAX_THREADS) : 1;
    exo_run_parallel(linear_part, &job, parts);
    return 0;
}
