/* issue 22 q5dots: AVX2 / AVX-VNNI / AVX-512 VNNI dots of Q5_0, Q5_1 and Q5_K weights with 8-bit
 * activations, 8 file rows at a time (below) and the rows left per row (1 or 4 activation rows a
 * pass), in act8_q5.h's order. A block's values
 * 0..31 (nibble | fifth bit << 4) times the int8 activations by vpmaddubsw + vpmaddwd (AVX2) or
 * vpdpbusd (VNNI builds): an exact integer sum, then the scalar float steps. Q5_0's repacked
 * groups: arch/x86/grouped8_q5.c. */
#include "act8_q5.h"

#if EXO_AVX2
#include "arch/x86/x86.h"

static inline int32_t q5_hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* A Q5_0 / Q5_1 block's 32 values as bytes, in value order: byte j = 16 if bit j of qh is set,
 * or'ed with the nibbles. */
static inline __m256i q5_values(const uint8_t qh[4], const uint8_t qs[16]) {
    const __m128i b = _mm_loadu_si128((const __m128i*)qs);
    const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(15));
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)q5_bits(qh)),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                                                2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(16)));
}

/* One Q5_0 (or Q5_1 if has_m) weight row against R = 1 or 4 activation rows (stride nb). */
static inline __attribute__((always_inline)) void row_q5(const uint8_t* w, const BlockX8* x, int nb, int R,
                                                         int has_m, float* out) {
    float acc[4] = {0};
    for (int b = 0; b < nb; b++) {
        float d, m;
        __m256i wv;
        if (has_m) {
            const BlockQ5_1* wb = (const BlockQ5_1*)w + b;
            d = exo_h2f(wb->d), m = exo_h2f(wb->m), wv = q5_values(wb->qh, wb->qs);
        } else {
            const BlockQ5_0* wb = (const BlockQ5_0*)w + b;
            d = exo_h2f(wb->d), m = q5_0_min(wb), wv = q5_values(wb->qh, wb->qs);
        }
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
            acc[r] = act8_step(acc[r], d, m, xb, q5_hsum(x86_dot_u8s8(wv, _mm256_loadu_si256((const __m256i*)xb->qs))));
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* One Q5_K weight row against R = 1 or 4 activation rows: a 32-byte chunk of nibbles is sub-blocks
 * j (low) and j + 1 (high); bits j and j + 1 of qh's 32 bytes are their fifth bits. */
static inline __attribute__((always_inline)) void row_q5k(const uint8_t* w, const BlockX8* x, int nb, int R,
                                                          float* out) {
    float acc[4] = {0};
    const __m256i low = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int b = 0; b < nb; b += 2) {
        const BlockQ5K* wb = (const BlockQ5K*)w + b / 8;
        const int j = b % 8;
        float d0, m0, d1, m1;
        q5k_sub(wb->scales, wb->d, wb->dmin, j, &d0, &m0);
        q5k_sub(wb->scales, wb->d, wb->dmin, j + 1, &d1, &m1);
        const __m256i v = _mm256_loadu_si256((const __m256i*)(wb->qs + 16 * j));
        const __m256i h = _mm256_loadu_si256((const __m256i*)wb->qh);
        const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j), one), 4);
        const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j + 1), one), 4);
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, low), h0);
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), h1);
        for (int r = 0; r < R; r++) {
            const BlockX8* xb = x + (size_t)r * nb + b;
            const int32_t i0 = q5_hsum(x86_dot_u8s8(lo, _mm256_loadu_si256((const __m256i*)xb[0].qs)));
            const int32_t i1 = q5_hsum(x86_dot_u8s8(hi, _mm256_loadu_si256((const __m256i*)xb[1].qs)));
            acc[r] = act8_step(act8_step(acc[r], d0, m0, xb, i0), d1, m1, xb + 1, i1);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* kind: 0 Q5_0, 1 Q5_1, 2 Q5_K (a constant at each use) */
static inline __attribute__((always_inline)) int run_q5(const Run* r, int kind) {
    float out[4];
    for (int n = r->lo; n < r->hi; n++) {
        const uint8_t* wr = run_row(r, n);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= 4 ? 4 : 1;
            const BlockX8* x = r->x8 + (size_t)m * r->nb;
            if (kind == 2) row_q5k(wr, x, r->nb, R, out);
            else row_q5(wr, x, r->nb, R, kind, out);
            for (int i = 0; i < R; i++) run_store(r, m + i, n, out[i]);
            m += R;
        }
    }
    return 0;
}

/* ---- 8 file rows at once, a lane per row (no repacked layout needed): each row's block sums by
 * one vpdpbusd (or vpmaddubsw + vpmaddwd) per row, the 8 rows' vectors reduced into one (lane c =
 * row c's exact sum), then the float steps of the 8 rows as vectors: per lane, act8_q5.h's order. */

/* The 8 rows after this octet's (rows n + 8 .. n + 15), `bytes` of each from offset `at` of the
 * octet's block pointer, into the cache: the hardware prefetchers do not follow 8 rows read block
 * by block (weights not in cache ran 2x slower without). A hint: it never faults, even past the
 * weights' end (the address is computed as an integer). */
static inline __attribute__((always_inline)) void q5_prefetch_next(const uint8_t* blk, int rb, int bytes) {
    const uintptr_t next = (uintptr_t)blk + 8 * (uintptr_t)rb;
    for (int c = 0; c < 8; c++)
        for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char*)(next + (uintptr_t)c * (uintptr_t)rb + (uintptr_t)o), _MM_HINT_T0);
}

/* lane c = the sum of p[c]'s 8 lanes */
static inline __attribute__((always_inline)) __m256i q5_reduce8(const __m256i* p) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* the 8 rows' half-floats at bits 0..15 (hi: 16..31) of the lanes of v, as floats */
static inline __m256 q5_halves(__m256i v, int hi) {
    const __m256i h = hi ? _mm256_srli_epi32(v, 16) : _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
}

/* byte k (0..11) of the 8 rows' scale bytes (s: their dwords 0, 1, 2), a lane per row */
static inline __m256i q5_scale_byte(const __m256i* s, int k) {
    return _mm256_and_si256(_mm256_srli_epi32(s[k / 4], 8 * (k % 4)), _mm256_set1_epi32(0xFF));
}

/* sub-block j's d sc_j and dmin m_j of the 8 rows (q5k_sub's floats; the step subtracts dm s) */
static inline void q5k_scales8(const __m256i* s, __m256 d, __m256 dmin, int j, __m256* dsc, __m256* dm) {
    const __m256i six = _mm256_set1_epi32(63), four = _mm256_set1_epi32(15);
    __m256i sc, mn;
    if (j < 4) {
        sc = _mm256_and_si256(q5_scale_byte(s, j), six);
        mn = _mm256_and_si256(q5_scale_byte(s, j + 4), six);
    } else {
        const __m256i b = q5_scale_byte(s, j + 4);
        sc = _mm256_or_si256(_mm256_and_si256(b, four), _mm256_slli_epi32(_mm256_srli_epi32(q5_scale_byte(s, j - 4), 6), 4));
        mn = _mm256_or_si256(_mm256_srli_epi32(b, 4), _mm256_slli_epi32(_mm256_srli_epi32(q5_scale_byte(s, j), 6), 4));
    }
    *dsc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
    *dm = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn));
}

/* acc + (dsc d_x) i - dm s_x per lane (act8_step's order; minus dm s is plus -(dm) s exactly) */
static inline __m256 q5_step8(__m256 acc, __m256 dsc, __m256 dm, const BlockX8* xb, __m256i isum) {
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dsc, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(isum)));
    return _mm256_sub_ps(acc, _mm256_mul_ps(dm, _mm256_set1_ps(xb->s)));
}

/* the 8 rows' isum vectors of 32 values each (w[c]) against one activation block */
static inline __attribute__((always_inline)) __m256i q5_octet_isum(const __m256i* w, const int8_t* xq) {
    const __m256i x = _mm256_loadu_si256((const __m256i*)xq);
    __m256i p[8];
    for (int c = 0; c < 8; c++) p[c] = x86_dot_u8s8(w[c], x);
    return q5_reduce8(p);
}

/* Q5_K rows n .. n + 7 against activation rows m .. m + R - 1 (R <= 4): out[r] lane c. */
static inline __attribute__((always_inline)) void octet_q5k(const Run* r, int n, const BlockX8* x, int R,
                                                            __m256* out) {
    const uint8_t* w0 = run_row(r, n);
    const int rb = (int)r->rb;
    const __m256i at = _mm256_setr_epi32(0, rb, 2 * rb, 3 * rb, 4 * rb, 5 * rb, 6 * rb, 7 * rb);
    const __m256i low = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    __m256 acc[4];
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    for (int b = 0; b < r->nb; b += 8) {
        const uint8_t* blk = w0 + (size_t)(b / 8) * sizeof(BlockQ5K);
        q5_prefetch_next(blk, rb, (int)sizeof(BlockQ5K));
        const __m256i dd = _mm256_i32gather_epi32((const int*)(const void*)blk, at, 1);
        __m256i s[3];
        for (int k = 0; k < 3; k++) s[k] = _mm256_i32gather_epi32((const int*)(const void*)(blk + 4 + 4 * k), at, 1);
        const __m256 d = q5_halves(dd, 0), dmin = q5_halves(dd, 1);
        for (int j = 0; j < 8; j += 2) {
            __m256i lo[8], hi[8];
            for (int c = 0; c < 8; c++) {
                const BlockQ5K* wb = (const BlockQ5K*)(const void*)(blk + (size_t)c * (size_t)rb);
                const __m256i v = _mm256_loadu_si256((const __m256i*)(wb->qs + 16 * j));
                const __m256i h = _mm256_loadu_si256((const __m256i*)wb->qh);
                lo[c] = _mm256_or_si256(_mm256_and_si256(v, low),
                                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j), one), 4));
                hi[c] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j + 1), one), 4));
            }
            __m256 dsc0, dm0, dsc1, dm1;
            q5k_scales8(s, d, dmin, j, &dsc0, &dm0);
            q5k_scales8(s, d, dmin, j + 1, &dsc1, &dm1);
            for (int i = 0; i < R; i++) {
                const BlockX8* xb = x + (size_t)i * r->nb + b + j;
                const __m256i i0 = q5_octet_isum(lo, xb[0].qs), i1 = q5_octet_isum(hi, xb[1].qs);
                acc[i] = q5_step8(q5_step8(acc[i], dsc0, dm0, xb, i0), dsc1, dm1, xb + 1, i1);
            }
        }
    }
    for (int i = 0; i < R; i++) out[i] = acc[i];
}

/* Q5_0 (Q5_1 if has_m) rows n .. n + 7 against activation rows m .. m + R - 1 (R <= 4). */
static inline __attribute__((always_inline)) void octet_q5(const Run* r, int n, const BlockX8* x, int R, int has_m,
                                                           __m256* out) {
    const uint8_t* w0 = run_row(r, n);
    const int rb = (int)r->rb;
    const __m256i at = _mm256_setr_epi32(0, rb, 2 * rb, 3 * rb, 4 * rb, 5 * rb, 6 * rb, 7 * rb);
    const size_t bytes = has_m ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0);
    __m256 acc[4];
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    for (int b = 0; b < r->nb; b++) {
        const uint8_t* blk = w0 + (size_t)b * bytes;
        if (b % 2 == 0) q5_prefetch_next(blk, rb, 1); /* a line per row every 2 blocks (< 64 bytes) */
        __m256i w[8];
        for (int c = 0; c < 8; c++) {
            const uint8_t* row = blk + (size_t)c * (size_t)rb;
            w[c] = has_m ? q5_values(((const BlockQ5_1*)(const void*)row)->qh, ((const BlockQ5_1*)(const void*)row)->qs)
                         : q5_values(((const BlockQ5_0*)(const void*)row)->qh, ((const BlockQ5_0*)(const void*)row)->qs);
        }
        const __m256i dm = _mm256_i32gather_epi32((const int*)(const void*)blk, at, 1);
        const __m256 d = q5_halves(dm, 0);
        const __m256 m = has_m ? q5_halves(dm, 1) : _mm256_mul_ps(_mm256_set1_ps(-16.0f), d);
        for (int i = 0; i < R; i++) {
            const BlockX8* xb = x + (size_t)i * r->nb + b;
            const __m256i isum = q5_octet_isum(w, xb->qs);
            acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(isum)));
            acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(m, _mm256_set1_ps(xb->s)));
        }
    }
    for (int i = 0; i < R; i++) out[i] = acc[i];
}

#define Q5_OCTET(name, R, has_m)                                                                  \
    static __attribute__((noinline)) void name##_##R(const Run* r, int n, const BlockX8* x, __m256* out) { \
        octet_q5(r, n, x, R, has_m, out);                                                         \
    }
Q5_OCTET(octet_q50, 1, 0)
Q5_OCTET(octet_q50, 2, 0)
Q5_OCTET(octet_q50, 3, 0)
Q5_OCTET(octet_q50, 4, 0)
Q5_OCTET(octet_q51, 1, 1)
Q5_OCTET(octet_q51, 2, 1)
Q5_OCTET(octet_q51, 3, 1)
Q5_OCTET(octet_q51, 4, 1)

#define Q5K_OCTET(R)                                                                              \
    static __attribute__((noinline)) void octet_q5k_##R(const Run* r, int n, const BlockX8* x, __m256* out) { \
        octet_q5k(r, n, x, R, out);                                                               \
    }
Q5K_OCTET(1)
Q5K_OCTET(2)
Q5K_OCTET(3)
Q5K_OCTET(4)

typedef void (*Q5Octet)(const Run* r, int n, const BlockX8* x, __m256* out);

/* Octets of rows by `k` (index R - 1), the rows left (fewer than 8) by the per-row dot. */
static int run_octets(const Run* r, const Q5Octet* k, int kind) {
    __m256 acc[4];
    float o[4 * 8];
    int n = r->lo;
    for (; n + 8 <= r->hi; n += 8)
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= 4 ? 4 : r->m1 - m;
            k[R - 1](r, n, r->x8 + (size_t)m * r->nb, acc);
            for (int i = 0; i < R; i++) _mm256_storeu_ps(o + 8 * i, acc[i]);
            for (int i = 0; i < R; i++)
                for (int c = 0; c < 8; c++) run_store(r, m + i, n + c, o[8 * i + c]);
            m += R;
        }
    if (n == r->hi) return 0;
    Run rest = *r;
    rest.lo = n;
    return run_q5(&rest, kind);
}

int exo_x86_dot8_q5_0(const Run* r) {
    static const Q5Octet k[] = {octet_q50_1, octet_q50_2, octet_q50_3, octet_q50_4};
    return run_octets(r, k, 0);
}
int exo_x86_dot8_q5_1(const Run* r) {
    static const Q5Octet k[] = {octet_q51_1, octet_q51_2, octet_q51_3, octet_q51_4};
    return run_octets(r, k, 1);
}
int exo_x86_dot8_q5_k(const Run* r) {
    static const Q5Octet k[] = {octet_q5k_1, octet_q5k_2, octet_q5k_3, octet_q5k_4};
    return run_octets(r, k, 2);
}

#endif
