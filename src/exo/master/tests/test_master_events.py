"""The master's sequencing, with plain values: what it writes to the log for the events
and commands it is given."""

import anyio
import pytest
from loguru import logger

from exo.master.event_log import MemoryEventLog
from exo.master.main import Master
from exo.shared.tests.builders import (
    INSTANCE_1,
    MODEL_1,
    NODE_A,
    RUNNER_A1,
    model_card,
    node_info,
    single_instance,
)
from exo.shared.types.chunks import ErrorChunk
from exo.shared.types.commands import Command, PlaceInstance
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeGatheredInfo,
    RunnerStatusUpdated,
)
from exo.shared.types.state import State
from exo.shared.types.worker.runners import RunnerIdle, RunnerShutdown, RunnerShuttingDown
from exo.utils.channels import channel

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_master() -> tuple[Master, list[IndexedEvent]]:
    published: list[IndexedEvent] = []

    async def publish(indexed: IndexedEvent) -> None:
        published.append(indexed)

    def send_chunk(chunk: ChunkGenerated, origin: NodeId | None) -> None:
        pass

    master = Master(
        node_id=NodeId("master"),
        commands=channel[tuple[Command, NodeId | None]]()[1],
        local_events=channel[Event]()[1],
        publish=publish,
        send_chunk=send_chunk,
        resolve_card=lambda _: None,
    )
    return master, published


async def test_a_late_status_of_a_deleted_instances_runner_is_dropped() -> None:
    master, published = make_master()
    await master.emit(InstanceCreated(instance=single_instance()))
    await master.emit(RunnerStatusUpdated(runner_id=RUNNER_A1, runner_status=RunnerIdle()))
    await master.emit(InstanceDeleted(instance_id=INSTANCE_1, reason="test"))
    # The runner's last words arrive after the deletion: they must not bring it back.
    await master.emit(
        RunnerStatusUpdated(runner_id=RUNNER_A1, runner_status=RunnerShuttingDown())
    )
    await master.emit(RunnerStatusUpdated(runner_id=RUNNER_A1, runner_status=RunnerShutdown()))
    await anyio.lowlevel.checkpoint()
    assert master.state.runners == {}
    assert not any(
        isinstance(p.event, RunnerStatusUpdated)
        and isinstance(p.event.runner_status, RunnerShuttingDown)
        for p in published
    )


async def test_racing_placements_of_a_model_that_needs_one_make_one_instance() -> None:
    """The CLI's start model and a request that needs the model both saw no instance and
    both asked to place it: the master places once. A plain placement still adds one."""
    master, published = make_master()
    master.resolve_card = lambda model_id: model_card(model_id)
    await master.emit(NodeGatheredInfo(node_id=NODE_A, info=node_info("a", memory_mb=8192)))
    for _ in range(2):
        await master.submit(PlaceInstance(model_id=MODEL_1, unless_present=True), NODE_A)
    created = [p for p in published if isinstance(p.event, InstanceCreated)]
    assert len(created) == 1
    assert len(master.state.instances) == 1
    await master.submit(PlaceInstance(model_id=MODEL_1), NODE_A)  # asked for another one
    assert len(master.state.instances) == 2


class _FailingOnceLog:
    """A log whose next write fails (a full disk, say), then works again."""

    def __init__(self) -> None:
        self.inner = MemoryEventLog()
        self.fail_next = False

    def append(self, event: IndexedEvent, state_after: State) -> None:
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk full")
        self.inner.append(event, state_after)

    def read_from(self, idx: int, limit: int) -> list[IndexedEvent]:
        return self.inner.read_from(idx, limit)

    def snapshot(self) -> State | None:
        return self.inner.snapshot()

    def restore(self) -> State:
        return self.inner.restore()

    def command_ids(self, limit: int) -> list[CommandId]:
        return self.inner.command_ids(limit)


async def test_an_event_that_cannot_be_written_is_never_sequenced() -> None:
    """The master applied an event to its state before writing it: a failed write left a
    state the log did not have (and the next event's index skipped one). Now the event is
    refused (``log_full``: the sender tries again later) and nothing changes."""
    master, published = make_master()
    log = _FailingOnceLog()
    master.log = log
    await master.emit(NodeGatheredInfo(node_id=NODE_A, info=node_info()))
    log.fail_next = True
    refusal = await master.emit(InstanceCreated(instance=single_instance()))
    assert refusal is not None and refusal.kind == "log_full"
    assert master.state.last_event_applied_idx == 0
    assert INSTANCE_1 not in master.state.instances
    assert await master.emit(InstanceCreated(instance=single_instance())) is None
    assert [e.idx for e in published] == [0, 1]
    assert [e.idx for e in log.read_from(0, 10)] == [0, 1]
    assert master.state.last_event_applied_idx == 1


async def test_a_command_the_log_cannot_take_is_refused_to_its_requester() -> None:
    """Disk full: the command was acknowledged and never applied, and nobody heard. Now
    its requester gets an error that says so (insufficient storage), the state stays as it
    was, and the same command succeeds once the log takes writes again."""
    chunks: list[ChunkGenerated] = []
    master, published = make_master()
    master.send_chunk = lambda chunk, _origin: chunks.append(chunk)
    master.resolve_card = lambda model_id: model_card(model_id)
    log = _FailingOnceLog()
    master.log = log
    await master.emit(NodeGatheredInfo(node_id=NODE_A, info=node_info("a", memory_mb=8192)))
    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(str(m)), level="ERROR")
    log.fail_next = True
    await master.submit(PlaceInstance(model_id=MODEL_1), NODE_A)  # refused too
    chunks.clear()
    log.fail_next = True
    command = PlaceInstance(model_id=MODEL_1)
    refusal = await master.submit(command, NODE_A)
    logger.remove(sink)
    assert len(errors) == 1, errors  # the node logs it once, not once per command
    assert refusal is not None and refusal.kind == "log_full"
    assert master.state.instances == {}
    (chunk,) = chunks
    assert chunk.command_id == command.command_id
    assert isinstance(chunk.chunk, ErrorChunk)
    assert chunk.chunk.error_code == "insufficient_storage"
    assert chunk.chunk.refusal == "log_full"
    assert "cannot be written" in chunk.chunk.error_message
    assert await master.submit(command, NODE_A) is None  # space came back
    assert len(master.state.instances) == 1
    assert [type(p.event) for p in published] == [NodeGatheredInfo, InstanceCreated]
