"""Weight matrices kept in a GGUF block type: the file's bytes, row by row.

A `QuantTensor` is a matrix [N, K] stored as N rows of K / block_size blocks, exactly the
bytes llama.cpp's format holds (`raw`: uint8 [N, row_bytes]). Rows are independent, so row
ranges (tensor-parallel column-parallel slices), row permutations (the rotary layout change)
and row lookups (embeddings) work on the bytes without dequantising. Column ranges work when
they fall on block boundaries.

Dequantising uses `gguf.quants.dequantize` (the reference implementation) on a bounded number
of rows at a time; `Weight` is what the loaders hand to the model: a plain tensor or one of these.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
from torch import Tensor

# Rows dequantised at once are capped at this many float32 values (4 MiB of scratch).
SCRATCH_VALUES = 1 << 20

Q4_0 = GGMLQuantizationType.Q4_0
Q4_1 = GGMLQuantizationType.Q4_1
Q5_0 = GGMLQuantizationType.Q5_0
Q5_1 = GGMLQuantizationType.Q5_1
Q8_0 = GGMLQuantizationType.Q8_0
Q4_K = GGMLQuantizationType.Q4_K
Q5_K = GGMLQuantizationType.Q5_K
Q6_K = GGMLQuantizationType.Q6_K


@dataclass(frozen=True)
class QuantTensor:
    qtype: GGMLQuantizationType
    raw: Tensor  # uint8 [N, row_bytes], contiguous
    in_features: int  # K

    def __post_init__(self) -> None:
        block, size = GGML_QUANT_SIZES[self.qtype]
        if self.raw.dtype != torch.uint8 or self.raw.dim() != 2:
            raise ValueError("QuantTensor.raw must be uint8 [rows, row_bytes]")
        if self.in_features % block or self.raw.shape[1] != self.in_features // block * size:
            raise ValueError(
                f"{self.qtype.name}: {self.raw.shape[1]} bytes per row do not hold "
                f"{self.in_features} values"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return (self.raw.shape[0], self.in_features)

    @property
    def block_size(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][0]

    @property
    def n_bytes(self) -> int:
        return self.raw.numel()

    def rows(self, start: int, stop: int) -> "QuantTensor":
        return QuantTensor(self.qtype, self.raw[start:stop].contiguous(), self.in_features)

    def take_rows(self, index: Tensor) -> "QuantTensor":
        return QuantTensor(self.qtype, self.raw[index].contiguous(), self.in_features)

    def cols(self, start: int, stop: int) -> "QuantTensor | None":
        """Columns [start, stop) on block boundaries, or None when they are not."""
        block, size = GGML_QUANT_SIZES[self.qtype]
        if start % block or stop % block:
            return None
        raw = self.raw[:, start // block * size : stop // block * size].contiguous()
        return QuantTensor(self.qtype, raw, stop - start)

    def dequantize(self, start: int = 0, stop: int | None = None) -> Tensor:
        """Rows [start, stop) as float32 [rows, K] (the whole matrix by default)."""
        stop = self.raw.shape[0] if stop is None else stop
        return dequantize_rows(self.qtype, self.raw[start:stop], self.in_features)


def dequantize_rows(qtype: GGMLQuantizationType, raw: Tensor, k: int) -> Tensor:
    """uint8 [rows, row_bytes] of `qtype` -> float32 [rows, k]."""
    if qtype == Q8_0 and raw.shape[0] > 0:
        # the embedding's layout, looked up every step: w = d q in torch, the same float32
        # products as the reference (whose per-call overhead was ~0.4 ms for 8 rows)
        blocks = raw.contiguous().reshape(raw.shape[0], -1, 34)
        d = blocks[..., :2].contiguous().view(torch.float16).float()  # [rows, k / 32, 1]
        q = blocks[..., 2:].contiguous().view(torch.int8).float()  # [rows, k / 32, 32]
        return (q * d).reshape(raw.shape[0], k)
    data: np.ndarray[Any, np.dtype[np.uint8]] = raw.contiguous().numpy()
    out = dequantize(data, qtype).reshape(raw.shape[0], k)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def row_chunk(k: int) -> int:
    """How many rows of K values fit the dequantisation scratch (at least one)."""
    return max(1, SCRATCH_VALUES // max(1, k))


Weight = Tensor | QuantTensor
"""A weight as loaded: a plain tensor (norms, biases, float matrices) or file blocks."""
