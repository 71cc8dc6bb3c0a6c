"""Following the master: a follower applies what the master publishes in index order,
and asks it for what it missed.

A follower that sees a gap, lags behind the master's heartbeat, or starts following a new
master asks for the events after its log, telling where its log ends and its lineage. The
master answers (``catch_up_reply``) with the next page; with its current state (the
snapshot plus the tail, applied: one parse for the follower instead of a page of events to
apply one by one) when the follower's log is older than the master keeps, or diverged from
its own, or is ahead of it. Rule: *the master's log is the truth.* A new master is by construction the most
up-to-date live node, so a follower is only ahead of it with events no live node
confirmed (a dead master's last ones, or a node that comes back from a partition): it
drops them and starts again from the master's state (nothing wedges), reports what it
dropped, and re-submits the commands behind it (``resubmit``): none is lost."""

from collections.abc import Awaitable, Callable

import anyio
from loguru import logger

from exo.cluster.config import ClusterConfig
from exo.cluster.host import ClusterHost
from exo.cluster.lineage import agreed_prefix
from exo.cluster.messages import CATCH_UP, CatchUpReply, CatchUpRequest, EventMsg
from exo.cluster.network import ClusterNetwork, Inbox
from exo.cluster.replica import Replica
from exo.cluster.resubmit import Resubmission
from exo.master.event_log import REMEMBERED_COMMANDS, LogUnavailable
from exo.routing import RequestError
from exo.shared.types.common import NodeId
from exo.shared.types.events import MergeReported
from exo.shared.types.state import State
from exo.utils.wakeup import Wakeup

PAGE = 2000
"""Events per catch-up reply."""
MAX_BUFFERED = 10_000
"""Out-of-order events a follower holds before it drops them and catches up instead."""
GAP_WAIT_S = 0.02
"""How long a follower that sees a gap waits for the missing event before it asks."""


def catch_up_reply(replica: Replica, current: State, request: CatchUpRequest) -> CatchUpReply:
    """The master's answer to ``request`` from its log, or its ``current`` state (the
    caller holds the lock)."""
    last = replica.last_idx
    lineage = replica.lineage
    log = replica.log
    if agreed_prefix(request.lineage, request.last_idx, lineage, last) >= request.last_idx:
        events = log.read_from(request.last_idx + 1, PAGE)
        if events or request.last_idx >= last:
            return CatchUpReply(base=None, events=events, last_idx=last, lineage=lineage)
    return CatchUpReply(base=current, events=[], last_idx=last, lineage=lineage,
                        commands=log.command_ids(REMEMBERED_COMMANDS))


class LogFollower:
    def __init__(
        self,
        config: ClusterConfig,
        host: ClusterHost,
        replica: Replica,
        clock: Callable[[], float],
        network: Callable[[], ClusterNetwork],
        *,
        master: Callable[[], NodeId | None],
        is_master: Callable[[], bool],
        wait_master_change: Callable[[float], Awaitable[None]],
        report: Callable[[MergeReported], None],
        resubmit: Callable[[Resubmission], None],
        on_synced: Callable[[], None],
    ) -> None:
        """``master``: whom the election chose; ``is_master``: whether this node sequences
        now; ``report``: send a merge report to the master; ``resubmit``: send the master
        the commands a merge dropped from this node's log (``resubmit``); ``on_synced``:
        this node caught up with a new master."""
        self._config = config
        self._host = host
        self._replica = replica
        self._clock = clock
        self._network = network
        self._master = master
        self._is_master = is_master
        self._wait_master_change = wait_master_change
        self._report = report
        self._resubmit = resubmit
        self._on_synced = on_synced
        self.node_id = host.node_id
        self.synced = False
        """Caught up with the master this node follows (or this node is the master)."""
        self._buffer: dict[int, tuple[NodeId, EventMsg]] = {}
        self._master_was_at = -1
        self._catch_up = Wakeup()
        self._must_ask = False
        """Ask the master even if no gap is left (a lost last event, an overflow)."""

    def follow(self, master: NodeId | None) -> None:
        """Start following ``master`` (None: no master yet)."""
        self.synced = False
        self._host.set_in_sync(False)
        self._master_was_at = -1
        self._buffer = {i: item for i, item in self._buffer.items() if item[0] == master}
        if master is None:
            logger.info("cluster: no master; electing")
            return
        logger.info(f"cluster: following master {master}")
        self._catch_up.set()

    def lead(self) -> None:
        """This node became the master: its log is the truth (the caller holds the lock)."""
        self._buffer.clear()
        self.synced = True

    async def receive_events(self, events: Inbox[EventMsg]) -> None:
        async for delivery in events.deliveries():
            msg, sender = delivery.message, NodeId(delivery.sender)
            master = self._master()
            if master == self.node_id or msg.epoch.master != sender:
                continue
            if master is not None and sender != master:
                continue
            if self.synced and msg.event.idx <= self._replica.last_idx:
                continue  # applied already (a duplicate, or it came in a catch-up page)
            self._buffer[msg.event.idx] = (sender, msg)
            if len(self._buffer) > MAX_BUFFERED:
                self._buffer.clear()
                self._must_ask = True
                self._catch_up.set()
            elif self.synced:
                async with self._replica.lock:
                    await self._drain()

    async def _drain(self) -> None:
        """Apply the buffered events that follow the log (the caller holds the lock).

        Constant time per event applied: it runs for every event that arrives, and the
        buffer may hold thousands behind a gap (a scan of it per arrival made a burst of
        n events cost n^2: at 64 nodes, the 4032 link events of the mesh stalled every
        follower for seconds). Only what follows the log is buffered while in sync
        (``receive_events``); a catch-up page that moves the log past buffered events
        forgets them (``_forget_applied``)."""
        master = self._master()
        while (item := self._buffer.pop(self._replica.last_idx + 1, None)) is not None:
            sender, msg = item
            if sender != master or self._is_master():
                break
            await self._replica.apply(msg)
        if self._buffer:
            self._catch_up.set()  # a gap before what is buffered

    def _forget_applied(self) -> None:
        """Drop the buffered events the log already holds (after a catch-up page)."""
        last = self._replica.last_idx
        self._buffer = {i: item for i, item in self._buffer.items() if i > last}

    def check_lag(self, master_last_idx: int) -> None:
        """Still behind where the master was one heartbeat ago: an event went missing
        (a gap shows only when a later event comes; this catches a lost last one)."""
        if self.synced and self._replica.last_idx < self._master_was_at:
            self._must_ask = True
            self._catch_up.set()
        self._master_was_at = master_last_idx

    async def loop(self) -> None:
        while True:
            await self._catch_up.wait()
            if self.synced and not self._must_ask:
                # A gap: the event before what is buffered is most likely still on its
                # way (overtaken by the next ones). Asking at once made a catch-up storm
                # (every follower, for every burst of events); so did asking for a gap
                # that had closed by the time this loop ran (every follower, after every
                # burst, for nothing).
                if not self._buffer:
                    continue  # closed already
                missing = self._replica.last_idx + 1
                await anyio.sleep(GAP_WAIT_S)
                if self._replica.last_idx >= missing and not self._must_ask:
                    continue  # it came (a later gap wakes this loop again)
            self._must_ask = False
            await self._catch_up_with_master()

    async def _catch_up_with_master(self) -> None:
        interval = self._config.heartbeat_interval_s
        while (master := self._master()) is not None and master != self.node_id:
            request = CatchUpRequest(
                last_idx=self._replica.last_idx, lineage=self._replica.lineage
            )
            started = self._clock()
            try:
                reply = await self._network().request(
                    CATCH_UP, request, target=master, timeout=self._config.request_timeout_s
                )
            except RequestError as e:
                logger.debug(f"cluster: catch-up from {master} failed: {e}")
                await self._wait_master_change(interval)
                continue
            if self._master() != master:
                continue
            if not await self._apply(master, reply):
                await self._wait_master_change(interval)
                continue
            logger.debug(
                f"cluster: caught up to {self._replica.last_idx} of {reply.last_idx} "
                f"({len(reply.events)} events{', from a snapshot' if reply.base else ''}) "
                f"in {self._clock() - started:.3f} s"
            )
            if self._replica.last_idx >= reply.last_idx:
                return

    async def _apply(self, master: NodeId, reply: CatchUpReply) -> bool:
        async with self._replica.lock:
            try:
                report = await self._replica.apply_reply(reply, self._resubmit)
            except LogUnavailable:  # the disk is full: the replica logged it once
                return False
            except ValueError as e:  # a malformed page: ask again
                logger.error(f"cluster: catch-up from {master} failed: {e}")
                return False
            if report is not None:  # the merge is recorded in the log, never silent
                self._report(MergeReported(report=report))
            first = not self.synced
            self.synced = True
            self._forget_applied()
            await self._drain()
        if first:
            logger.info(f"cluster: in sync with master {master} at event {self._replica.last_idx}")
            self._host.set_in_sync(True)
            self._on_synced()
        return True
