"""An instance: one placed copy of a model, spread over one or more runners."""

from collections.abc import Mapping
from typing import Literal

from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.common import FrozenModel, Id, NodeId
from exo.shared.types.worker.runners import RunnerId, RunnerReady, RunnerRunning, RunnerStatus
from exo.shared.types.worker.shards import ShardMetadata

Sharding = Literal["pipeline", "tensor"]


class InstanceId(Id):
    __slots__ = ()


class ShardAssignments(FrozenModel):
    model_id: ModelId
    runner_to_shard: Mapping[RunnerId, ShardMetadata]
    node_to_runner: Mapping[NodeId, RunnerId]


class Instance(FrozenModel):
    instance_id: InstanceId
    sharding: Sharding
    shard_assignments: ShardAssignments
    # Rendezvous for the runners' process group (torch.distributed), rank 0's node.
    group_host: str = "127.0.0.1"
    group_port: int = 0

    @property
    def model_card(self) -> ModelCard:
        return next(iter(self.shard_assignments.runner_to_shard.values())).model_card

    @property
    def world_size(self) -> int:
        return len(self.shard_assignments.runner_to_shard)

    def shard(self, runner_id: RunnerId) -> ShardMetadata | None:
        return self.shard_assignments.runner_to_shard.get(runner_id)

    def node_of(self, runner_id: RunnerId) -> NodeId | None:
        for node_id, rid in self.shard_assignments.node_to_runner.items():
            if rid == runner_id:
                return node_id
        return None


class BoundInstance(FrozenModel):
    """An instance seen from one of its runners."""

    instance: Instance
    bound_runner_id: RunnerId
    bound_node_id: NodeId

    @property
    def bound_shard(self) -> ShardMetadata:
        shard = self.instance.shard(self.bound_runner_id)
        if shard is None:
            raise ValueError(f"runner {self.bound_runner_id} has no shard in this instance")
        return shard


def instance_is_serving(instance: Instance, all_runners: Mapping[RunnerId, RunnerStatus]) -> bool:
    """Every runner of the instance can take requests (ready or already running)."""
    return all(
        isinstance(all_runners.get(rid), (RunnerReady, RunnerRunning))
        for rid in instance.shard_assignments.runner_to_shard
    )
