"""Linear layers in the weight formats the engine can run, each with an optional fused prologue.

    y = prologue(x) W^T (+ b) (+ residual)

The prologue is the operation that always precedes the layer in a transformer block, fused so a
block costs fewer operations: RMSNorm with its gain (before qkv and gate|up) or SwiGLU (before
down). Formats, measured on a 2-core x86 CPU (AVX2, no AVX-512), one thread, SmolLM2-135M,
where decoding is bound by the bytes of weights read per token:

* "dense": `F.linear` with weights in the engine dtype (any device; the exact reference).
* "fp16": fbgemm's packed float16 weights, float32 activations: half the bytes of float32 at
  full speed (bfloat16 / float16 `F.linear` run slower than float32 on such CPUs).
* "q8" / "q4": 8-bit / 4-bit weight blocks (GGUF's Q8_0 / Q4_1 layouts) run by the compiled
  kernels of `cpu_kernels` (activations quantised per block of 32 to 16 bits: results within
  ~1e-4 of float32). Requantising weights that were Q4_1 / Q8_0 blocks reproduces them
  exactly; other weights lose a little precision (q8 much less than q4).
"""

from dataclasses import dataclass
from typing import Literal, Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from exo.worker.engines.cpu_kernels import (
    PROLOGUE_NONE,
    PROLOGUE_RMS_NORM,
    PROLOGUE_SWIGLU,
    QKernels,
    QuantWeights,
)

WeightFormat = Literal["dense", "fp16", "q8", "q4"]
WEIGHT_FORMATS: tuple[WeightFormat, ...] = ("dense", "fp16", "q8", "q4")
QUANT_BLOCK = 32


@dataclass(frozen=True)
class RmsNorm:
    """x / sqrt(mean(x^2) + eps) * gain."""

    gain: Tensor  # [in]
    eps: float


@dataclass(frozen=True)
class SwiGLU:
    """x = [a | b] (2 * in features) -> silu(a) * b."""


Prologue = RmsNorm | SwiGLU | None


class Linear(Protocol):
    @property
    def out_features(self) -> int: ...

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """x [..., in] (or [..., 2 * in] after SwiGLU) -> [..., out] (+ residual)."""
        ...


def _torch_prologue(x: Tensor, prologue: Prologue) -> Tensor:
    """The prologue with torch ops; an RmsNorm's gain is folded into the weights."""
    if isinstance(prologue, RmsNorm):
        return F.rms_norm(x, (x.shape[-1],), None, prologue.eps)
    if isinstance(prologue, SwiGLU):
        half = x.shape[-1] // 2
        return F.silu(x[..., :half]) * x[..., half:]
    return x


def _fold_gain(weight: Tensor, prologue: Prologue) -> Tensor:
    if isinstance(prologue, RmsNorm):
        return weight.float() * prologue.gain.float()
    return weight


class DenseLinear:
    def __init__(self, weight: Tensor, bias: Tensor | None, prologue: Prologue) -> None:
        self.weight = weight  # [out, in], gain folded in
        self.bias = bias  # [out]
        self.prologue = prologue

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        y = F.linear(_torch_prologue(x, self.prologue), self.weight, self.bias)
        return y if residual is None else residual + y


def _prepack_fp16(weight: Tensor, bias: Tensor | None) -> object:
    return cast(object, torch.ops.quantized.linear_prepack_fp16(weight, bias))


def _linear_fp16(x: Tensor, packed: object) -> Tensor:
    return cast(Tensor, torch.ops.quantized.linear_dynamic_fp16(x, packed))


class PackedFp16Linear:
    """fbgemm: weights packed once as float16, activations and output float32."""

    def __init__(self, weight: Tensor, bias: Tensor | None, prologue: Prologue) -> None:
        self._out = weight.shape[0]
        self._packed = _prepack_fp16(
            weight.float().contiguous(), None if bias is None else bias.float()
        )
        self.prologue = prologue

    @property
    def out_features(self) -> int:
        return self._out

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        y = _linear_fp16(_torch_prologue(x, self.prologue), self._packed)
        return y if residual is None else residual + y


def _f16_bytes(t: Tensor) -> Tensor:
    """float values [..] -> their float16 bytes [.., 2]."""
    return t.to(torch.float16).contiguous().view(torch.uint8).reshape(*t.shape, 2)


def quantize_q4(weight: Tensor) -> Tensor:
    """[N, K] -> q4 blocks uint8 [N, K/32, 20]: {f16 d, f16 m, 16 bytes of nibbles}.

    w = d q + m with q in 0..15 (d, m from the block's min and max, like GGUF's Q4_1);
    byte j of a block holds element j in its low nibble and element j + 16 in its high one.
    """
    n, k = weight.shape
    blocks = weight.float().reshape(n, k // QUANT_BLOCK, QUANT_BLOCK)
    lo = blocks.amin(-1).half().float()
    scale = ((blocks.amax(-1) - lo) / 15).half().float()
    inv = torch.where(scale > 0, 1 / scale, 0.0)
    q = torch.round((blocks - lo[..., None]) * inv[..., None]).clamp(0, 15).to(torch.uint8)
    half = QUANT_BLOCK // 2
    nibbles = q[..., :half] | (q[..., half:] << 4)
    return torch.cat([_f16_bytes(scale), _f16_bytes(lo), nibbles], dim=-1).contiguous()


def quantize_q8(weight: Tensor) -> Tensor:
    """[N, K] -> q8 blocks uint8 [N, K/32, 34]: {f16 d, 32 x int8}; w = d q, |q| <= 127."""
    n, k = weight.shape
    blocks = weight.float().reshape(n, k // QUANT_BLOCK, QUANT_BLOCK)
    scale = (blocks.abs().amax(-1) / 127).half().float()
    inv = torch.where(scale > 0, 1 / scale, 0.0)
    q = torch.round(blocks * inv[..., None]).clamp(-127, 127).to(torch.int8).view(torch.uint8)
    return torch.cat([_f16_bytes(scale), q], dim=-1).contiguous()


def dequantize_blocks(blocks: Tensor, bits: int) -> Tensor:
    """q4 / q8 blocks [..., K/32, 20 or 34] -> float32 [..., K]."""
    scale = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [..., nb, 1]
    if bits == 4:
        minimum = blocks[..., 2:4].contiguous().view(torch.float16).float()
        nibbles = blocks[..., 4:]
        q = torch.cat([nibbles & 15, nibbles >> 4], dim=-1).float()
        return (q * scale + minimum).flatten(-2)
    q = blocks[..., 2:].contiguous().view(torch.int8).float()
    return (q * scale).flatten(-2)


class QuantLinear:
    """q4 / q8 weight blocks run by the compiled CPU kernels (float32 activations in and out)."""

    def __init__(
        self, weight: Tensor, bias: Tensor | None, prologue: Prologue, bits: int, kernels: QKernels
    ) -> None:
        n, k = weight.shape
        self.bits = bits
        self.blocks = quantize_q4(weight) if bits == 4 else quantize_q8(weight)
        self._kernels = kernels
        kind, gain, eps = PROLOGUE_NONE, None, 0.0
        if isinstance(prologue, RmsNorm):
            kind, gain, eps = PROLOGUE_RMS_NORM, prologue.gain, prologue.eps
        elif isinstance(prologue, SwiGLU):
            kind = PROLOGUE_SWIGLU
        self._weights = QuantWeights(bits, kind, self.blocks, gain, eps, bias, k, n)

    @property
    def out_features(self) -> int:
        return self._weights.n

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        return self._kernels.linear(self._weights, x, residual)


def fp16_packing_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


def choose_weight_format(
    source_format: str, device: torch.device, dtype: torch.dtype, kernels: QKernels | None
) -> WeightFormat:
    """The fastest format that keeps the file's precision (see the module docstring).

    q4 only for Q4_1 files (requantising them is exact); q8 for everything else, which is
    exact for Q8_0 and loses far less than the file's own quantisation for other types.
    """
    if device.type != "cpu" or dtype != torch.float32:
        return "dense"
    if kernels is not None:
        return "q4" if source_format == "Q4_1" else "q8"
    return "fp16" if fp16_packing_available() else "dense"


def make_linear(
    weight: Tensor,
    bias: Tensor | None,
    fmt: WeightFormat,
    *,
    prologue: Prologue = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
    kernels: QKernels | None = None,
) -> Linear:
    """A linear layer y = prologue(x) W^T + b in format `fmt`; `dtype` is the activation dtype."""
    device = device or torch.device("cpu")
    if fmt in ("fp16", "q8", "q4") and (device.type != "cpu" or dtype != torch.float32):
        raise ValueError(f"the {fmt} weight format needs device 'cpu' and dtype float32")
    if fmt in ("q8", "q4"):
        if kernels is None:
            raise ValueError(f"the {fmt} weight format needs the compiled CPU kernels")
        if weight.shape[1] % QUANT_BLOCK:
            fmt = "fp16" if fp16_packing_available() else "dense"
        else:
            return QuantLinear(weight, bias, prologue, 4 if fmt == "q4" else 8, kernels)
    if isinstance(prologue, RmsNorm):
        prologue = RmsNorm(prologue.gain.to(device), prologue.eps)
    folded = _fold_gain(weight, prologue)
    if fmt == "fp16":
        return PackedFp16Linear(folded, bias, prologue)
    return DenseLinear(
        folded.to(device=device, dtype=dtype).contiguous(),
        None if bias is None else bias.to(device=device, dtype=dtype),
        prologue,
    )
