"""One named tensor of a file turned into the form the model keeps, without a float32 shard.

The loaders (GGUF, safetensors) name tensors; this module decides how each is held:

* vectors (norms, biases, rotary factors): plain tensors in the plan's dtype;
* matrices in a GGUF block type: the file's bytes (`QuantTensor`), Q4_0 included (the kernels
  run its 18-byte blocks as they are);
* matrices stored as floats (F32 / F16 / BF16): q8 blocks when the compiled kernels run them,
  else plain tensors in the plan's dtype.

Conversions walk a tensor in row chunks read from the file, so the scratch memory of a load is
bounded by one chunk, whatever the tensor's size. `DENSE_PLAN` (the default of the loaders)
dequantises everything to plain float32 tensors: the exact reference.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from gguf import GGMLQuantizationType
from torch import Tensor

from exo.worker.engines.file_rows import weight_buffer
from exo.worker.engines.linear import QUANT_BLOCK, quantize_q8
from exo.worker.engines.qtensor import Q8_0, QuantTensor, Weight, dequantize_rows

FLOAT_KINDS: dict[str, torch.dtype] = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}


class RowReader(Protocol):
    def read_rows(self, name: str, start: int, stop: int) -> Tensor:
        """uint8 [stop - start, row_bytes]: rows of the tensor seen as [rows, last dim]."""
        ...


@dataclass(frozen=True)
class StoragePlan:
    dtype: torch.dtype = torch.float32  # plain tensors
    float_matrices: Literal["dense", "q8"] = "dense"
    keep_blocks: bool = False  # GGUF block types stay in the file's bytes
    matrix_dtype: torch.dtype | None = None  # dense float matrices, when not `dtype`


DENSE_PLAN = StoragePlan()


def kernel_plan(
    dtype: torch.dtype, kernels_loaded: bool, matrix_dtype: torch.dtype | None = None
) -> StoragePlan:
    """The memory-faithful plan: file blocks kept; floats as q8 when the kernels run them, else
    dense in `matrix_dtype` (float16 where fbgemm will pack them: the file's 16 bits)."""
    return StoragePlan(
        dtype=dtype,
        float_matrices="q8" if kernels_loaded else "dense",
        keep_blocks=True,
        matrix_dtype=None if kernels_loaded else matrix_dtype,
    )


@dataclass(frozen=True)
class StoredTensor:
    """Where a tensor is: its name in `reader`, its file kind ("BF16", "Q4_K", ..), its shape."""

    reader: RowReader
    name: str
    kind: str
    shape: tuple[int, ...]


# Values converted at once: a conversion's temporaries are ~20 bytes a value (1.25 MiB here).
CONVERT_VALUES = 1 << 16


def _chunked(t: StoredTensor, rows: int, convert: "_Convert", out: Tensor) -> Tensor:
    step = max(1, CONVERT_VALUES // max(1, t.shape[-1]))
    for a in range(0, rows, step):
        b = min(rows, a + step)
        out[a:b] = convert(t.reader.read_rows(t.name, a, b))
    return out


class _Convert(Protocol):
    def __call__(self, raw: Tensor) -> Tensor: ...


def _float_rows(kind: str, raw: Tensor) -> Tensor:
    """Raw bytes [rows, K * size] of a float kind -> float32 [rows, K]."""
    if kind in FLOAT_KINDS:
        return raw.view(FLOAT_KINDS[kind]).float()
    raise ValueError(f"{kind} is not a float kind")


def materialise(t: StoredTensor, plan: StoragePlan) -> Weight:
    """The tensor in the form `plan` keeps it (see the module docstring)."""
    rows = 1
    for d in t.shape[:-1]:
        rows *= d
    k = t.shape[-1]
    is_matrix = len(t.shape) == 2
    if t.kind in FLOAT_KINDS:
        if is_matrix and plan.float_matrices == "q8" and k % QUANT_BLOCK == 0:
            out = weight_buffer(rows, k // QUANT_BLOCK * 34)

            def to_q8(raw: Tensor) -> Tensor:
                return quantize_q8(_float_rows(t.kind, raw)).reshape(raw.shape[0], -1)

            return QuantTensor(Q8_0, _chunked(t, rows, to_q8, out), k)
        dtype = plan.matrix_dtype if is_matrix and plan.matrix_dtype is not None else plan.dtype
        dense = torch.empty((rows, k), dtype=dtype)
        return _chunked(t, rows, lambda raw: _float_rows(t.kind, raw), dense).reshape(t.shape)
    qtype = GGMLQuantizationType[t.kind]
    if is_matrix and plan.keep_blocks:
        return QuantTensor(qtype, t.reader.read_rows(t.name, 0, rows), k)
    dense = torch.empty((rows, k), dtype=plan.dtype)
    return _chunked(t, rows, lambda raw: dequantize_rows(qtype, raw, k), dense).reshape(t.shape)


class TensorSource(ABC):
    """A model's tensors by name (one file format), each materialised as ``plan`` says
    when asked for."""

    def __init__(self, plan: StoragePlan) -> None:
        self.plan = plan

    @abstractmethod
    def has(self, name: str) -> bool: ...

    @abstractmethod
    def stored(self, name: str) -> StoredTensor:
        """Where ``name`` is; ValueError naming it when the model lacks it."""

    def get(self, name: str) -> Weight:
        return materialise(self.stored(name), self.plan)

    def vector(self, name: str) -> Tensor:
        w = self.get(name)
        assert isinstance(w, Tensor)  # vectors are always plain tensors
        return w

    def maybe(self, name: str) -> Weight | None:
        return self.get(name) if self.has(name) else None

    def maybe_vector(self, name: str) -> Tensor | None:
        return self.vector(name) if self.has(name) else None


def running_bytes(w: Weight | None) -> int:
    if w is None:
        return 0
    if isinstance(w, QuantTensor):
        return w.n_bytes
    return w.numel() * w.element_size()


def kind_of(w: Weight) -> str:
    """The running format of a weight: a GGUF block type name or a torch dtype name."""
    return w.qtype.name if isinstance(w, QuantTensor) else str(w.dtype).removeprefix("torch.")
