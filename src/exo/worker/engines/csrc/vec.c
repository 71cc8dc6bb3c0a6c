/* Row operations shared by the kernels: half floats, the linear prologues, activation
 * quantisation and e^x. Each has an AVX2 body and a plain C one (see exo_kernels.h). */
#include <math.h>
#include <string.h>

#include "exo_kernels.h"

const char* exo_isa(void) {
    return EXO_AVX512VNNI ? "avx512vnni" : EXO_AVXVNNI ? "avxvnni" : EXO_AVX2 ? "avx2"
           : EXO_NEON_DOTPROD ? "neon-dotprod" /* arm */
           : EXO_NEON         ? "neon"
                              : "portable";
}

void exo_prologue_row(int kind, const float* src, const float* g, float eps, int K, float* dst) {
    if (kind == PROLOGUE_RMS_NORM) {
#if EXO_AVX2
        __m256 ss = _mm256_setzero_ps();
        for (int k = 0; k < K; k += 8) {
            __m256 v = _mm256_loadu_ps(src + k);
            ss = _mm256_fmadd_ps(v, v, ss);
        }
        const float sum = exo_hsum8(ss);
#else
        float acc[8] = {0};
        for (int k = 0; k < K; k += 8)
            for (int i = 0; i < 8; i++) acc[i] += src[k + i] * src[k + i];
        float sum = 0.0f;
        for (int i = 0; i < 8; i++) sum += acc[i];
#endif
        const float scale = 1.0f / sqrtf(sum / (float)K + eps);
        for (int k = 0; k < K; k++) dst[k] = src[k] * scale * g[k];
    } else if (kind == PROLOGUE_SWIGLU || kind == PROLOGUE_GEGLU) {
        /* silu(a) = a / (1 + e^-a); gelu_tanh(a) = a / (1 + e^-2u), u = sqrt(2/pi) (a + 0.044715 a^3) */
        const int gelu = kind == PROLOGUE_GEGLU;
        const float c1 = 1.5957691216f, c3 = 1.5957691216f * 0.044715f; /* 2 sqrt(2/pi), its a^3 term */
#if EXO_AVX2
        const __m256 one = _mm256_set1_ps(1.0f), v1 = _mm256_set1_ps(c1), v3 = _mm256_set1_ps(c3);
        for (int k = 0; k < K; k += 8) {
            __m256 a = _mm256_loadu_ps(src + k), b = _mm256_loadu_ps(src + K + k);
            __m256 t = a;
            if (gelu) t = _mm256_mul_ps(a, _mm256_fmadd_ps(_mm256_mul_ps(a, a), v3, v1));
            __m256 e = exo_exp8(_mm256_sub_ps(_mm256_setzero_ps(), t));
            _mm256_storeu_ps(dst + k, _mm256_mul_ps(_mm256_div_ps(a, _mm256_add_ps(one, e)), b));
        }
#else
        for (int k = 0; k < K; k++) {
            const float a = src[k], t = gelu ? a * (c1 + c3 * a * a) : a;
            dst[k] = a / (1.0f + exo_expf(-t)) * src[K + k];
        }
#endif
    } else {
        memcpy(dst, src, (size_t)K * sizeof(float));
    }
}

void exo_quantize_row(const float* x, int K, BlockX* out) {
    for (int b = 0; b < K / QK; b++) {
        const float* xb = x + (size_t)b * QK;
        float mx = 0.0f;
        for (int j = 0; j < QK; j++) mx = fabsf(xb[j]) > mx ? fabsf(xb[j]) : mx;
        const float inv = mx > 0.0f ? 32767.0f / mx : 0.0f;
#if EXO_AVX2
        const __m256 vinv = _mm256_set1_ps(inv);
        __m256i i[4];
        for (int j = 0; j < 4; j++)
            i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * j), vinv),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        /* packs works within 128-bit lanes: put the 64-bit quarters back in order */
        _mm256_storeu_si256((__m256i*)out[b].qs, _mm256_permute4x64_epi64(_mm256_packs_epi32(i[0], i[1]), 0xD8));
        _mm256_storeu_si256((__m256i*)(out[b].qs + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(i[2], i[3]), 0xD8));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_hadd_epi32(s4, s4);
        s4 = _mm_hadd_epi32(s4, s4);
        const int qsum = _mm_cvtsi128_si32(s4);
#else
        int qsum = 0;
        for (int j = 0; j < QK; j++) {
            const int q = (int)nearbyintf(xb[j] * inv);
            out[b].qs[j] = (int16_t)q;
            qsum += q;
        }
#endif
        out[b].d = mx / 32767.0f;
        out[b].s = out[b].d * (float)qsum;
    }
}
