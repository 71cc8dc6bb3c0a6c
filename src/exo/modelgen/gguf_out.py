"""A GGUF file written tensor by tensor: header, metadata and the tensor index first (gguf's
GGUFWriter, given each tensor's type and size up front), then each tensor's bytes streamed in
row chunks straight to the file. Memory stays at one chunk whatever the file's size."""

import functools
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    GGML_QUANT_VERSION,
    GGMLQuantizationType,
    GGUFEndian,
    GGUFValueType,
    GGUFWriter,
)

from exo.modelgen.blueprint import Blueprint, MetaItem, TensorSpec
from exo.modelgen.quants import QUANTISERS, check_width, quantize_rows, row_bytes
from exo.modelgen.recipes import Recipe, tensor_type
from exo.modelgen.values import CHUNK_VALUES, value_chunks
from exo.modelgen.vocab import Vocabulary, gguf_arrays, gguf_items

T = GGMLQuantizationType

Progress = Callable[[str, int, int], None]
"""(tensor name, bytes written so far, total bytes)"""


def tensor_types(bp: Blueprint, r: Recipe) -> dict[str, GGMLQuantizationType]:
    """Each tensor's type; ValueError when a row width does not fit its type's blocks."""
    types = {t.gguf_name: fitting_type(tensor_type(r, t, bp), t.k) for t in bp.tensors}
    for t in bp.tensors:
        problem = check_width(types[t.gguf_name], t.k)
        if problem is not None:
            raise ValueError(f"{t.gguf_name} ({t.k} values per row): {problem}")
    return types


# What llama.cpp's quantiser stores a tensor in when its rows are not whole blocks of the
# recipe's type (gpt-oss's 2880-wide rows in a K-quant, MLA's 128-wide attn_k_b...).
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL",
             "IQ4_XS": "IQ4_NL"}  # fmt: skip


def fitting_type(qtype: GGMLQuantizationType, k: int) -> GGMLQuantizationType:
    """`qtype`, or (rows of `k` values not whole blocks of it) llama.cpp's fallback type, else
    Q8_0, else F16: the first of them the generator can write."""
    if check_width(qtype, k) is None:
        return qtype
    fallback = T.__members__.get(_FALLBACK.get(qtype.name, ""))
    for candidate in (fallback, T.Q8_0, T.F16):
        if candidate is not None and candidate in QUANTISERS and check_width(candidate, k) is None:
            return candidate
    return qtype  # (reported by the caller)


class _Writer(GGUFWriter):
    """gguf's writer, packing the vocabulary's arrays (100k strings and ids) in one go rather
    than value by value: the same bytes, a second less per file."""

    def _pack_val(
        self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None
    ) -> bytes:
        if vtype is GGUFValueType.ARRAY and self.endianess is GGUFEndian.LITTLE and sub_type is None:
            packed = _packed_array(tuple(val)) if isinstance(val, list | tuple) else None
            if packed is not None:
                return (struct.pack("<I", vtype) if add_vtype else b"") + packed
        return super()._pack_val(val, vtype, add_vtype, sub_type)


@functools.lru_cache(maxsize=8)
def _packed_array(values: tuple[object, ...]) -> bytes | None:
    """An array of strings or of ints as GGUF stores it (None: other arrays, gguf packs them)."""
    if values and all(isinstance(v, str) for v in values):
        encoded = [str(v).encode("utf-8") for v in values]
        parts = [struct.pack("<IQ", GGUFValueType.STRING, len(encoded))]
        parts += [struct.pack("<Q", len(e)) + e for e in encoded]
        return b"".join(parts)
    if values and all(type(v) is int for v in values):
        ints = np.array(values, dtype=np.int64)
        if ints.min() >= -(2**31) and ints.max() < 2**31:
            head = struct.pack("<IQ", GGUFValueType.INT32, len(values))
            return head + ints.astype("<i4").tobytes()
    return None


def _add_meta(w: GGUFWriter, items: tuple[MetaItem, ...]) -> None:
    for item in items:
        w.add_key_value(item.key, item.value, item.vtype)


def write_gguf(
    path: Path,
    bp: Blueprint,
    r: Recipe,
    vocab: Vocabulary | int,
    *,
    name: str,
    seed: int = 0,
    chunk_values: int = CHUNK_VALUES,
    progress: Progress | None = None,
) -> Path:
    """Write model `bp` under recipe `r` to `path` (through `path.part`, renamed when done).
    `vocab` an int: no tokenizer (a bare file for engine tests; BOS 1, EOS 2)."""
    types = tensor_types(bp, r)
    part = path.with_name(path.name + ".part")
    w = _Writer(str(part), bp.gguf_arch)
    w.add_name(name)
    w.add_type("model")
    w.add_file_type(int(r.file_type))
    w.add_quantization_version(GGML_QUANT_VERSION)
    _add_meta(w, bp.metadata)
    if isinstance(vocab, Vocabulary):
        _add_meta(w, gguf_items(vocab))
        for key, values in gguf_arrays(vocab).items():
            w.add_array(key, values)
    else:
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    sizes = {t.gguf_name: t.rows * row_bytes(types[t.gguf_name], t.k) for t in bp.tensors}
    for t in bp.tensors:
        w.add_tensor_info(t.gguf_name, t.shape, np.dtype(np.float32), sizes[t.gguf_name],
                          raw_dtype=types[t.gguf_name])  # fmt: skip
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        out = w.fout[0]
        total, done = sum(sizes.values()), 0
        for t in bp.tensors:
            w.write_padding(out, out.tell())  # each tensor starts aligned
            done += _stream_tensor(out.write, t, types[t.gguf_name], seed, chunk_values)
            w.write_padding(out, sizes[t.gguf_name])
            if progress is not None:
                progress(t.gguf_name, done, total)
    finally:
        w.close()
    part.replace(path)
    return path


def _stream_tensor(
    write: Callable[[memoryview], object],
    t: TensorSpec,
    qtype: GGMLQuantizationType,
    seed: int,
    chunk_values: int,
) -> int:
    written = 0
    for chunk in value_chunks(t, seed, chunk_values):
        data = np.ascontiguousarray(quantize_rows(chunk, qtype))
        write(data.data)
        written += data.nbytes
    return written
