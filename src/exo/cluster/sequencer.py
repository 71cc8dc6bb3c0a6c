"""The master's side of the link: while this node is the master, a ``Master`` that
continues from this node's log sequences commands and every node's local events, applies
each here and publishes it to every node; it keeps the state's membership in step with
the live nodes, and answers other nodes' requests (commands, local events, catch-up).

A command the master already handled (this one or an earlier one: the log says) is
acknowledged, not handled twice. An event the master cannot sequence (it cannot be
applied or written) is refused whole: the log and the master's state stay as they were,
and it counts as done (retrying would fail again and hold up everything queued behind
it). Whatever part of it reached this node's own state is undone by a resync from the
master's state, so no node keeps a state the log does not have."""

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from loguru import logger

from exo.cluster.catch_up import catch_up_reply
from exo.cluster.host import ClusterHost
from exo.cluster.lineage import Epoch, extended
from exo.cluster.membership import membership_events
from exo.cluster.messages import (
    EVENTS,
    Ack,
    CatchUpReply,
    CatchUpRequest,
    CommandMsg,
    EventMsg,
    LocalEventsMsg,
)
from exo.cluster.network import ClusterNetwork
from exo.cluster.presence import Peers
from exo.cluster.replica import Replica
from exo.master.main import Master
from exo.shared.types.commands import Command
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import Event, IndexedEvent, NodeTimedOut, TopologyEdgeCreated
from exo.utils.channels import channel
from exo.utils.flood_gate import FloodGate

PEER_EVENTS_PER_S = 500.0
PEER_EVENTS_BURST = 4000.0
"""Local events the master takes from one peer: sustained per second, and at once."""
REMEMBERED_COMMANDS = 10_000
"""Commands the master remembers having handled (a retry of an older one is rare)."""


class NotMaster(Exception):
    """This node is not the master (any more): ask the one the election chose."""


class Sequencer:
    def __init__(
        self,
        host: ClusterHost,
        replica: Replica,
        peers: Peers,
        network: Callable[[], ClusterNetwork],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._host = host
        self._clock = clock
        self.event_gate = FloodGate(PEER_EVENTS_PER_S, PEER_EVENTS_BURST)
        self._replica = replica
        self._peers = peers
        self._network = network
        self.node_id = host.node_id
        self.master: Master | None = None
        self.epoch: Epoch | None = None
        self._handled: OrderedDict[CommandId, None] = OrderedDict()

    @property
    def is_master(self) -> bool:
        return self.master is not None

    async def take_over(self, term: int, on_master: Callable[[], None]) -> None:
        """Become the master of ``term`` from the end of this node's log; ``on_master``
        runs while the log is still locked."""
        async with self._replica.lock:
            start = self._replica.last_idx + 1
            self.epoch = Epoch(term=term, master=self.node_id, start_idx=start)
            self._replica.save(term, extended(self._replica.lineage, self.epoch))
            self.master = Master(
                node_id=self.node_id,
                commands=channel[tuple[Command, NodeId | None]]()[1],
                local_events=channel[Event]()[1],
                publish=self._publish,
                send_chunk=self._host.deliver_chunk,
                resolve_card=self._host.resolve_card,
                log=self._replica.log,
                state=self._host.state(),
            )
            on_master()
            # Commands any earlier master applied (the log says): a retry is not applied
            # again. Only those: what this node handled as an earlier master and a merge
            # dropped since is not in its log, and comes back re-submitted.
            self._handled.clear()
            for command_id in self._replica.log.command_ids(REMEMBERED_COMMANDS):
                self.remember(command_id)
        logger.info(f"cluster: {self.node_id} is the master (term {term}) from event {start}")

    async def step_down(self) -> None:
        async with self._replica.lock:
            self.master = None
            self.epoch = None
        logger.warning(f"cluster: {self.node_id} steps down as master")

    async def _publish(self, indexed: IndexedEvent) -> None:
        """The master's publish: apply here, then send to every node."""
        await self._host.apply_event(indexed)
        logger.debug(f"cluster: event {indexed.idx}: {type(indexed.event).__name__}")
        if self.epoch is not None:
            await self._network().publish(EVENTS, EventMsg(epoch=self.epoch, event=indexed))

    async def reconcile(self) -> None:
        """Emit what makes the state's membership match the live nodes."""
        live = self._peers.live()
        async with self._replica.lock:
            master = self.master
            if master is None:
                return
            for event in membership_events(master.state, live):
                logger.info(f"cluster: {type(event).__name__} {_describe(event)}")
                await master.emit(event)

    async def _as_master(self, action: Callable[[Master], Awaitable[None]]) -> bool:
        """Run ``action`` on this node's master; False when this node is not the master.
        A failure is a refusal (see the module's note): this node re-syncs. (A log that
        cannot take a write is no failure here: the master refuses that command to its
        requester, or ``emit_all`` does not accept those events, and nothing changed.)"""
        async with self._replica.lock:
            master = self.master
            if master is None:
                return False
            try:
                await action(master)
            except Exception:
                logger.exception(
                    "cluster: the master refused an event it could not sequence; "
                    f"this node re-syncs to the master's state at event "
                    f"{master.state.last_event_applied_idx}"
                )
                self._host.replace_state(master.state)
            return True

    async def submit(
        self, command: Command, origin: NodeId | None, *, resubmitted: bool = False
    ) -> bool:
        """Sequence ``command`` (once); False when this node is not the master.
        ``resubmitted``: a merge dropped it (its refusal is logged: ``CommandMsg``)."""

        async def submit(master: Master) -> None:
            if command.command_id in self._handled:
                logger.info(f"cluster: command {command.command_id} was applied already")
                return  # a retry of a command this master (or an earlier one) applied
            self.remember(command.command_id)
            refusal = await master.submit(command, origin, log_refusal=resubmitted)
            if refusal is not None and refusal.kind == "log_full":
                # Refused unwritten (its requester heard why): a retry may be applied.
                self._handled.pop(command.command_id, None)

        return await self._as_master(submit)

    def remember(self, command_id: CommandId) -> None:
        self._handled[command_id] = None
        self._handled.move_to_end(command_id)
        while len(self._handled) > REMEMBERED_COMMANDS:
            self._handled.popitem(last=False)

    async def emit_all(self, events: list[Event]) -> bool:
        """Sequence ``events`` in order; False when this node is not the master, or its
        log cannot take them now."""

        written = [True]

        async def emit(master: Master) -> None:
            for event in events:
                if await master.emit(event) is not None:  # the log cannot take it now
                    written[0] = False
                    return

        # Not accepted while the log cannot take them: the sender retries later (those
        # before the refused one come again; a node's events say how things are now).
        return await self._as_master(emit) and written[0]

    async def serve_command(self, msg: CommandMsg) -> Ack:
        if msg.origin is not None:
            self._peers.contacted(msg.origin)
        return Ack(accepted=await self.submit(msg.command, msg.origin,
                                              resubmitted=msg.resubmitted))

    async def serve_local_events(self, msg: LocalEventsMsg) -> Ack:
        self._peers.contacted(msg.node_id)
        now = self._clock()
        if not self.event_gate.admit(msg.node_id, len(msg.events), now):
            # A flood: refused (an honest sender retries the batch later), counted, and
            # logged at most once a second.
            if (dropped := self.event_gate.report(msg.node_id, now)) is not None:
                logger.warning(f"cluster: {msg.node_id} sends local events faster than "
                               f"{self.event_gate.rate_per_s:g}/s: {dropped} refused since the last report")
            return Ack(accepted=False)
        return Ack(accepted=await self.emit_all(msg.events))

    async def serve_catch_up(self, request: CatchUpRequest) -> CatchUpReply:
        async with self._replica.lock:
            if self.master is None:
                raise NotMaster(f"{self.node_id} is not the master")
            return catch_up_reply(self._replica, self.master.state, request)


def _describe(event: Event) -> str:
    match event:
        case TopologyEdgeCreated():
            return f"{event.connection.source} -> {event.connection.sink}"
        case NodeTimedOut():
            return str(event.node_id)
        case _:
            return ""
