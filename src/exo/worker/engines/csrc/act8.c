/* 8-bit activations: the per-row quantiser, the setting, and the generic dots of the kinds that
 * have 8-bit dots (the float order: act8.h). */
#include <math.h>

#include "act8.h"

/* the library's own setting until set: cpu_kernels.py sets EXO_ACTIVATIONS's (default 8) at load;
 * the harness's linear checks (16-bit bounds) run on this one */
static int activation_bits = 16;

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
#if EXO_AVX2
        /* the largest |x| as fmaxf's loop finds it: vmaxps returns its second operand (the running
         * maximum) when the first is a NaN, so NaNs are passed over as fmaxf passes them */
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 vmax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) vmax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * j)), vmax);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
#else
        float amax = 0.0f;
        for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(xb[i]));
#endif
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
#if EXO_AVX2 /* roundf's result (halves away from zero) by truncation: |v| - trunc |v| is exact */
        const __m256 vid = _mm256_set1_ps(id), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
        __m256i i[4];
        for (int j = 0; j < 4; j++) {
            const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xb + 8 * j), vid), a = _mm256_andnot_ps(sign, v);
            const __m256 t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m256 r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(a, t), half, _CMP_GE_OQ), one));
            i[j] = _mm256_cvtps_epi32(_mm256_or_ps(r, _mm256_and_ps(sign, v)));
        }
        const __m256i sum8 = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        /* packs work within 128-bit lanes: the dwords back in order */
        const __m256i p16 = _mm256_packs_epi32(i[0], i[1]), p16b = _mm256_packs_epi32(i[2], i[3]);
        const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, p16b),
                                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i*)out[b].qs, p8);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum8), _mm256_extracti128_si256(sum8, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        const int sum = _mm_cvtsi128_si32(s4);
#else
        int sum = 0;
        for (int i = 0; i < QK; i++) {
            const int q = (int)roundf(xb[i] * id);
            out[b].qs[i] = (int8_t)q;
            sum += q;
        }
#endif
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
