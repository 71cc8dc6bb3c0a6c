"""Quantised linear and decode-attention kernels for x86 CPUs (AVX2 + FMA + F16C).

Why: decoding a small model on a CPU is bound by the bytes of weights read per token and by the
number of operations per token. torch's own low-bit CPU kernels are slow on AVX2-only machines
(measured: int4/int8 weight-only matmuls at 1-4 GB/s against ~14 GB/s of memory bandwidth), so
reading 5 bits per weight instead of 16 only pays off with a kernel that keeps up with memory.
These do: 4- or 8-bit weight blocks (GGUF's Q4_1 / Q8_0 layouts) times activations quantised
per block to 16 bits, with integer multiply-adds (see the C source). A second kernel runs a
whole decode step of attention (rotate q and k, append to the cache, attend) in one call.

The C source below is compiled once per machine with the system C compiler into a cache folder
(the file name carries a hash of source, compiler and flags; a build already in the per-user
default folder is reused) and loaded with ctypes, which releases the GIL during calls. Without a compiler or AVX2, `load_kernels` returns None and the
engine falls back to torch (fbgemm float16 weights).
"""

import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from exo.worker.engines.kv_cache import PagedLayer

C_FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-shared", "-fPIC", "-std=gnu11", "-pthread")
_REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")

PROLOGUE_NONE, PROLOGUE_RMS_NORM, PROLOGUE_SWIGLU = 0, 1, 2
MAX_PARTS = 4  # weight parts a quantised linear reads in place (C: MAX_PARTS)
KIND_Q4, KIND_Q8, KIND_Q4_K, KIND_Q5_K, KIND_Q6_K = 4, 8, 104, 105, 106  # `exo_qlinear` layouts
_BLOCK_BYTES = {KIND_Q4: 20, KIND_Q8: 34, KIND_Q4_K: 144, KIND_Q5_K: 176, KIND_Q6_K: 210}

C_SOURCE = r"""
/* Quantised linear layers for x86 CPUs with AVX2 + FMA: y = prologue(x) W^T (+ bias) (+ residual).
 *
 * Weights, blocks of 32 along the input dimension (a row is nb = K / 32 blocks, in order):
 *   q4: w = d * q + m, q in 0..15: {f16 d, f16 m, 16 bytes: byte j holds element j in its low
 *       nibble and element j + 16 in its high nibble}, 20 bytes per block (GGUF's Q4_1);
 *   q8: w = d * q, q in -127..127: {f16 d, 32 x int8}, 34 bytes per block (GGUF's Q8_0).
 * Activations are quantised on the fly to int16 blocks of 32 (scale d_x, and d_x * sum q_x for
 * the q4 offset term; 15 bits keep the result within ~1e-4 of float32), so a block's dot
 * product is integer multiply-adds and one float multiply-add:
 *   q4: sum_j w_j x_j = d d_x sum_j q_j q_xj + m (d_x sum_j q_xj)
 *   q8: sum_j w_j x_j = d d_x sum_j q_j q_xj
 * Prologue applied to each row of x before quantising:
 *   0: none;  1: RMSNorm, x / sqrt(mean(x^2) + eps) * g;  2: SwiGLU, x = [a | b] -> silu(a) * b.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>

#define QK 32

/* ---- a small thread pool: workers block on a condition variable between jobs (no spinning) */

typedef void (*task_fn)(void* ctx, int part, int parts);

#define MAX_THREADS 64
static struct {
    pthread_mutex_t mu, dispatch;
    pthread_cond_t wake, done;
    pthread_t threads[MAX_THREADS];
    int n_workers;  /* started worker threads; the calling thread is part 0 */
    int n_active;   /* threads a job may use (exo_set_threads) */
    long generation;
    int pending;
    task_fn fn;
    void* ctx;
    int parts;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, {0}, 0, 1, 0, 0, NULL, NULL, 0};

static void* pool_worker(void* arg) {
    const int id = (int)(intptr_t)arg;
    long seen = 0;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (pool.generation == seen) pthread_cond_wait(&pool.wake, &pool.mu);
        seen = pool.generation;
        const task_fn fn = pool.fn;
        void* ctx = pool.ctx;
        const int parts = pool.parts;
        pthread_mutex_unlock(&pool.mu);
        if (id < parts) fn(ctx, id, parts);
        pthread_mutex_lock(&pool.mu);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done);
    }
    return NULL;
}

/* A forked child has no workers: start over with the calling thread alone. */
static void pool_after_fork_in_child(void) {
    pthread_mutex_init(&pool.mu, NULL);
    pthread_mutex_init(&pool.dispatch, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.n_workers = 0;
    pool.n_active = 1;
}

/* Use n threads (the caller plus n - 1 workers, started once). Returns the number in use. */
int exo_set_threads(int n) {
    static int fork_handler_registered = 0;
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    pthread_mutex_lock(&pool.mu);
    if (!fork_handler_registered) {
        pthread_atfork(NULL, NULL, pool_after_fork_in_child);
        fork_handler_registered = 1;
    }
    while (pool.n_workers < n - 1) {
        if (pthread_create(&pool.threads[pool.n_workers], NULL, pool_worker,
                           (void*)(intptr_t)(pool.n_workers + 1)) != 0)
            break;
        pthread_detach(pool.threads[pool.n_workers]);
        pool.n_workers++;
    }
    pool.n_active = n < pool.n_workers + 1 ? n : pool.n_workers + 1;
    pthread_mutex_unlock(&pool.mu);
    return pool.n_active;
}

/* fn(ctx, part, parts) for part in 0..parts-1, in parallel; returns when all are done.
 * Concurrent callers (e.g. tensor-parallel ranks in threads of one process) take turns. */
static void run_parallel(task_fn fn, void* ctx, int parts) {
    if (parts > pool.n_active) parts = pool.n_active;
    if (parts <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool.dispatch);
    pthread_mutex_lock(&pool.mu);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.parts = parts;
    pool.pending = pool.n_workers;
    pool.generation++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    fn(ctx, 0, parts);
    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.dispatch);
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x, |relative error| < 1e-7 on [-88, 88]: 2^n * 2^f with a degree-7 polynomial for 2^f. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(87.0f));
    __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504f));
    __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(1.5252734e-5f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530e-4f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504109e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022651e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}

/* Prologue of one row: src [K] (or [2K] for SwiGLU) -> dst [K]. */
static void prologue_row(int kind, const float* src, const float* g, float eps, int K, float* dst) {
    if (kind == 1) {
        __m256 ss = _mm256_setzero_ps();
        for (int k = 0; k < K; k += 8) {
            __m256 v = _mm256_loadu_ps(src + k);
            ss = _mm256_fmadd_ps(v, v, ss);
        }
        __m256 scale = _mm256_set1_ps(1.0f / sqrtf(hsum8(ss) / (float)K + eps));
        for (int k = 0; k < K; k += 8)
            _mm256_storeu_ps(dst + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(src + k), scale),
                                                    _mm256_loadu_ps(g + k)));
    } else if (kind == 2) {
        const __m256 one = _mm256_set1_ps(1.0f);
        for (int k = 0; k < K; k += 8) {
            __m256 a = _mm256_loadu_ps(src + k), b = _mm256_loadu_ps(src + K + k);
            __m256 silu = _mm256_div_ps(a, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), a))));
            _mm256_storeu_ps(dst + k, _mm256_mul_ps(silu, b));
        }
    } else {
        for (int k = 0; k < K; k++) dst[k] = src[k];
    }
}

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

typedef struct { uint16_t d, m; uint8_t qs[16]; } BlockQ4;   /* w = d q + m  (f16 d, m) */
typedef struct { uint16_t d; int8_t qs[32]; } BlockQ8;       /* w = d q      (f16 d) */
typedef struct { float d, s; int16_t qs[32]; } BlockX;        /* x = d q, s = d sum(q) */

/* x [K] -> K/32 int16 blocks (scale d = max|x| / 32767, s = d * sum(q)). */
static void quantize_row(const float* x, int K, BlockX* out) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int b = 0; b < K / QK; b++) {
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + b * QK + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_and_ps(v[j], absmask));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float mx = _mm_cvtss_f32(m4);
        const __m256 inv = _mm256_set1_ps(mx > 0.0f ? 32767.0f / mx : 0.0f);
        __m256i i[4];
        for (int j = 0; j < 4; j++)
            i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], inv),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        /* packs works within 128-bit lanes: put the 64-bit quarters back in order */
        _mm256_storeu_si256((__m256i*)out[b].qs, _mm256_permute4x64_epi64(_mm256_packs_epi32(i[0], i[1]), 0xD8));
        _mm256_storeu_si256((__m256i*)(out[b].qs + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(i[2], i[3]), 0xD8));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_hadd_epi32(s4, s4);
        s4 = _mm_hadd_epi32(s4, s4);
        out[b].d = mx / 32767.0f;
        out[b].s = out[b].d * (float)_mm_cvtsi128_si32(s4);
    }
}

/* One weight row against R activation rows (R = 1 or 4: the weights are unpacked once). */
#define DEFINE_DOT_Q4(R)                                                                          \
static inline void dot_q4_##R(const BlockQ4* w, const BlockX* x, int nb, float* out) {          \
    const __m256i low = _mm256_set1_epi16(0x0F);                                                 \
    __m256 acc[R];                                                                               \
    float accm[R];                                                                               \
    for (int r = 0; r < R; r++) { acc[r] = _mm256_setzero_ps(); accm[r] = 0.0f; }                \
    for (int b = 0; b < nb; b++) {                                                               \
        const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)w[b].qs));    \
        const __m256i q0 = _mm256_and_si256(bytes, low);    /* elements 0..15 */                 \
        const __m256i q1 = _mm256_srli_epi16(bytes, 4);     /* elements 16..31 */                \
        const float d = h2f(w[b].d), m = h2f(w[b].m);                                            \
        for (int r = 0; r < R; r++) {                                                            \
            const BlockX* xb = x + (size_t)r * nb + b;                                           \
            const __m256i p = _mm256_add_epi32(                                                  \
                _mm256_madd_epi16(q0, _mm256_loadu_si256((const __m256i*)xb->qs)),               \
                _mm256_madd_epi16(q1, _mm256_loadu_si256((const __m256i*)(xb->qs + 16))));       \
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r]);  \
            accm[r] += m * xb->s;                                                                \
        }                                                                                        \
    }                                                                                            \
    for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]) + accm[r];                                \
}
DEFINE_DOT_Q4(1)
DEFINE_DOT_Q4(4)

#define DEFINE_DOT_Q8(R)                                                                          \
static inline void dot_q8_##R(const BlockQ8* w, const BlockX* x, int nb, float* out) {          \
    __m256 acc[R];                                                                               \
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                    \
    for (int b = 0; b < nb; b++) {                                                               \
        const __m256i q0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w[b].qs));      \
        const __m256i q1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w[b].qs + 16))); \
        const float d = h2f(w[b].d);                                                             \
        for (int r = 0; r < R; r++) {                                                            \
            const BlockX* xb = x + (size_t)r * nb + b;                                           \
            const __m256i p = _mm256_add_epi32(                                                  \
                _mm256_madd_epi16(q0, _mm256_loadu_si256((const __m256i*)xb->qs)),               \
                _mm256_madd_epi16(q1, _mm256_loadu_si256((const __m256i*)(xb->qs + 16))));       \
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[r]);  \
        }                                                                                        \
    }                                                                                            \
    for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]);                                          \
}
DEFINE_DOT_Q8(1)
DEFINE_DOT_Q8(4)

/* ---- K-quants (llama.cpp's super-blocks of 256 values), one activation row at a time ------ */

typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } BlockQ4K; /* 144 B */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } BlockQ6K; /* 210 B */

/* Q4_K: sub-block j (32 values) is d * sc_j * q - dmin * m_j, q in 0..15; (sc, m) are 6-bit
 * pairs packed in 12 bytes; 64-value chunk c holds sub-block 2c in the low nibbles of its 32
 * bytes and 2c + 1 in the high ones. */
static inline void q4k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static inline __m256i madd_halves(__m128i lo16, __m128i hi16, const BlockX* xb, int is_signed) {
    const __m256i a = is_signed ? _mm256_cvtepi8_epi16(lo16) : _mm256_cvtepu8_epi16(lo16);
    const __m256i b = is_signed ? _mm256_cvtepi8_epi16(hi16) : _mm256_cvtepu8_epi16(hi16);
    return _mm256_add_epi32(_mm256_madd_epi16(a, _mm256_loadu_si256((const __m256i*)xb->qs)),
                            _mm256_madd_epi16(b, _mm256_loadu_si256((const __m256i*)(xb->qs + 16))));
}

static float dot_q4k(const BlockQ4K* w, const BlockX* x, int nsb) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0.0f;
    for (int s = 0; s < nsb; s++) {
        const float d = h2f(w[s].d), dmin = h2f(w[s].dmin);
        for (int c = 0; c < 4; c++) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i*)(w[s].qs + 32 * c));
            const __m256i q[2] = {_mm256_and_si256(bytes, low),
                                  _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low)};
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h;
                int sc, m;
                q4k_scale_min(w[s].scales, j, &sc, &m);
                const BlockX* xb = x + (size_t)s * 8 + j;
                const __m256i p = madd_halves(_mm256_castsi256_si128(q[h]),
                                              _mm256_extracti128_si256(q[h], 1), xb, 0);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc * xb->d), _mm256_cvtepi32_ps(p), acc);
                accm -= dmin * (float)m * xb->s;
            }
        }
    }
    return hsum8(acc) + accm;
}

/* Q5_K: Q4_K with a fifth bit: value j of sub-block 2c + h gets 16 * bit (2c + h) of qh[l]. */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } BlockQ5K;

static float dot_q5k(const BlockQ5K* w, const BlockX* x, int nsb) {
    const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0.0f;
    for (int s = 0; s < nsb; s++) {
        const float d = h2f(w[s].d), dmin = h2f(w[s].dmin);
        const __m256i qh = _mm256_loadu_si256((const __m256i*)w[s].qh);
        for (int c = 0; c < 4; c++) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i*)(w[s].qs + 32 * c));
            const __m256i nib[2] = {_mm256_and_si256(bytes, low),
                                    _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low)};
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h;
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, j), one);
                const __m256i q = _mm256_or_si256(nib[h], _mm256_slli_epi16(hb, 4));
                int sc, m;
                q4k_scale_min(w[s].scales, j, &sc, &m);
                const BlockX* xb = x + (size_t)s * 8 + j;
                const __m256i p = madd_halves(_mm256_castsi256_si128(q),
                                              _mm256_extracti128_si256(q, 1), xb, 0);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc * xb->d), _mm256_cvtepi32_ps(p), acc);
                accm -= dmin * (float)m * xb->s;
            }
        }
    }
    return hsum8(acc) + accm;
}

/* Q6_K: sub-block j (16 values) is d * sc_j * (q - 32), q in 0..63: low 4 bits in ql, high 2
 * in qh. 32-value group g = 4n + k (half n, quarter k): low bits from ql[64n + 32(k & 1) + l]
 * (low nibble for k < 2, high for k >= 2), high bits from qh[32n + l] >> 2k. */
static float dot_q6k(const BlockQ6K* w, const BlockX* x, int nsb) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
    const __m256i off = _mm256_set1_epi8(32);
    __m256 acc = _mm256_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const float d = h2f(w[s].d);
        for (int g = 0; g < 8; g++) {
            const int n = g / 4, k = g % 4;
            const __m256i ql = _mm256_loadu_si256((const __m256i*)(w[s].ql + 64 * n + 32 * (k & 1)));
            const __m256i qh = _mm256_loadu_si256((const __m256i*)(w[s].qh + 32 * n));
            const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2);
            const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), off);
            const BlockX* xb = x + (size_t)s * 8 + g;
            const __m256i a = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
            const __m256i b = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
            const __m256i p0 = _mm256_madd_epi16(a, _mm256_loadu_si256((const __m256i*)xb->qs));
            const __m256i p1 = _mm256_madd_epi16(b, _mm256_loadu_si256((const __m256i*)(xb->qs + 16)));
            const float dd = d * xb->d;
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dd * w[s].scales[2 * g]), _mm256_cvtepi32_ps(p0), acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dd * w[s].scales[2 * g + 1]), _mm256_cvtepi32_ps(p1), acc);
        }
    }
    return hsum8(acc);
}

/* Per-thread scratch for the prologue output and quantised activations, grown, never shrunk. */
static __thread float* scratch_f;
static __thread BlockX* scratch_x;
static __thread size_t scratch_rows_k;

static int reserve(size_t rows_k) {
    if (rows_k <= scratch_rows_k) return 0;
    free(scratch_f);
    free(scratch_x);
    scratch_f = malloc(rows_k * sizeof(float));
    scratch_x = malloc((rows_k / QK) * sizeof(BlockX));
    scratch_rows_k = (scratch_f && scratch_x) ? rows_k : 0;
    return scratch_rows_k ? 0 : -1;
}

#define MAX_PARTS 4

typedef struct {
    int kind, M, N, nb;
    const BlockX* x;
    const void* const* w;   /* [MAX_PARTS] row blocks of each part, stacked along the output */
    const int* part_rows;   /* [MAX_PARTS] rows of each part (0 for unused parts) */
    const float *bias, *residual;
    float* y;
} LinearJob;

/* The blocks of output row n: a row of the part that holds it. */
static inline const void* weight_row(const LinearJob* j, int n, size_t row_bytes) {
    int p = 0;
    while (p < MAX_PARTS - 1 && n >= j->part_rows[p]) n -= j->part_rows[p++];
    return (const char*)j->w[p] + (size_t)n * row_bytes;
}

/* Output columns [N * part / parts, N * (part + 1) / parts) of a linear job. */
static void linear_part(void* ctx, int part, int parts) {
    const LinearJob* j = (const LinearJob*)ctx;
    const int n0 = (int)((long)j->N * part / parts), n1 = (int)((long)j->N * (part + 1) / parts);
    const int TM = 64; /* activation rows per pass over the weights (they stay in L2) */
    const int nb = j->nb;
    float out[4];
    for (int m0 = 0; m0 < j->M; m0 += TM) {
        const int m1 = m0 + TM < j->M ? m0 + TM : j->M;
        for (int n = n0; n < n1; n++) {
            const float bn = j->bias ? j->bias[n] : 0.0f;
            for (int m = m0; m < m1;) {
                const int R = j->kind < 100 && m1 - m >= 4 ? 4 : 1;
                const BlockX* xr = j->x + (size_t)m * nb;
                if (j->kind == 104) {
                    const BlockQ4K* wr = (const BlockQ4K*)weight_row(j, n, nb / 8 * sizeof(BlockQ4K));
                    out[0] = dot_q4k(wr, xr, nb / 8);
                } else if (j->kind == 105) {
                    const BlockQ5K* wr = (const BlockQ5K*)weight_row(j, n, nb / 8 * sizeof(BlockQ5K));
                    out[0] = dot_q5k(wr, xr, nb / 8);
                } else if (j->kind == 106) {
                    const BlockQ6K* wr = (const BlockQ6K*)weight_row(j, n, nb / 8 * sizeof(BlockQ6K));
                    out[0] = dot_q6k(wr, xr, nb / 8);
                } else if (j->kind == 4) {
                    const BlockQ4* wr = (const BlockQ4*)weight_row(j, n, nb * sizeof(BlockQ4));
                    if (R == 4) dot_q4_4(wr, xr, nb, out); else dot_q4_1(wr, xr, nb, out);
                } else {
                    const BlockQ8* wr = (const BlockQ8*)weight_row(j, n, nb * sizeof(BlockQ8));
                    if (R == 4) dot_q8_4(wr, xr, nb, out); else dot_q8_1(wr, xr, nb, out);
                }
                for (int r = 0; r < R; r++) {
                    const size_t i = (size_t)(m + r) * j->N + n;
                    j->y[i] = out[r] + bn + (j->residual ? j->residual[i] : 0.0f);
                }
                m += R;
            }
        }
    }
}

/* A linear layer's constant part, built once by the caller. */
typedef struct {
    int kind;       /* 4: w = q4 rows [N][K/32 blocks]; 8: q8 rows; 104/105/106: Q4_K/Q5_K/Q6_K */
    int prologue;   /* 0 none, 1 RMSNorm (gain g, eps), 2 SwiGLU */
    int K, N;
    float eps;
    const float* g; /* [K] or NULL */
    const void* w[MAX_PARTS];  /* parts of the weight rows, stacked: q | k | v, gate | up */
    int part_rows[MAX_PARTS];  /* rows of each part; they sum to N */
    const float* bias; /* [N] or NULL */
} LinearSpec;

/* y [M, N] = prologue(x) W^T + bias + residual. x is [M, K] ([M, 2K] for SwiGLU); residual
 * [M, N] is optional (NULL) and may be y itself. Returns 0 on success. */
int exo_qlinear(const LinearSpec* s, const float* x, int M, const float* residual, float* y) {
    const int K = s->K, N = s->N;
    if (K % QK != 0 || (s->kind != 4 && s->kind != 8 && (s->kind < 104 || s->kind > 106))) return -2;
    if (s->kind > 100 && K % 256 != 0) return -2;
    const int nb = K / QK;
    if (reserve((size_t)M * K)) return -1;
    const size_t x_stride = s->prologue == 2 ? 2 * (size_t)K : (size_t)K;
    for (int m = 0; m < M; m++) {
        float* row = scratch_f + (size_t)m * K;
        prologue_row(s->prologue, x + m * x_stride, s->g, s->eps, K, row);
        quantize_row(row, K, scratch_x + (size_t)m * nb);
    }
    LinearJob job = {s->kind, M, N, nb, scratch_x, s->w, s->part_rows, s->bias, residual, y};
    /* a part per thread, if each gets at least ~64k weight-rows of work */
    const long work = (long)M * N * K;
    const int parts = work >= (1L << 16) * 2 ? (int)(work >> 16) : 1;
    run_parallel(linear_part, &job, parts);
    return 0;
}

/* ---- decode attention ---------------------------------------------------------------------- */

/* Rotate the pairs (x[2i], x[2i+1]) of one head by the angles of `rot` ([hd/2] of (cos, sin)). */
static void rotate_head(float* x, const float* rot, int hd) {
    for (int i = 0; i < hd / 2; i++) {
        const float c = rot[2 * i], s = rot[2 * i + 1];
        const float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = a * s + b * c;
    }
}

static void rms_norm_head(float* x, const float* g, float eps, int hd) {
    float ss = 0.0f;
    for (int i = 0; i < hd; i++) ss += x[i] * x[i];
    const float scale = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int i = 0; i < hd; i++) x[i] = x[i] * scale * g[i];
}

static inline float dot_f32(const float* a, const float* b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum8(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* s[t] = scale * q . k_t for t < L (k rows of hd floats); four rows at a time, one reduction. */
static void scores_f32(const float* q, const float* k, int L, int hd, float scale, float* s) {
    int t = 0;
    if (hd % 8 == 0) {
        for (; t + 4 <= L; t += 4) {
            const float* k0 = k + (size_t)t * hd;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int i = 0; i < hd; i += 8) {
                const __m256 qv = _mm256_loadu_ps(q + i);
                a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
                a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + hd + i), a1);
                a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * hd + i), a2);
                a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * hd + i), a3);
            }
            const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
            const __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            _mm_storeu_ps(s + t, _mm_mul_ps(r, _mm_set1_ps(scale)));
        }
    }
    for (; t < L; t++) s[t] = scale * dot_f32(q, k + (size_t)t * hd, hd);
}

/* o += sum_t p[t] v_t (v rows of hd floats), 64 dimensions at a time in registers. */
static void weighted_sum_f32(const float* p, const float* v, int L, int hd, float* o) {
    if (hd % 64 != 0) {
        for (int t = 0; t < L; t++) {
            const float* vt = v + (size_t)t * hd;
            for (int i = 0; i < hd; i++) o[i] += p[t] * vt[i];
        }
        return;
    }
    for (int i0 = 0; i0 < hd; i0 += 64) {
        __m256 acc[8];
        for (int j = 0; j < 8; j++) acc[j] = _mm256_loadu_ps(o + i0 + 8 * j);
        for (int t = 0; t < L; t++) {
            const __m256 pt = _mm256_set1_ps(p[t]);
            const float* vt = v + (size_t)t * hd + i0;
            for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 8 * j), acc[j]);
        }
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(o + i0 + 8 * j, acc[j]);
    }
}

static __thread float* scratch_att;
static __thread size_t scratch_att_n;

typedef struct {
    const float* qkv;
    int B, H, KV, hd;
    const float *rope, *qk_norm;
    float eps;
    const int64_t* pages; /* [B, max_pages] page addresses: page [L, 2, KV, P, hd] floats */
    int max_pages, P;
    long layer_off;       /* floats from a page's start to this layer's keys */
    const int64_t* pos;
    float* out;
    int failed;
} AttendJob;

/* Row b's key (kv = 0) or value (kv = 1) of kv head j at position t. */
static inline float* cached(const AttendJob* a, int b, int kv, int j, int t) {
    float* page = (float*)(intptr_t)a->pages[(size_t)b * a->max_pages + t / a->P];
    return page + a->layer_off + (((size_t)kv * a->KV + j) * a->P + t % a->P) * a->hd;
}

/* Task (b, j): row b's kv head j and the G query heads that share it. */
static void attend_task(const AttendJob* a, int b, int j, float* scratch) {
    const int G = a->H / a->KV, hd = a->hd;
    const float* row = a->qkv + (size_t)b * (a->H + 2 * a->KV) * hd;
    const int p = (int)a->pos[b], P = a->P;
    const float* rot = a->rope + (size_t)p * hd;
    const int L = p + 1;
    float* q = scratch;               /* [G, hd] */
    float* scores = scratch + G * hd; /* [L] */
    float* kp = cached(a, b, 0, j, p);
    float* vp = cached(a, b, 1, j, p);
    const int kh = a->H + j; /* k head j within the q | k | v row */
    for (int i = 0; i < hd; i++) {
        kp[i] = row[(size_t)kh * hd + i];
        vp[i] = row[(size_t)(a->H + a->KV + j) * hd + i];
    }
    if (a->qk_norm) rms_norm_head(kp, a->qk_norm + (size_t)kh * hd, a->eps, hd);
    rotate_head(kp, rot, hd);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int g = 0; g < G; g++) {
        const int h = j * G + g;
        float* qg = q + (size_t)g * hd;
        for (int i = 0; i < hd; i++) qg[i] = row[(size_t)h * hd + i];
        if (a->qk_norm) rms_norm_head(qg, a->qk_norm + (size_t)h * hd, a->eps, hd);
        rotate_head(qg, rot, hd);
        for (int t0 = 0; t0 < L; t0 += P) /* a page's keys are contiguous */
            scores_f32(qg, cached(a, b, 0, j, t0), L - t0 < P ? L - t0 : P, hd, scale, scores + t0);
        float mx = -INFINITY;
        for (int t = 0; t < L; t++) mx = scores[t] > mx ? scores[t] : mx;
        int t = 0;
        const __m256 vmx = _mm256_set1_ps(mx);
        __m256 vtot = _mm256_setzero_ps();
        for (; t + 8 <= L; t += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + t), vmx));
            _mm256_storeu_ps(scores + t, e);
            vtot = _mm256_add_ps(vtot, e);
        }
        float total = hsum8(vtot);
        for (; t < L; t++) {
            scores[t] = expf(scores[t] - mx);
            total += scores[t];
        }
        const float inv = 1.0f / total;
        for (t = 0; t < L; t++) scores[t] *= inv;
        float* o = a->out + ((size_t)b * a->H + h) * hd;
        for (int i = 0; i < hd; i++) o[i] = 0.0f;
        for (int t0 = 0; t0 < L; t0 += P)
            weighted_sum_f32(scores + t0, cached(a, b, 1, j, t0), L - t0 < P ? L - t0 : P, hd, o);
    }
}

static void attend_part(void* ctx, int part, int parts) {
    AttendJob* a = (AttendJob*)ctx;
    const int tasks = a->B * a->KV;
    const size_t need = (size_t)(a->H / a->KV) * a->hd + (size_t)a->max_pages * a->P;
    if (need > scratch_att_n) {
        free(scratch_att);
        scratch_att = malloc(need * sizeof(float));
        scratch_att_n = scratch_att ? need : 0;
        if (!scratch_att) {
            a->failed = 1;
            return;
        }
    }
    for (int t = tasks * part / parts; t < tasks * (part + 1) / parts; t++)
        attend_task(a, t / a->KV, t % a->KV, scratch_att);
}

/* One decoding step of B rows, one new token each:
 *   q, k = rotate(qkv's q and k heads) (after a per-head RMSNorm when qk_norm is given),
 *   cache[pos] = k, v;  out = softmax(q K^T / sqrt(hd)) V over positions 0..pos.
 * qkv [B, (H + 2KV) * hd]; rope [positions, hd/2, 2] (cos, sin); qk_norm [H + KV, hd] or NULL;
 * the paged cache: pages [B, max_pages] addresses of pages [L, 2, KV, P, hd] (keys, values of
 * P positions), this layer at float offset layer_off; pos [B]; out [B, H * hd].
 * Returns 0 on success. */
int exo_attend_decode(const float* qkv, int B, int H, int KV, int hd, const float* rope,
                      const float* qk_norm, float eps, const int64_t* pages, int max_pages, int P,
                      long layer_off, const int64_t* pos, float* out) {
    long work = 0; /* multiply-adds, to decide whether threads pay off */
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0 || pos[b] >= (int64_t)max_pages * P) return -3;
        for (int t0 = 0; t0 <= pos[b]; t0 += P)
            if (pages[(size_t)b * max_pages + t0 / P] == 0) return -4;
        work += 2 * (pos[b] + 1) * (long)H * hd;
    }
    AttendJob job = {qkv, B, H, KV, hd, rope, qk_norm, eps, pages, max_pages, P, layer_off,
                     pos, out, 0};
    const int tasks = B * KV;
    const int parts = work >= (1L << 17) ? tasks : 1;
    run_parallel(attend_part, &job, parts);
    return job.failed ? -1 : 0;
}
"""


def default_kernel_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"exo-kernels-{os.getuid()}"


def cpu_supports_kernels() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    flags_line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    flags = set(flags_line.split(":", 1)[-1].split())
    return all(f in flags for f in _REQUIRED_CPU_FLAGS)


def _compile(compiler: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "exo_qlinear.c"
        src.write_text(C_SOURCE, encoding="utf-8")
        lib = Path(tmp) / out.name
        subprocess.run(
            [compiler, *C_FLAGS, str(src), "-o", str(lib), "-lm"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        lib.replace(out)  # atomic: concurrent runners never load a half-written file


class _LinearSpec(ctypes.Structure):
    _fields_: ClassVar = [
        ("kind", ctypes.c_int),
        ("prologue", ctypes.c_int),
        ("K", ctypes.c_int),
        ("N", ctypes.c_int),
        ("eps", ctypes.c_float),
        ("g", ctypes.c_void_p),
        ("w", ctypes.c_void_p * MAX_PARTS),
        ("part_rows", ctypes.c_int * MAX_PARTS),
        ("bias", ctypes.c_void_p),
    ]


class QuantWeights:
    """A linear layer's quantised weights (and prologue) as the kernel reads them.

    `parts`: up to MAX_PARTS block matrices uint8 [rows_i, k / 32 * (20 or 34)] whose rows stack
    into the layer's N outputs (q | k | v): the kernel reads each where it lies, so stacking
    them costs no copy.
    """

    def __init__(
        self,
        bits: int,
        prologue: int,
        parts: list[Tensor],
        gain: Tensor | None,
        eps: float,
        bias: Tensor | None,
        k: int,
    ) -> None:
        if not 1 <= len(parts) <= MAX_PARTS:
            raise ValueError(f"a quantised linear takes 1 to {MAX_PARTS} parts")
        row_bytes = k // 32 * _BLOCK_BYTES[bits] if bits < 100 else k // 256 * _BLOCK_BYTES[bits]
        self.parts = [p.contiguous() for p in parts]
        if any(p.dtype != torch.uint8 or p[0].numel() != row_bytes for p in self.parts):
            raise ValueError(f"each part must be uint8 rows of {row_bytes} bytes")
        self.gain = None if gain is None else gain.float().contiguous()
        self.bias = None if bias is None else bias.float().contiguous()
        self.n = sum(p.shape[0] for p in self.parts)
        self.bits, self.k = bits, k
        pointers = [p.data_ptr() for p in self.parts] + [0] * (MAX_PARTS - len(parts))
        rows = [p.shape[0] for p in self.parts] + [0] * (MAX_PARTS - len(parts))
        self.spec = _LinearSpec(
            bits,
            prologue,
            k,
            self.n,
            eps,
            None if self.gain is None else self.gain.data_ptr(),
            (ctypes.c_void_p * MAX_PARTS)(*pointers),
            (ctypes.c_int * MAX_PARTS)(*rows),
            None if self.bias is None else self.bias.data_ptr(),
        )
        self.spec_address = ctypes.addressof(self.spec)


class QKernels:
    """The loaded library, with typed wrappers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        self._fn = lib.exo_qlinear
        self._fn.argtypes = [p, p, i, p, p]
        self._fn.restype = i
        self._set_threads = lib.exo_set_threads
        self._set_threads.argtypes = [i]
        self._set_threads.restype = i
        self._attend = lib.exo_attend_decode
        self._attend.argtypes = [p, i, i, i, i, p, p, f, p, i, i, ctypes.c_long, p, p]
        self._attend.restype = i

    def linear(self, w: QuantWeights, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """y [..., n] = prologue(x) W^T + bias + residual; float32 in and out."""
        x = x.contiguous()
        y = torch.empty((*x.shape[:-1], w.n), dtype=torch.float32)
        res = None if residual is None else residual.contiguous().data_ptr()
        rc = self._fn(w.spec_address, x.data_ptr(), x.numel() // x.shape[-1], res, y.data_ptr())
        if rc != 0:
            raise RuntimeError(f"exo_qlinear failed with code {rc}")
        return y

    def set_threads(self, n: int) -> int:
        """Threads the kernels use (the caller and n - 1 workers that sleep between jobs)."""
        return int(self._set_threads(n))

    def attend_decode(
        self,
        qkv: Tensor,
        heads: int,
        kv_heads: int,
        head_dim: int,
        rope: Tensor,
        qk_norm: Tensor | None,
        eps: float,
        cache: PagedLayer,
        positions: Tensor,
    ) -> Tensor:
        """One decode step of attention (see the C source): qkv [B, 1, W] -> [B, 1, H * hd].

        rope: complex64 [P, hd/2]; cache: the step's pages (float32, `kv_cache.py`) for this
        layer; positions: int64 [B].
        """
        bsz = qkv.shape[0]
        qkv = qkv.contiguous()
        pages = cache.pages.contiguous()
        if pages.dtype != torch.int64 or pages.shape[0] != bsz or positions.shape != (bsz,):
            raise ValueError("attend_decode: pages [B, n] int64 and positions [B] expected")
        out = torch.empty((bsz, 1, heads * head_dim), dtype=torch.float32)
        rc = self._attend(
            qkv.data_ptr(),
            bsz,
            heads,
            kv_heads,
            head_dim,
            rope.data_ptr(),
            None if qk_norm is None else qk_norm.data_ptr(),
            eps,
            pages.data_ptr(),
            pages.shape[1],
            cache.page,
            cache.offset,
            positions.contiguous().data_ptr(),
            out.data_ptr(),
        )
        if rc != 0:
            raise RuntimeError(f"exo_attend_decode failed with code {rc}")
        return out


def _private_dir(folder: Path) -> bool:
    """Create `folder` if needed; True if only we can write to it (we load code from it)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


@cache
def load_kernels(kernel_dir: Path | None = None) -> QKernels | None:
    """The compiled kernels, or None where they cannot run (not x86 AVX2, no C compiler)."""
    if os.environ.get("EXO_DISABLE_CPU_KERNELS") or not cpu_supports_kernels():
        return None
    compiler = (
        os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    )
    folder = kernel_dir or default_kernel_dir()
    if compiler is None or not _private_dir(folder):
        return None
    key = hashlib.sha256("\0".join([C_SOURCE, compiler, *C_FLAGS]).encode()).hexdigest()[:16]
    name = f"exo_qlinear_{key}.so"
    out, shared = folder / name, default_kernel_dir() / name
    try:
        if not out.exists():
            if shared.exists() and _private_dir(shared.parent):  # built before, elsewhere
                out = shared
            else:
                _compile(compiler, out)
        return QKernels(ctypes.CDLL(str(out)))
    except (OSError, subprocess.SubprocessError):
        return None
