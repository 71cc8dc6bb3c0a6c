"""Requests that arrive together reach a busy runner together: the supervisor does not wait
for each request's acknowledgement (the runner's side, taking every queued input before its
next step, is tested with a real runner in engines/tests/test_runner_queued_inputs.py)."""

from pathlib import Path

import anyio

from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.types.common import CommandId
from exo.shared.types.events import Event
from exo.shared.types.tasks import Task, TaskId, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.utils.channels import channel, mp_channel
from exo.worker.tests.test_distributed_runners import make_instance
from exo.worker.tests.unittests.bare_supervisor import bare_supervisor


def _task(i: int) -> TextGeneration:
    instance = make_instance("pipeline", 1)
    return TextGeneration(
        task_id=TaskId(f"task-{i}"), instance_id=instance.instance_id,
        command_id=CommandId(f"cmd-{i}"),
        task_params=TextGenerationTaskParams(
            model=EMBEDDED_MODEL_ID, input=[InputMessage(role="user", content="hi")]),
    )  # fmt: skip


def test_a_request_is_sent_without_waiting_for_the_runner_to_take_it(tmp_path: Path) -> None:
    """The worker forwards one task at a time; waiting for each request's acknowledgement
    let a busy runner (a pipeline acknowledges once per trip through its stages) receive
    one request per step however many were queued."""
    task_send, task_recv = mp_channel[Task]()
    cancel_send, _ = mp_channel[TaskId]()
    _, ev_recv = mp_channel[Event]()

    async def send_all() -> set[TaskId]:
        events, _ = channel[Event]()
        supervisor = bare_supervisor(ev_recv, task_send, cancel_send, events)
        with anyio.fail_after(10):  # the runner never acknowledges: waiting would hang
            for i in range(4):
                await supervisor.start_task(_task(i))
        return set(supervisor.in_progress)

    in_progress = anyio.run(send_all)
    assert [str(task_recv.receive().task_id) for _ in range(4)] == [f"task-{i}" for i in range(4)]
    assert in_progress == {TaskId(f"task-{i}") for i in range(4)}
