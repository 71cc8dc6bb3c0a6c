"""What placement assumes a shard needs, and what each node has free for one.

The one estimate of a runner's memory is `exo.shared.models.memory.estimate_runner_memory`
(the one the engine's load is measured against); here it is fed from the model card:

* weights: the shard's bytes in the file in their running format (``weight_format``: block
  types as the file holds them, F16 / BF16 / F32 matrices become q8 blocks). Each layer counts
  its own bytes (``layer_bytes``) when the card has them, else the layers share
  ``storage_size`` less the embedding and head equally; pipeline rank 0 adds the embedding,
  the last rank the head (the embedding again when tied), a tensor rank its ``1 / world_size``
  of the layers and both whole;
* KV cache: the shard's layers (tensor: its share of the kv heads; an MLA latent,
  ``kv_bytes_per_token``, whole on every rank) at the runner's maximum,
  ``EXO_RUNNER_MAX_BATCH`` slots of ``min(context_length, EXO_MAX_CONTEXT_TOKENS)`` positions;
* the runtime overhead of one runner process (``RUNNER_OVERHEAD_BYTES``);
* on the runner holding layer 0 of a vision model: its tower and projector and one image's
  encoding (``vision_bytes``, ``vision_activation_bytes``; the image tokens' KV entries are
  positions of the context counted above).

It assumes a runner on a CPU with the engine's kernels and a float32 KV cache (the node's
default). Pure.
"""

from collections.abc import Mapping
from typing import assert_never

from exo.shared.constants import EXO_RUNNER_MAX_BATCH
from exo.shared.models.memory import (
    RUNNER_OVERHEAD_BYTES,
    MemoryEstimate,
    estimate_runner_memory,
    runner_max_seq,
)
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.common import NodeId
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.worker.instances import Instance, InstanceId
from exo.shared.types.worker.shards import (
    PipelineShardMetadata,
    ShardMetadata,
    TensorShardMetadata,
)


def card_estimate(
    card: ModelCard,
    start: int,
    end: int,
    world_size: int = 1,
    *,
    max_batch: int = EXO_RUNNER_MAX_BATCH,
    max_seq: int | None = None,
) -> MemoryEstimate:
    """A runner of ``card`` holding layers [start, end) (pipeline, ``world_size`` 1) or its
    ``1 / world_size`` tensor slice of every layer (start 0, end ``n_layers``), with its KV
    cache grown to ``max_batch`` requests of ``max_seq`` positions (default: what a runner
    serves, the card's context up to ``EXO_MAX_CONTEXT_TOKENS``)."""
    world = max(world_size, 1)
    return estimate_runner_memory(
        weight_file_bytes=_file_bytes(card, start, end, world),
        file_format=card.weight_format,
        n_layers=end - start,
        kv_heads=_ceil_div(card.num_kv_heads, world),
        head_dim=card.attention_head_dim,
        max_seq=runner_max_seq(card.context_length) if max_seq is None else max_seq,
        max_batch=max_batch,
        # a latent cache (MLA) is per layer, and whole on every tensor rank
        kv_bytes_per_position=card.kv_bytes_per_token * (end - start) // max(card.n_layers, 1),
        # the vision tower runs where the first stage runs (every tensor rank may hold it)
        vision_bytes=card.vision_bytes + card.vision_activation_bytes if start == 0 else 0,
    )


def pipeline_memory(card: ModelCard, start: int, end: int) -> int:
    """Bytes a runner holding layers [start, end) of ``card`` needs, overhead included."""
    return card_estimate(card, start, end).total


def layers_memory(card: ModelCard, layers: int) -> int:
    """The most a runner holding ``layers`` consecutive layers needs, wherever they are: a
    shard of fewer than all layers holds the embedding or the head, not both (with per-layer
    bytes, every window of ``layers`` layers is looked at: the heaviest may be inside)."""
    n = card.n_layers
    if layers >= n:
        return pipeline_memory(card, 0, n)
    starts = range(n - layers + 1) if _has_layer_bytes(card) else (0, n - layers)
    return max(pipeline_memory(card, a, a + layers) for a in starts)


def tensor_memory(card: ModelCard, world_size: int) -> int:
    """Bytes each of ``world_size`` tensor-parallel runners of ``card`` needs."""
    return card_estimate(card, 0, card.n_layers, world_size).total


def shard_memory(shard: ShardMetadata) -> int:
    """Bytes a runner holding this shard needs, overhead included."""
    match shard:
        case PipelineShardMetadata():
            return pipeline_memory(shard.model_card, shard.start_layer, shard.end_layer)
        case TensorShardMetadata():
            return tensor_memory(shard.model_card, shard.world_size)
        case _:  # pyright: ignore[reportUnnecessaryComparison]
            assert_never(shard)


def shard_file_bytes(shard: ShardMetadata) -> int:
    """Bytes of the files' weights this shard reads (about what a node downloads for it)."""
    card = shard.model_card
    match shard:
        case PipelineShardMetadata():
            return _file_bytes(card, shard.start_layer, shard.end_layer, 1)
        case TensorShardMetadata():
            return _file_bytes(card, 0, card.n_layers, max(shard.world_size, 1))
        case _:  # pyright: ignore[reportUnnecessaryComparison]
            assert_never(shard)


def layer_capacity(card: ModelCard, free: int) -> int:
    """The most layers of ``card`` a node with ``free`` bytes can hold (0: not even one),
    wherever in the model they are."""
    lo, hi = 0, card.n_layers
    while lo < hi:  # the largest count whose memory fits (memory grows with the count)
        mid = (lo + hi + 1) // 2
        if layers_memory(card, mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def node_free_memory(
    nodes: Mapping[NodeId, NodeInfo], instances: Mapping[InstanceId, Instance]
) -> dict[NodeId, int]:
    """Bytes free for a new shard on each node (never below zero)."""
    reserved = dict.fromkeys(nodes, 0)
    for instance in instances.values():
        assignments = instance.shard_assignments
        for node_id, runner_id in assignments.node_to_runner.items():
            shard = assignments.runner_to_shard.get(runner_id)
            if node_id in reserved and shard is not None:
                reserved[node_id] += shard_memory(shard)
    return {
        node_id: max(info.available_for_models.in_bytes - reserved[node_id], 0)
        for node_id, info in nodes.items()
    }


def _has_layer_bytes(card: ModelCard) -> bool:
    return len(card.layer_bytes) == card.n_layers > 0


def _file_bytes(card: ModelCard, start: int, end: int, world: int) -> int:
    """Bytes in the file of layers [start, end) (a ``1 / world`` slice of each), with the
    embedding on the first layer's runner and the head on the last one's. The card's
    per-layer bytes when it has them, else an equal share of the file for each layer."""
    n = max(card.n_layers, 1)
    embedding, head = card.embedding_bytes, card.head_bytes
    if _has_layer_bytes(card):
        total = _ceil_div(sum(card.layer_bytes[start:end]), world)
    else:
        layers = max(card.storage_size.in_bytes - embedding - head, 0)
        total = _ceil_div(layers * (end - start), n * world)
    if start == 0:
        total += embedding
    if end >= card.n_layers and not (start == 0 and head == 0):
        total += head or embedding  # a tied head is the embedding, loaded by the last rank
    return total


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = [
    "RUNNER_OVERHEAD_BYTES",
    "card_estimate",
    "layer_capacity",
    "layers_memory",
    "node_free_memory",
    "pipeline_memory",
    "shard_file_bytes",
    "shard_memory",
    "tensor_memory",
]
