"""What the cluster link needs from the node it runs in."""

from typing import Protocol

from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.common import NodeId
from exo.shared.types.events import ChunkGenerated, Event, IndexedEvent
from exo.shared.types.state import State


class ClusterHost(Protocol):
    @property
    def node_id(self) -> NodeId: ...

    def state(self) -> State:
        """The state this node has applied."""
        ...

    async def apply_event(self, indexed: IndexedEvent) -> None:
        """Apply the next event of the log to the node's state."""
        ...

    def replace_state(self, state: State) -> None:
        """Start again from ``state`` (a snapshot from the master's log)."""
        ...

    def deliver_chunk(self, event: ChunkGenerated, origin: NodeId | None) -> None:
        """Hand a chunk to the request it answers, on ``origin`` (None: this node)."""
        ...

    def set_in_sync(self, in_sync: bool) -> None:
        """Whether this node's state is caught up with the cluster's (it follows a
        master and has caught up with it, or it is the master); act only while it is."""
        ...

    def resolve_card(self, model_id: ModelId) -> ModelCard | None: ...

    def local_truth(self, full: bool) -> list[Event]:
        """Events that make the state agree with this node as it is: its info when the
        state lacks it; with ``full``, its runners' statuses and its downloads' progress
        where the state differs (sent to a new master, which may have missed some, or after
        a merge dropped them)."""
        ...
