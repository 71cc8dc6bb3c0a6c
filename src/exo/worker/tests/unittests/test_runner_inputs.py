"""The runner's main loop takes every task and cancel already queued before its next step
(one per step held a pipeline's requests back by a trip through every stage each)."""

from pathlib import Path

from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import Event
from exo.shared.types.tasks import Task, TaskId, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.instances import BoundInstance
from exo.shared.types.worker.runners import RunnerId
from exo.utils.channels import mp_channel
from exo.worker.runner.runner import Runner
from exo.worker.runner.settings import RunnerSettings
from exo.worker.tests.test_distributed_runners import make_instance


def _task(i: int) -> TextGeneration:
    instance = make_instance("pipeline", 1)
    return TextGeneration(
        task_id=TaskId(f"task-{i}"), instance_id=instance.instance_id,
        command_id=CommandId(f"cmd-{i}"),
        task_params=TextGenerationTaskParams(
            model=EMBEDDED_MODEL_ID, input=[InputMessage(role="user", content="hi")]),
    )  # fmt: skip


class Recording(Runner):
    def __init__(self, tmp_path: Path) -> None:
        instance = make_instance("pipeline", 1)
        [rid] = instance.shard_assignments.runner_to_shard
        bound = BoundInstance(instance=instance, bound_runner_id=RunnerId(rid),
                              bound_node_id=NodeId("node-0"))  # fmt: skip
        events, _ = mp_channel[Event]()
        self.task_in, tasks = mp_channel[Task]()
        self.cancel_in, cancels = mp_channel[TaskId]()
        super().__init__(bound, events, tasks, cancels, RunnerSettings(tmp_path, tmp_path))
        self.seen: list[str] = []

    def handle_task(self, task: Task) -> None:
        self.seen.append(str(task.task_id))

    def _handle_cancel(self, task_id: TaskId) -> None:
        self.seen.append(f"cancel {task_id}")


def test_every_queued_task_and_cancel_is_taken_before_the_next_step(tmp_path: Path) -> None:
    runner = Recording(tmp_path)
    for i in range(5):
        runner.task_in.send(_task(i))
    runner.cancel_in.send(TaskId("task-0"))
    runner._take_inputs(block=False)  # pyright: ignore[reportPrivateUsage]
    assert sorted(runner.seen) == ["cancel task-0", *(f"task-{i}" for i in range(5))]
    runner._take_inputs(block=False)  # nothing queued: returns at once  # pyright: ignore[reportPrivateUsage]
    assert len(runner.seen) == 6
