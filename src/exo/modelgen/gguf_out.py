"""A GGUF file written tensor by tensor: header, metadata and the tensor index first (gguf's
GGUFWriter, given each tensor's type and size up front), then each tensor's bytes streamed in
row chunks straight to the file. Memory stays at one chunk whatever the file's size."""

from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter

from exo.modelgen.blueprint import Blueprint, MetaItem, TensorSpec
from exo.modelgen.quants import check_width, quantize_rows, row_bytes
from exo.modelgen.recipes import Recipe, tensor_type
from exo.modelgen.values import CHUNK_VALUES, value_chunks
from exo.modelgen.vocab import Vocabulary, gguf_arrays, gguf_items

Progress = Callable[[str, int, int], None]
"""(tensor name, bytes written so far, total bytes)"""


def tensor_types(bp: Blueprint, r: Recipe) -> dict[str, GGMLQuantizationType]:
    """Each tensor's type; ValueError when a row width does not fit its type's blocks."""
    types = {t.gguf_name: tensor_type(r, t, bp) for t in bp.tensors}
    for t in bp.tensors:
        problem = check_width(types[t.gguf_name], t.k)
        if problem is not None:
            raise ValueError(f"{t.gguf_name} ({t.k} values per row): {problem}")
    return types


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
    w = GGUFWriter(str(part), bp.gguf_arch)
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
