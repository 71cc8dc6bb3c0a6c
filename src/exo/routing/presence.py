"""Presence: which nodes of the cluster are alive, from their liveliness tokens.

Liveliness tokens carry no payload, so they cannot be authenticated like messages: they
live under the secret-derived prefix, which keeps other clusters out but not someone who
reads that prefix off the wire.
"""

from dataclasses import dataclass
from functools import partial

import anyio
from anyio.abc import ObjectReceiveStream
from loguru import logger

from exo.routing.transport import Transport


@dataclass(frozen=True)
class Joined:
    node_id: str


@dataclass(frozen=True)
class Left:
    node_id: str


PresenceEvent = Joined | Left


class PresenceWatch(ObjectReceiveStream[PresenceEvent]):
    """Starts with a Joined for every node alive now (this one included), then follows
    changes. Each node joins and leaves alternately: no repeated events."""

    def __init__(self, transport: Transport, *, buffer: int) -> None:
        self._transport = transport
        self._members: set[str] = set()
        self._send, self._receive = anyio.create_memory_object_stream[PresenceEvent](buffer)
        self._undeclare = transport.session.watch_liveliness(
            transport.keys.alive(None), self._on_change_thread
        )

    @property
    def members(self) -> frozenset[str]:
        """The nodes alive as far as this watch has heard (its events may still be queued)."""
        return frozenset(self._members)

    def _on_change_thread(self, key: str, alive: bool) -> None:
        self._transport.bridge.post(partial(self._on_change, key, alive))

    def _on_change(self, key: str, alive: bool) -> None:
        node_id = self._transport.keys.node_of_alive(key)
        if node_id is None:
            logger.warning(f"ignoring a liveliness token with an unexpected key: {key}")
            return
        if alive == (node_id in self._members):
            return
        if alive:
            self._members.add(node_id)
            event: PresenceEvent = Joined(node_id)
        else:
            self._members.discard(node_id)
            event = Left(node_id)
        self._transport.offer(self._send, event, "presence")

    async def receive(self) -> PresenceEvent:
        return await self._receive.receive()

    def end(self) -> None:
        self._undeclare()
        self._send.close()

    async def aclose(self) -> None:
        self.end()
        self._receive.close()
