"""Linear layers in the weight formats the engine can run, each with an optional fused prologue.

    y = prologue(x) W^T (+ b) (+ residual)

The prologue is the operation that always precedes the layer in a transformer block, fused so a
block costs fewer operations: RMSNorm with its gain (before qkv and gate|up) or SwiGLU / GeGLU
(before down). A layer may also end with a norm of its own output before the residual add
(`post_norm`, Gemma 3): y = residual + rmsnorm(prologue(x) W^T + b) * g_post. Formats, measured on a 2-core x86 CPU (AVX2, no AVX-512), one thread, SmolLM2-135M,
where decoding is bound by the bytes of weights read per token:

* "dense": `F.linear` with weights in the engine dtype (any device; the exact reference).
* "fp16": fbgemm's packed float16 weights, float32 activations: half the bytes of float32 at
  full speed (bfloat16 / float16 `F.linear` run slower than float32 on such CPUs).
* "q8" / "q4": 8-bit / 4-bit weight blocks (GGUF's Q8_0 / Q4_1 layouts) run by the compiled
  kernels of `cpu_kernels` (activations quantised per block of 32 to 16 bits: results within
  ~1e-4 of float32). Requantising weights that were Q4_1 / Q8_0 blocks reproduces them
  exactly; other weights lose a little precision (q8 much less than q4).

Those formats apply to weights held as plain tensors. Weights kept in a GGUF file's blocks
(`QuantTensor`, see `materialise.py`) run in their own format: Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (and MXFP4, IQ4_NL, IQ4_XS) by the compiled kernels, reading the file's
bytes in place, parts of different types in one call (Q5_0 q | k with a Q8_0 v) (measured, one thread, 2048 x 2048, one token: Q4_K 2.7 GB/s, Q6_K 3.6, q8 6.5); other
types, or any type without the kernels, by `StreamingLinear`, which dequantises a bounded
number of rows per call (memory-faithful, ~50x slower: the load log says which layers run so).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from exo.worker.engines.cpu_kernels import (
    MAX_PARTS,
    PROLOGUE_GEGLU,
    PROLOGUE_NONE,
    PROLOGUE_RMS_NORM,
    PROLOGUE_SWIGLU,
    QKernels,
    QuantWeights,
)
from exo.worker.engines.file_rows import weight_buffer
from exo.worker.engines.kinds import BY_GGML, BY_KERNEL, GROUP_ROWS, Kind, kind_named, layout_name
from exo.worker.engines.q_blocks import QUANT_BLOCK as QUANT_BLOCK
from exo.worker.engines.q_blocks import dequantize_blocks as dequantize_blocks
from exo.worker.engines.q_blocks import quantize_q4 as quantize_q4
from exo.worker.engines.q_blocks import quantize_q8 as quantize_q8
from exo.worker.engines.qtensor import QuantTensor, Weight, row_chunk

WeightFormat = Literal["dense", "fp16", "q8", "q4"]
WEIGHT_FORMATS: tuple[WeightFormat, ...] = ("dense", "fp16", "q8", "q4")


@dataclass(frozen=True)
class RmsNorm:
    """x / sqrt(mean(x^2) + eps) * gain."""

    gain: Tensor  # [in]
    eps: float


@dataclass(frozen=True)
class SwiGLU:
    """x = [a | b] (2 * in features) -> silu(a) * b."""


@dataclass(frozen=True)
class GeGLU:
    """x = [a | b] (2 * in features) -> gelu_tanh(a) * b (Gemma)."""


Prologue = RmsNorm | SwiGLU | GeGLU | None


class Linear(Protocol):
    @property
    def out_features(self) -> int: ...

    @property
    def kernel(self) -> str:
        """Which code runs this layer (for the load log)."""
        ...

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """x [..., in] (or [..., 2 * in] after SwiGLU) -> [..., out] (+ residual)."""
        ...


def _torch_prologue(x: Tensor, prologue: Prologue) -> Tensor:
    """The prologue with torch ops; an RmsNorm's gain is folded into the weights."""
    if isinstance(prologue, RmsNorm):
        return F.rms_norm(x, (x.shape[-1],), None, prologue.eps)
    if isinstance(prologue, SwiGLU | GeGLU):
        half = x.shape[-1] // 2
        a = x[..., :half]
        act = F.silu(a) if isinstance(prologue, SwiGLU) else F.gelu(a, approximate="tanh")
        return act * x[..., half:]
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

    @property
    def kernel(self) -> str:
        return f"torch F.linear ({str(self.weight.dtype).removeprefix('torch.')})"

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

    @property
    def kernel(self) -> str:
        return "fbgemm float16"

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        y = _linear_fp16(_torch_prologue(x, self.prologue), self._packed)
        return y if residual is None else residual + y


Regroup = Literal["in_place", "copy", "no"]
"""What a layer may do with the blocks it is given (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K; Q5_1, Q5_K at 8-bit activations) to re-lay them in
groups of 8 rows for the x86 kernels (`csrc/repack.c`): overwrite them (the caller hands them
over: a model built by its loader), copy them (the caller may still read them), or leave them."""


class QuantLinear:
    """Weight blocks run by the compiled CPU kernels (float32 activations in and out).

    `parts`: block matrices uint8 [rows_i, K/32, 20 or 34] (or [rows_i, row bytes]) whose rows
    stack into the output; they are read where they lie (no concatenation). `kinds`: each part's
    kind (`kinds.KINDS`); `post_norm`: the norm of the output before the residual. Parts of whole
    groups of 8 rows of a kind that has a repacked layout are repacked for the AVX2 build as
    `regroup` allows (`kinds` then says so; `block_rows` reads rows back in the file's layout).
    """

    def __init__(
        self,
        parts: list[Tensor],
        k: int,
        bias: Tensor | None,
        prologue: Prologue,
        kinds: Sequence[Kind],
        kernels: QKernels,
        post_norm: RmsNorm | None = None,
        regroup: Regroup = "copy",
    ) -> None:
        if len(kinds) != len(parts):
            raise ValueError("one kind per part")
        self.file_kinds = list(kinds)
        self.kinds = [kind.kernel for kind in kinds]  # each part's layout as the kernel reads it
        self._kernels = kernels
        kind, gain, eps = PROLOGUE_NONE, None, 0.0
        if isinstance(prologue, RmsNorm):
            kind, gain, eps = PROLOGUE_RMS_NORM, prologue.gain, prologue.eps
        elif isinstance(prologue, SwiGLU):
            kind = PROLOGUE_SWIGLU
        elif isinstance(prologue, GeGLU):
            kind = PROLOGUE_GEGLU
        flat = [p.reshape(p.shape[0], -1) for p in parts]
        if regroup != "no" and kernels.x86:
            flat = self._split_tails(flat)
            self._regroup(flat, regroup)
        post_gain, post_eps = (None, 0.0) if post_norm is None else (post_norm.gain, post_norm.eps)
        self._weights = QuantWeights(
            self.kinds[0], kind, flat, gain, eps, bias, k, self.kinds, post_gain, post_eps
        )

    def _split_tails(self, flat: list[Tensor]) -> list[Tensor]:
        """A groupable part whose rows do not come in 8s (a 49156-row head) as its whole groups
        and its rest, while MAX_PARTS allows, so that the groups run regrouped."""
        out, kinds, start, bits = list[Tensor](), list[Kind](), 0, self._kernels.activations
        for i, (p, kind) in enumerate(zip(flat, self.file_kinds, strict=True)):
            whole = p.shape[0] // GROUP_ROWS * GROUP_ROWS
            room = len(out) + (len(flat) - i) < MAX_PARTS and start % GROUP_ROWS == 0
            split = kind.grouped_at(bits) and room and 0 < whole < p.shape[0]
            out += [p[:whole], p[whole:]] if split else [p]
            kinds += [kind] * (2 if split else 1)
            start += p.shape[0]
        self.file_kinds, self.kinds = kinds, [kind.kernel for kind in kinds]
        return out

    def _regroup(self, flat: list[Tensor], regroup: Regroup) -> None:
        """Parts of whole groups that start on a group boundary, re-laid (`flat`, kinds)."""
        start, bits = 0, self._kernels.activations  # (Q5_1 / Q5_K: groups at 8 bits only)
        for i, (p, kind) in enumerate(zip(flat, self.file_kinds, strict=True)):
            rows = p.shape[0]
            whole = rows and rows % GROUP_ROWS == 0 and start % GROUP_ROWS == 0
            if (g := kind.grouped_at(bits)) and whole:
                out = p if regroup == "in_place" and p.is_contiguous() else weight_buffer(*p.shape)
                self._kernels.repack_rows(kind.kernel, p, out)
                flat[i], self.kinds[i] = out, g
            start += rows

    def block_rows(self, index: Tensor) -> Tensor:
        """Rows `index` of a one-kind layer's blocks, file layout: uint8 [n, row bytes]."""
        if len({k.name for k in self.file_kinds}) != 1:
            raise ValueError("block_rows reads a layer of one kind")
        index = index.flatten().cpu()
        if len(self.kinds) == 1:
            return self._part_rows(0, index)
        # a split head (its groups, its rest): which part each row is in, found in Python (a
        # decode step looks up a row or a few; torch ops on them cost more, caches cold)
        values, base, hits = index.tolist(), 0, list[tuple[int, list[int], int]]()
        for i, part in enumerate(self._weights.parts):
            sel = [j for j, t in enumerate(values) if base <= t < base + part.shape[0]]
            if sel:
                hits.append((i, sel, base))
            base += part.shape[0]
        if sum(len(sel) for _, sel, _ in hits) != len(values):
            raise ValueError(f"row indices must be in [0, {base})")
        if len(hits) == 1:  # all in one part (a single row always)
            return self._part_rows(hits[0][0], index - hits[0][2])
        out = torch.empty((len(values), self._weights.parts[0].shape[1]), dtype=torch.uint8)
        for i, sel, at in hits:
            out[sel] = self._part_rows(i, index[sel] - at)
        return out

    def _part_rows(self, i: int, index: Tensor) -> Tensor:
        part, (kind, grouped) = self._weights.parts[i], BY_KERNEL[self.kinds[i]]
        if grouped:
            return self._kernels.unrepack_rows(kind.kernel, part, index)
        return part[index]

    @property
    def out_features(self) -> int:
        return self._weights.n

    @property
    def parts(self) -> list[Tensor]:
        """The weight parts as the kernel reads them (uint8 [rows_i, row bytes], see `kinds`)."""
        return self._weights.parts

    @property
    def kernel(self) -> str:
        names = " + ".join(dict.fromkeys(layout_name(k) for k in self.kinds))
        return f"{names} C kernel{', post-norm' if self._weights.post_gain is not None else ''}"

    @property
    def native(self) -> tuple[QKernels, QuantWeights]:  # (calls that chain layers in C: MoE)
        return self._kernels, self._weights

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        return self._kernels.linear(self._weights, x, residual)


def _prologue_with_gain(x: Tensor, prologue: Prologue) -> Tensor:
    """The prologue with torch ops, RmsNorm's gain applied (not folded into weights)."""
    if isinstance(prologue, RmsNorm):
        return F.rms_norm(x, (x.shape[-1],), prologue.gain.to(x.device, x.dtype), prologue.eps)
    return _torch_prologue(x, prologue)


class StreamingLinear:
    """File blocks of a type no kernel runs, dequantised `row_chunk` rows at a time per call.

    Memory-faithful (the weights stay in the file's bytes; the scratch is bounded), slow: every
    call dequantises the whole matrix. The fast native K-quant kernels will replace it.
    """

    def __init__(
        self,
        weight: QuantTensor,
        bias: Tensor | None,
        prologue: Prologue,
        dtype: torch.dtype,
        device: torch.device,
        why: str = "no kernel for it",
    ) -> None:
        self.weight = weight
        self.why = why
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype)
        self.prologue = prologue
        self.dtype, self.device = dtype, device
        self._chunk = row_chunk(weight.in_features)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def kernel(self) -> str:
        return f"{self.weight.qtype.name} dequantised per call in torch ({self.why})"

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        x = _prologue_with_gain(x, self.prologue)
        n = self.out_features
        y = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
        for a in range(0, n, self._chunk):
            b = min(n, a + self._chunk)
            w = self.weight.dequantize(a, b).to(device=self.device, dtype=self.dtype)
            y[..., a:b] = F.linear(x, w)
        if self.bias is not None:
            y += self.bias
        return y if residual is None else residual + y


class PostNormLinear:
    """y = residual + rmsnorm(inner(x)) * gain: a layer's output norm where no kernel fuses it."""

    def __init__(self, inner: Linear, norm: RmsNorm) -> None:
        self.inner, self.norm = inner, norm

    @property
    def out_features(self) -> int:
        return self.inner.out_features

    @property
    def kernel(self) -> str:
        return f"{self.inner.kernel}, post-norm in torch"

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        y = self.inner(x)
        y = F.rms_norm(y, (y.shape[-1],), self.norm.gain.to(y.device, y.dtype), self.norm.eps)
        return y if residual is None else residual + y


class SplitLinear:
    """Parts of different formats (Q4_K q | k with Q6_K v): one prologue, then each part."""

    def __init__(self, parts: list[Linear], bias: Tensor | None, prologue: Prologue) -> None:
        self.parts, self.bias, self.prologue = parts, bias, prologue

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)

    @property
    def kernel(self) -> str:
        return " + ".join(sorted({p.kernel for p in self.parts}))

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        x = _prologue_with_gain(x, self.prologue)
        y = torch.cat([p(x) for p in self.parts], dim=-1)
        if self.bias is not None:
            y = y + self.bias.to(y.device, y.dtype)
        return y if residual is None else residual + y


def fp16_packing_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


def choose_weight_format(
    source_format: str, device: torch.device, dtype: torch.dtype, kernels: QKernels | None
) -> WeightFormat:
    """The fastest format that keeps the file's precision, for weights held as plain tensors
    (see the module docstring; weights kept in the file's blocks run in their own format).

    q4 only for Q4_1 files (requantising them is exact); q8 for everything else, which is
    exact for Q8_0 and loses far less than the file's own quantisation for other types.
    """
    if device.type != "cpu" or dtype != torch.float32:
        return "dense"
    if kernels is not None:
        return "q4" if source_format == "Q4_1" else "q8"
    return "fp16" if fp16_packing_available() else "dense"


def make_linear(
    weight: Weight | Sequence[Weight],
    bias: Tensor | None,
    fmt: WeightFormat,
    *,
    prologue: Prologue = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
    kernels: QKernels | None = None,
    post_norm: RmsNorm | None = None,
    regroup: Regroup = "copy",
) -> Linear:
    """A linear layer y = prologue(x) W^T + b (then `post_norm`, if given, before the residual
    add); `dtype` is the activation dtype; `regroup`: see `Regroup` (file blocks given).

    `weight` is one matrix or the parts whose rows stack into it (q | k | v). Plain tensors run
    in format `fmt`; file blocks run in their own format: the compiled kernel for the types it
    knows (parts of different types in one call), else dequantised a few rows at a time
    (`StreamingLinear`).
    """
    device = device or torch.device("cpu")
    parts = [weight] if isinstance(weight, Tensor | QuantTensor) else list(weight)
    plain = [p for p in parts if isinstance(p, Tensor)]
    if len(plain) == len(parts):
        return _plain_linear(
            plain[0] if len(plain) == 1 else torch.cat(plain), bias, fmt, prologue, dtype, device,
            kernels, post_norm,
        )  # fmt: skip
    kinds = _kernel_kinds(parts, device, dtype, kernels)
    if kinds is not None and kernels is not None:
        blocks = [p.raw for p in parts if isinstance(p, QuantTensor)]
        k = parts[0].shape[1]
        return QuantLinear(blocks, k, bias, prologue, kinds, kernels, post_norm, regroup)
    lin: Linear
    if len(parts) == 1 and isinstance(parts[0], QuantTensor):
        why = "no kernel for it"
        if parts[0].qtype in BY_GGML:
            why = "the compiled kernels run on CPUs with float32 activations only"
            if kernels is None:
                why = "the compiled CPU kernels are not available here"
        lin = StreamingLinear(parts[0], bias, prologue, dtype, device, why)
    else:
        groups: list[list[Weight]] = []  # runs one kernel takes together: [q, k] Q4_K, [v] F16 blocks
        for p in parts:
            if groups and _kernel_kinds([*groups[-1], p], device, dtype, kernels) is not None:
                groups[-1].append(p)
            else:
                groups.append([p])
        lin = SplitLinear(
            [
                make_linear(
                    g, None, fmt, dtype=dtype, device=device, kernels=kernels, regroup=regroup
                )
                for g in groups
            ],
            bias,
            prologue,
        )
    return lin if post_norm is None else PostNormLinear(lin, post_norm)


def _kernel_kinds(
    parts: list[Weight], device: torch.device, dtype: torch.dtype, kernels: QKernels | None
) -> list[Kind] | None:
    """Each part's kind, when every part is blocks of a kind the compiled kernels run
    (`kinds.KINDS`; kinds may differ between parts)."""
    if kernels is None or device.type != "cpu" or dtype != torch.float32 or len(parts) > MAX_PARTS:
        return None
    kinds: list[Kind] = []
    for p in parts:
        if not isinstance(p, QuantTensor) or p.qtype not in BY_GGML:
            return None
        kinds.append(BY_GGML[p.qtype])
    return kinds


def _plain_linear(
    weight: Tensor,
    bias: Tensor | None,
    fmt: WeightFormat,
    prologue: Prologue,
    dtype: torch.dtype,
    device: torch.device,
    kernels: QKernels | None,
    post_norm: RmsNorm | None = None,
) -> Linear:
    if fmt in ("fp16", "q8", "q4") and (device.type != "cpu" or dtype != torch.float32):
        raise ValueError(f"the {fmt} weight format needs device 'cpu' and dtype float32")
    if fmt in ("q8", "q4"):
        if kernels is None:
            raise ValueError(f"the {fmt} weight format needs the compiled CPU kernels")
        if weight.shape[1] % QUANT_BLOCK:
            fmt = "fp16" if fp16_packing_available() else "dense"
        else:
            blocks = quantize_q4(weight) if fmt == "q4" else quantize_q8(weight)
            kind = kind_named("Q4_1" if fmt == "q4" else "Q8_0")
            k = weight.shape[1]
            # fresh blocks: nobody else reads them
            return QuantLinear([blocks], k, bias, prologue, [kind], kernels, post_norm, "in_place")
    if isinstance(prologue, RmsNorm):
        prologue = RmsNorm(prologue.gain.to(device), prologue.eps)
    folded = _fold_gain(weight, prologue)
    lin: Linear
    if fmt == "fp16":
        lin = PackedFp16Linear(folded, bias, prologue)
    else:
        lin = DenseLinear(
            folded.to(device=device, dtype=dtype).contiguous(),
            None if bias is None else bias.to(device=device, dtype=dtype),
            prologue,
        )
    return lin if post_norm is None else PostNormLinear(lin, post_norm)
