"""A GGUF file's whole header (metadata and tensor table) from its first bytes, checked, and
the header of a shard file that keeps some of its tensors.

The metadata pairs are kept as the raw bytes they were read from, so a shard file carries
them unchanged (its own ``exo.shard.*`` pairs appended, a split file's ``split.*`` pairs
dropped); the tensor table is read in full and checked against the file's size before a
byte of tensor data is fetched.
"""

import struct
from dataclasses import dataclass
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from exo.worker.download.gguf_head import _ARRAY, _STRING, TruncatedHead, _Reader, read_counts

SHARD_PREFIX = "exo.shard."
"""Metadata keys of a shard file (its layer range, and the repo, commit and file it came from)."""
MODEL_TENSORS_KEY = "exo.shard.model_tensors"
"""The whole model's tensors (``name:dims``, dims in the file's order) a shard file lists, so
a loader reads the model's shape (vocabulary, biases, tied head) from a shard that lacks them."""


class LyingHeader(ValueError):
    """A header whose tensor table the file cannot hold (offsets past its end, overlaps,
    sizes that do not match the type and shape)."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dims: tuple[int, ...]  # the file's order: innermost first
    qtype: int
    offset: int  # relative to the start of the tensor data
    n_bytes: int


@dataclass(frozen=True)
class GGUFIndex:
    version: int
    kvs: tuple[tuple[str, bytes], ...]  # (key, the pair's raw bytes)
    metadata: dict[str, Any]  # scalars and strings (arrays are None)
    tensors: tuple[TensorEntry, ...]
    alignment: int
    data_start: int  # absolute offset of the tensor data

    def by_name(self) -> dict[str, TensorEntry]:
        return {t.name: t for t in self.tensors}


def tensor_bytes(name: str, dims: tuple[int, ...], qtype: int) -> int:
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except ValueError:
        raise LyingHeader(f"tensor {name!r} has an unknown type {qtype}") from None
    n = 1
    for d in dims:
        n *= d
    if not dims or dims[0] % block:
        raise LyingHeader(f"tensor {name!r}: a row of {dims[:1]} is not whole {block}-blocks")
    return n // block * type_size


def read_gguf_index(data: bytes) -> GGUFIndex:
    """The header in ``data`` (the file's first bytes). Raises TruncatedHead (fetch more),
    ValueError (not a GGUF file) or LyingHeader (a table no file could hold)."""
    r = _Reader(data)
    version, n_tensors, n_kv = read_counts(r)
    if n_tensors > 1 << 20 or n_kv > 1 << 20:
        raise LyingHeader(f"a header claiming {n_tensors} tensors and {n_kv} metadata pairs")
    kvs: list[tuple[str, bytes]] = []
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        begin = r.pos
        key = r.string()
        metadata[key] = r.value(r.unpack("<I", 4))
        kvs.append((key, data[begin : r.pos]))
    raw: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.unpack("<I", 4)
        if n_dims > 8:
            raise LyingHeader(f"tensor {name!r} claims {n_dims} dimensions")
        dims = tuple(int(r.unpack("<Q", 8)) for _ in range(n_dims))
        raw.append((name, dims, r.unpack("<I", 4), r.unpack("<Q", 8)))
    align = metadata.get("general.alignment", 32)
    alignment = align if isinstance(align, int) and align > 0 else 32
    data_start = _align(r.pos, alignment)
    tensors = tuple(TensorEntry(n, d, q, o, tensor_bytes(n, d, q)) for n, d, q, o in raw)
    return GGUFIndex(version, tuple(kvs), metadata, tensors, alignment, data_start)


def check_index(index: GGUFIndex, file_size: int, where: str) -> None:
    """Refuse a tensor table the file of ``file_size`` bytes cannot hold: LyingHeader."""
    names: set[str] = set()
    end_before = 0
    for t in sorted(index.tensors, key=lambda t: t.offset):
        if t.name in names:
            raise LyingHeader(f"{where}: the tensor {t.name!r} is listed twice")
        names.add(t.name)
        if index.data_start + t.offset + t.n_bytes > file_size:
            raise LyingHeader(
                f"{where}: the header places tensor {t.name!r} at bytes "
                f"{index.data_start + t.offset}..{index.data_start + t.offset + t.n_bytes}, "
                f"past the file's end ({file_size} bytes)"
            )
        if t.offset < end_before:
            raise LyingHeader(f"{where}: the tensor {t.name!r} overlaps the one before it")
        end_before = t.offset + t.n_bytes


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def kv_string(key: str, value: str) -> bytes:
    return _string(key) + struct.pack("<I", _STRING) + _string(value)


def kv_u32(key: str, value: int) -> bytes:
    return _string(key) + struct.pack("<I", 4) + struct.pack("<I", value)


def kv_strings(key: str, values: list[str]) -> bytes:
    body = b"".join(_string(v) for v in values)
    return _string(key) + struct.pack("<IIQ", _ARRAY, _STRING, len(values)) + body


def model_tensor_list(index: GGUFIndex) -> list[str]:
    """``name:d0,d1,...`` for every tensor of the whole model (MODEL_TENSORS_KEY)."""
    return [f"{t.name}:{','.join(str(d) for d in t.dims)}" for t in index.tensors]


def shard_layout(
    index: GGUFIndex, kept: list[TensorEntry], extra_kvs: list[bytes]
) -> tuple[bytes, list[int]]:
    """The header of a file holding ``kept`` (in that order) with the metadata of ``index``
    (``split.*`` and earlier ``exo.shard.*`` pairs dropped, ``extra_kvs`` appended), padded
    to the alignment; and each kept tensor's absolute offset in that file."""
    kvs = [raw for key, raw in index.kvs
           if not key.startswith(("split.", SHARD_PREFIX))] + extra_kvs
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", index.version, len(kept), len(kvs))
    for raw in kvs:
        out += raw
    offsets: list[int] = []
    rel = 0
    for t in kept:
        out += _string(t.name) + struct.pack("<I", len(t.dims))
        out += b"".join(struct.pack("<Q", d) for d in t.dims)
        out += struct.pack("<IQ", t.qtype, rel)
        offsets.append(rel)
        rel = _align(rel + t.n_bytes, index.alignment)
    data_start = _align(len(out), index.alignment)
    out += b"\0" * (data_start - len(out))
    return bytes(out), [data_start + o for o in offsets]


__all__ = ["TruncatedHead"]
