"""Shared builders for tests of the pure core: fixed ids and small values.

Everything here is deterministic: the same call gives an equal value, so tests can
compare states and events with ``==``.
"""

from collections.abc import Iterable, Mapping, Sequence

from exo.shared.apply import apply
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import Event, IndexedEvent
from exo.shared.types.memory import Memory
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.state import State
from exo.shared.types.tasks import Task, TaskId, TaskStatus, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.topology import Connection, Topology
from exo.shared.types.worker.downloads import DownloadCompleted, DownloadProgress
from exo.shared.types.worker.instances import (
    BoundInstance,
    Instance,
    InstanceId,
    ShardAssignments,
)
from exo.shared.types.worker.runners import RunnerId, RunnerStatus
from exo.shared.types.worker.shards import PipelineShardMetadata, ShardMetadata

NODE_A = NodeId("node-a")
NODE_B = NodeId("node-b")
NODE_C = NodeId("node-c")

INSTANCE_1 = InstanceId("instance-1")
INSTANCE_2 = InstanceId("instance-2")

RUNNER_A1 = RunnerId("runner-a1")
RUNNER_B1 = RunnerId("runner-b1")
RUNNER_C1 = RunnerId("runner-c1")
RUNNER_A2 = RunnerId("runner-a2")
RUNNER_B2 = RunnerId("runner-b2")

MODEL_1 = ModelId("test-org/model-1")
MODEL_2 = ModelId("test-org/model-2")

TASK_1 = TaskId("task-1")
TASK_2 = TaskId("task-2")
TASK_3 = TaskId("task-3")

COMMAND_1 = CommandId("command-1")
COMMAND_2 = CommandId("command-2")

# What a node reports once its download of a model finished.
DONE: DownloadProgress = DownloadCompleted(path="/models/test")


def model_card(model_id: ModelId = MODEL_1, n_layers: int = 8) -> ModelCard:
    return ModelCard(
        model_id=model_id,
        n_layers=n_layers,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        storage_size=Memory.from_mb(16),
        context_length=512,
        architecture="llama",
    )


def pipeline_instance(
    instance_id: InstanceId,
    placements: Sequence[tuple[NodeId, RunnerId]],
    model_id: ModelId = MODEL_1,
    n_layers: int = 8,
    card: ModelCard | None = None,
) -> Instance:
    """An instance of ``model_id`` with one runner per ``(node, runner)``, in rank order;
    the layers are split as evenly as they go. ``card``: the model's card (its id and
    layers win over ``model_id`` and ``n_layers``)."""
    if card is None:
        card = model_card(model_id, n_layers)
    model_id, n_layers = card.model_id, card.n_layers
    world_size = len(placements)
    shards: dict[RunnerId, ShardMetadata] = {}
    for rank, (_, runner_id) in enumerate(placements):
        shards[runner_id] = PipelineShardMetadata(
            model_card=card,
            device_rank=rank,
            world_size=world_size,
            start_layer=rank * n_layers // world_size,
            end_layer=(rank + 1) * n_layers // world_size,
            n_layers=n_layers,
        )
    return Instance(
        instance_id=instance_id,
        sharding="pipeline",
        shard_assignments=ShardAssignments(
            model_id=model_id,
            runner_to_shard=shards,
            node_to_runner={node_id: runner_id for node_id, runner_id in placements},
        ),
    )


def single_instance(
    instance_id: InstanceId = INSTANCE_1,
    node_id: NodeId = NODE_A,
    runner_id: RunnerId = RUNNER_A1,
    model_id: ModelId = MODEL_1,
) -> Instance:
    return pipeline_instance(instance_id, [(node_id, runner_id)], model_id)


def pair_instance(
    instance_id: InstanceId = INSTANCE_1,
    model_id: ModelId = MODEL_1,
) -> Instance:
    """Two ranks: RUNNER_A1 on NODE_A, RUNNER_B1 on NODE_B."""
    return pipeline_instance(instance_id, [(NODE_A, RUNNER_A1), (NODE_B, RUNNER_B1)], model_id)


def bound(instance: Instance, node_id: NodeId) -> BoundInstance:
    """``instance`` seen from the runner it places on ``node_id``."""
    runner_id = instance.shard_assignments.node_to_runner[node_id]
    return BoundInstance(instance=instance, bound_runner_id=runner_id, bound_node_id=node_id)


def text_generation(
    task_id: TaskId = TASK_1,
    instance_id: InstanceId = INSTANCE_1,
    command_id: CommandId = COMMAND_1,
    status: TaskStatus = TaskStatus.Pending,
    model_id: ModelId = MODEL_1,
) -> TextGeneration:
    return TextGeneration(
        task_id=task_id,
        instance_id=instance_id,
        task_status=status,
        command_id=command_id,
        task_params=TextGenerationTaskParams(
            model=model_id, input=[InputMessage(role="user", content="hello")]
        ),
    )


def node_info(hostname: str = "host", memory_mb: float = 4096) -> NodeInfo:
    return NodeInfo(
        hostname=hostname,
        cpu_count=4,
        memory_total=Memory.from_mb(memory_mb),
        memory_available=Memory.from_mb(memory_mb / 2),
    )


def make_state(
    instances: Iterable[Instance] = (),
    runners: Mapping[RunnerId, RunnerStatus] | None = None,
    tasks: Iterable[Task] = (),
    downloads: Mapping[NodeId, Mapping[ModelId, DownloadProgress]] | None = None,
    nodes: Mapping[NodeId, NodeInfo] | None = None,
    connections: Iterable[Connection] = (),
) -> State:
    return State(
        instances={i.instance_id: i for i in instances},
        runners=dict(runners or {}),
        tasks={t.task_id: t for t in tasks},
        downloads={n: dict(d) for n, d in (downloads or {}).items()},
        nodes=dict(nodes or {}),
        topology=Topology(connections=list(connections)),
    )


def downloaded(
    *node_ids: NodeId, model_id: ModelId = MODEL_1
) -> dict[NodeId, dict[ModelId, DownloadProgress]]:
    """Downloads in which every given node has finished ``model_id``."""
    return {node_id: {model_id: DONE} for node_id in node_ids}


def indexed(events: Sequence[Event], start: int = 0) -> list[IndexedEvent]:
    return [IndexedEvent(idx=start + i, event=e) for i, e in enumerate(events)]


def fold(state: State, events: Sequence[Event]) -> State:
    """Apply ``events`` after the last event ``state`` has seen, in order."""
    for ie in indexed(events, start=state.last_event_applied_idx + 1):
        state = apply(state, ie)
    return state
