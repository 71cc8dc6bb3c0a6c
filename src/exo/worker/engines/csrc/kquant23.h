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

/* Q2_K's min term needs each sub-block's activation sum: hs[16 s + i] = d_x * (sum of the 16 q_x
 * of sub-block i of super-block s), for nsb super-blocks of one activation row (a call computes
 * them once per activation row, or per super-block where it has no scratch: the same floats). */
static inline void q2k_half_sums(const BlockX* x, int nsb, float* hs) {
    for (int b = 0; b < nsb * 8; b++) {
        int32_t a = 0, c = 0;
        for (int l = 0; l < 16; l++) {
            a += x[b].qs[l];
            c += x[b].qs[l + 16];
        }
        hs[2 * b] = x[b].d * (float)a;
        hs[2 * b + 1] = x[b].d * (float)c;
    }
}

/* The dot strategy of Q2_K (kinds.h's run_rows, with the half sums): `dot(w, x, nsb, R, hs, out)`
 * with hs the rows' half sums (R rows of 16 nsb floats) or NULL (computed per super-block). */
#define Q2K_RUN_ROWS(r, dot)                                                                        \
    do {                                                                                            \
        const int nsb_ = (r)->nb / 8, per_ = 16 * nsb_;                                             \
        float* hs_ = exo_scratch(SCRATCH_UNPACK, (size_t)((r)->m1 - (r)->m0) * per_ * sizeof(float)); \
        for (int m_ = (r)->m0; hs_ && m_ < (r)->m1; m_++)                                           \
            q2k_half_sums((r)->x + (size_t)m_ * (r)->nb, nsb_, hs_ + (size_t)(m_ - (r)->m0) * per_);  \
        float out_[4];                                                                              \
        for (int n_ = (r)->lo; n_ < (r)->hi; n_++) {                                                \
            const BlockQ2K* w_ = (const BlockQ2K*)run_row(r, n_);                                   \
            for (int m_ = (r)->m0; m_ < (r)->m1;) {                                                 \
                const BlockX* x_ = (r)->x + (size_t)m_ * (r)->nb;                                   \
                const float* h_ = hs_ ? hs_ + (size_t)(m_ - (r)->m0) * per_ : NULL;                 \
                const int R_ = (r)->m1 - m_ >= 4 ? 4 : 1;                                           \
                if (R_ == 4) dot(w_, x_, nsb_, 4, h_, out_);                                        \
                else dot(w_, x_, nsb_, 1, h_, out_);                                                \
                for (int i_ = 0; i_ < R_; i_++) run_store(r, m_ + i_, n_, out_[i_]);                \
                m_ += R_;                                                                           \
            }                                                                                       \
        }                                                                                           \
    } while (0)

#endif
