/* 8-bit activations: the per-row quantiser, the setting, and the generic dots of the kinds that
 * have 8-bit dots (the float order: act8.h). */
#include <math.h>

#include "act8.h"

static int activation_bits = 16; /* 8 is slower than 16 here yet (bench/kernels.py) */

int exo_set_activations(int bits) {
    if (bits != 8 && bits != 16) return -2;
    const int before = activation_bits;
    __atomic_store_n(&activation_bits, bits, __ATOMIC_RELAXED);
    return before;
}

int exo_activation_bits(void) { return __atomic_load_n(&activation_bits, __ATOMIC_RELAXED); }

void exo_quantize_row8(const float* x, int K, BlockX8* out) {
    for (int b = 0; b < K / QK; b++) {
        const float* xb = x + (size_t)b * QK;
        float amax = 0.0f;
        for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int i = 0; i < QK; i++) {
            const int q = (int)roundf(xb[i] * id);
            out[b].qs[i] = (int8_t)q;
            sum += q;
        }
        out[b].d = d;
        out[b].s = d * (float)sum;
    }
}

/* One weight row of nb Q4 blocks (Q4_1 if `has_m`, else Q4_0) against one activation row. */
static inline __attribute__((always_inline)) float row_dot(const uint8_t* w, const BlockX8* x, int nb,
                                                           int has_m) {
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        if (has_m) {
            const BlockQ4_1* wb = (const BlockQ4_1*)w + b;
            acc = act8_step(acc, exo_h2f(wb->d), q4_1_min(wb), x + b, q4_isum8(wb->qs, x[b].qs));
        } else {
            const BlockQ4_0* wb = (const BlockQ4_0*)w + b;
            acc = act8_step(acc, exo_h2f(wb->d), q4_0_min(wb), x + b, q4_isum8(wb->qs, x[b].qs));
        }
    }
    return acc;
}

static inline __attribute__((always_inline)) int run_dot8(const Run* r, int has_m) {
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1; m++) run_store(r, m, n, row_dot(wr, r->x8 + (size_t)m * r->nb, r->nb, has_m));
    }
    return 0;
}

static float row_dot_q8_0(const uint8_t* w, const BlockX8* x, int nb) {
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        const BlockQ8_0* wb = (const BlockQ8_0*)w + b;
        acc = act8_step0(acc, exo_h2f(wb->d), x + b, q8_isum8(wb->qs, x[b].qs));
    }
    return acc;
}

int exo_generic_dot8_q8_0(const Run* r) {
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1; m++) run_store(r, m, n, row_dot_q8_0(wr, r->x8 + (size_t)m * r->nb, r->nb));
    }
    return 0;
}

static float row_dot_q4_k(const uint8_t* w, const BlockX8* x, int nb) {
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        const BlockQ4K* wb = (const BlockQ4K*)w + b / 8;
        const int j = b % 8;
        float d, m;
        q4k_sub(wb->scales, wb->d, wb->dmin, j, &d, &m);
        acc = act8_step(acc, d, m, x + b, nibbles_isum8(wb->qs + 32 * (j / 2), j & 1, x[b].qs));
    }
    return acc;
}

int exo_generic_dot8_q4_k(const Run* r) {
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1; m++) run_store(r, m, n, row_dot_q4_k(wr, r->x8 + (size_t)m * r->nb, r->nb));
    }
    return 0;
}

static float row_dot_q6_k(const uint8_t* w, const BlockX8* x, int nb) {
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        const BlockQ6K* wb = (const BlockQ6K*)w + b / 8;
        const int g = b % 8;
        for (int h = 0; h < 2; h++) {
            int32_t isum = 0;
            for (int l = 16 * h; l < 16 * h + 16; l++) isum += q6k_value(wb, g, l) * x[b].qs[l];
            acc = act8_step0(acc, exo_h2f(wb->d) * (float)wb->scales[2 * g + h], x + b, isum);
        }
    }
    return acc;
}

int exo_generic_dot8_q6_k(const Run* r) {
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1; m++) run_store(r, m, n, row_dot_q6_k(wr, r->x8 + (size_t)m * r->nb, r->nb));
    }
    return 0;
}

int exo_generic_dot8_q4_0(const Run* r) { return run_dot8(r, 0); }
int exo_generic_dot8_q4_1(const Run* r) { return run_dot8(r, 1); }
