"""The worker's planner: from the state and this node's runners to the next task.

Pure: time and backoff are inputs. The worker calls ``plan`` in a loop and executes
whatever it returns; nothing here acts. The first rule that has something to do wins.
"""

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Protocol

from exo.shared.constants import EXO_MAX_INSTANCE_RETRIES
from exo.shared.models.model_cards import ModelId
from exo.shared.types.common import NodeId
from exo.shared.types.state import State
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
from exo.shared.types.worker.downloads import DownloadProgress, holds_shard
from exo.shared.types.worker.instances import (
    BoundInstance,
    Instance,
    InstanceId,
    instance_is_serving,
)
from exo.shared.types.worker.runners import (
    RunnerConnected,
    RunnerConnecting,
    RunnerFailed,
    RunnerId,
    RunnerIdle,
    RunnerLoaded,
    RunnerLoading,
    RunnerShuttingDown,
    RunnerStatus,
    RunnerWarmingUp,
)
from exo.utils.backoff import KeyedBackoff


class LocalRunner(Protocol):
    """What the planner needs to know about one of this node's runners."""

    @property
    def bound_instance(self) -> BoundInstance: ...
    @property
    def status(self) -> RunnerStatus: ...
    @property
    def in_progress(self) -> Mapping[TaskId, Task]: ...
    @property
    def completed(self) -> Set[TaskId]: ...
    @property
    def cancelled(self) -> Set[TaskId]: ...


@dataclass(frozen=True)
class RunnerView:
    """A plain LocalRunner, for tests and snapshots."""

    bound_instance: BoundInstance
    status: RunnerStatus = field(default_factory=RunnerIdle)
    in_progress: Mapping[TaskId, Task] = field(default_factory=dict[TaskId, Task])
    completed: Set[TaskId] = frozenset()
    cancelled: Set[TaskId] = frozenset()


def plan(
    node_id: NodeId,
    runners: Mapping[RunnerId, LocalRunner],
    state: State,
    instance_backoff: KeyedBackoff[InstanceId],
    download_backoff: KeyedBackoff[ModelId],
    now: float,
) -> Task | None:
    downloads = state.downloads.get(node_id, {})
    return (
        _cancel_tasks(runners, state)
        or _kill_runner(runners, state)
        or _create_runner(node_id, runners, state, instance_backoff, now)
        or _model_needs_download(runners, downloads, download_backoff, now)
        or _init_distributed_backend(runners, state.runners)
        or _load_model(runners, state.runners, downloads)
        or _start_warmup(runners, state.runners)
        or _pending_tasks(runners, state)
    )


def _cancel_tasks(runners: Mapping[RunnerId, LocalRunner], state: State) -> CancelTask | None:
    """A runner is working on a request the state no longer has (finished, cancelled,
    or its instance is gone): tell it to stop."""
    for runner in runners.values():
        for task_id, task in runner.in_progress.items():
            if not isinstance(task, TextGeneration) or task_id in runner.cancelled:
                continue
            current = state.tasks.get(task_id)
            if current is None or current.task_status == TaskStatus.Cancelled:
                return CancelTask(instance_id=task.instance_id, cancelled_task_id=task_id)
    return None


def _kill_runner(runners: Mapping[RunnerId, LocalRunner], state: State) -> Shutdown | None:
    for runner in runners.values():
        if isinstance(runner.status, RunnerShuttingDown):
            continue
        runner_id = runner.bound_instance.bound_runner_id
        instance_id = runner.bound_instance.instance.instance_id
        if instance_id not in state.instances:
            return Shutdown(instance_id=instance_id, runner_id=runner_id)
        # A failed runner is a dead runner.
        if isinstance(runner.status, RunnerFailed):
            return Shutdown(instance_id=instance_id, runner_id=runner_id)
        # A group with a failed member cannot work: leave it, and wait for it to be rebuilt.
        for sibling_id in _runner_ids(runner.bound_instance.instance):
            if sibling_id != runner_id and isinstance(state.runners.get(sibling_id), RunnerFailed):
                return Shutdown(instance_id=instance_id, runner_id=runner_id)
    return None


def _create_runner(
    node_id: NodeId,
    runners: Mapping[RunnerId, LocalRunner],
    state: State,
    instance_backoff: KeyedBackoff[InstanceId],
    now: float,
) -> CreateRunner | AbandonInstance | None:
    for instance in state.instances.values():
        runner_id = instance.shard_assignments.node_to_runner.get(node_id)
        if runner_id is None or runner_id in runners:
            continue
        # Don't come back while a sibling is failed, unless we are the one that failed:
        # the failed node rebuilds first, then the others follow.
        sibling_failed = any(
            isinstance(state.runners.get(rid), RunnerFailed)
            for rid in _runner_ids(instance)
            if rid != runner_id
        )
        we_failed = isinstance(state.runners.get(runner_id), RunnerFailed)
        if sibling_failed and not we_failed:
            continue
        attempts = instance_backoff.attempts(instance.instance_id)
        failed = state.runners.get(runner_id)
        if isinstance(failed, RunnerFailed) and failed.deterministic:
            return AbandonInstance(
                instance_id=instance.instance_id,
                reason=f"runner failed: {failed.error_message} (not retried: it would fail "
                "the same way)",
            )
        if attempts >= EXO_MAX_INSTANCE_RETRIES:
            last = state.runners.get(runner_id)
            detail = f": {last.error_message}" if isinstance(last, RunnerFailed) else ""
            return AbandonInstance(
                instance_id=instance.instance_id,
                reason=f"runner failed {attempts} times{detail}",
            )
        if not instance_backoff.should_proceed(instance.instance_id, now):
            continue
        return CreateRunner(
            instance_id=instance.instance_id,
            bound_instance=BoundInstance(
                instance=instance, bound_runner_id=runner_id, bound_node_id=node_id
            ),
        )
    return None


def _model_needs_download(
    runners: Mapping[RunnerId, LocalRunner],
    downloads: Mapping[ModelId, DownloadProgress],
    download_backoff: KeyedBackoff[ModelId],
    now: float,
) -> DownloadModel | None:
    for runner in runners.values():
        if not isinstance(runner.status, RunnerIdle):
            continue
        shard = runner.bound_instance.bound_shard
        model_id = shard.model_card.model_id
        if holds_shard(downloads.get(model_id), shard):
            continue
        if not download_backoff.should_proceed(model_id, now):
            continue
        return DownloadModel(
            instance_id=runner.bound_instance.instance.instance_id, shard_metadata=shard
        )
    return None


def _init_distributed_backend(
    runners: Mapping[RunnerId, LocalRunner], all_runners: Mapping[RunnerId, RunnerStatus]
) -> ConnectToGroup | None:
    """Multi-runner instances: connect once every runner of the group exists."""
    for runner in runners.values():
        instance = runner.bound_instance.instance
        if instance.world_size == 1 or not isinstance(runner.status, RunnerIdle):
            continue
        if all(
            isinstance(all_runners.get(rid), (RunnerIdle, RunnerConnecting, RunnerConnected))
            for rid in _runner_ids(instance)
        ):
            return ConnectToGroup(instance_id=instance.instance_id)
    return None


def _load_model(
    runners: Mapping[RunnerId, LocalRunner],
    all_runners: Mapping[RunnerId, RunnerStatus],
    downloads: Mapping[ModelId, DownloadProgress],
) -> LoadModel | None:
    for runner in runners.values():
        instance = runner.bound_instance.instance
        shard = runner.bound_instance.bound_shard
        if not holds_shard(downloads.get(shard.model_card.model_id), shard):
            continue
        if instance.world_size == 1:
            ready_to_load = isinstance(runner.status, RunnerIdle)
        else:
            ready_to_load = isinstance(runner.status, RunnerConnected) and all(
                isinstance(all_runners.get(rid), (RunnerConnected, RunnerLoading, RunnerLoaded))
                for rid in _runner_ids(instance)
            )
        if ready_to_load:
            return LoadModel(instance_id=instance.instance_id)
    return None


def _start_warmup(
    runners: Mapping[RunnerId, LocalRunner], all_runners: Mapping[RunnerId, RunnerStatus]
) -> StartWarmup | None:
    """Warm up together: every rank takes part in the first forward pass."""
    for runner in runners.values():
        instance = runner.bound_instance.instance
        if isinstance(runner.status, RunnerLoaded) and all(
            isinstance(all_runners.get(rid), (RunnerLoaded, RunnerWarmingUp))
            for rid in _runner_ids(instance)
        ):
            return StartWarmup(instance_id=instance.instance_id)
    return None


_FORWARDABLE = (TaskStatus.Pending, TaskStatus.Running)


def _pending_tasks(runners: Mapping[RunnerId, LocalRunner], state: State) -> TextGeneration | None:
    """Forward a request to this node's runner once every runner of its instance serves.

    Running counts too: the first rank to acknowledge marks the task Running for the
    whole cluster, and the other ranks must still receive it."""
    # Rank 0 leads a multi-runner instance: only it takes requests.
    local = {
        r.bound_instance.instance.instance_id: r
        for r in runners.values()
        if r.bound_instance.bound_shard.device_rank == 0
    }
    for task in state.tasks.values():
        runner = local.get(task.instance_id)
        if (
            runner is None
            or not isinstance(task, TextGeneration)
            or task.task_status not in _FORWARDABLE
            or task.task_id in runner.in_progress
            or task.task_id in runner.completed
        ):
            continue
        instance = state.instances.get(task.instance_id)
        if instance is not None and instance_is_serving(instance, state.runners):
            return task
    return None


def _runner_ids(instance: Instance) -> list[RunnerId]:
    return list(instance.shard_assignments.runner_to_shard)
