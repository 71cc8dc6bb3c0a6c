"""Quantised linear and decode-attention kernels for CPUs, loaded with ctypes.

Why: decoding a small model on a CPU is bound by the bytes of weights read per token and by the
number of operations per token. torch's own low-bit CPU kernels are slow on AVX2-only machines
(measured: int4/int8 weight-only matmuls at 1-4 GB/s against ~14 GB/s of memory bandwidth), so
reading 5 bits per weight instead of 16 only pays off with a kernel that keeps up with memory.
These do: 4- to 8-bit weight blocks (the kinds of `kinds.py`: GGUF's Q4_1 / Q8_0 / Q5_0 / Q5_1
layouts, and the K-quant super-blocks Q4_K / Q5_K / Q6_K read from the file as they are; a
layer's parts may differ in type) times activations quantised per block to 16 bits, with integer
multiply-adds (see `csrc/kinds.h`; with several rows, batched decode or prefill, 8 weight rows at
a time share each activation load: `csrc/arch/x86/tile.c`); a layer may end with Gemma's norm of
its output before the residual add. On AVX2, a model's Q4_1, Q5_0, Q8_0, Q4_K and Q6_K weights
(Q5_1 and Q5_K too at 8-bit activations: `Kind.grouped_at`) are repacked at load in groups of 8
rows (`QKernels.repack_rows`, `csrc/repack.c`), so that decode too shares each block's float work among 8 rows. A second kernel runs a whole decode step of attention (rotate q and k, append to
the paged cache, attend) in one call.

The C sources (`csrc/`) are compiled once per machine (`kernel_build.py`: AVX2 where the CPU
has it, else the portable C path) into a cache folder (the file name carries a hash of sources,
compiler and flags; a build already in the per-user default folder is reused) and loaded with
ctypes, which releases the GIL during calls. Every wrapper checks dtypes, devices and shapes
before a pointer reaches C, and holds every temporary until the call returns. Without a C
compiler, `load_kernels` returns None and the engine falls back to torch.
"""

import ctypes
import os
import stat
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import ClassVar

import torch
from loguru import logger
from torch import Tensor

from exo.worker.engines.kernel_build import (
    X86_ISAS,
    Isa,
    KernelBuildError,
    build_library,
    choose_isa,
    find_compiler,
    isa_flags,
    library_name,
)
from exo.worker.engines.kinds import BY_KERNEL, GROUP_ROWS, KINDS, kind_named
from exo.worker.engines.kv_cache import PagedLayer

PROLOGUE_NONE, PROLOGUE_RMS_NORM, PROLOGUE_SWIGLU, PROLOGUE_GEGLU = 0, 1, 2, 3
_GLU_PROLOGUES = (PROLOGUE_SWIGLU, PROLOGUE_GEGLU)
MAX_PARTS = 4  # weight parts a quantised linear reads in place (C: MAX_PARTS)
# The kernel ids (`kinds.KINDS`; C: KIND_*), under the names the engine's tests and benches use.
KIND_Q4, KIND_Q8, KIND_Q5_0, KIND_Q5_1, KIND_Q4_K, KIND_Q5_K, KIND_Q6_K = (
    kind_named(n).kernel for n in ("Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
)
# each layout that has one -> its rows repacked in groups of 8 (`QKernels.repack_rows`)
GROUPED: dict[int, int] = {k.kernel: k.grouped for k in KINDS if k.grouped is not None}
KIND_Q4_G8, KIND_Q8_G8, KIND_Q5_0_G8, KIND_Q4_K_G8, KIND_Q6_K_G8 = (
    GROUPED[k] for k in (KIND_Q4, KIND_Q8, KIND_Q5_0, KIND_Q4_K, KIND_Q6_K)
)
_INT_MAX = 2**31 - 1


class KernelArgumentError(ValueError):
    """An argument the kernels cannot take (wrong dtype, device, shape): nothing reached C."""


def default_kernel_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"exo-kernels-{os.getuid()}"


def _float_cpu(name: str, t: Tensor) -> None:
    if t.dtype != torch.float32:
        raise KernelArgumentError(f"{name} must be float32, got {t.dtype}")
    if not t.is_cpu:  # (cheaper than t.device: called for every tensor of every call)
        raise KernelArgumentError(f"{name} must be on the CPU, got {t.device}")


def _shape(name: str, t: Tensor, want: tuple[int, ...]) -> None:
    if tuple(t.shape) != want:
        raise KernelArgumentError(f"{name} must have shape {list(want)}, got {list(t.shape)}")


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
        ("part_kind", ctypes.c_int * MAX_PARTS),
        ("post_g", ctypes.c_void_p),
        ("post_eps", ctypes.c_float),
    ]


class QuantWeights:
    """A linear layer's quantised weights (and prologue) as the kernel reads them.

    `parts`: up to MAX_PARTS block matrices uint8 [rows_i, row bytes] whose rows stack into the
    layer's N outputs (q | k | v): the kernel reads each where it lies, so stacking them costs
    no copy; `part_kinds` gives each part's layout (default: `kind` for all). With `post_gain`
    [N] the layer computes y = residual + rmsnorm(x W^T + bias) * post_gain (Gemma 3). The
    object holds every tensor whose address the spec carries.
    """

    def __init__(
        self,
        kind: int,
        prologue: int,
        parts: list[Tensor],
        gain: Tensor | None,
        eps: float,
        bias: Tensor | None,
        k: int,
        part_kinds: list[int] | None = None,
        post_gain: Tensor | None = None,
        post_eps: float = 0.0,
    ) -> None:
        kinds = [kind] * len(parts) if part_kinds is None else list(part_kinds)
        if len(kinds) != len(parts):
            raise KernelArgumentError("one layout per part")
        for layout in {kind, *kinds}:
            if layout not in BY_KERNEL:
                raise KernelArgumentError(f"unknown weight layout {layout}")
        if prologue not in (PROLOGUE_NONE, PROLOGUE_RMS_NORM, *_GLU_PROLOGUES):
            raise KernelArgumentError(f"unknown prologue {prologue}")
        if not 1 <= len(parts) <= MAX_PARTS:
            raise KernelArgumentError(f"a quantised linear takes 1 to {MAX_PARTS} parts")
        block = max(BY_KERNEL[layout][0].block_values for layout in kinds)
        if k <= 0 or k % block != 0 or k > _INT_MAX:
            raise KernelArgumentError(f"k must be a positive multiple of {block}, got {k}")
        for i, (p, layout) in enumerate(zip(parts, kinds, strict=True)):
            row_bytes = BY_KERNEL[layout][0].row_bytes(k)
            if p.dtype != torch.uint8 or p.device.type != "cpu" or p.dim() != 2:
                raise KernelArgumentError(f"part {i} must be a 2-D uint8 CPU tensor")
            if p.shape[1] != row_bytes:
                raise KernelArgumentError(
                    f"part {i} must have rows of {row_bytes} bytes, got {p.shape[1]}"
                )
        start = 0
        for i, (p, layout) in enumerate(zip(parts, kinds, strict=True)):
            if BY_KERNEL[layout][1] and (p.shape[0] % GROUP_ROWS or start % GROUP_ROWS):
                raise KernelArgumentError(
                    f"part {i} is laid in groups of {GROUP_ROWS} rows: it must have a multiple "
                    f"of {GROUP_ROWS} rows and start on one (rows {start}..{start + p.shape[0]})"
                )
            start += p.shape[0]
        self.parts = [p.contiguous() for p in parts]
        self.n = sum(p.shape[0] for p in self.parts)
        if not 0 < self.n <= _INT_MAX:
            raise KernelArgumentError("a quantised linear needs 1 to 2^31 - 1 output rows")
        if prologue == PROLOGUE_RMS_NORM and gain is None:
            raise KernelArgumentError("the RMSNorm prologue needs a gain")
        self.gain = None if gain is None else gain.detach().float().contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.post_gain = None if post_gain is None else post_gain.detach().float().contiguous()
        for name, t, size in (
            ("gain", self.gain, k),
            ("bias", self.bias, self.n),
            ("post_gain", self.post_gain, self.n),
        ):
            if t is not None:
                _float_cpu(name, t)
                _shape(name, t, (size,))
        self.kind, self.k, self.prologue, self.kinds = kind, k, prologue, kinds
        self.width = 2 * k if prologue in _GLU_PROLOGUES else k  # x's last dimension
        pad = [0] * (MAX_PARTS - len(parts))
        pointers = [p.data_ptr() for p in self.parts] + pad
        rows = [p.shape[0] for p in self.parts] + pad
        self.spec = _LinearSpec(
            kind,
            prologue,
            k,
            self.n,
            eps,
            None if self.gain is None else self.gain.data_ptr(),
            (ctypes.c_void_p * MAX_PARTS)(*pointers),
            (ctypes.c_int * MAX_PARTS)(*rows),
            None if self.bias is None else self.bias.data_ptr(),
            (ctypes.c_int * MAX_PARTS)(*kinds, *pad),
            None if self.post_gain is None else self.post_gain.data_ptr(),
            post_eps,
        )
        self.spec_address = ctypes.addressof(self.spec)


class QKernels:
    """The loaded library, with checked wrappers."""

    def __init__(self, lib: ctypes.CDLL, isa: Isa) -> None:
        p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        self.isa = isa
        self.x86 = isa in X86_ISAS  # arch/x86/'s kernels: the tile, the 8-row groups
        self._fn = lib.exo_qlinear
        self._fn.argtypes = [p, p, i, p, p]
        self._fn.restype = i
        self._set_threads = lib.exo_set_threads
        self._set_threads.argtypes = [i]
        self._set_threads.restype = i
        self._set_spin = lib.exo_set_spin
        self._set_spin.argtypes = [ctypes.c_long, ctypes.c_long]
        self._set_spin.restype = i
        self._attend_step = lib.exo_attend_step
        self._attend_step.argtypes = [p, p, i, i, i, p, f, ctypes.c_long, p, p]
        self._attend_step.restype = i
        self._repack = lib.exo_repack_rows
        self._repack.argtypes = [i, p, i, i, p]
        self._repack.restype = i
        self._set_activations = lib.exo_set_activations
        self._set_activations.argtypes = [i]
        self._set_activations.restype = i
        self.activations = 8  # the bits of the kinds with 8-bit dots (`set_activations`)
        self._unrepack = lib.exo_unrepack_rows
        self._unrepack.argtypes = [i, p, i, i, p, i, p]
        self._unrepack.restype = i
        self._dequant = lib.exo_dequant_rows
        self._dequant.argtypes = [i, p, ctypes.c_long, i, p]
        self._dequant.restype = i
        self.lib = lib  # (the entry points other modules bind: moe_kernels.py's exo_moe_experts)

    def set_activations(self, bits: int) -> None:
        """The activation format of the kinds with 8-bit dots (`Kind.act8`): 8 or 16 bits (the
        other kinds always take 16); it applies to every call from then on, in either layout."""
        if self._set_activations(bits) == -2:
            raise KernelArgumentError(f"activations are 8 or 16 bits, not {bits}")
        self.activations = bits

    def repack_rows(self, kind: int, rows: Tensor, out: Tensor) -> None:
        """File rows of `kind` (one with a repacked layout: `GROUPED`), uint8 [n, row bytes] with
        n a multiple of 8, repacked in groups of 8 rows into `out` (same shape; may be `rows`
        itself) as the grouped kernels read them (`csrc/repack.c`, `csrc/exo_kernels.h`)."""
        k = self._repack_k(kind, rows)
        if out.shape != rows.shape or out.dtype != torch.uint8 or not out.is_contiguous():
            raise KernelArgumentError(
                "the output must be a contiguous uint8 tensor of the same shape"
            )
        src = rows.contiguous()
        rc = self._repack(kind, src.data_ptr(), rows.shape[0], k, out.data_ptr())
        del src  # alive until here: the kernel has returned
        if rc != 0:
            raise RuntimeError(f"exo_repack_rows failed with code {rc}")

    def unrepack_rows(self, kind: int, grouped: Tensor, index: Tensor) -> Tensor:
        """Rows `index` (int64 [n]) of rows repacked by `repack_rows`, in the file's layout:
        uint8 [n, row bytes] (an embedding's lookups in a tied head's blocks)."""
        k = self._repack_k(kind, grouped)
        rows = index.reshape(-1).to(device="cpu", dtype=torch.int64).contiguous()
        n = grouped.shape[0]
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= n):
            raise KernelArgumentError(f"row indices must be in [0, {n})")
        src = grouped.contiguous()
        out = torch.empty(rows.numel(), grouped.shape[1], dtype=torch.uint8)
        rc = self._unrepack(
            kind, src.data_ptr(), n, k, rows.data_ptr(), rows.numel(), out.data_ptr()
        )
        del src, rows  # alive until here: the kernel has returned
        if rc != 0:
            raise RuntimeError(f"exo_unrepack_rows failed with code {rc}")
        return out

    def dequant_rows(self, kind: int, rows: Tensor, k: int) -> Tensor | None:
        """Rows of file layout `kind` (uint8 [n, row bytes]) as float32 [n, k], the values
        gguf-py's dequantisation gives, bit for bit; None for a layout the kernels do not
        dequantise (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K do)."""
        entry = BY_KERNEL.get(kind)
        if entry is None or entry[1]:
            return None
        layout = entry[0]
        if rows.dtype != torch.uint8 or not rows.is_cpu or rows.dim() != 2:
            raise KernelArgumentError("rows must be a 2-D uint8 CPU tensor")
        if k <= 0 or k % layout.block_values or rows.shape[1] != layout.row_bytes(k):
            raise KernelArgumentError(
                f"rows of {layout.name} with {k} values have {layout.row_bytes(k)} bytes"
            )
        src = rows.contiguous()
        out = torch.empty(rows.shape[0], k, dtype=torch.float32)
        rc = self._dequant(kind, src.data_ptr(), rows.shape[0], k, out.data_ptr())
        del src  # alive until here: the kernel has returned
        return out if rc == 0 else None

    @staticmethod
    def _repack_k(kind: int, rows: Tensor) -> int:
        """The values per row of `rows` (uint8 CPU [8k, row bytes]) of a kind with a repacked
        layout."""
        entry = BY_KERNEL.get(kind)
        if entry is None or entry[1] or entry[0].grouped is None:
            raise KernelArgumentError(f"layout {kind} has no repacked form")
        if rows.dtype != torch.uint8 or not rows.is_cpu or rows.dim() != 2:
            raise KernelArgumentError(f"rows of layout {kind} must be a 2-D uint8 CPU tensor")
        size, per = entry[0].block_bytes, entry[0].block_values
        if rows.shape[1] % size or rows.shape[1] // size * per > _INT_MAX:
            raise KernelArgumentError(f"rows of {entry[0].name} hold whole blocks of {size} bytes")
        if rows.shape[0] % GROUP_ROWS or rows.shape[0] > _INT_MAX:
            raise KernelArgumentError(f"{rows.shape[0]} rows are not whole groups of {GROUP_ROWS}")
        return rows.shape[1] // size * per

    def linear(self, w: QuantWeights, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """y [..., n] = prologue(x) W^T + bias + residual; float32 in and out.

        x [..., k] ([..., 2k] for SwiGLU / GeGLU); residual [..., n]. Inputs that are not contiguous
        are copied; the copies live (as locals here) until the C call has returned."""
        # (the checks are written for a call per layer per step: a plain comparison first, the
        # helper with the message only when it fails: ~4.7 -> ~3.7 us a call at SmolLM2's
        # shape, one row, the kernel's ~1.1 included)
        if x.dtype != torch.float32 or not x.is_cpu:
            _float_cpu("x", x)
        width, shape = w.width, x.shape
        if not shape or shape[-1] != width:
            raise KernelArgumentError(f"x must be [..., {width}], got {list(shape)}")
        rows = x.numel() // width
        if rows > _INT_MAX:
            raise KernelArgumentError("too many rows for one call")
        x_c = x.contiguous()
        res_c: Tensor | None = None
        if residual is not None:
            if residual.dtype != torch.float32 or not residual.is_cpu:
                _float_cpu("residual", residual)
            rs = residual.shape
            if not rs or rs[-1] != w.n or rs[:-1] != shape[:-1]:
                _shape("residual", residual, (*shape[:-1], w.n))
            res_c = residual.contiguous()
            y = torch.empty_like(res_c)  # [..., n] float32, contiguous (cheaper than empty)
        else:
            y = torch.empty(*shape[:-1], w.n, dtype=torch.float32)  # (sizes as arguments: cheaper)
        rc = self._fn(
            w.spec_address,
            x_c.data_ptr(),
            rows,
            None if res_c is None else res_c.data_ptr(),
            y.data_ptr(),
        )
        del x_c, res_c  # alive until here: the kernel has returned
        if rc != 0:
            raise RuntimeError(f"exo_qlinear failed with code {rc}")
        return y

    def set_threads(self, n: int) -> int:
        """Threads the kernels use (the caller and n - 1 workers that sleep between jobs)."""
        if n < 1:
            raise KernelArgumentError(f"threads must be at least 1, got {n}")
        return int(self._set_threads(n))

    def set_spin(self, idle_us: float, wait_us: float) -> None:
        """How long pool threads spin before they sleep (`csrc/pool.c`); 0: sleep at once."""
        if idle_us < 0 or wait_us < 0:
            raise KernelArgumentError("spin times must not be negative")
        self._set_spin(int(idle_us * 1000), int(wait_us * 1000))

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
        *,
        sinks: Tensor | None = None,
        window: int | None = None,
    ) -> Tensor:
        """One decode step of attention (see `csrc/attention.c`): qkv [B, 1, W] -> [B, 1, H * hd].

        rope: complex64 [P, hd/2]; cache: the step's pages (float32 or float16, `kv_cache.py`)
        for this layer; positions: int64 [B], each below P and within the row's pages; sinks:
        float32 [H], a logit per head that takes part in the softmax and adds no value (gpt-oss),
        or None; window: the keys a query sees (the last `window` positions; None: all).
        A step's layers share most of this: `decode_attention` checks that once a step."""
        step = self.decode_attention(rope, cache, positions, window)
        return step(qkv, heads, kv_heads, head_dim, qk_norm, eps, cache.offset, sinks)

    def decode_attention(
        self, rope: Tensor, cache: PagedLayer, positions: Tensor, window: int | None
    ) -> "DecodeAttention":
        """A decode step's attention for its layers of one kind (`DecodeAttention`): the step's
        rotary table, pages (`cache.offset` is not used: each call names its layer's),
        positions and window, checked once."""
        return DecodeAttention(self._attend_step, rope, cache, positions, window)


class _AttendStep(ctypes.Structure):
    """C: AttendStep (`csrc/exo_kernels.h`), the same fields in the same order."""

    _fields_: ClassVar = [
        ("rope", ctypes.c_void_p),
        ("pages", ctypes.c_void_p),
        ("pos", ctypes.c_void_p),
        ("B", ctypes.c_int),
        ("max_pages", ctypes.c_int),
        ("P", ctypes.c_int),
        ("window", ctypes.c_int),
        ("half", ctypes.c_int),
    ]


class DecodeAttention:
    """One decode step of attention for a step's layers of one kind (global or sliding): rotate
    q and k, append to the paged cache, attend (`csrc/attention.c`), one call a layer.

    What the layers share (rows, rotary table, pages, positions, window) is checked and set in
    a C struct once a step; a layer's call then checks and passes only its own arguments
    (SmolLM2's shape, one row: ~14 us a layer's call with every argument checked and converted
    each time, ~9 so, the kernel's few included). The tensors are held (as contiguous copies
    where needed) until this object goes. The kernel checks each position against the row's
    pages before it writes anything (-3, raised as the argument error it is); the positions
    are read here only when the rope table is shorter than the pages."""

    def __init__(
        self, attend_step: Callable[..., int], rope: Tensor, cache: PagedLayer,
        positions: Tensor, window: int | None,
    ) -> None:  # fmt: skip
        """attend_step: the library's exo_attend_step (`QKernels.decode_attention` passes it)."""
        if rope.dtype != torch.complex64 or not rope.is_cpu or rope.dim() != 2:
            raise KernelArgumentError(
                f"rope must be complex64 [P, hd/2] on the CPU, got {rope.dtype} {list(rope.shape)}"
            )
        if window is not None and not 0 < window < 2**31:
            raise KernelArgumentError(f"the window must be a positive int, got {window}")
        pages = cache.pages
        if pages.dtype != torch.int64 or not pages.is_cpu or pages.dim() != 2:
            raise KernelArgumentError("the cache's pages must be an int64 [B, n] CPU tensor")
        bsz = pages.shape[0]
        if positions.dtype != torch.int64 or not positions.is_cpu:
            raise KernelArgumentError("positions must be int64 on the CPU")
        if positions.shape != (bsz,):
            _shape("positions", positions, (bsz,))
        if cache.dtype not in (torch.float32, torch.float16):
            raise KernelArgumentError(f"the cache must be float32 or float16, got {cache.dtype}")
        if pages.shape[1] * cache.page > _INT_MAX:
            raise KernelArgumentError("too many pages for one call")
        if rope.shape[0] < pages.shape[1] * cache.page:  # the kernel's check is not enough
            _check_positions(positions, rope.shape[0], pages.shape[1] * cache.page)
        self._attend_step, self._cache, self.bsz = attend_step, cache, bsz
        self._rope, self._pages = rope.contiguous(), pages.contiguous()
        self._pos = positions.contiguous()
        self._spec = _AttendStep(
            self._rope.data_ptr(), self._pages.data_ptr(), self._pos.data_ptr(), bsz,
            pages.shape[1], cache.page, window or 0, int(cache.dtype == torch.float16),
        )  # fmt: skip
        self._address = ctypes.addressof(self._spec)
        self._rope_width = rope.shape[1]

    def __call__(
        self,
        qkv: Tensor,
        heads: int,
        kv_heads: int,
        head_dim: int,
        qk_norm: Tensor | None,
        eps: float,
        layer_offset: int,
        sinks: Tensor | None = None,
    ) -> Tensor:
        """qkv [B, 1, (H + 2KV) * hd] -> [B, 1, H * hd] for the layer whose keys start at
        `layer_offset` in a page (`PagedLayer.offset`); qk_norm [H + KV, hd] or None; sinks
        float32 [H] (gpt-oss) or None."""
        if heads <= 0 or kv_heads <= 0 or heads % kv_heads or head_dim <= 0 or head_dim % 2:
            raise KernelArgumentError(
                f"heads {heads} must be a multiple of kv_heads {kv_heads}; head_dim even"
            )
        cache = self._cache
        if cache.kv_heads != kv_heads or cache.head_dim != head_dim:
            raise KernelArgumentError(
                f"the cache holds {cache.kv_heads} kv heads of {cache.head_dim}, "
                f"not {kv_heads} of {head_dim}"
            )
        if self._rope_width != head_dim // 2:
            raise KernelArgumentError(f"rope must be [P, {head_dim // 2}], got [P, {self._rope_width}]")
        _float_cpu("qkv", qkv)
        bsz = self.bsz
        if qkv.dim() != 3:
            raise KernelArgumentError(f"qkv must be [B, 1, W], got {list(qkv.shape)}")
        if qkv.shape != (bsz, 1, (heads + 2 * kv_heads) * head_dim):
            _shape("qkv", qkv, (bsz, 1, (heads + 2 * kv_heads) * head_dim))
        if qk_norm is not None:
            _float_cpu("qk_norm", qk_norm)
            _shape("qk_norm", qk_norm, (heads + kv_heads, head_dim))
        if sinks is not None:
            _float_cpu("sinks", sinks)
            _shape("sinks", sinks, (heads,))
        if not 0 <= layer_offset < 2**62:
            raise KernelArgumentError(f"the layer's offset must be in [0, 2^62), got {layer_offset}")
        qkv_c = qkv.contiguous()
        norm_c = None if qk_norm is None else qk_norm.contiguous()
        sinks_c = None if sinks is None else sinks.contiguous()
        out = torch.empty(bsz, 1, heads * head_dim, dtype=torch.float32)
        rc = self._attend_step(
            self._address,
            qkv_c.data_ptr(),
            heads,
            kv_heads,
            head_dim,
            None if norm_c is None else norm_c.data_ptr(),
            eps,
            layer_offset,
            None if sinks_c is None else sinks_c.data_ptr(),
            out.data_ptr(),
        )
        del qkv_c, norm_c, sinks_c  # alive until the kernel has returned
        if rc == -3:  # a position past the row's pages (or negative): nothing was written
            _check_positions(self._pos, self._rope.shape[0], self._pages.shape[1] * cache.page)
        if rc != 0:
            raise RuntimeError(f"exo_attend_step failed with code {rc}")
        return out


def _check_positions(positions: Tensor, rope_rows: int, page_rows: int) -> None:
    """Every position (int64 CPU [B]) in [0, min(rope_rows, page_rows)), or the argument error."""
    pos_list: list[int] = positions.tolist()
    if pos_list and min(pos_list) < 0:
        raise KernelArgumentError("positions must not be negative")
    if pos_list and max(pos_list) >= min(rope_rows, page_rows):
        raise KernelArgumentError("a position is past the rope table or the row's pages")


def _private_dir(folder: Path) -> bool:
    """Create `folder` if needed; True if only we can write to it (we load code from it)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def kernels_unavailable_reason() -> str | None:
    """Why `load_kernels` gives None here (for test skips and the log), or None if it does not."""
    if os.environ.get("EXO_DISABLE_CPU_KERNELS"):
        return "the CPU kernels are disabled (EXO_DISABLE_CPU_KERNELS)"
    if find_compiler() is None:
        return "no C compiler (cc, gcc or clang; or $CC) to build the CPU kernels"
    return None


@cache
def load_kernels(kernel_dir: Path | None = None) -> QKernels | None:
    """The compiled kernels for this CPU, or None where they cannot be built (no C compiler,
    a failed build: the log says why)."""
    isa, why = choose_isa()
    return load_kernels_for(isa, kernel_dir, why)


def load_kernels_for(isa: Isa, kernel_dir: Path | None = None, why: str = "") -> QKernels | None:
    """The kernels built for `isa` (tests run the portable path on x86 with this)."""
    reason = kernels_unavailable_reason()
    compiler = find_compiler()
    if reason is not None or compiler is None:
        logger.info(f"CPU kernels off: {reason}; linear layers run in torch")
        return None
    folder = kernel_dir or default_kernel_dir()
    if not _private_dir(folder):
        logger.warning(f"CPU kernels off: {folder} is not a private folder")
        return None
    name = library_name(compiler, isa)
    out, shared = folder / name, default_kernel_dir() / name
    try:
        if not out.exists():
            if shared.exists() and _private_dir(shared.parent):  # built before, elsewhere
                out = shared
            else:
                build_library(compiler, isa, out)
        kernels = QKernels(ctypes.CDLL(str(out)), isa)
    except KernelBuildError as e:
        logger.warning(f"CPU kernels off: the {isa} build failed: {e}")
        return None
    except OSError as e:
        logger.warning(f"CPU kernels off: {out} did not load: {e}")
        return None
    kernels.set_activations(_activations_from_env())
    spin = _spin_from_env()
    if spin is not None:
        kernels.set_spin(*spin)
    evex = "-DEXO_AVXVNNI_EVEX" in isa_flags(isa)  # (kernel_build.AVXVNNI_EVEX_FLAGS)
    logger.info(
        f"CPU kernels: the {isa} path"
        + (" in AVX-512 VL's encodings (this CPU has AVX-512 VNNI, not AVX-VNNI)" if evex else "")
        + (f" ({why})" if why else "")
        + f", {kernels.activations}-bit activations"
        + ("" if spin is None else f", spin {spin[0]:g}/{spin[1]:g} us")
    )
    return kernels


def _activations_from_env() -> int:
    """EXO_ACTIVATIONS=8|16: the activation format of the kinds with 8-bit dots (default 8: as
    accurate as llama.cpp's by bench/accuracy.py, and faster in prefill and batches, bench/engine.py
    and bench/kernels.py; 16 keeps results within ~1e-4 of float activations)."""
    text = os.environ.get("EXO_ACTIVATIONS", "").strip()
    if text in ("8", "16"):
        return int(text)
    if text:
        logger.warning(f"EXO_ACTIVATIONS={text!r} is not 8 or 16: 8-bit activations")
    return 8


def _spin_from_env() -> tuple[float, float] | None:
    """EXO_KERNEL_SPIN_US="idle,wait" (or one number for both): the pool's spin limits."""
    text = os.environ.get("EXO_KERNEL_SPIN_US", "").strip()
    if not text:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values) < 0:
        logger.warning(f"EXO_KERNEL_SPIN_US={text!r} is not 'idle,wait' microseconds: ignored")
        return None
    return (values[0], values[-1])
