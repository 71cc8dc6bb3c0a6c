"""MasterDelivery to the master: commands and this node's local events go to the master by
request/reply and are retried (in order) until a master accepts them, so a failover loses
none; a command that finds no master within ``command_timeout_s`` fails with an error for
its requester. On the master itself they go straight to its sequencer.

A node sends its own info when it joins (and again whenever the state lacks it), and
tells each new master its runners' statuses, which that master may have missed."""

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from loguru import logger

from exo.cluster.config import ClusterConfig
from exo.cluster.host import ClusterHost
from exo.cluster.messages import COMMANDS, LOCAL_EVENTS, Ack, CommandMsg, LocalEventsMsg
from exo.cluster.network import ClusterNetwork
from exo.cluster.pending import PendingResubmissions
from exo.cluster.resubmit import Resubmission
from exo.cluster.sequencer import Sequencer
from exo.routing import Endpoint, RequestError
from exo.shared.types.chunks import error_chunk
from exo.shared.types.commands import Command
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import ChunkGenerated, Event, NodeGatheredInfo
from exo.utils.channels import Receiver, channel

Req = TypeVar("Req")

LOCAL_BATCH = 256
"""Local events sent to the master in one request, at most."""


class MasterDelivery:
    def __init__(
        self,
        config: ClusterConfig,
        host: ClusterHost,
        sequencer: Sequencer,
        clock: Callable[[], float],
        network: Callable[[], ClusterNetwork],
        *,
        master: Callable[[], NodeId | None],
        wait_master_change: Callable[[float], Awaitable[None]],
        pending: PendingResubmissions | None = None,
    ) -> None:
        """``master``: whom the election chose; ``sequencer``: this node's own master
        side, for when that is this node; ``pending``: re-submissions kept across
        restarts (those an earlier run left are sent first)."""
        self._config = config
        self._host = host
        self._sequencer = sequencer
        self._clock = clock
        self._network = network
        self._master = master
        self._wait_master_change = wait_master_change
        self.node_id = host.node_id
        self._outgoing_tx, self._outgoing_rx = channel[Event]()
        self._again_tx, self._again_rx = channel[Command]()
        self.resubmitted: list[CommandId] = []
        """Every command this node re-submitted after a merge dropped it (in order)."""
        self._pending = pending or PendingResubmissions(None)
        for command in self._pending.commands:
            self._again_tx.send_nowait(command)
        self._info_sent_at = clock()  # the node reports its info as it starts

    def queue(self, event: Event) -> None:
        """Send ``event`` to the master (after those queued before it)."""
        self._outgoing_tx.send_nowait(event)

    def queue_local_truth(self, *, full: bool) -> None:
        """Queue what the master may lack about this node; its info only when none was
        sent for a node timeout (one on its way would do)."""
        now = self._clock()
        for event in self._host.local_truth(full):
            if isinstance(event, NodeGatheredInfo):
                if now - self._info_sent_at < self._config.node_timeout_s:
                    continue
                self._info_sent_at = now
            self.queue(event)

    async def pump_local_events(self, local_events: Receiver[Event]) -> None:
        async for event in local_events:
            if isinstance(event, NodeGatheredInfo):
                self._info_sent_at = self._clock()
            self.queue(event)

    async def forward_commands(self, commands: Receiver[tuple[Command, NodeId | None]]) -> None:
        async for command, origin in commands:
            await self._deliver_command(command, origin)

    @property
    def resubmitting(self) -> int:
        """Re-submitted commands not yet taken by a master."""
        return len(self._pending.commands)

    def resubmit(self, again: Resubmission) -> None:
        """Send the master the commands a merge drops from this node's log (kept on disk
        first: the caller drops their events next)."""
        self._pending.add(again.commands)
        for command in again.commands:
            self.resubmitted.append(command.command_id)
            self._again_tx.send_nowait(command)

    async def forward_resubmissions(self) -> None:
        """Re-submitted commands, in order, each until a master takes it (a master that
        has it already says so); this node stands for their origin (their clients were
        answered when they were first applied)."""
        async for command in self._again_rx:
            while not await self._command_to_master(command, self.node_id, resubmitted=True):
                await self._wait_master_change(self._config.heartbeat_interval_s)
            self._pending.taken(command.command_id)

    async def _deliver_command(self, command: Command, origin: NodeId | None) -> None:
        deadline = self._clock() + self._config.command_timeout_s
        while not await self._command_to_master(command, origin):
            if self._clock() >= deadline:
                message = f"no cluster master within {self._config.command_timeout_s:g} s"
                logger.warning(f"command {type(command).__name__}: {message}")
                chunk = error_chunk(message)
                self._host.deliver_chunk(
                    ChunkGenerated(command_id=command.command_id, chunk=chunk), origin
                )
                return
            await self._wait_master_change(self._config.heartbeat_interval_s)

    async def _command_to_master(
        self, command: Command, origin: NodeId | None, *, resubmitted: bool = False
    ) -> bool:
        master = self._master()
        if master is None:
            return False
        if master == self.node_id:
            return await self._sequencer.submit(command, origin, resubmitted=resubmitted)
        message = CommandMsg(command=command, origin=origin, resubmitted=resubmitted)
        return await self._ask(COMMANDS, message, master)

    async def forward_local_events(self) -> None:
        batch: list[Event] = []
        while True:
            if not batch:
                batch.append(await self._outgoing_rx.receive())
            while len(batch) < LOCAL_BATCH:
                try:
                    batch.append(self._outgoing_rx.receive_nowait())
                except anyio.WouldBlock:
                    break
            if await self._events_to_master(batch):
                batch = []
            else:
                await self._wait_master_change(self._config.heartbeat_interval_s)

    async def _events_to_master(self, events: list[Event]) -> bool:
        master = self._master()
        if master is None:
            return False
        if master == self.node_id:
            return await self._sequencer.emit_all(events)
        message = LocalEventsMsg(node_id=self.node_id, events=events)
        return await self._ask(LOCAL_EVENTS, message, master)

    async def _ask(self, endpoint: Endpoint[Req, Ack], message: Req, master: NodeId) -> bool:
        try:
            ack = await self._network().request(
                endpoint, message, target=master, timeout=self._config.request_timeout_s
            )
        except RequestError as e:
            logger.debug(f"cluster: {endpoint} to {master}: {e}")
            return False
        return ack.accepted
