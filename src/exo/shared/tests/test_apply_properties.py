"""Properties of apply over random event sequences (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from exo.shared.apply import EventOrderError, apply
from exo.shared.tests.builders import (
    COMMAND_1,
    INSTANCE_1,
    INSTANCE_2,
    MODEL_1,
    MODEL_2,
    NODE_A,
    NODE_B,
    NODE_C,
    RUNNER_A1,
    RUNNER_B1,
    RUNNER_B2,
    RUNNER_C1,
    TASK_1,
    TASK_2,
    TASK_3,
    node_info,
    pair_instance,
    pipeline_instance,
    single_instance,
    text_generation,
)
from exo.shared.types.chunks import ErrorChunk, TokenChunk
from exo.shared.types.common import NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
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
from exo.shared.types.state import State
from exo.shared.types.tasks import TaskId, TaskStatus
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
    RunnerFailed,
    RunnerIdle,
    RunnerReady,
    RunnerShutdown,
    RunnerShuttingDown,
    RunnerStatus,
)

_NODES = [NODE_A, NODE_B, NODE_C]
_INSTANCES = [
    pair_instance(INSTANCE_1),
    pipeline_instance(INSTANCE_2, [(NODE_B, RUNNER_B2), (NODE_C, RUNNER_C1)], MODEL_2),
    # The same id placed differently: a later InstanceCreated replaces the earlier one.
    single_instance(INSTANCE_2, NODE_C, RUNNER_C1, MODEL_2),
]
_RUNNER_STATUSES: list[RunnerStatus] = [
    RunnerIdle(),
    RunnerConnected(),
    RunnerReady(),
    RunnerShuttingDown(),
    RunnerShutdown(),
    RunnerFailed(error_message="boom"),
]
_PROGRESS: list[DownloadProgress] = [
    DownloadPending(),
    DownloadOngoing(downloaded_bytes=1, total_bytes=2),
    DownloadCompleted(path="/m"),
    DownloadFailed(error_message="no network"),
]

_node = st.sampled_from(_NODES)
_instance_id = st.sampled_from([INSTANCE_1, INSTANCE_2])
_task_id = st.sampled_from([TASK_1, TASK_2, TASK_3])
_connection = st.builds(Connection, source=_node, sink=_node)


def _task_created(task_id: TaskId, instance_id: InstanceId) -> TaskCreated:
    return TaskCreated(task_id=task_id, task=text_generation(task_id, instance_id))


def _node_gathered_info(node_id: NodeId) -> NodeGatheredInfo:
    return NodeGatheredInfo(node_id=node_id, info=node_info(str(node_id)))


_event: st.SearchStrategy[Event] = st.one_of(
    st.builds(_task_created, _task_id, _instance_id),
    st.builds(TaskAcknowledged, task_id=_task_id),
    st.builds(TaskStatusUpdated, task_id=_task_id, task_status=st.sampled_from(list(TaskStatus))),
    st.builds(InstanceCreated, instance=st.sampled_from(_INSTANCES)),
    st.builds(InstanceDeleted, instance_id=_instance_id),
    st.builds(
        RunnerStatusUpdated,
        runner_id=st.sampled_from([RUNNER_A1, RUNNER_B1, RUNNER_B2, RUNNER_C1]),
        runner_status=st.sampled_from(_RUNNER_STATUSES),
    ),
    st.builds(_node_gathered_info, _node),
    st.builds(NodeTimedOut, node_id=_node),
    st.builds(
        NodeDownloadProgress,
        node_id=_node,
        model_id=st.sampled_from([MODEL_1, MODEL_2]),
        progress=st.sampled_from(_PROGRESS),
    ),
    st.builds(TopologyEdgeCreated, connection=_connection),
    st.builds(TopologyEdgeDeleted, connection=_connection),
    st.builds(
        ChunkGenerated,
        command_id=st.just(COMMAND_1),
        chunk=st.sampled_from(
            [
                TokenChunk(model=MODEL_1, text="a", token_id=1, idx=0),
                ErrorChunk(model=MODEL_1, error_message="runner died"),
            ]
        ),
    ),
)
_events = st.lists(_event, max_size=40)


def _check_invariants(state: State, event: Event) -> None:
    # Tasks only live as long as their instance.
    assert all(t.instance_id in state.instances for t in state.tasks.values())
    # RunnerShutdown removes runners: it is never stored.
    assert not any(isinstance(s, RunnerShutdown) for s in state.runners.values())
    if isinstance(event, NodeTimedOut):
        gone: NodeId = event.node_id
        assert gone not in state.nodes
        assert gone not in state.downloads
        assert all(gone not in (c.source, c.sink) for c in state.topology.connections)
        assert all(gone not in i.shard_assignments.node_to_runner for i in state.instances.values())


@settings(max_examples=150, deadline=None)
@given(_events)
def test_folding_in_order_works_and_never_mutates(events: list[Event]) -> None:
    state = State()
    for idx, event in enumerate(events):
        before = state.model_dump()
        new = apply(state, IndexedEvent(idx=idx, event=event))
        assert state.model_dump() == before, "apply mutated its input"
        assert new.last_event_applied_idx == idx
        _check_invariants(new, event)
        state = new
    assert state.last_event_applied_idx == len(events) - 1


@settings(max_examples=50, deadline=None)
@given(_events)
def test_apply_is_deterministic(events: list[Event]) -> None:
    def fold(evs: list[Event]) -> State:
        s = State()
        for idx, e in enumerate(evs):
            s = apply(s, IndexedEvent(idx=idx, event=e))
        return s

    assert fold(events) == fold(events)


@st.composite
def _bad_order(draw: st.DrawFn) -> tuple[list[Event], list[int]]:
    """Events with indices that are not 0, 1, 2, ...: shuffled, duplicated or skipped."""
    events = draw(st.lists(_event, min_size=2, max_size=20))
    n = len(events)
    how = draw(st.sampled_from(["shuffle", "duplicate", "skip"]))
    indices = list(range(n))
    if how == "shuffle":
        indices = draw(st.permutations(indices).filter(lambda p: list(p) != list(range(n))))
    elif how == "duplicate":
        at = draw(st.integers(1, n - 1))
        indices[at] = draw(st.integers(0, at - 1))
    else:
        at = draw(st.integers(0, n - 1))
        indices[at] = draw(st.integers(at + 1, at + 5))
    return events, list(indices)


@settings(max_examples=150, deadline=None)
@given(_bad_order())
def test_out_of_order_log_is_refused_at_the_first_bad_index(
    case: tuple[list[Event], list[int]],
) -> None:
    events, indices = case
    first_bad = next(i for i, idx in enumerate(indices) if idx != i)
    state = State()
    for pos, (idx, event) in enumerate(zip(indices, events, strict=True)):
        before = state.model_dump()
        if pos < first_bad:
            state = apply(state, IndexedEvent(idx=idx, event=event))
            continue
        try:
            apply(state, IndexedEvent(idx=idx, event=event))
        except EventOrderError as e:
            assert f"expected index {pos}, got {idx}" in str(e)
        else:
            raise AssertionError(f"index {idx} at position {pos} was accepted")
        assert state.model_dump() == before
        assert state.last_event_applied_idx == pos - 1
        break
    else:
        raise AssertionError("the bad index was never reached")
