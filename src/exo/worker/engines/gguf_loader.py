"""GGUF files (llama.cpp's format) to a model config and `ShardWeights`, for any family.

The file's `general.architecture` picks the family (`models/registry.py`), which parses the
config and names the tensors of each layer. Only the tensors of the requested layer range are
read, one at a time, into the form a `StoragePlan` asks for (`materialise.py`: the file's blocks,
q8 blocks, or plain tensors).
"""

from dataclasses import replace
from pathlib import Path

import torch

from exo.worker.engines.config import LlamaConfig, check_layer_range
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.materialise import DENSE_PLAN, StoragePlan, StoredTensor, TensorSource
from exo.worker.engines.models.gguf_meta import get
from exo.worker.engines.models.registry import Family, family_for_gguf
from exo.worker.engines.qtensor import Weight
from exo.worker.engines.weights import (
    ProgressCallback,
    ShardWeights,
    TensorParallel,
    assemble_shard,
)

__all__ = ["LlamaConfig", "gguf_config", "gguf_family", "load_gguf_config", "load_gguf_shard"]


def gguf_family(f: GGUFFile) -> Family:
    """The family of an open GGUF file (ValueError for an architecture none reads)."""
    return family_for_gguf(str(get(f.metadata, "general.architecture")))


def gguf_config(f: GGUFFile) -> LlamaConfig:
    """The model shape described by an open GGUF file's metadata."""
    return gguf_family(f).gguf_config(f)


def load_gguf_config(path: Path) -> LlamaConfig:
    f = GGUFFile(path)
    try:
        return gguf_config(f)
    finally:
        f.close()


class _TensorSource(TensorSource):
    def __init__(self, f: GGUFFile, plan: StoragePlan) -> None:
        super().__init__(plan)
        self.f = f

    def has(self, name: str) -> bool:
        return name in self.f.tensors

    def stored(self, name: str) -> StoredTensor:
        if name not in self.f.tensors:
            raise ValueError(f"GGUF file lacks tensor {name!r}")
        info = self.f.tensors[name]
        return StoredTensor(self.f, name, info.qtype.name, info.shape)


def _source_format(f: GGUFFile, layer: int) -> str:
    """How the file stores a layer's matrices: its FFN down projection's type, or (a family
    without one) the type of the layer's largest matrix."""
    down = f.tensors.get(f"blk.{layer}.ffn_down.weight")
    if down is not None:
        return down.qtype.name
    prefix = f"blk.{layer}."
    matrices = [t for n, t in f.tensors.items() if n.startswith(prefix) and len(t.shape) >= 2]
    return max(matrices, key=lambda t: t.n_bytes).qtype.name if matrices else "F32"


def load_gguf_shard(
    path: Path,
    start_layer: int,
    end_layer: int,
    *,
    dtype: torch.dtype = torch.float32,
    progress: ProgressCallback | None = None,
    plan: StoragePlan | None = None,
    tensor_parallel: TensorParallel | None = None,
) -> ShardWeights:
    """Layers [start_layer, end_layer) of a GGUF model, held as `plan` says (default: every
    tensor dequantised to `dtype`); with `tensor_parallel`, each layer is sliced as it loads."""
    f = GGUFFile(path)
    try:
        family = gguf_family(f)
        config = gguf_config(f)
        check_layer_range(config, start_layer, end_layer)
        src = _TensorSource(f, plan or replace(DENSE_PLAN, dtype=dtype))

        def head(embed: Weight | None) -> Weight:
            if config.tie_embeddings:
                return embed if embed is not None else src.get("token_embd.weight")
            return src.get("output.weight")

        freq_factors = f.tensors.get("rope_freqs.weight")
        return assemble_shard(
            config,
            start_layer,
            end_layer,
            layer=lambda i: family.gguf_layer(src, config, i),
            slice_layer=family.slice_layer,
            embedding=lambda: src.get("token_embd.weight"),
            head=head,
            final_norm=lambda: src.vector("output_norm.weight"),
            source_format=_source_format(f, start_layer),
            progress=progress,
            tensor_parallel=tensor_parallel,
            rope_freq_factors=None
            if freq_factors is None
            else torch.from_numpy(f.load(freq_factors.name)),
        )
    finally:
        f.close()
