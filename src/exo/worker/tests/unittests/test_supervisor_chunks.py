"""A runner's chunks go from its pipe straight to the node's delivery (one hop a streamed
token in the node); every other event still reaches the worker, in order."""

from multiprocessing.process import BaseProcess
from typing import cast

import anyio
import pytest

from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.types.chunks import TokenChunk
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import ChunkGenerated, Event, TaskStatusUpdated
from exo.shared.types.tasks import Task, TaskId, TaskStatus
from exo.shared.types.worker.instances import BoundInstance
from exo.shared.types.worker.runners import RunnerId
from exo.utils.channels import channel, mp_channel
from exo.worker.runner.runner_supervisor import RunnerSupervisor
from exo.worker.tests.test_distributed_runners import make_instance


class _LiveProcess:
    exitcode = None

    def is_alive(self) -> bool:
        return True


def _chunk(idx: int) -> ChunkGenerated:
    return ChunkGenerated(
        command_id=CommandId("cmd"),
        chunk=TokenChunk(model=EMBEDDED_MODEL_ID, text=f"t{idx}", token_id=idx, idx=idx),
    )


@pytest.mark.asyncio
async def test_chunks_go_to_the_sink_and_other_events_to_the_worker() -> None:
    instance = make_instance("pipeline", 1)
    [rid] = instance.shard_assignments.runner_to_shard
    bound = BoundInstance(instance=instance, bound_runner_id=RunnerId(rid),
                          bound_node_id=NodeId("node-0"))  # fmt: skip
    task_send, _ = mp_channel[Task]()
    cancel_send, _ = mp_channel[TaskId]()
    ev_send, ev_recv = mp_channel[Event]()
    events, worker_inbox = channel[Event]()
    delivered: list[ChunkGenerated] = []
    supervisor = RunnerSupervisor(
        shard_metadata=bound.bound_shard, bound_instance=bound,
        runner_process=cast("BaseProcess", cast(object, _LiveProcess())),
        initialize_timeout=60, _ev_recv=ev_recv, _task_sender=task_send,
        _event_sender=events, _cancel_sender=cancel_send, chunk_sink=delivered.append,
    )  # fmt: skip
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
