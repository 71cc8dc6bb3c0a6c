"""Builders for worker tests. The seed tests import ``get_bound_mlx_ring_instance``."""

from exo.shared.models.embedded import embedded_model_card
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.tests.builders import bound, pipeline_instance
from exo.shared.types.common import NodeId
from exo.shared.types.worker.instances import BoundInstance, InstanceId
from exo.shared.types.worker.runners import RunnerId


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
    return bound(pipeline_instance(instance_id, [(node_id, runner_id)], card=card), node_id)
