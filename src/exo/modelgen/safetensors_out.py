"""A Hugging Face folder written tensor by tensor: config.json, tokenizer files, chat template
and safetensors shards (`model.safetensors`, or `model-0000i-of-0000n.safetensors` with
`model.safetensors.index.json` past `shard_bytes`). Each shard's header is computed from the
tensors' sizes first, then their bytes are streamed in row chunks."""

import json
import math
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from exo.modelgen.blueprint import Blueprint, TensorSpec
from exo.modelgen.quants import quantize_rows, row_bytes
from exo.modelgen.values import CHUNK_VALUES, Array, value_chunks
from exo.modelgen.vocab import Vocabulary, write_hf_tokenizer

T = GGMLQuantizationType
DTYPES = {T.F32: "F32", T.F16: "F16", T.BF16: "BF16"}
SHARD_BYTES = 4 << 30


def _shards(tensors: tuple[TensorSpec, ...], itemsize: int, limit: int) -> list[list[TensorSpec]]:
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for t in tensors:
        n = t.rows * t.k * itemsize
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += n
    return shards


def _header(tensors: list[TensorSpec], qtype: GGMLQuantizationType) -> bytes:
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        for name, shape in hf_parts(t):
            n = math.prod(shape[:-1]) * row_bytes(qtype, t.k)
            entries[name] = {"dtype": DTYPES[qtype], "shape": list(shape),
                             "data_offsets": [offset, offset + n]}  # fmt: skip
            offset += n
    raw = json.dumps(entries, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def hf_parts(t: TensorSpec) -> list[tuple[str, tuple[int, ...]]]:
    """The Hugging Face tensors `t` is stored as: itself, or (a merged expert tensor whose
    hf_name holds `{e}`) one matrix per expert, in order: the same bytes either way."""
    if "{e}" not in t.hf_name:
        return [(t.hf_name, t.shape)]
    return [(t.hf_name.format(e=e), t.shape[1:]) for e in range(t.shape[0])]


def _write_shard(path: Path, tensors: list[TensorSpec], qtype: GGMLQuantizationType,
                 seed: int, chunk_values: int) -> None:  # fmt: skip
    header = _header(tensors, qtype)
    with path.open("wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for t in tensors:
            for chunk in value_chunks(t, seed, chunk_values):
                f.write(np.ascontiguousarray(quantize_rows(half_split(chunk, t), qtype)).data)


def half_split(chunk: Array, t: TensorSpec) -> Array:
    """Rows of whole heads from llama.cpp's interleaved rotary order (pairs 2i, 2i+1) to
    Hugging Face's half-split order (pairs i, i + head_dim / 2); other tensors as they are."""
    hd = t.rope_head_dim
    if not hd:
        return chunk
    heads = chunk.reshape(-1, hd // 2, 2, chunk.shape[-1])
    return heads.swapaxes(1, 2).reshape(chunk.shape)


def write_safetensors(
    folder: Path,
    bp: Blueprint,
    qtype: GGMLQuantizationType,
    vocab: Vocabulary | int,
    *,
    seed: int = 0,
    chunk_values: int = CHUNK_VALUES,
    shard_bytes: int = SHARD_BYTES,
) -> Path:
    """Write model `bp` in float type `qtype` (F32, F16 or BF16) into `folder`."""
    if qtype not in DTYPES:
        raise ValueError(f"safetensors holds float weights (F32, F16, BF16), not {qtype.name}")
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(bp.hf_config) | {"torch_dtype": {"F32": "float32", "F16": "float16",
                                                   "BF16": "bfloat16"}[DTYPES[qtype]]}  # fmt: skip
    if isinstance(vocab, Vocabulary):
        config |= {"bos_token_id": vocab.bos_id, "eos_token_id": vocab.eos_id}
        write_hf_tokenizer(vocab, folder, int(str(config.get("max_position_embeddings", 4096))))
    else:
        config |= {"bos_token_id": 1, "eos_token_id": 2}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    shards = _shards(bp.tensors, row_bytes(qtype, 256) // 256, shard_bytes)
    if len(shards) == 1:
        _write_shard(folder / "model.safetensors", shards[0], qtype, seed, chunk_values)
        return folder
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        _write_shard(folder / name, shard, qtype, seed, chunk_values)
        weight_map |= {part: name for t in shard for part, _ in hf_parts(t)}
    total = sum(t.rows * row_bytes(qtype, t.k) for t in bp.tensors)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n",
                                                         encoding="utf-8")  # fmt: skip
    return folder
