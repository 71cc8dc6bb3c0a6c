/* Several activation rows (batched decode, prefill) times 8 weight rows at once, with the 8
 * weight rows' values interleaved so that vector lane c holds weight row c (AVX2 only;
 * included by linear.c).
 *
 * Why: dotting one weight row with one activation row leaves 8 int32 lanes to be converted,
 * scaled (a scalar d_w d_x broadcast) and summed per 32-value block: that float tail costs as
 * much as the multiply-adds. With the lanes as 8 weight rows, one multiply-add of a broadcast
 * activation pair (x_2j, x_2j+1) gives 8 rows' partial sums, and one convert and one FMA with
 * a vector of the 8 rows' block scales finishes a block for all 8.
 *
 * The tile: per 32-value block b, 16 vectors (pair j: lane c = the int16 pair (q_c,2j, q_c,2j+1)
 * of weight row c) and per row c the block's scale d (d2: the scale of values 16..31 where it
 * differs, Q6_K's 16-value sub-blocks) and offset m (w = d q + m). Every layout unpacks to it:
 * Q4_1, Q8_0, Q5_0 (q - 16, no offset), Q5_1, Q4_K / Q5_K (d sc, -dmin m per sub-block) and
 * Q6_K ((q - 32), d sc per 16 values). The tile is built once per 8 weight rows and used by
 * every activation row of the pass. Integer sums per lane stay below 2^31: 32 products of
 * |q| <= 128 and |x| <= 32767.
 */
#include "exo_kernels.h" /* and dot_kquants.h before it (q4k_scale_min) */

#if EXO_AVX2
#define TILE_COLS 8

typedef struct {
    __m256i* q; /* [nb * 16] */
    float* d;   /* [nb * 8]: scale of values 0..15 (and 16..31 unless `halves`) */
    float* d2;  /* [nb * 8]: scale of values 16..31 (Q6_K) */
    float* m;   /* [nb * 8]: offset per value */
} Tile;

static inline size_t tile_bytes(int nb) { return (size_t)nb * (16 * sizeof(__m256i) + 3 * TILE_COLS * sizeof(float)); }

static inline Tile tile_at(void* buf, int nb) {
    char* p = (char*)buf;
    Tile t;
    t.q = (__m256i*)p;
    t.d = (float*)(p + (size_t)nb * 16 * sizeof(__m256i));
    t.d2 = t.d + (size_t)nb * TILE_COLS;
    t.m = t.d2 + (size_t)nb * TILE_COLS;
    return t;
}

static inline int tile_has_m(int kind) {
    return kind == KIND_Q4 || kind == KIND_Q5_1 || kind == KIND_Q4_K || kind == KIND_Q5_K;
}

/* Block b (32 values) of weight row `row` in layout `kind` -> int16 q[32], d, d2, m. */
static inline __attribute__((always_inline)) void unpack_block32(int kind, const uint8_t* row, int b, int16_t* q, float* d, float* d2, float* m) {
    const __m256i low = _mm256_set1_epi16(0x0F), sixteen = _mm256_set1_epi16(16);
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                          4096, 8192, 16384, (short)0x8000);
    __m256i q0, q1;
    if (kind == KIND_Q8) {
        const BlockQ8* w = (const BlockQ8*)row + b;
        q0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w->qs));
        q1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w->qs + 16)));
        *d = *d2 = exo_h2f(w->d);
        *m = 0.0f;
    } else if (kind == KIND_Q4) {
        const BlockQ4* w = (const BlockQ4*)row + b;
        const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)w->qs));
        q0 = _mm256_and_si256(bytes, low);
        q1 = _mm256_srli_epi16(bytes, 4);
        *d = *d2 = exo_h2f(w->d);
        *m = exo_h2f(w->m);
    } else if (kind == KIND_Q5_0 || kind == KIND_Q5_1) {
        const int has_m = kind == KIND_Q5_1;
        const uint8_t* blk = row + (size_t)b * (has_m ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0));
        uint16_t d16, m16;
        uint32_t qh;
        memcpy(&d16, blk, 2);
        memcpy(&m16, blk + 2, 2);
        memcpy(&qh, blk + (has_m ? 4 : 2), 4);
        const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(blk + (has_m ? 8 : 6))));
        const __m256i h0 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(qh & 0xFFFF)), bit), bit);
        const __m256i h1 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)(qh >> 16)), bit), bit);
        const __m256i n0 = _mm256_and_si256(bytes, low), n1 = _mm256_srli_epi16(bytes, 4);
        q0 = has_m ? _mm256_or_si256(n0, _mm256_and_si256(h0, sixteen))
                   : _mm256_add_epi16(n0, _mm256_andnot_si256(h0, _mm256_set1_epi16(-16)));
        q1 = has_m ? _mm256_or_si256(n1, _mm256_and_si256(h1, sixteen))
                   : _mm256_add_epi16(n1, _mm256_andnot_si256(h1, _mm256_set1_epi16(-16)));
        *d = *d2 = exo_h2f(d16);
        *m = has_m ? exo_h2f(m16) : 0.0f;
    } else if (kind == KIND_Q4_K || kind == KIND_Q5_K) {
        const int five = kind == KIND_Q5_K;
        const uint8_t* blk = row + (size_t)(b / 8) * (five ? sizeof(BlockQ5K) : sizeof(BlockQ4K));
        const int j = b % 8, c = j / 2;
        uint16_t d16, dmin16;
        memcpy(&d16, blk, 2);
        memcpy(&dmin16, blk + 2, 2);
        int sc, mn;
        q4k_scale_min(blk + 4, j, &sc, &mn);
        const uint8_t* qs = blk + 16 + (five ? 32 : 0);
        const __m256i bytes = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
        __m256i v = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0F));
        if (five) {
            const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i*)(blk + 16)), j),
                                                _mm256_set1_epi8(1));
            v = _mm256_or_si256(v, _mm256_slli_epi16(hb, 4));
        }
        q0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v));
        q1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1));
        *d = *d2 = exo_h2f(d16) * (float)sc;
        *m = -exo_h2f(dmin16) * (float)mn;
    } else { /* Q6_K */
        const BlockQ6K* w = (const BlockQ6K*)row + b / 8;
        const int g = b % 8, n = g / 4, k = g % 4;
        const __m256i vl = _mm256_loadu_si256((const __m256i*)(w->ql + 64 * n + 32 * (k & 1)));
        const __m256i vh = _mm256_loadu_si256((const __m256i*)(w->qh + 32 * n));
        const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(vl, 4) : vl, _mm256_set1_epi8(0x0F));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(vh, 2 * k), _mm256_set1_epi8(0x03));
        const __m256i v = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
        q0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
        q1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
        const float dd = exo_h2f(w->d);
        *d = dd * (float)w->scales[2 * g];
        *d2 = dd * (float)w->scales[2 * g + 1];
        *m = 0.0f;
    }
    _mm256_storeu_si256((__m256i*)q, q0);
    _mm256_storeu_si256((__m256i*)(q + 16), q1);
}

/* Transpose 8 vectors of 8 int32: out[i] lane c = in[c] lane i. */
static inline void transpose8x8(const __m256i* in, __m256i* out) {
    const __m256i t0 = _mm256_unpacklo_epi32(in[0], in[1]), t1 = _mm256_unpackhi_epi32(in[0], in[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(in[2], in[3]), t3 = _mm256_unpackhi_epi32(in[2], in[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(in[4], in[5]), t5 = _mm256_unpackhi_epi32(in[4], in[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(in[6], in[7]), t7 = _mm256_unpackhi_epi32(in[6], in[7]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    _mm256_storeu_si256(out + 0, _mm256_permute2x128_si256(u0, u4, 0x20));
    _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(u1, u5, 0x20));
    _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(u2, u6, 0x20));
    _mm256_storeu_si256(out + 3, _mm256_permute2x128_si256(u3, u7, 0x20));
    _mm256_storeu_si256(out + 4, _mm256_permute2x128_si256(u0, u4, 0x31));
    _mm256_storeu_si256(out + 5, _mm256_permute2x128_si256(u1, u5, 0x31));
    _mm256_storeu_si256(out + 6, _mm256_permute2x128_si256(u2, u6, 0x31));
    _mm256_storeu_si256(out + 7, _mm256_permute2x128_si256(u3, u7, 0x31));
}

/* The tile of 8 weight rows (rows[c], layout `kind`, nb blocks of 32). */
static inline __attribute__((always_inline)) void tile_build_kind(int kind, const uint8_t* const* rows, int nb, Tile t) {
    int16_t buf[TILE_COLS * QK] __attribute__((aligned(32)));
    for (int b = 0; b < nb; b++) {
        for (int c = 0; c < TILE_COLS; c++)
            unpack_block32(kind, rows[c], b, buf + c * QK, t.d + (size_t)b * TILE_COLS + c,
                           t.d2 + (size_t)b * TILE_COLS + c, t.m + (size_t)b * TILE_COLS + c);
        __m256i lo[TILE_COLS], hi[TILE_COLS];
        for (int c = 0; c < TILE_COLS; c++) {
            lo[c] = _mm256_load_si256((const __m256i*)(buf + c * QK));
            hi[c] = _mm256_load_si256((const __m256i*)(buf + c * QK + 16));
        }
        transpose8x8(lo, t.q + (size_t)b * 16);
        transpose8x8(hi, t.q + (size_t)b * 16 + 8);
    }
}

/* An empty asm that "changes" v: the compiler keeps each sum a running chain in a register
 * (left alone, it reassociates the 16 adds into a tree and spills the products to the stack). */
#define TILE_KEEP(v) __asm__("" : "+x"(v))

static void tile_build(int kind, const uint8_t* const* rows, int nb, Tile t) {
    switch (kind) { /* one copy per layout: the unpacking specialises */
        case KIND_Q4: tile_build_kind(KIND_Q4, rows, nb, t); break;
        case KIND_Q8: tile_build_kind(KIND_Q8, rows, nb, t); break;
        case KIND_Q5_0: tile_build_kind(KIND_Q5_0, rows, nb, t); break;
        case KIND_Q5_1: tile_build_kind(KIND_Q5_1, rows, nb, t); break;
        case KIND_Q4_K: tile_build_kind(KIND_Q4_K, rows, nb, t); break;
        case KIND_Q5_K: tile_build_kind(KIND_Q5_K, rows, nb, t); break;
        default: tile_build_kind(KIND_Q6_K, rows, nb, t);
    }
}

/* pairs j0..j0+7 of block b against R activation rows: s[r] += sum over lanes of 8 rows */
#define TILE_PAIRS(s, j0)                                                                         \
    for (int j = j0; j < (j0) + 8; j++) {                                                        \
        const __m256i w = _mm256_loadu_si256(W + j);                                             \
        for (int r = 0; r < R; r++) {                                                            \
            int32_t xv;                                                                          \
            memcpy(&xv, x[(size_t)r * nb + b].qs + 2 * j, sizeof xv);                             \
            s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(w, _mm256_set1_epi32(xv)));          \
            TILE_KEEP(s[r]);                                                                     \
        }                                                                                        \
    }

/* out[r] lane c = dot of weight row c of the tile with activation row r (x + r * nb), R <= 4. */
static inline __attribute__((always_inline)) void tile_rows(Tile t, int nb, const BlockX* x, int R,
                                                            int has_m, int halves, __m256* out) {
    __m256 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const __m256i* W = t.q + (size_t)b * 16;
        __m256i s[4], s2[4];
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
        TILE_PAIRS(s, 0)
        if (halves) {
            for (int r = 0; r < R; r++) s2[r] = _mm256_setzero_si256();
            TILE_PAIRS(s2, 8)
        } else {
            TILE_PAIRS(s, 8)
        }
        const __m256 dv = _mm256_loadu_ps(t.d + (size_t)b * TILE_COLS);
        for (int r = 0; r < R; r++) {
            const __m256 xd = _mm256_set1_ps(x[(size_t)r * nb + b].d);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dv, xd), _mm256_cvtepi32_ps(s[r]), acc[r]);
        }
        if (halves) {
            const __m256 dv2 = _mm256_loadu_ps(t.d2 + (size_t)b * TILE_COLS);
            for (int r = 0; r < R; r++) {
                const __m256 xd = _mm256_set1_ps(x[(size_t)r * nb + b].d);
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dv2, xd), _mm256_cvtepi32_ps(s2[r]), acc[r]);
            }
        }
        if (has_m) {
            const __m256 mv = _mm256_loadu_ps(t.m + (size_t)b * TILE_COLS);
            for (int r = 0; r < R; r++)
                acc[r] = _mm256_fmadd_ps(mv, _mm256_set1_ps(x[(size_t)r * nb + b].s), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

#define TILE_ROWS_FOR(R)                                                                          \
static void tile_rows_##R(Tile t, int nb, const BlockX* x, int kind, __m256* out) {              \
    if (kind == KIND_Q6_K) tile_rows(t, nb, x, R, 0, 1, out);                                    \
    else if (tile_has_m(kind)) tile_rows(t, nb, x, R, 1, 0, out);                                \
    else tile_rows(t, nb, x, R, 0, 0, out);                                                      \
}
TILE_ROWS_FOR(1)
TILE_ROWS_FOR(2)
TILE_ROWS_FOR(3)
TILE_ROWS_FOR(4)

/* out[r] for R = 1..4 activation rows. */
static inline void tile_dot(Tile t, int nb, const BlockX* x, int kind, int R, __m256* out) {
    switch (R) {
        case 4: tile_rows_4(t, nb, x, kind, out); break;
        case 3: tile_rows_3(t, nb, x, kind, out); break;
        case 2: tile_rows_2(t, nb, x, kind, out); break;
        default: tile_rows_1(t, nb, x, kind, out);
    }
}
#endif
