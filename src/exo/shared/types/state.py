"""The replicated state every node holds: a fold of the master's event log."""

from collections.abc import Mapping

from exo.shared.models.model_cards import ModelId
from exo.shared.types.common import FrozenModel, NodeId
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.tasks import Task, TaskId
from exo.shared.types.topology import Topology
from exo.shared.types.worker.downloads import DownloadProgress
from exo.shared.types.worker.instances import Instance, InstanceId
from exo.shared.types.worker.runners import RunnerId, RunnerStatus


class State(FrozenModel):
    instances: Mapping[InstanceId, Instance] = {}
    runners: Mapping[RunnerId, RunnerStatus] = {}
    tasks: Mapping[TaskId, Task] = {}
    downloads: Mapping[NodeId, Mapping[ModelId, DownloadProgress]] = {}
    nodes: Mapping[NodeId, NodeInfo] = {}
    topology: Topology = Topology()
    last_event_applied_idx: int = -1
