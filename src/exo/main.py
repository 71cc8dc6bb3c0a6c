"""The node: one process per machine wiring master, worker and API together.
A node alone (no cluster config) is its own master, with a log in memory. A node with a
cluster config joins the cluster through a ``ClusterLink``: its state follows the elected
master's log (kept in the data directory), and it masters when elected. The command line
is in ``exo.cli``."""

import fcntl
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import anyio
import uvicorn
from loguru import logger

from exo.api.connection_guard import server_config
from exo.api.errors import ApiError
from exo.api.main import ApiSettings, create_app
from exo.cluster.config import ClusterConfig
from exo.cluster.link import ClusterLink
from exo.cluster.log_open import open_log
from exo.master.main import Master
from exo.node.chunks import ChunkRouter
from exo.node.hub_cards import node_registry
from exo.node.info import cap_memory, gather_node_info, significantly_different
from exo.node.requests import RequestsEnded, RequestTracker
from exo.shared.apply import apply
from exo.shared.constants import EXO_RUNNER_MAX_BATCH
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.chunks import Chunk
from exo.shared.types.commands import Command
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    Event,
    IndexedEvent,
    NodeGatheredInfo,
    RunnerStatusUpdated,
)
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.state import State
from exo.shared.types.worker.runners import RunnerFailed, RunnerShutdown
from exo.utils.channels import Receiver, Sender, channel
from exo.worker.download.hub import HubSettings
from exo.worker.main import Worker
from exo.worker.runner.runner_supervisor import PhaseTimeouts
from exo.worker.runner.settings import RunnerSettings


@dataclass(frozen=True)
class NodeConfig:
    data_dir: Path
    api: ApiSettings
    models: list[ModelCard] = field(default_factory=list[ModelCard])
    runner_threads: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    max_batch: int = EXO_RUNNER_MAX_BATCH
    info_interval_s: float = 5.0
    timeouts: PhaseTimeouts = field(default_factory=PhaseTimeouts)
    cluster: ClusterConfig | None = None
    """None: a node alone, its own master (nothing on the network but its API)."""
    memory_limit: int | None = None
    """The most memory (bytes) placement may use on this node."""
    models_dirs: list[Path] = field(default_factory=list[Path])
    """Read-only model folders (Hugging Face caches among them) searched for models."""


def load_node_id(data_dir: Path) -> NodeId:
    """The node's id survives restarts: it lives in the data directory."""
    path = data_dir / "node_id"
    if path.exists():
        text = path.read_text().strip()
        if text:
            return NodeId(text)
    node_id = NodeId()
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(node_id)
    tmp.replace(path)
    return node_id


def lock_data_dir(data_dir: Path) -> TextIO:
    """Hold an exclusive lock on the data directory for the life of this process: two
    nodes on one directory would share an id and interleave one event log. The lock
    file names the holder's pid."""
    path = data_dir / "lock"
    handle = path.open("a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise SystemExit(
            f"exo: the data directory {data_dir} is in use by another exo process "
            f"(pid {holder}); stop it, or give this node its own --data-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self._data_dir_lock = lock_data_dir(config.data_dir)
        self._node_id = load_node_id(config.data_dir)
        self.registry = node_registry(config.models)
        self._state = State()
        self._state_changed = anyio.Event()
        self.chunks = ChunkRouter()
        self.requests = RequestTracker(self.chunks)
        self._commands_tx, self._commands_rx = channel[tuple[Command, NodeId | None]]()
        self._local_tx, self._local_rx = channel[Event]()
        self.worker = Worker(
            node_id=self._node_id,
            runner_settings=RunnerSettings(
                cache_dir=config.data_dir / "cache",
                models_dir=config.data_dir / "models",
                hub_cache_dir=HubSettings.from_env().cache_dir,
                extra_model_dirs=tuple(config.models_dirs),
                threads=config.runner_threads,
                device=config.device,
                dtype=config.dtype,
                max_batch=config.max_batch,
            ),
            local_events=self._local_tx.clone(),
            commands=_CommandSender(self._commands_tx.clone(), self._node_id),
            chunk_sink=self.deliver_chunk,
            timeouts=config.timeouts,
        )
        self.api_port: int | None = None
        self.started = anyio.Event()
        self._last_info: NodeInfo | None = None
        self.master: Master | None = None
        self.cluster: ClusterLink | None = None
        if config.cluster is None:
            self.master = Master(
                node_id=self._node_id,
                commands=self._commands_rx,
                local_events=self._local_rx,
                publish=self._from_own_master,
                send_chunk=self.deliver_chunk,
                resolve_card=self.resolve_card,
            )
        else:
            cluster_dir = config.data_dir / "cluster"
            log, store, self._state = open_log(cluster_dir)
            self.worker.update_state(self._state)
            self.worker.set_in_sync(False)  # the restored log may be stale: catch up first
            self.cluster = ClusterLink(
                config.cluster,
                host=self,
                log=log,
                store=store,
                commands=self._commands_rx,
                local_events=self._local_rx,
                data_dir=cluster_dir,
            )

    # -- NodeHandle ------------------------------------------------------------------

    @property
    def node_id(self) -> NodeId:
        return self._node_id

    def state(self) -> State:
        return self._state

    def master_id(self) -> NodeId | None:
        return self._node_id if self.cluster is None else self.cluster.master_id

    async def wait_for_state(self, predicate: Callable[[State], bool], timeout: float) -> State:
        with anyio.fail_after(timeout):
            while not predicate(self._state):
                await self._state_changed.wait()
        return self._state

    async def send_command(self, command: Command) -> None:
        await self._commands_tx.send((command, self._node_id))

    def open_response(self, command_id: CommandId) -> Receiver[Chunk]:
        try:
            return self.requests.open(command_id)
        except RequestsEnded as e:  # the node is stopping
            raise ApiError(503, str(e)) from None

    def close_response(self, command_id: CommandId) -> None:
        self.requests.close(command_id)

    def model_cards(self) -> list[ModelCard]:
        return self.registry.cards()

    async def wait_ready(self) -> None:
        """Until this node knows the cluster's state: at once for a node alone; in a
        cluster, once it has caught up with the master (or become it)."""
        if self.cluster is not None:
            await self.cluster.ready.wait()

    # -- ClusterHost -----------------------------------------------------------------

    async def apply_event(self, indexed: IndexedEvent) -> None:
        await self._on_indexed_event(indexed)

    def replace_state(self, state: State) -> None:
        self._state = state
        self.requests.reset(state)
        self._publish_state()

    def resolve_card(self, model_id: ModelId) -> ModelCard | None:
        return self.registry.resolve(model_id, self._state)

    def set_in_sync(self, in_sync: bool) -> None:
        self.worker.set_in_sync(in_sync)

    def local_truth(self, full: bool) -> list[Event]:
        state = self._state
        events: list[Event] = []
        if self._last_info is not None and self._node_id not in state.nodes:
            events.append(NodeGatheredInfo(node_id=self._node_id, info=self._last_info))
        if not full:
            return events
        events.extend(self.worker.download_truth(state))
        for instance in state.instances.values():
            runner_id = instance.shard_assignments.node_to_runner.get(self._node_id)
            if runner_id is None:
                continue
            known = state.runners.get(runner_id)
            runner = self.worker.runners.get(runner_id)
            if runner is not None and known != runner.status:
                events.append(RunnerStatusUpdated(runner_id=runner_id, runner_status=runner.status))
            elif runner is None and known is not None and not isinstance(known, RunnerFailed):
                # A status left by an earlier run of this node: that runner is gone.
                events.append(
                    RunnerStatusUpdated(runner_id=runner_id, runner_status=RunnerShutdown())
                )
        return events

    # -- wiring ----------------------------------------------------------------------

    def deliver_chunk(self, event: ChunkGenerated, origin: NodeId | None) -> None:
        if self.cluster is not None and origin is not None and origin != self._node_id:
            self.cluster.send_chunk(origin, event)
            return
        self.chunks.deliver(event.command_id, event.chunk)

    async def _from_own_master(self, indexed: IndexedEvent) -> None:
        """A node alone: its master folded the event already; its state is the node's
        (folding it again here would apply every event twice)."""
        if self.master is None or self.master.state.last_event_applied_idx != indexed.idx:
            raise RuntimeError(f"event {indexed.idx} published out of step with the master")
        await self._adopt(indexed, self.master.state)

    async def _on_indexed_event(self, indexed: IndexedEvent) -> None:
        await self._adopt(indexed, apply(self._state, indexed))

    async def _adopt(self, indexed: IndexedEvent, state: State) -> None:
        self._state = state
        self.requests.observe(indexed.event, self._state)
        self.worker.observe(indexed.event)
        self._publish_state()

    def _publish_state(self) -> None:
        """Tell the worker and every waiter that the state changed."""
        self.worker.update_state(self._state)
        self._state_changed.set()
        self._state_changed = anyio.Event()

    async def end_open_requests(self, message: str, grace_s: float = 3.0) -> None:
        """Before the node stops: every waiting or streaming request gets an error that
        says why, and a moment to send it."""
        await self.requests.end_all(message, grace_s)

    async def run(self) -> None:
        # Stored Responses live in the node's data directory.
        api_settings = self.config.api.model_copy(update={"data_dir": self.config.data_dir})
        app = create_app(self, api_settings, self.registry)
        sock = _bind(self.config.api.host, self.config.api.port)
        self.api_port = sock.getsockname()[1]
        server = _ApiServer(  # with a deadline for request heads (half-open connections)
            server_config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2)
        )
        try:
            async with anyio.create_task_group() as tg:
                if self.cluster is not None:
                    await tg.start(self.cluster.run)
                elif self.master is not None:
                    tg.start_soon(self.master.run)
                tg.start_soon(self.worker.run)
                tg.start_soon(self._report_info)
                tg.start_soon(self.requests.run)
                tg.start_soon(server.serve, [sock])
                self.started.set()
                logger.info(f"node {self._node_id} serving on http://{_url_host(self.config.api.host)}:{self.api_port}")
        finally:
            sock.close()

    async def _report_info(self) -> None:
        last: NodeInfo | None = None
        while True:
            info = await anyio.to_thread.run_sync(gather_node_info, self.api_port)
            if self.config.memory_limit is not None:
                info = cap_memory(info, self.config.memory_limit)
            if last is None or significantly_different(last, info):
                self._last_info = info
                await self._local_tx.send(NodeGatheredInfo(node_id=self._node_id, info=info))
                last = info
            await anyio.sleep(self.config.info_interval_s)


class _CommandSender(Sender[Command]):
    """The worker's view of the command channel: commands from this node."""

    def __init__(self, inner: Sender[tuple[Command, NodeId | None]], node_id: NodeId) -> None:
        self._inner = inner
        self._node_id = node_id

    async def send(self, item: Command) -> None:
        await self._inner.send((item, self._node_id))


class _ApiServer(uvicorn.Server):
    def capture_signals(self):  # type: ignore[override]  # the node owns signal handling
        from contextlib import nullcontext

        return nullcontext()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise SystemExit(f"exo: cannot listen on {host}:{port}: {e.strerror}") from e
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host

