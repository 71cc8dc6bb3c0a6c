/* Standalone test harness for exo's CPU kernels: every kernel against the plain C references
 * (reference.c) on random shapes, with the thread pool resized between calls and several
 * threads calling at once. Built with -fsanitize=address,undefined by
 * tests/test_engine_kernel_harness.py (kernel_build.build_harness); any mismatch or sanitizer
 * report fails the run (exit status != 0). Usage: harness [seed] [rounds] */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exo_kernels.h"
#include "reference.h"

static int failures;
static pthread_mutex_t report_mu = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char* what) {
    pthread_mutex_lock(&report_mu);
    failures++;
    if (failures <= 20) fprintf(stderr, "FAIL: %s\n", what);
    pthread_mutex_unlock(&report_mu);
}

static void* xmalloc(size_t n) { /* exact sizes: ASan sees any read past the end */
    void* p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static const int KINDS[] = {KIND_Q4_0, KIND_Q4_1, KIND_Q8_0, KIND_Q5_0, KIND_Q5_1, KIND_Q4_K, KIND_Q5_K, KIND_Q6_K,
                            /* MXFP4, IQ4_NL, IQ4_XS */
                            KIND_MXFP4, KIND_IQ4_NL, KIND_IQ4_XS,
    /* issue 23: Q2_K, Q3_K */
    KIND_Q2_K, KIND_Q3_K,
};
#define N_KINDS (int)(sizeof KINDS / sizeof KINDS[0])

/* A random layout that rows of K values can take. */
static int random_kind(Rng* r, int K) {
    for (;;) {
        const int kind = KINDS[rng_int(r, 0, N_KINDS - 1)];
        if (kind < 100 || K % 256 == 0) return kind;
    }
}

/* One random linear call against the reference. Returns 0 if it matched. */
int check_act8(Rng* r, int quiet); /* act8_check.c */
int check_attend_sinks(Rng* r); /* attend_sinks_check.c (issue 23 sinks) */

static int check_linear(Rng* r, int quiet) {
    char msg[256];
    const int kind = KINDS[rng_int(r, 0, N_KINDS - 1)];
    const int kq = kind > 100;
    const int K = (kq ? 256 : 32) * rng_int(r, 1, kq ? 3 : 24);
    const int N = rng_int(r, 1, 300);
    /* decode batches (M = 0..9), and one time in eight a prefill (several passes over a tile,
     * more than one chunk of 64 rows) */
    const int M = rng_int(r, 0, 7) == 0 ? rng_int(r, 10, 70) : rng_int(r, 0, 9);
    const int prologue = rng_int(r, 0, 3);
    const int n_parts = rng_int(r, 1, MAX_PARTS < N ? MAX_PARTS : N);
    const int mixed = rng_int(r, 0, 1); /* parts in layouts of their own */
    LinearSpec s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    s.prologue = prologue;
    s.K = K;
    s.N = N;
    s.eps = 1e-5f;
    double* w = xmalloc(sizeof(double) * (size_t)N * K);
    int row = 0;
    int grouped = 0;
    for (int p = 0; p < n_parts; p++) { /* split the rows into parts, each its own allocation */
        int rows = p == n_parts - 1 ? N - row : rng_int(r, 0, (N - row) - (n_parts - 1 - p));
        const int pk = mixed ? random_kind(r, K) : kind;
        if (pk != kind) s.part_kind[p] = pk;
        /* Q4_0, Q4_1, Q8_0, Q5_0, Q4_K, Q6_K parts of whole groups starting on a multiple of 8: re-laid half the time */
        const int groups = pk == KIND_Q4_0 || pk == KIND_Q4_1 || pk == KIND_Q8_0 || pk == KIND_Q5_0 || pk == KIND_Q4_K || pk == KIND_Q6_K ||
                           /* issue 22 q5g */ pk == KIND_Q5_1 || pk == KIND_Q5_K;
        const int group = groups && row % 8 == 0 && rng_int(r, 0, 1) &&
                          (p < n_parts - 1 ? rows >= 8 : rows % 8 == 0);
        if (group && p < n_parts - 1) rows -= rows % 8;
        const size_t rb = ref_row_bytes(pk, K);
        uint8_t* part = xmalloc(rb * (size_t)rows);
        for (int i = 0; i < rows; i++) {
            ref_random_row(r, pk, K, part + rb * (size_t)i);
            ref_dequant_row(pk, part + rb * (size_t)i, K, w + (size_t)(row + i) * K);
        }
        if (group) {
            uint8_t* laid = xmalloc(rb * (size_t)rows);
            ref_group_rows(pk, part, rows, K, laid);
            free(part);
            part = laid;
            s.part_kind[p] = pk == KIND_Q4_0     ? KIND_Q4_0_G8
                             : pk == KIND_Q4_1   ? KIND_Q4_1_G8
                             : pk == KIND_Q8_0   ? KIND_Q8_0_G8
                             : pk == KIND_Q5_0 ? KIND_Q5_0_G8
                             : pk == KIND_Q4_K ? KIND_Q4_K_G8
                             : pk == KIND_Q5_1 ? KIND_Q5_1_G8 /* issue 22 q5g */
                             : pk == KIND_Q5_K ? KIND_Q5_K_G8
                                               : KIND_Q6_K_G8;
            grouped++;
        }
        s.w[p] = part;
        s.part_rows[p] = rows;
        row += rows;
    }
    const size_t xw = (size_t)(prologue >= PROLOGUE_SWIGLU ? 2 * K : K);
    float* x = xmalloc(sizeof(float) * M * xw);
    for (size_t i = 0; i < M * xw; i++) x[i] = rng_normalish(r) * 3.0f;
    float* g = NULL;
    if (prologue == PROLOGUE_RMS_NORM) {
        g = xmalloc(sizeof(float) * K);
        for (int k = 0; k < K; k++) g[k] = 0.5f + (float)rng_unit(r);
    }
    s.g = g;
    float* bias = NULL;
    if (rng_int(r, 0, 1)) {
        bias = xmalloc(sizeof(float) * N);
        for (int n = 0; n < N; n++) bias[n] = rng_normalish(r);
    }
    s.bias = bias;
    float* post_g = NULL;
    if (rng_int(r, 0, 3) == 0) { /* Gemma's norm after the layer */
        post_g = xmalloc(sizeof(float) * N);
        for (int n = 0; n < N; n++) post_g[n] = 0.5f + (float)rng_unit(r);
        s.post_g = post_g;
        s.post_eps = 1e-6f;
    }
    const int with_residual = rng_int(r, 0, 2); /* 0 none, 1 its own array, 2 y itself */
    float* y = xmalloc(sizeof(float) * M * N);
    float* residual = NULL;
    if (with_residual) {
        residual = with_residual == 1 ? xmalloc(sizeof(float) * M * N) : y;
        for (int i = 0; i < M * N; i++) residual[i] = rng_normalish(r);
    }
    double* want = xmalloc(sizeof(double) * ((size_t)M * N + 1));
    double* tol = xmalloc(sizeof(double) * ((size_t)M * N + 1));
    ref_linear(prologue, x, M, K, N, w, g, s.eps, bias, residual, post_g, want, tol);
    const int rc = exo_qlinear(&s, x, M, residual, y);
    int bad = rc != 0;
    if (rc != 0) {
        snprintf(msg, sizeof msg, "exo_qlinear kind %d returned %d", kind, rc);
        fail(msg);
    }
    for (int i = 0; !bad && i < M * N; i++) {
        if (!(fabs(y[i] - want[i]) <= tol[i])) {
            snprintf(msg, sizeof msg,
                     "exo_qlinear kind %d prologue %d post %d M %d N %d K %d parts %d mixed %d grouped %d: y[%d] = %g, want %g (tol %g)",
                     kind, prologue, post_g != NULL, M, N, K, n_parts, mixed, grouped, i, (double)y[i], want[i], tol[i]);
            fail(msg);
            bad = 1;
        }
    }
    if (!quiet && !bad)
        printf("ok linear kind %d prologue %d M %d N %d K %d grouped %d\n", kind, prologue, M, N, K, grouped);
    for (int p = 0; p < n_parts; p++) free((void*)s.w[p]);
    if (with_residual == 1) free(residual);
    free(w), free(x), free(g), free(bias), free(post_g), free(y), free(want), free(tol);
    return bad;
}

/* One random decode-attention call on a paged cache (of floats, or of half floats) against the
 * reference. */
static int check_attention(Rng* r) {
    char msg[256];
    const int KV = rng_int(r, 1, 3), G = rng_int(r, 1, 3), H = KV * G;
    const int hd = 2 * rng_int(r, 1, 40), P = rng_int(r, 1, 20), L = rng_int(r, 1, 3);
    const int layer = rng_int(r, 0, L - 1), B = rng_int(r, 1, 3);
    const int max_pages = rng_int(r, 1, 6), qk = rng_int(r, 0, 1), half = rng_int(r, 0, 1);
    const size_t esize = half ? sizeof(uint16_t) : sizeof(float);
    const size_t page_floats = (size_t)L * 2 * KV * P * hd;
    const long layer_off = (long)layer * 2 * KV * P * hd;
    const int W = (H + 2 * KV) * hd, positions = max_pages * P;
    int64_t* pages = xmalloc(sizeof(int64_t) * B * max_pages);
    int64_t* pos = xmalloc(sizeof(int64_t) * B);
    float* qkv = xmalloc(sizeof(float) * B * W);
    float* rope = xmalloc(sizeof(float) * positions * hd);
    float* norm = qk ? xmalloc(sizeof(float) * (H + KV) * hd) : NULL;
    float* out = xmalloc(sizeof(float) * B * H * hd);
    for (int i = 0; i < B * W; i++) qkv[i] = rng_normalish(r);
    for (int t = 0; t < positions; t++)
        for (int i = 0; i < hd / 2; i++) {
            const double a = t * rng_unit(r);
            rope[(size_t)t * hd + 2 * i] = (float)cos(a);
            rope[(size_t)t * hd + 2 * i + 1] = (float)sin(a);
        }
    for (int i = 0; norm && i < (H + KV) * hd; i++) norm[i] = 0.5f + (float)rng_unit(r);
    for (int b = 0; b < B; b++) {
        pos[b] = rng_int(r, 0, positions - 1);
        for (int pg = 0; pg < max_pages; pg++) {
            pages[b * max_pages + pg] = 0;
            if (pg * P <= pos[b]) {
                void* page = xmalloc(esize * page_floats);
                for (size_t i = 0; i < page_floats; i++) {
                    const float x = (float)rng_normalish(r);
                    if (half)
                        ((uint16_t*)page)[i] = exo_f2h(x);
                    else
                        ((float*)page)[i] = x;
                }
                pages[b * max_pages + pg] = (int64_t)(intptr_t)page;
            }
        }
    }
    const int rc = exo_attend_decode_kv(qkv, B, H, KV, hd, rope, norm, 1e-5f, pages, max_pages, P,
                                        layer_off, pos, NULL, 0, half, out);
    int bad = rc != 0;
    if (rc != 0) {
        snprintf(msg, sizeof msg, "exo_attend_decode_kv returned %d", rc);
        fail(msg);
    }
    /* the reference, on the cache the kernel left: the new key and value it stored at each row's
     * position are checked against the reference's own below */
    double* want = xmalloc(sizeof(double) * B * H * hd);
    double* k_new = xmalloc(sizeof(double) * B * KV * hd);
    double* q_all = xmalloc(sizeof(double) * H * hd);
    for (int b = 0; b < B; b++) {
        const int p = (int)pos[b];
        const float* row = qkv + (size_t)b * W;
        const float* rot = rope + (size_t)p * hd;
#define CACHED_AT(kv, j, t) ((char*)(intptr_t)pages[b * max_pages + (t) / P] + esize * \
                             (layer_off + (((size_t)(kv) * KV + (j)) * P + (t) % P) * hd))
#define CACHED(kv, j, t, i) (half ? (double)exo_h2f(((const uint16_t*)CACHED_AT(kv, j, t))[i]) \
                                  : (double)((const float*)CACHED_AT(kv, j, t))[i])
        double head[256], sc[128];
        double* kb = k_new + (size_t)b * KV * hd;
        for (int hh = 0; hh < H + KV; hh++) { /* q heads, then k heads: norm, rotate */
            const float* src = row + (size_t)hh * hd;
            double ss = 0.0;
            for (int i = 0; i < hd; i++) ss += (double)src[i] * src[i];
            const double scale = norm ? 1.0 / sqrt(ss / hd + 1e-5) : 1.0;
            for (int i = 0; i < hd; i++) head[i] = src[i] * scale * (norm ? norm[(size_t)hh * hd + i] : 1.0);
            for (int i = 0; i < hd / 2; i++) {
                const double c = rot[2 * i], s = rot[2 * i + 1], a = head[2 * i], bb = head[2 * i + 1];
                head[2 * i] = a * c - bb * s;
                head[2 * i + 1] = a * s + bb * c;
            }
            if (hh < H) {
                memcpy(q_all + (size_t)hh * hd, head, sizeof(double) * hd);
                continue;
            }
            memcpy(kb + (size_t)(hh - H) * hd, head, sizeof(double) * hd);
        }
        for (int hh = 0; hh < H; hh++) { /* scores (the new key at p), softmax, values */
            const double* qh = q_all + (size_t)hh * hd;
            const int j = hh / G;
            double mx = -INFINITY, total = 0.0;
            for (int t = 0; t <= p; t++) {
                double d = 0.0;
                for (int i = 0; i < hd; i++) d += qh[i] * CACHED(0, j, t, i);
                sc[t] = d / sqrt((double)hd);
                mx = sc[t] > mx ? sc[t] : mx;
            }
            for (int t = 0; t <= p; t++) total += (sc[t] = exp(sc[t] - mx));
            for (int i = 0; i < hd; i++) {
                double o = 0.0;
                for (int t = 0; t <= p; t++) o += sc[t] / total * CACHED(1, j, t, i);
                want[((size_t)b * H + hh) * hd + i] = o;
            }
        }
    }
    for (int i = 0; !bad && i < B * H * hd; i++)
        if (!(fabs(out[i] - want[i]) <= 1e-4 + 1e-4 * fabs(want[i]))) {
            snprintf(msg, sizeof msg, "exo_attend_decode_kv B %d H %d KV %d hd %d P %d half %d: out[%d] = %g, want %g",
                     B, H, KV, hd, P, half, i, (double)out[i], want[i]);
            fail(msg);
            bad = 1;
        }
    /* the new keys and values landed in the cache (in half floats: rounded to nearest, the key
     * within one step of f16's 11 bits of the reference's) */
    const double key_tol = half ? 1.0 / 1024 : 1e-5;
    for (int b = 0; !bad && b < B; b++)
        for (int j = 0; j < KV; j++)
            for (int i = 0; i < hd; i++) {
                const int p = (int)pos[b];
                const double kw = k_new[((size_t)b * KV + j) * hd + i];
                const float vw = qkv[(size_t)b * W + (size_t)(H + KV + j) * hd + i];
                const double vs = half ? (double)exo_h2f(exo_f2h(vw)) : (double)vw;
                if (!(fabs(CACHED(0, j, p, i) - kw) <= 1e-5 + key_tol * fabs(kw)) || CACHED(1, j, p, i) != vs) {
                    fail("exo_attend_decode_kv: the new key or value is not in the cache");
                    bad = 1;
                }
            }
    for (int b = 0; b < B; b++)
        for (int pg = 0; pg < max_pages; pg++) free((void*)(intptr_t)pages[b * max_pages + pg]);
    free(pages), free(pos), free(qkv), free(rope), free(norm), free(out), free(want), free(k_new), free(q_all);
    return bad;
}

/* ---- the thread pool alone: each part of every job runs exactly once, and a job is over
 * (every part done) when exo_run_parallel returns, while the pool grows and shrinks ---- */

typedef struct {
    int count[MAX_THREADS];
    int parts_seen;
} PoolJob;

static void pool_task(void* ctx, int part, int parts) {
    PoolJob* j = (PoolJob*)ctx;
    if (part > 0) {
        const struct timespec ts = {0, 1000000}; /* long enough for resizes to land mid-job */
        nanosleep(&ts, NULL);
    }
    __atomic_store_n(&j->parts_seen, parts, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&j->count[part], 1, __ATOMIC_SEQ_CST);
}

static void* pool_dispatcher(void* arg) {
    const int jobs = *(const int*)arg;
    for (int i = 0; i < jobs; i++) {
        PoolJob job;
        memset(&job, 0, sizeof job);
        exo_run_parallel(pool_task, &job, MAX_THREADS);
        const int parts = __atomic_load_n(&job.parts_seen, __ATOMIC_SEQ_CST);
        for (int p = 0; p < MAX_THREADS; p++) {
            const int c = __atomic_load_n(&job.count[p], __ATOMIC_SEQ_CST);
            if (c != (p < parts ? 1 : 0)) {
                char msg[128];
                snprintf(msg, sizeof msg, "pool: job %d part %d of %d ran %d times by its end", i, p, parts, c);
                fail(msg);
                return NULL;
            }
        }
    }
    return NULL;
}

static void check_pool(Rng* r) {
    enum { DISPATCHERS = 2 };
    pthread_t t[DISPATCHERS];
    int jobs = 150;
    exo_set_threads(1);
    for (int i = 0; i < DISPATCHERS; i++) pthread_create(&t[i], NULL, pool_dispatcher, &jobs);
    const struct timespec ts = {0, 200000};
    for (int n = 2; n <= MAX_THREADS; n++) { /* new workers start while jobs run */
        exo_set_threads(n);
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < 100; i++) {
        exo_set_threads(rng_int(r, 1, MAX_THREADS));
        if (i % 25 == 0) exo_set_spin(i % 50 ? 50000 : 0, i % 50 ? 100000 : 0); /* sleep at once, or spin */
        nanosleep(&ts, NULL);
    }
    exo_set_spin(50000, 100000);
    for (int i = 0; i < DISPATCHERS; i++) pthread_join(t[i], NULL);
    printf("ok pool\n");
}

typedef struct { uint64_t seed; int rounds; } CallerArgs;

static void* caller(void* arg) {
    const CallerArgs* a = (const CallerArgs*)arg;
    Rng r = {a->seed};
    for (int i = 0; i < a->rounds; i++) {
        if (rng_int(&r, 0, 3) == 0) check_attention(&r);
        else check_linear(&r, 1);
    }
    return NULL;
}

/* exo_dequant_rows against the reference's dequantisation (in doubles: within float rounding);
 * its bits against gguf-py's: test_engine_dequant_rows.py. */
static void check_dequant(Rng* r) {
    static const int kinds[] = {KIND_Q4_0, KIND_Q4_1, KIND_Q5_0, KIND_Q5_1, KIND_Q8_0, KIND_Q4_K, KIND_Q5_K, KIND_Q6_K};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        const int kind = kinds[i], K = 256 * rng_int(r, 1, 3), n = rng_int(r, 1, 4);
        const size_t rb = ref_row_bytes(kind, K);
        uint8_t* rows = xmalloc(rb * (size_t)n);
        float* got = xmalloc(sizeof(float) * (size_t)n * K);
        double* want = xmalloc(sizeof(double) * (size_t)K);
        for (int j = 0; j < n; j++) ref_random_row(r, kind, K, rows + rb * (size_t)j);
        if (exo_dequant_rows(kind, rows, n, K, got) != 0) fail("exo_dequant_rows refused a kind it takes");
        for (int j = 0; j < n; j++) {
            ref_dequant_row(kind, rows + rb * (size_t)j, K, want);
            double most = 0.0; /* within float rounding of the row's largest (a - b may cancel) */
            for (int k = 0; k < K; k++) most = fabs(want[k]) > most ? fabs(want[k]) : most;
            for (int k = 0; k < K; k++)
                if (!(fabs(got[(size_t)j * K + k] - want[k]) <= 1e-6 * most + 1e-30)) {
                    char msg[128];
                    snprintf(msg, sizeof msg, "exo_dequant_rows kind %d row %d value %d: %g, want %g", kind, j, k,
                             (double)got[(size_t)j * K + k], want[k]);
                    fail(msg);
                    break;
                }
        }
        free(rows), free(got), free(want);
    }
    float out[32];
    if (exo_dequant_rows(KIND_Q2_K, out, 1, 256, out) != -2) fail("dequantising a kind it does not take accepted");
    if (exo_dequant_rows(KIND_Q4_1_G8, out, 1, 32, out) != -2) fail("dequantising a repacked layout accepted");
    if (exo_dequant_rows(KIND_Q4_K, out, 1, 32, out) != -2) fail("a K-quant row of 32 values accepted");
}

/* Bad specs are refused, not read. */
/* exo_repack_rows against the reference's groups (byte for byte, in place too) and
 * exo_unrepack_rows back to the file's rows, for every kind with a repacked layout. */
static void check_repack(Rng* r) {
    static const int GROUPED[] = {KIND_Q4_0, KIND_Q4_1, KIND_Q8_0, KIND_Q5_0, KIND_Q4_K, KIND_Q6_K,
                                  /* issue 22 q5g */ KIND_Q5_1, KIND_Q5_K};
    enum { N_GROUPED = sizeof GROUPED / sizeof GROUPED[0] };
    char msg[160];
    for (int round = 0; round < 24; round++) {
        const int kind = GROUPED[round % N_GROUPED], kq = kind > 100;
        const int K = (kq ? 256 : 32) * rng_int(r, 1, kq ? 3 : 8), rows = 8 * rng_int(r, 1, 3);
        const size_t rb = ref_row_bytes(kind, K), bytes = rb * (size_t)rows;
        uint8_t *raw = xmalloc(bytes), *want = xmalloc(bytes), *got = xmalloc(bytes), *back = xmalloc(bytes);
        for (int i = 0; i < rows; i++) ref_random_row(r, kind, K, raw + rb * (size_t)i);
        ref_group_rows(kind, raw, rows, K, want);
        snprintf(msg, sizeof msg, "exo_repack_rows kind %d K %d rows %d", kind, K, rows);
        if (exo_repack_rows(kind, raw, rows, K, got) != 0 || memcmp(got, want, bytes) != 0) fail(msg);
        memcpy(got, raw, bytes);
        if (exo_repack_rows(kind, got, rows, K, got) != 0 || memcmp(got, want, bytes) != 0) fail(msg); /* in place */
        int64_t index[24];
        for (int i = 0; i < rows; i++) index[i] = rng_int(r, 0, rows - 1);
        snprintf(msg, sizeof msg, "exo_unrepack_rows kind %d K %d rows %d", kind, K, rows);
        if (exo_unrepack_rows(kind, want, rows, K, index, rows, back) != 0) fail(msg);
        for (int i = 0; i < rows; i++)
            if (memcmp(back + rb * (size_t)i, raw + rb * (size_t)index[i], rb) != 0) fail(msg);
        free(raw), free(want), free(got), free(back);
    }
    uint8_t row[24 * 8] = {0};
    int64_t bad = 8;
    if (exo_repack_rows(KIND_IQ4_NL, row, 8, 32, row) != -2) fail("repacking a kind without a repacked layout accepted");
    if (exo_repack_rows(KIND_Q4_1, row, 4, 32, row) != -2) fail("repacking part of a group accepted");
    if (exo_unrepack_rows(KIND_Q4_1, row, 8, 32, &bad, 1, row) != -2) fail("a row index out of range accepted");
}

static void check_refusals(void) {
    LinearSpec s;
    memset(&s, 0, sizeof s);
    float x[64] = {0}, y[64];
    s.kind = 5, s.K = 32, s.N = 1, s.part_rows[0] = 1, s.w[0] = x;
    if (exo_qlinear(&s, x, 1, NULL, y) != -2) fail("unknown kind accepted");
    s.kind = KIND_Q4_1, s.K = 48;
    if (exo_qlinear(&s, x, 1, NULL, y) != -2) fail("K not a multiple of 32 accepted");
    s.K = 32, s.N = 2;
    if (exo_qlinear(&s, x, 1, NULL, y) != -2) fail("parts not summing to N accepted");
    s.N = 1, s.prologue = 1;
    if (exo_qlinear(&s, x, 1, NULL, y) != -2) fail("RMSNorm without gain accepted");
    s.prologue = 0, s.kind = KIND_Q4_K;
    if (exo_qlinear(&s, x, 1, NULL, y) != -2) fail("a K-quant with K % 256 != 0 accepted");
    s.kind = KIND_Q8_0, s.part_kind[0] = KIND_Q6_K;
    if (exo_qlinear(&s, x, 1, NULL, y) != -2) fail("a K-quant part with K % 256 != 0 accepted");
    s.part_kind[0] = 9;
    if (exo_qlinear(&s, x, 1, NULL, y) != -2) fail("an unknown part kind accepted");
    s.part_kind[0] = KIND_Q4_1_G8; /* one row: not a group of 8 */
    if (exo_qlinear(&s, x, 1, NULL, y) != -2) fail("a group of fewer than 8 rows accepted");
    s.N = 9, s.part_rows[0] = 1, s.w[1] = x, s.part_rows[1] = 8, s.part_kind[0] = KIND_Q4_1, s.part_kind[1] = KIND_Q4_1_G8;
    if (exo_qlinear(&s, x, 1, NULL, y) != -2) fail("groups not starting on a multiple of 8 accepted");
    s.N = 1, s.w[1] = NULL, s.part_rows[1] = 0, s.part_kind[1] = 0;
    s.part_kind[0] = 0, s.prologue = 4;
    if (exo_qlinear(&s, x, 1, NULL, y) != -2) fail("an unknown prologue accepted");
    s.prologue = 0;
    int64_t pages[1] = {0}, pos[1] = {0};
    if (exo_attend_decode(x, 1, 1, 1, 2, x, NULL, 1e-5f, pages, 1, 4, 0, pos, y) != -4)
        fail("a missing page accepted");
    pos[0] = 4;
    if (exo_attend_decode(x, 1, 1, 1, 2, x, NULL, 1e-5f, pages, 1, 4, 0, pos, y) != -3)
        fail("a position past the pages accepted");
    if (exo_attend_decode(x, 1, 3, 2, 2, x, NULL, 1e-5f, pages, 1, 4, 0, pos, y) != -2)
        fail("H not a multiple of KV accepted");
}

int run_digest(void); /* digest.c */

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "digest") == 0) { /* fixed calls' output hashes (digest.c) */
        printf("isa %s\n", exo_isa());
        return run_digest() ? 1 : 0;
    }
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    const int rounds = argc > 2 ? atoi(argv[2]) : 60;
    Rng r = {seed * 0x9E3779B97F4A7C15ULL + 1};
    printf("isa %s, seed %llu, rounds %d\n", exo_isa(), (unsigned long long)seed, rounds);
    check_refusals();
    check_repack(&r);
    check_dequant(&r);
    check_pool(&r);
    /* several callers at once while the main thread grows the pool from one thread to
     * MAX_THREADS (new workers start while jobs are in flight), then resizes it at random */
    enum { CALLERS = 4 };
    pthread_t threads[CALLERS];
    CallerArgs args[CALLERS];
    exo_set_threads(1);
    for (int i = 0; i < CALLERS; i++) {
        args[i].seed = seed * 1000 + (uint64_t)i + 7;
        args[i].rounds = rounds / 2 + 1;
        if (pthread_create(&threads[i], NULL, caller, &args[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 2;
        }
    }
    for (int n = 2; n <= MAX_THREADS; n++) {
        exo_set_threads(n);
        check_linear(&r, 1);
    }
    for (int i = 0; i < 200; i++) exo_set_threads(rng_int(&r, 1, 8));
    for (int i = 0; i < CALLERS; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < rounds; i++) { /* one caller, the pool resized between calls */
        exo_set_threads(rng_int(&r, 1, 6));
        check_linear(&r, 0);
        check_attention(&r);
        failures += check_act8(&r, 0);
        failures += check_attend_sinks(&r); /* issue 23 sinks */
    }
    exo_set_threads(1);
    printf("%s: %d failures\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
