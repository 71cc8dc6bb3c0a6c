/* The non-linear 4-bit kinds: MXFP4 (gpt-oss), IQ4_NL and IQ4_XS, as GGUF stores them. A 4-bit
 * code indexes a 16-entry table of small integers, so a block's products with the 16-bit
 * activation blocks (BlockX) are integer multiply-adds, and the float order below is every
 * build's and every row count's (iq4.c: generic; arch/x86/iq4.c: AVX2 and the VNNI builds).
 *
 *   MXFP4   17 B / 32 values: e (E8M0), qs[16]: value = 2^(e - 128) * E2M1x2[code], the E2M1
 *           values doubled (-12..12), as ggml's kvalues_mxfp4 and GGML_E8M0_TO_FP32_HALF
 *   IQ4_NL  18 B / 32 values: f16 d, qs[16]: value = d * NL[code] (NL: -127..113)
 *   IQ4_XS 136 B / 256 values: f16 d, u16 scales_h, u8 scales_l[4], qs[128]: sub-block j (32
 *           values, qs[16 j ..]) is IQ4_NL with scale d * (ls_j - 32), ls_j the 6-bit number
 *           nibble j % 2 of scales_l[j / 2] | bits 2j, 2j + 1 of scales_h << 4
 *   In each 16 bytes of codes byte i holds value i (low nibble) and value i + 16 (high).
 *
 * Float order (one weight row against one activation row): per 32-value block b, eight int32
 * lanes p_l = sum of q_i x_i over i in {2l, 2l + 1, 2l + 16, 2l + 17} (exact; vpmaddwd then
 * vpdpwssd give exactly these lanes; |p_l| < 2^24, so (float)p_l is exact too), the block's
 * scale s_b (exact: a power of two, or an f16 times a small integer) and t = s_b * d_x, then
 * a_l = a_l + t * (float)p_l into one of two sets of lanes, a = A for even b and B for odd b (a
 * multiply, then an add: both files are built with fp-contract off; two chains, so one block's
 * add need not wait for the last's); the result is the lanes of A + B summed as exo_hsum8 does,
 * ((c0 + c4) + (c2 + c6)) + ((c1 + c5) + (c3 + c7)) for c = A + B. There is no offset term.
 */
#ifndef EXO_IQ4_H
#define EXO_IQ4_H

#include "kinds.h"

typedef struct { uint8_t e; uint8_t qs[16]; } BlockMXFP4;                                       /* 17 B */
typedef struct { uint16_t d; uint8_t qs[16]; } BlockIQ4NL;                                      /* 18 B */
typedef struct { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; } BlockIQ4XS; /* 136 B */

static const int8_t IQ4_NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e - 128) (e = 0 and 1 give float32 subnormals), as ggml's E8M0 "half" */
static inline float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Sub-block j's scale in an IQ4_XS block: d (ls_j - 32). */
static inline float iq4xs_scale(const BlockIQ4XS* b, int j) {
    const int ls = ((b->scales_l[j / 2] >> (4 * (j % 2))) & 15) | (((b->scales_h >> (2 * j)) & 3) << 4);
    return exo_h2f(b->d) * (float)(ls - 32);
}

static inline float iq4_lanes_sum(const float* a) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

#endif
