"""The replicated state every node holds: a fold of the master's event log."""

from collections.abc import Mapping

from exo.shared.models.model_cards import ModelId
from exo.shared.types.common import CommandId, FrozenModel, NodeId
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.tasks import Task, TaskId
from exo.shared.types.topology import Topology
from exo.shared.types.worker.downloads import DownloadProgress
from exo.shared.types.worker.instances import Instance, InstanceId
from exo.shared.types.worker.runners import RunnerId, RunnerStatus


class MergeReport(FrozenModel):
    """What a node dropped from its log when it rejoined a master whose log differs
    (a partition where both sides wrote, or a master that died with unconfirmed events):
    the master's log won, and these events of the node's are gone."""

    node_id: NodeId
    """The node whose events were dropped."""
    first_idx: int
    last_idx: int
    dropped_events: int
    event_kinds: tuple[str, ...]
    """The kinds of the dropped events (empty when the node no longer held them)."""
    command_ids: tuple[CommandId, ...]
    """The commands behind the dropped events: acknowledged there, undone by the merge."""


class State(FrozenModel):
    instances: Mapping[InstanceId, Instance] = {}
    runners: Mapping[RunnerId, RunnerStatus] = {}
    tasks: Mapping[TaskId, Task] = {}
    downloads: Mapping[NodeId, Mapping[ModelId, DownloadProgress]] = {}
    nodes: Mapping[NodeId, NodeInfo] = {}
    topology: Topology = Topology()
    last_merge_report: MergeReport | None = None
    """The latest merge that dropped events (None: none since the log began)."""
    last_event_applied_idx: int = -1
