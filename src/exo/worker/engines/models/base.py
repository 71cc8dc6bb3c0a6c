"""What every architecture family provides, and what the rest of the engine calls on a model.

A family (`ModelFamily`) turns a model's files into a running model, in four steps that the one
loader (`engine.load_model`) calls in order:

    config      = family.gguf_config(file) | family.hf_config(raw, folder)   shape, from metadata
    layer i     = family.gguf_layer(src, config, i) | family.hf_layer(...)     tensor names -> weights
    layer i     = family.slice_layer(layer, config, rank, world)              tensor-parallel share
    model       = family.build(shard weights, ...)                            the forward pass

Sharding stays out of the forward pass: the loader reads only the shard's layer range, applies
the family's tensor-parallel split to each layer record as it is read (a rank never holds more
than its share plus one layer), and the family builds its model from what is left, with the
all-reduce that sums a rank's partial outputs (`BuildOptions.all_reduce`). A family whose config
needs more fields (experts, MLA ranks) subclasses `LlamaConfig` (every field it adds defaulted).

The model it builds is a `ShardModel`: a layer range with `embed`, `forward_layers` and `head`.
The batcher sees only a `StepModel` (one forward over a step of a batch) and an `Engine` an
`EngineModel` (that, plus its layer range and embeddings), which a single `ShardModel` is, and
which the pipeline leader (`runner/distributed.py`) also is.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from torch import Tensor

from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.cpu_kernels import QKernels
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.images import ChunkImages
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.linear import WeightFormat
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.weights import ShardWeights

AllReduce = Callable[[Tensor], Tensor]
JsonDict = dict[str, Any]
Layer = TypeVar("Layer")


def no_all_reduce(x: Tensor) -> Tensor:
    return x


@dataclass(frozen=True)
class StepInputs:
    """Where a step's new tokens go, as plain values (pipeline stages each get the same).

    Row b of the batch writes `n_new` tokens to cache slot `slots[b]`, at positions
    starts[b] .. starts[b] + n_new - 1 (its first `starts[b]` positions are already cached).
    `images`: a prefill chunk's images (one row; `images.ChunkImages`), None without images.
    `rope_deltas` (M-RoPE models, Qwen-VL): row b's new tokens rotate at M-RoPE positions
    starts[b] + delta_b + i (a prompt with images leaves a delta); () = every delta 0.
    """

    slots: tuple[int, ...]
    starts: tuple[int, ...]
    n_new: int
    images: ChunkImages | None = None
    rope_deltas: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.images is not None and len(self.slots) != 1:
            raise ValueError("images ride on a prefill chunk of one request (a batch of one)")

    @staticmethod
    def single(slot: int, start: int, n_new: int, images: ChunkImages | None = None) -> "StepInputs":
        return StepInputs((slot,), (start,), n_new, images)


class StepModel(Protocol):
    """What the batcher calls on a model: one forward over a step of a batch."""

    @property
    def config(self) -> LlamaConfig: ...

    @property
    def device(self) -> torch.device: ...

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        """A cache of up to `max_batch` slots of `max_seq` positions (grown as used)."""
        ...

    def forward(
        self, tokens: Tensor, step: StepInputs, cache: KVCache, every_position: bool = False
    ) -> Tensor:
        """tokens [B, T] -> logits of each row's last position [B, V] (float32; of every
        position [B, T, V] with ``every_position``: a prompt's log-probabilities)."""
        ...


class EngineModel(StepModel, Protocol):
    """What an `Engine` holds: a step model with its layer range, its running weight format
    and the final hidden states (embeddings)."""

    @property
    def start_layer(self) -> int: ...

    @property
    def end_layer(self) -> int: ...

    @property
    def weight_format(self) -> WeightFormat: ...

    def final_hidden(self, tokens: Tensor) -> Tensor:
        """tokens [1, T] -> final hidden states [T, D] after the final norm (float32)."""
        ...


class ShardModel(EngineModel, Protocol):
    """A layer range of a model on this process: the three stages a pipeline calls apart."""

    @property
    def dtype(self) -> torch.dtype: ...

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> hidden [B, T, D] (first shard only)."""
        ...

    def forward_layers(self, hidden: Tensor, step: StepInputs, cache: KVCache) -> Tensor:
        """hidden [B, T, D] through this shard's layers; writes their keys/values to `cache`."""
        ...

    def head(self, hidden: Tensor) -> Tensor:
        """hidden [..., D] -> logits [..., V] (float32; last shard only)."""
        ...

    @property
    def kv_dtype(self) -> torch.dtype:
        """The KV cache's element type (`kv_cache.kv_cache_dtype`)."""
        ...

    def kv_bytes_per_position(self) -> int:
        """Cache bytes of one position of one request, over this shard's layers."""
        ...

    def kernels_used(self) -> dict[str, int]:
        """How many linears run on each kernel ("qkv: Q4_K C kernel": 30, ...): the load log."""
        ...


@dataclass(frozen=True)
class BuildOptions:
    """How a family builds its model from loaded weights."""

    weight_format: WeightFormat = "dense"
    dtype: torch.dtype = torch.float32
    device: torch.device | str = "cpu"
    all_reduce: AllReduce = no_all_reduce
    kernels: QKernels | None = None
    own_weights: bool = False  # the model may re-lay the weights' blocks in place


class ModelFamily(Protocol[Layer]):
    """One architecture family: its names in both file formats, its config, its tensor names,
    its tensor-parallel split and its forward pass. A new family is one module providing one.
    `Layer` is the family's record of one layer's weights (the dense family's `LayerWeights`)."""

    @property
    def name(self) -> str: ...

    @property
    def gguf_architectures(self) -> tuple[str, ...]:
        """The GGUF `general.architecture` values it reads."""
        ...

    @property
    def hf_model_types(self) -> tuple[str, ...]:
        """The Hugging Face `config.json` `model_type` values it reads."""
        ...

    def gguf_config(self, f: GGUFFile) -> LlamaConfig: ...

    def hf_config(self, raw: JsonDict, folder: Path) -> LlamaConfig: ...

    def gguf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> Layer:
        """Layer i's weights, from llama.cpp's tensor names, in the canonical layout."""
        ...

    def hf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> Layer:
        """Layer i's weights, from Hugging Face tensor names, in the canonical layout."""
        ...

    def hf_final_norm(self, src: TensorSource, config: LlamaConfig) -> Tensor:
        """The final norm's gain from Hugging Face names (`model.norm.weight`, as stored or
        offset as the family stores its norms)."""
        ...

    def slice_layer(self, layer: Layer, config: LlamaConfig, rank: int, world: int) -> Layer:
        """The share of one layer that tensor-parallel rank `rank` of `world` computes."""
        ...

    def build(self, weights: ShardWeights[Layer], options: BuildOptions) -> ShardModel:
        """The running model of a shard's weights (sharding already applied)."""
        ...
