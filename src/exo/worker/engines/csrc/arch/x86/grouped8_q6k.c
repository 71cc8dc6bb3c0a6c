/* Repacked Q6_K groups (KIND_Q6_K_G8) against 8-bit activation rows on x86, in act8.h's order: the
 * same floats as grouped8.c's kernels and the per-row dots, faster (grouped8.c's
 * exo_x86_grouped8_q6_k hands its passes here).
 *
 * Each super-block of a group is decoded once for all the pass's rows (q6_decode): its 6-bit values
 * (unsigned, 0..63) re-laid so that int32 lane c of a vector holds weight row c's 4 values of a
 * quad, 64 such vectors (8 groups of 32 x 8 quads), and its 16 halves' scales d sc as floats. The
 * rows then run Q6R_MAX at a time over the decoded block with nothing but a vpdpbusd per quad and
 * row (against a broadcast of the row's 4 activation bytes) and a half's float step; the rows'
 * float sums wait in memory between super-blocks (the same floats: a row's steps keep their
 * order). The half's integer dot is sum q x - 32 sum x, the same integer as sum (q - 32) x (exact
 * in int32): each row's sum starts at -32 sum x, computed once a call while the activation rows
 * are re-laid block-major (Q6X), so that one pointer and constant offsets reach every row.
 *
 * The AVX-512 VNNI build takes two groups at once (q6_pair) in passes of Q6_PAIR_FROM_ROWS rows or
 * more: 512-bit vectors hold the first group's 8 weight rows in lanes 0..7 and the second's in
 * lanes 8..15, so one 4-byte broadcast serves a vpdpbusd of 64 products and each float step covers
 * 16 weight rows (lane by lane the same operations as the 256-bit kernel, which runs a part's odd
 * group left over, passes of fewer rows and the other builds). On a Zen 4 core (512-bit operations
 * in two halves), weights not in cache, one row: Gemma 3 270M's down 85-91 us a call one group at
 * a time against 156-175 in pairs, the 1B shape's 1,490-1,780 against 1,740-1,850; at 4 to 60 rows
 * within noise of each other. (A single-row kernel of its own, grouped8_k1.c's, which decoded four
 * groups' quads and dotted them at once without storing the decoded super-block, ran at about
 * half this file's speed at one row there: removed.)
 */
#include "exo_kernels.h"
#if EXO_AVX2
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "act8.h"
#include "arch/x86/grouped8_kq.h"
#include "arch/x86/x86.h"

/* activation rows a pass over a decoded super-block (the AVX-512 builds have 32 vector registers) */
#if EXO_AVX512VNNI
#define Q6R_MAX 8
#define Q6_PAIR_FROM_ROWS 4 /* fewer rows: one group at a time (see the top of the file) */
#else
#define Q6R_MAX 4
#endif

/* An activation block re-laid: its values, d, and -32 x the sums of its two 16-value halves. */
typedef struct {
    int8_t qs[32];
    float d;
    int32_t nsx[2];
} Q6X;

/* A Q6_K group's super-block, decoded: q[8 g + quad] lane c = weight row c's values 4 quad ..
 * 4 quad + 3 of 32-value group g (0..63), dsc[2 g + h] = d sc of half h of group g. */
typedef struct {
    __m256i q[64];
    __m256 dsc[16];
} Q6Dec;

/* All of super-block `blk`'s cache lines asked for at once, before its decode reads them. The decode
 * walks three chunks of the block side by side (ql 2n, 2n + 1, qh n), which the hardware
 * prefetchers follow poorly; these 27 requests let the memory system fetch the whole block in
 * parallel. Asking for the next super-block instead (while this one runs) was much slower: the
 * 1B-shaped Q4_K_M file's decode at one thread on a Zen 4 core, alternating in one process,
 * 17-21 tok/s against 26-31 with this (and 17-19 with no prefetch at all). The pairs of groups
 * (4 rows or more, AVX-512 VNNI) ask for the next super-blocks' lines as well: the 1B shape's
 * down projection at 4 rows 1,710 -> 1,374 us a call, at 8 rows 2,339 -> 2,146 (weights not in
 * cache, alternating in one process). */
static inline __attribute__((always_inline)) void q6_prefetch(const uint8_t* blk) {
    x86_prefetch_at((uintptr_t)blk, sizeof(BlockQ6Kx8));
}

/* Super-block `blk` of a group decoded (each quad of the 3 chunks that groups 4n .. 4n + 3 share
 * loaded and re-laid once for all four): group g = 4n + k reads
 * the low (k < 2) or high nibbles of ql chunk 2n + (k & 1) and bits 2k, 2k + 1 of qh chunk n. */
static void q6_decode(const uint8_t* blk, Q6Dec* o) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)blk));
    for (int j = 0; j < 16; j++) {
        const __m128i sc = _mm_loadl_epi64((const __m128i*)(blk + offsetof(BlockQ6Kx8, scales) + 8 * j));
        o->dsc[j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
    }
    const __m256i low = _mm256_set1_epi8(15), b01 = _mm256_set1_epi8(3), b23 = _mm256_set1_epi8(12);
    const __m256i b45 = _mm256_set1_epi8(48);
    for (int n = 0; n < 2; n++) {
        const uint8_t* ql0 = blk + offsetof(BlockQ6Kx8, ql) + 256 * (2 * n);
        const uint8_t* ql1 = ql0 + 256;
        const uint8_t* qh = blk + offsetof(BlockQ6Kx8, qh) + 256 * n;
        __m256i* q = o->q + 32 * n;
        for (int quad = 0; quad < 8; quad++) {
            const __m256i a = x86_row_quad(ql0, quad), b = x86_row_quad(ql1, quad), hb = x86_row_quad(qh, quad);
            q[quad] = _mm256_or_si256(_mm256_and_si256(a, low), _mm256_slli_epi16(_mm256_and_si256(hb, b01), 4));
            q[8 + quad] = _mm256_or_si256(_mm256_and_si256(b, low), _mm256_slli_epi16(_mm256_and_si256(hb, b23), 2));
            q[16 + quad] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low), _mm256_and_si256(hb, b45));
            q[24 + quad] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), low),
                                           _mm256_and_si256(_mm256_srli_epi16(hb, 2), b45));
        }
    }
}

/* acc[8 r .. 8 r + 7] (row r's float sums, lane c: weight row c) plus the decoded super-block's
 * steps against row r's 8 blocks: block g of row r at x[g * stride + r], r < R. */
static inline __attribute__((always_inline)) void q6_rows(const Q6Dec* dec, const Q6X* x, size_t stride, int R,
                                                          float* acc) {
    __m256 a[Q6R_MAX];
    for (int r = 0; r < R; r++) a[r] = _mm256_loadu_ps(acc + 8 * r);
    for (int g = 0; g < 8; g++) {
        const Q6X* xg = x + (size_t)g * stride;
        for (int h = 0; h < 2; h++) {
            __m256i s[Q6R_MAX];
            for (int r = 0; r < R; r++) s[r] = _mm256_set1_epi32(xg[r].nsx[h]);
#if EXO_AVX512VNNI || EXO_AVXVNNI
            for (int i = 0; i < 4; i++) {
                const __m256i q = _mm256_load_si256(dec->q + 8 * g + 4 * h + i);
                for (int r = 0; r < R; r++) s[r] = x86_dpbusd(s[r], q, x86_bcast4(xg[r].qs + 16 * h + 4 * i));
            }
#else
            /* two quads' vpmaddubsw sums added in int16 (at most 2 x 2 x 63 x 127 < 2^15 a lane),
             * then widened: one vpmaddwd for two quads */
            for (int i = 0; i < 4; i += 2) {
                const __m256i q = _mm256_load_si256(dec->q + 8 * g + 4 * h + i);
                const __m256i q2 = _mm256_load_si256(dec->q + 8 * g + 4 * h + i + 1);
                for (int r = 0; r < R; r++) {
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(q, x86_bcast4(xg[r].qs + 16 * h + 4 * i)),
                                                       _mm256_maddubs_epi16(q2, x86_bcast4(xg[r].qs + 16 * h + 4 * i + 4)));
                    s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
                }
            }
#endif
            const __m256 dsc = _mm256_load_ps((const float*)(dec->dsc + 2 * g + h));
            for (int r = 0; r < R; r++) {
                const __m256 t = _mm256_mul_ps(dsc, _mm256_set1_ps(xg[r].d));
                a[r] = _mm256_add_ps(a[r], _mm256_mul_ps(t, _mm256_cvtepi32_ps(s[r])));
            }
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(acc + 8 * r, a[r]);
}

typedef void (*Q6Rows)(const Q6Dec* dec, const Q6X* x, size_t stride, float* acc);
#define Q6_COPY(R)                                                                                    \
    static __attribute__((noinline)) void q6_rows_##R(const Q6Dec* dec, const Q6X* x, size_t stride, \
                                                      float* acc) {                                  \
        q6_rows(dec, x, stride, R, acc);                                                              \
    }
Q6_COPY(1)
Q6_COPY(2)
Q6_COPY(3)
Q6_COPY(4)
#if EXO_AVX512VNNI
Q6_COPY(5)
Q6_COPY(6)
Q6_COPY(7)
Q6_COPY(8)
static const Q6Rows Q6_ROWS[Q6R_MAX] = {q6_rows_1, q6_rows_2, q6_rows_3, q6_rows_4,
                                        q6_rows_5, q6_rows_6, q6_rows_7, q6_rows_8};
#else
static const Q6Rows Q6_ROWS[Q6R_MAX] = {q6_rows_1, q6_rows_2, q6_rows_3, q6_rows_4};
#endif

#if EXO_AVX512VNNI
/* Two groups' super-blocks decoded side by side (q6_decode's vectors at 512 bits): lanes 0..7 weight
 * rows c of the first group, lanes 8..15 those of the second. */
typedef struct {
    __m512i q[64];
    __m512 dsc[16];
} Q6Dec2;

/* x86_row_quad of two chunks at once: quad `quad` of chunk a in the low 256 bits, of chunk b in the high. */
static inline __attribute__((always_inline)) __m512i q6_quad2(const uint8_t* a, const uint8_t* b, int quad) {
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(a + 32 * quad))),
                                         _mm256_loadu_si256((const __m256i*)(b + 32 * quad)), 1);
    const __m512i order = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15));
    return _mm512_shuffle_epi8(_mm512_permutex_epi64(v, 0xD8), order);
}

/* Super-blocks `ba` and `bb` of two groups decoded (q6_decode's steps, the same floats and values). */
static void q6_decode2(const uint8_t* ba, const uint8_t* bb, Q6Dec2* o) {
    const __m256i dh = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)ba)),
                                               _mm_loadu_si128((const __m128i*)bb), 1);
    const __m512 d = _mm512_cvtph_ps(dh);
    for (int j = 0; j < 16; j++) {
        const size_t at = offsetof(BlockQ6Kx8, scales) + 8 * (size_t)j;
        const __m128i sc =
            _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)(ba + at)), _mm_loadl_epi64((const __m128i*)(bb + at)));
        o->dsc[j] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
    }
    const __m512i low = _mm512_set1_epi8(15), b01 = _mm512_set1_epi8(3), b23 = _mm512_set1_epi8(12);
    const __m512i b45 = _mm512_set1_epi8(48);
    for (int n = 0; n < 2; n++) {
        const size_t l0 = offsetof(BlockQ6Kx8, ql) + 256 * (size_t)(2 * n), l1 = l0 + 256;
        const size_t hq = offsetof(BlockQ6Kx8, qh) + 256 * (size_t)n;
        __m512i* q = o->q + 32 * n;
        for (int quad = 0; quad < 8; quad++) {
            const __m512i a = q6_quad2(ba + l0, bb + l0, quad), b = q6_quad2(ba + l1, bb + l1, quad);
            const __m512i hb = q6_quad2(ba + hq, bb + hq, quad);
            q[quad] = _mm512_or_si512(_mm512_and_si512(a, low), _mm512_slli_epi16(_mm512_and_si512(hb, b01), 4));
            q[8 + quad] = _mm512_or_si512(_mm512_and_si512(b, low), _mm512_slli_epi16(_mm512_and_si512(hb, b23), 2));
            q[16 + quad] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), low), _mm512_and_si512(hb, b45));
            q[24 + quad] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b, 4), low),
                                           _mm512_and_si512(_mm512_srli_epi16(hb, 2), b45));
        }
    }
}

/* q6_rows over two decoded groups: acc[16 r .. 16 r + 15] (lane c: the first group's weight row c,
 * 8 + c: the second's), r < R. */
static inline __attribute__((always_inline)) void q6_rows2(const Q6Dec2* dec, const Q6X* x, size_t stride, int R,
                                                           float* acc) {
    __m512 a[Q6R_MAX];
    for (int r = 0; r < R; r++) a[r] = _mm512_loadu_ps(acc + 16 * r);
    for (int g = 0; g < 8; g++) {
        const Q6X* xg = x + (size_t)g * stride;
        for (int h = 0; h < 2; h++) {
            __m512i s[Q6R_MAX];
            for (int r = 0; r < R; r++) s[r] = _mm512_set1_epi32(xg[r].nsx[h]);
            for (int i = 0; i < 4; i++) {
                const __m512i q = _mm512_load_si512(dec->q + 8 * g + 4 * h + i);
                for (int r = 0; r < R; r++) {
                    int32_t v;
                    memcpy(&v, xg[r].qs + 16 * h + 4 * i, sizeof v);
                    s[r] = _mm512_dpbusd_epi32(s[r], q, _mm512_set1_epi32(v));
                }
            }
            const __m512 dsc = _mm512_load_ps((const float*)(dec->dsc + 2 * g + h));
            for (int r = 0; r < R; r++) {
                const __m512 t = _mm512_mul_ps(dsc, _mm512_set1_ps(xg[r].d));
                a[r] = _mm512_add_ps(a[r], _mm512_mul_ps(t, _mm512_cvtepi32_ps(s[r])));
            }
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(acc + 16 * r, a[r]);
}

typedef void (*Q6Rows2)(const Q6Dec2* dec, const Q6X* x, size_t stride, float* acc);
#define Q6_COPY2(R)                                                                                     \
    static __attribute__((noinline)) void q6_rows2_##R(const Q6Dec2* dec, const Q6X* x, size_t stride, \
                                                       float* acc) {                                   \
        q6_rows2(dec, x, stride, R, acc);                                                               \
    }
Q6_COPY2(1)
Q6_COPY2(2)
Q6_COPY2(3)
Q6_COPY2(4)
Q6_COPY2(5)
Q6_COPY2(6)
Q6_COPY2(7)
Q6_COPY2(8)
static const Q6Rows2 Q6_ROWS2[Q6R_MAX] = {q6_rows2_1, q6_rows2_2, q6_rows2_3, q6_rows2_4,
                                          q6_rows2_5, q6_rows2_6, q6_rows2_7, q6_rows2_8};

/* The M rows of xt over the groups at `ga` and `gb` into acc[16 m + c] (c < 8: ga's weight row c,
 * else gb's row c - 8). */
static void q6_pair(const uint8_t* ga, const uint8_t* gb, int nb, const Q6X* xt, int M,
                    float* acc) {
    Q6Dec2 dec;
    memset(acc, 0, sizeof(float) * 16 * (size_t)M);
    for (int b0 = 0; b0 < nb; b0 += 8) {
        const size_t at = (size_t)(b0 / 8) * sizeof(BlockQ6Kx8);
        q6_prefetch(ga + at); /* and the next super-blocks, in these longer passes: see q6_prefetch */
        q6_prefetch(gb + at);
        x86_prefetch_at((uintptr_t)(ga + at) + sizeof(BlockQ6Kx8), sizeof(BlockQ6Kx8));
        x86_prefetch_at((uintptr_t)(gb + at) + sizeof(BlockQ6Kx8), sizeof(BlockQ6Kx8));
        q6_decode2(ga + at, gb + at, &dec);
        const Q6X* x = xt + (size_t)b0 * M;
        for (int m = 0; m < M;) {
            const int R = M - m >= Q6R_MAX ? Q6R_MAX : M - m;
            Q6_ROWS2[R - 1](&dec, x + m, (size_t)M, acc + 16 * (size_t)m);
            m += R;
        }
    }
}
#endif

/* The pass's activation rows re-laid block-major: block b of row m (from m0) at xt[b M + m]. */
static void q6_relay(const Run* r, int M, Q6X* xt) {
    for (int m = 0; m < M; m++) {
        const BlockX8* x = r->x8 + (size_t)(r->m0 + m) * r->nb;
        for (int b = 0; b < r->nb; b++) {
            Q6X* o = xt + (size_t)b * M + m;
            memcpy(o->qs, x[b].qs, sizeof o->qs);
            o->d = x[b].d;
            for (int h = 0; h < 2; h++) {
                int32_t s = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) s += x[b].qs[l];
                o->nsx[h] = -32 * s;
            }
        }
    }
}

/* The M rows of xt over the group at `grp` into acc[8 m + c] (weight row c). */
static void q6_group(const uint8_t* grp, int nb, const Q6X* xt, int M, float* acc) {
    Q6Dec dec;
    memset(acc, 0, sizeof(float) * 8 * (size_t)M);
    for (int b0 = 0; b0 < nb; b0 += 8) {
        const uint8_t* blk = grp + (size_t)(b0 / 8) * sizeof(BlockQ6Kx8);
        q6_prefetch(blk);
        q6_decode(blk, &dec);
        const Q6X* x = xt + (size_t)b0 * M;
        for (int m = 0; m < M;) {
            const int R = M - m >= Q6R_MAX ? Q6R_MAX : M - m;
            Q6_ROWS[R - 1](&dec, x + m, (size_t)M, acc + 8 * (size_t)m);
            m += R;
        }
    }
}

int exo_x86_grouped8_q6_k_rows(const Run* r) {
    const int M = r->m1 - r->m0;
    Q6X* xt = malloc(sizeof(Q6X) * (size_t)M * r->nb + sizeof(float) * 16 * (size_t)M);
    if (xt == NULL) return -1;
    float* acc = (float*)(xt + (size_t)M * r->nb);
    q6_relay(r, M, xt);
    int n = r->lo;
#if EXO_AVX512VNNI
    for (; M >= Q6_PAIR_FROM_ROWS && n + 16 <= r->hi; n += 16) {
        q6_pair(run_row(r, n), run_row(r, n + 8), r->nb, xt, M, acc);
        for (int m = 0; m < M; m++)
            for (int c = 0; c < 16; c++) run_store(r, r->m0 + m, n + c, acc[16 * m + c]);
    }
#endif
    for (; n < r->hi; n += 8) {
        q6_group(run_row(r, n), r->nb, xt, M, acc);
        for (int m = 0; m < M; m++)
            for (int c = 0; c < 8; c++) run_store(r, r->m0 + m, n + c, acc[8 * m + c]);
    }
    free(xt);
    return 0;
}
#endif
