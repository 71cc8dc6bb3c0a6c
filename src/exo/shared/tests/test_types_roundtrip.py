"""The typed vocabulary: JSON round-trips of every union member, ids, frozen models."""

from collections.abc import Sequence
from typing import Any, get_args

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from exo.shared.models.model_cards import HubFile, HubSource, ModelId
from exo.shared.tests.builders import (
    COMMAND_1,
    COMMAND_2,
    DONE,
    INSTANCE_1,
    INSTANCE_2,
    MODEL_1,
    MODEL_2,
    NODE_A,
    NODE_B,
    NODE_C,
    RUNNER_A1,
    RUNNER_B1,
    RUNNER_C1,
    TASK_1,
    TASK_2,
    TASK_3,
    bound,
    make_state,
    model_card,
    node_info,
    pair_instance,
    single_instance,
    text_generation,
)
from exo.shared.types.chunks import Chunk, ErrorChunk, TokenChunk, Usage
from exo.shared.types.commands import (
    CancelCommand,
    Command,
    CreateInstance,
    DeleteInstance,
    DownloadAction,
    GenerateText,
    PlaceInstance,
    RecordRefusal,
)
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    CommandRefused,
    DownloadActionRequested,
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    MergeReported,
    NodeDownloadProgress,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
    TaskAcknowledged,
    TaskCreated,
    TaskStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from exo.shared.types.memory import Memory
from exo.shared.types.profiling import GpuInfo, NodeInfo
from exo.shared.types.state import MergeReport, State
from exo.shared.types.tasks import (
    AbandonInstance,
    CancelTask,
    ConnectToGroup,
    CreateRunner,
    DownloadModel,
    LoadModel,
    Shutdown,
    StartWarmup,
    Task,
    TaskId,
    TaskStatus,
    TextGeneration,
)
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.topology import Connection
from exo.shared.types.worker.downloads import (
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    DownloadProgress,
)
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import (
    RunnerConnected,
    RunnerConnecting,
    RunnerFailed,
    RunnerId,
    RunnerIdle,
    RunnerLoaded,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerShutdown,
    RunnerShuttingDown,
    RunnerStatus,
    RunnerWarmingUp,
)
from exo.shared.types.worker.shards import (
    PipelineShardMetadata,
    ShardMetadata,
    TensorShardMetadata,
)

_A_TO_B = Connection(source=NODE_A, sink=NODE_B)

RUNNER_STATUSES: list[RunnerStatus] = [
    RunnerIdle(),
    RunnerConnecting(),
    RunnerConnected(),
    RunnerLoading(layers_loaded=3, total_layers=8),
    RunnerLoaded(),
    RunnerWarmingUp(),
    RunnerReady(),
    RunnerRunning(active_requests=2),
    RunnerShuttingDown(),
    RunnerShutdown(),
    RunnerFailed(error_message="Terminated (exit code -9)"),
]

SHARDS: list[ShardMetadata] = [
    PipelineShardMetadata(
        model_card=model_card(),
        device_rank=1,
        world_size=2,
        start_layer=4,
        end_layer=8,
        n_layers=8,
    ),
    TensorShardMetadata(model_card=model_card(MODEL_2), device_rank=0, world_size=2),
]

DOWNLOADS: list[DownloadProgress] = [
    DownloadPending(),
    DownloadOngoing(downloaded_bytes=1024, total_bytes=4096),
    DownloadCompleted(path="/models/m"),
    DownloadFailed(error_message="disk full", status=507),
    DownloadOngoing(downloaded_bytes=1, total_bytes=2, bytes_per_s=3.5, eta_s=0.5),
]

HUB_CARD = model_card(MODEL_2).model_copy(update={"hub": HubSource(
    repo_id="org/repo-GGUF", revision="a" * 40, gguf_quant="Q4_K_M",
    files=[HubFile(path="m-Q4_K_M.gguf", size=10, sha256="b" * 64)])})

FULL_PARAMS = TextGenerationTaskParams(
    model=MODEL_1,
    input=[
        InputMessage(role="system", content="be brief"),
        InputMessage(role="user", content="hi"),
        InputMessage(role="assistant", content="hello"),
        InputMessage(role="tool", content="{}"),
    ],
    stream=True,
    max_tokens=32,
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    min_p=0.05,
    seed=1234,
    stop=["\n\n", "</s>"],
    repetition_penalty=1.1,
    presence_penalty=0.5,
    frequency_penalty=-0.5,
    raw_prompt="raw text",
)

TASKS: list[Task] = [
    CreateRunner(
        task_id=TASK_1, instance_id=INSTANCE_1, bound_instance=bound(pair_instance(), NODE_B)
    ),
    DownloadModel(task_id=TASK_2, instance_id=INSTANCE_1, shard_metadata=SHARDS[0]),
    ConnectToGroup(instance_id=INSTANCE_1, task_status=TaskStatus.Running),
    LoadModel(instance_id=INSTANCE_1, task_status=TaskStatus.Complete),
    StartWarmup(instance_id=INSTANCE_1, task_status=TaskStatus.Failed),
    TextGeneration(
        task_id=TASK_3,
        instance_id=INSTANCE_1,
        task_status=TaskStatus.TimedOut,
        command_id=COMMAND_1,
        task_params=FULL_PARAMS,
        origin_node_id=NODE_C,
    ),
    CancelTask(instance_id=INSTANCE_1, cancelled_task_id=TASK_3, task_status=TaskStatus.Cancelled),
    Shutdown(instance_id=INSTANCE_1, runner_id=RUNNER_A1),
    AbandonInstance(instance_id=INSTANCE_1, reason="runner failed 5 times: boom"),
]

CHUNKS: list[Chunk] = [
    TokenChunk(
        model=MODEL_1,
        text="Hello",
        token_id=9906,
        idx=3,
        finish_reason="length",
        usage=Usage(prompt_tokens=5, completion_tokens=4),
    ),
    ErrorChunk(model=MODEL_1, error_message="Runner shutdown before completing command"),
]

FULL_NODE_INFO = NodeInfo(
    hostname="gpu-box",
    cpu_count=16,
    memory_total=Memory.from_mb(65536),
    memory_available=Memory.from_mb(32768),
    gpus=[
        GpuInfo(
            name="H200", memory_total=Memory.from_mb(1000), memory_available=Memory.from_mb(900)
        )
    ],
    api_port=52415,
)

EVENTS: list[Event] = [
    TaskCreated(task_id=TASK_3, task=TASKS[5]),
    TaskAcknowledged(task_id=TASK_3),
    TaskStatusUpdated(task_id=TASK_3, task_status=TaskStatus.Failed, error_message="oops"),
    InstanceCreated(instance=pair_instance()),
    InstanceDeleted(instance_id=INSTANCE_1, reason="runner failed 5 times"),
    RunnerStatusUpdated(runner_id=RUNNER_A1, runner_status=RunnerFailed(error_message="x")),
    NodeGatheredInfo(node_id=NODE_A, info=FULL_NODE_INFO),
    NodeTimedOut(node_id=NODE_B),
    NodeDownloadProgress(node_id=NODE_A, model_id=MODEL_1, progress=DOWNLOADS[1]),
    DownloadActionRequested(node_id=NODE_A, action="delete", model_card=HUB_CARD),
    TopologyEdgeCreated(connection=_A_TO_B),
    TopologyEdgeDeleted(connection=_A_TO_B),
    MergeReported(report=MergeReport(
        node_id=NODE_B, first_idx=7, last_idx=9, dropped_events=3,
        event_kinds=("InstanceCreated",), command_ids=(COMMAND_1,),
    )),
    CommandRefused(command_id=COMMAND_2, reason="the instance was already deleted"),
    ChunkGenerated(command_id=COMMAND_1, chunk=CHUNKS[0]),
]

COMMANDS: list[Command] = [
    PlaceInstance(command_id=COMMAND_1, model_id=MODEL_1, sharding="tensor", min_nodes=2),
    CreateInstance(command_id=COMMAND_2, instance=pair_instance()),
    DeleteInstance(instance_id=INSTANCE_1, reason="user asked"),
    GenerateText(task_params=FULL_PARAMS, origin_node_id=NODE_A),
    CancelCommand(cancelled_command_id=COMMAND_1),
    PlaceInstance(model_id=HUB_CARD.model_id, model_card=HUB_CARD),
    DownloadAction(action="start", node_id=NODE_B, model_card=HUB_CARD),
    RecordRefusal(command_id=COMMAND_2, reason="cut by a merge"),
]


def _members(union: object) -> set[type]:
    """The classes of an ``Annotated[A | B | ..., Field(discriminator=...)]`` union."""
    (inner, *_) = get_args(union)
    return set(get_args(inner))


UNIONS: list[tuple[str, Any, Sequence[BaseModel]]] = [
    ("RunnerStatus", RunnerStatus, RUNNER_STATUSES),
    ("Task", Task, TASKS),
    ("Event", Event, EVENTS),
    ("Command", Command, COMMANDS),
    ("Chunk", Chunk, CHUNKS),
    ("ShardMetadata", ShardMetadata, SHARDS),
    ("DownloadProgress", DownloadProgress, DOWNLOADS),
]


@pytest.mark.parametrize(("name", "union", "samples"), UNIONS, ids=[u[0] for u in UNIONS])
def test_samples_cover_every_member(name: str, union: Any, samples: Sequence[BaseModel]) -> None:
    assert {type(s) for s in samples} == _members(union), f"{name}: a member has no sample"


@pytest.mark.parametrize(("name", "union", "samples"), UNIONS, ids=[u[0] for u in UNIONS])
def test_every_member_round_trips_through_json(
    name: str, union: Any, samples: Sequence[BaseModel]
) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(union)
    for sample in samples:
        back = adapter.validate_json(adapter.dump_json(sample))
        assert type(back) is type(sample), name
        assert back == sample, name


_MERGE = MergeReport(
    node_id=NODE_C, first_idx=30, last_idx=31, dropped_events=2,
    event_kinds=("InstanceDeleted", "TaskCreated"), command_ids=(COMMAND_2,),
)


def full_state() -> State:
    """A state with every field filled in."""
    return make_state(
        instances=[
            pair_instance(INSTANCE_1),
            single_instance(INSTANCE_2, NODE_C, RUNNER_C1, MODEL_2),
        ],
        runners={
            RUNNER_A1: RunnerReady(),
            RUNNER_B1: RunnerRunning(),
            RUNNER_C1: RunnerFailed(error_message="x"),
        },
        tasks=[
            text_generation(TASK_1),
            text_generation(TASK_2, INSTANCE_2, COMMAND_2, TaskStatus.Running, MODEL_2),
        ],
        downloads={NODE_A: {MODEL_1: DONE}, NODE_C: {MODEL_2: DOWNLOADS[1]}},
        nodes={NODE_A: FULL_NODE_INFO, NODE_B: node_info("b")},
        connections=[_A_TO_B, Connection(source=NODE_B, sink=NODE_A)],
    ).model_copy(update={"last_event_applied_idx": 41, "last_merge_report": _MERGE})


def test_full_state_round_trips_through_json() -> None:
    state = full_state()
    assert all(getattr(state, name) for name in State.model_fields)  # nothing left empty
    back = State.model_validate_json(state.model_dump_json())
    assert back == state
    indexed = IndexedEvent(idx=7, event=EVENTS[3])
    assert IndexedEvent.model_validate_json(indexed.model_dump_json()) == indexed


def test_ids_keep_their_types_after_a_round_trip() -> None:
    back = State.model_validate_json(full_state().model_dump_json())
    assert all(type(k) is InstanceId for k in back.instances)
    assert all(type(k) is RunnerId for k in back.runners)
    assert all(type(k) is TaskId for k in back.tasks)
    assert all(type(k) is NodeId for k in back.nodes)
    assert all(type(k) is NodeId for k in back.downloads)
    assert all(type(m) is ModelId for d in back.downloads.values() for m in d)
    instance = back.instances[INSTANCE_1]
    assert type(instance.instance_id) is InstanceId
    assert type(instance.shard_assignments.model_id) is ModelId
    assert all(type(k) is RunnerId for k in instance.shard_assignments.runner_to_shard)
    assert all(type(k) is NodeId for k in instance.shard_assignments.node_to_runner)
    assert all(type(v) is RunnerId for v in instance.shard_assignments.node_to_runner.values())
    task = back.tasks[TASK_1]
    assert isinstance(task, TextGeneration)
    assert type(task.task_id) is TaskId
    assert type(task.command_id) is CommandId
    assert type(task.task_params.model) is ModelId
    edge = back.topology.connections[0]
    assert type(edge.source) is NodeId
    assert type(edge.sink) is NodeId

    event_adapter: TypeAdapter[Event] = TypeAdapter(Event)
    shutdown = event_adapter.validate_json(
        event_adapter.dump_json(
            RunnerStatusUpdated(runner_id=RUNNER_B1, runner_status=RunnerShutdown())
        )
    )
    assert isinstance(shutdown, RunnerStatusUpdated)
    assert type(shutdown.runner_id) is RunnerId


def test_ids_serialize_as_plain_strings() -> None:
    assert (
        TaskCreated(task_id=TASK_1, task=text_generation()).model_dump(mode="json")["task_id"]
        == "task-1"
    )
    assert RunnerId("r") == "r"
    assert repr(RunnerId("r")) == "RunnerId('r')"


def test_fresh_ids_are_unique() -> None:
    ids = {RunnerId() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(type(i) is RunnerId and i for i in ids)
    assert TaskId() != TaskId()
    assert InstanceId() != InstanceId()


def test_empty_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        RunnerId("")
    with pytest.raises(ValidationError):
        RunnerStatusUpdated.model_validate_json(
            '{"runner_id": "", "runner_status": {"kind": "RunnerIdle"}}'
        )


def test_default_task_and_command_ids_are_fresh() -> None:
    assert LoadModel(instance_id=INSTANCE_1).task_id != LoadModel(instance_id=INSTANCE_1).task_id
    assert CancelCommand(cancelled_command_id=COMMAND_1).command_id != (
        CancelCommand(cancelled_command_id=COMMAND_1).command_id
    )


def test_models_are_frozen() -> None:
    status = RunnerFailed(error_message="x")
    with pytest.raises(ValidationError, match="frozen"):
        status.error_message = "y"  # pyright: ignore[reportAttributeAccessIssue]
    state = full_state()
    with pytest.raises(ValidationError, match="frozen"):
        state.last_event_applied_idx = 0  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(ValidationError, match="frozen"):
        TASKS[5].task_status = TaskStatus.Running  # pyright: ignore[reportAttributeAccessIssue]


def test_models_forbid_extra_fields() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        RunnerIdle.model_validate({"kind": "RunnerIdle", "surprise": 1})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        TypeAdapter(Event).validate_json(
            '{"kind": "TaskAcknowledged", "task_id": "t", "unexpected": true}'
        )
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        State.model_validate({"stale_field": {}})


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(RunnerStatus).validate_json('{"kind": "RunnerDeleted"}')


def test_runner_failed_requires_an_error_message() -> None:
    # Seed 000: RunnerFailed always carries an error message.
    with pytest.raises(ValidationError, match="error_message"):
        RunnerFailed()  # pyright: ignore[reportCallIssue]
    with pytest.raises(ValidationError, match="error_message"):
        TypeAdapter(RunnerStatus).validate_json('{"kind": "RunnerFailed"}')
    with pytest.raises(ValidationError):
        TypeAdapter(RunnerStatus).validate_json('{"kind": "RunnerFailed", "error_message": null}')
