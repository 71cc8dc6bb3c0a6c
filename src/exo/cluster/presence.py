"""Presence: which nodes are live, as this node sees them.

A node is live while its heartbeats keep coming (within the node timeout) and the network
has not said it left, or while it keeps sending requests to this node (a node that reaches
the master but whose heartbeats do not). The loops here only record what they hear and
call back; what to do about it (elect, catch up, reconcile) is the caller's."""

from collections.abc import Awaitable, Callable

from loguru import logger

from exo.cluster.election import Heard, Heartbeat, live_beats
from exo.cluster.network import Inbox, Presence
from exo.routing import Joined, Left
from exo.shared.types.common import NodeId


class Peers:
    def __init__(self, node_id: NodeId, clock: Callable[[], float], node_timeout_s: float) -> None:
        self.node_id = node_id
        self._clock = clock
        self._timeout = node_timeout_s
        self.heard: dict[NodeId, Heard] = {}
        """The last heartbeat from each node, with when it came."""
        self.gone: set[NodeId] = set()
        """Nodes the network says left (until they are heard again)."""
        self._contact: dict[NodeId, float] = {}

    def contacted(self, node_id: NodeId) -> None:
        """``node_id`` sent this node a request just now."""
        self._contact[node_id] = self._clock()

    def live(self) -> set[NodeId]:
        """The nodes live now, this node included."""
        now = self._clock()
        live = set(live_beats(self.node_id, self.heard, self.gone, now, self._timeout))
        live |= {
            n for n, at in self._contact.items() if now - at <= self._timeout and n not in self.gone
        }
        return live | {self.node_id}

    async def receive_heartbeats(
        self, beats: Inbox[Heartbeat], on_beat: Callable[[Heartbeat], None]
    ) -> None:
        """Record every heartbeat (a node's own only), then ``on_beat``."""
        async for delivery in beats.deliveries():
            beat = delivery.message
            if delivery.sender != beat.node_id:
                logger.warning(f"cluster: {delivery.sender} sent a heartbeat for {beat.node_id}")
                continue
            self.heard[beat.node_id] = Heard(beat, self._clock())
            self.gone.discard(beat.node_id)
            on_beat(beat)

    async def watch(
        self,
        presence: Presence,
        on_left: Callable[[], Awaitable[None]],
        on_joined: Callable[[], Awaitable[None]],
    ) -> None:
        """Record the nodes that leave; call back on every other node's leaving or joining."""
        async for change in presence:
            match change:
                case Left(node_id=node_id) if node_id != self.node_id:
                    if node_id in self.heard:  # not an observer
                        logger.info(f"cluster: node {node_id} left")
                    self.gone.add(NodeId(node_id))
                    await on_left()
                case Joined(node_id=node_id) if node_id != self.node_id:
                    await on_joined()
                case Left() | Joined():
                    pass
