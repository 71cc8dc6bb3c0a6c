/* Q2_K and Q3_K (llama.cpp's 2- and 3-bit K-quants, issue 23): their blocks as the file holds
 * them and the unpacking both builds share (kquant23.c: plain C, arch/x86/kquant23.c: AVX2).
 *
 * A super-block is 256 values, 8 activation blocks (BlockX) of 32: group g = 4n + j (128-value
 * half n, 2-bit plane j) is value l = 0..31 of qs[32n + l] >> 2j & 3, two sub-blocks of 16
 * values (l < 16: scale 2g, l >= 16: scale 2g + 1).
 *   Q2_K (84 B): w = d * (s & 15) * q - dmin * (s >> 4), s = scales[sub-block], q in 0..3.
 *   Q3_K (110 B): w = d * (sc - 32) * (q - (bit g of hmask[l] ? 0 : 4)), q - 4.. in -4..3; the
 *       6-bit sc of sub-block i: low 4 bits from scales[i] (i < 8) or scales[i - 8] >> 4,
 *       top 2 bits from scales[8 + i % 4] >> 2 (i / 4).
 * A group's dot product with activation block x = d_x q_x is integers first:
 *   Q2_K: d d_x (sc_a P_a + sc_b P_b) - dmin d_x (m_a S_a + m_b S_b), P the halves' sums of
 *         q q_x, S those of q_x;
 *   Q3_K: d d_x (sc_a P_a + sc_b P_b);
 * then float terms added per row in one order whatever the row count (1 or 4 rows a pass):
 * a row's result is the same alone or in any batch. */
#ifndef EXO_KQUANT23_H
#define EXO_KQUANT23_H

#include "exo_kernels.h"

typedef struct { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; } BlockQ2K;              /* 84 B */
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; } BlockQ3K; /* 110 B */
_Static_assert(sizeof(BlockQ2K) == 84 && sizeof(BlockQ3K) == 110, "a Q2_K / Q3_K block's size is not GGUF's");

/* A Q3_K super-block's 16 signed scales (sc - 32). */
static inline void q3k_scales(const uint8_t* s, int* out) {
    for (int i = 0; i < 16; i++) {
        const int low = i < 8 ? s[i] & 15 : s[i - 8] >> 4;
        const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        out[i] = (low | (high << 4)) - 32;
    }
}

#endif
