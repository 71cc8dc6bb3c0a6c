/* The chosen experts of one MoE step in one call: for each expert chosen by any token, its
 * gate|up layer over the rows that chose it, then its down layer (with its SwiGLU / GeGLU
 * prologue) and each output row written to its (token, rank) slot.
 *
 * Each layer is exo_qlinear on the same rows the Python loop gives it (engines/models/moe.py),
 * so every (token, rank) result is the loop's bit for bit: the same kernels, the same strategy
 * for the same row count, the same float order. What the call saves is the per-expert work
 * between the kernels: indexing, allocation, the wrappers' checks, the scatter.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exo_kernels.h"

/* Input width of a layer: 2K for the gated prologues (they read [a | b]). */
static int in_width(const LinearSpec* s) {
    return s->prologue == PROLOGUE_SWIGLU || s->prologue == PROLOGUE_GEGLU ? 2 * s->K : s->K;
}

/* gpt-oss's clamped SwiGLU, row by row in place: [gate | up] [rows, 2F] -> [rows, F] (stride F),
 * g = min(gate, limit), u = clamp(up, -limit, limit), (u + 1) g sigmoid(alpha g). */
static void clamped_swiglu(const MoeClamp* c, float* hidden, int rows, int F) {
    for (int r = 0; r < rows; r++) {
        const float* gu = hidden + (size_t)r * 2 * F;
        float* dst = hidden + (size_t)r * F; /* dst[j] is written after gu[j], gu[F + j] are read */
        for (int j = 0; j < F; j++) {
            const float g = gu[j] < c->limit ? gu[j] : c->limit;
            const float u0 = gu[F + j], u = u0 < -c->limit ? -c->limit : (u0 > c->limit ? c->limit : u0);
            dst[j] = (u + 1.0f) * (g / (1.0f + expf(-g * c->alpha)));
        }
    }
}

/* 0 if every chosen expert's layers chain (x [D] -> gate|up [H] -> down [O]) and the picks are a
 * permutation-sized list of valid slots, else -2. `max_rows`: the most rows one expert takes. */
static int check_moe(const LinearSpec* const* gate_up, const LinearSpec* const* down, int n_experts,
                     const int* chosen, const int* counts, int n_chosen, const int* picks,
                     int n_slots, int D, int O, int clamped, int* max_rows, int* max_hidden) {
    long total = 0;
    *max_rows = 0;
    *max_hidden = 0;
    for (int i = 0; i < n_chosen; i++) {
        const int e = chosen[i];
        if (e < 0 || e >= n_experts || counts[i] <= 0) return -2;
        const LinearSpec *g = gate_up[e], *d = down[e];
        if (g == NULL || d == NULL || in_width(g) != D || in_width(d) * (clamped ? 2 : 1) != g->N || d->N != O) return -2;
        if (counts[i] > *max_rows) *max_rows = counts[i];
        if (g->N > *max_hidden) *max_hidden = g->N;
        total += counts[i];
    }
    if (total != n_slots) return -2;
    for (int i = 0; i < n_slots; i++)
        if (picks[i] < 0 || picks[i] >= n_slots) return -2;
    return 0;
}

/* The chosen experts over their rows (check_moe has passed): for each, its rows of x gathered,
 * gate|up, down (clamped: gpt-oss's SwiGLU between them), each row to its slot of out. */
static int run_experts(const LinearSpec* const* gate_up, const LinearSpec* const* down, const int* chosen,
                       const int* counts, int n_chosen, const int* picks, int k, const float* x, int D, int O,
                       int max_rows, int max_hidden, const MoeClamp* clamp, float* out) {
    if (n_chosen == 0) return 0;
    float* xs = malloc((size_t)max_rows * D * sizeof(float));
    float* hidden = malloc((size_t)max_rows * max_hidden * sizeof(float));
    float* ys = malloc((size_t)max_rows * O * sizeof(float));
    int rc = xs && hidden && ys ? 0 : -1;
    const int* slot = picks;
    for (int i = 0; i < n_chosen && rc == 0; slot += counts[i], i++) {
        const int e = chosen[i], rows = counts[i];
        for (int j = 0; j < rows; j++) /* the rows that chose e: x[slot / k] */
            memcpy(xs + (size_t)j * D, x + (size_t)(slot[j] / k) * D, (size_t)D * sizeof(float));
        rc = exo_qlinear(gate_up[e], xs, rows, NULL, hidden);
        if (rc == 0 && clamp != NULL) clamped_swiglu(clamp, hidden, rows, gate_up[e]->N / 2);
        if (rc == 0) rc = exo_qlinear(down[e], hidden, rows, NULL, ys);
        for (int j = 0; j < rows && rc == 0; j++)
            memcpy(out + (size_t)slot[j] * O, ys + (size_t)j * O, (size_t)O * sizeof(float));
    }
    free(xs);
    free(hidden);
    free(ys);
    return rc;
}

/* out [n_tokens * k, O]: row t * k + r = expert_{e}(x[t]) for the r-th expert token t chose.
 * gate_up / down: every expert's layers (n_experts pointers); chosen [n_chosen]: the experts to
 * run, in order; counts [n_chosen]: rows each takes; picks [n_tokens * k]: the slots (t * k + r),
 * counts[0] of them for chosen[0], then chosen[1]'s, ... x [n_tokens, D]. 0, -1 out of memory,
 * -2 arguments that do not fit together (or an exo_qlinear refusal). */
int exo_moe_experts(const LinearSpec* const* gate_up, const LinearSpec* const* down, int n_experts,
                    const int* chosen, const int* counts, int n_chosen, const int* picks, int k,
                    const float* x, int n_tokens, int D, int O, float* out) {
    if (n_experts <= 0 || n_chosen < 0 || k <= 0 || n_tokens < 0 || D <= 0 || O <= 0) return -2;
    const int n_slots = n_tokens * k;
    int max_rows, max_hidden;
    if (check_moe(gate_up, down, n_experts, chosen, counts, n_chosen, picks, n_slots, D, O, 0, &max_rows,
                  &max_hidden) != 0)
        return -2;
    return run_experts(gate_up, down, chosen, counts, n_chosen, picks, k, x, D, O, max_rows, max_hidden, NULL,
                       out);
}

/* ---- issue 23 moedecode: a whole MoE feed-forward in one call ----
 *
 *     x = rmsnorm(h) g;  logits = x Wr^T (+ br);  (w, e) = route(logits)   (models/router.py)
 *     out = [h +] sum_r w_r expert_{e_r}(x) (+ shared(x))                    (models/moe.py)
 *
 * Every step is row by row (a token's norm, logits, choice and weighted sum never read another
 * token's) and the experts run on the rows that chose them as exo_moe_experts runs them, so a
 * token's result does not depend on its batch. */

/* sum a[i] b[i] in a fixed order: 16 lanes, then the lanes pairwise. */
static float dot16(const float* a, const float* b, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += a[i] * b[i];
    for (int w = 8; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

/* The index of the largest of v[0..n) not yet taken, ties to the lower index (-1: none left). */
static int best_left(const float* v, const unsigned char* taken, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

/* The k largest of v[0..n), largest first, ties to the lower index (a stable descending sort). */
static void top_k(const float* v, int n, int k, unsigned char* taken, int* idx) {
    memset(taken, 0, (size_t)n);
    for (int r = 0; r < k; r++) {
        idx[r] = best_left(v, taken, n);
        taken[idx[r]] = 1;
    }
}

/* choice [E]: the experts of the groups a token may not use set to -inf (a group scores the sum
 * of its `best` highest choices, highest first). */
static void group_mask(const MoeSpec* m, float* choice, unsigned char* taken, int* idx, int best) {
    const int G = m->n_group, per = m->E / G, b = best < per ? best : per;
    float scores[256] = {0}; /* G <= 256 (check_spec); zeroed: some compilers cannot see it */
    for (int g = 0; g < G; g++) {
        top_k(choice + g * per, per, b, taken, idx);
        float s = choice[g * per + idx[0]];
        for (int r = 1; r < b; r++) s += choice[g * per + idx[r]];
        scores[g] = s;
    }
    top_k(scores, G, m->topk_group, taken, idx);
    unsigned char allowed[256] = {0};
    for (int r = 0; r < m->topk_group; r++) allowed[idx[r]] = 1;
    for (int g = 0; g < G; g++)
        if (!allowed[g])
            for (int j = 0; j < per; j++) choice[g * per + j] = -INFINITY;
}

/* One token's logits [E] -> its k experts and weights. work: 2E floats, E bytes, E ints. */
static void route_token(const MoeSpec* m, const float* logits, float* work, unsigned char* taken, int* idx,
                        int* experts, float* weights) {
    const int E = m->E, k = m->k;
    float *p = work, *choice = work + E;
    if (m->route_kind == MOE_ROUTE_SOFTMAX_SELECTED) {
        top_k(logits, E, k, taken, experts);
        float mx = logits[experts[0]], sum = 0.0f;
        for (int r = 0; r < k; r++) sum += (weights[r] = expf(logits[experts[r]] - mx));
        for (int r = 0; r < k; r++) weights[r] /= sum;
    } else {
        if (m->route_kind == MOE_ROUTE_SOFTMAX) {
            float mx = logits[0], sum = 0.0f;
            for (int e = 1; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
            for (int e = 0; e < E; e++) sum += (p[e] = expf(logits[e] - mx));
            for (int e = 0; e < E; e++) choice[e] = p[e] /= sum;
        } else {
            for (int e = 0; e < E; e++) {
                p[e] = 1.0f / (1.0f + expf(-logits[e]));
                choice[e] = m->correction ? p[e] + m->correction[e] : p[e];
            }
        }
        if (m->n_group > 1) group_mask(m, choice, taken, idx, m->route_kind == MOE_ROUTE_SOFTMAX ? 1 : 2);
        top_k(choice, E, k, taken, experts);
        float sum = 0.0f;
        for (int r = 0; r < k; r++) sum += (weights[r] = p[experts[r]]);
        if (m->normalize) {
            const float denom = m->route_kind == MOE_ROUTE_SOFTMAX ? sum : sum + 1e-20f;
            for (int r = 0; r < k; r++) weights[r] /= denom;
        }
    }
    if (m->scaling != 1.0f)
        for (int r = 0; r < k; r++) weights[r] *= m->scaling;
}

typedef struct {
    const MoeSpec* m;
    const float* x;
    float* logits;
    int n;
} RouterJob;

/* logits[t, e] for experts [E part / parts, E (part + 1) / parts) of every token. */
static void router_part(void* ctx, int part, int parts) {
    const RouterJob* j = (const RouterJob*)ctx;
    const MoeSpec* m = j->m;
    const int e0 = (int)((long)m->E * part / parts), e1 = (int)((long)m->E * (part + 1) / parts);
    for (int t = 0; t < j->n; t++)
        for (int e = e0; e < e1; e++) {
            const float b = m->router_bias ? m->router_bias[e] : 0.0f;
            j->logits[(size_t)t * m->E + e] = dot16(m->router + (size_t)e * m->D, j->x + (size_t)t * m->D, m->D) + b;
        }
}

/* x [n, D] = rmsnorm(h) g, row by row. */
static void norm_rows(const MoeSpec* m, const float* h, int n, float* x) {
    for (int t = 0; t < n; t++) {
        const float* row = h + (size_t)t * m->D;
        const float scale = 1.0f / sqrtf(dot16(row, row, m->D) / (float)m->D + m->eps);
        for (int i = 0; i < m->D; i++) x[(size_t)t * m->D + i] = row[i] * scale * m->norm[i];
    }
}

static int check_spec(const MoeSpec* m) {
    if (m->D <= 0 || m->E <= 0 || m->k <= 0 || m->k > m->E || m->norm == NULL || m->router == NULL) return -2;
    if (m->route_kind < MOE_ROUTE_SOFTMAX || m->route_kind > MOE_ROUTE_SIGMOID) return -2;
    if (m->n_group < 1 || m->n_group > 256 || m->E % m->n_group) return -2;
    if (m->n_group > 1 && (m->topk_group < 1 || m->topk_group > m->n_group)) return -2;
    if ((m->shared_gate_up == NULL) != (m->shared_down == NULL)) return -2;
    if (m->shared_gate_up && (in_width(m->shared_gate_up) != m->D || in_width(m->shared_down) != m->shared_gate_up->N ||
                              m->shared_down->N != m->D))
        return -2;
    return 0;
}

/* Tokens grouped by expert: chosen (ascending), counts, and the slots t k + r in slot order. */
static int group_slots(const int* experts, int n_slots, int E, int* per, int* chosen, int* counts, int* picks) {
    memset(per, 0, (size_t)E * sizeof(int));
    for (int i = 0; i < n_slots; i++) per[experts[i]]++;
    int n_chosen = 0, start = 0;
    for (int e = 0; e < E; e++) {
        if (per[e] == 0) continue;
        chosen[n_chosen] = e;
        counts[n_chosen++] = per[e];
        const int c = per[e];
        per[e] = start; /* now: the next free place of e's slots */
        start += c;
    }
    for (int i = 0; i < n_slots; i++) picks[per[experts[i]]++] = i;
    return n_chosen;
}

/* y [n, D] = sum_r w_r outs[t k + r] in rank order (+ shared [n, D]) (+ h). */
static void combine(const float* outs, const float* w, const float* shared, const float* h, int n, int k, int D,
                    float* y) {
    for (int t = 0; t < n; t++) {
        float* yt = y + (size_t)t * D;
        for (int i = 0; i < D; i++) yt[i] = w[t * k] * outs[(size_t)t * k * D + i];
        for (int r = 1; r < k; r++) {
            const float wr = w[t * k + r], *o = outs + ((size_t)t * k + r) * D;
            for (int i = 0; i < D; i++) yt[i] = yt[i] + wr * o[i];
        }
        if (shared)
            for (int i = 0; i < D; i++) yt[i] = yt[i] + shared[(size_t)t * D + i];
        if (h)
            for (int i = 0; i < D; i++) yt[i] = h[(size_t)t * D + i] + yt[i];
    }
}

/* The experts (and the shared expert) of routed tokens: outs [n k, D], shared [n, D]. */
static int run_ffn_experts(const MoeSpec* m, const float* x, int n, const int* experts, float* outs, float* shared) {
    const int n_slots = n * m->k, E = m->E;
    int* ints = malloc(((size_t)E * 3 + (size_t)n_slots) * sizeof(int));
    if (ints == NULL) return -1;
    int *per = ints, *chosen = ints + E, *counts = ints + 2 * E, *picks = ints + 3 * E;
    const int n_chosen = group_slots(experts, n_slots, E, per, chosen, counts, picks);
    int max_rows, max_hidden;
    int rc = check_moe(m->gate_up, m->down, E, chosen, counts, n_chosen, picks, n_slots, m->D, m->D, m->clamped,
                       &max_rows, &max_hidden);
    const MoeClamp clamp = {m->alpha, m->limit};
    if (rc == 0)
        rc = run_experts(m->gate_up, m->down, chosen, counts, n_chosen, picks, m->k, x, m->D, m->D, max_rows,
                         max_hidden, m->clamped ? &clamp : NULL, outs);
    free(ints);
    if (rc != 0 || m->shared_gate_up == NULL) return rc;
    float* hidden = malloc((size_t)n * m->shared_gate_up->N * sizeof(float));
    rc = hidden ? exo_qlinear(m->shared_gate_up, x, n, NULL, hidden) : -1;
    if (rc == 0) rc = exo_qlinear(m->shared_down, hidden, n, NULL, shared);
    free(hidden);
    return rc;
}

/* out [n, D] = (add_residual ? h : 0) + moe(h) for h [n, D] (see above); experts_out [n, k] and
 * weights_out [n, k] (either may be NULL) receive the routing. 0, -1 out of memory, -2 a spec or
 * an expert layer that does not fit. */
int exo_moe_ffn(const MoeSpec* m, const float* h, int n, int add_residual, float* out, int* experts_out,
                float* weights_out) {
    if (check_spec(m) != 0 || n < 0) return -2;
    if (n == 0) return 0;
    const int D = m->D, E = m->E, k = m->k;
    const size_t floats = (size_t)n * D + (size_t)n * E + 2 * (size_t)E + (size_t)n * k + (size_t)n * k * D +
                          (m->shared_gate_up ? (size_t)n * D : 0);
    float* buf = malloc(floats * sizeof(float));
    int* ints = malloc(((size_t)n * k + (size_t)E) * sizeof(int));
    unsigned char* taken = malloc((size_t)E + 256);
    int rc = buf && ints && taken ? 0 : -1;
    if (rc == 0) {
        float *x = buf, *logits = x + (size_t)n * D, *work = logits + (size_t)n * E, *w = work + 2 * E;
        float *outs = w + (size_t)n * k, *shared = m->shared_gate_up ? outs + (size_t)n * k * D : NULL;
        int *experts = ints, *idx = ints + (size_t)n * k;
        norm_rows(m, h, n, x);
        RouterJob job = {m, x, logits, n};
        const long work_size = (long)n * E * D;
        exo_run_parallel(router_part, &job, work_size >= (1L << 18) ? (E < MAX_THREADS ? E : MAX_THREADS) : 1);
        for (int t = 0; t < n; t++)
            route_token(m, logits + (size_t)t * E, work, taken, idx, experts + (size_t)t * k, w + (size_t)t * k);
        rc = run_ffn_experts(m, x, n, experts, outs, shared);
        if (rc == 0) combine(outs, w, shared, add_residual ? h : NULL, n, k, D, out);
        if (experts_out) memcpy(experts_out, experts, (size_t)n * k * sizeof(int));
        if (weights_out) memcpy(weights_out, w, (size_t)n * k * sizeof(float));
    }
    free(buf);
    free(ints);
    free(taken);
    return rc;
}

/* ---- issue 23 moedecode: one linear per head (MLA's absorbed Wuk and Wuv) ----
 * y [M, H, N]: y[m, h] = specs[h](x[m, h]) for x [M, H, K]; every head's layer K -> N. 0, -1 out
 * of memory, -2 a layer that does not fit. */
int exo_head_linears(const LinearSpec* const* specs, int H, const float* x, int M, int K, int N, float* y) {
    if (H <= 0 || M < 0 || K <= 0 || N <= 0) return -2;
    for (int h = 0; h < H; h++)
        if (specs[h] == NULL || in_width(specs[h]) != K || specs[h]->N != N) return -2;
    if (M == 0) return 0;
    float* xs = malloc((size_t)M * K * sizeof(float));
    float* ys = malloc((size_t)M * N * sizeof(float));
    int rc = xs && ys ? 0 : -1;
    for (int h = 0; h < H && rc == 0; h++) {
        for (int m = 0; m < M; m++)
            memcpy(xs + (size_t)m * K, x + ((size_t)m * H + h) * K, (size_t)K * sizeof(float));
        rc = exo_qlinear(specs[h], xs, M, NULL, ys);
        for (int m = 0; m < M && rc == 0; m++)
            memcpy(y + ((size_t)m * H + h) * N, ys + (size_t)m * N, (size_t)N * sizeof(float));
    }
    free(xs);
    free(ys);
    return rc;
}
