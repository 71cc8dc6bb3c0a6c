"""Tasks: the units of work the worker executes (and the master creates for requests)."""

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from exo.shared.types.common import CommandId, FrozenModel, Id, NodeId
from exo.shared.types.text_generation import TextGenerationTaskParams
from exo.shared.types.worker.instances import BoundInstance, InstanceId
from exo.shared.types.worker.runners import RunnerId
from exo.shared.types.worker.shards import ShardMetadata


class TaskId(Id):
    __slots__ = ()


class TaskStatus(StrEnum):
    Pending = "Pending"
    Running = "Running"
    Complete = "Complete"
    Failed = "Failed"
    TimedOut = "TimedOut"
    Cancelled = "Cancelled"


FINISHED_TASK_STATUSES = frozenset(
    {TaskStatus.Complete, TaskStatus.Failed, TaskStatus.TimedOut, TaskStatus.Cancelled}
)

# A CancelTask with this id cancels everything the runner is doing.
CANCEL_ALL_TASKS = TaskId("cancel-all-tasks")


class BaseTask(FrozenModel):
    task_id: TaskId = Field(default_factory=TaskId)
    instance_id: InstanceId
    task_status: TaskStatus = TaskStatus.Pending


class CreateRunner(BaseTask):
    kind: Literal["CreateRunner"] = "CreateRunner"
    bound_instance: BoundInstance


class DownloadModel(BaseTask):
    kind: Literal["DownloadModel"] = "DownloadModel"
    shard_metadata: ShardMetadata


class ConnectToGroup(BaseTask):
    kind: Literal["ConnectToGroup"] = "ConnectToGroup"


class LoadModel(BaseTask):
    kind: Literal["LoadModel"] = "LoadModel"


class StartWarmup(BaseTask):
    kind: Literal["StartWarmup"] = "StartWarmup"


class TextGeneration(BaseTask):
    kind: Literal["TextGeneration"] = "TextGeneration"
    command_id: CommandId
    task_params: TextGenerationTaskParams
    # The node whose API took the request: chunks are sent back to it.
    origin_node_id: NodeId | None = None


class CancelTask(BaseTask):
    kind: Literal["CancelTask"] = "CancelTask"
    cancelled_task_id: TaskId


class Shutdown(BaseTask):
    kind: Literal["Shutdown"] = "Shutdown"
    runner_id: RunnerId


class AbandonInstance(BaseTask):
    """Runner creation for this instance failed too often: ask the master to delete it."""

    kind: Literal["AbandonInstance"] = "AbandonInstance"
    reason: str


Task = Annotated[
    CreateRunner
    | DownloadModel
    | ConnectToGroup
    | LoadModel
    | StartWarmup
    | TextGeneration
    | CancelTask
    | Shutdown
    | AbandonInstance,
    Field(discriminator="kind"),
]
