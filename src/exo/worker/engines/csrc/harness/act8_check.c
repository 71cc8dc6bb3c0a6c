/* The harness's check of 8-bit activations (exo_set_activations(8)): Q4_0 / Q4_1 rows against
 * the reference quantiser's rows (reference.c), in double precision. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../exo_kernels.h"
#include "reference.h"

/* One random Q4_0 / Q4_1 linear at 8-bit activations; returns 1 on a mismatch (printed). */
int check_act8(Rng* r, int quiet) {
    const int kind = rng_int(r, 0, 1) ? KIND_Q4_0 : KIND_Q4_1;
    const int K = 32 * rng_int(r, 1, 40), N = rng_int(r, 1, 100);
    const int M = rng_int(r, 0, 5) == 0 ? rng_int(r, 10, 70) : rng_int(r, 1, 9);
    const size_t rb = ref_row_bytes(kind, K);
    uint8_t* rows = malloc(rb * (size_t)N);
    double* w = malloc(sizeof(double) * (size_t)N * K);
    float* x = malloc(sizeof(float) * (size_t)M * K);
    float* y = malloc(sizeof(float) * (size_t)M * N);
    int8_t* q = malloc((size_t)K);
    double* d = malloc(sizeof(double) * (size_t)(K / 32));
    if (!rows || !w || !x || !y || !q || !d) abort();
    for (int n = 0; n < N; n++) {
        ref_random_row(r, kind, K, rows + rb * (size_t)n);
        ref_dequant_row(kind, rows + rb * (size_t)n, K, w + (size_t)n * K);
    }
    for (int i = 0; i < M * K; i++) x[i] = rng_normalish(r) * 3.0f;
    LinearSpec s = {.kind = kind, .prologue = PROLOGUE_NONE, .K = K, .N = N};
    s.w[0] = rows;
    s.part_rows[0] = N;
    exo_set_activations(8);
    const int rc = exo_qlinear(&s, x, M, NULL, y);
    exo_set_activations(16);
    int bad = rc != 0;
    if (bad) printf("FAIL act8: exo_qlinear kind %d returned %d\n", kind, rc);
    for (int m = 0; !bad && m < M; m++) {
        ref_quantize8(x + (size_t)m * K, K, q, d);
        for (int n = 0; !bad && n < N; n++) {
            double want = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                const double t = w[(size_t)n * K + k] * d[k / 32] * q[k];
                want += t, mag += fabs(t);
            }
            const double got = y[(size_t)m * N + n];
            if (!(fabs(got - want) <= 1e-5 * mag + 1e-6)) {
                printf("FAIL act8: kind %d M %d N %d K %d: y[%d, %d] = %g, want %g\n", kind, M, N, K, m, n, got,
                       want);
                bad = 1;
            }
        }
    }
    if (!quiet && !bad) printf("ok act8 kind %d M %d N %d K %d\n", kind, M, N, K);
    free(rows), free(w), free(x), free(y), free(q), free(d);
    return bad;
}
