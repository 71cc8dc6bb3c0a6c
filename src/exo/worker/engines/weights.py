"""Plain weight tensors of a model shard, in one canonical layout, and their tensor-parallel slices.

Canonical layout, whatever the file format:

* linear weights are [out_features, in_features] (the `F.linear` convention);
* the rows of q and k (and their biases and q/k-norm weights) use the *interleaved* rotary
  layout: within each head, dimensions (2i, 2i+1) form the pair that rotates by angle
  pos * theta^(-2i / head_dim). llama.cpp's converter stores llama GGUFs this way; Hugging Face
  checkpoints use the *half-split* layout (pairs (i, i + head_dim/2)) and are permuted on load
  by `halves_to_pairs`. Attention scores are unchanged: q and k get the same permutation.

Matrices are `Weight`s: plain tensors, or the file's quantised blocks (`QuantTensor`), which
permute and slice by rows (and by columns on block boundaries) without dequantising.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, cast

import torch
from torch import Tensor
from typing_extensions import TypeVar

from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.qtensor import QuantTensor, Weight

W = TypeVar("W", bound=Tensor | QuantTensor)

ProgressCallback = Callable[[int, int], None]
"""Called as (layers_loaded, total_layers_in_shard) while a shard loads."""


@dataclass(frozen=True)
class LayerWeights:
    """One block of the dense family (`models/dense.py`). Head counts are read from the shapes
    (they shrink under TP). Other families define their own layer records."""

    attn_norm: Tensor  # [D]
    wq: Weight  # [H*hd, D]
    wk: Weight  # [KV*hd, D]
    wv: Weight  # [KV*hd, D]
    wo: Weight  # [D, H*hd]
    ffn_norm: Tensor  # [D]
    w_gate: Weight  # [F, D]
    w_up: Weight  # [F, D]
    w_down: Weight  # [D, F]
    bq: Tensor | None = None  # [H*hd]   (Qwen2)
    bk: Tensor | None = None  # [KV*hd]
    bv: Tensor | None = None  # [KV*hd]
    q_norm: Tensor | None = None  # [hd]  (Qwen3: RMSNorm over each head before rotation)
    k_norm: Tensor | None = None  # [hd]
    post_attn_norm: Tensor | None = None  # [D]  (Gemma 3: rmsnorm of the attention output)
    post_ffn_norm: Tensor | None = None  # [D]  (Gemma 3: rmsnorm of the MLP output)


L = TypeVar("L", default=LayerWeights)


@dataclass(frozen=True)
class ShardWeights(Generic[L]):
    """Layers [start_layer, end_layer) plus the embedding (first shard) and head (last shard).
    A layer is a family's own record (`L`: `LayerWeights` for the dense family)."""

    config: LlamaConfig
    start_layer: int
    end_layer: int
    layers: list[L]
    embed: Weight | None  # [V, D]            when start_layer == 0
    final_norm: Tensor | None  # [D]          when end_layer == n_layers
    lm_head: Weight | None  # [V, D]          when end_layer == n_layers (the embedding if tied)
    rope_freq_factors: Tensor | None = None  # [hd/2]  divisors of the rotary frequencies
    source_format: str = "F32"  # how the file stored the layer matrices: "Q4_1", "Q8_0", "BF16"..

def halves_to_pairs(w: W, n_heads: int) -> W:
    """Reorder q/k rows from the half-split rotary layout to the interleaved one.

    Within a head, old row i (first half) and i + hd/2 (second half) become rows 2i and 2i+1.
    Works for weights [H*hd, in], biases [H*hd] and per-head norm weights [hd] (n_heads=1).
    """
    if isinstance(w, QuantTensor):
        order = halves_to_pairs(torch.arange(w.shape[0]), n_heads)
        return cast(W, w.take_rows(order))
    rest = w.shape[1:]
    head_dim = w.shape[0] // n_heads
    return cast(W, w.reshape(n_heads, 2, head_dim // 2, *rest).transpose(1, 2).reshape(w.shape))


# --- tensor parallel -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorParallel:
    """This process is rank `rank` of `world` tensor-parallel ranks."""

    rank: int
    world: int


def split_rows(w: Weight, sizes: list[int]) -> list[Weight]:
    """Consecutive row ranges of a matrix (a fused q|k|v or gate|up), in the file's format."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    if isinstance(w, QuantTensor):
        return [w.rows(a, a + n) for a, n in zip(starts, sizes, strict=True)]
    return [w[a : a + n].contiguous() for a, n in zip(starts, sizes, strict=True)]


def _rows(w: W, rank: int, world_size: int) -> W:
    n = w.shape[0] // world_size
    if isinstance(w, QuantTensor):
        return cast(W, w.rows(rank * n, (rank + 1) * n))
    return cast(W, w[rank * n : (rank + 1) * n].contiguous())


def _cols(w: Weight, rank: int, world_size: int) -> Weight:
    """Columns of a rank; blocks that a rank boundary would split are dequantised first."""
    n = w.shape[1] // world_size
    if isinstance(w, QuantTensor):
        sliced = w.cols(rank * n, (rank + 1) * n)
        if sliced is not None:
            return sliced
        return w.dequantize()[:, rank * n : (rank + 1) * n].contiguous()
    return w[:, rank * n : (rank + 1) * n].contiguous()


def _rows_opt(w: Tensor | None, rank: int, world_size: int) -> Tensor | None:
    return None if w is None else _rows(w, rank, world_size)


def slice_layer(
    layer: LayerWeights, config: LlamaConfig, rank: int, world_size: int
) -> LayerWeights:
    """The share of one dense block that rank `rank` of `world_size` computes (Megatron-style).

    Column-parallel (rows of the weight): q, k, v by whole heads, gate and up by ffn columns.
    Row-parallel (columns of the weight): o and down; their partial outputs must be summed
    over ranks (the model's all-reduce hook). Norms are replicated.
    """
    if config.heads % world_size or config.kv_heads % world_size or config.ffn % world_size:
        raise ValueError(
            f"heads ({config.heads}), kv_heads ({config.kv_heads}) and ffn ({config.ffn}) "
            f"must all divide by world_size ({world_size})"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} out of range for world_size {world_size}")
    return replace(
        layer,
        wq=_rows(layer.wq, rank, world_size),
        wk=_rows(layer.wk, rank, world_size),
        wv=_rows(layer.wv, rank, world_size),
        bq=_rows_opt(layer.bq, rank, world_size),
        bk=_rows_opt(layer.bk, rank, world_size),
        bv=_rows_opt(layer.bv, rank, world_size),
        wo=_cols(layer.wo, rank, world_size),
        w_gate=_rows(layer.w_gate, rank, world_size),
        w_up=_rows(layer.w_up, rank, world_size),
        w_down=_cols(layer.w_down, rank, world_size),
    )


def slice_shard(weights: ShardWeights, rank: int, world_size: int) -> ShardWeights:
    """Every layer of a dense shard sliced for one TP rank; embedding and head stay replicated."""
    layers = [slice_layer(layer, weights.config, rank, world_size) for layer in weights.layers]
    return replace(weights, layers=layers)


SliceLayer = Callable[[L, LlamaConfig, int, int], L]
"""A family's tensor-parallel split of one layer: (layer, config, rank, world) -> its share."""


def assemble_shard(
    config: LlamaConfig,
    start_layer: int,
    end_layer: int,
    *,
    layer: Callable[[int], L],
    slice_layer: SliceLayer[L],
    embedding: Callable[[], Weight],
    head: Callable[[Weight | None], Weight],
    final_norm: Callable[[], Tensor],
    source_format: str,
    progress: ProgressCallback | None = None,
    tensor_parallel: TensorParallel | None = None,
    rope_freq_factors: Tensor | None = None,
) -> ShardWeights[L]:
    """The shard of layers [start_layer, end_layer), whatever the file format and family: each
    layer read by ``layer`` (and sliced for a TP rank by ``slice_layer`` as it loads), then the
    embedding for the first shard, the final norm and the head for the last (``head`` gets
    the embedding when this shard loaded it, for tied heads)."""
    layers: list[L] = []
    for i in range(start_layer, end_layer):
        loaded = layer(i)
        if tensor_parallel is not None:
            loaded = slice_layer(loaded, config, tensor_parallel.rank, tensor_parallel.world)
        layers.append(loaded)
        if progress is not None:
            progress(len(layers), end_layer - start_layer)
    is_last = end_layer == config.n_layers
    embed = embedding() if start_layer == 0 else None
    return ShardWeights[L](
        config=config,
        start_layer=start_layer,
        end_layer=end_layer,
        layers=layers,
        embed=embed,
        final_norm=final_norm() if is_last else None,
        lm_head=head(embed) if is_last else None,
        rope_freq_factors=rope_freq_factors,
        source_format=source_format,
    )
