"""apply: the one pure function that folds events into state, strictly in index order."""

from collections.abc import Mapping
from typing import TypeVar, assert_never

from exo.shared.types.common import NodeId
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
from exo.shared.types.state import State
from exo.shared.types.tasks import FINISHED_TASK_STATUSES, Task, TaskId, TaskStatus
from exo.shared.types.worker.downloads import DownloadFailed
from exo.shared.types.worker.instances import Instance, InstanceId
from exo.shared.types.worker.runners import RunnerId, RunnerShutdown, RunnerStatus

_K = TypeVar("_K")
_V = TypeVar("_V")


class EventOrderError(ValueError):
    """An event arrived out of order: a gap or a duplicate in the log."""


def apply(state: State, indexed_event: IndexedEvent) -> State:
    """Apply the next event of the log. Refuses gaps and duplicates."""
    expected = state.last_event_applied_idx + 1
    if indexed_event.idx != expected:
        kind = "duplicate" if indexed_event.idx < expected else "gap"
        raise EventOrderError(
            f"{kind} in event log: expected index {expected}, got {indexed_event.idx}"
        )
    new_state = event_apply(indexed_event.event, state)
    return new_state.model_copy(update={"last_event_applied_idx": indexed_event.idx})


def event_apply(event: Event, state: State) -> State:
    match event:
        case TaskCreated():
            return apply_task_created(event, state)
        case TaskAcknowledged():
            return apply_task_acknowledged(event, state)
        case TaskStatusUpdated():
            return apply_task_status_updated(event, state)
        case InstanceCreated():
            return apply_instance_created(event, state)
        case InstanceDeleted():
            return apply_instance_deleted(event, state)
        case RunnerStatusUpdated():
            return apply_runner_status_updated(event, state)
        case NodeGatheredInfo():
            return apply_node_gathered_info(event, state)
        case NodeTimedOut():
            return apply_node_timed_out(event, state)
        case NodeDownloadProgress():
            return apply_node_download_progress(event, state)
        case DownloadActionRequested():
            return apply_download_action(event, state)
        case TopologyEdgeCreated():
            return apply_topology_edge_created(event, state)
        case TopologyEdgeDeleted():
            return apply_topology_edge_deleted(event, state)
        case MergeReported():
            return state.model_copy(update={"last_merge_report": event.report})
        case ChunkGenerated() | CommandRefused():
            return state  # a refusal is bookkeeping of the log (its command id), not state
        case _:  # pyright: ignore[reportUnnecessaryComparison]
            assert_never(event)


def apply_task_created(event: TaskCreated, state: State) -> State:
    if event.task.instance_id not in state.instances:
        # The instance went away before the task was sequenced: nothing can run it.
        return state
    return state.model_copy(update={"tasks": {**state.tasks, event.task_id: event.task}})


def apply_task_acknowledged(event: TaskAcknowledged, state: State) -> State:
    return _set_task_status(state, event.task_id, TaskStatus.Running)


def apply_task_status_updated(event: TaskStatusUpdated, state: State) -> State:
    if event.task_status in FINISHED_TASK_STATUSES:
        return state.model_copy(update={"tasks": _without(state.tasks, {event.task_id})})
    return _set_task_status(state, event.task_id, event.task_status)


def _set_task_status(state: State, task_id: TaskId, status: TaskStatus) -> State:
    task = state.tasks.get(task_id)
    if task is None or task.task_status == status:
        return state
    updated: Task = task.model_copy(update={"task_status": status})
    return state.model_copy(update={"tasks": {**state.tasks, task_id: updated}})


def apply_instance_created(event: InstanceCreated, state: State) -> State:
    """A new instance starts its downloads afresh: failures of earlier attempts on its
    nodes are forgotten (so that they do not fail the new instance's requests)."""
    instance = event.instance
    model_id = instance.shard_assignments.model_id
    downloads = dict(state.downloads)
    for node_id in instance.shard_assignments.node_to_runner:
        mine = downloads.get(node_id, {})
        if isinstance(mine.get(model_id), DownloadFailed):
            downloads[node_id] = {k: v for k, v in mine.items() if k != model_id}
    return state.model_copy(
        update={
            "instances": {**state.instances, instance.instance_id: instance},
            "downloads": downloads,
        }
    )


def apply_instance_deleted(event: InstanceDeleted, state: State) -> State:
    return _delete_instances(state, {event.instance_id})


def _delete_instances(state: State, instance_ids: set[InstanceId]) -> State:
    """Remove instances with what belongs only to them: their tasks and runner statuses."""
    if not instance_ids & state.instances.keys():
        return state
    tasks = {tid: t for tid, t in state.tasks.items() if t.instance_id not in instance_ids}
    runner_ids = {
        rid
        for iid in instance_ids & state.instances.keys()
        for rid in state.instances[iid].shard_assignments.runner_to_shard
    }
    return state.model_copy(
        update={
            "instances": _without(state.instances, instance_ids),
            "tasks": tasks,
            "runners": _without(state.runners, runner_ids),
        }
    )


def apply_runner_status_updated(event: RunnerStatusUpdated, state: State) -> State:
    if isinstance(event.runner_status, RunnerShutdown):
        runners: Mapping[RunnerId, RunnerStatus] = _without(state.runners, {event.runner_id})
        return state.model_copy(update={"runners": runners})
    return state.model_copy(
        update={"runners": {**state.runners, event.runner_id: event.runner_status}}
    )


def apply_node_gathered_info(event: NodeGatheredInfo, state: State) -> State:
    return state.model_copy(update={"nodes": {**state.nodes, event.node_id: event.info}})


def apply_node_timed_out(event: NodeTimedOut, state: State) -> State:
    """Forget everything about the node: its info, downloads, links, runners and the
    instances that had a shard on it (those cannot run any more)."""
    node_id = event.node_id
    broken = {
        iid for iid, inst in state.instances.items() if _has_node(inst, node_id)
    }
    its_runners = {
        rid
        for inst in state.instances.values()
        for nid, rid in inst.shard_assignments.node_to_runner.items()
        if nid == node_id
    }
    state = _delete_instances(state, broken)
    return state.model_copy(
        update={
            "nodes": _without(state.nodes, {node_id}),
            "downloads": _without(state.downloads, {node_id}),
            "topology": state.topology.without_node(node_id),
            "runners": _without(state.runners, its_runners),
        }
    )


def _has_node(instance: Instance, node_id: NodeId) -> bool:
    return node_id in instance.shard_assignments.node_to_runner


def apply_download_action(event: DownloadActionRequested, state: State) -> State:
    """A deleted download is gone from the state; starts and cancels are reported by
    the node as it acts."""
    if event.action != "delete":
        return state
    model_id = event.model_card.model_id
    mine = state.downloads.get(event.node_id, {})
    if model_id not in mine:
        return state
    rest = {k: v for k, v in mine.items() if k != model_id}
    return state.model_copy(update={"downloads": {**state.downloads, event.node_id: rest}})


def apply_node_download_progress(event: NodeDownloadProgress, state: State) -> State:
    node_downloads = {**state.downloads.get(event.node_id, {}), event.model_id: event.progress}
    return state.model_copy(
        update={"downloads": {**state.downloads, event.node_id: node_downloads}}
    )


def apply_topology_edge_created(event: TopologyEdgeCreated, state: State) -> State:
    return state.model_copy(update={"topology": state.topology.with_connection(event.connection)})


def apply_topology_edge_deleted(event: TopologyEdgeDeleted, state: State) -> State:
    return state.model_copy(
        update={"topology": state.topology.without_connection(event.connection)}
    )


def _without(mapping: Mapping[_K, _V], keys: set[_K]) -> dict[_K, _V]:
    new = dict(mapping)
    for key in keys:
        new.pop(key, None)
    return new
