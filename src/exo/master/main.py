"""The master: the single writer. It turns commands and workers' events into indexed
events, applies them, keeps them in its log and publishes them to every node.

What a command or an event becomes is decided by the pure ``decide`` module; this shell
resolves the card a placement needs, hands out fresh ids, sequences what was decided
(log first, then state, then publish) and tells a requester why its command was refused.

When a node times out, the instances that had a shard on it go with it (``apply``); the
master places each of their models again on the nodes that remain, or logs why it cannot.

A log that cannot take a write (a full disk) refuses the command whose events it could
not hold (``log_full``: the client hears it, HTTP 507) and leaves the state as it was;
the node stays up, read-only, and each later command tries again, so it recovers by
itself once space returns. The failure is logged once, and its end once."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from loguru import logger

from exo.master.decide import (
    Fresh,
    Refusal,
    admit,
    decide,
    next_port_offset,
    replacements,
)
from exo.master.event_log import EventLog, MemoryEventLog
from exo.shared.apply import apply
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.chunks import error_chunk
from exo.shared.types.commands import Command, PlaceInstance
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    CommandRefused,
    Event,
    IndexedEvent,
    NodeTimedOut,
)
from exo.shared.types.state import State
from exo.shared.types.tasks import TaskId
from exo.shared.types.worker.instances import InstanceId
from exo.utils.channels import Receiver

Publish = Callable[[IndexedEvent], Awaitable[None]]
SendChunk = Callable[[ChunkGenerated, NodeId | None], None]
ResolveCard = Callable[[ModelId], ModelCard | None]


@dataclass(eq=False)
class Master:
    node_id: NodeId
    commands: Receiver[tuple[Command, NodeId | None]]
    local_events: Receiver[Event]
    publish: Publish
    send_chunk: SendChunk
    resolve_card: ResolveCard
    log: EventLog = field(default_factory=MemoryEventLog)
    state: State = field(default_factory=State)
    group_port_base: int = 29500
    _next_port: int = field(default=0, init=False)
    """Where the search for the next group port starts, from ``group_port_base``."""
    _handling: CommandId | None = field(default=None, init=False)
    """The command being handled: its events carry its id into the log."""
    log_failure: str | None = field(default=None, init=False)
    """Why the last write to the log failed (None: the log takes writes)."""

    async def run(self) -> None:
        logger.info(
            f"master {self.node_id} starting at event {self.state.last_event_applied_idx + 1}"
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._command_loop)
            tg.start_soon(self._event_loop)

    async def _command_loop(self) -> None:
        async for command, origin in self.commands:
            await self.submit(command, origin)

    async def _event_loop(self) -> None:
        async for event in self.local_events:
            await self.emit(event)

    def _fresh(self, ids: int = 1) -> Fresh:
        return Fresh(
            instance_ids=tuple(InstanceId() for _ in range(ids)),
            task_id=TaskId(),
            port_base=self.group_port_base,
            port_offset=self._next_port,
        )

    async def submit(
        self, command: Command, origin: NodeId | None, *, log_refusal: bool = False
    ) -> Refusal | None:
        """Handle a command; a refusal (returned) is an error for its requester. A command
        that fails otherwise is an error for its requester too, and the master stays up.
        ``log_refusal``: a refusal is written to the log instead (``CommandRefused``), for
        a command a merge dropped whose client was answered already."""
        self._handling = command.command_id
        try:
            decided = decide(self.state, command, self._fresh(), self._card_for(command))
            if isinstance(decided, Refusal) and log_refusal and decided.kind != "log_full":
                logger.info(f"command {command.command_id}, re-submitted after a merge, is "
                            f"recorded as refused: {decided.reason}")
                recorded: list[Event] = [
                    CommandRefused(command_id=command.command_id, reason=decided.reason)]
                decided = recorded
            refusal = decided if isinstance(decided, Refusal) else await self._sequence_all(decided)
        except Exception as e:  # a bad command must not take the master down
            logger.opt(exception=e).error(f"command {type(command).__name__} failed")
            self._error(command.command_id, origin, f"{type(e).__name__}: {e}", None)
            return None
        finally:
            self._handling = None
        if refusal is not None:
            self._error(command.command_id, origin, refusal.reason, refusal)
        return refusal

    def _card_for(self, command: Command) -> ModelCard | None:
        if not isinstance(command, PlaceInstance):
            return None
        return command.model_card or self.resolve_card(command.model_id)

    async def emit(self, event: Event) -> Refusal | None:
        """Sequence a node's event (unless ``admit`` drops it); a ``log_full`` refusal when
        the log cannot take it (the state stays as it was: the sender retries later)."""
        if not admit(self.state, event):
            logger.debug(f"dropped {type(event).__name__}: no instance has its runner")
            return None
        before = self.state
        refusal = await self._sequence_all([event])
        if refusal is None and isinstance(event, NodeTimedOut):
            await self._place_again(before, event.node_id)
        return refusal

    async def _place_again(self, before: State, gone: NodeId) -> None:
        """Instances that went with a node, placed again on the nodes left."""
        lost = len(before.instances) - len(self.state.instances)
        for outcome in replacements(before, self.state, gone, self._fresh(max(lost, 1))):
            if isinstance(outcome, Refusal):
                logger.warning(outcome.reason)
                continue
            logger.info(f"an instance lost with node {gone}: placed again as "
                        f"{outcome.instance.instance_id} ({outcome.instance.sharding}, "
                        f"{_count_nodes(outcome.instance.world_size)})")
            if await self._sequence_all([outcome]) is not None:
                return

    async def _sequence_all(self, events: list[Event]) -> Refusal | None:
        """Sequence ``events`` in order; a ``log_full`` refusal at the first the log
        cannot take (those before it stay sequenced)."""
        for event in events:
            try:
                await self._sequence(event)
            except OSError as e:
                return self._log_failed(e)
            self._next_port = next_port_offset(event, self.group_port_base, self._next_port)
        return None

    async def _sequence(self, event: Event) -> None:
        """Give ``event`` the next index: written to the log first, then the master's
        state, then published. An event that cannot be applied or written raises and
        leaves the state and the log as they were (it was never sequenced)."""
        indexed = IndexedEvent(
            idx=self.state.last_event_applied_idx + 1, event=event, command_id=self._handling
        )
        state = apply(self.state, indexed)
        self.log.append(indexed, state)
        if self.log_failure is not None:
            logger.info(f"master: the event log takes writes again (it failed: {self.log_failure})")
            self.log_failure = None
        self.state = state
        await self.publish(indexed)

    def _log_failed(self, error: OSError) -> Refusal:
        reason = f"the event log cannot be written ({error}); nothing was changed"
        if self.log_failure is None:  # logged once, until the log takes writes again
            logger.error(f"master: {reason}: the node is read-only until the log takes "
                         "writes again (free disk space); commands are refused meanwhile")
        self.log_failure = str(error)
        return Refusal(kind="log_full", reason=reason)

    def _error(
        self, command_id: CommandId, origin: NodeId | None, message: str, refusal: Refusal | None
    ) -> None:
        if refusal is None or refusal.kind != "log_full":
            logger.warning(f"command {command_id}: {message}")
        kind = None if refusal is None else refusal.kind
        code = "insufficient_storage" if kind == "log_full" else None
        chunk = error_chunk(message, code=code, refusal=kind)
        self.send_chunk(ChunkGenerated(command_id=command_id, chunk=chunk), origin)


def _count_nodes(n: int) -> str:
    return "1 node" if n == 1 else f"{n} nodes"
