"""What each event does to the state (through ``apply``, so indices advance too)."""

from typing import Any

import pytest

from exo.shared.tests.builders import (
    COMMAND_1,
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
    RUNNER_B2,
    RUNNER_C1,
    TASK_1,
    TASK_2,
    TASK_3,
    fold,
    make_state,
    node_info,
    pair_instance,
    pipeline_instance,
    single_instance,
    text_generation,
)
from exo.shared.types.chunks import TokenChunk
from exo.shared.types.common import NodeId
from exo.shared.types.events import (
    ChunkGenerated,
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
from exo.shared.types.state import MergeReport, State
from exo.shared.types.tasks import FINISHED_TASK_STATUSES, TaskStatus
from exo.shared.types.topology import Connection
from exo.shared.types.worker.downloads import DownloadOngoing
from exo.shared.types.worker.runners import (
    RunnerFailed,
    RunnerIdle,
    RunnerLoaded,
    RunnerReady,
    RunnerShutdown,
)

A_TO_B = Connection(source=NODE_A, sink=NODE_B)
B_TO_A = Connection(source=NODE_B, sink=NODE_A)
B_TO_C = Connection(source=NODE_B, sink=NODE_C)
C_TO_B = Connection(source=NODE_C, sink=NODE_B)


def _content(state: State) -> dict[str, Any]:
    """The state without its position in the log."""
    return state.model_dump(exclude={"last_event_applied_idx"})


# --- tasks ---------------------------------------------------------------------------


def test_task_created_is_added() -> None:
    state = make_state(instances=[single_instance()])
    task = text_generation()
    new = fold(state, [TaskCreated(task_id=TASK_1, task=task)])
    assert new.tasks == {TASK_1: task}
    assert new.last_event_applied_idx == 0


def test_task_created_for_unknown_instance_is_ignored() -> None:
    state = make_state(instances=[single_instance(INSTANCE_1)])
    task = text_generation(instance_id=INSTANCE_2)
    new = fold(state, [TaskCreated(task_id=TASK_1, task=task)])
    assert _content(new) == _content(state)
    assert new.last_event_applied_idx == 0


def test_task_acknowledged_becomes_running() -> None:
    state = make_state(instances=[single_instance()], tasks=[text_generation()])
    new = fold(state, [TaskAcknowledged(task_id=TASK_1)])
    assert new.tasks[TASK_1].task_status == TaskStatus.Running
    # Only the status changes.
    assert (
        new.tasks[TASK_1].model_copy(update={"task_status": TaskStatus.Pending})
        == (state.tasks[TASK_1])
    )


def test_task_acknowledged_for_unknown_task_changes_nothing() -> None:
    state = make_state(instances=[single_instance()], tasks=[text_generation()])
    new = fold(state, [TaskAcknowledged(task_id=TASK_2)])
    assert _content(new) == _content(state)


def test_task_status_updated_to_running() -> None:
    state = make_state(instances=[single_instance()], tasks=[text_generation()])
    new = fold(state, [TaskStatusUpdated(task_id=TASK_1, task_status=TaskStatus.Running)])
    assert new.tasks[TASK_1].task_status == TaskStatus.Running


@pytest.mark.parametrize("status", sorted(FINISHED_TASK_STATUSES))
def test_finished_task_is_removed(status: TaskStatus) -> None:
    other = text_generation(TASK_2)
    state = make_state(instances=[single_instance()], tasks=[text_generation(), other])
    new = fold(state, [TaskStatusUpdated(task_id=TASK_1, task_status=status)])
    assert new.tasks == {TASK_2: other}


def test_finished_statuses_are_exactly_the_terminal_ones() -> None:
    assert set(TaskStatus) - FINISHED_TASK_STATUSES == {TaskStatus.Pending, TaskStatus.Running}


def test_status_of_unknown_task_changes_nothing() -> None:
    state = make_state(instances=[single_instance()], tasks=[text_generation()])
    new = fold(
        state,
        [
            TaskStatusUpdated(task_id=TASK_2, task_status=TaskStatus.Running),
            TaskStatusUpdated(task_id=TASK_3, task_status=TaskStatus.Complete),
        ],
    )
    assert _content(new) == _content(state)


# --- instances -----------------------------------------------------------------------


def test_instance_created_is_added() -> None:
    instance = pair_instance()
    new = fold(State(), [InstanceCreated(instance=instance)])
    assert new.instances == {INSTANCE_1: instance}


def test_instance_deleted_removes_its_tasks_and_runners_only() -> None:
    first = pair_instance(INSTANCE_1)
    second = pipeline_instance(INSTANCE_2, [(NODE_B, RUNNER_B2), (NODE_C, RUNNER_C1)], MODEL_2)
    state = make_state(
        instances=[first, second],
        runners={
            RUNNER_A1: RunnerReady(),
            RUNNER_B1: RunnerReady(),
            RUNNER_B2: RunnerLoaded(),
            RUNNER_C1: RunnerLoaded(),
        },
        tasks=[
            text_generation(TASK_1, INSTANCE_1),
            text_generation(TASK_2, INSTANCE_2),
            text_generation(TASK_3, INSTANCE_1),
        ],
        downloads={NODE_A: {MODEL_1: DONE}},
        nodes={NODE_A: node_info("a"), NODE_B: node_info("b")},
        connections=[A_TO_B],
    )
    new = fold(state, [InstanceDeleted(instance_id=INSTANCE_1, reason="test")])
    assert new.instances == {INSTANCE_2: second}
    assert set(new.tasks) == {TASK_2}
    assert new.runners == {RUNNER_B2: RunnerLoaded(), RUNNER_C1: RunnerLoaded()}
    # Nodes, downloads and links are not the instance's.
    assert new.nodes == state.nodes
    assert new.downloads == state.downloads
    assert new.topology == state.topology


def test_deleting_unknown_instance_changes_nothing() -> None:
    state = make_state(
        instances=[single_instance()],
        runners={RUNNER_A1: RunnerReady()},
        tasks=[text_generation()],
    )
    new = fold(state, [InstanceDeleted(instance_id=INSTANCE_2)])
    assert _content(new) == _content(state)


# --- runners -------------------------------------------------------------------------


def test_runner_status_is_set_and_replaced() -> None:
    state = fold(
        State(),
        [
            RunnerStatusUpdated(runner_id=RUNNER_A1, runner_status=RunnerIdle()),
            RunnerStatusUpdated(runner_id=RUNNER_B1, runner_status=RunnerIdle()),
            RunnerStatusUpdated(runner_id=RUNNER_A1, runner_status=RunnerLoaded()),
        ],
    )
    assert state.runners == {RUNNER_A1: RunnerLoaded(), RUNNER_B1: RunnerIdle()}


def test_runner_failed_stays_in_state_with_its_message() -> None:
    failed = RunnerFailed(error_message="out of memory")
    state = fold(State(), [RunnerStatusUpdated(runner_id=RUNNER_A1, runner_status=failed)])
    assert state.runners == {RUNNER_A1: failed}


def test_runner_shutdown_removes_the_runner() -> None:
    # Seed 003: there is no RunnerDeleted event; RunnerShutdown removes the runner.
    state = make_state(runners={RUNNER_A1: RunnerReady(), RUNNER_B1: RunnerReady()})
    new = fold(state, [RunnerStatusUpdated(runner_id=RUNNER_A1, runner_status=RunnerShutdown())])
    assert new.runners == {RUNNER_B1: RunnerReady()}


def test_runner_shutdown_of_unknown_runner_changes_nothing() -> None:
    state = make_state(runners={RUNNER_B1: RunnerReady()})
    new = fold(state, [RunnerStatusUpdated(runner_id=RUNNER_A1, runner_status=RunnerShutdown())])
    assert _content(new) == _content(state)


def test_runner_shutdown_is_never_stored() -> None:
    new = fold(State(), [RunnerStatusUpdated(runner_id=RUNNER_A1, runner_status=RunnerShutdown())])
    assert new.runners == {}


# --- nodes ---------------------------------------------------------------------------


def test_node_info_is_set_and_replaced() -> None:
    state = fold(
        State(),
        [
            NodeGatheredInfo(node_id=NODE_A, info=node_info("a", 1024)),
            NodeGatheredInfo(node_id=NODE_B, info=node_info("b")),
            NodeGatheredInfo(node_id=NODE_A, info=node_info("a", 2048)),
        ],
    )
    assert state.nodes == {NODE_A: node_info("a", 2048), NODE_B: node_info("b")}


def _three_node_state() -> State:
    """NODE_A and NODE_B share INSTANCE_1; NODE_B and NODE_C share INSTANCE_2."""
    first = pair_instance(INSTANCE_1)
    second = pipeline_instance(INSTANCE_2, [(NODE_B, RUNNER_B2), (NODE_C, RUNNER_C1)], MODEL_2)
    return make_state(
        instances=[first, second],
        runners={
            RUNNER_A1: RunnerReady(),
            RUNNER_B1: RunnerReady(),
            RUNNER_B2: RunnerReady(),
            RUNNER_C1: RunnerReady(),
        },
        tasks=[text_generation(TASK_1, INSTANCE_1), text_generation(TASK_2, INSTANCE_2)],
        downloads={
            NODE_A: {MODEL_1: DONE},
            NODE_B: {MODEL_1: DONE, MODEL_2: DONE},
            NODE_C: {MODEL_2: DONE},
        },
        nodes={NODE_A: node_info("a"), NODE_B: node_info("b"), NODE_C: node_info("c")},
        connections=[A_TO_B, B_TO_A, B_TO_C, C_TO_B],
    )


def test_node_timed_out_forgets_the_node_and_what_depended_on_it() -> None:
    state = _three_node_state()
    new = fold(state, [NodeTimedOut(node_id=NODE_A)])
    # The node itself: info, downloads, links.
    assert NODE_A not in new.nodes
    assert NODE_A not in new.downloads
    assert new.topology.connections == [B_TO_C, C_TO_B]
    # INSTANCE_1 had a shard on it: gone, with its task and both its runners.
    assert set(new.instances) == {INSTANCE_2}
    assert set(new.tasks) == {TASK_2}
    assert set(new.runners) == {RUNNER_B2, RUNNER_C1}


def test_node_timed_out_leaves_other_nodes_untouched() -> None:
    state = _three_node_state()
    new = fold(state, [NodeTimedOut(node_id=NODE_A)])
    for node_id in (NODE_B, NODE_C):
        assert new.nodes[node_id] == state.nodes[node_id]
        assert new.downloads[node_id] == state.downloads[node_id]
    assert new.instances[INSTANCE_2] == state.instances[INSTANCE_2]
    assert new.tasks[TASK_2] == state.tasks[TASK_2]


def test_node_in_two_instances_takes_both_down() -> None:
    new = fold(_three_node_state(), [NodeTimedOut(node_id=NODE_B)])
    assert new.instances == {}
    assert new.tasks == {}
    assert new.runners == {}
    assert set(new.nodes) == {NODE_A, NODE_C}
    assert new.topology.connections == []


def test_unknown_node_timed_out_changes_nothing() -> None:
    state = _three_node_state()
    new = fold(state, [NodeTimedOut(node_id=NodeId("node-z"))])
    assert _content(new) == _content(state)


# --- downloads -----------------------------------------------------------------------


def test_download_progress_is_per_node_and_model() -> None:
    ongoing = DownloadOngoing(downloaded_bytes=10, total_bytes=100)
    state = fold(
        State(),
        [
            NodeDownloadProgress(node_id=NODE_A, model_id=MODEL_1, progress=ongoing),
            NodeDownloadProgress(node_id=NODE_A, model_id=MODEL_2, progress=ongoing),
            NodeDownloadProgress(node_id=NODE_B, model_id=MODEL_1, progress=ongoing),
            NodeDownloadProgress(node_id=NODE_A, model_id=MODEL_1, progress=DONE),
        ],
    )
    assert state.downloads == {
        NODE_A: {MODEL_1: DONE, MODEL_2: ongoing},
        NODE_B: {MODEL_1: ongoing},
    }


# --- topology ------------------------------------------------------------------------


def test_topology_edges_are_added_once_and_removed() -> None:
    state = fold(
        State(),
        [
            TopologyEdgeCreated(connection=A_TO_B),
            TopologyEdgeCreated(connection=B_TO_A),
            TopologyEdgeCreated(connection=A_TO_B),
        ],
    )
    assert state.topology.connections == [A_TO_B, B_TO_A]
    state = fold(state, [TopologyEdgeDeleted(connection=A_TO_B)])
    assert state.topology.connections == [B_TO_A]
    before = _content(state)
    state = fold(state, [TopologyEdgeDeleted(connection=A_TO_B)])
    assert _content(state) == before
    assert state.last_event_applied_idx == 4


# --- chunks --------------------------------------------------------------------------


def test_chunk_generated_changes_nothing_but_the_index() -> None:
    state = _three_node_state()
    chunk = TokenChunk(model=MODEL_1, text="hi", token_id=7, idx=0)
    new = fold(state, [ChunkGenerated(command_id=COMMAND_1, chunk=chunk)])
    assert _content(new) == _content(state)
    assert new.last_event_applied_idx == state.last_event_applied_idx + 1


# --- merges --------------------------------------------------------------------------


def test_a_merge_report_is_kept_as_the_last_one_and_changes_nothing_else() -> None:
    state = _three_node_state()
    first = MergeReport(
        node_id=NODE_B, first_idx=3, last_idx=5, dropped_events=3,
        event_kinds=("InstanceCreated", "TaskCreated"), command_ids=(COMMAND_1,),
    )
    second = first.model_copy(update={"node_id": NODE_C, "command_ids": ()})
    once = fold(state, [MergeReported(report=first)])
    assert once.last_merge_report == first
    assert _content(once) == {**_content(state), "last_merge_report": first.model_dump()}
    assert fold(once, [MergeReported(report=second)]).last_merge_report == second
