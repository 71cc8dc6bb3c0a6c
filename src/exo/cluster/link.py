"""The cluster link: this node's part in a cluster, over the router.

Every node announces a heartbeat, follows the election (``election.step``), keeps its own
copy of the log (``Replica``) and serves the master's endpoints (answering "not the
master" while it is not). The master sequences commands and every node's local events
with a ``Master`` that continues from this node's log; followers apply what it publishes
in index order, and ask it for what they missed:

* **Catch-up.** A follower that sees a gap, lags behind the master's heartbeat, or starts
  following a new master asks for the events after its log, telling where its log ends
  and its lineage. The master answers with the next page; with its current state (the
  snapshot plus the tail, applied) when the follower's log is older than the master keeps,
  or diverged from its own, or is ahead of it. Rule: *the master's log is the truth.*
  A new master is by construction the most up-to-date live node, so a follower is only
  ahead of it with events no live node confirmed (a dead master's last ones, or a node
  that comes back from a partition): it drops them and starts again from the master's
  state; nothing wedges.
* **Presence.** The master emits ``NodeTimedOut`` for every node the state knows that is
  not live (gone from liveliness, or silent for the node timeout) and links every two
  live nodes that reported their info (``membership``). A node sends its own info when it
  joins (and again whenever the state lacks it), and tells each new master its runners'
  statuses, which that master may have missed.
* **Delivery.** Commands and local events go to the master by request/reply and are
  retried (in order) until a master accepts them, so a failover loses none; a command
  that finds no master within ``command_timeout_s`` fails with an error for its
  requester. A command the master already handled is acknowledged, not handled twice.
  Response chunks go point-to-point to the node that took the request.
"""

import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TypeVar

import anyio
from anyio.abc import TaskStatus
from loguru import logger

from exo.cluster.config import ClusterConfig
from exo.cluster.election import Election, Heard, Heartbeat, live_beats, step
from exo.cluster.host import ClusterHost
from exo.cluster.lineage import Epoch, agreed_prefix, extended
from exo.cluster.membership import membership_events
from exo.cluster.messages import (
    CATCH_UP,
    CHUNKS,
    COMMANDS,
    EVENTS,
    HEARTBEATS,
    LOCAL_EVENTS,
    Ack,
    CatchUpReply,
    CatchUpRequest,
    CommandMsg,
    EventMsg,
    LocalEventsMsg,
)
from exo.cluster.network import ClusterNetwork, Inbox, OpenNetwork, Presence
from exo.cluster.replica import Replica
from exo.cluster.store import ElectionStore
from exo.master.event_log import SqliteEventLog
from exo.master.main import Master
from exo.routing import Endpoint, Joined, Left, RequestError, Router
from exo.shared.types.chunks import error_chunk
from exo.shared.types.commands import Command
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    Event,
    IndexedEvent,
    MergeReported,
    NodeGatheredInfo,
    NodeTimedOut,
    TopologyEdgeCreated,
)
from exo.utils.channels import Receiver, channel
from exo.utils.wakeup import Wakeup

Req = TypeVar("Req")

PAGE = 2000
"""Events per catch-up reply."""
MAX_BUFFERED = 10_000
"""Out-of-order events a follower holds before it drops them and catches up instead."""
REMEMBERED_COMMANDS = 10_000
LOCAL_BATCH = 256
GAP_WAIT_S = 0.02
"""How long a follower that sees a gap waits for the missing event before it asks."""


class NotMaster(Exception):
    """This node is not the master (any more): ask the one the election chose."""


class ClusterLink:
    def __init__(
        self,
        config: ClusterConfig,
        host: ClusterHost,
        log: SqliteEventLog,
        store: ElectionStore,
        commands: Receiver[tuple[Command, NodeId | None]],
        local_events: Receiver[Event],
        *,
        clock: Callable[[], float] = time.monotonic,
        network: OpenNetwork | None = None,
    ) -> None:
        """``clock`` and ``network`` are the real ones unless given (the simulator gives
        a virtual clock and a simulated network): the monotonic clock, and a zenoh router
        for ``config``."""
        self.config = config
        self._clock = clock
        self._open_network: OpenNetwork = network or (
            lambda: Router(config.routing(host.node_id))
        )
        self.host = host
        self.node_id = host.node_id
        self.replica = Replica(host, log, store)
        self.election = Election.start(
            self.node_id, config.force_master, self.replica.term, clock()
        )
        self.ready = anyio.Event()
        """Set once this node follows a master and has caught up, or is the master."""
        self.listen_endpoints: list[str] = []
        self._commands = commands
        self._local_events = local_events
        self._outgoing_tx, self._outgoing_rx = channel[Event]()
        self._chunks_tx, self._chunks_rx = channel[tuple[NodeId, ChunkGenerated]]()
        self._heard: dict[NodeId, Heard] = {}
        self._gone: set[NodeId] = set()
        self._contact: dict[NodeId, float] = {}
        self._master: Master | None = None
        self._epoch: Epoch | None = None
        self._synced = False
        self._buffer: dict[int, tuple[NodeId, EventMsg]] = {}
        self._master_was_at = -1
        self._info_sent_at = clock()  # the node reports its info as it starts
        self._handled: OrderedDict[CommandId, None] = OrderedDict()
        self._elect = Wakeup()
        self._catch_up = Wakeup()
        self._master_changed = anyio.Event()
        self._router_: ClusterNetwork | None = None

    # -- public ------------------------------------------------------------------------

    @property
    def master_id(self) -> NodeId | None:
        return self.election.master

    @property
    def is_master(self) -> bool:
        return self._master is not None

    def send_chunk(self, origin: NodeId, event: ChunkGenerated) -> None:
        """Send a chunk to the node that took its request."""
        self._chunks_tx.send_nowait((origin, event))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with AsyncExitStack() as stack:
            try:
                router = await stack.enter_async_context(self._open_network())
            except Exception as e:  # zenoh's own error type: endpoints, ports, config
                raise SystemExit(
                    f"exo: cannot join the cluster network: {_readable(e)}"
                ) from e
            self._router_ = router
            self.listen_endpoints = router.listen_endpoints
            beats = router.subscribe(HEARTBEATS, include_self=False)
            events = router.subscribe(EVENTS, include_self=False)
            chunks = router.subscribe_direct(CHUNKS)
            presence = router.presence()
            async with anyio.create_task_group() as tg:
                await tg.start(router.serve, COMMANDS, self._serve_command)
                await tg.start(router.serve, LOCAL_EVENTS, self._serve_local_events)
                await tg.start(router.serve, CATCH_UP, self._serve_catch_up)
                tg.start_soon(self._receive_heartbeats, beats)
                tg.start_soon(self._receive_events, events)
                tg.start_soon(self._receive_chunks, chunks)
                tg.start_soon(self._watch_presence, presence)
                tg.start_soon(self._election_loop)
                tg.start_soon(self._heartbeat_loop)
                tg.start_soon(self._catch_up_loop)
                tg.start_soon(self._pump_local_events)
                tg.start_soon(self._forward_local_events)
                tg.start_soon(self._forward_commands)
                tg.start_soon(self._send_chunks)
                logger.info(
                    f"cluster: node {self.node_id} listening on "
                    f"{', '.join(self.listen_endpoints)}; log at event {self.replica.last_idx}"
                )
                task_status.started()

    @property
    def _router(self) -> ClusterNetwork:
        if self._router_ is None:
            raise RuntimeError("the cluster link is not running")
        return self._router_

    # -- election ----------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await self._send_heartbeat()
            if self._master is not None:
                await self._reconcile()
            self._check_own_info()
            await anyio.sleep(self.config.heartbeat_interval_s)

    async def _send_heartbeat(self) -> None:
        beat = self.election.heartbeat(self.replica.last_idx, self.replica.log_term)
        await self._router.publish(HEARTBEATS, beat)

    async def _receive_heartbeats(self, beats: Inbox[Heartbeat]) -> None:
        async for delivery in beats.deliveries():
            beat = delivery.message
            if delivery.sender != beat.node_id:
                logger.warning(f"cluster: {delivery.sender} sent a heartbeat for {beat.node_id}")
                continue
            self._heard[beat.node_id] = Heard(beat, self._clock())
            self._gone.discard(beat.node_id)
            if beat.node_id == self.election.master:
                self._check_lag(beat.last_idx)
            self._elect.set()

    async def _watch_presence(self, presence: Presence) -> None:
        async for change in presence:
            match change:
                case Left(node_id=node_id) if node_id != self.node_id:
                    if node_id in self._heard:  # not an observer
                        logger.info(f"cluster: node {node_id} left")
                    self._gone.add(NodeId(node_id))
                    self._elect.set()
                    if self._master is not None:
                        await self._reconcile()
                case Joined(node_id=node_id) if node_id != self.node_id:
                    await self._send_heartbeat()  # so that it learns the master at once
                case Left() | Joined():
                    pass

    async def _election_loop(self) -> None:
        while True:
            await self._elect.wait(self.config.heartbeat_interval_s / 2)
            await self._run_election()

    async def _run_election(self) -> None:
        before = self.election
        after = step(
            before,
            self.replica.last_idx,
            self._heard,
            self._gone,
            self._clock(),
            self.config.timing,
            log_term=self.replica.log_term,
        )
        self.election = after
        if after.master == before.master:
            self.replica.save(after.term)
            return
        if before.master == self.node_id:
            await self._step_down()
        if after.master == self.node_id:
            await self._take_over(after.term)
        else:
            self.replica.save(after.term)
            self._follow(after.master)
        self._master_changed.set()
        self._master_changed = anyio.Event()
        await self._send_heartbeat()
        if self._master is not None:
            await self._reconcile()
            self._queue_local_truth(full=True)

    async def _take_over(self, term: int) -> None:
        async with self.replica.lock:
            start = self.replica.last_idx + 1
            self._epoch = Epoch(term=term, master=self.node_id, start_idx=start)
            self.replica.save(term, extended(self.replica.lineage, self._epoch))
            self._master = Master(
                node_id=self.node_id,
                commands=channel[tuple[Command, NodeId | None]]()[1],
                local_events=channel[Event]()[1],
                publish=self._publish,
                send_chunk=self.host.deliver_chunk,
                resolve_card=self.host.resolve_card,
                log=self.replica.log,
                state=self.host.state(),
            )
            self._buffer.clear()
            self._synced = True
            # Commands any earlier master applied (the log says): a retry is not applied again.
            for command_id in self.replica.log.command_ids(REMEMBERED_COMMANDS):
                self._remember(command_id)
        logger.info(f"cluster: {self.node_id} is the master (term {term}) from event {start}")
        self.host.set_in_sync(True)
        self.ready.set()

    async def _step_down(self) -> None:
        async with self.replica.lock:
            self._master = None
            self._epoch = None
        logger.warning(f"cluster: {self.node_id} steps down as master")

    def _follow(self, master: NodeId | None) -> None:
        self._synced = False
        self.host.set_in_sync(False)
        self._master_was_at = -1
        self._buffer = {i: item for i, item in self._buffer.items() if item[0] == master}
        if master is None:
            logger.info("cluster: no master; electing")
            return
        logger.info(f"cluster: following master {master}")
        self._catch_up.set()

    # -- the master's side -------------------------------------------------------------

    async def _publish(self, indexed: IndexedEvent) -> None:
        """The master's publish: apply here, then send to every node."""
        await self.host.apply_event(indexed)
        logger.debug(f"cluster: event {indexed.idx}: {type(indexed.event).__name__}")
        if self._epoch is not None:
            await self._router.publish(EVENTS, EventMsg(epoch=self._epoch, event=indexed))

    def _live(self) -> set[NodeId]:
        now = self._clock()
        timeout = self.config.node_timeout_s
        live = set(live_beats(self.node_id, self._heard, self._gone, now, timeout))
        live |= {
            n for n, at in self._contact.items() if now - at <= timeout and n not in self._gone
        }
        return live | {self.node_id}

    async def _reconcile(self) -> None:
        live = self._live()
        async with self.replica.lock:
            master = self._master
            if master is None:
                return
            for event in membership_events(master.state, live):
                logger.info(f"cluster: {type(event).__name__} {_describe(event)}")
                await master.emit(event)

    async def _as_master(self, action: Callable[[Master], Awaitable[None]]) -> bool:
        """Run ``action`` on this node's master; False when this node is not the master.

        An event the master cannot sequence (it cannot be applied or written) is refused
        whole: the log and the master's state stay as they were, and it counts as done
        (retrying would fail again and hold up everything queued behind it). Whatever
        part of it reached this node's own state is undone by a resync from the master's
        state, so no node keeps a state the log does not have; followers see only
        sequenced events (one that was not delivered, they fetch by catching up)."""
        async with self.replica.lock:
            master = self._master
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
                self.host.replace_state(master.state)
            return True

    async def _submit(self, command: Command, origin: NodeId | None) -> bool:
        async def submit(master: Master) -> None:
            if command.command_id in self._handled:
                logger.info(f"cluster: command {command.command_id} was applied already")
                return  # a retry of a command this master (or an earlier one) applied
            self._remember(command.command_id)
            await master.submit(command, origin)

        return await self._as_master(submit)

    def _remember(self, command_id: CommandId) -> None:
        self._handled[command_id] = None
        self._handled.move_to_end(command_id)
        while len(self._handled) > REMEMBERED_COMMANDS:
            self._handled.popitem(last=False)

    async def _emit_all(self, events: list[Event]) -> bool:
        async def emit(master: Master) -> None:
            for event in events:
                await master.emit(event)

        return await self._as_master(emit)

    async def _serve_command(self, msg: CommandMsg) -> Ack:
        if msg.origin is not None:
            self._contact[msg.origin] = self._clock()
        return Ack(accepted=await self._submit(msg.command, msg.origin))

    async def _serve_local_events(self, msg: LocalEventsMsg) -> Ack:
        self._contact[msg.node_id] = self._clock()
        return Ack(accepted=await self._emit_all(msg.events))

    async def _serve_catch_up(self, request: CatchUpRequest) -> CatchUpReply:
        async with self.replica.lock:
            if self._master is None:
                raise NotMaster(f"{self.node_id} is not the master")
            last = self.replica.last_idx
            lineage = self.replica.lineage
            log = self.replica.log
            if agreed_prefix(request.lineage, request.last_idx, lineage, last) >= request.last_idx:
                events = log.read_from(request.last_idx + 1, PAGE)
                if events or request.last_idx >= last:
                    return CatchUpReply(base=None, events=events, last_idx=last, lineage=lineage)
            # Its current state (the log's snapshot plus the tail, applied): one parse
            # for the follower instead of a page of events to apply one by one.
            return CatchUpReply(base=self.host.state(), events=[], last_idx=last,
                                lineage=lineage)

    # -- the followers' side -----------------------------------------------------------

    async def _receive_events(self, events: Inbox[EventMsg]) -> None:
        async for delivery in events.deliveries():
            msg, sender = delivery.message, NodeId(delivery.sender)
            master = self.election.master
            if master == self.node_id or msg.epoch.master != sender:
                continue
            if master is not None and sender != master:
                continue
            self._buffer[msg.event.idx] = (sender, msg)
            if len(self._buffer) > MAX_BUFFERED:
                self._buffer.clear()
                self._catch_up.set()
            elif self._synced:
                async with self.replica.lock:
                    await self._drain()

    async def _drain(self) -> None:
        """Apply the buffered events that follow the log (the caller holds the lock)."""
        master = self.election.master
        while (item := self._buffer.pop(self.replica.last_idx + 1, None)) is not None:
            sender, msg = item
            if sender != master or self._master is not None:
                break
            await self.replica.apply(msg)
        last = self.replica.last_idx
        for idx in [i for i in self._buffer if i <= last]:
            del self._buffer[idx]
        if self._buffer:
            self._catch_up.set()  # a gap before what is buffered

    def _check_lag(self, master_last_idx: int) -> None:
        """Still behind where the master was one heartbeat ago: an event went missing
        (a gap shows only when a later event comes; this catches a lost last one)."""
        if self._synced and self.replica.last_idx < self._master_was_at:
            self._catch_up.set()
        self._master_was_at = master_last_idx

    async def _catch_up_loop(self) -> None:
        while True:
            await self._catch_up.wait()
            if self._synced and self._buffer:
                # A gap: the event before what is buffered is most likely still on its
                # way (overtaken by the next ones). Asking at once made a catch-up storm
                # (every follower, for every burst of events).
                missing = self.replica.last_idx + 1
                await anyio.sleep(GAP_WAIT_S)
                if self.replica.last_idx >= missing:
                    continue  # it came (a later gap wakes this loop again)
            await self._catch_up_with_master()

    async def _catch_up_with_master(self) -> None:
        while (master := self.election.master) is not None and master != self.node_id:
            request = CatchUpRequest(last_idx=self.replica.last_idx, lineage=self.replica.lineage)
            started = self._clock()
            try:
                reply = await self._router.request(
                    CATCH_UP, request, target=master, timeout=self.config.request_timeout_s
                )
            except RequestError as e:
                logger.debug(f"cluster: catch-up from {master} failed: {e}")
                await self._wait_master_change(self.config.heartbeat_interval_s)
                continue
            if self.election.master != master:
                continue
            if not await self._apply_catch_up(master, reply):
                await self._wait_master_change(self.config.heartbeat_interval_s)
                continue
            logger.debug(
                f"cluster: caught up to {self.replica.last_idx} of {reply.last_idx} "
                f"({len(reply.events)} events{', from a snapshot' if reply.base else ''}) "
                f"in {self._clock() - started:.3f} s"
            )
            if self.replica.last_idx >= reply.last_idx:
                return

    async def _apply_catch_up(self, master: NodeId, reply: CatchUpReply) -> bool:
        async with self.replica.lock:
            try:
                report = await self.replica.apply_reply(reply)
            except ValueError as e:  # a malformed page: ask again
                logger.error(f"cluster: catch-up from {master} failed: {e}")
                return False
            if report is not None:  # the merge is recorded in the log, never silent
                self._outgoing_tx.send_nowait(MergeReported(report=report))
            first = not self._synced
            self._synced = True
            await self._drain()
        if first:
            logger.info(f"cluster: in sync with master {master} at event {self.replica.last_idx}")
            self.host.set_in_sync(True)
            self.ready.set()
            self._queue_local_truth(full=True)
        return True

    async def _receive_chunks(self, chunks: Inbox[ChunkGenerated]) -> None:
        async for event in chunks:
            self.host.deliver_chunk(event, None)

    # -- to the master -----------------------------------------------------------------

    async def _wait_master_change(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self._master_changed.wait()

    async def _ask_master(self, endpoint: Endpoint[Req, Ack], message: Req, master: NodeId) -> bool:
        try:
            ack = await self._router.request(
                endpoint, message, target=master, timeout=self.config.request_timeout_s
            )
        except RequestError as e:
            logger.debug(f"cluster: {endpoint} to {master}: {e}")
            return False
        return ack.accepted

    async def _forward_commands(self) -> None:
        async for command, origin in self._commands:
            await self._deliver_command(command, origin)

    async def _deliver_command(self, command: Command, origin: NodeId | None) -> None:
        deadline = self._clock() + self.config.command_timeout_s
        while not await self._command_to_master(command, origin):
            if self._clock() >= deadline:
                message = f"no cluster master within {self.config.command_timeout_s:g} s"
                logger.warning(f"command {type(command).__name__}: {message}")
                chunk = error_chunk(message)
                self.host.deliver_chunk(
                    ChunkGenerated(command_id=command.command_id, chunk=chunk), origin
                )
                return
            await self._wait_master_change(self.config.heartbeat_interval_s)

    async def _command_to_master(self, command: Command, origin: NodeId | None) -> bool:
        master = self.election.master
        if master is None:
            return False
        if master == self.node_id:
            return await self._submit(command, origin)
        return await self._ask_master(COMMANDS, CommandMsg(command=command, origin=origin), master)

    async def _pump_local_events(self) -> None:
        async for event in self._local_events:
            if isinstance(event, NodeGatheredInfo):
                self._info_sent_at = self._clock()
            self._outgoing_tx.send_nowait(event)

    def _queue_local_truth(self, *, full: bool) -> None:
        """Queue what the master may lack about this node; its info only when none was
        sent for a node timeout (one on its way would do)."""
        now = self._clock()
        for event in self.host.local_truth(full):
            if isinstance(event, NodeGatheredInfo):
                if now - self._info_sent_at < self.config.node_timeout_s:
                    continue
                self._info_sent_at = now
            self._outgoing_tx.send_nowait(event)

    def _check_own_info(self) -> None:
        """The state lacks this node (it joined, or was taken for gone): tell the master."""
        if not (self._synced or self._master is not None):
            return
        if self.node_id not in self.host.state().nodes:
            self._queue_local_truth(full=False)

    async def _forward_local_events(self) -> None:
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
                await self._wait_master_change(self.config.heartbeat_interval_s)

    async def _events_to_master(self, events: list[Event]) -> bool:
        master = self.election.master
        if master is None:
            return False
        if master == self.node_id:
            return await self._emit_all(events)
        message = LocalEventsMsg(node_id=self.node_id, events=events)
        return await self._ask_master(LOCAL_EVENTS, message, master)

    async def _send_chunks(self) -> None:
        async for origin, event in self._chunks_rx:
            await self._router.send_to(CHUNKS, origin, event)


def _readable(error: Exception) -> str:
    """Zenoh's error text without the places in its Rust source it points at."""
    text = re.sub(r"\s*(at )?\S+\.rs:\d+(:\d+)?\.?", "", str(error))
    return " ".join(text.split()) or type(error).__name__


def _describe(event: Event) -> str:
    match event:
        case TopologyEdgeCreated():
            return f"{event.connection.source} -> {event.connection.sink}"
        case NodeTimedOut():
            return str(event.node_id)
        case _:
            return ""
