"""Hugging Face model folders (config.json + *.safetensors) to a model config and `ShardWeights`.

config.json's `model_type` picks the family (`models/registry.py`), which parses the config and
names the tensors of each layer. Only the tensors of the requested layer range are read, one at
a time, into the form a `StoragePlan` asks for (`materialise.py`). q/k rows are permuted from
Hugging Face's half-split rotary layout to our interleaved one.
"""

from dataclasses import replace
from pathlib import Path

import torch

from exo.worker.engines.config import LlamaConfig, check_layer_range
from exo.worker.engines.file_rows import SafetensorsFile
from exo.worker.engines.materialise import DENSE_PLAN, StoragePlan, StoredTensor, TensorSource
from exo.worker.engines.models.hf_meta import JsonDict, read_chat_template, read_json
from exo.worker.engines.models.registry import Family, family_for_hf
from exo.worker.engines.qtensor import Weight
from exo.worker.engines.weights import (
    ProgressCallback,
    ShardWeights,
    TensorParallel,
    assemble_shard,
)

__all__ = ["canonical_name", "hf_config", "hf_family", "load_hf_shard", "read_chat_template"]

# A vision-language checkpoint keeps its text model under a prefix (the hub's Gemma 3 and
# Qwen-VL folders: ``language_model.model.``; transformers 5: ``model.language_model.``):
# its tensors are read under the text model's own names.
_TEXT_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)


def canonical_name(name: str) -> str:
    """A tensor's name as a text-only checkpoint has it (`_TEXT_PREFIXES`)."""
    for prefix, text in _TEXT_PREFIXES:
        if name.startswith(prefix):
            return text + name[len(prefix) :]
    return name


def _raw_config(folder: Path) -> JsonDict:
    return read_json(folder / "config.json")


def hf_family(folder: Path) -> Family:
    """The family of a Hugging Face folder (ValueError for a model_type none reads)."""
    return family_for_hf(str(_raw_config(folder).get("model_type", "")))


def hf_config(folder: Path) -> LlamaConfig:
    """The model shape described by a Hugging Face folder's config.json."""
    raw = _raw_config(folder)
    return family_for_hf(str(raw.get("model_type", ""))).hf_config(raw, folder)


class _TensorSource(TensorSource):
    """Tensor name -> the safetensors file holding it; each tensor read when asked for."""

    def __init__(self, folder: Path, plan: StoragePlan) -> None:
        super().__init__(plan)
        self.where: dict[str, SafetensorsFile] = {}
        self.stored_as: dict[str, str] = {}  # a tensor's text-model name -> its name in the file
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ValueError(f"no *.safetensors file in {folder}")
        self.files = [SafetensorsFile(file) for file in files]
        for st in self.files:
            for key in st.tensors:
                self.where[canonical_name(key)] = st
                self.stored_as[canonical_name(key)] = key

    def close(self) -> None:
        for st in self.files:
            st.close()

    def has(self, name: str) -> bool:
        return name in self.where

    def stored(self, name: str) -> StoredTensor:
        if name not in self.where:
            raise ValueError(f"tensor {name!r} not found in the safetensors files")
        key = self.stored_as[name]
        info = self.where[name].tensors[key]
        return StoredTensor(self.where[name], key, info.dtype, info.shape)

    def stored_dtype(self, name: str) -> str:
        """The file's dtype of a tensor, upper case ("BF16", "F16", "F32")."""
        return self.where[name].tensors[self.stored_as[name]].dtype.upper()

    def source_format(self, layer: int) -> str:
        """The dtype of a layer's matrices: its MLP down projection's, or (a family without
        one) that of the layer's first matrix."""
        down = f"model.layers.{layer}.mlp.down_proj.weight"
        if down in self.where:
            return self.stored_dtype(down)
        prefix = f"model.layers.{layer}."
        names = sorted(n for n in self.where if n.startswith(prefix))
        matrices = [n for n in names if len(self.where[n].tensors[self.stored_as[n]].shape) >= 2]
        return self.stored_dtype(matrices[0]) if matrices else "F32"


def load_hf_shard(
    folder: Path,
    start_layer: int,
    end_layer: int,
    *,
    dtype: torch.dtype = torch.float32,
    progress: ProgressCallback | None = None,
    plan: StoragePlan | None = None,
    tensor_parallel: TensorParallel | None = None,
) -> ShardWeights:
    """Layers [start_layer, end_layer) of a Hugging Face safetensors model, held as `plan` says
    (default: plain tensors in `dtype`); with `tensor_parallel`, each layer is sliced as it
    loads."""
    family, config = hf_family(folder), hf_config(folder)
    check_layer_range(config, start_layer, end_layer)
    src = _TensorSource(folder, plan or replace(DENSE_PLAN, dtype=dtype))
    try:
        return _load(src, family, config, start_layer, end_layer, progress, tensor_parallel)
    finally:
        src.close()


def _load(
    src: _TensorSource,
    family: Family,
    config: LlamaConfig,
    start_layer: int,
    end_layer: int,
    progress: ProgressCallback | None,
    tensor_parallel: TensorParallel | None,
) -> ShardWeights:
    def head(embed: Weight | None) -> Weight:
        if config.tie_embeddings or not src.has("lm_head.weight"):
            return embed if embed is not None else src.get("model.embed_tokens.weight")
        return src.get("lm_head.weight")

    return assemble_shard(
        config,
        start_layer,
        end_layer,
        layer=lambda i: family.hf_layer(src, config, i),
        slice_layer=family.slice_layer,
        embedding=lambda: src.get("model.embed_tokens.weight"),
        head=head,
        final_norm=lambda: family.hf_final_norm(src, config),
        source_format=src.source_format(start_layer),
        progress=progress,
        tensor_parallel=tensor_parallel,
    )
