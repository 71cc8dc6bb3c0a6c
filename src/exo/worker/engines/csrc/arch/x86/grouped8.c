/* The grouped strategy at 8-bit activations (ACT_X8) on x86: the repacked Q4_0 / Q4_1 / Q8_0 /
 * Q4_K / Q6_K groups (KIND_*_G8; exo_kernels.h) against 1 to G8X_MAX_R activation rows a pass, a
 * vector lane per weight row, in act8.h's order (bit for bit the per-row dots' floats).
 *
 * A group's block holds, for i = 0..7, the 8 rows' nibble bytes 2i, 2i + 1 (row c at 2c). Two of
 * those (i = 2k, 2k + 1), loaded as one vector, vpermq + vpshufb put row c's bytes 4k .. 4k + 3 in
 * int32 lane c: their low nibbles are the row's values 4k .. 4k + 3, the high ones 16 + 4k ..
 * 19 + 4k, so one vpdpbusd (VNNI builds) or vpmaddubsw (AVX2) per half against a broadcast of the
 * activation's 4 matching bytes adds them to the 8 rows' sums. AVX2 keeps a block's sums in int16
 * (16 products of at most 15 x 127 a lane: < 2^15) and widens them once, by vpmaddwd.
 *
 * Q6_K groups run grouped8_q6k.c's kernel (the batched copies here are the fallback when its
 * re-laid rows find no memory); Q4_K groups on
 * the AVX-512 VNNI build run grouped8_q4k.c's (64 bytes a step), and its passes of Q4P_FROM_ROWS
 * or more rows over Q4_0 / Q4_1 / Q8_0 groups grouped8_q4.c's.
 */
#include "exo_kernels.h"
#if EXO_AVX2
#include <stddef.h>
#include <stdlib.h>

#include "act8.h"
#include "arch/x86/grouped8_kq.h"
#include "arch/x86/grouped8_q4.h"
#include "arch/x86/x86.h"

/* Activation rows a pass over a group. The AVX-512 builds have 32 vector registers; the AVX2
 * build's 16 do not hold 8 rows' float sums beside their integer ones, and the compiler keeps most
 * of the float sums on the stack (a load and a store a row and block), yet a group's quads are
 * re-laid (x86_row_quad: a vpshufb each, after a vpermq on the VNNI builds, a vpblendd on the
 * AVX2 one) once for 8 rows instead of twice for 4 and the pass ran faster: on a Zen 3 core, one
 * thread, weights in cache, alternating in one process, 8 rows a call of SmolLM2's o / gate | up /
 * down (Q4_1) 1.20x / 1.08x / 1.13x, its Q8_0 head 1.07x, the 1B shape's Q4_K and Q4_0 / Q4_1
 * layers 1.13-1.17x (and 5 or 6 rows, once split 4 + 1 or 4 + 2, 1.2-1.3x). The AVX-VNNI build
 * (no such machine here) keeps 4. */
#if EXO_AVX512VNNI || !EXO_AVXVNNI
#define G8X_MAX_R 8
#else
#define G8X_MAX_R 4
#endif

#define G8X_KEEP(v) __asm__("" : "+x"(v))

#if EXO_AVX512VNNI || EXO_AVXVNNI
/* a_1 . b_1 + a_2 . b_2 per int32 lane (unsigned a, signed b, 4 bytes each), from zero: the
 * running sums then wait on one add a step, not on a chain of vpdpbusd latencies */
static inline __attribute__((always_inline)) __m256i g8x_dp2(__m256i a1, __m256i b1, __m256i a2, __m256i b2) {
    return X86_VNNI_DPBUSD(X86_VNNI_DPBUSD(_mm256_setzero_si256(), a1, b1), a2, b2);
}
#endif

/* out[r] lane c = row c of the group at `grp` (Q4_1 if has_m, else Q4_0) dotted with activation
 * row r (x + r nb), r < R; `relaid`: the group's quads are a relay's copy (run_groups8), as read. */
static inline __attribute__((always_inline)) void g8x_rows(const uint8_t* grp, int nb, const BlockX8* x, int R,
                                                           int has_m, int relaid, __m256* out) {
    const size_t bytes = has_m ? sizeof(BlockQ4_1x8) : sizeof(BlockQ4_0x8);
    const size_t qs_at = has_m ? offsetof(BlockQ4_1x8, qs) : offsetof(BlockQ4_0x8, qs);
    const __m256i low = _mm256_set1_epi8(15);
    __m256 acc[8]; /* R <= 8 (a constant in each copy) */
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)b * bytes;
        if (!relaid) x86_ahead(blk, bytes);
#if EXO_AVX512VNNI || EXO_AVXVNNI
        __m256i s[8];
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
#else
        __m256i s16[8];
        for (int r = 0; r < R; r++) s16[r] = _mm256_setzero_si256();
#endif
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i q = relaid ? _mm256_loadu_si256((const __m256i*)(blk + qs_at + 32 * k))
                                     : x86_row_quad(blk + qs_at, k);
            const __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            for (int r = 0; r < R; r++) {
                const int8_t* xq = x[(size_t)r * nb + b].qs;
#if EXO_AVX512VNNI || EXO_AVXVNNI
                s[r] = _mm256_add_epi32(s[r], g8x_dp2(lo, x86_bcast4(xq + 4 * k), hi, x86_bcast4(xq + 16 + 4 * k)));
                G8X_KEEP(s[r]);
#else
                const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x86_bcast4(xq + 4 * k)),
                                                   _mm256_maddubs_epi16(hi, x86_bcast4(xq + 16 + 4 * k)));
                s16[r] = _mm256_add_epi16(s16[r], p);
                G8X_KEEP(s16[r]);
#endif
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
        const __m256 m = has_m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ4_1x8, m))))
                               : _mm256_mul_ps(_mm256_set1_ps(-8.0f), d);
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
#if EXO_AVX512VNNI || EXO_AVXVNNI
            const __m256i isum = s[r];
#else
            const __m256i isum = _mm256_madd_epi16(s16[r], _mm256_set1_epi16(1));
#endif
            const __m256 t = _mm256_mul_ps(d, _mm256_set1_ps(xb->d));
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(t, _mm256_cvtepi32_ps(isum)));
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(m, _mm256_set1_ps(xb->s)));
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* Chunks 2k and 2k + 1 of a Q8_0 group's block (its bytes at qs) re-laid: lane c of *p holds row c's
 * values 4k .. 4k + 3, of *q its values 16 + 4k .. 19 + 4k. */
static inline __attribute__((always_inline)) void g8x_q8_quads(const uint8_t* qs, int k, __m256i* p, __m256i* q) {
    const __m256i a = _mm256_loadu_si256((const __m256i*)(qs + 64 * k));
    const __m256i c = _mm256_loadu_si256((const __m256i*)(qs + 64 * k + 32));
    const __m256i lo = _mm256_unpacklo_epi16(a, c), hi = _mm256_unpackhi_epi16(a, c);
    *p = _mm256_permute2x128_si256(lo, hi, 0x20);
    *q = _mm256_permute2x128_si256(lo, hi, 0x31);
}

/* The same for a Q8_0 group: chunks 2k and 2k + 1 (32 bytes each: pairs 2k, 2k + 1 of the 8
 * rows in their low halves, pairs 2k + 8, 2k + 9 in the high ones) give lane c row c's values
 * 4k .. 4k + 3 (P) and 16 + 4k .. 19 + 4k (Q); |w| times x with w's sign (exact: x > -128). AVX2
 * widens each vpmaddubsw (its pairs reach 2 x 128 x 127) by vpmaddwd. */
static inline __attribute__((always_inline)) void g8x_q8_rows(const uint8_t* grp, int nb, const BlockX8* x, int R,
                                                              int relaid, __m256* out) {
    __m256 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)b * sizeof(BlockQ8_0x8);
        if (!relaid) x86_ahead(blk, sizeof(BlockQ8_0x8));
        const uint8_t* qs = blk + offsetof(BlockQ8_0x8, qs);
        __m256i s[8];
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m256i p, q;
            if (relaid) {
                p = _mm256_loadu_si256((const __m256i*)(qs + 64 * k));
                q = _mm256_loadu_si256((const __m256i*)(qs + 64 * k + 32));
            } else
                g8x_q8_quads(qs, k, &p, &q);
            const __m256i up = _mm256_abs_epi8(p), uq = _mm256_abs_epi8(q);
            for (int r = 0; r < R; r++) {
                const int8_t* xq = x[(size_t)r * nb + b].qs;
                const __m256i xp = _mm256_sign_epi8(x86_bcast4(xq + 4 * k), p);
                const __m256i xq2 = _mm256_sign_epi8(x86_bcast4(xq + 16 + 4 * k), q);
#if EXO_AVX512VNNI || EXO_AVXVNNI
                s[r] = _mm256_add_epi32(s[r], g8x_dp2(up, xp, uq, xq2));
#else
                const __m256i one = _mm256_set1_epi16(1);
                s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(_mm256_maddubs_epi16(up, xp), one));
                s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(_mm256_maddubs_epi16(uq, xq2), one));
#endif
                G8X_KEEP(s[r]);
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
        for (int r = 0; r < R; r++) {
            const __m256 t = _mm256_mul_ps(d, _mm256_set1_ps(x[(size_t)r * nb + b].d));
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(t, _mm256_cvtepi32_ps(s[r])));
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* The same for a Q4_K group: chunk ch of a super-block (qs[ch]: 16 x 16 bytes) holds sub-blocks
 * 2 ch (low nibbles) and 2 ch + 1 (high), as a Q4 block holds its two halves. */
static inline __attribute__((always_inline)) void g8x_q4k_rows(const uint8_t* grp, int nb, const BlockX8* x, int R,
                                                               int relaid, __m256* out) {
    const __m256i low = _mm256_set1_epi8(15);
    __m256 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    uint8_t sc[64], mn[64];
    for (int b = 0; b < nb; b += 2) {
        const uint8_t* blk = grp + (size_t)(b / 8) * sizeof(BlockQ4Kx8);
        const int j = b % 8;
        const uint8_t* qs = blk + offsetof(BlockQ4Kx8, qs) + 256 * (j / 2);
        if (j == 0) q4k8_unpack(blk, sc, mn);
        if (!relaid) x86_ahead(qs, 256);
        __m256i s0[8], s1[8]; /* the two sub-blocks' sums (int16 on AVX2) */
        for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int k = 0; k < 8; k += 2) { /* quads k, k + 1 */
            const __m256i q = relaid ? _mm256_loadu_si256((const __m256i*)(qs + 32 * k)) : x86_row_quad(qs, k);
            const __m256i q2 = relaid ? _mm256_loadu_si256((const __m256i*)(qs + 32 * k + 32)) : x86_row_quad(qs, k + 1);
            const __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            const __m256i lo2 = _mm256_and_si256(q2, low), hi2 = _mm256_and_si256(_mm256_srli_epi16(q2, 4), low);
            for (int r = 0; r < R; r++) {
                const BlockX8* xb = x + (size_t)r * nb + b;
                const int8_t *x0 = xb[0].qs + 4 * k, *x1 = xb[1].qs + 4 * k;
#if EXO_AVX512VNNI || EXO_AVXVNNI
                s0[r] = _mm256_add_epi32(s0[r], g8x_dp2(lo, x86_bcast4(x0), lo2, x86_bcast4(x0 + 4)));
                s1[r] = _mm256_add_epi32(s1[r], g8x_dp2(hi, x86_bcast4(x1), hi2, x86_bcast4(x1 + 4)));
#else
                s0[r] = _mm256_add_epi16(s0[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo, x86_bcast4(x0)),
                                                                 _mm256_maddubs_epi16(lo2, x86_bcast4(x0 + 4))));
                s1[r] = _mm256_add_epi16(s1[r], _mm256_add_epi16(_mm256_maddubs_epi16(hi, x86_bcast4(x1)),
                                                                 _mm256_maddubs_epi16(hi2, x86_bcast4(x1 + 4))));
#endif
                G8X_KEEP(s0[r]);
                G8X_KEEP(s1[r]);
            }
        }
        __m256 d, dmin, dsc0, dm0, dsc1, dm1;
        q4k8_d(blk, &d, &dmin);
        q4k8_scale(d, dmin, sc + 8 * j, mn + 8 * j, &dsc0, &dm0);
        q4k8_scale(d, dmin, sc + 8 * j + 8, mn + 8 * j + 8, &dsc1, &dm1);
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
#if EXO_AVX512VNNI || EXO_AVXVNNI
            const __m256i i0 = s0[r], i1 = s1[r];
#else
            const __m256i i0 = _mm256_madd_epi16(s0[r], _mm256_set1_epi16(1));
            const __m256i i1 = _mm256_madd_epi16(s1[r], _mm256_set1_epi16(1));
#endif
            acc[r] = q4k8_step(q4k8_step(acc[r], dsc0, dm0, xb, i0), dsc1, dm1, xb + 1, i1);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* The same for a Q6_K group: 32-value group g = 4n + k of a super-block reads ql chunk 2n + (k & 1)
 * (its low nibbles if k < 2, else the high ones) and bits 2k, 2k + 1 of qh chunk n; quads 0..3
 * are the first 16-value half, 4..7 the second, each half its own step. |q - 32| times x with
 * q - 32's sign (exact); AVX2 keeps a half's sums in int16 (4 x 2 x 32 x 127 < 2^15). */
static inline __attribute__((always_inline)) void g8x_q6k_rows(const uint8_t* grp, int nb, const BlockX8* x, int R,
                                                               __m256* out) {
    const __m256i low = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    __m256 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)(b / 8) * sizeof(BlockQ6Kx8);
        const int g = b % 8, n = g / 4, k = g % 4;
        const uint8_t* ql = blk + offsetof(BlockQ6Kx8, ql) + 256 * (2 * n + (k & 1));
        const uint8_t* qh = blk + offsetof(BlockQ6Kx8, qh) + 256 * n;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
        for (int h = 0; h < 2; h++) {
            __m256i s[8];
            for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
            for (int quad = 4 * h; quad < 4 * h + 4; quad += 2) { /* quads quad, quad + 1 */
                __m256i q[2], u[2];
                for (int i = 0; i < 2; i++) {
                    const __m256i l4 = x86_row_quad(ql, quad + i), h2 = x86_row_quad(qh, quad + i);
                    const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(l4, 4) : l4, low);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(h2, 2 * k), three);
                    q[i] = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), m32);
                    u[i] = _mm256_abs_epi8(q[i]);
                }
                for (int r = 0; r < R; r++) {
                    const int8_t* xq = x[(size_t)r * nb + b].qs + 4 * quad;
                    const __m256i xs0 = _mm256_sign_epi8(x86_bcast4(xq), q[0]);
                    const __m256i xs1 = _mm256_sign_epi8(x86_bcast4(xq + 4), q[1]);
#if EXO_AVX512VNNI || EXO_AVXVNNI
                    s[r] = _mm256_add_epi32(s[r], g8x_dp2(u[0], xs0, u[1], xs1));
#else
                    s[r] = _mm256_add_epi16(s[r], _mm256_add_epi16(_mm256_maddubs_epi16(u[0], xs0),
                                                                   _mm256_maddubs_epi16(u[1], xs1)));
#endif
                    G8X_KEEP(s[r]);
                }
            }
            const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i*)(blk + offsetof(BlockQ6Kx8, scales) + 8 * (2 * g + h)))));
            const __m256 dsc = _mm256_mul_ps(d, sc);
            for (int r = 0; r < R; r++) {
#if EXO_AVX512VNNI || EXO_AVXVNNI
                const __m256i isum = s[r];
#else
                const __m256i isum = _mm256_madd_epi16(s[r], _mm256_set1_epi16(1));
#endif
                const __m256 t = _mm256_mul_ps(dsc, _mm256_set1_ps(x[(size_t)r * nb + b].d));
                acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(t, _mm256_cvtepi32_ps(isum)));
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* one copy per layout and R (not inlined into the caller's loop) */
#define G8X_COPY(name, R, has_m)                                                                 \
    static __attribute__((noinline)) void name##_##R(const uint8_t* grp, int nb, const BlockX8* x, \
                                                     __m256* out) {                              \
        g8x_rows(grp, nb, x, R, has_m, 0, out);                                                  \
    }
#define G8X_COPIES(name, has_m)                                                                  \
    G8X_COPY(name, 1, has_m)                                                                     \
    G8X_COPY(name, 2, has_m) G8X_COPY(name, 3, has_m) G8X_COPY(name, 4, has_m)                   \
        G8X_COPY(name, 5, has_m) G8X_COPY(name, 6, has_m) G8X_COPY(name, 7, has_m)               \
            G8X_COPY(name, 8, has_m)
G8X_COPIES(g8x_q40, 0)
G8X_COPIES(g8x_q41, 1)
#define G8X_Q8_COPY(R)                                                                            \
    static __attribute__((noinline)) void g8x_q80_##R(const uint8_t* grp, int nb, const BlockX8* x, \
                                                      __m256* out) {                             \
        g8x_q8_rows(grp, nb, x, R, 0, out);                                                      \
    }
G8X_Q8_COPY(1)
G8X_Q8_COPY(2)
G8X_Q8_COPY(3)
G8X_Q8_COPY(4)
G8X_Q8_COPY(5)
G8X_Q8_COPY(6)
G8X_Q8_COPY(7)
G8X_Q8_COPY(8)
#define G8X_Q4K_COPY(R)                                                                           \
    static __attribute__((noinline)) void g8x_q4k_##R(const uint8_t* grp, int nb, const BlockX8* x, \
                                                      __m256* out) {                             \
        g8x_q4k_rows(grp, nb, x, R, 0, out);                                                     \
    }
G8X_Q4K_COPY(1)
G8X_Q4K_COPY(2)
G8X_Q4K_COPY(3)
G8X_Q4K_COPY(4)
G8X_Q4K_COPY(5)
G8X_Q4K_COPY(6)
G8X_Q4K_COPY(7)
G8X_Q4K_COPY(8)
#define G8X_Q6K_COPY(R)                                                                           \
    static __attribute__((noinline)) void g8x_q6k_##R(const uint8_t* grp, int nb, const BlockX8* x, \
                                                      __m256* out) {                             \
        g8x_q6k_rows(grp, nb, x, R, out);                                                        \
    }
G8X_Q6K_COPY(1)
G8X_Q6K_COPY(2)
G8X_Q6K_COPY(3)
G8X_Q6K_COPY(4)
G8X_Q6K_COPY(5)
G8X_Q6K_COPY(6)
G8X_Q6K_COPY(7)
G8X_Q6K_COPY(8)

#if !EXO_AVX512VNNI && !EXO_AVXVNNI
/* One activation row on the AVX2 build (a decode step of one stream), Q4_0 / Q4_1 / Q4_K: the
 * quads' bytes as stored, not re-laid. A 32-byte quad holds row c's bytes 4k, 4k + 1 at 2c of its
 * low half and 4k + 2, 4k + 3 at 2c of its high half, so vpmaddubsw against a vector holding the
 * activation's matching 2 bytes 8 times in each half (g8x_spread: its 4 bytes' pairs, one vpshufb
 * of a broadcast, laid out once a call for the whole row) puts row c's sums in int16 lanes c and
 * 8 + c, added together (widened) once a block. Against re-laying each quad by vpermq + vpshufb
 * (g8x_rows, which a batch's rows share): the 1B-shaped file's gate | up (Q4_K) at one thread on a
 * Zen 3 core, weights not in cache, 1,492 -> 1,383 us a call (in cache 1,305 -> 1,073), its q | k | v
 * 290 -> 266, an 8B-shaped down 2,536 -> 2,275 (alternating in one process). The same integers, so
 * the same floats (act8.h's order). The VNNI builds sum 4 bytes a lane (vpdpbusd) and keep the
 * re-laid quads. */

/* Row x's blocks re-laid: block b's value quad v (values 4v .. 4v + 3) at ax[8 b + v], its bytes
 * 4v, 4v + 1 repeated in the low half and 4v + 2, 4v + 3 in the high half. */
static void g8x_spread(const BlockX8* x, int nb, __m256i* ax) {
    const __m256i pairs = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2,
                                           3, 2, 3, 2, 3, 2, 3);
    for (int b = 0; b < nb; b++)
        for (int v = 0; v < 8; v++) ax[8 * b + v] = _mm256_shuffle_epi8(x86_bcast4(x[b].qs + 4 * v), pairs);
}

/* int32 lane c = int16 lanes c + 8 + c of s (row c's two half sums). */
static inline __attribute__((always_inline)) __m256i g8x_fold(__m256i s) {
    return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(s)),
                            _mm256_cvtepi16_epi32(_mm256_extracti128_si256(s, 1)));
}

/* Lane c = row c of the Q4_0 (has_m 0) or Q4_1 group at `grp` dotted with row x (ax: spread). A
 * block's 8 vpmaddubsw sums reach 8 x 2 x 15 x 127 < 2^15 a lane. */
static inline __attribute__((always_inline)) __m256 g8x_q4_one(const uint8_t* grp, int nb, const BlockX8* x,
                                                               const __m256i* ax, int has_m) {
    const size_t bytes = has_m ? sizeof(BlockQ4_1x8) : sizeof(BlockQ4_0x8);
    const size_t qs_at = has_m ? offsetof(BlockQ4_1x8, qs) : offsetof(BlockQ4_0x8, qs);
    const __m256i low = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t* blk = grp + (size_t)b * bytes;
        const __m256i* a = ax + 8 * b;
        x86_ahead(blk, bytes);
        __m256i s = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            const __m256i q = _mm256_loadu_si256((const __m256i*)(blk + qs_at + 32 * k));
            const __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            s = _mm256_add_epi16(s, _mm256_add_epi16(_mm256_maddubs_epi16(lo, a[k]), _mm256_maddubs_epi16(hi, a[4 + k])));
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
        const __m256 m = has_m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + offsetof(BlockQ4_1x8, m))))
                               : _mm256_mul_ps(_mm256_set1_ps(-8.0f), d);
        const __m256 t = _mm256_mul_ps(d, _mm256_set1_ps(x[b].d));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(t, _mm256_cvtepi32_ps(g8x_fold(s))));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(m, _mm256_set1_ps(x[b].s)));
    }
    return acc;
}
static __attribute__((noinline)) __m256 g8x_q40_one(const uint8_t* grp, int nb, const BlockX8* x, const __m256i* ax) {
    return g8x_q4_one(grp, nb, x, ax, 0);
}
static __attribute__((noinline)) __m256 g8x_q41_one(const uint8_t* grp, int nb, const BlockX8* x, const __m256i* ax) {
    return g8x_q4_one(grp, nb, x, ax, 1);
}

/* The same for a Q4_K group: chunk p of a super-block holds sub-blocks 2p (low nibbles) and
 * 2p + 1 (high), each sub-block's 8 quads summed in int16 (at most 30,480 a lane), its scales
 * unpacked once a super-block. */
static __attribute__((noinline)) __m256 g8x_q4k_one(const uint8_t* grp, int nb, const BlockX8* x, const __m256i* ax) {
    const __m256i low = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    uint8_t sc[64], mn[64];
    for (int b0 = 0; b0 < nb; b0 += 8) {
        const uint8_t* blk = grp + (size_t)(b0 / 8) * sizeof(BlockQ4Kx8);
        __m256 d, dmin;
        q4k8_d(blk, &d, &dmin);
        q4k8_unpack(blk, sc, mn);
        for (int p = 0; p < 4; p++) {
            const uint8_t* qs = blk + offsetof(BlockQ4Kx8, qs) + 256 * p;
            const __m256i* a = ax + 8 * (b0 + 2 * p);
            x86_ahead(qs, 256);
            __m256i s0 = _mm256_setzero_si256(), s1 = s0;
            for (int k = 0; k < 8; k += 2) {
                const __m256i q = _mm256_loadu_si256((const __m256i*)(qs + 32 * k));
                const __m256i q2 = _mm256_loadu_si256((const __m256i*)(qs + 32 * k + 32));
                const __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
                const __m256i lo2 = _mm256_and_si256(q2, low), hi2 = _mm256_and_si256(_mm256_srli_epi16(q2, 4), low);
                s0 = _mm256_add_epi16(s0, _mm256_add_epi16(_mm256_maddubs_epi16(lo, a[k]), _mm256_maddubs_epi16(lo2, a[k + 1])));
                s1 = _mm256_add_epi16(s1, _mm256_add_epi16(_mm256_maddubs_epi16(hi, a[8 + k]),
                                                           _mm256_maddubs_epi16(hi2, a[8 + k + 1])));
            }
            acc = q4k8_pair(acc, d, dmin, sc, mn, p, x + b0 + 2 * p, g8x_fold(s0), g8x_fold(s1));
        }
    }
    return acc;
}

typedef __m256 (*G8XOne)(const uint8_t* grp, int nb, const BlockX8* x, const __m256i* ax);

/* A pass of one activation row over a layout's groups by `one`; -1 (nothing done) where the spread
 * row finds no memory (the caller's kernels then run it). */
static int run_one8(const Run* r, G8XOne one) {
    if (r->m1 - r->m0 != 1) return -1;
    __m256i* ax = aligned_alloc(32, sizeof(__m256i) * 8 * (size_t)r->nb);
    if (ax == NULL) return -1;
    const BlockX8* x = r->x8 + (size_t)r->m0 * r->nb;
    g8x_spread(x, r->nb, ax);
    float o[8];
    for (int n = r->lo; n < r->hi; n += 8) {
        _mm256_storeu_ps(o, one(run_row(r, n), r->nb, x, ax));
        for (int c = 0; c < 8; c++) run_store(r, r->m0, n + c, o[c]);
    }
    free(ax);
    return 0;
}
#define G8X_ONE(one) if (run_one8(r, one) == 0) return 0
#else
#define G8X_ONE(one) (void)0
#endif

typedef void (*G8XRows)(const uint8_t* grp, int nb, const BlockX8* x, __m256* out);
#define G8X_BY_R(name) {name##_1, name##_2, name##_3, name##_4, name##_5, name##_6, name##_7, name##_8}

/* A group's blocks (nb activation blocks' worth, at grp) copied to dst with their quads re-laid as
 * the kernels read them (x86_row_quad; Q8_0: g8x_q8_quads), for the relaid copies of the kernels.
 * The relay streams the weights, so it asks for them ahead (x86_ahead); the passes reading the
 * copy (in L1) do not (60 rows: SmolLM2's Q4_1 layers 1.05-1.06x, the rest within noise). */
typedef void (*G8XRelay)(const uint8_t* grp, int nb, uint8_t* dst);
static inline __attribute__((always_inline)) void g8x_relay_q4(const uint8_t* grp, int nb, int has_m, uint8_t* dst) {
    const size_t bytes = has_m ? sizeof(BlockQ4_1x8) : sizeof(BlockQ4_0x8);
    const size_t qs_at = has_m ? offsetof(BlockQ4_1x8, qs) : offsetof(BlockQ4_0x8, qs);
    for (size_t at = 0; at < (size_t)nb * bytes; at += bytes) {
        x86_ahead(grp + at, bytes);
        memcpy(dst + at, grp + at, qs_at);
        for (int k = 0; k < 4; k++) _mm256_storeu_si256((__m256i*)(dst + at + qs_at + 32 * k), x86_row_quad(grp + at + qs_at, k));
    }
}
static void g8x_relay_q40(const uint8_t* grp, int nb, uint8_t* dst) { g8x_relay_q4(grp, nb, 0, dst); }
static void g8x_relay_q41(const uint8_t* grp, int nb, uint8_t* dst) { g8x_relay_q4(grp, nb, 1, dst); }
static void g8x_relay_q80(const uint8_t* grp, int nb, uint8_t* dst) {
    const size_t qs_at = offsetof(BlockQ8_0x8, qs);
    for (size_t at = 0; at < (size_t)nb * sizeof(BlockQ8_0x8); at += sizeof(BlockQ8_0x8)) {
        x86_ahead(grp + at, sizeof(BlockQ8_0x8));
        memcpy(dst + at, grp + at, qs_at);
        for (int k = 0; k < 4; k++) {
            __m256i p, q;
            g8x_q8_quads(grp + at + qs_at, k, &p, &q);
            _mm256_storeu_si256((__m256i*)(dst + at + qs_at + 64 * k), p);
            _mm256_storeu_si256((__m256i*)(dst + at + qs_at + 64 * k + 32), q);
        }
    }
}
static void g8x_relay_q4k(const uint8_t* grp, int nb, uint8_t* dst) {
    const size_t qs_at = offsetof(BlockQ4Kx8, qs);
    for (size_t at = 0; at < (size_t)(nb / 8) * sizeof(BlockQ4Kx8); at += sizeof(BlockQ4Kx8)) {
        x86_ahead(grp + at, sizeof(BlockQ4Kx8));
        memcpy(dst + at, grp + at, qs_at);
        for (int k = 0; k < 32; k++) _mm256_storeu_si256((__m256i*)(dst + at + qs_at + 32 * k), x86_row_quad(grp + at + qs_at, k));
    }
}

/* A layout's kernels for 1..G8X_MAX_R activation rows (index R - 1); on the plain AVX2 build, a
 * G8X_MAX_R-row copy reading a relaid group, its relay and a group's bytes per activation block. */
typedef struct {
    G8XRows k[8];
    G8XRows relaid;
    G8XRelay relay;
    size_t block_bytes;
} G8XLayout;

/* Each pass over a group re-lays its quads (a vpermq and a vpshufb a quad, shared by the pass's
 * rows). With three or more passes' rows (a prompt's), the plain AVX2 build re-lays each group once
 * into a copy that every full pass then reads as it stands: the same integers, so the same floats.
 * On a Zen 3 core, one thread, weights in cache, alternating in one process, 60 rows: SmolLM2's
 * Q4_1 layers 1.10-1.12x, its Q8_0 head 1.06x, the 1B shape's Q4_K / Q4_0 / Q4_1 layers 1.07-1.12x;
 * at two passes (16 rows) it gained on SmolLM2's small groups (1.08-1.11x) and lost on the 1B
 * shape's (0.96-0.98x: a 9 KB group copied, then read back). */
#define G8X_RELAY (!EXO_AVX512VNNI && !EXO_AVXVNNI)
#define G8X_RELAY_FROM_ROWS (3 * G8X_MAX_R)

/* The grouped strategy over a layout's kernels. */
static inline __attribute__((always_inline)) void run_groups8(const Run* r, const G8XLayout* L) {
    __m256 acc[8];
    float o[8 * 8];
    const size_t group_bytes = (size_t)r->nb * L->block_bytes;
    uint8_t* copy = G8X_RELAY && L->relay != NULL && r->m1 - r->m0 >= G8X_RELAY_FROM_ROWS
                        ? aligned_alloc(32, (group_bytes + 31) / 32 * 32)
                        : NULL; /* none: every pass re-lays its own */
    for (int n = r->lo; n < r->hi; n += 8) {
        const uint8_t* grp = run_row(r, n);
        if (copy != NULL) L->relay(grp, r->nb, copy);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= G8X_MAX_R ? G8X_MAX_R : r->m1 - m;
            if (copy != NULL && R == G8X_MAX_R)
                L->relaid(copy, r->nb, r->x8 + (size_t)m * r->nb, acc);
            else
                L->k[R - 1](grp, r->nb, r->x8 + (size_t)m * r->nb, acc);
            for (int i = 0; i < R; i++) _mm256_storeu_ps(o + 8 * i, acc[i]);
            for (int i = 0; i < R; i++)
                for (int c = 0; c < 8; c++) run_store(r, m + i, n + c, o[8 * i + c]);
            m += R;
        }
    }
    free(copy);
}

/* the relaid copies (G8X_MAX_R rows) */
static __attribute__((noinline)) void g8x_q40_relaid(const uint8_t* grp, int nb, const BlockX8* x, __m256* out) {
    g8x_rows(grp, nb, x, G8X_MAX_R, 0, 1, out);
}
static __attribute__((noinline)) void g8x_q41_relaid(const uint8_t* grp, int nb, const BlockX8* x, __m256* out) {
    g8x_rows(grp, nb, x, G8X_MAX_R, 1, 1, out);
}
static __attribute__((noinline)) void g8x_q80_relaid(const uint8_t* grp, int nb, const BlockX8* x, __m256* out) {
    g8x_q8_rows(grp, nb, x, G8X_MAX_R, 1, out);
}
static __attribute__((noinline)) void g8x_q4k_relaid(const uint8_t* grp, int nb, const BlockX8* x, __m256* out) {
    g8x_q4k_rows(grp, nb, x, G8X_MAX_R, 1, out);
}
static const G8XLayout G8X_Q40 = {G8X_BY_R(g8x_q40), g8x_q40_relaid, g8x_relay_q40, sizeof(BlockQ4_0x8)};
static const G8XLayout G8X_Q41 = {G8X_BY_R(g8x_q41), g8x_q41_relaid, g8x_relay_q41, sizeof(BlockQ4_1x8)};
static const G8XLayout G8X_Q80 = {G8X_BY_R(g8x_q80), g8x_q80_relaid, g8x_relay_q80, sizeof(BlockQ8_0x8)};
static const G8XLayout G8X_Q4K = {G8X_BY_R(g8x_q4k), g8x_q4k_relaid, g8x_relay_q4k, sizeof(BlockQ4Kx8) / 8};
static const G8XLayout G8X_Q6K = {G8X_BY_R(g8x_q6k), NULL, NULL, sizeof(BlockQ6Kx8) / 8};

int exo_x86_grouped8_q4_0(const Run* r) {
    G8X_ONE(g8x_q40_one);
#if EXO_AVX512VNNI
    if (r->m1 - r->m0 >= Q4P_FROM_ROWS && exo_x86_grouped8_q4_pairs(r, Q4P_Q4_0) == 0) return 0; /* grouped8_q4.c */
#endif
    run_groups8(r, &G8X_Q40);
    return 0;
}
int exo_x86_grouped8_q4_1(const Run* r) {
    G8X_ONE(g8x_q41_one);
#if EXO_AVX512VNNI
    if (r->m1 - r->m0 >= Q4P_FROM_ROWS && exo_x86_grouped8_q4_pairs(r, Q4P_Q4_1) == 0) return 0; /* grouped8_q4.c */
#endif
    run_groups8(r, &G8X_Q41);
    return 0;
}
int exo_x86_grouped8_q4_k(const Run* r) {
#if EXO_AVX512VNNI
    if (exo_x86_grouped8_q4_k_rows(r) == 0) return 0; /* grouped8_q4k.c */
#endif
    G8X_ONE(g8x_q4k_one);
    run_groups8(r, &G8X_Q4K);
    return 0;
}
int exo_x86_grouped8_q6_k(const Run* r) {
    if (exo_x86_grouped8_q6_k_rows(r) == 0) return 0;
    run_groups8(r, &G8X_Q6K);
    return 0;
}
int exo_x86_grouped8_q8_0(const Run* r) {
#if EXO_AVX512VNNI
    if (r->m1 - r->m0 >= Q4P_FROM_ROWS && exo_x86_grouped8_q4_pairs(r, Q4P_Q8_0) == 0) return 0; /* grouped8_q4.c */
#endif
    run_groups8(r, &G8X_Q80);
    return 0;
}
#endif
