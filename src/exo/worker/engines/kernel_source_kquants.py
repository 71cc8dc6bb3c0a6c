"""C source of the K-quant dot products (Q4_K, Q5_K, Q6_K) used by exo_qlinear; compiled with the
rest by `cpu_kernels.py`.
"""

KQUANT_SOURCE = r"""
/* ---- K-quants (llama.cpp's super-blocks of 256 values), one activation row at a time ------ */

typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } BlockQ4K; /* 144 B */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } BlockQ6K; /* 210 B */

/* Q4_K: sub-block j (32 values) is d * sc_j * q - dmin * m_j, q in 0..15; (sc, m) are 6-bit
 * pairs packed in 12 bytes; 64-value chunk c holds sub-block 2c in the low nibbles of its 32
 * bytes and 2c + 1 in the high ones. */
static inline void q4k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static inline __m256i madd_halves(__m128i lo16, __m128i hi16, const BlockX* xb, int is_signed) {
    const __m256i a = is_signed ? _mm256_cvtepi8_epi16(lo16) : _mm256_cvtepu8_epi16(lo16);
    const __m256i b = is_signed ? _mm256_cvtepi8_epi16(hi16) : _mm256_cvtepu8_epi16(hi16);
    return _mm256_add_epi32(_mm256_madd_epi16(a, _mm256_loadu_si256((const __m256i*)xb->qs)),
                            _mm256_madd_epi16(b, _mm256_loadu_si256((const __m256i*)(xb->qs + 16))));
}

static float dot_q4k(const BlockQ4K* w, const BlockX* x, int nsb) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0.0f;
    for (int s = 0; s < nsb; s++) {
        const float d = h2f(w[s].d), dmin = h2f(w[s].dmin);
        for (int c = 0; c < 4; c++) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i*)(w[s].qs + 32 * c));
            const __m256i q[2] = {_mm256_and_si256(bytes, low),
                                  _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low)};
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h;
                int sc, m;
                q4k_scale_min(w[s].scales, j, &sc, &m);
                const BlockX* xb = x + (size_t)s * 8 + j;
                const __m256i p = madd_halves(_mm256_castsi256_si128(q[h]),
                                              _mm256_extracti128_si256(q[h], 1), xb, 0);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc * xb->d), _mm256_cvtepi32_ps(p), acc);
                accm -= dmin * (float)m * xb->s;
            }
        }
    }
    return hsum8(acc) + accm;
}

/* Q5_K: Q4_K with a fifth bit: value j of sub-block 2c + h gets 16 * bit (2c + h) of qh[l]. */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } BlockQ5K;

static float dot_q5k(const BlockQ5K* w, const BlockX* x, int nsb) {
    const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0.0f;
    for (int s = 0; s < nsb; s++) {
        const float d = h2f(w[s].d), dmin = h2f(w[s].dmin);
        const __m256i qh = _mm256_loadu_si256((const __m256i*)w[s].qh);
        for (int c = 0; c < 4; c++) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i*)(w[s].qs + 32 * c));
            const __m256i nib[2] = {_mm256_and_si256(bytes, low),
                                    _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low)};
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h;
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, j), one);
                const __m256i q = _mm256_or_si256(nib[h], _mm256_slli_epi16(hb, 4));
                int sc, m;
                q4k_scale_min(w[s].scales, j, &sc, &m);
                const BlockX* xb = x + (size_t)s * 8 + j;
                const __m256i p = madd_halves(_mm256_castsi256_si128(q),
                                              _mm256_extracti128_si256(q, 1), xb, 0);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc * xb->d), _mm256_cvtepi32_ps(p), acc);
                accm -= dmin * (float)m * xb->s;
            }
        }
    }
    return hsum8(acc) + accm;
}

/* Q6_K: sub-block j (16 values) is d * sc_j * (q - 32), q in 0..63: low 4 bits in ql, high 2
 * in qh. 32-value group g = 4n + k (half n, quarter k): low bits from ql[64n + 32(k & 1) + l]
 * (low nibble for k < 2, high for k >= 2), high bits from qh[32n + l] >> 2k. */
static float dot_q6k(const BlockQ6K* w, const BlockX* x, int nsb) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
    const __m256i off = _mm256_set1_epi8(32);
    __m256 acc = _mm256_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const float d = h2f(w[s].d);
        for (int g = 0; g < 8; g++) {
            const int n = g / 4, k = g % 4;
            const __m256i ql = _mm256_loadu_si256((const __m256i*)(w[s].ql + 64 * n + 32 * (k & 1)));
            const __m256i qh = _mm256_loadu_si256((const __m256i*)(w[s].qh + 32 * n));
            const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2);
            const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), off);
            const BlockX* xb = x + (size_t)s * 8 + g;
            const __m256i a = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
            const __m256i b = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
            const __m256i p0 = _mm256_madd_epi16(a, _mm256_loadu_si256((const __m256i*)xb->qs));
            const __m256i p1 = _mm256_madd_epi16(b, _mm256_loadu_si256((const __m256i*)(xb->qs + 16)));
            const float dd = d * xb->d;
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dd * w[s].scales[2 * g]), _mm256_cvtepi32_ps(p0), acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dd * w[s].scales[2 * g + 1]), _mm256_cvtepi32_ps(p1), acc);
        }
    }
    return hsum8(acc);
}
"""
