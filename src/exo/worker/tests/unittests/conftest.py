"""Builders for worker tests. The seed tests import ``get_bound_mlx_ring_instance``."""

from exo.shared.models.embedded import embedded_model_card
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.common import NodeId
from exo.shared.types.worker.instances import (
    BoundInstance,
    Instance,
    InstanceId,
    ShardAssignments,
)
from exo.shared.types.worker.runners import RunnerId
from exo.shared.types.worker.shards import PipelineShardMetadata


def get_bound_mlx_ring_instance(
    instance_id: InstanceId,
    model_id: ModelId,
    runner_id: RunnerId,
    node_id: NodeId,
    model_card: ModelCard | None = None,
) -> BoundInstance:
    """A one-node pipeline instance of ``model_id``, bound to its only runner. (The name
    is the seed's; our single-node instance is a one-rank pipeline.)"""
    card = (model_card or embedded_model_card()).model_copy(update={"model_id": model_id})
    shard = PipelineShardMetadata(
        model_card=card,
        device_rank=0,
        world_size=1,
        start_layer=0,
        end_layer=card.n_layers,
        n_layers=card.n_layers,
    )
    instance = Instance(
        instance_id=instance_id,
        sharding="pipeline",
        shard_assignments=ShardAssignments(
            model_id=model_id,
            runner_to_shard={runner_id: shard},
            node_to_runner={node_id: runner_id},
        ),
    )
    return BoundInstance(instance=instance, bound_runner_id=runner_id, bound_node_id=node_id)
