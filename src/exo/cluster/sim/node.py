"""A simulated node: the real ``ClusterLink`` with its real SQLite log and election store
in a data directory, hosted by a small ``SimHost`` (state, apply, local truth) instead of
the full node (no API, no worker, no runners)."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import TaskGroup

from exo.cluster.config import ClusterConfig
from exo.cluster.link import ClusterLink
from exo.cluster.sim.loop import Machine, run_on
from exo.cluster.sim.net import SimNetwork
from exo.cluster.store import ElectionStore
from exo.master.event_log import SqliteEventLog
from exo.shared.apply import apply
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.tests.builders import model_card, node_info
from exo.shared.types.chunks import ErrorChunk
from exo.shared.types.commands import Command
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    CommandRefused,
    Event,
    IndexedEvent,
    NodeGatheredInfo,
)
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.state import State
from exo.utils.channels import Sender, channel

SIM_MODEL = ModelId("sim-org/sim-model")


@dataclass
class SimHost:
    node_id: NodeId
    state_: State
    clock: Callable[[], float]
    info: NodeInfo
    applied: dict[int, CommandId | None] = field(default_factory=dict[int, CommandId | None])
    """Index -> the command behind the event this node applied there (this run only)."""
    acked: dict[CommandId, float] = field(default_factory=dict[CommandId, float])
    """Commands this node took whose effect it has applied: acknowledged to the client."""
    failed: dict[CommandId, str] = field(default_factory=dict[CommandId, str])
    pending: set[CommandId] = field(default_factory=set[CommandId])
    ever_applied: set[CommandId] = field(default_factory=set[CommandId])
    history: list[tuple[int, CommandId]] = field(default_factory=list[tuple[int, CommandId]])
    """Every (index, command) this node's log held in this run, in order."""
    refused: dict[CommandId, str] = field(default_factory=dict[CommandId, str])
    """Commands this node's log records as refused (``CommandRefused``), and why."""
    in_sync: bool = False
    on_apply: Callable[[NodeId, IndexedEvent], None] | None = None

    def state(self) -> State:
        return self.state_

    async def apply_event(self, indexed: IndexedEvent) -> None:
        self.state_ = apply(self.state_, indexed)
        self.applied[indexed.idx] = indexed.command_id
        if indexed.command_id is not None:
            self.ever_applied.add(indexed.command_id)
            self.history.append((indexed.idx, indexed.command_id))
        if isinstance(indexed.event, CommandRefused):
            self.refused[indexed.event.command_id] = indexed.event.reason
        if indexed.command_id is not None and indexed.command_id in self.pending:
            self.pending.discard(indexed.command_id)
            self.acked[indexed.command_id] = self.clock()
        if self.on_apply is not None:
            self.on_apply(self.node_id, indexed)

    def replace_state(self, state: State) -> None:
        # The node's log is now the master's up to the base (whose events it did not
        # apply itself): its record starts again after it.
        self.applied.clear()
        self.state_ = state

    def deliver_chunk(self, event: ChunkGenerated, origin: NodeId | None) -> None:
        if isinstance(event.chunk, ErrorChunk) and event.command_id in self.pending:
            self.pending.discard(event.command_id)
            self.failed[event.command_id] = event.chunk.error_message

    def set_in_sync(self, in_sync: bool) -> None:
        self.in_sync = in_sync

    def resolve_card(self, model_id: ModelId) -> ModelCard | None:
        return model_card(model_id, n_layers=8) if model_id == SIM_MODEL else None

    def local_truth(self, full: bool) -> list[Event]:
        if self.node_id in self.state_.nodes:
            return []
        return [NodeGatheredInfo(node_id=self.node_id, info=self.info)]


class SimNode:
    """One node's data directory, and its current run (None while it is down)."""

    def __init__(self, net: SimNetwork, node_id: NodeId, data_dir: Path,
                 config: ClusterConfig, clock: Callable[[], float],
                 snapshot_every: int = 1000) -> None:
        """``snapshot_every``: the log snapshots (and compacts) every so many events; small
        in short runs, so that catch-ups from a snapshot happen."""
        self.snapshot_every = snapshot_every
        self.machine = Machine(node_id)
        """Its CPU (charged only on a loop that charges CPU time), across restarts."""
        self.net = net
        self.node_id = node_id
        self.data_dir = data_dir
        self.config = config
        self.clock = clock
        self.host: SimHost | None = None
        self.link: ClusterLink | None = None
        self.hosts: list[SimHost] = []
        """Every run's host, oldest first."""
        self.links: list[ClusterLink] = []
        self._commands: Sender[tuple[Command, NodeId | None]] | None = None
        self._scope: anyio.CancelScope | None = None
        self._log: SqliteEventLog | None = None

    @property
    def up(self) -> bool:
        return self.link is not None

    def start(self, tg: TaskGroup, on_apply: Callable[[NodeId, IndexedEvent], None]) -> None:
        cluster_dir = self.data_dir / "cluster"
        log = SqliteEventLog(cluster_dir / "events.db", snapshot_every=self.snapshot_every,
                             keep_tail=self.snapshot_every)
        info = node_info(hostname=str(self.node_id), memory_mb=4096)
        host = SimHost(self.node_id, log.restore(), self.clock, info, on_apply=on_apply)
        # What its log holds from an earlier run (what a merge may have to drop).
        held = log.read_from(0, 10**9)
        host.applied = {e.idx: e.command_id for e in held}
        host.refused = {e.event.command_id: e.event.reason for e in held
                        if isinstance(e.event, CommandRefused)}
        host.history = [(i, c) for i, c in host.applied.items() if c is not None]
        host.ever_applied = {c for _, c in host.history}
        commands_tx, commands_rx = channel[tuple[Command, NodeId | None]]()
        local_tx, local_rx = channel[Event]()
        local_tx.send_nowait(NodeGatheredInfo(node_id=self.node_id, info=info))
        link = ClusterLink(
            self.config, host=host, log=log,
            store=ElectionStore(cluster_dir / "election.json"),
            commands=commands_rx, local_events=local_rx, clock=self.clock,
            network=lambda: self.net.port(self.node_id), data_dir=cluster_dir,
        )
        scope = anyio.CancelScope()
        self.host, self.link, self._commands, self._scope, self._log = (
            host, link, commands_tx, scope, log
        )
        self.hosts.append(host)
        self.links.append(link)

        async def run() -> None:
            run_on(self.machine)
            try:
                with scope:
                    await link.run()
            finally:
                # Closed once the run has unwound: a task the crash cancelled may still
                # finish a step it was in (the crash takes effect at its next await).
                log.close()

        tg.start_soon(run)

    def crash(self) -> None:
        """Stop at once (its data directory stays as it was)."""
        if self._scope is not None:
            self._scope.cancel()
        self.host = self.link = self._commands = self._scope = self._log = None

    def submit(self, command: Command) -> None:
        if self.host is None or self._commands is None:
            raise RuntimeError(f"{self.node_id} is down")
        self.host.pending.add(command.command_id)
        self._commands.send_nowait((command, self.node_id))
