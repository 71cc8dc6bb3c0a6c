"""Quantised linear kernels for x86 CPUs (AVX2 + FMA), compiled on first use, called via ctypes.

Why: decoding a small model on a CPU is bound by the bytes of weights read per token. torch's
own low-bit CPU kernels are slow on AVX2-only machines (measured: int4/int8 weight-only matmuls
ran at 1-4 GB/s against ~14 GB/s of memory bandwidth), so reading 4.5-9 bits per weight instead
of 16 only pays off with a kernel that keeps up with memory. This one does: int8 activations
times 4- or 8-bit weight blocks with one integer multiply-add per 32 weights (see the C source).

The C source below is compiled once per machine with the system C compiler into `kernel_dir`
(a cache folder; the file name carries a hash of source and flags) and loaded with ctypes, which
releases the GIL during calls. Without a compiler or AVX2, `load_kernels` returns None and the
engine falls back to the torch weight formats.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

C_FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-shared", "-fPIC", "-std=c11")
_REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")

PROLOGUE_NONE, PROLOGUE_RMS_NORM, PROLOGUE_SWIGLU = 0, 1, 2

C_SOURCE = r"""
/* Quantised linear layers for x86 CPUs with AVX2 + FMA: y = prologue(x) W^T (+ bias) (+ residual).
 *
 * Weights, blocks of 32 along the input dimension:
 *   q4: w = d * q + m, q in 0..15; 16 bytes per block (byte j: low nibble = element j,
 *       high nibble = element j + 16), d and m float32 per block.
 *   q8: w = d * q, q in -127..127; 32 bytes per block, d float32 per block.
 * Activations are quantised on the fly to int8 blocks of 32 (scale d_x, and d_x * sum q_x for
 * the q4 offset term), so each block's dot product is one integer multiply-add:
 *   q4: sum_j w_j x_j = d d_x sum_j q_j q_xj + m (d_x sum_j q_xj)
 *   q8: sum_j w_j x_j = d d_x sum_j q_j q_xj
 * Prologue applied to each row of x before quantising:
 *   0: none;  1: RMSNorm, x / sqrt(mean(x^2) + eps) * g;  2: SwiGLU, x = [a | b] -> silu(a) * b.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define QK 32

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

/* x [K] -> q [K] int8, d [K/32] scales, s [K/32] = d * sum(q). */
static void quantize_row(const float* x, int K, int8_t* q, float* d, float* s) {
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
        float mx = _mm_cvtss_f32(m4);
        __m256 inv = _mm256_set1_ps(mx > 0.0f ? 127.0f / mx : 0.0f);
        __m256i i[4];
        for (int j = 0; j < 4; j++)
            i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], inv),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i*)(q + b * QK), p);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_hadd_epi32(s4, s4);
        s4 = _mm_hadd_epi32(s4, s4);
        d[b] = mx / 127.0f;
        s[b] = d[b] * (float)_mm_cvtsi128_si32(s4);
    }
}

typedef struct {
    const int8_t* q; /* [R][K] */
    const float* d;  /* [R][nb] */
    const float* s;  /* [R][nb] */
} QRows;

/* One weight row against R (1..4) activation rows; out[r] = dot. */
#define R_MAX 4
static void dot_q4(const uint8_t* w, const float* wd, const float* wm, QRows x, int K, int R, float* out) {
    const int nb = K / QK;
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[R_MAX];
    float accm[R_MAX];
    for (int r = 0; r < R; r++) { acc[r] = _mm256_setzero_ps(); accm[r] = 0.0f; }
    for (int b = 0; b < nb; b++) {
        __m128i raw = _mm_loadu_si128((const __m128i*)(w + 16 * b));
        __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
        for (int r = 0; r < R; r++) {
            __m256i xq = _mm256_loadu_si256((const __m256i*)(x.q + (size_t)r * K + QK * b));
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd[b] * x.d[r * nb + b]), _mm256_cvtepi32_ps(p), acc[r]);
            accm[r] += wm[b] * x.s[r * nb + b];
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]) + accm[r];
}

static void dot_q8(const int8_t* w, const float* wd, QRows x, int K, int R, float* out) {
    const int nb = K / QK;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[R_MAX];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i q = _mm256_loadu_si256((const __m256i*)(w + QK * b));
        __m256i aq = _mm256_sign_epi8(q, q);
        for (int r = 0; r < R; r++) {
            __m256i xq = _mm256_loadu_si256((const __m256i*)(x.q + (size_t)r * K + QK * b));
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(xq, q)), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd[b] * x.d[r * nb + b]), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum8(acc[r]);
}

/* Per-thread scratch for the quantised activations, grown as needed, never shrunk. */
static __thread int8_t* scratch_q;
static __thread float* scratch_f;
static __thread size_t scratch_rows_k;

static int reserve(size_t rows_k) {
    if (rows_k <= scratch_rows_k) return 0;
    free(scratch_q);
    free(scratch_f);
    scratch_q = malloc(rows_k);
    scratch_f = malloc(rows_k * sizeof(float) + 2 * (rows_k / QK) * sizeof(float));
    scratch_rows_k = (scratch_q && scratch_f) ? rows_k : 0;
    return scratch_rows_k ? 0 : -1;
}

/* y [M, N] = prologue(x) W^T + bias + residual. x is [M, K] ([M, 2K] for SwiGLU).
 * kind: 4 (q4: wq uint8 [N, K/2], wd, wm [N, K/32]) or 8 (q8: wq int8 [N, K], wd [N, K/32]).
 * bias [N] and residual [M, N] are optional (NULL); residual may be y itself. Returns 0 on success. */
int exo_qlinear(int kind, int prologue, const float* x, const float* g, float eps, int M, int K,
                const void* wq, const float* wd, const float* wm, const float* bias,
                const float* residual, int N, float* y) {
    if (K % QK != 0 || (kind != 4 && kind != 8)) return -2;
    const int nb = K / QK;
    if (reserve((size_t)M * K)) return -1;
    float* xf = scratch_f;
    float* xd = scratch_f + (size_t)M * K;
    float* xs = xd + (size_t)M * nb;
    const size_t x_stride = prologue == 2 ? 2 * (size_t)K : (size_t)K;
    for (int m = 0; m < M; m++) {
        prologue_row(prologue, x + m * x_stride, g, eps, K, xf + (size_t)m * K);
        quantize_row(xf + (size_t)m * K, K, scratch_q + (size_t)m * K, xd + (size_t)m * nb, xs + (size_t)m * nb);
    }
    const int TM = 64; /* activation rows per pass over the weights (stay in L2) */
    float out[R_MAX];
    for (int m0 = 0; m0 < M; m0 += TM) {
        const int m1 = m0 + TM < M ? m0 + TM : M;
        for (int n = 0; n < N; n++) {
            const float bn = bias ? bias[n] : 0.0f;
            for (int m = m0; m < m1; m += R_MAX) {
                const int R = m1 - m < R_MAX ? m1 - m : R_MAX;
                QRows xr = {scratch_q + (size_t)m * K, xd + (size_t)m * nb, xs + (size_t)m * nb};
                if (kind == 4)
                    dot_q4((const uint8_t*)wq + (size_t)n * (K / 2), wd + (size_t)n * nb,
                           wm + (size_t)n * nb, xr, K, R, out);
                else
                    dot_q8((const int8_t*)wq + (size_t)n * K, wd + (size_t)n * nb, xr, K, R, out);
                for (int r = 0; r < R; r++) {
                    const size_t i = (size_t)(m + r) * N + n;
                    y[i] = out[r] + bn + (residual ? residual[i] : 0.0f);
                }
            }
        }
    }
    return 0;
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


class QKernels:
    """The loaded library, with typed wrappers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = lib.exo_qlinear
        p, i = ctypes.c_void_p, ctypes.c_int
        self._fn.argtypes = [i, i, p, p, ctypes.c_float, i, i, p, p, p, p, p, i, p]
        self._fn.restype = i

    def linear(
        self,
        kind: int,
        prologue: int,
        x: Tensor,
        gain: Tensor | None,
        eps: float,
        k: int,
        wq: Tensor,
        wd: Tensor,
        wm: Tensor | None,
        bias: Tensor | None,
        residual: Tensor | None,
        n: int,
    ) -> Tensor:
        """y [..., n] = prologue(x) W^T + bias + residual, all float32 and contiguous."""
        x = x.contiguous()
        m = x.numel() // x.shape[-1]
        y = torch.empty((*x.shape[:-1], n), dtype=torch.float32)
        if residual is not None:
            residual = residual.contiguous()
        rc = self._fn(
            kind,
            prologue,
            x.data_ptr(),
            None if gain is None else gain.data_ptr(),
            eps,
            m,
            k,
            wq.data_ptr(),
            wd.data_ptr(),
            None if wm is None else wm.data_ptr(),
            None if bias is None else bias.data_ptr(),
            None if residual is None else residual.data_ptr(),
            n,
            y.data_ptr(),
        )
        if rc != 0:
            raise RuntimeError(f"exo_qlinear failed with code {rc}")
        return y


@cache
def load_kernels(kernel_dir: Path | None = None) -> QKernels | None:
    """The compiled kernels, or None where they cannot run (not x86 AVX2, no C compiler)."""
    if os.environ.get("EXO_DISABLE_CPU_KERNELS") or not cpu_supports_kernels():
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None
    key = hashlib.sha256("\0".join([C_SOURCE, compiler, *C_FLAGS]).encode()).hexdigest()[:16]
    out = (kernel_dir or default_kernel_dir()) / f"exo_qlinear_{key}.so"
    try:
        if not out.exists():
            _compile(compiler, out)
        return QKernels(ctypes.CDLL(str(out)))
    except (OSError, subprocess.SubprocessError):
        return None
