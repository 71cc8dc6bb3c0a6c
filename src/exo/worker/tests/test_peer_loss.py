"""A pipeline loses a rank mid-stream (real runner processes over gloo on 127.0.0.1):
the client hears a clear, human error -- never the collective library's raw text."""

import os
import signal
from pathlib import Path

import anyio
import pytest

from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.types.chunks import ErrorChunk, TokenChunk
from exo.shared.types.common import CommandId
from exo.shared.types.events import ChunkGenerated, Event, RunnerStatusUpdated, TaskStatusUpdated
from exo.shared.types.tasks import ConnectToGroup, LoadModel, StartWarmup, TaskId, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.runners import (
    RunnerConnected,
    RunnerFailed,
    RunnerId,
    RunnerLoaded,
    RunnerReady,
    RunnerStatus,
)
from exo.utils.channels import channel
from exo.worker.tests.test_distributed_runners import make_instance, make_supervisors

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

RAW = ("gloo", "GLHF", "Connection closed by peer", "Connection reset", "[../", ".cc:")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_killing_rank_1_gives_the_client_a_human_error(tmp_path: Path) -> None:
    instance = make_instance("pipeline", 2)
    send, receive = channel[Event]()
    supervisors = make_supervisors(instance, send, tmp_path)
    status: dict[RunnerId, RunnerStatus] = {}
    errors: list[str] = []
    tokens = 0
    command = CommandId("long")

    async def until(done: object, timeout: float) -> None:
        nonlocal tokens
        assert callable(done)
        with anyio.fail_after(timeout):
            while not done():
                event = await receive.receive()
                match event:
                    case RunnerStatusUpdated():
                        status[event.runner_id] = event.runner_status
                        if isinstance(event.runner_status, RunnerFailed):
                            errors.append(event.runner_status.error_message)
                    case ChunkGenerated(chunk=TokenChunk()):
                        tokens += 1
                    case ChunkGenerated(chunk=ErrorChunk() as chunk):
                        errors.append(chunk.error_message)
                    case TaskStatusUpdated(error_message=str() as message):
                        errors.append(message)
                    case _:
                        pass

    iid = instance.instance_id
    async with anyio.create_task_group() as tg:
        for s in supervisors:
            tg.start_soon(s.run)
        # one phase at a time, as the worker does: started together, a rank's tasks may reach
        # it out of order (each send runs in a worker thread), and a runner refuses to warm up
        # before it has loaded (this test once hung on exactly that)
        for task, reached in ((ConnectToGroup(instance_id=iid), RunnerConnected),
                              (LoadModel(instance_id=iid), RunnerLoaded),
                              (StartWarmup(instance_id=iid), RunnerReady)):
            for s in supervisors:
                tg.start_soon(s.start_task, task)
            await until(lambda r=reached: all(isinstance(status.get(s.runner_id), r)
                                              for s in supervisors), 120)
        leader, follower = supervisors
        await leader.start_task(TextGeneration(
            task_id=TaskId("long-task"), instance_id=iid, command_id=command,
            task_params=TextGenerationTaskParams(
                model=EMBEDDED_MODEL_ID, input=[InputMessage(role="user", content="Count.")],
                temperature=0.0, max_tokens=2000,
            ),
        ))
        await until(lambda: tokens >= 2, 120)
        assert follower.pid is not None
        os.kill(follower.pid, signal.SIGKILL)
        await until(lambda: any("peer" in e for e in errors) and len(errors) >= 2, 120)
        for s in supervisors:
            tg.start_soon(s.stop)
    assert errors
    for message in errors:
        assert not any(raw in message for raw in RAW), message
