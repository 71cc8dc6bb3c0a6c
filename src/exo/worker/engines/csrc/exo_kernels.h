/* Shared declarations of exo's CPU kernels (see cpu_kernels.py for how they are built).
 *
 * The sources build one library per instruction set (kernel_build.py): the generic files (plain C
 * loops that any compiler vectorises for the machine it targets, ARM included: the "portable"
 * path) always, and arch/x86/ where the compiler targets AVX2 + FMA + F16C (EXO_AVX2). kinds.h
 * says how a weight kind's kernels are found (the KindTraits table, kinds.c).
 */
#ifndef EXO_KERNELS_H
#define EXO_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(EXO_FORCE_PORTABLE)
#define EXO_AVX2 1
#include <immintrin.h>
#else
#define EXO_AVX2 0
#endif
/* The x86 builds above AVX2 (kernel_build.py): the same arch/x86/ code, whose int16 pair
 * multiply-adds become one VNNI instruction (vpdpwssd, ymm: arch/x86/x86.h). */
#if EXO_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && !defined(EXO_AVXVNNI_EVEX)
#define EXO_AVX512VNNI 1
#else
#define EXO_AVX512VNNI 0
#endif
#if EXO_AVX2 && !EXO_AVX512VNNI && \
    (defined(__AVXVNNI__) || (defined(EXO_AVXVNNI_EVEX) && defined(__AVX512VL__) && defined(__AVX512VNNI__)))
#define EXO_AVXVNNI 1
#else
#define EXO_AVXVNNI 0
#endif
/* The ymm VNNI instructions (vpdpbusd, vpdpwssd): AVX-512 VL's EVEX forms in the avx512vnni build
 * and in the avxvnni build made for a CPU with AVX-512 VNNI but no AVX-VNNI (Zen 4, Ice Lake:
 * kernel_build.py adds -DEXO_AVXVNNI_EVEX, so that the avxvnni build's code runs, and is tested,
 * there); AVX-VNNI's VEX forms otherwise. The same integers either way. */
#if EXO_AVX512VNNI || (EXO_AVXVNNI && defined(EXO_AVXVNNI_EVEX))
#define X86_VNNI_DPBUSD _mm256_dpbusd_epi32
#define X86_VNNI_DPWSSD _mm256_dpwssd_epi32
#elif EXO_AVXVNNI
#define X86_VNNI_DPBUSD _mm256_dpbusd_avx_epi32
#define X86_VNNI_DPWSSD _mm256_dpwssd_avx_epi32
#endif
/* arm: the aarch64 builds above portable (kernel_build.py) compile arch/arm/: NEON dots of the
 * 16-bit activations (baseline armv8-a) and, with the dotprod extension (armv8.2-a+dotprod:
 * sdot), the 8-bit ones. */
#if defined(__aarch64__) && defined(__ARM_NEON) && !defined(EXO_FORCE_PORTABLE)
#define EXO_NEON 1
#include <arm_neon.h>
#else
#define EXO_NEON 0
#endif
#if EXO_NEON && defined(__ARM_FEATURE_DOTPROD)
#define EXO_NEON_DOTPROD 1
#else
#define EXO_NEON_DOTPROD 0
#endif

#include <string.h>

/* f16 -> f32 (in the hot loops: inline) */
static inline float exo_h2f(uint16_t h) {
#if EXO_AVX2
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf, nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else { /* zero or subnormal: man * 2^-24 */
        const float f = (float)man * 5.9604644775390625e-8f;
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
#endif
}

/* f32 -> f16, rounded to nearest even (as torch's and F16C's conversions): overflow to inf,
 * subnormals kept, NaN stays NaN (a quiet one). */
static inline uint16_t exo_f2h(float f) {
#if EXO_AVX2
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0); /* inf, nan */
    if (ax >= 0x477ff000u) return sign | 0x7c00; /* rounds to >= 65520: inf */
    if (ax >= 0x38800000u) { /* normal in f16: drop 13 mantissa bits, round to nearest even */
        const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
        return sign | (uint16_t)((r - 0x38000000u) >> 13);
    }
    if (ax < 0x33000000u) return sign; /* below half the least subnormal (or exactly): 0 */
    /* subnormal: mantissa with its implicit bit, shifted right by 126 - e - 24 + 1 ... */
    const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e; /* 14 .. 24: the f16 subnormal's ulp is 2^-24 */
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    return sign | (uint16_t)(q + (rem > half || (rem == half && (q & 1u))));
#endif
}

/* e^x = 2^n 2^f, f in [-0.5, 0.5], 2^f by a degree-7 polynomial; x clamped to [-87, 87];
 * relative error < 1e-6. Inline: loops over it vectorise. */
#define EXO_EXP_POLY(p, f, FMA, SET)                                                             \
    p = SET(1.5252734e-5f);                                                                      \
    p = FMA(p, f, SET(1.5403530e-4f));                                                           \
    p = FMA(p, f, SET(1.3333558e-3f));                                                           \
    p = FMA(p, f, SET(9.6181291e-3f));                                                           \
    p = FMA(p, f, SET(5.5504109e-2f));                                                           \
    p = FMA(p, f, SET(2.4022651e-1f));                                                           \
    p = FMA(p, f, SET(6.9314718e-1f));                                                           \
    p = FMA(p, f, SET(1.0f))
#define EXO_SCALAR_FMA(a, b, c) ((a) * (b) + (c))
#define EXO_SCALAR_SET(v) (v)

static inline float exo_expf(float x) {
    x = x < -87.0f ? -87.0f : (x > 87.0f ? 87.0f : x);
    const float t = x * 1.44269504f;
    const float n = __builtin_nearbyintf(t), f = t - n;
    float p;
    EXO_EXP_POLY(p, f, EXO_SCALAR_FMA, EXO_SCALAR_SET);
    int32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits += (int32_t)n * (1 << 23);
    memcpy(&p, &bits, sizeof p);
    return p;
}

#if EXO_AVX2
static inline float exo_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 exo_exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(87.0f));
    const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504f));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(t, n);
    __m256 p;
    EXO_EXP_POLY(p, f, _mm256_fmadd_ps, _mm256_set1_ps);
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}
#endif

#define QK 32         /* values per q4 / q8 / activation block */
#define QK_K 256      /* values per K-quant super-block */
#define MAX_PARTS 4   /* weight parts a linear reads in place (stacked along the output) */
#define MAX_THREADS 64

/* Weight layouts: GGUF's blocks as the file holds them (one row: K / values-per-block blocks). */
typedef struct { uint16_t d; uint8_t qs[16]; } BlockQ4_0;      /* w = d (q - 8) (f16 d), nibbles as Q4_1's */
typedef struct { uint16_t d, m; uint8_t qs[16]; } BlockQ4_1;   /* w = d q + m  (f16 d, m) */
typedef struct { uint16_t d; int8_t qs[32]; } BlockQ8_0;       /* w = d q      (f16 d) */
/* Q5_0: w = d (q - 16); Q5_1: w = d q + m; q = nibble | (bit j of qh) << 4, 0..31; byte j of qs
 * holds element j (low nibble) and j + 16 (high nibble). */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } BlockQ5_0;          /* 22 B */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } BlockQ5_1;       /* 24 B */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } BlockQ4K; /* 144 B */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } BlockQ5K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } BlockQ6K; /* 210 B */
/* An activation block: x = d q, s = d sum(q). */
typedef struct { float d, s; int16_t qs[32]; } BlockX;
/* An 8-bit activation block (as ggml's Q8_1): x = d q, q in [-127, 127], s = d sum(q). */
typedef struct { float d, s; int8_t qs[32]; } BlockX8;

/* The repacked layouts (repack.c builds them, grouped.c and arch/x86/grouped.c read them): rows
 * 8g .. 8g + 7 of a part re-laid together, block by block, so a vector lane is a row ("c" below:
 * the row in its group, "e": 0 or 1, the value of a pair). A group holds its 8 rows' bytes, so
 * offsets by rows stay the file's; a part so laid has a multiple of 8 rows. */
/* Q4_1: qs[i][2c + e] = byte 2i + e of row c's nibbles (low nibbles: values 2i + e, high: 2i + 16 + e) */
typedef struct { uint16_t d[8], m[8]; uint8_t qs[8][16]; } BlockQ4_1x8;           /* 160 B */
/* Q4_0: as Q4_1's, without m */
typedef struct { uint16_t d[8]; uint8_t qs[8][16]; } BlockQ4_0x8;                 /* 144 B */
/* Q5_0: the word qh[i] (little-endian) has bit 2c + e = the fifth bit of row c's value 2i + e,
 * bit 16 + 2c + e that of its value 2i + 16 + e; qs as Q4_1's. */
typedef struct { uint16_t d[8]; uint8_t qh[8][4]; uint8_t qs[8][16]; } BlockQ5_0x8; /* 176 B */
/* Q8_0: value 2j + e of row c at qs[32 (j % 8) + 16 (j / 8) + 2c + e] (a tile's, arch/x86/tile.c) */
typedef struct { uint16_t d[8]; int8_t qs[256]; } BlockQ8_0x8;                    /* 272 B */
/* Q4_K, per super-block: scales[k][c] = byte k of row c's 12 scale bytes; qs[ch][i][2c + e] = byte
 * 2i + e of row c's 64-value chunk ch (low nibbles: sub-block 2 ch, high: 2 ch + 1). */
typedef struct { uint16_t d[8], dmin[8]; uint8_t scales[12][8]; uint8_t qs[4][16][16]; } BlockQ4Kx8; /* 1152 B */
/* Q6_K, per super-block (d first here, last in the file's): scales[k][c] = scale k of row c;
 * ql[q][i][2c + e] = byte 2i + e of row c's ql chunk q (32 bytes), qh[h][i][2c + e] the same of qh. */
typedef struct { uint16_t d[8]; int8_t scales[16][8]; uint8_t ql[4][16][16]; uint8_t qh[2][16][16]; } BlockQ6Kx8; /* 1680 B */
/* issue 22 q5g: Q5_1 as Q5_0's with m[8] after d[8]; Q5_K as Q4_K's with qh[i][2c + e] = byte 2i + e
 * of row c's 32 qh bytes (bit j of byte l: the fifth bit of sub-block j's value l) before qs. */
typedef struct { uint16_t d[8], m[8]; uint8_t qh[8][4]; uint8_t qs[8][16]; } BlockQ5_1x8; /* 192 B */
typedef struct { uint16_t d[8], dmin[8]; uint8_t scales[12][8]; uint8_t qh[16][16]; uint8_t qs[4][16][16]; } BlockQ5Kx8; /* 1408 B */

/* The weight kinds (kinds.c holds each one's traits; the Python table, engines/kinds.py, mirrors
 * this enum and tests/test_engine_kind_table.py checks that it does). KIND_<name>_G8: the rows of
 * <name> repacked in groups of 8 (above). One name a line: */
enum {
    KIND_Q4_1 = 4,
    KIND_Q4_0 = 40,
    KIND_Q8_0 = 8,
    KIND_Q5_0 = 50,
    KIND_Q5_1 = 51,
    KIND_Q4_K = 104,
    KIND_Q5_K = 105,
    KIND_Q6_K = 106,
    KIND_Q4_1_G8 = 204,
    KIND_Q4_0_G8 = 240,
    KIND_Q8_0_G8 = 208,
    KIND_Q5_0_G8 = 250,
    KIND_Q4_K_G8 = 304,
    KIND_Q6_K_G8 = 306,
    /* MXFP4, IQ4_NL, IQ4_XS (iq4.h) */
    KIND_MXFP4 = 70,
    KIND_IQ4_NL = 60,
    KIND_IQ4_XS = 110,
    /* issue 23: Q2_K, Q3_K (kquant23.h) */
    KIND_Q2_K = 102,
    KIND_Q3_K = 103,
    /* issue 22 q5g: Q5_1 and Q5_K in groups of 8 rows */
    KIND_Q5_1_G8 = 251,
    KIND_Q5_K_G8 = 305,
};
enum { PROLOGUE_NONE = 0, PROLOGUE_RMS_NORM = 1, PROLOGUE_SWIGLU = 2, PROLOGUE_GEGLU = 3 };

/* A linear layer's constant part, built once by the caller. */
typedef struct {
    int kind;       /* KIND_*: the layout of the weight rows */
    int prologue;   /* PROLOGUE_*: RMSNorm uses gain g and eps; SwiGLU / GeGLU read [a | b] */
    int K, N;
    float eps;
    const float* g; /* [K] or NULL */
    const void* w[MAX_PARTS];  /* parts of the weight rows, stacked: q | k | v, gate | up */
    int part_rows[MAX_PARTS];  /* rows of each part (0 for unused ones); they sum to N */
    const float* bias; /* [N] or NULL */
    int part_kind[MAX_PARTS]; /* each part's layout; 0: `kind` (parts may differ: q | k Q5_0, v Q8_0) */
    const float* post_g;      /* [N] or NULL: y = residual + rmsnorm(x W^T + bias) * post_g */
    float post_eps;
} LinearSpec;

/* ---- public entry points (loaded with ctypes) ---- */
int exo_set_threads(int n);
int exo_get_threads(void);
int exo_set_spin(long idle_ns, long wait_ns);
const char* exo_isa(void);
/* The activation format of the kinds that have 8-bit dots: 8 or 16 bits (the others always take
 * 16); returns the previous setting, or -2 for another value. */
int exo_set_activations(int bits);
int exo_qlinear(const LinearSpec* s, const float* x, int M, const float* residual, float* y);
/* n rows of file layout `kind` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), K values each, to
 * floats out [n, K], as gguf-py dequantises them (dequant.c). 0, or -2 another kind or a bad size. */
int exo_dequant_rows(int kind, const void* rows, long n, int K, float* out);
/* Rows of `kind` (one with a repacked layout) uint8 [n_rows, row bytes], n_rows a multiple of 8,
 * repacked in groups of 8 into `out` (same size; may be `rows` itself). 0, -1 out of memory, -2 a
 * kind without a repacked layout or a bad size. */
int exo_repack_rows(int kind, const uint8_t* rows, int n_rows, int K, uint8_t* out);
/* The inverse for rows index[0..n) of repacked rows `grouped` (n_rows rows): out [n, row bytes]
 * in the file's layout. 0, -2 as above or an index out of range. */
int exo_unrepack_rows(int kind, const uint8_t* grouped, int n_rows, int K, const int64_t* index, int n,
                      uint8_t* out);
int exo_attend_decode(const float* qkv, int B, int H, int KV, int hd, const float* rope,
                      const float* qk_norm, float eps, const int64_t* pages, int max_pages, int P,
                      long layer_off, const int64_t* pos, float* out);

/* ---- internal, shared between files ---- */
typedef void (*task_fn)(void* ctx, int part, int parts);
/* fn(ctx, part, parts) for part in 0..parts-1 in parallel (at most the threads in use);
 * returns when all are done. Concurrent callers take turns. */
void exo_run_parallel(task_fn fn, void* ctx, int parts);

/* Prologue of one row: src [K] (or [2K] for SwiGLU / GeGLU) -> dst [K]; K a multiple of 32. */
void exo_prologue_row(int kind, const float* src, const float* g, float eps, int K, float* dst);
/* x [K] -> K/32 int16 blocks (d = max|x| / 32767, q = round(x / d), s = d * sum(q)). */
void exo_quantize_row(const float* x, int K, BlockX* out);
/* x [K] -> K/32 int8 blocks, each by itself (d = max|x| / 127, q = round(x / d), s = d * sum(q)). */
void exo_quantize_row8(const float* x, int K, BlockX8* out);
/* This thread's scratch buffer `slot` of at least `bytes` (contents not kept across growth);
 * freed when the thread exits. NULL if out of memory. */
#define EXO_SCRATCH_SLOTS 7
enum { SCRATCH_PROLOGUE = 0, SCRATCH_QUANT = 1, SCRATCH_ATTEND = 2, SCRATCH_POST = 3, SCRATCH_UNPACK = 4,
       SCRATCH_TILE = 5, SCRATCH_XSUM = 6 };
void* exo_scratch(int slot, size_t bytes);

/* issue 23 moefast: the chosen experts of one MoE step in one call (moe.c) */
int exo_moe_experts(const LinearSpec* const* gate_up, const LinearSpec* const* down, int n_experts,
                    const int* chosen, const int* counts, int n_chosen, const int* picks, int k,
                    const float* x, int n_tokens, int D, int O, float* out);

/* issue 23 moedecode: a whole MoE feed-forward in one call (moe.c): norm, router, experts, sum */
enum { MOE_ROUTE_SOFTMAX = 0, MOE_ROUTE_SOFTMAX_SELECTED = 1, MOE_ROUTE_SIGMOID = 2 };
typedef struct { float alpha, limit; } MoeClamp;
typedef struct {
    int D, E, k;                /* width, experts, experts per token */
    float eps;
    const float* norm;          /* [D] the pre-norm's gain */
    const float* router;        /* [E, D] float32 */
    const float* router_bias;   /* [E] or NULL: added to the logits (gpt-oss) */
    const float* correction;    /* [E] or NULL: added to the sigmoid scores for choosing */
    int route_kind;             /* MOE_ROUTE_* (models/router.py's kinds) */
    int normalize, n_group, topk_group;
    float scaling;
    int clamped;                /* gpt-oss's clamped SwiGLU between gate|up and down */
    float alpha, limit;
    const LinearSpec* const* gate_up; /* [E] */
    const LinearSpec* const* down;    /* [E] */
    const LinearSpec* shared_gate_up; /* or NULL (with shared_down) */
    const LinearSpec* shared_down;
} MoeSpec;
int exo_moe_ffn(const MoeSpec* m, const float* h, int n, int add_residual, float* out, int* experts_out,
                float* weights_out);

int exo_head_linears(const LinearSpec* const* specs, int H, const float* x, int M, int K, int N, float* y);

/* issue 23 sinks: gpt-oss attention (sinks, sliding window): exo_attend_decode with sinks [H] (or NULL) in the
 * softmax's denominator and only the last `window` positions (0: all); see attention.c. */
int exo_attend_decode_sinks(const float* qkv, int B, int H, int KV, int hd, const float* rope,
                            const float* qk_norm, float eps, const int64_t* pages, int max_pages,
                            int P, long layer_off, const int64_t* pos, const float* sinks,
                            int window, float* out);
/* exo_attend_decode_sinks on a cache of floats (half 0) or of f16 half floats (half 1). */
int exo_attend_decode_kv(const float* qkv, int B, int H, int KV, int hd, const float* rope,
                         const float* qk_norm, float eps, const int64_t* pages, int max_pages,
                         int P, long layer_off, const int64_t* pos, const float* sinks,
                         int window, int half, float* out);
/* A decode step's arguments that its layers of one kind share (rows, rotary table, pages,
 * positions, window, cache type), set once a step by the caller (cpu_kernels.py's
 * DecodeAttention): each layer's call then passes only its own. */
typedef struct {
    const float* rope;
    const int64_t* pages;
    const int64_t* pos;
    int B, max_pages, P, window, half;
} AttendStep;
/* exo_attend_decode_kv(qkv, s->B, H, KV, hd, s->rope, qk_norm, eps, s->pages, s->max_pages, s->P,
 * layer_off, s->pos, sinks, s->window, s->half, out). */
int exo_attend_step(const AttendStep* s, const float* qkv, int H, int KV, int hd,
                    const float* qk_norm, float eps, long layer_off, const float* sinks, float* out);

#endif
