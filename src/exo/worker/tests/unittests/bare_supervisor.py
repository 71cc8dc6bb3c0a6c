"""A supervisor over pipes the test holds, of a runner that is never started."""

from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import cast

from exo.shared.types.common import NodeId
from exo.shared.types.events import ChunkGenerated, Event
from exo.shared.types.tasks import Task, TaskId
from exo.shared.types.worker.instances import BoundInstance
from exo.shared.types.worker.runners import RunnerId
from exo.utils.channels import MpReceiver, MpSender, Sender
from exo.worker.runner.runner_supervisor import RunnerSupervisor
from exo.worker.tests.test_distributed_runners import make_instance


class _LiveProcess:
    """A runner process that says it is alive."""

    exitcode = None

    def is_alive(self) -> bool:
        return True


def bare_supervisor(
    events_in: MpReceiver[Event],
    tasks_out: MpSender[Task],
    cancels_out: MpSender[TaskId],
    events_out: Sender[Event],
    chunk_sink: Callable[[ChunkGenerated], None] | None = None,
) -> RunnerSupervisor:
    """The supervisor of a one-runner pipeline instance's runner, on these pipes."""
    instance = make_instance("pipeline", 1)
    [rid] = instance.shard_assignments.runner_to_shard
    bound = BoundInstance(instance=instance, bound_runner_id=RunnerId(rid),
                          bound_node_id=NodeId("node-0"))  # fmt: skip
    return RunnerSupervisor(
        shard_metadata=bound.bound_shard, bound_instance=bound,
        runner_process=cast("BaseProcess", cast(object, _LiveProcess())),
        initialize_timeout=60, _ev_recv=events_in, _task_sender=tasks_out,
        _event_sender=events_out, _cancel_sender=cancels_out, chunk_sink=chunk_sink,
    )  # fmt: skip
