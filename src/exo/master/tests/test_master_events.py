"""The master's sequencing, with plain values: what it writes to the log for the events
and commands it is given."""

import anyio
import pytest

from exo.master.main import Master
from exo.shared.tests.builders import INSTANCE_1, RUNNER_A1, single_instance
from exo.shared.types.commands import Command
from exo.shared.types.common import NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    RunnerStatusUpdated,
)
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
