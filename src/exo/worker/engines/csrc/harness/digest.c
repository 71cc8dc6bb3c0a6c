/* The harness's digest mode (`harness digest`): fixed linear calls of every weight kind, at 16-
 * and 8-bit activations and at the row counts that cross each strategy's threshold, each output
 * printed as a hash of its float bits. Two builds whose kernels keep the same integer sums and the
 * same float order print the same lines: tests/test_engine_kernel_arm.py compares the aarch64
 * NEON build's against the portable build's (and the x86 portable build's) line for line. It also
 * prints which kinds have a dot and a dot8 of this build's own instruction set (not the generic
 * fallback), so a test can see the build's kernels are the ones that ran; and checks that with
 * 8-bit activations each row of a batch gets the floats it gets alone (the kinds with dot8), and
 * that the build's own dot8 entry points give the generic ones' bits (issue 22 arm8). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exo_kernels.h"
#include "kinds.h"
#include "reference.h"

/* Each kind's file layout (the grouped kinds are built from it by the reference's repacking). */
static const int DIGEST_KINDS[][2] = {
    {KIND_Q4_0, KIND_Q4_0},    {KIND_Q4_1, KIND_Q4_1},       {KIND_Q8_0, KIND_Q8_0},
    {KIND_Q5_0, KIND_Q5_0},    {KIND_Q5_1, KIND_Q5_1},       {KIND_Q4_K, KIND_Q4_K},
    {KIND_Q5_K, KIND_Q5_K},    {KIND_Q6_K, KIND_Q6_K},       {KIND_Q4_0_G8, KIND_Q4_0},
    {KIND_Q4_1_G8, KIND_Q4_1}, {KIND_Q8_0_G8, KIND_Q8_0},    {KIND_Q5_0_G8, KIND_Q5_0},
    {KIND_Q4_K_G8, KIND_Q4_K}, {KIND_Q6_K_G8, KIND_Q6_K},
    {KIND_MXFP4, KIND_MXFP4},  {KIND_IQ4_NL, KIND_IQ4_NL},   {KIND_IQ4_XS, KIND_IQ4_XS},
    {KIND_Q2_K, KIND_Q2_K},    {KIND_Q3_K, KIND_Q3_K},
    /* issue 22 q5g */
    {KIND_Q5_1_G8, KIND_Q5_1}, {KIND_Q5_K_G8, KIND_Q5_K},
};
static const int DIGEST_ROWS[] = {1, 2, 3, 4, 5, 8, 9, 64};

static uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
    const uint8_t* p = (const uint8_t*)data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ULL;
    return h;
}

/* 1 if a row of the M-row result y differs (in bits) from that row run alone. */
static int batched_differs(const LinearSpec* s, const float* x, int M, const float* y) {
    float alone[64];
    if (s->N > 64) return 1;
    for (int m = 0; m < M; m++) {
        if (exo_qlinear(s, x + (size_t)m * s->K, 1, NULL, alone) != 0) return 1;
        if (memcmp(alone, y + (size_t)m * s->N, sizeof(float) * (size_t)s->N) != 0) return 1;
    }
    return 0;
}

/* issue 22 arm8: 1 (printed) if the build's own dot8 entry point of kind t (not the generic
 * fallback) gives other bits than the generic one, each called directly on the same Run: rows
 * [lo, N) of w against activation rows [m0, m1) of x quantised to 8 bits (every activation row in
 * one Run, so the entry point's passes of rows are crossed as the row count grows). */
static int dot8_differs(const KindTraits* t, const uint8_t* w, size_t rb, int K, int N, const float* x, int lo, int m0,
                        int m1) {
    if (EXO_ISA == EXO_ISA_GENERIC || t->act8 != ACT_X8 || t->dot8[EXO_ISA] == NULL) return 0;
    const int nb = K / QK;
    const size_t out = sizeof(float) * (size_t)m1 * N;
    BlockX8* x8 = malloc(sizeof(BlockX8) * (size_t)m1 * nb);
    float* own = calloc(1, out);
    float* generic = calloc(1, out);
    if (!x8 || !own || !generic) abort();
    for (int m = 0; m < m1; m++) exo_quantize_row8(x + (size_t)m * K, K, x8 + (size_t)m * nb);
    Run r = {.w = w, .rb = rb, .kind = t->kind, .file_kind = t->file_kind, .base = 0, .lo = lo, .hi = N, .m0 = m0,
             .m1 = m1, .nb = nb, .N = N, .y = own, .x8 = x8};
    int bad = t->dot8[EXO_ISA](&r) != 0;
    r.y = generic;
    bad = bad || t->dot8[EXO_ISA_GENERIC](&r) != 0 || memcmp(own, generic, out) != 0;
    if (bad)
        printf("FAIL digest kind %d K %d rows %d.. M %d..%d: the build's dot8 differs from the generic one\n", t->kind,
               K, lo, m0, m1);
    free(x8), free(own), free(generic);
    return bad;
}

/* issue 22 arm8: dot8_differs at more shapes than the digest's: an odd number of blocks (or of
 * super-blocks), 5 groups, all rows and rows from 8 on, activation rows from 0 and from 1 on. */
static int dot8_shapes(Rng* r) {
    enum { N = 40, MAX_K = 1184, MAX_M = 65 };
    static const int rows[] = {1, 2, 4, 8, 9, 64};
    float* x = malloc(sizeof(float) * MAX_M * MAX_K);
    uint8_t* file = malloc(ref_row_bytes(KIND_Q8_0, MAX_K) * N);
    uint8_t* laid = malloc(ref_row_bytes(KIND_Q8_0, MAX_K) * N);
    if (!x || !file || !laid) abort();
    for (int i = 0; i < MAX_M * MAX_K; i++) x[i] = rng_normalish(r) * 3.0f;
    int failed = 0;
    for (size_t k = 0; k < sizeof DIGEST_KINDS / sizeof DIGEST_KINDS[0]; k++) {
        const int kind = DIGEST_KINDS[k][0], file_kind = DIGEST_KINDS[k][1];
        const KindTraits* t = exo_kind_traits(kind);
        for (int big = 0; t->act8 == ACT_X8 && big < 2; big++) {
            const int K = t->block_values == 256 ? (big ? 1024 : 256) : (big ? MAX_K : 96);
            const size_t rb = ref_row_bytes(file_kind, K);
            for (int n = 0; n < N; n++) ref_random_row(r, file_kind, K, file + rb * (size_t)n);
            if (kind != file_kind) ref_group_rows(file_kind, file, N, K, laid);
            const uint8_t* w = kind != file_kind ? laid : file;
            for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
                failed += dot8_differs(t, w, rb, K, N, x, 0, 0, rows[i]);
                failed += dot8_differs(t, w, rb, K, N, x, 8, 1, rows[i] + 1);
            }
        }
    }
    free(x), free(file), free(laid);
    return failed;
}

/* Prints one line per kind, activation bits and row count; returns the number of failed calls. */
int run_digest(void) {
    enum { K = 512, N = 24, MAX_M = 64 };
    Rng r = {12345};
    float* x = malloc(sizeof(float) * MAX_M * K);
    float* y = malloc(sizeof(float) * MAX_M * N);
    uint8_t* rows = malloc(ref_row_bytes(KIND_Q8_0, K) * N);
    uint8_t* laid = malloc(ref_row_bytes(KIND_Q8_0, K) * N);
    if (!x || !y || !rows || !laid) abort();
    for (int i = 0; i < MAX_M * K; i++) x[i] = rng_normalish(&r) * 3.0f;
    int failed = 0;
    exo_set_threads(1);
    for (size_t k = 0; k < sizeof DIGEST_KINDS / sizeof DIGEST_KINDS[0]; k++) {
        const int kind = DIGEST_KINDS[k][0], file_kind = DIGEST_KINDS[k][1];
        const KindTraits* t = exo_kind_traits(kind);
        printf("entries kind %d: dot %d dot8 %d\n", kind, EXO_ISA != EXO_ISA_GENERIC && t->ops[EXO_ISA].dot != NULL,
               EXO_ISA != EXO_ISA_GENERIC && t->dot8[EXO_ISA] != NULL);
        const size_t rb = ref_row_bytes(file_kind, K);
        for (int n = 0; n < N; n++) ref_random_row(&r, file_kind, K, rows + rb * (size_t)n);
        if (kind != file_kind) ref_group_rows(file_kind, rows, N, K, laid);
        LinearSpec s = {.kind = kind, .prologue = PROLOGUE_NONE, .K = K, .N = N};
        s.w[0] = kind != file_kind ? laid : rows;
        s.part_rows[0] = N;
        for (int bits = 16; bits >= 8; bits -= 8) {
            exo_set_activations(bits);
            for (size_t i = 0; i < sizeof DIGEST_ROWS / sizeof DIGEST_ROWS[0]; i++) {
                const int M = DIGEST_ROWS[i];
                memset(y, 0, sizeof(float) * MAX_M * N);
                const int rc = exo_qlinear(&s, x, M, NULL, y);
                failed += rc != 0;
                if (bits == 8) failed += dot8_differs(t, s.w[0], rb, K, N, x, 0, 0, M); /* issue 22 arm8 */
                if (bits == 8 && t->act8 == ACT_X8 && batched_differs(&s, x, M, y)) {
                    printf("FAIL digest kind %d bits 8 M %d: a row's result differs from its result alone\n", kind, M);
                    failed++;
                }
                printf("digest kind %d bits %d M %d: rc %d %016llx\n", kind, bits, M, rc,
                       (unsigned long long)fnv1a(y, sizeof(float) * (size_t)M * N, 0xCBF29CE484222325ULL));
            }
        }
        exo_set_activations(16);
    }
    free(x), free(y), free(rows), free(laid);
    failed += dot8_shapes(&r); /* issue 22 arm8 */
    printf("digest done: %d failed calls\n", failed);
    return failed;
}
