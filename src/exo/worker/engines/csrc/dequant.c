/* Rows of a file layout to floats: the embedding's looked-up rows each step (a decode step
 * dequantises one row per request; in Python, through numpy, that cost ~0.6 ms a token at the 1B
 * shape, the caches cold after the weights streamed by).
 *
 * The values are gguf-py's (`gguf.quants.dequantize`), bit for bit: each the same float32
 * operations in the same order (scale products first, then the multiply, then the offset), with
 * no multiply-add contracted (the x86 builds allow FMA contraction elsewhere). */
#include "kinds.h"
#include "quants.h"

#if defined(__GNUC__) && !defined(__clang__)
#define NO_FMA_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define NO_FMA_CONTRACT
#endif

/* out = d q + m for the 32 values of a legacy block (q unsigned 0..31, or already centred). */
static NO_FMA_CONTRACT void legacy_block(int kind, const uint8_t* blk, float* out) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    uint16_t d16, m16 = 0;
    memcpy(&d16, blk, 2);
    const float d = exo_h2f(d16);
    if (kind == KIND_Q8_0) {
        const int8_t* qs = (const int8_t*)(blk + 2);
        for (int j = 0; j < 32; j++) out[j] = d * (float)qs[j];
        return;
    }
    const int has_m = kind == KIND_Q4_1 || kind == KIND_Q5_1;
    if (has_m) memcpy(&m16, blk + 2, 2);
    const float m = exo_h2f(m16);
    uint32_t qh = 0;
    const int five = kind == KIND_Q5_0 || kind == KIND_Q5_1;
    if (five) memcpy(&qh, blk + (has_m ? 4 : 2), 4);
    const uint8_t* qs = blk + (has_m ? 4 : 2) + (five ? 4 : 0);
    const int centre = has_m ? 0 : (five ? 16 : 8);
    for (int j = 0; j < 16; j++) {
        const int lo = (qs[j] & 15) | (five ? (int)((qh >> j) & 1) << 4 : 0);
        const int hi = (qs[j] >> 4) | (five ? (int)((qh >> (j + 16)) & 1) << 4 : 0);
        const float a = d * (float)(lo - centre), b = d * (float)(hi - centre);
        out[j] = has_m ? a + m : a;
        out[j + 16] = has_m ? b + m : b;
    }
}

/* out = (d sc) q - (dmin m) for a Q4_K (qh NULL) or Q5_K super-block's 256 values. */
static NO_FMA_CONTRACT void q45k_block(const uint8_t* scales, uint16_t d16, uint16_t dmin16, const uint8_t* qh,
                                       const uint8_t* qs, float* out) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    const float d = exo_h2f(d16), dmin = exo_h2f(dmin16);
    for (int j = 0; j < 8; j++) { /* sub-block j: chunk j / 2's low (even j) or high nibbles */
        int sc, mn;
        q4k_scale_min(scales, j, &sc, &mn);
        const float ds = d * (float)sc, dm = dmin * (float)mn;
        const uint8_t* q = qs + 32 * (j / 2);
        for (int l = 0; l < 32; l++) {
            const int v = ((j & 1 ? q[l] >> 4 : q[l]) & 15) | (qh ? ((qh[l] >> j) & 1) << 4 : 0);
            const float p = ds * (float)v;
            out[32 * j + l] = p - dm;
        }
    }
}

/* out = (d sc) q for a Q6_K super-block's 256 values. */
static NO_FMA_CONTRACT void q6k_block(const BlockQ6K* w, float* out) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    const float d = exo_h2f(w->d);
    for (int v = 0; v < 256; v++) {
        const int h = v / 128, r = v % 128; /* half; within it, ql's nibble r / 64 and qh's pair r / 32 */
        const int lo = (w->ql[64 * h + r % 64] >> (4 * (r / 64))) & 15;
        const int hi = (w->qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        out[v] = (d * (float)w->scales[v / 16]) * (float)((lo | hi << 4) - 32);
    }
}

int exo_dequant_rows(int kind, const void* rows, long n, int K, float* out) {
    const KindTraits* t = exo_kind_traits(kind);
    if (t == NULL || t->kind != t->file_kind || n < 0 || K <= 0 || K % t->block_values != 0) return -2;
    if (kind != KIND_Q4_0 && kind != KIND_Q4_1 && kind != KIND_Q5_0 && kind != KIND_Q5_1 && kind != KIND_Q8_0 &&
        kind != KIND_Q4_K && kind != KIND_Q5_K && kind != KIND_Q6_K)
        return -2;
    const int nb = K / t->block_values;
    const uint8_t* blk = (const uint8_t*)rows;
    for (long i = 0; i < n * nb; i++, blk += t->block_bytes, out += t->block_values) {
        if (kind == KIND_Q4_K) {
            const BlockQ4K* w = (const BlockQ4K*)blk;
            q45k_block(w->scales, w->d, w->dmin, NULL, w->qs, out);
        } else if (kind == KIND_Q5_K) {
            const BlockQ5K* w = (const BlockQ5K*)blk;
            q45k_block(w->scales, w->d, w->dmin, w->qh, w->qs, out);
        } else if (kind == KIND_Q6_K) {
            q6k_block((const BlockQ6K*)blk, out);
        } else {
            legacy_block(kind, blk, out);
        }
    }
    return 0;
}
