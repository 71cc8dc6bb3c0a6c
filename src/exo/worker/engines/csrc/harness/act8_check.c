/* The harness's check of 8-bit activations (exo_set_activations(8)): Q4_0 / Q4_1 / Q8_0 / Q4_K /
 * Q6_K / Q5_0 / Q5_1 / Q5_K rows against the reference quantiser's rows (reference.c), in double precision; and, for N a multiple of 8,
 * the same rows repacked in groups (exo_repack_rows: checked against the reference elsewhere),
 * whose 8-bit dots must give the file rows' floats bit for bit, alone or in the batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../exo_kernels.h"
#include "reference.h"

/* y [M, N] of the rows at 8-bit activations; the kernel's return code. */
static int linear8(int kind, const uint8_t* rows, int K, int N, const float* x, int M, float* y) {
    LinearSpec s = {.kind = kind, .prologue = PROLOGUE_NONE, .K = K, .N = N};
    s.w[0] = rows;
    s.part_rows[0] = N;
    exo_set_activations(8);
    const int rc = exo_qlinear(&s, x, M, NULL, y);
    exo_set_activations(16);
    return rc;
}

/* 1 (printed) if y [M, N] is not the reference's dot of w with x's 8-bit rows. */
static int against_reference(int kind, const double* w, const float* x, const float* y, int M, int N, int K) {
    int8_t* q = malloc((size_t)K);
    double* d = malloc(sizeof(double) * (size_t)(K / 32));
    if (!q || !d) abort();
    int bad = 0;
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
    free(q), free(d);
    return bad;
}

/* 1 (printed) if the rows' groups at 8 bits do not give y [M, N] bit for bit, in the batch and
 * for its last row alone. */
static int groups_match(int kind, const uint8_t* rows, int K, int N, const float* x, int M, const float* y) {
    const int grouped = kind == KIND_Q4_0   ? KIND_Q4_0_G8
                        : kind == KIND_Q4_1 ? KIND_Q4_1_G8
                        : kind == KIND_Q8_0 ? KIND_Q8_0_G8
                        : kind == KIND_Q4_K ? KIND_Q4_K_G8
                        : kind == KIND_Q5_0 ? KIND_Q5_0_G8 /* issue 22 q5dots */
                        : kind == KIND_Q5_1 ? KIND_Q5_1_G8 /* issue 22 q5g */
                        : kind == KIND_Q5_K ? KIND_Q5_K_G8
                                            : KIND_Q6_K_G8;
    const size_t bytes = ref_row_bytes(kind, K) * (size_t)N;
    uint8_t* groups = malloc(bytes);
    float* got = malloc(sizeof(float) * (size_t)M * N);
    if (!groups || !got) abort();
    int bad = exo_repack_rows(kind, rows, N, K, groups) != 0;
    bad = bad || linear8(grouped, groups, K, N, x, M, got) != 0 || memcmp(got, y, sizeof(float) * (size_t)M * N);
    const size_t last = (size_t)(M - 1) * N;
    bad = bad || linear8(grouped, groups, K, N, x + (size_t)(M - 1) * K, 1, got) != 0 ||
          memcmp(got, y + last, sizeof(float) * (size_t)N);
    if (bad) printf("FAIL act8: kind %d M %d N %d K %d: the groups' 8-bit dots differ from the rows'\n", kind, M, N, K);
    free(groups), free(got);
    return bad;
}

/* One random linear of a kind with 8-bit dots at 8-bit activations; returns 1 on a mismatch (printed). */
int check_act8(Rng* r, int quiet) {
    static const int kinds[] = {KIND_Q4_0, KIND_Q4_1, KIND_Q8_0, KIND_Q4_K, KIND_Q6_K,
                                /* issue 22 q5dots */ KIND_Q5_0, KIND_Q5_1, KIND_Q5_K};
    const int kind = kinds[rng_int(r, 0, (int)(sizeof kinds / sizeof kinds[0]) - 1)];
    const int K = kind == KIND_Q4_K || kind == KIND_Q6_K || kind == KIND_Q5_K ? 256 * rng_int(r, 1, 5) : 32 * rng_int(r, 1, 40), N = rng_int(r, 0, 1) ? 8 * rng_int(r, 1, 12) : rng_int(r, 1, 100);
    const int M = rng_int(r, 0, 5) == 0 ? rng_int(r, 10, 70) : rng_int(r, 1, 9);
    const size_t rb = ref_row_bytes(kind, K);
    uint8_t* rows = malloc(rb * (size_t)N);
    double* w = malloc(sizeof(double) * (size_t)N * K);
    float* x = malloc(sizeof(float) * (size_t)M * K);
    float* y = malloc(sizeof(float) * (size_t)M * N);
    if (!rows || !w || !x || !y) abort();
    for (int n = 0; n < N; n++) {
        ref_random_row(r, kind, K, rows + rb * (size_t)n);
        ref_dequant_row(kind, rows + rb * (size_t)n, K, w + (size_t)n * K);
    }
    for (int i = 0; i < M * K; i++) x[i] = rng_normalish(r) * 3.0f;
    const int rc = linear8(kind, rows, K, N, x, M, y);
    int bad = rc != 0;
    if (bad) printf("FAIL act8: exo_qlinear kind %d returned %d\n", kind, rc);
    bad = bad || against_reference(kind, w, x, y, M, N, K);
    const int has_groups = 1; /* issue 22 q5g: every kind here has its groups */
    if (!bad && N % 8 == 0 && has_groups) bad = groups_match(kind, rows, K, N, x, M, y);
    if (!quiet && !bad)
        printf("ok act8 kind %d M %d N %d K %d%s\n", kind, M, N, K, N % 8 || !has_groups ? "" : " (+ groups)");
    free(rows), free(w), free(x), free(y);
    return bad;
}
