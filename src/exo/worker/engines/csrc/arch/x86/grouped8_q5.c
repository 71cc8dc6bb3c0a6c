/* issue 22 q5dots: the grouped strategy at 8-bit activations for Q5_0's repacked groups
 * (KIND_Q5_0_G8; issue 22 q5g: and Q5_1's, KIND_Q5_1_G8, the same with m; exo_kernels.h) on x86: 1 to Q5G_MAX_R activation rows a pass, a vector lane per
 * weight row, in act8_q5.h's order (bit for bit the per-row dots' floats).
 *
 * Two of a block's nibble vectors (i = 2k, 2k + 1), vpermq + vpshufb, give lane c row c's nibble
 * bytes 4k .. 4k + 3 (values 4k .. 4k + 3 low, 16 + 4k .. 19 + 4k high, as arch/x86/grouped8.c's
 * Q4 groups). Their fifth bits are bits 2c, 2c + 1 (and 16 + 2c, 17 + 2c) of words 2k and 2k + 1:
 * shifted right by 2c per lane (vpsrlvd), each moved to bit 4 of its byte. One vpdpbusd (VNNI) or
 * vpmaddubsw (AVX2) per half against a broadcast of the activation's 4 matching bytes; AVX2 keeps
 * two quads' sums in int16 (8 products of at most 31 x 127 a lane: < 2^15) and widens them by
 * vpmaddwd. */
#include "exo_kernels.h"
#if EXO_AVX2
#include <stddef.h>

#include "act8_q5.h"
#include "arch/x86/x86.h"

#if EXO_AVX512VNNI
#define Q5G_MAX_R 8
#else
#define Q5G_MAX_R 4
#endif

#define Q5G_KEEP(v) __asm__("" : "+x"(v))

/* bits 0 and 1 of lo16 and of hi16 (each lane's) at bit 4 of bytes 0, 1 and 2, 3 */
static inline __attribute__((always_inline)) __m256i q5g_fifth(__m256i lo16, __m256i hi16) {
    const __m256i t = _mm256_or_si256(_mm256_and_si256(lo16, _mm256_set1_epi32(3)),
                                      _mm256_slli_epi32(_mm256_and_si256(hi16, _mm256_set1_epi32(3)), 16));
    return _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(t, _mm256_set1_epi32(0x00010001)), 4),
                           _mm256_slli_epi32(_mm256_and_si256(t, _mm256_set1_epi32(0x00020002)), 11));
}

/* out[r] lane c = row c of the Q5_0 group (issue 22 q5g: Q5_1's if has_m) at `grp` dotted with
 * activation row r (x + r nb). */
static inline __attribute__((always_inline)) void q5g_rows(const uint8_t* grp, int nb, const BlockX8* x, int R,
                                                           int has_m, __m256* out) {
    const size_t bytes = has_m ? sizeof(BlockQ5_1x8) : sizeof(BlockQ5_0x8);
    const size_t qs_at = has_m ? offsetof(BlockQ5_1x8, qs) : offsetof(BlockQ5_0x8, qs);
    const size_t qh_at = has_m ? offsetof(BlockQ5_1x8, qh) : offsetof(BlockQ5_0x8, qh);
    const __m256i low = _mm256_set1_epi8(15), lanes2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    __m256 acc[8]; /* R <= 8 (a constant in each copy) */
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)b * bytes;
        x86_ahead(blk, bytes);
        const uint8_t* qs = blk + qs_at;
        const uint8_t* words = blk + qh_at; /* 8 words of 4 bytes */
        __m256i s[8];
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
        for (int k = 0; k < 4; k += 2) { /* quads k, k + 1 */
            __m256i lo[2], hi[2];
            for (int i = 0; i < 2; i++) {
                int32_t w0, w1;
                memcpy(&w0, words + 8 * (k + i), sizeof w0);
                memcpy(&w1, words + 8 * (k + i) + 4, sizeof w1);
                const __m256i a = _mm256_srlv_epi32(_mm256_set1_epi32(w0), lanes2);
                const __m256i c = _mm256_srlv_epi32(_mm256_set1_epi32(w1), lanes2);
                const __m256i q = x86_row_quad(qs, k + i);
                lo[i] = _mm256_or_si256(_mm256_and_si256(q, low), q5g_fifth(a, c));
                hi[i] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low),
                                        q5g_fifth(_mm256_srli_epi32(a, 16), _mm256_srli_epi32(c, 16)));
            }
            for (int r = 0; r < R; r++) {
                const int8_t* xq = x[(size_t)r * nb + b].qs + 4 * k;
#if EXO_AVX512VNNI || EXO_AVXVNNI
                __m256i t = s[r];
                t = X86_VNNI_DPBUSD(t, lo[0], x86_bcast4(xq));
                t = X86_VNNI_DPBUSD(t, hi[0], x86_bcast4(xq + 16));
                t = X86_VNNI_DPBUSD(t, lo[1], x86_bcast4(xq + 4));
                t = X86_VNNI_DPBUSD(t, hi[1], x86_bcast4(xq + 20));
                s[r] = t;
#else
                const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[0], x86_bcast4(xq)),
                                                    _mm256_maddubs_epi16(hi[0], x86_bcast4(xq + 16)));
                const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[1], x86_bcast4(xq + 4)),
                                                    _mm256_maddubs_epi16(hi[1], x86_bcast4(xq + 20)));
                s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(_mm256_add_epi16(p0, p1), _mm256_set1_epi16(1)));
#endif
                Q5G_KEEP(s[r]);
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
        const __m256 m = has_m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ5_1x8, m))))
                               : _mm256_mul_ps(_mm256_set1_ps(-16.0f), d);
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
            const __m256 t = _mm256_mul_ps(d, _mm256_set1_ps(xb->d));
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(t, _mm256_cvtepi32_ps(s[r])));
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(m, _mm256_set1_ps(xb->s)));
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* one copy per R and layout (not inlined into the caller's loop) */
#define Q5G_COPY(R)                                                                               \
    static __attribute__((noinline)) void q5g_##R(const uint8_t* grp, int nb, const BlockX8* x,  \
                                                  __m256* out) {                                 \
        q5g_rows(grp, nb, x, R, 0, out);                                                         \
    }                                                                                            \
    static __attribute__((noinline)) void q51g_##R(const uint8_t* grp, int nb, const BlockX8* x, \
                                                   __m256* out) {                                \
        q5g_rows(grp, nb, x, R, 1, out);                                                         \
    }
Q5G_COPY(1)
Q5G_COPY(2)
Q5G_COPY(3)
Q5G_COPY(4)
Q5G_COPY(5)
Q5G_COPY(6)
Q5G_COPY(7)
Q5G_COPY(8)

typedef void (*Q5GRows)(const uint8_t* grp, int nb, const BlockX8* x, __m256* out);

static int q5g_run(const Run* r, const Q5GRows* k) {
    __m256 acc[8];
    float o[8 * 8];
    for (int n = r->lo; n < r->hi; n += 8) {
        const uint8_t* grp = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= Q5G_MAX_R ? Q5G_MAX_R : r->m1 - m;
            k[R - 1](grp, r->nb, r->x8 + (size_t)m * r->nb, acc);
            for (int i = 0; i < R; i++) _mm256_storeu_ps(o + 8 * i, acc[i]);
            for (int i = 0; i < R; i++)
                for (int c = 0; c < 8; c++) run_store(r, m + i, n + c, o[8 * i + c]);
            m += R;
        }
    }
    return 0;
}
int exo_x86_grouped8_q5_0(const Run* r) {
    static const Q5GRows k[] = {q5g_1, q5g_2, q5g_3, q5g_4, q5g_5, q5g_6, q5g_7, q5g_8};
    return q5g_run(r, k);
}
/* issue 22 q5g: Q5_1's groups */
int exo_x86_grouped8_q5_1(const Run* r) {
    static const Q5GRows k[] = {q51g_1, q51g_2, q51g_3, q51g_4, q51g_5, q51g_6, q51g_7, q51g_8};
    return q5g_run(r, k);
}
#endif
