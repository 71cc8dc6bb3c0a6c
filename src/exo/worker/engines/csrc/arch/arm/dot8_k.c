/* issue 22 arm8: NEON + dotprod per-row 8-bit dots (the dot8 strategy of the file layouts) of
 * Q8_0, Q4_K, Q6_K, Q5_0, Q5_1 and Q5_K: each block's 32 values unpacked to two int8x16 (values
 * 0..15, 16..31) and its scale / offset as the generic dots compute them (act8.c, act8_q5.c), then
 * arm8.h's runner: sdot integer sums, act8.h's float steps. Q4_0 / Q4_1: dot8.c. The same floats as
 * the portable build bit for bit (the harness's digest under qemu). Speed: not measured. */
#include "act8_q5.h"
#include "arch/arm/arm8.h"

#if EXO_NEON_DOTPROD

static inline __attribute__((always_inline)) void unpack_q8_0(const uint8_t* row, int b, ArmRow8* out) {
    const BlockQ8_0* wb = (const BlockQ8_0*)row + b;
    out->lo = vld1q_s8(wb->qs), out->hi = vld1q_s8(wb->qs + 16);
    out->d = exo_h2f(wb->d), out->m = 0.0f;
}

/* Q4_K: block b is sub-block b % 8 of super-block b / 8 (act8.c's row_dot_q4_k). */
static inline __attribute__((always_inline)) void unpack_q4_k(const uint8_t* row, int b, ArmRow8* out) {
    const BlockQ4K* wb = (const BlockQ4K*)row + b / 8;
    const int j = b % 8;
    const uint8_t* q = wb->qs + 32 * (j / 2);
    out->lo = arm_nibbles(vld1q_u8(q), j & 1), out->hi = arm_nibbles(vld1q_u8(q + 16), j & 1);
    q4k_sub(wb->scales, wb->d, wb->dmin, j, &out->d, &out->m);
}

/* Q6_K: block b is 32-value group g = b % 8 of super-block b / 8, its halves scaled apart. */
static inline __attribute__((always_inline)) void unpack_q6_k(const uint8_t* row, int b, ArmRow8* out) {
    const BlockQ6K* wb = (const BlockQ6K*)row + b / 8;
    const int g = b % 8, n = g / 4, k = g % 4;
    const uint8_t* ql = wb->ql + 64 * n + 32 * (k & 1);
    const uint8_t* qh = wb->qh + 32 * n;
    out->lo = arm_q6k_bytes(vld1q_u8(ql), vld1q_u8(qh), k);
    out->hi = arm_q6k_bytes(vld1q_u8(ql + 16), vld1q_u8(qh + 16), k);
    out->d = exo_h2f(wb->d) * (float)wb->scales[2 * g];
    out->m = exo_h2f(wb->d) * (float)wb->scales[2 * g + 1];
}

/* Q5_0 / Q5_1's 32 values: nibbles | fifth bit << 4 (bit j of qh: value j's). */
static inline __attribute__((always_inline)) void q5_values(const uint8_t qh[4], const uint8_t qs[16], ArmRow8* out) {
    const uint32_t h = q5_bits(qh);
    const uint8x16_t v = vld1q_u8(qs);
    out->lo = vorrq_s8(arm_low_nibbles(v), arm_fifth_bits(h));
    out->hi = vorrq_s8(arm_high_nibbles(v), arm_fifth_bits(h >> 16));
}

static inline __attribute__((always_inline)) void unpack_q5_0(const uint8_t* row, int b, ArmRow8* out) {
    const BlockQ5_0* wb = (const BlockQ5_0*)row + b;
    q5_values(wb->qh, wb->qs, out);
    out->d = exo_h2f(wb->d), out->m = q5_0_min(wb);
}

static inline __attribute__((always_inline)) void unpack_q5_1(const uint8_t* row, int b, ArmRow8* out) {
    const BlockQ5_1* wb = (const BlockQ5_1*)row + b;
    q5_values(wb->qh, wb->qs, out);
    out->d = exo_h2f(wb->d), out->m = exo_h2f(wb->m);
}

/* Q5_K: sub-block j = b % 8 as Q4_K's, value l's fifth bit = bit j of qh[l]. */
static inline __attribute__((always_inline)) void unpack_q5_k(const uint8_t* row, int b, ArmRow8* out) {
    const BlockQ5K* wb = (const BlockQ5K*)row + b / 8;
    const int j = b % 8;
    const uint8_t* q = wb->qs + 32 * (j / 2);
    out->lo = vorrq_s8(arm_nibbles(vld1q_u8(q), j & 1), arm_bit_j(vld1q_u8(wb->qh), j));
    out->hi = vorrq_s8(arm_nibbles(vld1q_u8(q + 16), j & 1), arm_bit_j(vld1q_u8(wb->qh + 16), j));
    q5k_sub(wb->scales, wb->d, wb->dmin, j, &out->d, &out->m);
}

int exo_arm_dot8_q8_0(const Run* r) { return arm_run_rows8(r, unpack_q8_0, ARM8_NOMIN); }
int exo_arm_dot8_q4_k(const Run* r) { return arm_run_rows8(r, unpack_q4_k, ARM8_MIN); }
int exo_arm_dot8_q6_k(const Run* r) { return arm_run_rows8(r, unpack_q6_k, ARM8_HALVES); }
int exo_arm_dot8_q5_0(const Run* r) { return arm_run_rows8(r, unpack_q5_0, ARM8_MIN); }
int exo_arm_dot8_q5_1(const Run* r) { return arm_run_rows8(r, unpack_q5_1, ARM8_MIN); }
int exo_arm_dot8_q5_k(const Run* r) { return arm_run_rows8(r, unpack_q5_k, ARM8_MIN); }

#endif
