"""A small, fast GGUF parser: metadata and tensor locations, tensor bytes memory-mapped.

`gguf.GGUFReader` builds a numpy view for every metadata item and takes seconds on a vocabulary
of 50k tokens; this parser reads the header with `struct` and leaves tensor data in the mmap.
Quantisation types and block sizes come from the `gguf` package.

Layout (little endian): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
kv_count x (string key, u32 value type, value), tensor_count x (string name, u32 n_dims,
n_dims x u64 dims, u32 ggml type, u64 offset), padding to `general.alignment`, tensor data.
"""

import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
from torch import Tensor

from exo.worker.engines.file_rows import pread_into

MetadataValue = int | float | bool | str | list[Any]


def eos_token_ids(meta: Mapping[str, object]) -> tuple[int, ...]:
    """Every token id that ends a generation: end of sequence, of turn and of message."""
    ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = meta.get(f"tokenizer.ggml.{key}")
        if isinstance(value, int) and not isinstance(value, bool) and value not in ids:
            ids.append(value)
    return tuple(ids)

_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),  # uint8
    1: ("<b", 1),  # int8
    2: ("<H", 2),  # uint16
    3: ("<h", 2),  # int16
    4: ("<I", 4),  # uint32
    5: ("<i", 4),  # int32
    6: ("<f", 4),  # float32
    7: ("<?", 1),  # bool
    10: ("<Q", 8),  # uint64
    11: ("<q", 8),  # int64
    12: ("<d", 8),  # float64
}
_STRING = 8
_ARRAY = 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order: outermost first (GGUF stores innermost first)
    qtype: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    n_bytes: int


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def scalar(self, fmt: str, size: int) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self) -> int:
        return int(self.scalar("<I", 4))

    def u64(self) -> int:
        return int(self.scalar("<Q", 8))

    def string(self) -> str:
        n = self.u64()
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> MetadataValue:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type = self.u32()
            count = self.u64()
            if item_type in _SCALARS:  # numeric arrays in one numpy read
                fmt, size = _SCALARS[item_type]
                arr = np.frombuffer(self.buf, dtype=np.dtype(fmt), count=count, offset=self.pos)
                self.pos += size * count
                return arr.tolist()
            return [self.value(item_type) for _ in range(count)]
        fmt, size = _SCALARS[vtype]
        return self.scalar(fmt, size)


def _model_shapes(
    meta: Mapping[str, object], tensors: Mapping[str, TensorInfo]
) -> dict[str, tuple[int, ...]]:
    """Every tensor of the whole model and its shape (numpy order): a shard file holding some
    of them lists them all (``exo.shard.model_tensors``: ``name:d0,d1`` in GGUF order)."""
    listed = meta.get("exo.shard.model_tensors")
    if not isinstance(listed, list):
        return {name: t.shape for name, t in tensors.items()}
    shapes: dict[str, tuple[int, ...]] = {}
    for item in listed:
        name, _, dims = str(item).rpartition(":")
        shapes[name] = tuple(reversed([int(d) for d in dims.split(",") if d]))
    return shapes


class GGUFFile:
    """An open GGUF file: `metadata`, `tensors` by name, and `load(name)` as float32 numpy."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        try:
            header = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
            try:
                self._parse(path, header)
            finally:
                header.close()  # metadata is copied out; tensor data is read with pread
        except BaseException:
            os.close(self._fd)
            raise

    def _parse(self, path: Path, buf: mmap.mmap) -> None:
        cur = _Cursor(buf)
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        cur.pos = 4
        version = cur.u32()
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        n_tensors, n_kv = cur.u64(), cur.u64()
        self.metadata: dict[str, MetadataValue] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.u32())
        infos: list[tuple[str, tuple[int, ...], GGMLQuantizationType, int]] = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = [cur.u64() for _ in range(cur.u32())]
            qtype = GGMLQuantizationType(cur.u32())
            infos.append((name, tuple(reversed(dims)), qtype, cur.u64()))
        align_value = self.metadata.get("general.alignment", 32)
        alignment = align_value if isinstance(align_value, int) else 32
        data_start = (cur.pos + alignment - 1) // alignment * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, qtype, offset in infos:
            block, type_size = GGML_QUANT_SIZES[qtype]
            n_elements = int(np.prod(shape))
            self.tensors[name] = TensorInfo(
                name, shape, qtype, data_start + offset, n_elements // block * type_size
            )
        self.model_shapes = _model_shapes(self.metadata, self.tensors)

    def raw(self, name: str) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The stored bytes of a tensor, one row per outermost index (read, not mapped)."""
        info = self.tensors[name]
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        return self.read_rows(name, 0, rows).numpy().reshape(*info.shape[:-1], -1)

    def row_bytes(self, name: str) -> int:
        info = self.tensors[name]
        block, type_size = GGML_QUANT_SIZES[info.qtype]
        return info.shape[-1] // block * type_size

    def read_rows(self, name: str, start: int, stop: int) -> Tensor:
        """Rows [start, stop) of a tensor seen as [rows, last dim]: uint8 [stop - start, row_bytes].

        Read with pread into a fresh buffer: the file's pages stay out of this process (a
        mapped page that was read counts in its resident memory until unmapped).
        """
        info = self.tensors[name]
        row = self.row_bytes(name)
        return pread_into(self._fd, info.offset + start * row, stop - start, row)

    def load(self, name: str) -> np.ndarray[Any, np.dtype[np.float32]]:
        """A tensor dequantised to float32, in numpy order (e.g. [out_features, in_features])."""
        info = self.tensors[name]
        if info.qtype == GGMLQuantizationType.F32:
            out = self.raw(name).view(np.float32).reshape(info.shape).copy()
        elif info.qtype == GGMLQuantizationType.F16:
            out = self.raw(name).view(np.float16).reshape(info.shape).astype(np.float32)
        else:
            out = dequantize(self.raw(name), info.qtype).reshape(info.shape)
        return np.ascontiguousarray(out, dtype=np.float32)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
