"""Events: the only way state changes. The master indexes them; every node applies them."""

from typing import Annotated, Literal

from pydantic import Field

from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.chunks import Chunk
from exo.shared.types.common import CommandId, FrozenModel, NodeId
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.state import MergeReport
from exo.shared.types.tasks import Task, TaskId, TaskStatus
from exo.shared.types.topology import Connection
from exo.shared.types.worker.downloads import DownloadProgress
from exo.shared.types.worker.instances import Instance, InstanceId
from exo.shared.types.worker.runners import RunnerId, RunnerStatus


class TaskCreated(FrozenModel):
    kind: Literal["TaskCreated"] = "TaskCreated"
    task_id: TaskId
    task: Task


class TaskAcknowledged(FrozenModel):
    kind: Literal["TaskAcknowledged"] = "TaskAcknowledged"
    task_id: TaskId


class TaskStatusUpdated(FrozenModel):
    kind: Literal["TaskStatusUpdated"] = "TaskStatusUpdated"
    task_id: TaskId
    task_status: TaskStatus
    error_message: str | None = None


class InstanceCreated(FrozenModel):
    kind: Literal["InstanceCreated"] = "InstanceCreated"
    instance: Instance


class InstanceDeleted(FrozenModel):
    kind: Literal["InstanceDeleted"] = "InstanceDeleted"
    instance_id: InstanceId
    reason: str = ""


class RunnerStatusUpdated(FrozenModel):
    kind: Literal["RunnerStatusUpdated"] = "RunnerStatusUpdated"
    runner_id: RunnerId
    runner_status: RunnerStatus


class NodeGatheredInfo(FrozenModel):
    kind: Literal["NodeGatheredInfo"] = "NodeGatheredInfo"
    node_id: NodeId
    info: NodeInfo


class NodeTimedOut(FrozenModel):
    kind: Literal["NodeTimedOut"] = "NodeTimedOut"
    node_id: NodeId


class NodeDownloadProgress(FrozenModel):
    kind: Literal["NodeDownloadProgress"] = "NodeDownloadProgress"
    node_id: NodeId
    model_id: ModelId
    progress: DownloadProgress


class TopologyEdgeCreated(FrozenModel):
    kind: Literal["TopologyEdgeCreated"] = "TopologyEdgeCreated"
    connection: Connection


class TopologyEdgeDeleted(FrozenModel):
    kind: Literal["TopologyEdgeDeleted"] = "TopologyEdgeDeleted"
    connection: Connection


class ChunkGenerated(FrozenModel):
    """A piece of a response. Routed straight to the requesting API, never logged."""

    kind: Literal["ChunkGenerated"] = "ChunkGenerated"
    command_id: CommandId
    chunk: Chunk


class DownloadActionRequested(FrozenModel):
    """A node is asked to start, cancel or delete a model's download (the node acts; a
    deletion also forgets the node's download entry)."""

    kind: Literal["DownloadActionRequested"] = "DownloadActionRequested"
    node_id: NodeId
    action: Literal["start", "cancel", "delete"]
    model_card: ModelCard


class MergeReported(FrozenModel):
    """A node dropped events of its log to follow the master's (see ``MergeReport``);
    sent by that node once it has started again from the master's state."""

    kind: Literal["MergeReported"] = "MergeReported"
    report: MergeReport


class CommandRefused(FrozenModel):
    """A command recorded as refused, and why (words its client can read): so that its
    id is in the log once although it was not applied. Written for a command a merge
    dropped that is not run again (a generation cut by the merge, a cancellation, a
    deletion of an instance the winner had deleted already: ``cluster.resubmit``)."""

    kind: Literal["CommandRefused"] = "CommandRefused"
    command_id: CommandId
    reason: str


Event = Annotated[
    TaskCreated
    | TaskAcknowledged
    | TaskStatusUpdated
    | InstanceCreated
    | InstanceDeleted
    | RunnerStatusUpdated
    | NodeGatheredInfo
    | NodeTimedOut
    | NodeDownloadProgress
    | DownloadActionRequested
    | TopologyEdgeCreated
    | TopologyEdgeDeleted
    | MergeReported
    | CommandRefused
    | ChunkGenerated,
    Field(discriminator="kind"),
]


class IndexedEvent(FrozenModel):
    """An event with its place in the master's log."""

    idx: int = Field(ge=0)
    event: Event
    command_id: CommandId | None = None
    """The command the master was handling when it wrote this event (None: an event
    from a worker or the master itself). Kept in the replicated log, so that any later
    master knows which commands were applied and applies a retried one at most once."""
