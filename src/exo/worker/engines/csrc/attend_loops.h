/* attention.c's inner loops over a run of cached keys or values, for one element type of the
 * cache: included once per type with KV_SUF (the functions' suffix: f32 or f16), KV_T (float, or
 * uint16_t: an f16's bits), KV_FLOAT(x) (one element as a float) and, for AVX2, KV_LOAD8(p) (8
 * consecutive elements as a __m256) defined; all are undefined at the end.
 *
 * Each loop serves the n query heads of one kv head at once (q, scores, outputs: a row of hd or
 * of `ls` floats per head), so that a key or value is loaded, and widened from f16, once for up
 * to ATT_HB heads instead of once per head (Zen 3 widens one vector of 8 a cycle: 16 of the ~24
 * cycles a 64-dimensional key and value took for each query head went to widening). A head's
 * arithmetic is the same however many heads share the loop and whichever are its neighbours,
 * in the order the loops had head by head: the split of a group's heads among threads never
 * changes a bit. The f16 loops widen each element exactly and do the f32 loops' arithmetic. */
#define KV_CAT2(a, b) a##_##b
#define KV_CAT(a, b) KV_CAT2(a, b)
#define KV_FN(name) KV_CAT(name, KV_SUF)

#if EXO_AVX2
/* Two keys (rows k, k + hd) against HB query heads: s[g ls], s[g ls + 1] = scale * q_g . k.
 * Each sum: 8 lanes over i, then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)); hd % 8 == 0. */
static inline __attribute__((always_inline)) void KV_FN(scores_pair)(const float* q, const int HB,
                                                                   const KV_T* k, int hd,
                                                                   __m128 scale, float* s,
                                                                   size_t ls) {
    __m256 acc[ATT_HB][2];
    for (int g = 0; g < HB; g++) acc[g][0] = acc[g][1] = _mm256_setzero_ps();
    for (int i = 0; i < hd; i += 8) {
        const __m256 k0 = KV_LOAD8(k + i), k1 = KV_LOAD8(k + hd + i);
        for (int g = 0; g < HB; g++) {
            const __m256 qv = _mm256_loadu_ps(q + (size_t)g * hd + i);
            acc[g][0] = _mm256_fmadd_ps(qv, k0, acc[g][0]);
            acc[g][1] = _mm256_fmadd_ps(qv, k1, acc[g][1]);
        }
    }
    for (int g = 0; g < HB; g += 2) { /* heads g, g + 1: [g k0, g k1, g+1 k0, g+1 k1] */
        const int g1 = g + 1 < HB ? g + 1 : g;
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[g][0], acc[g][1]),
                                        _mm256_hadd_ps(acc[g1][0], acc[g1][1]));
        const __m128 r =
            _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)), scale);
        _mm_storel_pi((__m64*)(void*)(s + (size_t)g * ls), r);
        if (g + 1 < HB) _mm_storeh_pi((__m64*)(void*)(s + (size_t)g1 * ls), r);
    }
}

/* One key against HB query heads: s[g ls] = scale * q_g . k, each sum reduced by exo_hsum8. */
static inline __attribute__((always_inline)) void KV_FN(scores_one)(const float* q, const int HB,
                                                                  const KV_T* k, int hd,
                                                                  float scale, float* s,
                                                                  size_t ls) {
    __m256 acc[ATT_HB];
    for (int g = 0; g < HB; g++) acc[g] = _mm256_setzero_ps();
    for (int i = 0; i < hd; i += 8) {
        const __m256 kv = KV_LOAD8(k + i);
        for (int g = 0; g < HB; g++)
            acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)g * hd + i), kv, acc[g]);
    }
    for (int g = 0; g < HB; g++) s[(size_t)g * ls] = scale * exo_hsum8(acc[g]);
}

/* Keys 0 .. L - 1 against HB heads: pairs up to L rounded down to a multiple of 4, then one key
 * at a time (the split of the four-key blocks these loops replaced: the same sums). */
static inline __attribute__((always_inline)) void KV_FN(scores_heads)(const float* q, const int HB,
                                                                    const KV_T* k, int L, int hd,
                                                                    float scale, float* s,
                                                                    size_t ls, Ahead* f) {
    const __m128 vs = _mm_set1_ps(scale);
    const long row = (long)hd * (long)sizeof(KV_T);
    const int body = L - L % 4;
    int t = 0;
    for (; t < body; t += 2) {
        KV_FN(scores_pair)(q, HB, k + (size_t)t * hd, hd, vs, s + t, ls);
        ahead_pace(f, 2 * row);
    }
    for (; t < L; t++) {
        KV_FN(scores_one)(q, HB, k + (size_t)t * hd, hd, scale, s + t, ls);
        ahead_pace(f, row);
    }
}

/* Dimensions [0, 8 D) of HB heads' outputs: o[g hd + i] += sum_t p[g lp + t] v_t[i], t in order. */
static inline __attribute__((always_inline)) void KV_FN(weighted_block)(const float* p, size_t lp,
                                                                      const int HB, const int D,
                                                                      const KV_T* v, int L, int hd,
                                                                      float* o) {
    __m256 acc[ATT_HB][8];
    for (int g = 0; g < HB; g++)
        for (int d = 0; d < D; d++) acc[g][d] = _mm256_loadu_ps(o + (size_t)g * hd + 8 * d);
    for (int t = 0; t < L; t++) {
        const KV_T* vt = v + (size_t)t * hd;
        __m256 vv[8];
        for (int d = 0; d < D; d++) vv[d] = KV_LOAD8(vt + 8 * d);
        for (int g = 0; g < HB; g++) {
            const __m256 pt = _mm256_broadcast_ss(p + (size_t)g * lp + t);
            for (int d = 0; d < D; d++) acc[g][d] = _mm256_fmadd_ps(pt, vv[d], acc[g][d]);
        }
    }
    for (int g = 0; g < HB; g++)
        for (int d = 0; d < D; d++) _mm256_storeu_ps(o + (size_t)g * hd + 8 * d, acc[g][d]);
}

/* All hd dimensions of HB heads, in blocks of 8 D dimensions (HB D accumulators: at most 8, the
 * converted values and a weight fit the other registers), then 8 at a time; hd % 8 == 0. */
static inline __attribute__((always_inline)) void KV_FN(weighted_heads)(const float* p, size_t lp,
                                                                      const int HB, const KV_T* v,
                                                                      int L, int hd, float* o,
                                                                      Ahead* f) {
    const int D = 8 / HB;
    const long block = (long)L * 8 * D * (long)sizeof(KV_T); /* bytes a block of D reads */
    int i = 0;
    for (; i + 8 * D <= hd; i += 8 * D) {
        KV_FN(weighted_block)(p, lp, HB, D, v + i, L, hd, o + i);
        ahead_pace(f, block);
    }
    for (; i < hd; i += 8) {
        KV_FN(weighted_block)(p, lp, HB, 1, v + i, L, hd, o + i);
        ahead_pace(f, block / D);
    }
}
#endif

#if EXO_AVX2
/* q . k over n elements (8 lanes, reduced by exo_hsum8, then the rest in order). */
static inline float KV_FN(dot)(const float* a, const KV_T* b, int n) {
    int i = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), KV_LOAD8(b + i), acc);
    float s = exo_hsum8(acc);
    for (; i < n; i++) s += a[i] * KV_FLOAT(b[i]);
    return s;
}
#endif

/* s[g ls + t] = scale * q_g . k_t for t < L and the n heads g (q_g = q + g hd; k: L rows of hd
 * elements). `wide`: scratch of L hd floats where the loops without AVX2 widen the run once for
 * all heads (NULL for a cache of floats: they read k itself). */
static void KV_FN(scores)(const float* q, int n, const KV_T* k, int L, int hd, float scale,
                          float* s, size_t ls, float* wide, Ahead* f) {
#if EXO_AVX2
    if (hd % 8 == 0) {
        for (int g = 0; g < n; g += ATT_HB) {
            const float* qg = q + (size_t)g * hd;
            float* sg = s + (size_t)g * ls;
            Ahead* fg = g == 0 ? f : NULL; /* (the first block's reads pace the asking) */
            switch (n - g < ATT_HB ? n - g : ATT_HB) { /* constant HB: accumulators in registers */
            case 1: KV_FN(scores_heads)(qg, 1, k, L, hd, scale, sg, ls, fg); break;
            case 2: KV_FN(scores_heads)(qg, 2, k, L, hd, scale, sg, ls, fg); break;
            case 3: KV_FN(scores_heads)(qg, 3, k, L, hd, scale, sg, ls, fg); break;
            default: KV_FN(scores_heads)(qg, 4, k, L, hd, scale, sg, ls, fg); break;
            }
        }
        return;
    }
    ahead_pace(f, (long)L * hd * (long)sizeof(KV_T));
    (void)wide; /* head dimensions not a multiple of 8: key by key, head by head */
    for (int g = 0; g < n; g++)
        for (int t = 0; t < L; t++)
            s[(size_t)g * ls + t] = scale * KV_FN(dot)(q + (size_t)g * hd, k + (size_t)t * hd, hd);
#else
    /* the run widened once, then each head's dots over floats (8 partial sums) */
    ahead_pace(f, (long)L * hd * (long)sizeof(KV_T));
    const float* kf = (const float*)(const void*)k;
    if (wide != NULL) {
        for (size_t i = 0; i < (size_t)L * hd; i++) wide[i] = KV_FLOAT(k[i]);
        kf = wide;
    }
    for (int g = 0; g < n; g++)
        for (int t = 0; t < L; t++) {
            const float* a = q + (size_t)g * hd;
            const float* b = kf + (size_t)t * hd;
            float acc[8] = {0}, d = 0.0f;
            int i = 0;
            for (; i + 8 <= hd; i += 8)
                for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
            for (int l = 0; l < 8; l++) d += acc[l];
            for (; i < hd; i++) d += a[i] * b[i];
            s[(size_t)g * ls + t] = scale * d;
        }
#endif
}

/* o[g hd + i] += sum_t p[g lp + t] v_t[i] for the n heads g (v: L rows of hd elements). `wide`:
 * as scores' (here also with AVX2, for head dimensions not a multiple of 8). */
static void KV_FN(weighted_sum)(const float* p, size_t lp, int n, const KV_T* v, int L, int hd,
                                float* o, float* wide, Ahead* f) {
#if EXO_AVX2
    if (hd % 8 == 0) {
        for (int g = 0; g < n; g += ATT_HB) {
            const float* pg = p + (size_t)g * lp;
            float* og = o + (size_t)g * hd;
            Ahead* fg = g == 0 ? f : NULL;
            switch (n - g < ATT_HB ? n - g : ATT_HB) {
            case 1: KV_FN(weighted_heads)(pg, lp, 1, v, L, hd, og, fg); break;
            case 2: KV_FN(weighted_heads)(pg, lp, 2, v, L, hd, og, fg); break;
            case 3: KV_FN(weighted_heads)(pg, lp, 3, v, L, hd, og, fg); break;
            default: KV_FN(weighted_heads)(pg, lp, 4, v, L, hd, og, fg); break;
            }
        }
        return;
    }
#endif
    /* the run widened once, then each head's sums over floats */
    ahead_pace(f, (long)L * hd * (long)sizeof(KV_T));
    const float* vf = (const float*)(const void*)v;
    if (wide != NULL) {
        for (size_t i = 0; i < (size_t)L * hd; i++) wide[i] = KV_FLOAT(v[i]);
        vf = wide;
    }
    for (int g = 0; g < n; g++)
        for (int t = 0; t < L; t++) {
            const float pt = p[(size_t)g * lp + t];
            const float* vt = vf + (size_t)t * hd;
            float* og = o + (size_t)g * hd;
            for (int i = 0; i < hd; i++) og[i] += pt * vt[i];
        }
}

#undef KV_FN
#undef KV_CAT
#undef KV_CAT2
#undef KV_SUF
#undef KV_T
#undef KV_FLOAT
#undef KV_LOAD8
