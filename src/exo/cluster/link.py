"""The cluster link: this node's part in a cluster, over the router.

Every node announces a heartbeat, follows the election, keeps its own copy of the log
(``Replica``) and serves the master's endpoints (answering "not the master" while it is
not). The link composes parts with one job each, each given the clock and the network
rather than reading them:

* ``presence.Peers``: which nodes are live (heartbeats, the network's presence, requests).
* ``election_driver.ElectionDriver``: steps the election, announces heartbeats.
* ``sequencer.Sequencer``: the master's side -- sequences commands and every node's local
  events with a ``Master`` that continues from this node's log, publishes them, keeps the
  membership in step with the live nodes (``membership``), answers other nodes.
* ``catch_up.LogFollower``: a follower's side -- applies what the master publishes in index
  order and asks it for what it missed.
* ``delivery.MasterDelivery``: commands and local events to the master, retried until one
  accepts them.
* ``chunks.ChunkPost``: response chunks point-to-point to the node that took the request.

What the link itself decides is what a change of master means for this node: take over,
step down, or follow; and, every heartbeat interval, to reconcile the membership (as the
master) and to tell the master about this node when its state lacks it.
"""

import re
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
from anyio.abc import TaskStatus
from loguru import logger

from exo.cluster.catch_up import LogFollower
from exo.cluster.chunks import ChunkPost
from exo.cluster.config import ClusterConfig
from exo.cluster.delivery import MasterDelivery
from exo.cluster.election import Election, Heartbeat
from exo.cluster.election_driver import ElectionDriver
from exo.cluster.host import ClusterHost
from exo.cluster.messages import CATCH_UP, CHUNKS, COMMANDS, EVENTS, HEARTBEATS, LOCAL_EVENTS
from exo.cluster.network import ClusterNetwork, OpenNetwork
from exo.cluster.pending import PendingResubmissions
from exo.cluster.presence import Peers
from exo.cluster.replica import Replica
from exo.cluster.sequencer import Sequencer
from exo.cluster.store import ElectionStore
from exo.master.event_log import SqliteEventLog
from exo.routing import Router
from exo.shared.types.commands import Command
from exo.shared.types.common import NodeId
from exo.shared.types.events import ChunkGenerated, Event
from exo.utils.channels import Receiver

REPLAY_FILE = "replay.log"
PENDING_FILE = "resubmit.json"


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
        data_dir: Path | None = None,
    ) -> None:
        """``clock`` and ``network`` are the real ones unless given (the simulator gives
        a virtual clock and a simulated network): the monotonic clock, and a zenoh router
        for ``config``. ``data_dir``: this node's cluster directory, where the router
        remembers the envelopes it admitted (``REPLAY_FILE``: a message recorded before
        a restart is refused after it) and the delivery its re-submissions not yet taken
        (``PENDING_FILE``)."""
        self.config = config
        replay = None if data_dir is None else data_dir / REPLAY_FILE
        self._open_network: OpenNetwork = network or (
            lambda: Router(config.routing(host.node_id, replay))
        )
        self._network: ClusterNetwork | None = None
        self.host = host
        self.node_id = host.node_id
        self.replica = Replica(host, log, store)
        self.ready = anyio.Event()
        """Set once this node follows a master and has caught up, or is the master."""
        self.listen_endpoints: list[str] = []
        self._commands = commands
        self._local_events = local_events
        net = self._running_network
        self.peers = Peers(self.node_id, clock, config.node_timeout_s)
        self.driver = ElectionDriver(config, self.replica, self.peers, clock, net)
        self.sequencer = Sequencer(host, self.replica, self.peers, net, clock)
        self.delivery = MasterDelivery(
            config, host, self.sequencer, clock, net,
            master=lambda: self.driver.master,
            wait_master_change=self.driver.wait_master_change,
            pending=PendingResubmissions(None if data_dir is None else data_dir / PENDING_FILE),
        )
        self.follower = LogFollower(
            config, host, self.replica, clock, net,
            master=lambda: self.driver.master,
            is_master=lambda: self.sequencer.is_master,
            wait_master_change=self.driver.wait_master_change,
            report=self.delivery.queue,
            resubmit=self.delivery.resubmit,
            on_synced=self._synced,
        )
        self.chunks = ChunkPost(host, net)

    # -- public ------------------------------------------------------------------------

    @property
    def election(self) -> Election:
        return self.driver.election

    @property
    def master_id(self) -> NodeId | None:
        return self.driver.master

    @property
    def is_master(self) -> bool:
        return self.sequencer.is_master

    def send_chunk(self, origin: NodeId, event: ChunkGenerated) -> None:
        """Send a chunk to the node that took its request."""
        self.chunks.send(origin, event)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with AsyncExitStack() as stack:
            try:
                network = await stack.enter_async_context(self._open_network())
            except Exception as e:  # zenoh's own error type: endpoints, ports, config
                raise SystemExit(
                    f"exo: cannot join the cluster network: {_readable(e)}"
                ) from e
            self._network = network
            self.listen_endpoints = network.listen_endpoints
            beats = network.subscribe(HEARTBEATS, include_self=False)
            events = network.subscribe(EVENTS, include_self=False)
            chunks = network.subscribe_direct(CHUNKS)
            presence = network.presence()
            async with anyio.create_task_group() as tg:
                await tg.start(network.serve, COMMANDS, self.sequencer.serve_command)
                await tg.start(network.serve, LOCAL_EVENTS, self.sequencer.serve_local_events)
                await tg.start(network.serve, CATCH_UP, self.sequencer.serve_catch_up)
                tg.start_soon(self.peers.receive_heartbeats, beats, self._heard)
                tg.start_soon(self.follower.receive_events, events)
                tg.start_soon(self.chunks.receive, chunks)
                tg.start_soon(self.peers.watch, presence, self._left, self.driver.joined)
                tg.start_soon(self.driver.beat_on_joins)
                tg.start_soon(self.driver.loop, self._master_changes, self._master_changed)
                tg.start_soon(self._heartbeat_loop)
                tg.start_soon(self.follower.loop)
                tg.start_soon(self.delivery.pump_local_events, self._local_events)
                tg.start_soon(self.delivery.forward_local_events)
                tg.start_soon(self.delivery.forward_commands, self._commands)
                tg.start_soon(self.delivery.forward_resubmissions)
                tg.start_soon(self.chunks.send_queued)
                logger.info(
                    f"cluster: node {self.node_id} listening on "
                    f"{', '.join(self.listen_endpoints)}; log at event {self.replica.last_idx}"
                )
                task_status.started()

    def _running_network(self) -> ClusterNetwork:
        if self._network is None:
            raise RuntimeError("the cluster link is not running")
        return self._network

    # -- what happens when -------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await self.driver.send_heartbeat()
            if self.sequencer.is_master:
                await self.sequencer.reconcile()
            self._check_own_info()
            await anyio.sleep(self.config.heartbeat_interval_s)

    def _heard(self, beat: Heartbeat) -> None:
        if beat.node_id == self.driver.master:
            self.follower.check_lag(beat.last_idx)
        self.driver.wake()

    async def _left(self) -> None:
        self.driver.wake()
        if self.sequencer.is_master:
            await self.sequencer.reconcile()

    async def _master_changes(self, before: Election, after: Election) -> None:
        if before.master == self.node_id:
            await self.sequencer.step_down()
        if after.master == self.node_id:
            await self.sequencer.take_over(after.term, self.follower.lead)
            self.host.set_in_sync(True)
            self.ready.set()
        else:
            self.replica.save(after.term)
            self.follower.follow(after.master)

    async def _master_changed(self) -> None:
        if self.sequencer.is_master:
            await self.sequencer.reconcile()
            self.delivery.queue_local_truth(full=True)

    def _synced(self) -> None:
        """This node caught up with the master it follows."""
        self.ready.set()
        self.delivery.queue_local_truth(full=True)

    def _check_own_info(self) -> None:
        """The state lacks this node (it joined, or was taken for gone): tell the master."""
        if not (self.follower.synced or self.sequencer.is_master):
            return
        if self.node_id not in self.host.state().nodes:
            self.delivery.queue_local_truth(full=False)


def _readable(error: Exception) -> str:
    """Zenoh's error text without the places in its Rust source it points at."""
    text = re.sub(r"\s*(at )?\S+\.rs:\d+(:\d+)?\.?", "", str(error))
    return " ".join(text.split()) or type(error).__name__
