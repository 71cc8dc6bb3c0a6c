"""A Hugging Face folder written tensor by tensor: config.json, tokenizer files, chat template
and safetensors shards (`model.safetensors`, or `model-0000i-of-0000n.safetensors` with
`model.safetensors.index.json` past `shard_bytes`). Each shard's header is computed from the
tensors' sizes first, then their bytes are streamed in row chunks."""

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import groupby
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


@dataclass(frozen=True)
class Part:
    """Bytes written as one run of a shard: the tensors `entries` (name, shape) of `dtype`,
    each `nbytes` long, whose bytes `chunks()` yields in order."""

    entries: list[tuple[str, tuple[int, ...]]]
    dtype: str
    nbytes: int
    chunks: Callable[[], Iterator[Array]]

    @property
    def total(self) -> int:
        return self.nbytes * len(self.entries)


def _shards(parts: list[Part], limit: int) -> list[list[Part]]:
    shards: list[list[Part]] = [[]]
    size = 0
    for part in parts:
        if shards[-1] and size + part.total > limit:
            shards.append([])
            size = 0
        shards[-1].append(part)
        size += part.total
    return shards


def _header(parts: list[Part]) -> bytes:
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for part in parts:
        for name, shape in part.entries:
            entries[name] = {"dtype": part.dtype, "shape": list(shape),
                             "data_offsets": [offset, offset + part.nbytes]}  # fmt: skip
            offset += part.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def _write_shard(path: Path, parts: list[Part]) -> None:
    header = _header(parts)
    with path.open("wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for part in parts:
            for chunk in part.chunks():
                f.write(np.ascontiguousarray(chunk).data)


# --- a blueprint's tensors as parts ------------------------------------------------------------


def hf_parts(t: TensorSpec) -> list[tuple[str, tuple[int, ...]]]:
    """The Hugging Face tensors `t` is stored as: itself, or (a merged expert tensor whose
    hf_name holds `{e}`) one matrix per expert, in order: the same bytes either way."""
    if "{e}" not in t.hf_name:
        return [(t.hf_name, t.shape)]
    return [(t.hf_name.format(e=e), t.shape[1:]) for e in range(t.shape[0])]


def _float_part(t: TensorSpec, qtype: GGMLQuantizationType, seed: int, chunk_values: int) -> Part:
    entries = hf_parts(t)

    def chunks() -> Iterator[Array]:
        for chunk in value_chunks(t, seed, chunk_values):
            yield quantize_rows(half_split(chunk, t), qtype)

    return Part(entries, DTYPES[qtype], t.rows * row_bytes(qtype, t.k) // len(entries), chunks)


def _fused(ts: list[TensorSpec], seed: int, chunk_values: int) -> Iterator[Array]:
    """Float32 rows of two tensors of one shape fused along axis 1, alternating: [n, K] chunks
    of 3-D tensors [E, R, K] give [2n, K] rows; of 2-D ones [E, K], [n, 2K]."""
    streams = [value_chunks(t, seed, chunk_values) for t in ts]
    matrices = len(ts[0].shape) > 2
    for a, b in zip(*streams, strict=True):
        pairs = np.stack([a, b], axis=1 if matrices else 2)
        yield pairs.reshape(-1, a.shape[-1]) if matrices else pairs.reshape(a.shape[0], -1)


def _fused_float_part(ts: list[TensorSpec], qtype: GGMLQuantizationType, seed: int,
                      chunk_values: int) -> Part:  # fmt: skip
    t = ts[0]
    shape = (t.shape[0], 2 * t.shape[1], *t.shape[2:])

    def chunks() -> Iterator[Array]:
        for rows in _fused(ts, seed, chunk_values):
            yield quantize_rows(rows, qtype)

    return Part([(t.hf_name, shape)], DTYPES[qtype], 2 * t.rows * row_bytes(qtype, t.k), chunks)


def mxfp4_split(rows: Array) -> tuple[Array, Array]:
    """GGUF MXFP4 rows uint8 [n, G * 17] (a scale byte, then byte j: value j low, j + 16 high)
    -> Hugging Face's blocks [n, G, 16] (byte j: value 2j low, 2j + 1 high), scales [n, G]."""
    blocks = rows.reshape(rows.shape[0], -1, 17)
    qs = blocks[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [n, G, 32]: values in order
    return codes[..., 0::2] | (codes[..., 1::2] << 4), blocks[..., 0]


def _mxfp4_parts(ts: list[TensorSpec], seed: int, chunk_values: int) -> list[Part]:
    """`{hf_name}_blocks` and `_scales`, as gpt-oss's checkpoints hold MXFP4 experts."""
    t, fused = ts[0], len(ts) > 1
    rows = t.shape[:-1] if not fused else (t.shape[0], 2 * t.shape[1], *t.shape[2:-1])
    groups = t.k // 32

    def stream(which: int) -> Callable[[], Iterator[Array]]:
        def chunks() -> Iterator[Array]:
            every = _fused(ts, seed, chunk_values) if fused else value_chunks(t, seed, chunk_values)
            for chunk in every:
                yield mxfp4_split(quantize_rows(chunk, T.MXFP4))[which]

        return chunks

    n = math.prod(rows) * groups
    return [
        Part([(t.hf_name + "_blocks", (*rows, groups, 16))], "U8", n * 16, stream(0)),
        Part([(t.hf_name + "_scales", (*rows, groups))], "U8", n, stream(1)),
    ]


def blueprint_parts(bp: Blueprint, qtype: GGMLQuantizationType, seed: int,
                    chunk_values: int) -> list[Part]:  # fmt: skip
    """Every tensor of `bp` in float type `qtype` (those with an MXFP4 `grid` in MXFP4);
    tensors sharing an hf_name fused."""
    parts: list[Part] = []
    for _, group in groupby(bp.tensors, key=lambda t: t.hf_name):
        ts = list(group)
        if ts[0].grid is T.MXFP4:
            parts += _mxfp4_parts(ts, seed, chunk_values)
        elif len(ts) > 1:
            parts.append(_fused_float_part(ts, qtype, seed, chunk_values))
        else:
            parts.append(_float_part(ts[0], qtype, seed, chunk_values))
    return parts


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
    parts = blueprint_parts(bp, qtype, seed, chunk_values)
    shards = _shards(parts, shard_bytes)
    if len(shards) == 1:
        _write_shard(folder / "model.safetensors", shards[0])
        return folder
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        _write_shard(folder / name, shard)
        weight_map |= {entry: name for part in shard for entry, _ in part.entries}
    total = sum(part.total for part in parts)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n",
                                                         encoding="utf-8")  # fmt: skip
    return folder
