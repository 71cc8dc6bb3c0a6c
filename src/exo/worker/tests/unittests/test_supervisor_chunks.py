"""A runner's chunks go from its pipe straight to the node's delivery (one hop a streamed
token in the node); every other event still reaches the worker, in order."""

import anyio
import pytest

from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.types.chunks import TokenChunk
from exo.shared.types.common import CommandId
from exo.shared.types.events import ChunkGenerated, Event, TaskStatusUpdated
from exo.shared.types.tasks import Task, TaskId, TaskStatus
from exo.utils.channels import channel, mp_channel
from exo.worker.tests.unittests.bare_supervisor import bare_supervisor


def _chunk(idx: int) -> ChunkGenerated:
    return ChunkGenerated(
        command_id=CommandId("cmd"),
        chunk=TokenChunk(model=EMBEDDED_MODEL_ID, text=f"t{idx}", token_id=idx, idx=idx),
    )


@pytest.mark.asyncio
async def test_chunks_go_to_the_sink_and_other_events_to_the_worker() -> None:
    task_send, _ = mp_channel[Task]()
    cancel_send, _ = mp_channel[TaskId]()
    ev_send, ev_recv = mp_channel[Event]()
    events, worker_inbox = channel[Event]()
    delivered: list[ChunkGenerated] = []
    supervisor = bare_supervisor(ev_recv, task_send, cancel_send, events, delivered.append)
    done = TaskStatusUpdated(task_id=TaskId("task"), task_status=TaskStatus.Complete)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor._forward_events)  # pyright: ignore[reportPrivateUsage]
            ev_send.send_many([_chunk(0), _chunk(1)])  # one runner step: two streams' tokens
            ev_send.send(done)
            assert await worker_inbox.receive() == done
            assert [c.chunk for c in delivered] == [_chunk(0).chunk, _chunk(1).chunk]
            with pytest.raises(anyio.WouldBlock):
                worker_inbox.receive_nowait()  # no chunk went the worker's way
            tg.cancel_scope.cancel()
