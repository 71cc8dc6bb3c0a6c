"""C source of the quantised linear kernels, in two pieces around the K-quant dot products:
LINEAR_HEAD (thread pool, activation quantisation, q4 / q8 dot products) and LINEAR_TAIL
(scratch, the parallel job, exo_qlinear). Compiled together by `cpu_kernels.py`.
"""

LINEAR_HEAD = r"""
/* Quantised linear layers for x86 CPUs with AVX2 + FMA: y = prologue(x) W^T (+ bias) (+ residual).
 *
 * Weights, blocks of 32 along the input dimension (a row is nb = K / 32 blocks, in order):
 *   q4: w = d * q + m, q in 0..15: {f16 d, f16 m, 16 bytes: byte j holds element j in its low
 *       nibble and element j + 16 in its high nibble}, 20 bytes per block (GGUF's Q4_1);
 *   q8: w = d * q, q in -127..127: {f16 d, 32 x int8}, 34 bytes per block (GGUF's Q8_0).
 * Activations are quantised on the fly to int16 blocks of 32 (scale d_x, and d_x * sum q_x for
 * the q4 offset term; 15 bits keep the result within ~1e-4 of float32), so a block's dot
 * product is integer multiply-adds and one float multiply-add:
 *   q4: sum_j w_j x_j = d d_x sum_j q_j q_xj + m (d_x sum_j q_xj)
 *   q8: sum_j w_j x_j = d d_x sum_j q_j q_xj
 * Prologue applied to each row of x before quantising:
 *   0: none;  1: RMSNorm, x / sqrt(mean(x^2) + eps) * g;  2: SwiGLU, x = [a | b] -> silu(a) * b.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>

#define QK 32

/* ---- a small thread pool: workers block on a condition variable between jobs (no spinning) */

typedef void (*task_fn)(void* ctx, int part, int parts);

#define MAX_THREADS 64
static struct {
    pthread_mutex_t mu, dispatch;
    pthread_cond_t wake, done;
    pthread_t threads[MAX_THREADS];
    int n_workers;  /* started worker threads; the calling thread is part 0 */
    int n_active;   /* threads a job may use (exo_set_threads) */
    long generation;
    int pending;
    task_fn fn;
    void* ctx;
    int parts;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, {0}, 0, 1, 0, 0, NULL, NULL, 0};

static void* pool_worker(void* arg) {
    const int id = (int)(intptr_t)arg;
    long seen = 0;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (pool.generation == seen) pthread_cond_wait(&pool.wake, &pool.mu);
        seen = pool.generation;
        const task_fn fn = pool.fn;
        void* ctx = pool.ctx;
        const int parts = pool.parts;
        pthread_mutex_unlock(&pool.mu);
        if (id < parts) fn(ctx, id, parts);
        pthread_mutex_lock(&pool.mu);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done);
    }
    return NULL;
}

/* A forked child has no workers: start over with the calling thread alone. */
static void pool_after_fork_in_child(void) {
    pthread_mutex_init(&pool.mu, NULL);
    pthread_mutex_init(&pool.dispatch, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.n_workers = 0;
    pool.n_active = 1;
}

/* Use n threads (the caller plus n - 1 workers, started once). Returns the number in use. */
int exo_set_threads(int n) {
    static int fork_handler_registered = 0;
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    pthread_mutex_lock(&pool.mu);
    if (!fork_handler_registered) {
        pthread_atfork(NULL, NULL, pool_after_fork_in_child);
        fork_handler_registered = 1;
    }
    while (pool.n_workers < n - 1) {
        if (pthread_create(&pool.threads[pool.n_workers], NULL, pool_worker,
                           (void*)(intptr_t)(pool.n_workers + 1)) != 0)
            break;
        pthread_detach(pool.threads[pool.n_workers]);
        pool.n_workers++;
    }
    pool.n_active = n < pool.n_workers + 1 ? n : pool.n_workers + 1;
    pthread_mutex_unlock(&pool.mu);
    return pool.n_active;
}

/* fn(ctx, part, parts) for part in 0..parts-1, in parallel; returns when all are done.
 * Concurrent callers (e.g. tensor-parallel ranks in threads of one process) take turns. */
static void run_parallel(task_fn fn, void* ctx, int parts) {
    if (parts > pool.n_active) parts = pool.n_active;
    if (parts <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool.dispatch);
    pthread_mutex_lock(&pool.mu);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.parts = parts;
    pool.pending = pool.n_workers;
    pool.generation++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    fn(ctx, 0, parts);
    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.dispatch);
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x, |relative error| < 1e-7 on [-88, 88]: 2^n * 2^f with a degree-7 polynomial for 2^f. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(87.0f));
    __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504f));
    __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(1.5252734e-5f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530e-4f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504109e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022651e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}

/* Prologue of one row: src [K] (or [2K] for SwiGLU) -> dst [K]. */
static void prologue_row(int kind, const float* src, const float* g, float eps, int K, float* dst) {
    if (kind == 1) {
        __m256 ss = _mm256_setzero_ps();
        for (int k = 0; k < K; k += 8) {
            __m256 v = _mm256_loadu_ps(src + k);
            ss = _mm256_fmadd_ps(v, v, ss);
        }
        __m256 scale = _mm256_set1_ps(1.0f / sqrtf(hsum8(ss) / (float)K + eps));
        for (int k = 0; k < K; k += 8)
            _mm256_storeu_ps(dst + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(src + k), scale),
                                                    _mm256_loadu_ps(g + k)));
    } else if (kind == 2) {
        const __m256 one = _mm256_set1_ps(1.0f);
        for (int k = 0; k < K; k += 8) {
            __m256 a = _mm256_loadu_ps(src + k), b = _mm256_loadu_ps(src + K + k);
            __m256 silu = _mm256_div_ps(a, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), a))));
            _mm256_storeu_ps(dst + k, _mm256_mul_ps(silu, b));
        }
    } else {
        for (int k = 0; k < K; k++) dst[k] = src[k];
    }
}

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

typedef struct { uint16_t d, m; uint8_t qs[16]; } BlockQ4;   /* w = d q + m  (f16 d, m) */
typedef struct { uint16_t d; int8_t qs[32]; } BlockQ8;       /* w = d q      (f16 d) */
typedef struct { float d, s; int16_t qs[32]; } BlockX;        /* x = d q, s = d sum(q) */

/* x [K] -> K/32 int16 blocks (scale d = max|x| / 32767, s = d * sum(q)). */
static void quantize_row(const float* x, int K, BlockX* out) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int b = 0; b < K / QK; b++) {
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + b * QK + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_and_ps(v[j], absmask));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float mx = _mm_cvtss_f32(m4);
        const __m256 inv = _mm256_set1_ps(mx > 0.0f ? 32767.0f / mx : 0.0f);
        __m256i i[4];
        for (int j = 0; j < 4; j++)
            i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], inv),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        /* packs works within 128-bit lanes: put the 64-bit quarters back in order */
        _mm256_storeu_si256((__m256i*)out[b].qs, _mm256_permute4x64_epi64(_mm256_packs_epi32(i[0], i[1]), 0xD8));
        _mm256_storeu_si256((__m256i*)(out[b].qs + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(i[2], i[3]), 0xD8));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_hadd_epi32(s4, s4);
        s4 = _mm_hadd_epi32(s4, s4);
        out[b].d = mx / 32767.0f;
        out[b].s = out[b].d * (float)_mm_cvtsi128_si32(s4);
    }
}

/* One weight row against R activation rows (R = 1 or 4: the weights are unpacked once). */
#define DEFINE_DOT_Q4(R)                                                                          \
static inline void dot_q4_##R(const BlockQ4* w, const BlockX* x, int nb, float* out) {          \
    const __m256i low = _mm256_set1_epi16(0x0F);                                                 \
    __m256 acc[R];                                                                               \
    float accm[R];                                                                               \
    for (int r = 0; r < R; r++) { acc[r] = _mm256_setzero_ps(); accm[r] = 0.0f; }                \
    for (int b = 0; b < nb; b++) {                                                               \
        const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)w[b].qs));    \
        const __m256i q0 = _mm256_and_si256(bytes, low);    /* elements 0..15 */                 \
        const __m256i q1 = _mm256_srli_epi16(bytes, 4);     /* elements 16..31 */                \
        const float d = h2f(w[b].d), m = h2f(w[b].m);                                            \
        for (int r = 0; r < R; r++) {                                                            \
            const BlockX* xb = x + (size_t)r * nb + b;                                           \
            const __m256i p = _mm256_add_epi32(                                                  \
                _mm256_madd_epi16(q0, _mm256_loadu_si256((const __m256i*)xb->qs)),               \
                _mm256_madd_epi16(q1, _mm256_loadu_si256((const __m256i*)(xb->qs + 16))));       \
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r]);  \
            accm[r] += m * xb->s;                                                                \
        }                                                                                        \
    }                                                                                            \
    for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]) + accm[r];                                \
}
DEFINE_DOT_Q4(1)
DEFINE_DOT_Q4(4)

#define DEFINE_DOT_Q8(R)                                                                          \
static inline void dot_q8_##R(const BlockQ8* w, const BlockX* x, int nb, float* out) {          \
    __m256 acc[R];                                                                               \
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                    \
    for (int b = 0; b < nb; b++) {                                                               \
        const __m256i q0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w[b].qs));      \
        const __m256i q1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w[b].qs + 16))); \
        const float d = h2f(w[b].d);                                                             \
        for (int r = 0; r < R; r++) {                                                            \
            const BlockX* xb = x + (size_t)r * nb + b;                                           \
            const __m256i p = _mm256_add_epi32(                                                  \
                _mm256_madd_epi16(q0, _mm256_loadu_si256((const __m256i*)xb->qs)),               \
                _mm256_madd_epi16(q1, _mm256_loadu_si256((const __m256i*)(xb->qs + 16))));       \
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r]);  \
        }                                                                                        \
    }                                                                                            \
    for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]);                                          \
}
DEFINE_DOT_Q8(1)
DEFINE_DOT_Q8(4)

"""

LINEAR_TAIL = r"""
/* Per-thread scratch for the prologue output and quantised activations, grown, never shrunk. */
static __thread float* scratch_f;
static __thread BlockX* scratch_x;
static __thread size_t scratch_rows_k;

static int reserve(size_t rows_k) {
    if (rows_k <= scratch_rows_k) return 0;
    free(scratch_f);
    free(scratch_x);
    scratch_f = malloc(rows_k * sizeof(float));
    scratch_x = malloc((rows_k / QK) * sizeof(BlockX));
    scratch_rows_k = (scratch_f && scratch_x) ? rows_k : 0;
    return scratch_rows_k ? 0 : -1;
}

#define MAX_PARTS 4

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
                if (j->kind == 104) {
                    const BlockQ4K* wr = (const BlockQ4K*)weight_row(j, n, nb / 8 * sizeof(BlockQ4K));
                    out[0] = dot_q4k(wr, xr, nb / 8);
                } else if (j->kind == 105) {
                    const BlockQ5K* wr = (const BlockQ5K*)weight_row(j, n, nb / 8 * sizeof(BlockQ5K));
                    out[0] = dot_q5k(wr, xr, nb / 8);
                } else if (j->kind == 106) {
                    const BlockQ6K* wr = (const BlockQ6K*)weight_row(j, n, nb / 8 * sizeof(BlockQ6K));
                    out[0] = dot_q6k(wr, xr, nb / 8);
                } else if (j->kind == 4) {
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

/* A linear layer's constant part, built once by the caller. */
typedef struct {
    int kind;       /* 4: w = q4 rows [N][K/32 blocks]; 8: q8 rows; 104/105/106: Q4_K/Q5_K/Q6_K */
    int prologue;   /* 0 none, 1 RMSNorm (gain g, eps), 2 SwiGLU */
    int K, N;
    float eps;
    const float* g; /* [K] or NULL */
    const void* w[MAX_PARTS];  /* parts of the weight rows, stacked: q | k | v, gate | up */
    int part_rows[MAX_PARTS];  /* rows of each part; they sum to N */
    const float* bias; /* [N] or NULL */
} LinearSpec;

/* y [M, N] = prologue(x) W^T + bias + residual. x is [M, K] ([M, 2K] for SwiGLU); residual
 * [M, N] is optional (NULL) and may be y itself. Returns 0 on success. */
int exo_qlinear(const LinearSpec* s, const float* x, int M, const float* residual, float* y) {
    const int K = s->K, N = s->N;
    if (K % QK != 0 || (s->kind != 4 && s->kind != 8 && (s->kind < 104 || s->kind > 106))) return -2;
    if (s->kind > 100 && K % 256 != 0) return -2;
    const int nb = K / QK;
    if (reserve((size_t)M * K)) return -1;
    const size_t x_stride = s->prologue == 2 ? 2 * (size_t)K : (size_t)K;
    for (int m = 0; m < M; m++) {
        float* row = scratch_f + (size_t)m * K;
        prologue_row(s->prologue, x + m * x_stride, s->g, s->eps, K, row);
        quantize_row(row, K, scratch_x + (size_t)m * nb);
    }
    LinearJob job = {s->kind, M, N, nb, scratch_x, s->w, s->part_rows, s->bias, residual, y};
    /* a part per thread, if each gets at least ~64k weight-rows of work */
    const long work = (long)M * N * K;
    const int parts = work >= (1L << 16) * 2 ? (int)(work >> 16) : 1;
    run_parallel(linear_part, &job, parts);
    return 0;
}

"""
