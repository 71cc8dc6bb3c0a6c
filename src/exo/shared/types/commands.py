"""Commands: requests to the master, which answers them with events."""

from typing import Annotated, Literal

from pydantic import Field

from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.common import CommandId, FrozenModel, NodeId
from exo.shared.types.text_generation import TextGenerationTaskParams
from exo.shared.types.worker.instances import Instance, InstanceId, Sharding


class PlaceInstance(FrozenModel):
    kind: Literal["PlaceInstance"] = "PlaceInstance"
    command_id: CommandId = Field(default_factory=CommandId)
    model_id: ModelId
    sharding: Sharding = "pipeline"
    min_nodes: int = Field(default=1, ge=1)
    model_card: ModelCard | None = None
    """A card the master may not know (built from the hub by the node that took the
    request); placed as given."""
    unless_present: bool = False
    """Place only if the state has no instance of the model yet (the start model of the
    CLI, a request that needs the model): such placements checked the state where they
    were sent, and two of them racing must not make two instances. The master decides,
    so the check holds across nodes and failovers."""


class CreateInstance(FrozenModel):
    kind: Literal["CreateInstance"] = "CreateInstance"
    command_id: CommandId = Field(default_factory=CommandId)
    instance: Instance


class DeleteInstance(FrozenModel):
    kind: Literal["DeleteInstance"] = "DeleteInstance"
    command_id: CommandId = Field(default_factory=CommandId)
    instance_id: InstanceId
    reason: str = "deleted by request"


class GenerateText(FrozenModel):
    kind: Literal["GenerateText"] = "GenerateText"
    command_id: CommandId = Field(default_factory=CommandId)
    task_params: TextGenerationTaskParams
    origin_node_id: NodeId


class CancelCommand(FrozenModel):
    kind: Literal["CancelCommand"] = "CancelCommand"
    command_id: CommandId = Field(default_factory=CommandId)
    cancelled_command_id: CommandId


DownloadActionKind = Literal["start", "cancel", "delete"]


class DownloadAction(FrozenModel):
    """Start, cancel or delete (free the disk of) a model's download on one node."""

    kind: Literal["DownloadAction"] = "DownloadAction"
    command_id: CommandId = Field(default_factory=CommandId)
    action: DownloadActionKind
    node_id: NodeId
    model_card: ModelCard


class RecordRefusal(FrozenModel):
    """Record command ``command_id`` as refused (``reason``, for its client) rather than
    apply it: how a node re-submits a command a merge dropped that must not run again
    (``cluster.resubmit``). The master logs a ``CommandRefused`` under that id, once."""

    kind: Literal["RecordRefusal"] = "RecordRefusal"
    command_id: CommandId
    reason: str


Command = Annotated[
    PlaceInstance
    | CreateInstance
    | DeleteInstance
    | GenerateText
    | CancelCommand
    | DownloadAction
    | RecordRefusal,
    Field(discriminator="kind"),
]
