/* Several activation rows (batched decode, prefill) times 8 weight rows at once, with the 8
 * weight rows' values interleaved so that vector lane c holds weight row c (AVX2).
 *
 * Why: dotting one weight row with one activation row leaves 8 int32 lanes to be converted,
 * scaled (a scalar d_w d_x broadcast) and summed per 32-value block: that float tail costs as
 * much as the multiply-adds. With the lanes as 8 weight rows, one multiply-add of a broadcast
 * activation pair (x_2j, x_2j+1) gives 8 rows' partial sums, and one convert and one FMA with
 * a vector of the 8 rows' block scales finishes a block for all 8.
 *
 * The tile: per 32-value block b, the 8 rows' values as int8 in 256 bytes (pair j of row c,
 * values 2j and 2j + 1, at bytes 32 (j % 8) + 16 (j / 8) + 2c: 16 bytes widen to the int16
 * vector of pair j), and per row c the block's scale d (d2: the scale of values 16..31 where it
 * differs, Q6_K's 16-value sub-blocks) and offset m (w = d q + m). Every layout unpacks to it:
 * Q4_0 (q - 8, no offset), Q4_1, Q8_0, Q5_0 (q - 16, no offset), Q5_1, Q4_K / Q5_K (d sc, -dmin m per sub-block) and
 * Q6_K ((q - 32), d sc per 16 values). The tile is built once per 8 weight rows and used by
 * every activation row of the pass, 4 rows at a time. Integer sums per lane stay below 2^31:
 * 32 products of |q| <= 128 and |x| <= 32767.
 */
#include "exo_kernels.h"
#if EXO_AVX2
#include "arch/x86/tile.h"
#include "arch/x86/x86.h"
#include "kinds.h"
#include "quants.h"

static inline int tile_has_m(int kind) {
    return kind == KIND_Q4_1 || kind == KIND_Q5_1 || kind == KIND_Q4_K || kind == KIND_Q5_K;
}


/* Block b (32 values) of weight row `row` in layout `kind` -> its 32 values as int8 (all fit:
 * -128..127), and its scales: the f16 bits of d and m (dh, mh) for the 32-value layouts, else
 * d, m (Q4_K, Q5_K) or d, d2 (Q6_K) as floats; a layout's unused ones are left alone. */
static inline __attribute__((always_inline)) __m256i unpack_block8(int kind, const uint8_t* row, int b, float* d,
                                                                   float* d2, float* m, uint16_t* dh, uint16_t* mh) {
    const __m128i low = _mm_set1_epi8(0x0F);
    if (kind == KIND_Q8_0) {
        const BlockQ8_0* w = (const BlockQ8_0*)row + b;
        *dh = w->d;
        return _mm256_loadu_si256((const __m256i*)w->qs);
    }
    if (kind == KIND_Q4_0) { /* q - 8, no offset */
        const BlockQ4_0* w = (const BlockQ4_0*)row + b;
        const __m128i v = _mm_loadu_si128((const __m128i*)w->qs);
        *dh = w->d;
        const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
        return _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
    }
    if (kind == KIND_Q4_1) {
        const BlockQ4_1* w = (const BlockQ4_1*)row + b;
        const __m128i v = _mm_loadu_si128((const __m128i*)w->qs);
        *dh = w->d;
        *mh = w->m;
        return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
    }
    if (kind == KIND_Q5_0 || kind == KIND_Q5_1) {
        const int has_m = kind == KIND_Q5_1;
        const uint8_t* blk = row + (size_t)b * (has_m ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0));
        uint16_t d16, m16;
        uint32_t qh;
        memcpy(&d16, blk, 2);
        memcpy(&m16, blk + 2, 2);
        memcpy(&qh, blk + (has_m ? 4 : 2), 4);
        const __m128i v = _mm_loadu_si128((const __m128i*)(blk + (has_m ? 8 : 6)));
        const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
        /* byte l gets bit l of qh: byte l of the broadcast word holds bits 8 (l / 8) .. */
        const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                                   _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL,
                                                                      0x0202020202020202LL, 0x0303030303030303LL));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        const __m256i h = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        *dh = d16;
        *mh = m16;
        /* Q5_1: q = nib | 16 h; Q5_0: q - 16 = nib + (h ? 0 : -16) */
        return has_m ? _mm256_or_si256(nib, _mm256_and_si256(h, _mm256_set1_epi8(16)))
                     : _mm256_add_epi8(nib, _mm256_andnot_si256(h, _mm256_set1_epi8(-16)));
    }
    if (kind == KIND_Q4_K || kind == KIND_Q5_K) {
        const int five = kind == KIND_Q5_K;
        const uint8_t* blk = row + (size_t)(b / 8) * (five ? sizeof(BlockQ5K) : sizeof(BlockQ4K));
        const int j = b % 8, c = j / 2;
        uint16_t d16, dmin16;
        memcpy(&d16, blk, 2);
        memcpy(&dmin16, blk + 2, 2);
        int sc, mn;
        q4k_scale_min(blk + 4, j, &sc, &mn);
        *d = exo_h2f(d16) * (float)sc;
        *m = -exo_h2f(dmin16) * (float)mn;
        const uint8_t* qs = blk + 16 + (five ? 32 : 0);
        const __m256i bytes = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
        __m256i v = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0F));
        if (five) {
            const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i*)(blk + 16)), j),
                                                _mm256_set1_epi8(1));
            v = _mm256_or_si256(v, _mm256_slli_epi16(hb, 4));
        }
        return v;
    }
    /* Q6_K */
    const BlockQ6K* w = (const BlockQ6K*)row + b / 8;
    const int g = b % 8, n = g / 4, k = g % 4;
    const __m256i vl = _mm256_loadu_si256((const __m256i*)(w->ql + 64 * n + 32 * (k & 1)));
    const __m256i vh = _mm256_loadu_si256((const __m256i*)(w->qh + 32 * n));
    const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(vl, 4) : vl, _mm256_set1_epi8(0x0F));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(vh, 2 * k), _mm256_set1_epi8(0x03));
    const float dd = exo_h2f(w->d);
    *d = dd * (float)w->scales[2 * g];
    *d2 = dd * (float)w->scales[2 * g + 1];
    return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
}

/* The f16 words at byte offsets off and off + 2 of the 8 rows' blocks (rows[c] + off) as floats:
 * d (offset off) and m (off + 2), one per lane, built in registers rather than by 16-bit stores
 * read back with one vector load (which cannot be forwarded from the stores). Used for Q4_1:
 * measured ~3% less CPU at 8 rows with weights in cache; the other layouts keep the stores
 * (Q8_0 measured no faster this way, with this for every f16 layout slower). */
static inline __attribute__((always_inline)) void tile_scales8(const uint8_t* const* rows, size_t off, __m256* d,
                                                              __m256* m) {
    int32_t w[TILE_COLS];
    for (int c = 0; c < TILE_COLS; c++) memcpy(&w[c], rows[c] + off, sizeof w[c]);
    const __m256i h = _mm256_setr_epi32(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]);
    /* per 128-bit lane: the 4 d words, then the 4 m words; then d of both lanes, m of both */
    const __m256i split = _mm256_shuffle_epi8(h, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                                                  0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
    const __m256i dm = _mm256_permute4x64_epi64(split, 0xD8); /* qwords 0, 2, 1, 3 */
    *d = _mm256_cvtph_ps(_mm256_castsi256_si128(dm));
    *m = _mm256_cvtph_ps(_mm256_extracti128_si256(dm, 1));
}

/* An 8 x 8 transpose of 16-bit words within each 128-bit lane: word c of v[i] = word i of q[c]. */
static inline __attribute__((always_inline)) void transpose8_words(const __m256i q[8], __m256i v[8]) {
    const __m256i t0 = _mm256_unpacklo_epi16(q[0], q[1]), t1 = _mm256_unpackhi_epi16(q[0], q[1]);
    const __m256i t2 = _mm256_unpacklo_epi16(q[2], q[3]), t3 = _mm256_unpackhi_epi16(q[2], q[3]);
    const __m256i t4 = _mm256_unpacklo_epi16(q[4], q[5]), t5 = _mm256_unpackhi_epi16(q[4], q[5]);
    const __m256i t6 = _mm256_unpacklo_epi16(q[6], q[7]), t7 = _mm256_unpackhi_epi16(q[6], q[7]);
    const __m256i u0 = _mm256_unpacklo_epi32(t0, t2), u1 = _mm256_unpackhi_epi32(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi32(t1, t3), u3 = _mm256_unpackhi_epi32(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi32(t4, t6), u5 = _mm256_unpackhi_epi32(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi32(t5, t7), u7 = _mm256_unpackhi_epi32(t5, t7);
    v[0] = _mm256_unpacklo_epi64(u0, u4), v[1] = _mm256_unpackhi_epi64(u0, u4);
    v[2] = _mm256_unpacklo_epi64(u1, u5), v[3] = _mm256_unpackhi_epi64(u1, u5);
    v[4] = _mm256_unpacklo_epi64(u2, u6), v[5] = _mm256_unpackhi_epi64(u2, u6);
    v[6] = _mm256_unpacklo_epi64(u3, u7), v[7] = _mm256_unpackhi_epi64(u3, u7);
}

/* The tile of 8 weight rows (rows[c], layout `kind`, nb blocks of 32): per block, 8 vectors v_j
 * whose low 128-bit lane holds pair j of the 8 rows (as int8: row c's values 2j, 2j + 1 in bytes
 * 2c, 2c + 1) and whose high lane holds pair j + 8. */
static inline __attribute__((always_inline)) void tile_build_kind(int kind, const uint8_t* const* rows, int nb, Tile t) {
    const int f16_scales = kind == KIND_Q4_0 || kind == KIND_Q4_1 || kind == KIND_Q8_0 || kind == KIND_Q5_0 || kind == KIND_Q5_1;
    for (int b = 0; b < nb; b++) {
        __m256i q[TILE_COLS]; /* word i of row c's block: its pair i */
        uint16_t dh[TILE_COLS], mh[TILE_COLS];
        for (int c = 0; c < TILE_COLS; c++)
            q[c] = unpack_block8(kind, rows[c], b, t.d + (size_t)b * TILE_COLS + c, t.d2 + (size_t)b * TILE_COLS + c,
                                 t.m + (size_t)b * TILE_COLS + c, dh + c, mh + c);
        if (f16_scales) { /* the 8 rows' scales converted at once */
            _mm256_storeu_ps(t.d + (size_t)b * TILE_COLS, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)dh)));
            if (tile_has_m(kind))
                _mm256_storeu_ps(t.m + (size_t)b * TILE_COLS, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)mh)));
        }
        __m256i v[8];
        transpose8_words(q, v);
        __m256i* out = (__m256i*)(t.q + (size_t)b * 256);
        for (int i = 0; i < 8; i++) _mm256_storeu_si256(out + i, v[i]);
    }
}

/* Q4_1 without unpacking first: 16-bit word i of a block's 16 bytes holds pair i in its low
 * nibbles and pair i + 8 in its high ones, so the 8 rows' bytes are transposed as they are (two
 * blocks at once, one per 128-bit lane) and split into nibbles after. */
/* (not inlined into tile_build: measured faster so) */
static __attribute__((noinline)) void tile_build_q4(const uint8_t* const* rows, int nb, Tile t) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m256i a[TILE_COLS];
        for (int c = 0; c < TILE_COLS; c++) {
            const BlockQ4_1* w = (const BlockQ4_1*)rows[c] + b;
            a[c] = _mm256_loadu2_m128i((const __m128i*)w[1].qs, (const __m128i*)w[0].qs);
        }
        for (int h = 0; h < 2; h++) {
            __m256 dv, mv;
            tile_scales8(rows, (size_t)(b + h) * sizeof(BlockQ4_1), &dv, &mv);
            _mm256_storeu_ps(t.d + (size_t)(b + h) * TILE_COLS, dv);
            _mm256_storeu_ps(t.m + (size_t)(b + h) * TILE_COLS, mv);
        }
        __m256i v[8];
        transpose8_words(a, v);
        __m256i* out0 = (__m256i*)(t.q + (size_t)b * 256);
        __m256i* out1 = (__m256i*)(t.q + (size_t)(b + 1) * 256);
        for (int i = 0; i < 8; i++) { /* v[i]: word c = word i of row c (block b | block b + 1) */
            const __m256i lo = _mm256_and_si256(v[i], low), hi = _mm256_and_si256(_mm256_srli_epi16(v[i], 4), low);
            _mm256_storeu_si256(out0 + i, _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256(out1 + i, _mm256_permute2x128_si256(lo, hi, 0x31));
        }
    }
    if (b < nb) { /* an odd last block */
        const uint8_t* last[TILE_COLS];
        for (int c = 0; c < TILE_COLS; c++) last[c] = rows[c] + (size_t)b * sizeof(BlockQ4_1);
        const Tile tb = {t.q + (size_t)b * 256, t.d + (size_t)b * TILE_COLS, t.d2 + (size_t)b * TILE_COLS,
                         t.m + (size_t)b * TILE_COLS};
        tile_build_kind(KIND_Q4_1, last, 1, tb);
    }
}

static void tile_build(int kind, const uint8_t* const* rows, int nb, Tile t) {
    switch (kind) { /* one copy per layout: the unpacking specialises */
        case KIND_Q4_1: tile_build_q4(rows, nb, t); break;
        case KIND_Q4_0: tile_build_kind(KIND_Q4_0, rows, nb, t); break;
        case KIND_Q8_0: tile_build_kind(KIND_Q8_0, rows, nb, t); break;
        case KIND_Q5_0: tile_build_kind(KIND_Q5_0, rows, nb, t); break;
        case KIND_Q5_1: tile_build_kind(KIND_Q5_1, rows, nb, t); break;
        case KIND_Q4_K: tile_build_kind(KIND_Q4_K, rows, nb, t); break;
        case KIND_Q5_K: tile_build_kind(KIND_Q5_K, rows, nb, t); break;
        default: tile_build_kind(KIND_Q6_K, rows, nb, t);
    }
}

/* An empty asm that "changes" v: the compiler keeps each sum a running chain in a register
 * (left alone, it reassociates the 16 adds into a tree and spills the products to the stack). */
#define TILE_KEEP(v) __asm__("" : "+x"(v))

/* pairs j0..j0+7 of block b (its tile values W) against R activation rows: s[r] += the pairs'
 * products, per lane (row of the tile) */
static inline __attribute__((always_inline)) void tile_pairs(const int8_t* W, const BlockX* x, int nb, int b, int R,
                                                             int j0, __m256i* s) {
    for (int j = j0; j < j0 + 8; j++) {
        const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(W + 32 * (j & 7) + 16 * (j >> 3))));
        for (int r = 0; r < R; r++) {
            int32_t xv;
            memcpy(&xv, x[(size_t)r * nb + b].qs + 2 * j, sizeof xv);
            s[r] = dp16(s[r], w, _mm256_set1_epi32(xv));
            TILE_KEEP(s[r]);
        }
    }
}

/* acc[r] += (the 8 rows' scales of block b, at d) * d_x * s[r] */
static inline __attribute__((always_inline)) void tile_tail(const float* d, const BlockX* x, int nb, int b, int R,
                                                            const __m256i* s, __m256* acc) {
    const __m256 dv = _mm256_loadu_ps(d + (size_t)b * TILE_COLS);
    for (int r = 0; r < R; r++) {
        const __m256 xd = _mm256_set1_ps(x[(size_t)r * nb + b].d);
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dv, xd), _mm256_cvtepi32_ps(s[r]), acc[r]);
    }
}

/* out[r] lane c = dot of weight row c of the tile with activation row r (x + r * nb), R <= 4. */
static inline __attribute__((always_inline)) void tile_rows(const Tile* tp, int nb, const BlockX* x, int R,
                                                            int has_m, int halves, __m256* out) {
    const Tile t = *tp;
    __m256 acc[TILE_MAX_R]; /* a local array: the sums stay in registers */
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const int8_t* W = t.q + (size_t)b * 256;
        __m256i s[TILE_MAX_R];
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
        tile_pairs(W, x, nb, b, R, 0, s);
        if (halves) { /* Q6_K: values 16..31 have a scale of their own */
            tile_tail(t.d, x, nb, b, R, s, acc);
            for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
            tile_pairs(W, x, nb, b, R, 8, s);
            tile_tail(t.d2, x, nb, b, R, s, acc);
        } else {
            tile_pairs(W, x, nb, b, R, 8, s);
            tile_tail(t.d, x, nb, b, R, s, acc);
        }
        if (has_m) {
            const __m256 mv = _mm256_loadu_ps(t.m + (size_t)b * TILE_COLS);
            for (int r = 0; r < R; r++)
                acc[r] = _mm256_fmadd_ps(mv, _mm256_set1_ps(x[(size_t)r * nb + b].s), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* one copy per R, not inlined into the caller (measured faster so); the layout's flags are
 * branches outside the loops */
static inline __attribute__((always_inline)) void tile_rows_kind(const Tile* t, int nb, const BlockX* x, int kind,
                                                                 int R, __m256* out) {
    if (kind == KIND_Q6_K) tile_rows(t, nb, x, R, 0, 1, out);
    else if (tile_has_m(kind)) tile_rows(t, nb, x, R, 1, 0, out);
    else tile_rows(t, nb, x, R, 0, 0, out);
}
static __attribute__((noinline)) void tile_rows_1(const Tile* t, int nb, const BlockX* x, int kind, __m256* out) {
    tile_rows_kind(t, nb, x, kind, 1, out);
}
static __attribute__((noinline)) void tile_rows_2(const Tile* t, int nb, const BlockX* x, int kind, __m256* out) {
    tile_rows_kind(t, nb, x, kind, 2, out);
}
static __attribute__((noinline)) void tile_rows_3(const Tile* t, int nb, const BlockX* x, int kind, __m256* out) {
    tile_rows_kind(t, nb, x, kind, 3, out);
}
static __attribute__((noinline)) void tile_rows_4(const Tile* t, int nb, const BlockX* x, int kind, __m256* out) {
    tile_rows_kind(t, nb, x, kind, 4, out);
}

/* out[r] for R = 1..TILE_MAX_R activation rows. */
static inline void tile_dot(const Tile* t, int nb, const BlockX* x, int kind, int R, __m256* out) {
    switch (R) {
        case 4: tile_rows_4(t, nb, x, kind, out); break;
        case 3: tile_rows_3(t, nb, x, kind, out); break;
        case 2: tile_rows_2(t, nb, x, kind, out); break;
        default: tile_rows_1(t, nb, x, kind, out);
    }
}

/* tiles ahead whose weights are prefetched, into L2 (into L1 measured slower: they evict the
 * tile being used) */
#define TILE_PF 2

/* The tile strategy (kinds.h): batched decode, prefill; 8 weight rows at once. */
int exo_x86_tile(const Run* r) {
    void* buf = exo_scratch(SCRATCH_TILE, tile_bytes(r->nb));
    if (buf == NULL) return -1;
    const int nb = r->nb, hi = r->hi, base = r->base, grouped = r->kind != r->file_kind;
    const size_t rb = r->rb;
    const Tile t = tile_at(buf, nb);
    /* the weights of the tiles ahead, as one run of bytes (the hardware prefetchers miss 8 short
     * streams): the first ones now, then one tile per tile */
    const char* wp = (const char*)r->w;
    const size_t pf_end = (size_t)(hi - base) * rb;
    int n = r->lo;
    size_t pf = (size_t)(n - base) * rb; /* bytes into the part */
    for (; pf < pf_end && pf < (size_t)(n - base + TILE_PF * TILE_COLS) * rb; pf += 64)
        _mm_prefetch(wp + pf, _MM_HINT_T1);
    for (; n < hi; n += TILE_COLS) {
        const int cols = hi - n < TILE_COLS ? hi - n : TILE_COLS;
        const uint8_t* rows[TILE_COLS]; /* past the part's end: its last row again */
        for (int c = 0; c < TILE_COLS; c++) rows[c] = run_row(r, n + (c < cols ? c : cols - 1));
        for (; pf < pf_end && pf < (size_t)(n - base + (TILE_PF + 1) * TILE_COLS) * rb; pf += 64)
            _mm_prefetch(wp + pf, _MM_HINT_T1);
        if (grouped) exo_x86_tile_from_group(r->kind, rows[0], nb, t);
        else tile_build(r->kind, rows, nb, t);
        for (int m = r->m0; m < r->m1;) {
            const int R = r->m1 - m >= TILE_MAX_R ? TILE_MAX_R : r->m1 - m;
            __m256 acc[TILE_MAX_R];
            float o[TILE_COLS];
            tile_dot(&t, nb, r->x + (size_t)m * nb, r->file_kind, R, acc);
            for (int i = 0; i < R; i++) {
                const size_t at = (size_t)(m + i) * r->N + n;
                if (cols == TILE_COLS) { /* residual may be y itself: read before the write */
                    __m256 v = acc[i];
                    if (r->bias) v = _mm256_add_ps(v, _mm256_loadu_ps(r->bias + n));
                    if (r->residual) v = _mm256_add_ps(v, _mm256_loadu_ps(r->residual + at));
                    _mm256_storeu_ps(r->y + at, v);
                    continue;
                }
                _mm256_storeu_ps(o, acc[i]);
                for (int c = 0; c < cols; c++) run_store(r, m + i, n + c, o[c]);
            }
            m += R;
        }
    }
    return 0;
}
#endif
