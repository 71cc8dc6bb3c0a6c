"""plan: when runners are shut down and created, and the first-match order of the chain."""

from collections.abc import Mapping
from dataclasses import replace

from exo.shared.models.model_cards import ModelId
from exo.shared.tests.builders import (
    DONE,
    INSTANCE_1,
    INSTANCE_2,
    MODEL_1,
    MODEL_2,
    NODE_A,
    NODE_B,
    RUNNER_A1,
    RUNNER_A2,
    RUNNER_B1,
    RUNNER_C1,
    TASK_1,
    TASK_2,
    bound,
    downloaded,
    make_state,
    pair_instance,
    single_instance,
    text_generation,
)
from exo.shared.types.common import NodeId
from exo.shared.types.state import State
from exo.shared.types.tasks import (
    CancelTask,
    CreateRunner,
    DownloadModel,
    LoadModel,
    Shutdown,
    Task,
)
from exo.shared.types.worker.instances import BoundInstance, InstanceId
from exo.shared.types.worker.runners import (
    RunnerFailed,
    RunnerId,
    RunnerIdle,
    RunnerReady,
    RunnerRunning,
    RunnerShuttingDown,
    RunnerStatus,
)
from exo.utils.backoff import KeyedBackoff
from exo.worker.plan import RunnerView, plan

NOW = 1000.0
FAILED = RunnerFailed(error_message="boom")


def _plan(node_id: NodeId, runners: Mapping[RunnerId, RunnerView], state: State) -> Task | None:
    return plan(node_id, runners, state, KeyedBackoff[InstanceId](), KeyedBackoff[ModelId](), NOW)


def _local(b: BoundInstance, status: RunnerStatus) -> dict[RunnerId, RunnerView]:
    return {b.bound_runner_id: RunnerView(bound_instance=b, status=status)}


# --- shutting down -------------------------------------------------------------------


def test_runner_whose_own_status_is_failed_is_shut_down() -> None:
    instance = single_instance()
    state = make_state(
        instances=[instance], runners={RUNNER_A1: FAILED}, downloads=downloaded(NODE_A)
    )
    task = _plan(NODE_A, _local(bound(instance, NODE_A), FAILED), state)
    assert isinstance(task, Shutdown)
    assert (task.instance_id, task.runner_id) == (INSTANCE_1, RUNNER_A1)


def test_own_failure_is_read_from_the_local_status() -> None:
    # The supervisor knows first: the state may not have the failure yet.
    instance = single_instance()
    state = make_state(instances=[instance], runners={RUNNER_A1: RunnerReady()})
    task = _plan(NODE_A, _local(bound(instance, NODE_A), FAILED), state)
    assert isinstance(task, Shutdown)
    assert task.runner_id == RUNNER_A1


def test_runner_whose_sibling_failed_is_shut_down() -> None:
    instance = pair_instance()
    state = make_state(
        instances=[instance],
        runners={RUNNER_A1: FAILED, RUNNER_B1: RunnerReady()},
        downloads=downloaded(NODE_A, NODE_B),
    )
    task = _plan(NODE_B, _local(bound(instance, NODE_B), RunnerReady()), state)
    assert isinstance(task, Shutdown)
    assert (task.instance_id, task.runner_id) == (INSTANCE_1, RUNNER_B1)


def test_runner_of_a_deleted_instance_is_shut_down() -> None:
    gone = bound(single_instance(INSTANCE_2, NODE_A, RUNNER_A2, MODEL_2), NODE_A)
    task = _plan(NODE_A, _local(gone, RunnerReady()), State())
    assert isinstance(task, Shutdown)
    assert (task.instance_id, task.runner_id) == (INSTANCE_2, RUNNER_A2)


def test_runner_already_shutting_down_is_not_shut_down_again() -> None:
    instance = pair_instance()
    b = bound(instance, NODE_B)
    # Its instance is gone ...
    assert _plan(NODE_B, _local(b, RunnerShuttingDown()), State()) is None
    # ... or its sibling failed.
    state = make_state(instances=[instance], runners={RUNNER_A1: FAILED})
    assert _plan(NODE_B, _local(b, RunnerShuttingDown()), state) is None


def test_healthy_runners_are_left_alone() -> None:
    instance = pair_instance()
    state = make_state(
        instances=[instance],
        runners={RUNNER_A1: RunnerReady(), RUNNER_B1: RunnerReady()},
        downloads=downloaded(NODE_A, NODE_B),
    )
    assert _plan(NODE_A, _local(bound(instance, NODE_A), RunnerReady()), state) is None


def test_runners_of_other_instances_do_not_count_as_siblings() -> None:
    mine = single_instance(INSTANCE_1, NODE_A, RUNNER_A1)
    other = single_instance(INSTANCE_2, NODE_B, RUNNER_B1, MODEL_2)
    state = make_state(
        instances=[mine, other],
        runners={RUNNER_A1: RunnerReady(), RUNNER_B1: FAILED},
        downloads=downloaded(NODE_A),
    )
    assert _plan(NODE_A, _local(bound(mine, NODE_A), RunnerReady()), state) is None


# --- creating ------------------------------------------------------------------------


def test_missing_runner_is_created() -> None:
    instance = pair_instance()
    state = make_state(instances=[instance])
    task = _plan(NODE_B, {}, state)
    assert isinstance(task, CreateRunner)
    assert task.instance_id == INSTANCE_1
    assert task.bound_instance == bound(instance, NODE_B)


def test_created_when_sibling_is_alive() -> None:
    instance = pair_instance()
    state = make_state(instances=[instance], runners={RUNNER_A1: RunnerIdle()})
    assert isinstance(_plan(NODE_B, {}, state), CreateRunner)


def test_not_created_while_a_sibling_is_failed() -> None:
    instance = pair_instance()
    state = make_state(instances=[instance], runners={RUNNER_A1: FAILED})
    assert _plan(NODE_B, {}, state) is None


def test_created_when_this_nodes_runner_is_the_one_that_failed() -> None:
    instance = pair_instance()
    state = make_state(instances=[instance], runners={RUNNER_A1: FAILED})
    task = _plan(NODE_A, {}, state)
    assert isinstance(task, CreateRunner)
    assert task.bound_instance.bound_runner_id == RUNNER_A1


def test_created_when_both_failed() -> None:
    # A cascade: the peer crashed too. Both rebuild; neither waits for the other.
    instance = pair_instance()
    state = make_state(instances=[instance], runners={RUNNER_A1: FAILED, RUNNER_B1: FAILED})
    assert isinstance(_plan(NODE_A, {}, state), CreateRunner)
    assert isinstance(_plan(NODE_B, {}, state), CreateRunner)


def test_not_created_where_this_node_has_no_shard() -> None:
    state = make_state(instances=[pair_instance()])
    assert _plan(NodeId("node-z"), {}, state) is None


def test_not_created_twice() -> None:
    instance = single_instance()
    state = make_state(instances=[instance], downloads=downloaded(NODE_A))
    task = _plan(NODE_A, _local(bound(instance, NODE_A), RunnerIdle()), state)
    assert not isinstance(task, CreateRunner)


def test_one_failed_instance_does_not_block_another() -> None:
    blocked = pair_instance(INSTANCE_1)
    free = single_instance(INSTANCE_2, NODE_B, RUNNER_C1, MODEL_2)
    state = make_state(instances=[blocked, free], runners={RUNNER_A1: FAILED})
    task = _plan(NODE_B, {}, state)
    assert isinstance(task, CreateRunner)
    assert task.instance_id == INSTANCE_2


# --- first match wins ----------------------------------------------------------------


def test_chain_order_cancel_kill_create_download_load() -> None:
    """Every rule has something to do; remove each cause in turn and the next one wins."""
    failing = single_instance(INSTANCE_1, NODE_A, RUNNER_A1)
    missing = single_instance(INSTANCE_2, NODE_A, RUNNER_A2, MODEL_2)
    state = make_state(instances=[failing, missing], runners={RUNNER_A1: FAILED})
    stale = text_generation(TASK_1, INSTANCE_1)  # in progress, but not in the state
    a1 = bound(failing, NODE_A)

    # cancel before kill (and before create)
    view = RunnerView(bound_instance=a1, status=FAILED, in_progress={TASK_1: stale})
    task = _plan(NODE_A, {RUNNER_A1: view}, state)
    assert isinstance(task, CancelTask)
    assert task.cancelled_task_id == TASK_1

    # kill before create
    view = replace(view, cancelled=frozenset({TASK_1}))
    task = _plan(NODE_A, {RUNNER_A1: view}, state)
    assert isinstance(task, Shutdown)
    assert task.runner_id == RUNNER_A1

    # create before download: A1 is back, Idle, without its model; A2 is missing
    idle = RunnerView(bound_instance=a1, status=RunnerIdle())
    state = make_state(instances=[failing, missing], runners={RUNNER_A1: RunnerIdle()})
    task = _plan(NODE_A, {RUNNER_A1: idle}, state)
    assert isinstance(task, CreateRunner)
    assert task.instance_id == INSTANCE_2

    # download before load: A2 exists and its model is here; A1's model is not
    a2 = RunnerView(bound_instance=bound(missing, NODE_A), status=RunnerIdle())
    state = make_state(
        instances=[failing, missing],
        runners={RUNNER_A1: RunnerIdle(), RUNNER_A2: RunnerIdle()},
        downloads={NODE_A: {MODEL_2: DONE}},
    )
    task = _plan(NODE_A, {RUNNER_A1: idle, RUNNER_A2: a2}, state)
    assert isinstance(task, DownloadModel)
    assert task.instance_id == INSTANCE_1

    # load once nothing is missing
    state = state.model_copy(update={"downloads": {NODE_A: {MODEL_1: DONE, MODEL_2: DONE}}})
    task = _plan(NODE_A, {RUNNER_A1: idle, RUNNER_A2: a2}, state)
    assert isinstance(task, LoadModel)


def test_cancel_comes_before_forwarding() -> None:
    instance = single_instance()
    pending = text_generation(TASK_1)
    old = text_generation(TASK_2)  # finished and removed from the state
    state = make_state(
        instances=[instance],
        runners={RUNNER_A1: RunnerRunning()},
        tasks=[pending],
        downloads=downloaded(NODE_A),
    )
    view = RunnerView(
        bound_instance=bound(instance, NODE_A), status=RunnerRunning(), in_progress={TASK_2: old}
    )
    task = _plan(NODE_A, {RUNNER_A1: view}, state)
    assert isinstance(task, CancelTask)
    assert task.cancelled_task_id == TASK_2
    # Once cancelled, the pending request is forwarded.
    assert (
        _plan(NODE_A, {RUNNER_A1: replace(view, cancelled=frozenset({TASK_2}))}, state) == pending
    )
