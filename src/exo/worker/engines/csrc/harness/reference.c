#include "reference.h"

#include <math.h>
#include <string.h>

uint64_t rng_next(Rng* r) { /* xorshift64* */
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 2685821657736338717ULL;
}

double rng_unit(Rng* r) { return (double)(rng_next(r) >> 11) / 9007199254740992.0; }

int rng_int(Rng* r, int lo, int hi) { return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1)); }

float rng_normalish(Rng* r) {
    double s = 0.0;
    for (int i = 0; i < 12; i++) s += rng_unit(r);
    return (float)(s - 6.0);
}

double ref_half(uint16_t h) {
    const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp((double)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp(1.0 + (double)m / 1024.0, e - 15);
    return sign ? -v : v;
}

uint16_t rng_half(Rng* r, int min_exp, int max_exp) {
    const int e = rng_int(r, min_exp, max_exp) + 15;
    return (uint16_t)((rng_int(r, 0, 1) << 15) | (e << 10) | rng_int(r, 0, 1023));
}

static int block_values(int kind) { return kind > 100 ? 256 : 32; }

static size_t block_bytes(int kind) {
    if (ref_iq4_block_bytes(kind)) return (size_t)ref_iq4_block_bytes(kind); /* MXFP4, IQ4_NL, IQ4_XS */
    switch (kind) {
        case 40: return 18;
        case 4: return 20;
        case 8: return 34;
        case 50: return 22;
        case 51: return 24;
        case 104: return 144;
        case 105: return 176;
        /* issue 23: Q2_K, Q3_K */
        case 102: return 84;
        case 103: return 110;
        default: return 210;
    }
}

size_t ref_row_bytes(int kind, int K) { return (size_t)(K / block_values(kind)) * block_bytes(kind); }

static void put_half(uint8_t* p, uint16_t h) { memcpy(p, &h, 2); }
static uint16_t get_half(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* Row c's block `blk` put in its group's block `o` (zeroed), per layout (see reference.h). */
static void place_q4(uint8_t* o, const uint8_t* blk, int c) { /* d, m, qs[16] */
    memcpy(o + 2 * c, blk, 2);
    memcpy(o + 16 + 2 * c, blk + 2, 2);
    for (int i = 0; i < 8; i++) memcpy(o + 32 + 16 * i + 2 * c, blk + 4 + 2 * i, 2);
}

static void place_q4_0(uint8_t* o, const uint8_t* blk, int c) { /* d, qs[16] */
    memcpy(o + 2 * c, blk, 2);
    for (int i = 0; i < 8; i++) memcpy(o + 16 + 16 * i + 2 * c, blk + 2 + 2 * i, 2);
}

static void place_q8(uint8_t* o, const uint8_t* blk, int c) { /* d, qs[32] */
    memcpy(o + 2 * c, blk, 2);
    for (int j = 0; j < 16; j++) memcpy(o + 16 + 32 * (j % 8) + 16 * (j / 8) + 2 * c, blk + 2 + 2 * j, 2);
}

static void place_q5_0(uint8_t* o, const uint8_t* blk, int c) { /* d, qh[4], qs[16] */
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    memcpy(o + 2 * c, blk, 2);
    for (int i = 0; i < 8; i++) {
        memcpy(o + 48 + 16 * i + 2 * c, blk + 6 + 2 * i, 2);
        uint32_t word;
        memcpy(&word, o + 16 + 4 * i, 4);
        for (int e = 0; e < 2; e++) {
            word |= ((qh >> (2 * i + e)) & 1u) << (2 * c + e);
            word |= ((qh >> (2 * i + 16 + e)) & 1u) << (16 + 2 * c + e);
        }
        memcpy(o + 16 + 4 * i, &word, 4);
    }
}

static void place_q4k(uint8_t* o, const uint8_t* blk, int c) { /* d, dmin, scales[12], qs[128] */
    memcpy(o + 2 * c, blk, 2);
    memcpy(o + 16 + 2 * c, blk + 2, 2);
    for (int k = 0; k < 12; k++) o[32 + 8 * k + c] = blk[4 + k];
    for (int ch = 0; ch < 4; ch++)
        for (int i = 0; i < 16; i++) memcpy(o + 128 + 16 * (16 * ch + i) + 2 * c, blk + 16 + 32 * ch + 2 * i, 2);
}

/* issue 22 q5g: Q5_1 (d, m, qh[4], qs[16]): Q5_0's with m; Q5_K (d, dmin, scales[12], qh[32], qs[128]):
 * Q4_K's with qh's 32 bytes laid as a chunk's, before the chunks */
static void place_q5_1(uint8_t* o, const uint8_t* blk, int c) {
    uint32_t qh;
    memcpy(&qh, blk + 4, 4);
    memcpy(o + 2 * c, blk, 2);
    memcpy(o + 16 + 2 * c, blk + 2, 2);
    for (int i = 0; i < 8; i++) {
        memcpy(o + 64 + 16 * i + 2 * c, blk + 8 + 2 * i, 2);
        uint32_t word;
        memcpy(&word, o + 32 + 4 * i, 4);
        for (int e = 0; e < 2; e++) {
            word |= ((qh >> (2 * i + e)) & 1u) << (2 * c + e);
            word |= ((qh >> (2 * i + 16 + e)) & 1u) << (16 + 2 * c + e);
        }
        memcpy(o + 32 + 4 * i, &word, 4);
    }
}

static void place_q5k(uint8_t* o, const uint8_t* blk, int c) {
    memcpy(o + 2 * c, blk, 2);
    memcpy(o + 16 + 2 * c, blk + 2, 2);
    for (int k = 0; k < 12; k++) o[32 + 8 * k + c] = blk[4 + k];
    for (int i = 0; i < 16; i++) memcpy(o + 128 + 16 * i + 2 * c, blk + 16 + 2 * i, 2);
    for (int ch = 0; ch < 4; ch++)
        for (int i = 0; i < 16; i++) memcpy(o + 384 + 16 * (16 * ch + i) + 2 * c, blk + 48 + 32 * ch + 2 * i, 2);
}

static void place_q6k(uint8_t* o, const uint8_t* blk, int c) { /* ql, qh, scales, d */
    memcpy(o + 2 * c, blk + 208, 2);
    for (int k = 0; k < 16; k++) o[16 + 8 * k + c] = blk[192 + k];
    for (int q = 0; q < 4; q++)
        for (int i = 0; i < 16; i++) memcpy(o + 144 + 256 * q + 16 * i + 2 * c, blk + 32 * q + 2 * i, 2);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 16; i++) memcpy(o + 1168 + 256 * h + 16 * i + 2 * c, blk + 128 + 32 * h + 2 * i, 2);
}

void ref_group_rows(int kind, const uint8_t* rows, int n_rows, int K, uint8_t* out) {
    const int nb = K / block_values(kind);
    const size_t bytes = block_bytes(kind);
    void (*place)(uint8_t*, const uint8_t*, int) = kind == 40   ? place_q4_0
                                                   : kind == 4    ? place_q4
                                                   : kind == 8  ? place_q8
                                                   : kind == 50 ? place_q5_0
                                                   : kind == 104 ? place_q4k
                                                   : kind == 51 ? place_q5_1 /* issue 22 q5g */
                                                   : kind == 105 ? place_q5k
                                                                 : place_q6k;
    for (int g = 0; g < n_rows / 8; g++)
        for (int b = 0; b < nb; b++) {
            uint8_t* o = out + ((size_t)g * nb + b) * 8 * bytes;
            memset(o, 0, 8 * bytes);
            for (int c = 0; c < 8; c++) place(o, rows + ((size_t)(8 * g + c) * nb + b) * bytes, c);
        }
}

void ref_random_row(Rng* r, int kind, int K, uint8_t* row) {
    if (ref_iq4_random_row(r, kind, K, row)) return; /* MXFP4, IQ4_NL, IQ4_XS */
    const size_t n = ref_row_bytes(kind, K), bb = block_bytes(kind);
    for (size_t i = 0; i < n; i++) row[i] = (uint8_t)rng_next(r);
    for (size_t b = 0; b < n / bb; b++) {
        uint8_t* blk = row + b * bb;
        if (kind == 4 || kind == 51 || kind == 104 || kind == 105) {
            put_half(blk, rng_half(r, -8, -3));
            put_half(blk + 2, rng_half(r, -8, -3));
        } else if (kind == 50 || kind == 40) {
            put_half(blk, rng_half(r, -8, -3));
        } else if (kind == 8) {
            put_half(blk, rng_half(r, -9, -5));
            if ((int8_t)blk[2] == -128) blk[2] = 0; /* q8 holds -127..127 */
        } else if (kind == 102) { /* issue 23: Q2_K {scales[16], qs[64], d, dmin} */
            put_half(blk + 80, rng_half(r, -8, -3));
            put_half(blk + 82, rng_half(r, -8, -3));
        } else if (kind == 103) { /* issue 23: Q3_K {hmask[32], qs[64], scales[12], d} */
            put_half(blk + 108, rng_half(r, -11, -6));
        } else {
            put_half(blk + 208, rng_half(r, -12, -7));
        }
    }
}

/* Q4_K / Q5_K sub-block j's 6-bit scale and min, from the 12 packed bytes: the first four
 * pairs are the low 6 bits of bytes j and j + 4; the last four take their low 4 bits from the
 * nibbles of byte j + 4 and their top 2 bits from the top bits of bytes j - 4 and j. */
static void kq_pair(const uint8_t* s, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 0x3f;
        *mn = s[j + 4] & 0x3f;
    } else {
        *sc = (s[j + 4] & 0x0f) + 16 * (s[j - 4] >> 6);
        *mn = (s[j + 4] >> 4) + 16 * (s[j] >> 6);
    }
}

/* issue 23: one Q2_K / Q3_K super-block's 256 values (GGUF's layouts: value i is 2-bit field
 * (i % 128) / 32 of byte 32 (i / 128) + i % 32 of qs; sub-block i / 16 has its own scale).
 *   Q2_K {scales[16], qs[64], f16 d, f16 dmin}: d (s & 15) q - dmin (s >> 4), s = scales[i / 16]
 *   Q3_K {hmask[32], qs[64], scales[12], f16 d}: d (sc - 32) (q - 4 + 4 h), h = bit (i / 32) of
 *       hmask[i % 32]; sc's low nibble is nibble (i / 128) of scales[(i / 16) % 8], its top two
 *       bits are bits 2 (i / 64), +1 of scales[8 + (i / 16) % 4]. */
static void ref_dequant_k23(int kind, const uint8_t* blk, double* o) {
    const uint8_t* qs = blk + (kind == 102 ? 16 : 32);
    for (int i = 0; i < 256; i++) {
        const int sub = i / 16;
        const int q = (qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
        if (kind == 102) {
            const double d = ref_half(get_half(blk + 80)), dmin = ref_half(get_half(blk + 82));
            o[i] = d * (blk[sub] % 16) * q - dmin * (blk[sub] / 16);
        } else {
            const uint8_t* sc = blk + 96;
            const int low = sub < 8 ? sc[sub] % 16 : sc[sub - 8] / 16;
            const int top = (sc[8 + sub % 4] >> (2 * (sub / 4))) % 4;
            const int h = (blk[i % 32] >> (i / 32)) & 1;
            o[i] = ref_half(get_half(blk + 108)) * (low + 16 * top - 32) * (q - 4 + 4 * h);
        }
    }
}

void ref_dequant_row(int kind, const uint8_t* row, int K, double* out) {
    if (ref_iq4_dequant_row(kind, row, K, out)) return; /* MXFP4, IQ4_NL, IQ4_XS */
    const size_t bb = block_bytes(kind);
    const int bv = block_values(kind);
    for (int b = 0; b < K / bv; b++) {
        const uint8_t* blk = row + (size_t)b * bb;
        double* o = out + (size_t)b * bv;
        if (kind == 4) {
            const double d = ref_half(get_half(blk)), m = ref_half(get_half(blk + 2));
            for (int i = 0; i < 32; i++) {
                const int q = i < 16 ? blk[4 + i] % 16 : blk[4 + i - 16] / 16;
                o[i] = d * q + m;
            }
        } else if (kind == 40) { /* {d, qs[16]}: w = d (q - 8) */
            const double d = ref_half(get_half(blk));
            for (int i = 0; i < 32; i++) o[i] = d * ((i < 16 ? blk[2 + i] % 16 : blk[2 + i - 16] / 16) - 8);
        } else if (kind == 8) {
            const double d = ref_half(get_half(blk));
            for (int i = 0; i < 32; i++) o[i] = d * (int8_t)blk[2 + i];
        } else if (kind == 50 || kind == 51) { /* {d, [m], qh[4], qs[16]}: 5-bit q, fifth bit i of qh */
            const double d = ref_half(get_half(blk));
            const double m = kind == 51 ? ref_half(get_half(blk + 2)) : -16.0 * d;
            const uint8_t* qh = blk + (kind == 51 ? 4 : 2);
            const uint8_t* qs = qh + 4;
            for (int i = 0; i < 32; i++) {
                const int nib = i < 16 ? qs[i] % 16 : qs[i - 16] / 16;
                const int high = (qh[i / 8] >> (i % 8)) & 1;
                o[i] = d * (nib + 16 * high) + m;
            }
        } else if (kind == 104 || kind == 105) {
            const double d = ref_half(get_half(blk)), dmin = ref_half(get_half(blk + 2));
            const uint8_t* scales = blk + 4;
            const uint8_t* qh = blk + 16;
            const uint8_t* qs = blk + (kind == 105 ? 48 : 16);
            for (int i = 0; i < 256; i++) {
                const int j = i / 32, l = i % 32;
                const uint8_t byte = qs[32 * (j / 2) + l];
                int q = j % 2 ? byte / 16 : byte % 16;
                if (kind == 105) q += 16 * ((qh[l] >> j) & 1);
                int sc, mn;
                kq_pair(scales, j, &sc, &mn);
                o[i] = d * sc * q - dmin * mn;
            }
        } else if (kind == 102 || kind == 103) { /* issue 23 */
            ref_dequant_k23(kind, blk, o);
        } else {
            const uint8_t* ql = blk;
            const uint8_t* qh = blk + 128;
            const int8_t* sc = (const int8_t*)(blk + 192);
            const double d = ref_half(get_half(blk + 208));
            for (int i = 0; i < 256; i++) {
                const int half = i / 128, quarter = (i % 128) / 32, l = i % 32;
                const uint8_t lb = ql[64 * half + 32 * (quarter % 2) + l];
                const int low = quarter >= 2 ? lb / 16 : lb % 16;
                const int high = (qh[32 * half + l] >> (2 * quarter)) % 4;
                o[i] = d * sc[i / 16] * (low + 16 * high - 32);
            }
        }
    }
}

void ref_linear(int prologue, const float* x, int M, int K, int N, const double* w,
                const float* g, float eps, const float* bias, const float* residual,
                const float* post_g, double* y, double* tol) {
    double h[4096 * 4];
    for (int m = 0; m < M; m++) {
        const float* xr = x + (size_t)m * (prologue >= 2 ? 2 * K : K);
        double hmax = 0.0;
        if (prologue == 1) {
            double ss = 0.0;
            for (int k = 0; k < K; k++) ss += (double)xr[k] * xr[k];
            const double scale = 1.0 / sqrt(ss / K + eps);
            for (int k = 0; k < K; k++) h[k] = xr[k] * scale * g[k];
        } else if (prologue == 2) {
            for (int k = 0; k < K; k++) h[k] = xr[k] / (1.0 + exp(-(double)xr[k])) * xr[K + k];
        } else if (prologue == 3) { /* GeGLU: gelu with the tanh approximation */
            for (int k = 0; k < K; k++) {
                const double a = xr[k];
                const double u = sqrt(2.0 / 3.14159265358979323846) * (a + 0.044715 * a * a * a);
                h[k] = 0.5 * a * (1.0 + tanh(u)) * xr[K + k];
            }
        } else {
            for (int k = 0; k < K; k++) h[k] = xr[k];
        }
        for (int k = 0; k < K; k++) hmax = fabs(h[k]) > hmax ? fabs(h[k]) : hmax;
        for (int n = 0; n < N; n++) {
            double s = 0.0, sabs = 0.0, wabs = 0.0;
            for (int k = 0; k < K; k++) {
                s += w[(size_t)n * K + k] * h[k];
                sabs += fabs(w[(size_t)n * K + k] * h[k]);
                wabs += fabs(w[(size_t)n * K + k]);
            }
            const size_t i = (size_t)m * N + n;
            const double add = (bias ? bias[n] : 0.0) + (post_g == NULL && residual ? residual[i] : 0.0);
            y[i] = s + add;
            /* activations to 15 bits: |error| <= max|h| / 32767 per value; float sums */
            tol[i] = wabs * hmax / 32767.0 + 1e-5 * sabs + 1e-6 * fabs(add) + 1e-6;
        }
        if (post_g == NULL) continue;
        /* y = residual + rmsnorm(t) * post_g: the error of t scales by the norm's factor */
        double ss = 0.0, tmax = 0.0;
        for (int n = 0; n < N; n++) ss += y[(size_t)m * N + n] * y[(size_t)m * N + n];
        const double scale = 1.0 / sqrt(ss / N + eps);
        for (int n = 0; n < N; n++) tmax = tol[(size_t)m * N + n] > tmax ? tol[(size_t)m * N + n] : tmax;
        for (int n = 0; n < N; n++) {
            const size_t i = (size_t)m * N + n;
            const double res = residual ? residual[i] : 0.0;
            const double t = y[i], v = t * scale * post_g[n];
            y[i] = res + v;
            /* each t off by at most tol (<= tmax): the norm changes by at most sqrt(N) tmax */
            const double rel = sqrt((double)N) * tmax / sqrt(ss + 1e-30);
            tol[i] = 1.5 * (tol[i] + fabs(t) * rel) * scale * post_g[n] + 1e-5 * fabs(v) + 1e-6 * fabs(res) + 1e-6;
        }
    }
}

void ref_quantize8(const float* x, int K, int8_t* q, double* d) {
    for (int b = 0; b < K / 32; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            const float a = x[32 * b + i] < 0 ? -x[32 * b + i] : x[32 * b + i];
            if (a > amax) amax = a;
        }
        const float scale = amax / 127.0f, inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        for (int i = 0; i < 32; i++) {
            const float v = x[32 * b + i] * inv; /* round half away from zero */
            q[32 * b + i] = (int8_t)(v < 0 ? -(int)(-v + 0.5f) : (int)(v + 0.5f));
        }
        d[b] = scale;
    }
}
