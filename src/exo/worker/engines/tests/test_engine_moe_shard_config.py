"""A shard-only GGUF (a middle or last pipeline stage: no `token_embd.weight`, no block 0)
describes the same model as the whole file, for every MoE family: each family's GGUF reader
reads the model's shapes from the shard's list of the whole model's tensors, not from the
tensors the shard holds."""

from pathlib import Path
from typing import Any

import pytest

from exo.worker.download.gguf_index import (
    kv_strings,
    kv_u32,
    model_tensor_list,
    read_gguf_index,
    shard_layout,
)
from exo.worker.download.shard_gguf import wanted
from exo.worker.engines.engine import load_family, load_shard_weights
from exo.worker.engines.gguf_reader import GGUFFile

from .deepseek_models import build_deepseek, write_deepseek_gguf
from .glm_models import build_glm, write_glm_gguf
from .moe_models import CASES, build_hf_model, write_gguf


def _whole_file(name: str, tmp: Path) -> Path:
    path = tmp / f"{name}.gguf"
    if name == "deepseek2":
        return write_deepseek_gguf(build_deepseek(tmp / name), path, "Q8_0")
    if name == "glm4moe":
        return write_glm_gguf(build_glm(tmp / name), path, "Q8_0")
    model: Any = build_hf_model(CASES[name], tmp / name)
    return write_gguf(model, CASES[name], path, "Q8_0")


def _shard(path: Path, start: int, end: int, n_layers: int, out: Path) -> Path:
    """The shard file a node fetching layers [start, end) of a model of `n_layers` (the
    card's count) keeps: the same layout and keys as the shard download writes."""
    data = path.read_bytes()
    index = read_gguf_index(data)
    tied = not any(t.name == "output.weight" for t in index.tensors)
    kept = [t for t in index.tensors if wanted(t.name, start, end, n_layers, tied)]
    extra = [kv_u32("exo.shard.start_layer", start), kv_u32("exo.shard.end_layer", end),
             kv_strings("exo.shard.model_tensors", model_tensor_list(index))]
    header, offsets = shard_layout(index, kept, extra)
    body = bytearray(header)
    for t, offset in zip(kept, offsets, strict=True):
        body += b"\0" * (offset - len(body))
        body += data[index.data_start + t.offset : index.data_start + t.offset + t.n_bytes]
    out.write_bytes(bytes(body))
    return out


FAMILIES = ["qwen3moe", "gpt-oss", "deepseek2", "glm4moe"]


@pytest.mark.parametrize("name", FAMILIES)
def test_a_stage_without_the_embedding_reads_the_whole_models_config(
    name: str, tmp_path: Path
) -> None:
    whole = _whole_file(name, tmp_path)
    family, config = load_family(whole)
    n = config.n_layers
    for start, end in [(1, n - 1), (1, n)]:  # a middle stage; the last stage
        shard = _shard(whole, start, end, n, tmp_path / f"{name}-{start}-{end}.gguf")
        assert "token_embd.weight" not in GGUFFile(shard).tensors
        shard_family, shard_config = load_family(shard)
        assert type(shard_family) is type(family)
        assert shard_config == config
        weights = load_shard_weights(shard, start, end)  # the stage's own layers load
        assert len(weights.layers) == end - start
