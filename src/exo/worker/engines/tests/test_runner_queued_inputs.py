"""A serving runner takes every queued request before its next step, so requests that arrive
together form one batch (not one more request per step); a flood is taken in bounded bites."""

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.tests.builders import NODE_A, bound, single_instance
from exo.shared.types.common import CommandId
from exo.shared.types.events import Event
from exo.shared.types.tasks import Task, TaskId, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import RunnerReady
from exo.utils.channels import MpSender, mp_channel
from exo.worker.engines.engine import Engine, load_engine
from exo.worker.runner import runner as runner_module
from exo.worker.runner.generation import Generation
from exo.worker.runner.runner import Runner
from exo.worker.runner.settings import RunnerSettings


@pytest.fixture(scope="module")
def engine(gguf_path: Path, tokenizer_cache: Path) -> Engine:
    return load_engine(gguf_path, threads=1, cache_dir=tokenizer_cache)


def _task(i: int) -> TextGeneration:
    return TextGeneration(
        task_id=TaskId(f"t{i}"),
        instance_id=InstanceId("instance"),
        command_id=CommandId(f"c{i}"),
        task_params=TextGenerationTaskParams.model_validate(
            {"model": EMBEDDED_MODEL_ID, "temperature": 0.0, "max_tokens": 3,
             "input": [InputMessage(role="user", content=f"Say something about {i}.")]}
        ),
    )  # fmt: skip


class _Serving:
    """A runner serving `engine` over real pipes; what it sends is collected in `events`."""

    def __init__(self, engine: Engine, tmp: Path) -> None:
        event_tx, event_rx = mp_channel[Event]()
        self.task_tx, task_rx = mp_channel[Task]()
        self.cancel_tx, cancel_rx = mp_channel[TaskId]()
        settings = RunnerSettings(cache_dir=tmp, models_dir=tmp)
        self.runner = Runner(
            bound(single_instance(), NODE_A), event_tx, task_rx, cancel_rx, settings
        )
        self.runner.generation = Generation(engine, max_batch=8)
        self.runner.current_status = RunnerReady()
        self.events: list[Event] = []
        self._event_tx: MpSender[Event] = event_tx

        def drain() -> None:  # the node's side of the pipe: keeps it from filling up
            try:
                while True:
                    self.events.append(event_rx.receive())
            except Exception:
                return

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()

    def close(self) -> None:
        self._event_tx.close()
        self._drain.join(timeout=10)


@pytest.fixture
def serving(engine: Engine, tmp_path: Path) -> Iterator[_Serving]:
    s = _Serving(engine, tmp_path)
    yield s
    s.close()


def test_requests_queued_together_join_one_batch(serving: _Serving) -> None:
    for i in range(8):
        serving.task_tx.send(_task(i))
    generation = serving.runner.generation
    assert generation is not None
    serving.runner._take_inputs(block=False)  # pyright: ignore[reportPrivateUsage]
    assert generation.active == 8  # all of them, not one per step
    generation.step()
    assert generation.batch.running == 8  # every one holds a slot from the first step on
    # their prompts prefill a turn (SERVE_PREFILL_TURN tokens) a step, oldest first: the
    # first tokens come out in arrival order, a turn's worth per step
    order: list[str] = []
    for _ in range(8):
        order += [t for t, r in generation.requests.items()
                  if r.completion_tokens > 0 and t not in order]  # fmt: skip
        if len(order) == 8:
            break
        generation.step()
    assert order == [f"t{i}" for i in range(8)]


def test_a_flood_is_taken_in_bounded_bites(
    serving: _Serving, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "_MAX_INPUTS_PER_STEP", 5)
    for i in range(7):
        serving.task_tx.send(_task(i))
    generation = serving.runner.generation
    assert generation is not None
    serving.runner._take_inputs(block=False)  # pyright: ignore[reportPrivateUsage]
    assert generation.active == 5  # the running streams get their next step first
    serving.runner._take_inputs(block=False)  # pyright: ignore[reportPrivateUsage]
    assert generation.active == 7


def test_a_queued_cancel_is_taken_with_the_requests(serving: _Serving) -> None:
    serving.task_tx.send(_task(0))
    serving.task_tx.send(_task(1))
    generation = serving.runner.generation
    assert generation is not None
    serving.runner._take_inputs(block=False)  # pyright: ignore[reportPrivateUsage]
    serving.cancel_tx.send(TaskId("t0"))
    serving.task_tx.send(_task(2))
    serving.runner._take_inputs(block=False)  # pyright: ignore[reportPrivateUsage]
    assert sorted(generation.requests) == ["t1", "t2"]
