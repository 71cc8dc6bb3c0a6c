/* Plain C references for the kernel test harness: written from the layouts' descriptions,
 * in double precision, sharing no code with the kernels. */
#ifndef EXO_REFERENCE_H
#define EXO_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

typedef struct { uint64_t s; } Rng;
uint64_t rng_next(Rng* r);
double rng_unit(Rng* r);            /* [0, 1) */
int rng_int(Rng* r, int lo, int hi); /* [lo, hi] */
float rng_normalish(Rng* r);         /* roughly N(0, 1) */

double ref_half(uint16_t h);
uint16_t rng_half(Rng* r, int min_exp, int max_exp); /* a random normal half with 2^e in range */

size_t ref_row_bytes(int kind, int K);
/* Random bytes for one weight row of `kind`, with sane half-float scales. */
void ref_random_row(Rng* r, int kind, int K, uint8_t* row);
/* The K values a weight row stands for. */
void ref_dequant_row(int kind, const uint8_t* row, int K, double* out);

/* n_rows (a multiple of 8) rows of `kind` (Q4_1, Q8_0, Q5_0, Q4_K, Q6_K; Q4_0, Q5_1, Q5_K) of K values re-laid in
 * groups of 8 rows, per group and block (of 32 values, or super-block of 256 for the K kinds):
 * - Q4_1 (KIND_Q4_1_G8): the 8 rows' f16 d, their f16 m, then for i = 0..7 the bytes 2i, 2i + 1 of
 *   each row's 16 bytes of nibbles, row after row.
 * - Q8_0 (KIND_Q8_0_G8): the 8 rows' f16 d, then value 2j + e (j = 0..15, e = 0, 1) of row c at
 *   byte 32 (j % 8) + 16 (j / 8) + 2c + e of the next 256.
 * - Q5_0 (KIND_Q5_0_G8): the 8 rows' f16 d, then for i = 0..7 a 32-bit word whose bit 2c + e is
 *   the fifth bit of row c's value 2i + e and bit 16 + 2c + e that of its value 2i + 16 + e,
 *   then the nibbles as for Q4_1.
 * - Q4_K (KIND_Q4_K_G8): the 8 rows' f16 d, their f16 dmin, byte k of row c's 12 scale bytes at
 *   32 + 8k + c, then for chunk ch = 0..3 and i = 0..15 the bytes 2i, 2i + 1 of the chunk's 32
 *   bytes of each row, row after row.
 * - Q6_K (KIND_Q6_K_G8): the 8 rows' f16 d, scale k of row c at 16 + 8k + c, then for ql's chunk
 *   q = 0..3 (32 bytes) and i = 0..15 the rows' bytes 2i, 2i + 1 at 144 + 256 q + 16 i + 2c,
 *   then qh's halves h = 0, 1 the same at 1168 + 256 h. */
/* - issue 22 q5g: Q5_1 (KIND_Q5_1_G8): the 8 rows' f16 d, their f16 m, then Q5_0's words and nibbles;
 *   Q5_K (KIND_Q5_K_G8): as Q4_K's, with the 16 pairs of bytes of each row's 32 qh bytes (at 128 + 16 i
 *   + 2c) before the chunks (at 384). */
void ref_group_rows(int kind, const uint8_t* rows, int n_rows, int K, uint8_t* out);

/* y [M, N] = prologue(x) W^T + bias + residual; W given as dequantised rows [N, K]; with post_g,
 * y = residual + rmsnorm(prologue(x) W^T + bias) * post_g (eps `eps`). Also the error bound per
 * output: tol [M, N]. */
void ref_linear(int prologue, const float* x, int M, int K, int N, const double* w,
                const float* g, float eps, const float* bias, const float* residual,
                const float* post_g, double* y, double* tol);

/* An activation row x [K] as 8-bit blocks of 32: scale d[b] = max |x| / 127 (in float), q = x / d
 * (by the float reciprocal) rounded half away from zero. The row stands for d[b] q. */
void ref_quantize8(const float* x, int K, int8_t* q, double* d);

/* MXFP4, IQ4_NL, IQ4_XS (iq4_reference.c): each returns 0 for a kind it does not hold. */
int ref_iq4_block_bytes(int kind);
int ref_iq4_random_row(Rng* r, int kind, int K, uint8_t* row);
int ref_iq4_dequant_row(int kind, const uint8_t* row, int K, double* out);

#endif
