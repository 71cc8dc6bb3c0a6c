/* Prefill: a weight row of a 32-value layout (q4, q8, Q5_0, Q5_1) unpacked once into int16
 * values and per-block floats (w = d q + m), then dotted with many activation rows, so the
 * unpacking (a third of a Q5_0 block's work) is not repeated for every group of rows (a
 * strategy of kinds.h). */
#include "kinds.h"

typedef struct {
    int16_t* q; /* [nb * 32] */
    float* d;   /* [nb] */
    float* m;   /* [nb]: the offset per value (0 for q8, -16 d for Q5_0) */
} UnpackedRow;

/* Block b of a Q5_0 (has_m 0) or Q5_1 row: its f16 d and m (m only in Q5_1) and fifth bits qh;
 * returns its 16 bytes of nibbles. */
static inline const uint8_t* q5_block(const void* row, int b, int has_m, uint16_t* d16, uint16_t* m16,
                                      uint32_t* qh) {
    const uint8_t* blk = (const uint8_t*)row + (size_t)b * (has_m ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0));
    memcpy(d16, blk, 2);
    memcpy(m16, blk + 2, 2);
    memcpy(qh, blk + (has_m ? 4 : 2), 4);
    return blk + (has_m ? 8 : 6);
}

static inline void unpack_row(int kind, const void* row, int nb, UnpackedRow u) {
    for (int b = 0; b < nb; b++) {
        int16_t* q = u.q + (size_t)b * QK;
        if (kind == KIND_Q8_0) {
            const BlockQ8_0* w = (const BlockQ8_0*)row + b;
            for (int j = 0; j < QK; j++) q[j] = w->qs[j];
            u.d[b] = exo_h2f(w->d);
            u.m[b] = 0.0f;
        } else if (kind == KIND_Q4_1) {
            const BlockQ4_1* w = (const BlockQ4_1*)row + b;
            for (int j = 0; j < 16; j++) {
                q[j] = (int16_t)(w->qs[j] & 15);
                q[j + 16] = (int16_t)(w->qs[j] >> 4);
            }
            u.d[b] = exo_h2f(w->d);
            u.m[b] = exo_h2f(w->m);
        } else { /* Q5_0, Q5_1 */
            const int has_m = kind == KIND_Q5_1;
            uint16_t d16, m16;
            uint32_t qh;
            const uint8_t* qs = q5_block(row, b, has_m, &d16, &m16, &qh);
            for (int j = 0; j < 16; j++) {
                q[j] = (int16_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));
                q[j + 16] = (int16_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
            }
            u.d[b] = exo_h2f(d16);
            u.m[b] = has_m ? exo_h2f(m16) : -16.0f * u.d[b];
        }
    }
}

/* out[r] = sum_b d_b d_x sum_j q_j q_xj + m_b s_x, for R = 4 activation rows (x + r * nb). */
static inline void dot_unpacked_4(UnpackedRow u, const BlockX* x, int nb, float* out) {
    for (int r = 0; r < 4; r++) {
        float acc = 0.0f;
        for (int b = 0; b < nb; b++) {
            const BlockX* xb = x + (size_t)r * nb + b;
            const int16_t* q = u.q + (size_t)b * QK;
            int32_t isum = 0;
            for (int j = 0; j < QK; j++) isum += (int32_t)q[j] * xb->qs[j];
            acc += u.d[b] * xb->d * (float)isum + u.m[b] * xb->s;
        }
        out[r] = acc;
    }
}

/* The unpacked strategy (kinds.h): 4 activation rows at a time; the rest by r->dot. */
int exo_generic_unpacked(const Run* r) {
    const int nb = r->nb;
    const size_t bytes = (size_t)nb * QK * sizeof(int16_t) + 2 * (size_t)nb * sizeof(float);
    char* buf = exo_scratch(SCRATCH_UNPACK, bytes);
    if (buf == NULL) return -1;
    const UnpackedRow u = {(int16_t*)buf, (float*)(buf + (size_t)nb * QK * sizeof(int16_t)),
                           (float*)(buf + (size_t)nb * QK * sizeof(int16_t)) + nb};
    float out[4];
    for (int n = r->lo; n < r->hi; n++) {
        unpack_row(r->kind, run_row(r, n), nb, u);
        int m = r->m0;
        for (; r->m1 - m >= 4; m += 4) {
            dot_unpacked_4(u, r->x + (size_t)m * nb, nb, out);
            for (int i = 0; i < 4; i++) run_store(r, m + i, n, out[i]);
        }
        if (m < r->m1) {
            Run rest = *r;
            rest.lo = n, rest.hi = n + 1, rest.m0 = m;
            r->dot(&rest);
        }
    }
    return 0;
}
