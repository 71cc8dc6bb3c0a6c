"""What placement assumes a shard needs, and what each node has free for one.

The one place placement's memory estimate lives: ``shard_memory`` (weights in
proportion to the shard, plus a fixed overhead per runner). Pure.
"""

from collections.abc import Mapping
from typing import assert_never

from exo.shared.types.common import NodeId
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.worker.instances import Instance, InstanceId
from exo.shared.types.worker.shards import (
    PipelineShardMetadata,
    ShardMetadata,
    TensorShardMetadata,
)

# What a runner needs besides its weights: activations, KV cache, runtime.
SHARD_OVERHEAD_BYTES = 64 * 1024 * 1024


def shard_memory(shard: ShardMetadata) -> int:
    """Bytes a runner holding this shard needs, overhead included."""
    storage = shard.model_card.storage_size.in_bytes
    match shard:
        case PipelineShardMetadata():
            layers = shard.end_layer - shard.start_layer
            return _ceil_div(storage * layers, max(shard.n_layers, 1)) + SHARD_OVERHEAD_BYTES
        case TensorShardMetadata():
            return _ceil_div(storage, max(shard.world_size, 1)) + SHARD_OVERHEAD_BYTES
        case _:  # pyright: ignore[reportUnnecessaryComparison]
            assert_never(shard)


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


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
