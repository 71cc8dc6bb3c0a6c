/* Prefill: a weight row of a 32-value layout (q4, q8, Q5_0, Q5_1) unpacked once into int16
 * values and per-block floats (w = d q + m), then dotted with many activation rows, so the
 * unpacking (a third of a Q5_0 block's work) is not repeated for every group of rows (a
 * strategy of kinds.h). */
#include "exo_kernels.h"
#if EXO_AVX2
#include "arch/x86/x86.h"
#include "kinds.h"

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
    const __m256i low = _mm256_set1_epi16(0x0F), sixteen = _mm256_set1_epi16(16);
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                          4096, 8192, 16384, (short)0x8000);
    for (int b = 0; b < nb; b++) {
        int16_t* q = u.q + (size_t)b * QK;
        __m256i q0, q1;
        if (kind == KIND_Q8_0) {
            const BlockQ8_0* w = (const BlockQ8_0*)row + b;
            q0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w->qs));
            q1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w->qs + 16)));
            u.d[b] = exo_h2f(w->d);
            u.m[b] = 0.0f;
        } else if (kind == KIND_Q4_1) {
            const BlockQ4_1* w = (const BlockQ4_1*)row + b;
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
            /* Q5_0: q - 16 as signed values (no offset term), as dot.c does */
            q0 = has_m ? _mm256_or_si256(n0, _mm256_and_si256(h0, sixteen))
                       : _mm256_add_epi16(n0, _mm256_andnot_si256(h0, _mm256_set1_epi16(-16)));
            q1 = has_m ? _mm256_or_si256(n1, _mm256_and_si256(h1, sixteen))
                       : _mm256_add_epi16(n1, _mm256_andnot_si256(h1, _mm256_set1_epi16(-16)));
            u.d[b] = exo_h2f(d16);
            u.m[b] = has_m ? exo_h2f(m16) : 0.0f;
        }
        _mm256_storeu_si256((__m256i*)q, q0);
        _mm256_storeu_si256((__m256i*)(q + 16), q1);
    }
}

/* out[r] = sum_b d_b d_x sum_j q_j q_xj + m_b s_x, for R = 4 activation rows (x + r * nb). */
static inline void dot_unpacked_4(UnpackedRow u, const BlockX* x, int nb, float* out) {
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
}

/* The unpacked strategy (kinds.h): 4 activation rows at a time; the rest by r->dot. */
int exo_x86_unpacked(const Run* r) {
    const int nb = r->nb;
    const size_t bytes = (size_t)nb * QK * sizeof(int16_t) + 2 * (size_t)nb * sizeof(float);
    char* buf = exo_scratch(SCRATCH_UNPACK, bytes);
    if (buf == NULL) return -1;
    const UnpackedRow u = {(int16_t*)buf, (float*)(buf + (size_t)nb * QK * sizeof(int16_t)),
                           (float*)(buf + (size_t)nb * QK * sizeof(int16_t)) + nb};
    float out[4];
    for (int n = r->lo; n < r->hi; n++) {
        unpack_row(r->kind, run_row(r, n), nb, u);
        int m = r->m0;
        for (; r->m1 - m >= 4; m += 4) {
            dot_unpacked_4(u, r->x + (size_t)m * nb, nb, out);
            for (int i = 0; i < 4; i++) run_store(r, m + i, n, out[i]);
        }
        if (m < r->m1) {
            Run rest = *r;
            rest.lo = n, rest.hi = n + 1, rest.m0 = m;
            r->dot(&rest);
        }
    }
    return 0;
}
#endif
