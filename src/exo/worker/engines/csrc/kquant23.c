/* Q2_K and Q3_K dots (kquant23.h) in plain C: the portable build's, and any build's fallback.
 * One weight row against R = 1 or 4 activation rows; each group is unpacked once for all R. */
#include "kinds.h"
#include "kquant23.h"

/* a fused multiply-add here and not there would make R = 1 and R = 4 differ */
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

/* hs: the R rows' half sums (q2k_half_sums; 16 nsb floats a row) or NULL */
static inline __attribute__((always_inline)) void dot_q2k(const BlockQ2K* w, const BlockX* x, int nsb, int R,
                                                          const float* hs, float* out) {
    const int nb = nsb * 8;
    float accf[4], accm[4];
    for (int r = 0; r < R; r++) accf[r] = accm[r] = 0.0f;
    for (int s = 0; s < nsb; s++) {
        const float d = exo_h2f(w[s].d), dmin = exo_h2f(w[s].dmin);
        for (int g = 0; g < 8; g++) {
            const uint8_t* qs = w[s].qs + 32 * (g / 4);
            const int shift = 2 * (g % 4);
            int16_t q[QK]; /* the values times their sub-block's scale (one 32-value loop below) */
            for (int h = 0; h < 2; h++) {
                const int sc = w[s].scales[2 * g + h] & 15;
                for (int l = 16 * h; l < 16 * h + 16; l++) q[l] = (int16_t)(((qs[l] >> shift) & 3) * sc);
            }
            for (int r = 0; r < R; r++) {
                const BlockX* xb = x + (size_t)r * nb + (size_t)s * 8 + g;
                int32_t isum = 0;
                for (int l = 0; l < QK; l++) isum += (int32_t)q[l] * xb->qs[l];
                accf[r] += (d * xb->d) * (float)isum;
            }
        }
        for (int r = 0; r < R; r++) { /* the mins against the sub-blocks' sums, in sub-block order */
            float own[16];
            const float* h = hs ? hs + (size_t)r * nb * 2 + 16 * s : own;
            if (!hs) q2k_half_sums(x + (size_t)r * nb + (size_t)s * 8, 1, own);
            float t = 0.0f;
            for (int i = 0; i < 16; i++) t += (float)(w[s].scales[i] >> 4) * h[i];
            accm[r] += dmin * t;
        }
    }
    for (int r = 0; r < R; r++) out[r] = accf[r] - accm[r];
}

static inline __attribute__((always_inline)) void dot_q3k(const BlockQ3K* w, const BlockX* x, int nsb, int R,
                                                          float* out) {
    const int nb = nsb * 8;
    float accf[4];
    for (int r = 0; r < R; r++) accf[r] = 0.0f;
    for (int s = 0; s < nsb; s++) {
        const float d = exo_h2f(w[s].d);
        int sc[16];
        q3k_scales(w[s].scales, sc);
        for (int g = 0; g < 8; g++) {
            const uint8_t* qs = w[s].qs + 32 * (g / 4);
            const int shift = 2 * (g % 4);
            int16_t q[QK]; /* the values times their sub-block's scale (|q sc| <= 128) */
            for (int h = 0; h < 2; h++) /* branch-free: the loops vectorise */
                for (int l = 16 * h; l < 16 * h + 16; l++) {
                    const int v = ((qs[l] >> shift) & 3) - 4 + (((w[s].hmask[l] >> g) & 1) << 2);
                    q[l] = (int16_t)(v * sc[2 * g + h]);
                }
            for (int r = 0; r < R; r++) {
                const BlockX* xb = x + (size_t)r * nb + (size_t)s * 8 + g;
                int32_t isum = 0;
                for (int l = 0; l < QK; l++) isum += (int32_t)q[l] * xb->qs[l];
                accf[r] += (d * xb->d) * (float)isum;
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = accf[r];
}

static inline __attribute__((always_inline)) void row_q3_k(const uint8_t* w, const BlockX* x, int nb, int R,
                                                           float* out) {
    if (R == 4) dot_q3k((const BlockQ3K*)w, x, nb / 8, 4, out);
    else dot_q3k((const BlockQ3K*)w, x, nb / 8, 1, out);
}

int exo_generic_dot_q2_k(const Run* r) { Q2K_RUN_ROWS(r, dot_q2k); return 0; }
int exo_generic_dot_q3_k(const Run* r) { run_rows(r, row_q3_k); return 0; }
