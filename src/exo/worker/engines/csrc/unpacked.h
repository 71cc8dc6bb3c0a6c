/* Prefill: a weight row of a 32-value layout (q4, q8, Q5_0, Q5_1) unpacked once into int16
 * values and per-block floats (w = d q + m), then dotted with many activation rows, so the
 * unpacking (a third of a Q5_0 block's work) is not repeated for every group of rows;
 * included by linear.c. */
#include "exo_kernels.h"

typedef struct {
    int16_t* q; /* [nb * 32] */
    float* d;   /* [nb] */
    float* m;   /* [nb]: the offset per value (0 for q8, -16 d for Q5_0) */
} UnpackedRow;

/* Block b of a Q5_0 (has_m 0) or Q5_1 row: its f16 d and m (m only in Q5_1) and fifth bits qh;
 * returns its 16 bytes of nibbles. */
static inline const uint8_t* q5_block(const void* row, int b, int has_m, uint16_t* d16, uint16_t* m16,
                                      uint32_t* qh) {
    const uint8_t* blk = (const uint8_t*)row + (size_t)b * (has_m ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0));
    memcpy(d16, blk, 2);
    memcpy(m16, blk + 2, 2);
    memcpy(qh, blk + (has_m ? 4 : 2), 4);
    return blk + (has_m ? 8 : 6);
}

static inline void unpack_row(int kind, const void* row, int nb, UnpackedRow u) {
#if EXO_AVX2
    const __m256i low = _mm256_set1_epi16(0x0F), sixteen = _mm256_set1_epi16(16);
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                          4096, 8192, 16384, (short)0x8000);
#endif
    for (int b = 0; b < nb; b++) {
        int16_t* q = u.q + (size_t)b * QK;
#if EXO_AVX2
        __m256i q0, q1;
        if (kind == KIND_Q8) {
            const BlockQ8* w = (const BlockQ8*)row + b;
            q0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w->qs));
            q1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w->qs + 16)));
            u.d[b] = exo_h2f(w->d);
            u.m[b] = 0.0f;
        } else if (kind == KIND_Q4) {
            const BlockQ4* w = (const BlockQ4*)row + b;
            const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)w->qs));
            q0 = _mm256_and_si256(bytes, low);
            q1 = _mm256_srli_epi16(bytes, 4);
            u.d[b] = exo_h2f(w->d);
            u.m[b] = exo_h2f(w->m);
        } else {
            const int has_m = kind == KIND_Q5_1;
            uint16_t d16, m16;
            uint32_t qh;
            const uint8_t* qs = q5_block(row, b, has_m, &d16, &m16, &qh);
            const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)qs));
            const __m256i h0 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(qh & 0xFFFF)), bit), bit);
            const __m256i h1 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(qh >> 16)), bit), bit);
            const __m256i n0 = _mm256_and_si256(bytes, low), n1 = _mm256_srli_epi16(bytes, 4);
            /* Q5_0: q - 16 as signed values (no offset term), as dot_q.h does */
            q0 = has_m ? _mm256_or_si256(n0, _mm256_and_si256(h0, sixteen))
                       : _mm256_add_epi16(n0, _mm256_andnot_si256(h0, _mm256_set1_epi16(-16)));
            q1 = has_m ? _mm256_or_si256(n1, _mm256_and_si256(h1, sixteen))
                       : _mm256_add_epi16(n1, _mm256_andnot_si256(h1, _mm256_set1_epi16(-16)));
            u.d[b] = exo_h2f(d16);
            u.m[b] = has_m ? exo_h2f(m16) : 0.0f;
        }
        _mm256_storeu_si256((__m256i*)q, q0);
        _mm256_storeu_si256((__m256i*)(q + 16), q1);
#else
        if (kind == KIND_Q8) {
            const BlockQ8* w = (const BlockQ8*)row + b;
            for (int j = 0; j < QK; j++) q[j] = w->qs[j];
            u.d[b] = exo_h2f(w->d);
            u.m[b] = 0.0f;
        } else if (kind == KIND_Q4) {
            const BlockQ4* w = (const BlockQ4*)row + b;
            for (int j = 0; j < 16; j++) {
                q[j] = (int16_t)(w->qs[j] & 15);
                q[j + 16] = (int16_t)(w->qs[j] >> 4);
            }
            u.d[b] = exo_h2f(w->d);
            u.m[b] = exo_h2f(w->m);
        } else { /* Q5_0, Q5_1 */
            const int has_m = kind == KIND_Q5_1;
            uint16_t d16, m16;
            uint32_t qh;
            const uint8_t* qs = q5_block(row, b, has_m, &d16, &m16, &qh);
            for (int j = 0; j < 16; j++) {
                q[j] = (int16_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));
                q[j + 16] = (int16_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
            }
            u.d[b] = exo_h2f(d16);
            u.m[b] = has_m ? exo_h2f(m16) : -16.0f * u.d[b];
        }
#endif
    }
}

/* out[r] = sum_b d_b d_x sum_j q_j q_xj + m_b s_x, for R = 4 activation rows (x + r * nb). */
static inline void dot_unpacked_4(UnpackedRow u, const BlockX* x, int nb, float* out) {
#if EXO_AVX2
    __m256 acc[4];
    float accm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const __m256i q0 = _mm256_loadu_si256((const __m256i*)(u.q + (size_t)b * QK));
        const __m256i q1 = _mm256_loadu_si256((const __m256i*)(u.q + (size_t)b * QK + 16));
        for (int r = 0; r < 4; r++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            const __m256i p = madd32(q0, q1, xb->qs);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(u.d[b] * xb->d), _mm256_cvtepi32_ps(p), acc[r]);
            accm[r] += u.m[b] * xb->s;
        }
    }
    for (int r = 0; r < 4; r++) out[r] = exo_hsum8(acc[r]) + accm[r];
#else
    for (int r = 0; r < 4; r++) {
        float acc = 0.0f;
        for (int b = 0; b < nb; b++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            const int16_t* q = u.q + (size_t)b * QK;
            int32_t isum = 0;
            for (int j = 0; j < QK; j++) isum += (int32_t)q[j] * xb->qs[j];
            acc += u.d[b] * xb->d * (float)isum + u.m[b] * xb->s;
        }
        out[r] = acc;
    }
#endif
}
