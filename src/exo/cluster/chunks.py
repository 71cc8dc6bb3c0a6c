"""Response chunks between nodes: each goes point-to-point to the node that took its
request (not through the log: chunks are not state)."""

from collections.abc import Callable

from exo.cluster.host import ClusterHost
from exo.cluster.messages import CHUNKS
from exo.cluster.network import ClusterNetwork, Inbox
from exo.shared.types.common import NodeId
from exo.shared.types.events import ChunkGenerated
from exo.utils.channels import channel


class ChunkPost:
    def __init__(self, host: ClusterHost, network: Callable[[], ClusterNetwork]) -> None:
        self._host = host
        self._network = network
        self._tx, self._rx = channel[tuple[NodeId, ChunkGenerated]]()

    def send(self, origin: NodeId, event: ChunkGenerated) -> None:
        """Queue a chunk for the node that took its request."""
        self._tx.send_nowait((origin, event))

    async def send_queued(self) -> None:
        async for origin, event in self._rx:
            await self._network().send_to(CHUNKS, origin, event)

    async def receive(self, chunks: Inbox[ChunkGenerated]) -> None:
        """Hand every chunk that comes to its request on this node."""
        async for event in chunks:
            self._host.deliver_chunk(event, None)
