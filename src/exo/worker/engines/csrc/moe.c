/* The chosen experts of one MoE step in one call: for each expert chosen by any token, its
 * gate|up layer over the rows that chose it, then its down layer (with its SwiGLU / GeGLU
 * prologue) and each output row written to its (token, rank) slot.
 *
 * Each layer is exo_qlinear on the same rows the Python loop gives it (engines/models/moe.py),
 * so every (token, rank) result is the loop's bit for bit: the same kernels, the same strategy
 * for the same row count, the same float order. What the call saves is the per-expert work
 * between the kernels: indexing, allocation, the wrappers' checks, the scatter.
 */
#include <stdlib.h>
#include <string.h>

#include "exo_kernels.h"

/* Input width of a layer: 2K for the gated prologues (they read [a | b]). */
static int in_width(const LinearSpec* s) {
    return s->prologue == PROLOGUE_SWIGLU || s->prologue == PROLOGUE_GEGLU ? 2 * s->K : s->K;
}

/* 0 if every chosen expert's layers chain (x [D] -> gate|up [H] -> down [O]) and the picks are a
 * permutation-sized list of valid slots, else -2. `max_rows`: the most rows one expert takes. */
static int check_moe(const LinearSpec* const* gate_up, const LinearSpec* const* down, int n_experts,
                     const int* chosen, const int* counts, int n_chosen, const int* picks,
                     int n_slots, int D, int O, int* max_rows, int* max_hidden) {
    long total = 0;
    *max_rows = 0;
    *max_hidden = 0;
    for (int i = 0; i < n_chosen; i++) {
        const int e = chosen[i];
        if (e < 0 || e >= n_experts || counts[i] <= 0) return -2;
        const LinearSpec *g = gate_up[e], *d = down[e];
        if (g == NULL || d == NULL || in_width(g) != D || in_width(d) != g->N || d->N != O) return -2;
        if (counts[i] > *max_rows) *max_rows = counts[i];
        if (g->N > *max_hidden) *max_hidden = g->N;
        total += counts[i];
    }
    if (total != n_slots) return -2;
    for (int i = 0; i < n_slots; i++)
        if (picks[i] < 0 || picks[i] >= n_slots) return -2;
    return 0;
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
    if (check_moe(gate_up, down, n_experts, chosen, counts, n_chosen, picks, n_slots, D, O, &max_rows,
                  &max_hidden) != 0)
        return -2;
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
        if (rc == 0) rc = exo_qlinear(down[e], hidden, rows, NULL, ys);
        for (int j = 0; j < rows && rc == 0; j++)
            memcpy(out + (size_t)slot[j] * O, ys + (size_t)j * O, (size_t)O * sizeof(float));
    }
    free(xs);
    free(hidden);
    free(ys);
    return rc;
}
