/* Quantised linear layers: y [M, N] = prologue(x) W^T (+ bias) (+ residual), or with a post-norm
 * y = residual + rmsnorm(prologue(x) W^T + bias) * post_g (Gemma 3's norms after attention / MLP).
 *
 * Activations are quantised on the fly to int16 blocks of 32 (15 bits keep the result within
 * ~1e-4 of float32), so a block's dot product is integer multiply-adds and one float
 * multiply-add (dot_q.h, dot_kquants.h). With several activation rows (batched decode,
 * prefill) the AVX2 build takes 8 weight rows at a time into a tile whose vector lanes are the 8
 * rows (tile.h): a convert and an FMA then finish a block for 8 outputs instead of one. Q4_1,
 * Q8_0, Q5_0, Q4_K and Q6_K weights re-laid that way at load (KIND_*_G8, grouped.h) need no tile built
 * per pass, and share the float tail among 8 rows at any number of activation rows. The
 * weight rows come in up to MAX_PARTS parts stacked along the output (q | k | v), each in its own
 * layout. Threads split the output rows: each streams its own contiguous rows of the weights.
 */
#include <math.h>

#include "exo_kernels.h"
#include "dot_q.h"
#include "dot_kquants.h"
#include "unpacked.h"
#include "tile.h"
#include "grouped.h"

/* activation rows from which groups of 8 rows (grouped.h) go through a tile too */
#define G8_TILE_ROWS 16
#define G8_Q8_TILE_ROWS 6
#define G8_Q5_TILE_ROWS 4
#define G8_Q4K_TILE_ROWS 16
#define G8_Q6K_TILE_ROWS 4
/* activation rows from which a prefill tile unpacks each weight row once (unpacked.h) */
#define UNPACK_ROWS 8
/* Whether `rows` activation rows take the tile path (tile.h, AVX2) for weights of `kind`: where
 * dot_q.h / dot_kquants.h run 4 rows at once (R = 4) and unpack faster than a tile is built, Q8_0
 * at 2 or 4 rows and Q4_K / Q5_K at 2, 4 or 5, they stay (measured with weights not in cache). */
static inline int use_tile(int kind, int rows) {
    if (kind == KIND_Q4_G8) return rows >= G8_TILE_ROWS;
    if (kind == KIND_Q5_0_G8) return rows >= G8_Q5_TILE_ROWS;
    if (kind == KIND_Q4_K_G8) return rows >= G8_Q4K_TILE_ROWS;
    if (kind == KIND_Q6_K_G8) return rows >= G8_Q6K_TILE_ROWS;
    if (kind == KIND_Q8_G8) return rows >= G8_Q8_TILE_ROWS;
    if (rows < 2) return 0;
    if (kind == KIND_Q8) return rows != 2 && rows != 4;
    if (kind == KIND_Q4_K || kind == KIND_Q5_K) return rows == 3 || rows >= 6;
    return 1;
}
/* tiles ahead whose weights are prefetched, into L2 (into L1 measured slower: they evict the
 * tile being used) */
#define TILE_PF 2

typedef struct {
    int M, N, nb;
    const BlockX* x;
    const LinearSpec* s;
    const float *bias, *residual;
    float* y;
} LinearJob;

static inline int kind_of_part(const LinearSpec* s, int p) {
    return s->part_kind[p] ? s->part_kind[p] : s->kind;
}

static inline int is_kquant(int kind) {
    return kind == KIND_Q4_K || kind == KIND_Q5_K || kind == KIND_Q6_K;
}

static int known_kind(int kind) {
    return kind == KIND_Q4 || kind == KIND_Q8 || kind == KIND_Q5_0 || kind == KIND_Q5_1 ||
           is_kquant(kind) || is_grouped(kind);
}

/* Bytes of one weight row of `kind` holding nb blocks of 32 values. */
static size_t row_bytes(int kind, int nb) {
    switch (kind) {
        case KIND_Q4:
        case KIND_Q4_G8: return (size_t)nb * sizeof(BlockQ4); /* a group: 8 rows' bytes */
        case KIND_Q8:
        case KIND_Q8_G8: return (size_t)nb * sizeof(BlockQ8);
        case KIND_Q5_0:
        case KIND_Q5_0_G8: return (size_t)nb * sizeof(BlockQ5_0);
        case KIND_Q5_1: return (size_t)nb * sizeof(BlockQ5_1);
        case KIND_Q4_K:
        case KIND_Q4_K_G8: return (size_t)nb / 8 * sizeof(BlockQ4K);
        case KIND_Q5_K: return (size_t)nb / 8 * sizeof(BlockQ5K);
        default: return (size_t)nb / 8 * sizeof(BlockQ6K); /* Q6_K, KIND_Q6_K_G8 */
    }
}

/* Dot products of weight row `wr` (layout `kind`) with R activation rows from xr (R = 1 or 4). */
static inline void dot_row(int kind, const void* wr, const BlockX* xr, int nb, int R, float* out) {
    switch (kind) {
        case KIND_Q4_K: dot_q4k((const BlockQ4K*)wr, xr, nb / 8, R, out); break;
        case KIND_Q5_K: dot_q5k((const BlockQ5K*)wr, xr, nb / 8, R, out); break;
        case KIND_Q6_K: dot_q6k((const BlockQ6K*)wr, xr, nb / 8, R, out); break;
        case KIND_Q4:
            if (R == 4) dot_q4_4((const BlockQ4*)wr, xr, nb, out);
            else dot_q4_1((const BlockQ4*)wr, xr, nb, out);
            break;
        case KIND_Q5_0: /* has_m a constant at each call: the unpacking specialises */
            if (R == 4) dot_q5_4((const uint8_t*)wr, sizeof(BlockQ5_0), 0, xr, nb, out);
            else dot_q5_1((const uint8_t*)wr, sizeof(BlockQ5_0), 0, xr, nb, out);
            break;
        case KIND_Q5_1:
            if (R == 4) dot_q5_4((const uint8_t*)wr, sizeof(BlockQ5_1), 1, xr, nb, out);
            else dot_q5_1((const uint8_t*)wr, sizeof(BlockQ5_1), 1, xr, nb, out);
            break;
        default:
            if (R == 4) dot_q8_4((const BlockQ8*)wr, xr, nb, out);
            else dot_q8_1((const BlockQ8*)wr, xr, nb, out);
    }
}

/* Output rows [N * part / parts, N * (part + 1) / parts) of a linear job. */
static void linear_part(void* ctx, int part, int parts) {
    const LinearJob* j = (const LinearJob*)ctx;
    const LinearSpec* s = j->s;
    /* part boundaries on multiples of 8 rows: a tile (tile.h) never straddles two parts */
    const int n0 = (int)((long)j->N * part / parts) & ~7;
    const int n1 = part == parts - 1 ? j->N : (int)((long)j->N * (part + 1) / parts) & ~7;
    const int TM = 64; /* activation rows per pass over the weights (they stay in L2) */
    const int nb = j->nb;
    float out[4];
    for (int m0 = 0; m0 < j->M; m0 += TM) {
        const int m1 = m0 + TM < j->M ? m0 + TM : j->M;
        int base = 0; /* first output row of part p */
        for (int p = 0; p < MAX_PARTS && base < n1; base += s->part_rows[p], p++) {
            const int lo = n0 > base ? n0 : base;
            const int hi = n1 < base + s->part_rows[p] ? n1 : base + s->part_rows[p];
            const int kind = kind_of_part(s, p);
            const size_t rb = row_bytes(kind, nb);
            int n = lo;
            if (is_grouped(kind) && !(EXO_AVX2 && use_tile(kind, m1 - m0))) {
                /* lo - base and hi - base are multiples of 8 (check_spec) */
                for (; n < hi; n += G8_ROWS) {
                    const uint8_t* grp = (const uint8_t*)s->w[p] + (size_t)(n - base) * rb;
                    for (int m = m0; m < m1;) {
                        const int R = m1 - m >= G8_MAX_R ? G8_MAX_R : m1 - m;
                        float o[G8_MAX_R * G8_ROWS];
                        g8_dot(kind, grp, nb, j->x + (size_t)m * nb, R, o);
                        for (int r = 0; r < R; r++)
                            for (int c = 0; c < G8_ROWS; c++) {
                                const size_t i = (size_t)(m + r) * j->N + n + c;
                                j->y[i] = o[G8_ROWS * r + c] + (j->bias ? j->bias[n + c] : 0.0f) +
                                          (j->residual ? j->residual[i] : 0.0f);
                            }
                        m += R;
                    }
                }
            }
#if EXO_AVX2
            if (use_tile(kind, m1 - m0) && n < hi) { /* batched decode, prefill: 8 weight rows at once */
                void* buf = exo_scratch(SCRATCH_TILE, tile_bytes(nb));
                if (buf != NULL) {
                    const Tile t = tile_at(buf, nb);
                    /* the weights of the tiles ahead, as one run of bytes (the hardware prefetchers
                     * miss 8 short streams): the first ones now, then one tile per tile */
                    const char* wp = (const char*)s->w[p];
                    const size_t pf_end = (size_t)(hi - base) * rb;
                    size_t pf = (size_t)(n - base) * rb; /* bytes into the part */
                    for (; pf < pf_end && pf < (size_t)(n - base + TILE_PF * TILE_COLS) * rb; pf += 64)
                        _mm_prefetch(wp + pf, _MM_HINT_T1);
                    for (; n < hi; n += TILE_COLS) {
                        const int cols = hi - n < TILE_COLS ? hi - n : TILE_COLS;
                        const uint8_t* rows[TILE_COLS]; /* past the part's end: its last row again */
                        for (int c = 0; c < TILE_COLS; c++)
                            rows[c] = (const uint8_t*)s->w[p] + (size_t)(n - base + (c < cols ? c : cols - 1)) * rb;
                        for (; pf < pf_end && pf < (size_t)(n - base + (TILE_PF + 1) * TILE_COLS) * rb; pf += 64)
                            _mm_prefetch(wp + pf, _MM_HINT_T1);
                        if (is_grouped(kind)) tile_from_group(kind, rows[0], nb, t);
                        else tile_build(kind, rows, nb, t);
                        for (int m = m0; m < m1;) {
                            const int R = m1 - m >= TILE_MAX_R ? TILE_MAX_R : m1 - m;
                            __m256 acc[TILE_MAX_R];
                            float o[TILE_COLS];
                            tile_dot(&t, nb, j->x + (size_t)m * nb, g8_file_kind(kind), R, acc);
                            for (int r = 0; r < R; r++) {
                                const size_t i = (size_t)(m + r) * j->N + n;
                                if (cols == TILE_COLS) { /* residual may be y itself: read before the write */
                                    __m256 v = acc[r];
                                    if (j->bias) v = _mm256_add_ps(v, _mm256_loadu_ps(j->bias + n));
                                    if (j->residual) v = _mm256_add_ps(v, _mm256_loadu_ps(j->residual + i));
                                    _mm256_storeu_ps(j->y + i, v);
                                    continue;
                                }
                                _mm256_storeu_ps(o, acc[r]);
                                for (int c = 0; c < cols; c++)
                                    j->y[i + c] = o[c] + (j->bias ? j->bias[n + c] : 0.0f) + (j->residual ? j->residual[i + c] : 0.0f);
                            }
                            m += R;
                        }
                    }
                    n = hi;
                }
            }
#endif
            if (!is_kquant(kind) && m1 - m0 >= UNPACK_ROWS && n < hi) { /* prefill: unpack each row once */
                const size_t bytes = (size_t)nb * QK * sizeof(int16_t) + 2 * (size_t)nb * sizeof(float);
                char* buf = exo_scratch(SCRATCH_UNPACK, bytes);
                if (buf != NULL) {
                    const UnpackedRow u = {(int16_t*)buf, (float*)(buf + (size_t)nb * QK * sizeof(int16_t)),
                                           (float*)(buf + (size_t)nb * QK * sizeof(int16_t)) + nb};
                    for (; n < hi; n++) {
                        unpack_row(kind, (const char*)s->w[p] + (size_t)(n - base) * rb, nb, u);
                        const float bn = j->bias ? j->bias[n] : 0.0f;
                        for (int m = m0; m < m1;) {
                            const int R = m1 - m >= 4 ? 4 : 1;
                            if (R == 4) dot_unpacked_4(u, j->x + (size_t)m * nb, nb, out);
                            else dot_row(kind, (const char*)s->w[p] + (size_t)(n - base) * rb, j->x + (size_t)m * nb, nb, 1, out);
                            for (int r = 0; r < R; r++) {
                                const size_t i = (size_t)(m + r) * j->N + n;
                                j->y[i] = out[r] + bn + (j->residual ? j->residual[i] : 0.0f);
                            }
                            m += R;
                        }
                    }
                }
            }
            if ((kind == KIND_Q8 || kind == KIND_Q5_0) && m1 - m0 < 4 && n == lo) { /* decode: rows n and n + half in one pass (two
                                                    * streams far apart: adjacent rows interleaved
                                                    * defeat the prefetchers) */
                const int half = (hi - lo) / 2;
                for (; n < lo + half; n++) {
                    const int rows[2] = {n, n + half};
                    const char* w = (const char*)s->w[p];
                    const char* w0 = w + (size_t)(rows[0] - base) * rb;
                    const char* w1 = w + (size_t)(rows[1] - base) * rb;
                    for (int m = m0; m < m1; m++) {
                        if (kind == KIND_Q8)
                            dot_q8_1x2((const BlockQ8*)w0, (const BlockQ8*)w1, j->x + (size_t)m * nb, nb, out);
                        else
                            dot_q5_0_1x2((const uint8_t*)w0, (const uint8_t*)w1, j->x + (size_t)m * nb, nb, out);
                        for (int r = 0; r < 2; r++) {
                            const size_t i = (size_t)m * j->N + rows[r];
                            j->y[i] = out[r] + (j->bias ? j->bias[rows[r]] : 0.0f) + (j->residual ? j->residual[i] : 0.0f);
                        }
                    }
                }
                n = lo + 2 * half;
            }
            for (; n < hi; n++) {
                const void* wr = (const char*)s->w[p] + (size_t)(n - base) * rb;
                const float bn = j->bias ? j->bias[n] : 0.0f;
                for (int m = m0; m < m1;) {
                    const int R = m1 - m >= 4 ? 4 : 1;
                    dot_row(kind, wr, j->x + (size_t)m * nb, nb, R, out);
                    for (int r = 0; r < R; r++) {
                        const size_t i = (size_t)(m + r) * j->N + n;
                        j->y[i] = out[r] + bn + (j->residual ? j->residual[i] : 0.0f);
                    }
                    m += R;
                }
            }
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

/* 0 if the spec is one the kernel takes, -2 if not. */
static int check_spec(const LinearSpec* s) {
    const int K = s->K, N = s->N;
    if (K <= 0 || N <= 0 || K % QK != 0) return -2;
    if (s->prologue < PROLOGUE_NONE || s->prologue > PROLOGUE_GEGLU) return -2;
    if (s->prologue == PROLOGUE_RMS_NORM && s->g == NULL) return -2;
    if (!known_kind(s->kind)) return -2;
    int rows = 0;
    for (int p = 0; p < MAX_PARTS; p++) {
        if (s->part_rows[p] < 0 || (s->part_rows[p] > 0 && s->w[p] == NULL)) return -2;
        if (s->part_kind[p] != 0 && !known_kind(s->part_kind[p])) return -2;
        if (s->part_rows[p] > 0 && is_kquant(g8_file_kind(kind_of_part(s, p))) && K % QK_K != 0) return -2;
        /* groups of 8 rows that start on a multiple of 8 (partitions split on those) */
        if (s->part_rows[p] > 0 && is_grouped(kind_of_part(s, p)) &&
            (s->part_rows[p] % G8_ROWS != 0 || rows % G8_ROWS != 0))
            return -2;
        if (s->part_rows[p] > N - rows) return -2;
        rows += s->part_rows[p];
    }
    return rows == N ? 0 : -2;
}

/* y [M, N] = prologue(x) W^T + bias + residual (or the post-norm form, see the top). x is
 * [M, K] ([M, 2K] for SwiGLU / GeGLU); residual [M, N] is optional (NULL) and may be y itself.
 * Returns 0 on success, -1 out of memory, -2 a spec the kernel does not take. */
int exo_qlinear(const LinearSpec* s, const float* x, int M, const float* residual, float* y) {
    if (check_spec(s) != 0 || M < 0) return -2;
    if (M == 0) return 0;
    const int K = s->K, N = s->N, nb = K / QK;
    float* scratch_f = exo_scratch(SCRATCH_PROLOGUE, (size_t)M * K * sizeof(float));
    BlockX* scratch_x = exo_scratch(SCRATCH_QUANT, (size_t)M * nb * sizeof(BlockX));
    float* raw = s->post_g ? exo_scratch(SCRATCH_POST, (size_t)M * N * sizeof(float)) : y;
    if (scratch_f == NULL || scratch_x == NULL || raw == NULL) return -1;
    const int glu = s->prologue == PROLOGUE_SWIGLU || s->prologue == PROLOGUE_GEGLU;
    const size_t x_stride = glu ? 2 * (size_t)K : (size_t)K;
    for (int m = 0; m < M; m++) {
        float* row = scratch_f + (size_t)m * K;
        exo_prologue_row(s->prologue, x + (size_t)m * x_stride, s->g, s->eps, K, row);
        exo_quantize_row(row, K, scratch_x + (size_t)m * nb);
    }
    LinearJob job = {M, N, nb, scratch_x, s, s->bias, s->post_g ? NULL : residual, raw};
    /* a part per thread, if each gets at least ~64k weight-rows of work */
    const long work = (long)M * N * K;
    const int parts = work >= (1L << 16) * 2 ? (int)(work >> 16 < MAX_THREADS ? work >> 16 : MAX_THREADS) : 1;
    exo_run_parallel(linear_part, &job, parts);
    if (s->post_g) post_norm(raw, M, N, s->post_g, s->post_eps, residual, y);
    return 0;
}
