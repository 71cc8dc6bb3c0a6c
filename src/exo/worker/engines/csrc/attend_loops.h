/* attention.c's inner loops over a run of cached keys or values, for one element type of the
 * cache: included once per type with KV_SUF (the functions' suffix: f32 or f16), KV_T (float, or
 * uint16_t: an f16's bits), KV_FLOAT(x) (one element as a float) and, for AVX2, KV_LOAD8(p) (8
 * consecutive elements as a __m256) defined; all are undefined at the end. The f16 loops widen
 * each element to f32 as it is loaded and do the f32 loops' arithmetic in the same order. */
#define KV_CAT2(a, b) a##_##b
#define KV_CAT(a, b) KV_CAT2(a, b)
#define KV_FN(name) KV_CAT(name, KV_SUF)

static inline float KV_FN(dot)(const float* a, const KV_T* b, int n) {
    int i = 0;
    float s = 0.0f;
#if EXO_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), KV_LOAD8(b + i), acc);
    s = exo_hsum8(acc);
#else
    float acc[8] = {0};
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * KV_FLOAT(b[i + l]);
    for (int l = 0; l < 8; l++) s += acc[l];
#endif
    for (; i < n; i++) s += a[i] * KV_FLOAT(b[i]);
    return s;
}

/* s[t] = scale * q . k_t for t < L (k rows of hd elements). */
static void KV_FN(scores)(const float* q, const KV_T* k, int L, int hd, float scale, float* s) {
    int t = 0;
#if EXO_AVX2
    if (hd % 8 == 0) { /* four rows at a time, one reduction */
        for (; t + 4 <= L; t += 4) {
            const KV_T* k0 = k + (size_t)t * hd;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int i = 0; i < hd; i += 8) {
                const __m256 qv = _mm256_loadu_ps(q + i);
                a0 = _mm256_fmadd_ps(qv, KV_LOAD8(k0 + i), a0);
                a1 = _mm256_fmadd_ps(qv, KV_LOAD8(k0 + hd + i), a1);
                a2 = _mm256_fmadd_ps(qv, KV_LOAD8(k0 + 2 * hd + i), a2);
                a3 = _mm256_fmadd_ps(qv, KV_LOAD8(k0 + 3 * hd + i), a3);
            }
            const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
            const __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            _mm_storeu_ps(s + t, _mm_mul_ps(r, _mm_set1_ps(scale)));
        }
    }
#endif
    for (; t < L; t++) s[t] = scale * KV_FN(dot)(q, k + (size_t)t * hd, hd);
}

/* o += sum_t p[t] v_t (v rows of hd elements). */
static void KV_FN(weighted_sum)(const float* p, const KV_T* v, int L, int hd, float* o) {
#if EXO_AVX2
    if (hd % 64 == 0) { /* 64 dimensions at a time in registers */
        for (int i0 = 0; i0 < hd; i0 += 64) {
            __m256 acc[8];
            for (int j = 0; j < 8; j++) acc[j] = _mm256_loadu_ps(o + i0 + 8 * j);
            for (int t = 0; t < L; t++) {
                const __m256 pt = _mm256_set1_ps(p[t]);
                const KV_T* vt = v + (size_t)t * hd + i0;
                for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(pt, KV_LOAD8(vt + 8 * j), acc[j]);
            }
            for (int j = 0; j < 8; j++) _mm256_storeu_ps(o + i0 + 8 * j, acc[j]);
        }
        return;
    }
#endif
    for (int t = 0; t < L; t++) {
        const KV_T* vt = v + (size_t)t * hd;
        for (int i = 0; i < hd; i++) o[i] += p[t] * KV_FLOAT(vt[i]);
    }
}

#undef KV_FN
#undef KV_CAT
#undef KV_CAT2
#undef KV_SUF
#undef KV_T
#undef KV_FLOAT
#undef KV_LOAD8
