"""Quantised linear and decode-attention kernels for x86 CPUs (AVX2 + FMA + F16C).

Why: decoding a small model on a CPU is bound by the bytes of weights read per token and by the
number of operations per token. torch's own low-bit CPU kernels are slow on AVX2-only machines
(measured: int4/int8 weight-only matmuls at 1-4 GB/s against ~14 GB/s of memory bandwidth), so
reading 5 bits per weight instead of 16 only pays off with a kernel that keeps up with memory.
These do: 4- or 8-bit weight blocks (GGUF's Q4_1 / Q8_0 layouts, and the K-quant super-blocks
Q4_K / Q5_K / Q6_K read from the file as they are) times activations quantised per block to 16
bits, with integer multiply-adds (see the C source). A second kernel runs a whole decode step
of attention (rotate q and k, append to the paged cache, attend) in one call.

The C source (the `kernel_source_*` modules) is compiled once per machine with the system C
compiler into a cache folder (the file name carries a hash of source, compiler and flags; a
build already in the per-user default folder is reused) and loaded with ctypes, which releases
the GIL during calls. Without a compiler or AVX2, `load_kernels` returns None and the engine
falls back to torch (fbgemm float16 weights; file blocks dequantised per call).
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

from exo.worker.engines.kernel_source_attention import ATTENTION_SOURCE
from exo.worker.engines.kernel_source_kquants import KQUANT_SOURCE
from exo.worker.engines.kernel_source_linear import LINEAR_HEAD, LINEAR_TAIL
from exo.worker.engines.kv_cache import PagedLayer

C_FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-shared", "-fPIC", "-std=gnu11", "-pthread")
_REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")

PROLOGUE_NONE, PROLOGUE_RMS_NORM, PROLOGUE_SWIGLU = 0, 1, 2
MAX_PARTS = 4  # weight parts a quantised linear reads in place (C: MAX_PARTS)
KIND_Q4, KIND_Q8, KIND_Q4_K, KIND_Q5_K, KIND_Q6_K = 4, 8, 104, 105, 106  # `exo_qlinear` layouts
_BLOCK_BYTES = {KIND_Q4: 20, KIND_Q8: 34, KIND_Q4_K: 144, KIND_Q5_K: 176, KIND_Q6_K: 210}

C_SOURCE = LINEAR_HEAD + KQUANT_SOURCE + LINEAR_TAIL + ATTENTION_SOURCE


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
