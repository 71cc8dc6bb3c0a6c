"""plan: download, connect, load, warm up, forward requests, cancel them."""

from collections.abc import Mapping, Sequence

import pytest

from exo.shared.models.model_cards import ModelId
from exo.shared.tests.builders import (
    INSTANCE_1,
    INSTANCE_2,
    MODEL_1,
    MODEL_2,
    NODE_A,
    NODE_B,
    RUNNER_A1,
    RUNNER_B1,
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
    ConnectToGroup,
    DownloadModel,
    LoadModel,
    StartWarmup,
    Task,
    TaskId,
    TaskStatus,
)
from exo.shared.types.worker.downloads import (
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    DownloadProgress,
)
from exo.shared.types.worker.instances import Instance, InstanceId
from exo.shared.types.worker.runners import (
    RunnerConnected,
    RunnerConnecting,
    RunnerIdle,
    RunnerLoaded,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerStatus,
    RunnerWarmingUp,
)
from exo.utils.backoff import KeyedBackoff
from exo.worker.plan import RunnerView, plan

NOW = 500.0


def _plan(
    node_id: NodeId,
    runners: Mapping[NodeId, RunnerView],
    state: State,
    download_backoff: KeyedBackoff[ModelId] | None = None,
    now: float = NOW,
) -> Task | None:
    """Plan for ``node_id`` with the given local runners (keyed by node, for short)."""
    local = {v.bound_instance.bound_runner_id: v for v in runners.values()}
    return plan(
        node_id,
        local,
        state,
        KeyedBackoff[InstanceId](),
        download_backoff or KeyedBackoff[ModelId](),
        now,
    )


def _view(instance: Instance, node_id: NodeId, status: RunnerStatus) -> RunnerView:
    return RunnerView(bound_instance=bound(instance, node_id), status=status)


def _single(
    status: RunnerStatus,
    downloads: Mapping[NodeId, Mapping[ModelId, DownloadProgress]] | None = None,
) -> tuple[State, dict[NodeId, RunnerView]]:
    instance = single_instance()
    state = make_state(instances=[instance], runners={RUNNER_A1: status}, downloads=downloads)
    return state, {NODE_A: _view(instance, NODE_A, status)}


def _pair(
    a: RunnerStatus | None,
    b: RunnerStatus | None,
    downloads: Mapping[NodeId, Mapping[ModelId, DownloadProgress]] | None = None,
    tasks: Sequence[Task] = (),
) -> tuple[State, dict[NodeId, RunnerView]]:
    """A two-rank instance; ``None`` means that node's runner does not exist yet."""
    instance = pair_instance()
    statuses = {rid: s for rid, s in [(RUNNER_A1, a), (RUNNER_B1, b)] if s is not None}
    state = make_state(
        instances=[instance],
        runners=statuses,
        downloads=downloaded(NODE_A, NODE_B) if downloads is None else downloads,
        tasks=tasks,
    )
    views = {
        node: _view(instance, node, s) for node, s in [(NODE_A, a), (NODE_B, b)] if s is not None
    }
    return state, views


def _only(views: dict[NodeId, RunnerView], node_id: NodeId) -> dict[NodeId, RunnerView]:
    return {node_id: views[node_id]}


# --- download ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "progress",
    [
        None,
        DownloadPending(),
        DownloadOngoing(downloaded_bytes=1, total_bytes=9),
        DownloadFailed(error_message="x"),
    ],
    ids=["absent", "pending", "ongoing", "failed"],
)
def test_idle_runner_without_its_model_downloads_it(progress: DownloadProgress | None) -> None:
    downloads = {} if progress is None else {NODE_A: {MODEL_1: progress}}
    state, views = _single(RunnerIdle(), downloads)
    task = _plan(NODE_A, views, state)
    assert isinstance(task, DownloadModel)
    assert task.instance_id == INSTANCE_1
    assert task.shard_metadata == bound(single_instance(), NODE_A).bound_shard


def test_download_on_another_node_does_not_count() -> None:
    state, views = _single(RunnerIdle(), downloaded(NODE_B))
    assert isinstance(_plan(NODE_A, views, state), DownloadModel)


def test_download_respects_its_backoff() -> None:
    state, views = _single(RunnerIdle(), {NODE_A: {MODEL_1: DownloadFailed(error_message="x")}})
    backoff = KeyedBackoff[ModelId]()
    backoff.record_attempt(MODEL_1, NOW)
    assert _plan(NODE_A, views, state, backoff, NOW) is None
    assert _plan(NODE_A, views, state, backoff, NOW + 0.999) is None
    assert isinstance(_plan(NODE_A, views, state, backoff, NOW + 1.0), DownloadModel)
    backoff.record_attempt(MODEL_1, NOW + 1.0)
    assert _plan(NODE_A, views, state, backoff, NOW + 2.999) is None
    assert isinstance(_plan(NODE_A, views, state, backoff, NOW + 3.0), DownloadModel)


def test_download_backoff_is_per_model() -> None:
    backoff = KeyedBackoff[ModelId]()
    backoff.record_attempt(MODEL_2, NOW)
    state, views = _single(RunnerIdle())
    assert isinstance(_plan(NODE_A, views, state, backoff), DownloadModel)


@pytest.mark.parametrize("status", [RunnerConnected(), RunnerLoaded(), RunnerReady()])
def test_only_idle_runners_download(status: RunnerStatus) -> None:
    state, views = _single(status)
    assert not isinstance(_plan(NODE_A, views, state), DownloadModel)


def _holding(start: int, end: int) -> dict[NodeId, dict[ModelId, DownloadProgress]]:
    """NODE_B holds the files of layers [start, end) of MODEL_1 (NODE_A all of it)."""
    shard = DownloadCompleted(path="/cache/m", start_layer=start, end_layer=end)
    return {**downloaded(NODE_A), NODE_B: {MODEL_1: shard}}


def test_a_node_holding_another_shard_of_the_model_downloads_its_own() -> None:
    # NODE_B runs layers [4, 8) of the pair; it holds only the files of [0, 4).
    state, views = _pair(RunnerIdle(), RunnerIdle(), downloads=_holding(0, 4))
    task = _plan(NODE_B, _only(views, NODE_B), state)
    assert isinstance(task, DownloadModel)
    assert task.shard_metadata == bound(pair_instance(), NODE_B).bound_shard
    state, views = _pair(RunnerConnected(), RunnerConnected(), downloads=_holding(0, 4))
    assert not isinstance(_plan(NODE_B, _only(views, NODE_B), state), LoadModel)


@pytest.mark.parametrize("held", [(4, 8), (0, 8), (2, 8)])
def test_a_node_holding_its_shard_or_more_loads_it(held: tuple[int, int]) -> None:
    state, views = _pair(RunnerIdle(), RunnerIdle(), downloads=_holding(*held))
    assert isinstance(_plan(NODE_B, _only(views, NODE_B), state), ConnectToGroup)
    state, views = _pair(RunnerConnected(), RunnerConnected(), downloads=_holding(*held))
    assert isinstance(_plan(NODE_B, _only(views, NODE_B), state), LoadModel)


# --- connect -------------------------------------------------------------------------


def test_single_runner_never_connects() -> None:
    state, views = _single(RunnerIdle(), downloaded(NODE_A))
    assert isinstance(_plan(NODE_A, views, state), LoadModel)


def test_group_waits_for_every_runner_to_exist() -> None:
    state, views = _pair(RunnerIdle(), None)
    assert _plan(NODE_A, views, state) is None


@pytest.mark.parametrize("peer", [RunnerIdle(), RunnerConnecting(), RunnerConnected()])
def test_group_connects_once_every_runner_exists(peer: RunnerStatus) -> None:
    state, views = _pair(RunnerIdle(), peer)
    task = _plan(NODE_A, _only(views, NODE_A), state)
    assert isinstance(task, ConnectToGroup)
    assert task.instance_id == INSTANCE_1


def test_group_downloads_before_it_connects() -> None:
    state, views = _pair(RunnerIdle(), RunnerIdle(), downloads=downloaded(NODE_B))
    assert isinstance(_plan(NODE_A, _only(views, NODE_A), state), DownloadModel)


def test_connecting_runner_is_not_told_again() -> None:
    state, views = _pair(RunnerConnecting(), RunnerIdle())
    assert _plan(NODE_A, _only(views, NODE_A), state) is None


# --- load ----------------------------------------------------------------------------


def test_single_runner_loads_from_idle_after_download() -> None:
    state, views = _single(RunnerIdle(), downloaded(NODE_A))
    task = _plan(NODE_A, views, state)
    assert isinstance(task, LoadModel)
    assert task.instance_id == INSTANCE_1


def test_no_load_without_download() -> None:
    state, views = _single(
        RunnerIdle(), {NODE_A: {MODEL_1: DownloadOngoing(downloaded_bytes=1, total_bytes=2)}}
    )
    backoff = KeyedBackoff[ModelId]()
    backoff.record_attempt(MODEL_1, NOW)  # the download is under way
    assert _plan(NODE_A, views, state, backoff) is None


def test_group_loads_when_all_are_connected() -> None:
    state, views = _pair(RunnerConnected(), RunnerConnecting())
    assert _plan(NODE_A, _only(views, NODE_A), state) is None
    state, views = _pair(RunnerConnected(), RunnerConnected())
    assert isinstance(_plan(NODE_A, _only(views, NODE_A), state), LoadModel)


@pytest.mark.parametrize("peer", [RunnerLoading(), RunnerLoaded()])
def test_group_loads_when_peer_is_ahead(peer: RunnerStatus) -> None:
    state, views = _pair(RunnerConnected(), peer)
    assert isinstance(_plan(NODE_A, _only(views, NODE_A), state), LoadModel)


def test_group_does_not_load_without_its_own_download() -> None:
    state, views = _pair(RunnerConnected(), RunnerConnected(), downloads=downloaded(NODE_B))
    assert _plan(NODE_A, _only(views, NODE_A), state) is None


# --- warm up -------------------------------------------------------------------------


def test_single_runner_warms_up_once_loaded() -> None:
    state, views = _single(RunnerLoaded(), downloaded(NODE_A))
    assert isinstance(_plan(NODE_A, views, state), StartWarmup)


def test_warmup_waits_for_every_rank_to_be_loaded() -> None:
    state, views = _pair(RunnerLoaded(), RunnerLoading())
    assert _plan(NODE_A, _only(views, NODE_A), state) is None


@pytest.mark.parametrize("peer", [RunnerLoaded(), RunnerWarmingUp()])
def test_warmup_starts_when_all_ranks_are_loaded(peer: RunnerStatus) -> None:
    state, views = _pair(RunnerLoaded(), peer)
    task = _plan(NODE_A, _only(views, NODE_A), state)
    assert isinstance(task, StartWarmup)
    assert task.instance_id == INSTANCE_1


def test_warming_up_runner_is_not_told_again() -> None:
    state, views = _pair(RunnerWarmingUp(), RunnerLoaded())
    assert _plan(NODE_A, _only(views, NODE_A), state) is None


# --- forwarding requests -------------------------------------------------------------


def test_pending_request_is_forwarded_to_a_ready_runner() -> None:
    task = text_generation()
    state, views = _single(RunnerReady(), downloaded(NODE_A))
    state = state.model_copy(update={"tasks": {TASK_1: task}})
    assert _plan(NODE_A, views, state) == task


def test_request_waits_until_every_runner_serves() -> None:
    pending = [text_generation()]
    for peer in [RunnerLoaded(), RunnerWarmingUp(), RunnerConnected()]:
        state, views = _pair(RunnerReady(), peer, tasks=pending)
        assert _plan(NODE_A, _only(views, NODE_A), state) is None
    state, views = _pair(RunnerReady(), None, tasks=pending)
    assert _plan(NODE_A, _only(views, NODE_A), state) is None
    for peer in [RunnerReady(), RunnerRunning()]:
        state, views = _pair(RunnerReady(), peer, tasks=pending)
        assert _plan(NODE_A, _only(views, NODE_A), state) == pending[0]


def test_busy_runner_takes_more_requests() -> None:
    state, views = _pair(RunnerRunning(), RunnerRunning(), tasks=[text_generation()])
    assert _plan(NODE_A, _only(views, NODE_A), state) == text_generation()


def test_request_is_not_forwarded_twice() -> None:
    task = text_generation()
    state, views = _pair(RunnerRunning(), RunnerRunning(), tasks=[task])
    a = views[NODE_A]
    in_progress = RunnerView(
        bound_instance=a.bound_instance, status=a.status, in_progress={TASK_1: task}
    )
    assert _plan(NODE_A, {NODE_A: in_progress}, state) is None
    done = RunnerView(
        bound_instance=a.bound_instance, status=a.status, completed=frozenset({TASK_1})
    )
    assert _plan(NODE_A, {NODE_A: done}, state) is None


def test_only_rank_0_takes_requests_of_a_group() -> None:
    # Rank 0 leads the group's batches; the other ranks follow it step by step, so they
    # never receive requests themselves (pending or already running).
    for status in (TaskStatus.Pending, TaskStatus.Running):
        task = text_generation(status=status)
        state, views = _pair(RunnerReady(), RunnerReady(), tasks=[task])
        ranks = {node: v.bound_instance.bound_shard.device_rank for node, v in views.items()}
        leader = next(node for node, rank in ranks.items() if rank == 0)
        follower = next(node for node, rank in ranks.items() if rank != 0)
        assert _plan(leader, _only(views, leader), state) == task
        assert _plan(follower, _only(views, follower), state) is None


def test_request_for_another_instance_is_not_forwarded() -> None:
    other = text_generation(TASK_2, INSTANCE_2, model_id=MODEL_2)
    state, views = _single(RunnerReady(), downloaded(NODE_A))
    state = state.model_copy(update={"tasks": {TASK_2: other}})
    assert _plan(NODE_A, views, state) is None


# --- cancelling ----------------------------------------------------------------------


def _working(
    task_status: TaskStatus | None, cancelled: frozenset[TaskId] = frozenset()
) -> Task | None:
    """NODE_A's runner works on TASK_1; the state has it with ``task_status`` (or not)."""
    task = text_generation()
    tasks = [] if task_status is None else [task.model_copy(update={"task_status": task_status})]
    state, views = _pair(RunnerRunning(), RunnerRunning(), tasks=tasks)
    a = views[NODE_A]
    view = RunnerView(
        bound_instance=a.bound_instance,
        status=a.status,
        in_progress={TASK_1: task},
        cancelled=cancelled,
    )
    return _plan(NODE_A, {NODE_A: view}, state)


def test_request_the_state_no_longer_has_is_cancelled() -> None:
    task = _working(None)
    assert isinstance(task, CancelTask)
    assert (task.instance_id, task.cancelled_task_id) == (INSTANCE_1, TASK_1)


def test_request_the_state_marks_cancelled_is_cancelled() -> None:
    task = _working(TaskStatus.Cancelled)
    assert isinstance(task, CancelTask)
    assert task.cancelled_task_id == TASK_1


def test_cancel_is_not_sent_twice() -> None:
    assert _working(None, frozenset({TASK_1})) is None
    assert _working(TaskStatus.Cancelled, frozenset({TASK_1})) is None


@pytest.mark.parametrize("status", [TaskStatus.Pending, TaskStatus.Running])
def test_live_request_is_not_cancelled(status: TaskStatus) -> None:
    assert _working(status) is None


def test_only_requests_are_cancelled() -> None:
    # A control task in progress (e.g. LoadModel) is not in the state's tasks by design.
    state, views = _single(RunnerLoading(), downloaded(NODE_A))
    a = views[NODE_A]
    load = LoadModel(instance_id=INSTANCE_1)
    view = RunnerView(
        bound_instance=a.bound_instance, status=a.status, in_progress={load.task_id: load}
    )
    assert _plan(NODE_A, {NODE_A: view}, state) is None
