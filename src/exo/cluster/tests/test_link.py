"""Cluster links in one process, with real routers on loopback and plain hosts: logs
that are behind, ahead or diverged, commands that wait for a master, chunks to the node
that took a request."""

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from exo.cluster.config import ClusterConfig
from exo.cluster.lineage import Epoch, Lineage
from exo.cluster.link import ClusterLink
from exo.cluster.store import ElectionStore
from exo.master.event_log import SqliteEventLog
from exo.shared.apply import apply
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.tests.builders import RUNNER_A1, node_info, pipeline_instance
from exo.shared.types.chunks import ErrorChunk
from exo.shared.types.commands import Command, CreateInstance
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    Event,
    IndexedEvent,
    MergeReported,
    NodeDownloadProgress,
    NodeGatheredInfo,
)
from exo.shared.types.state import MergeReport, State
from exo.shared.types.worker.downloads import DownloadOngoing
from exo.shared.types.worker.instances import InstanceId
from exo.utils.channels import Sender, channel

pytestmark = pytest.mark.anyio

SECRET = "link-test-secret"
M1, M2, X = NodeId("m1"), NodeId("m2"), NodeId("x")


@dataclass(eq=False)
class PlainHost:
    """A node reduced to what the link needs: a state, and what it was handed."""

    node_id: NodeId
    current: State
    chunks: list[ChunkGenerated] = field(default_factory=list[ChunkGenerated])
    replaced: int = 0
    in_sync: bool = False
    changed: anyio.Event = field(default_factory=anyio.Event)

    def state(self) -> State:
        return self.current

    async def apply_event(self, indexed: IndexedEvent) -> None:
        self.current = apply(self.current, indexed)
        self._notify()

    def replace_state(self, state: State) -> None:
        self.current = state
        self.replaced += 1
        self._notify()

    def deliver_chunk(self, event: ChunkGenerated, origin: NodeId | None) -> None:
        self.chunks.append(event)

    def resolve_card(self, model_id: ModelId) -> ModelCard | None:
        return None

    def set_in_sync(self, in_sync: bool) -> None:
        self.in_sync = in_sync

    def local_truth(self, full: bool) -> list[Event]:
        if self.node_id in self.current.nodes:
            return []
        return [NodeGatheredInfo(node_id=self.node_id, info=node_info(self.node_id))]

    def _notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_for(self, predicate: Callable[[State], bool], timeout: float = 5) -> State:
        with anyio.fail_after(timeout):
            while not predicate(self.current):
                await self.changed.wait()
        return self.current


def download(node_id: NodeId, tag: str, i: int) -> Event:
    return NodeDownloadProgress(
        node_id=node_id,
        model_id=ModelId(f"test-org/{tag}-{i}"),
        progress=DownloadOngoing(downloaded_bytes=i, total_bytes=1000),
    )


def write_log(
    data_dir: Path, events: Sequence[Event], term: int, lineage: Lineage,
    commands: Mapping[int, CommandId] | None = None,
) -> State:
    """A node's data directory with this log (``commands``: the command behind an
    event, by index), term and lineage; returns its state."""
    log = SqliteEventLog(data_dir / "cluster" / "events.db")
    state = State()
    for i, event in enumerate(events):
        indexed = IndexedEvent(idx=i, event=event, command_id=(commands or {}).get(i))
        state = apply(state, indexed)
        log.append(indexed, state)
    log.close()
    ElectionStore(data_dir / "cluster" / "election.json").save(term, lineage)
    return state


@dataclass
class RunningLink:
    link: ClusterLink
    host: PlainHost
    commands: Sender[tuple[Command, NodeId | None]]
    log: SqliteEventLog


@asynccontextmanager
async def running_link(
    node_id: NodeId, data_dir: Path, peers: Sequence[str] = (), *, force_master: bool = False
) -> AsyncGenerator[RunningLink]:
    log = SqliteEventLog(data_dir / "cluster" / "events.db")
    host = PlainHost(node_id, log.restore())
    commands_tx, commands_rx = channel[tuple[Command, NodeId | None]]()
    _, local_rx = channel[Event]()
    config = ClusterConfig(
        secret=SECRET, listen=["tcp/127.0.0.1:0"], peers=peers, node_timeout_s=0.5,
        force_master=force_master, command_timeout_s=10,
    )
    link = ClusterLink(
        config, host, log, ElectionStore(data_dir / "cluster" / "election.json"),
        commands_rx, local_rx,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(link.run)
        try:
            yield RunningLink(link, host, commands_tx, log)
        finally:
            tg.cancel_scope.cancel()


def same_log_content(a: State, b: State) -> bool:
    return a.downloads == b.downloads and a.last_event_applied_idx == b.last_event_applied_idx


async def test_a_follower_ahead_of_the_new_master_starts_again_from_its_state(
    tmp_path: Path,
) -> None:
    shared = [download(M1, "shared", i) for i in range(101)]
    # x got 101..105 from m1 before m1 died; m2 never did, and went on from 101 itself.
    # Two of them came from commands m1 had acknowledged.
    lost_commands = {102: CommandId("cmd-lost-a"), 104: CommandId("cmd-lost-b")}
    write_log(tmp_path / "x", [*shared, *(download(M1, "lost", i) for i in range(5))], 1,
              (Epoch(term=1, master=M1, start_idx=0),), lost_commands)
    master_state = write_log(
        tmp_path / "m2", [*shared, *(download(M2, "new", i) for i in range(20))], 2,
        (Epoch(term=1, master=M1, start_idx=0), Epoch(term=2, master=M2, start_idx=101)),
    )
    from loguru import logger

    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    with anyio.fail_after(15):
        async with (
            running_link(M2, tmp_path / "m2", force_master=True) as m2,
            running_link(X, tmp_path / "x", m2.link.listen_endpoints) as x,
        ):
            await x.link.ready.wait()
            assert m2.link.is_master
            # x says what it drops: its events 101..105, which no live master holds.
            assert any(
                "dropping 5 events 101..105" in line and "cmd-lost-a, cmd-lost-b" in line
                for line in lines
            ), lines
            logger.remove(sink)
            # ... and the merge is an event in the replicated log: every node holds it.
            expected = MergeReport(
                node_id=X, first_idx=101, last_idx=105, dropped_events=5,
                event_kinds=("NodeDownloadProgress",),
                command_ids=(CommandId("cmd-lost-a"), CommandId("cmd-lost-b")),
            )
            await m2.host.wait_for(lambda s: s.last_merge_report == expected)
            state = await x.host.wait_for(
                lambda s: s.last_event_applied_idx >= m2.host.state().last_event_applied_idx
                and X in s.nodes and s.last_merge_report == expected
            )
            reported = [
                e.event.report
                for e in m2.log.read_from(0, 1000)
                if isinstance(e.event, MergeReported)
            ]
            assert reported == [expected]
            assert x.host.replaced == 1
            assert "test-org/lost-0" not in state.downloads.get(M1, {})
            assert state.downloads[M2] == master_state.downloads[M2]
            assert same_log_content(state, m2.host.state())
            # What x keeps on disk is the master's log, not its old one.
            assert same_log_content(x.log.restore(), state)


async def test_a_follower_behind_catches_up_from_where_it_is(tmp_path: Path) -> None:
    lineage = (Epoch(term=1, master=M2, start_idx=0),)
    events = [download(M2, "model", i) for i in range(120)]
    write_log(tmp_path / "x", events[:50], 1, lineage)
    write_log(tmp_path / "m2", events, 1, lineage)
    with anyio.fail_after(15):
        async with (
            running_link(M2, tmp_path / "m2", force_master=True) as m2,
            running_link(X, tmp_path / "x", m2.link.listen_endpoints) as x,
        ):
            await x.link.ready.wait()
            state = await x.host.wait_for(lambda s: X in s.nodes)
            assert x.host.replaced == 0
            assert same_log_content(state, m2.host.state())
            assert x.link.replica.lineage[0] == lineage[0]
            assert x.link.replica.lineage[-1].master == M2


async def test_commands_wait_for_a_master_and_chunks_reach_their_origin(tmp_path: Path) -> None:
    with anyio.fail_after(15):
        async with (
            running_link(M2, tmp_path / "m2", force_master=True) as m2,
            running_link(X, tmp_path / "x", m2.link.listen_endpoints) as x,
        ):
            # Sent before x knows any master: delivered once it does.
            instance = pipeline_instance(InstanceId("i1"), [(X, RUNNER_A1)])
            await x.commands.send((CreateInstance(instance=instance), X))
            await x.link.ready.wait()
            await x.host.wait_for(lambda s: {X, M2} <= set(s.nodes) and bool(s.instances))
            assert m2.host.state().instances == {instance.instance_id: instance}
            # The master answers to the node that took a request, point to point.
            chunk = ChunkGenerated(
                command_id=CommandId("c2"),
                chunk=ErrorChunk(model=ModelId("exo"), error_message="to x"),
            )
            while not x.host.chunks:
                m2.link.send_chunk(X, chunk)
                with anyio.move_on_after(0.1):
                    while not x.host.chunks:
                        await anyio.sleep(0.01)
            assert x.host.chunks[0] == chunk
            assert m2.host.chunks == []  # the command failed nowhere


async def test_a_follower_that_missed_the_last_event_catches_up_from_the_heartbeat(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(15):
        async with (
            running_link(M2, tmp_path / "m2", force_master=True) as m2,
            running_link(X, tmp_path / "x", m2.link.listen_endpoints) as x,
        ):
            await x.link.ready.wait()
            await x.host.wait_for(lambda s: {X, M2} <= set(s.nodes))
            # The master sequences an event that never reaches x (as if lost on the way).
            epoch, m2.link.sequencer.epoch = m2.link.sequencer.epoch, None
            assert await m2.link.sequencer.emit_all([download(M2, "lost-on-the-way", 1)])
            m2.link.sequencer.epoch = epoch
            last = m2.host.state().last_event_applied_idx
            state = await x.host.wait_for(lambda s: s.last_event_applied_idx >= last)
            assert "test-org/lost-on-the-way-1" in state.downloads[M2]
            assert x.host.replaced == 0


async def test_a_command_retried_after_a_failover_is_not_applied_twice(tmp_path: Path) -> None:
    from contextlib import AsyncExitStack

    from exo.shared.types.events import InstanceCreated

    instance = pipeline_instance(InstanceId("i-once"), [(X, RUNNER_A1)])
    command = CreateInstance(instance=instance)

    def created(log: SqliteEventLog) -> int:
        events = log.read_from(0, 10_000)
        return sum(isinstance(e.event, InstanceCreated) for e in events)

    with anyio.fail_after(20):
        async with running_link(X, tmp_path / "x") as x:  # x outlives m2
            async with AsyncExitStack() as m2_scope:
                await m2_scope.enter_async_context(
                    running_link(M2, tmp_path / "m2", x.link.listen_endpoints, force_master=True)
                )
                await x.host.wait_for(lambda s: {X, M2} <= set(s.nodes))
                while x.link.master_id != M2:
                    await anyio.sleep(0.02)
                await x.commands.send((command, X))
                await x.host.wait_for(lambda s: instance.instance_id in s.instances)
                assert created(x.log) == 1
            # m2 is gone; x becomes the master, and the requester retries the command
            # (its acknowledgement was lost with m2).
            while not x.link.is_master:
                await anyio.sleep(0.02)
            await x.commands.send((command, X))
            marker = pipeline_instance(InstanceId("i-after"), [(X, RUNNER_A1)])
            await x.commands.send((CreateInstance(instance=marker), X))
            await x.host.wait_for(lambda s: marker.instance_id in s.instances)
            assert created(x.log) == 2  # the marker only: the retry was not applied again
