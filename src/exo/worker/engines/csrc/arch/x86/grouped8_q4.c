/* Repacked Q4_0 / Q4_1 / Q8_0 groups (KIND_Q4_0_G8, KIND_Q4_1_G8, KIND_Q8_0_G8) against 8-bit
 * activation rows on the AVX-512 VNNI build, in act8.h's order: the same floats as grouped8.c's kernels
 * (which the other x86 builds run) and the per-row dots, with two groups (16 weight rows) a pass.
 *
 * A block of both groups is re-laid by vpermt2w into 8 vectors, int32 lane l holding the pair's
 * row l's 4 values 4s .. 4s + 3 (Q4_0 / Q4_1: nibbles, q4p_rows; Q8_0: bytes as unsigned w + 128,
 * q8p_rows), once per block for all the pass's activation rows; each row then takes 8 vpdpbusd on
 * broadcasts of its 4 matching bytes, its 16 sums in output order, and one float step for the 16
 * weight rows. An odd group left over runs as its own pair (its lanes dropped).
 */
#include "exo_kernels.h"
#if EXO_AVX512VNNI
#include <stddef.h>

#include "act8.h"
#include "arch/x86/grouped8_q4.h"
#include "arch/x86/x86.h"

/* activation rows a pass over a pair of groups */
#define Q4P_MAX_R 8

/* a's 8 floats in lanes 0..7, b's in 8..15 */
static inline __attribute__((always_inline)) __m512 q4p_cat(__m256 a, __m256 b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(a)), _mm256_castps_pd(b), 1));
}

/* The block's d and offset m (Q4_1: its m; Q4_0: -8 d) of the 8 rows of a group. */
static inline __attribute__((always_inline)) void q4p_scales(const uint8_t* blk, int has_m, __m256* d, __m256* m) {
    *d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
    *m = has_m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ4_1x8, m))))
               : _mm256_mul_ps(_mm256_set1_ps(-8.0f), *d);
}

/* Both groups' block 8 blocks ahead in the order the pass reads them, a block's bytes (up to 3
 * lines each): past the groups' last block, the same block of the next pair's groups (16 rows on,
 * `pair` bytes). The two groups are two streams the hardware prefetchers follow less well than one,
 * and those streams run on from a group's end into memory read already (the first group's into
 * the second) while the next pair's second group starts cold: prefetching 8 blocks on in each
 * group, as before, left SmolLM2's decode step of 8 streams at 22-24 ms against 17-19 with this
 * (one thread, Zen 4, alternating in one process). */
static inline __attribute__((always_inline)) void q4p_prefetch(const uint8_t* b0, const uint8_t* b1, size_t bytes, int b,
                                                               int nb, size_t pair) {
    const size_t ahead = b + 8 < nb ? 8 * bytes : 8 * bytes + pair - (size_t)nb * bytes;
    x86_prefetch_at((uintptr_t)b0 + ahead, bytes);
    x86_prefetch_at((uintptr_t)b1 + ahead, bytes);
}

/* Word j of the block's dword vector Q_t (t = 2 u + v, from the pair's 64-byte halves u): int32
 * lane l holds row l of the pair's (group l / 8, row l % 8) nibble bytes 4t .. 4t + 3, words
 * (2t, c) and (2t + 1, c) of its group (qs[i][2c + e]: word 8i + c of a half's 32 words). */
static const uint16_t Q4N_IDX[2][32] = {
    {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 32, 40, 33, 41, 34, 42, 35, 43, 36, 44, 37, 45, 38, 46, 39, 47},
    {16, 24, 17, 25, 18, 26, 19, 27, 20, 28, 21, 29, 22, 30, 23, 31, 48, 56, 49, 57, 50, 58, 51, 59, 52, 60, 53, 61, 54, 62, 55, 63}};

/* acc + the dot of w's 4 unsigned bytes a lane with the 4 activation bytes at x, broadcast by the
 * instruction itself from memory (vpdpbusd's {1to16}: the compiler issues a vpbroadcastd of its
 * own for _mm512_set1_epi32, one more vector instruction a row and step; measured 7-9% of the pass). */
static inline __attribute__((always_inline)) __m512i q4p_dot4(__m512i acc, __m512i w, const int8_t* x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t*)(const void*)x));
    return acc;
}

/* out[r] lane l = row l of the pair (the group at g0: lanes 0..7, at g1: 8..15) dotted with
 * activation row r (x + r nb). A block's nibbles are re-laid once for all the pass's rows into
 * 8 vectors (vector s: every row's values 4s .. 4s + 3, one row an int32 lane), so a row's
 * integer dot is 8 vpdpbusd on 4-byte broadcasts, its 16 sums one a lane: no 8-byte broadcasts
 * and no folding of lane pairs (10 of the 24 vector instructions a row and block took before,
 * on a pass bound by their throughput), 14 now. The rows' vpdpbusd go step by step across the
 * rows (independent chains side by side). The integers are the same (exact) and so is each
 * row's float step: the same floats. Measured (SmolLM2's q | k | v, gate | up and down at one
 * thread, Zen 4, alternating in one process, weights in cache): 8 rows 231 -> 210 us a call of
 * the three, 55 rows 1,570 -> 1,403 (best of 60; the means 9% and 13% less). */
static inline __attribute__((always_inline)) void q4p_rows(const uint8_t* g0, const uint8_t* g1, int nb, size_t pair,
                                                           const BlockX8* x, int R, int has_m, __m512* out) {
    const size_t bytes = has_m ? sizeof(BlockQ4_1x8) : sizeof(BlockQ4_0x8);
    const size_t qs_at = has_m ? offsetof(BlockQ4_1x8, qs) : offsetof(BlockQ4_0x8, qs);
    const __m512i low = _mm512_set1_epi8(15);
    const __m512i idx0 = _mm512_loadu_si512((const void*)Q4N_IDX[0]), idx1 = _mm512_loadu_si512((const void*)Q4N_IDX[1]);
    __m512 acc[Q4P_MAX_R];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *b0 = g0 + (size_t)b * bytes, *b1 = g1 + (size_t)b * bytes;
        q4p_prefetch(b0, b1, bytes, b, nb, pair);
        __m512i w[8]; /* w[s]: values 4s .. 4s + 3 of the 16 rows (s < 4: low nibbles of Q_s, else high of Q_s-4) */
        for (int u = 0; u < 2; u++) {
            const __m512i h0 = _mm512_loadu_si512((const void*)(b0 + qs_at + 64 * u));
            const __m512i h1 = _mm512_loadu_si512((const void*)(b1 + qs_at + 64 * u));
            const __m512i q0 = _mm512_permutex2var_epi16(h0, idx0, h1), q1 = _mm512_permutex2var_epi16(h0, idx1, h1);
            w[2 * u] = _mm512_and_si512(q0, low), w[4 + 2 * u] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), low);
            w[2 * u + 1] = _mm512_and_si512(q1, low), w[5 + 2 * u] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), low);
        }
        __m256 d0, m0, d1, m1;
        q4p_scales(b0, has_m, &d0, &m0);
        q4p_scales(b1, has_m, &d1, &m1);
        const __m512 d = q4p_cat(d0, d1), m = q4p_cat(m0, m1);
        __m512i isum[Q4P_MAX_R];
        for (int r = 0; r < R; r++) isum[r] = _mm512_setzero_si512();
        for (int k = 0; k < 8; k++)
            for (int r = 0; r < R; r++)
                isum[r] = q4p_dot4(isum[r], w[k], x[(size_t)r * nb + b].qs + 4 * k);
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
            const __m512 t = _mm512_mul_ps(d, _mm512_set1_ps(xb->d));
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(t, _mm512_cvtepi32_ps(isum[r])));
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(m, _mm512_set1_ps(xb->s)));
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* Word j of the Q8_0 block vectors of the pair's 64-byte quarter u of both groups (value 2j + e of
 * row c at qs[32 (j % 8) + 16 (j / 8) + 2c + e]: word 16 (j % 8) + 8 (j / 8) + c): int32 lane l
 * holds row l's (group l / 8, row l % 8) values 4s .. 4s + 3 (pairs 2s, 2s + 1), s = u
 * (Q8N_IDX[0]) or u + 4 ([1]). */
static const uint16_t Q8N_IDX[2][32] = {
    {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 32, 48, 33, 49, 34, 50, 35, 51, 36, 52, 37, 53, 38, 54, 39, 55},
    {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31, 40, 56, 41, 57, 42, 58, 43, 59, 44, 60, 45, 61, 46, 62, 47, 63}};

/* out[r] lane l = row l of the Q8_0 pair (as q4p_rows') dotted with activation row r: the
 * unsigned sums (w + 128, vpermt2w and a sign flip once per block for all rows) less 128 times
 * the activation block's sum (xsum: exo_x86_grouped8_q4_pairs computes them once a call, where
 * 4 more vpdpbusd a row and block computed them before; exact integers), then the float step.
 * SmolLM2's head (49,152 x 576) at 55 rows 17.5-20.5 -> 14.4-15.2 ms, at 8 rows (the weights
 * streamed from memory) 2.7-3.2 -> 2.7-2.9 (one thread, Zen 4, processes alternating). */
static inline __attribute__((always_inline)) void q8p_rows(const uint8_t* g0, const uint8_t* g1, int nb, size_t pair,
                                                           const BlockX8* x, const int32_t* xsum, int R, __m512* out) {
    const __m512i sign = _mm512_set1_epi8((char)0x80);
    const __m512i idx0 = _mm512_loadu_si512((const void*)Q8N_IDX[0]), idx1 = _mm512_loadu_si512((const void*)Q8N_IDX[1]);
    __m512 acc[Q4P_MAX_R];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *b0 = g0 + (size_t)b * sizeof(BlockQ8_0x8), *b1 = g1 + (size_t)b * sizeof(BlockQ8_0x8);
        q4p_prefetch(b0, b1, sizeof(BlockQ8_0x8), b, nb, pair);
        __m512i w[8];
        for (int u = 0; u < 4; u++) {
            const size_t at = offsetof(BlockQ8_0x8, qs) + 64 * (size_t)u;
            const __m512i h0 = _mm512_loadu_si512((const void*)(b0 + at)), h1 = _mm512_loadu_si512((const void*)(b1 + at));
            w[u] = _mm512_xor_si512(_mm512_permutex2var_epi16(h0, idx0, h1), sign);
            w[u + 4] = _mm512_xor_si512(_mm512_permutex2var_epi16(h0, idx1, h1), sign);
        }
        const __m512 d = q4p_cat(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b0)),
                                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b1)));
        __m512i isum[Q4P_MAX_R];
        for (int r = 0; r < R; r++) isum[r] = _mm512_setzero_si512();
        for (int k = 0; k < 8; k++)
            for (int r = 0; r < R; r++) isum[r] = q4p_dot4(isum[r], w[k], x[(size_t)r * nb + b].qs + 4 * k);
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
            const __m512i s = _mm512_sub_epi32(isum[r], _mm512_set1_epi32(xsum[(size_t)r * nb + b]));
            const __m512 t = _mm512_mul_ps(d, _mm512_set1_ps(xb->d));
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(t, _mm512_cvtepi32_ps(s)));
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* the layouts' kernels, by name */
static inline __attribute__((always_inline)) void q4p_q40_rows(const uint8_t* g0, const uint8_t* g1, int nb,
                                                               size_t pair, const BlockX8* x, const int32_t* xsum, int R,
                                                               __m512* out) {
    (void)xsum;
    q4p_rows(g0, g1, nb, pair, x, R, 0, out);
}
static inline __attribute__((always_inline)) void q4p_q41_rows(const uint8_t* g0, const uint8_t* g1, int nb,
                                                               size_t pair, const BlockX8* x, const int32_t* xsum, int R,
                                                               __m512* out) {
    (void)xsum;
    q4p_rows(g0, g1, nb, pair, x, R, 1, out);
}
#define q4p_q80_rows q8p_rows

/* one copy per layout and R (not inlined into the caller's loop) */
typedef void (*Q4PRows)(const uint8_t* g0, const uint8_t* g1, int nb, size_t pair, const BlockX8* x,
                        const int32_t* xsum, __m512* out);
#define Q4P_COPY(name, R)                                                                              \
    static __attribute__((noinline)) void name##_##R(const uint8_t* g0, const uint8_t* g1, int nb,      \
                                                     size_t pair, const BlockX8* x, const int32_t* xsum, \
                                                     __m512* out) {                                    \
        name##_rows(g0, g1, nb, pair, x, xsum, R, out);                                                \
    }
#define Q4P_COPIES(name)                                                                               \
    Q4P_COPY(name, 1)                                                                                  \
    Q4P_COPY(name, 2)                                                                                  \
    Q4P_COPY(name, 3)                                                                                  \
    Q4P_COPY(name, 4)                                                                                  \
    Q4P_COPY(name, 5)                                                                                  \
    Q4P_COPY(name, 6)                                                                                  \
    Q4P_COPY(name, 7)                                                                                  \
    Q4P_COPY(name, 8)
Q4P_COPIES(q4p_q40)
Q4P_COPIES(q4p_q41)
Q4P_COPIES(q4p_q80)
#define Q4P_BY_R(name) {name##_1, name##_2, name##_3, name##_4, name##_5, name##_6, name##_7, name##_8}

/* Rows m .. m + R - 1 of outputs n .. n + 7 (and n + 8 .. n + 15 if both) from the pass's lanes
 * (lane l: output n + l): run_store's sums (v + bias + residual, a missing one as + 0.0f: the same
 * floats), 16 outputs a vector when both groups are there. */
static void q4p_store(const Run* r, int m, int R, int n, int both, const __m512* acc) {
    if (both) {
        const __m512 b = r->bias ? _mm512_loadu_ps(r->bias + n) : _mm512_setzero_ps();
        for (int i = 0; i < R; i++) {
            const size_t at = (size_t)(m + i) * r->N + n;
            const __m512 res = r->residual ? _mm512_loadu_ps(r->residual + at) : _mm512_setzero_ps();
            _mm512_storeu_ps(r->y + at, _mm512_add_ps(_mm512_add_ps(acc[i], b), res));
        }
        return;
    }
    float o[16 * Q4P_MAX_R];
    for (int i = 0; i < R; i++) _mm512_storeu_ps(o + 16 * i, acc[i]);
    for (int i = 0; i < R; i++)
        for (int c = 0; c < 8; c++) run_store(r, m + i, n + c, o[16 * i + c]);
}

int exo_x86_grouped8_q4_pairs(const Run* r, int layout) {
    static const Q4PRows k40[] = Q4P_BY_R(q4p_q40), k41[] = Q4P_BY_R(q4p_q41), k80[] = Q4P_BY_R(q4p_q80);
    const Q4PRows* k = layout == Q4P_Q8_0 ? k80 : layout == Q4P_Q4_1 ? k41 : k40;
    const int rows = r->m1 - r->m0;
    int32_t* xsum = NULL; /* Q8_0: 128 times each activation block's sum, row m's at (m - m0) nb */
    if (layout == Q4P_Q8_0) {
        xsum = (int32_t*)exo_scratch(SCRATCH_XSUM, sizeof(int32_t) * (size_t)rows * (size_t)r->nb);
        if (xsum == NULL) return -1;
        for (size_t i = 0; i < (size_t)rows * (size_t)r->nb; i++) {
            const int8_t* q = r->x8[(size_t)r->m0 * r->nb + i].qs;
            int32_t sum = 0;
            for (int j = 0; j < 32; j++) sum += q[j];
            xsum[i] = 128 * sum;
        }
    }
    __m512 acc[Q4P_MAX_R];
    const size_t pair = 16 * r->rb; /* from a pair's groups to the next pair's */
    for (int n = r->lo; n < r->hi; n += 16) {
        const int both = n + 8 < r->hi;
        const uint8_t *g0 = run_row(r, n), *g1 = both ? run_row(r, n + 8) : g0;
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= Q4P_MAX_R ? Q4P_MAX_R : r->m1 - m;
            k[R - 1](g0, g1, r->nb, pair, r->x8 + (size_t)m * r->nb,
                     xsum ? xsum + (size_t)(m - r->m0) * r->nb : NULL, acc);
            q4p_store(r, m, R, n, both, acc);
            m += R;
        }
    }
    return 0;
}
#endif
