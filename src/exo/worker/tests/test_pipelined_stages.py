"""Pipelined stages with real runner processes over gloo on 127.0.0.1: 2 and 3 ranks with
4 concurrent requests (greedy and seeded) give each request the text it gets alone; a cancel
in the middle of the pipeline frees its slot on every stage (each rank's trace, written
when the pipeline stops, says how many slots its cache still held); a pipeline of k stages
decodes k micro-batches of a runner's max_batch at once."""

from pathlib import Path

import anyio
import pytest

from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.types.common import CommandId
from exo.shared.types.events import Event
from exo.shared.types.tasks import ConnectToGroup, LoadModel, StartWarmup, TaskId, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.instances import Instance
from exo.shared.types.worker.runners import RunnerReady
from exo.utils.channels import channel
from exo.worker.runner.runner_supervisor import RunnerSupervisor
from exo.worker.runner.stage_trace import TRACE_DIR_ENV, StageTrace, load_traces
from exo.worker.tests.test_distributed_runners import (
    RunnerEvents,
    make_instance,
    make_supervisors,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PROMPTS = (
    "What is the capital of France?",
    "Name three colours.",
    "Write one sentence about the sea.",
    "Count from one to five.",
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _task(instance: Instance, i: int, max_tokens: int) -> TextGeneration:
    seeded = i % 2 == 1  # half greedy, half sampled with a seed
    return TextGeneration(
        task_id=TaskId(f"task-{i}"), instance_id=instance.instance_id,
        command_id=CommandId(f"cmd-{i}"),
        task_params=TextGenerationTaskParams(
            model=EMBEDDED_MODEL_ID, input=[InputMessage(role="user", content=PROMPTS[i])],
            temperature=0.8 if seeded else 0.0, seed=100 + i if seeded else None,
            max_tokens=max_tokens,
            # a long answer cannot end early: SmolLM2's end tokens are never picked
            logit_bias={0: -100.0, 1: -100.0, 2: -100.0} if max_tokens > 100 else {},
            stop=["e"] if i == 2 else [],  # a stop string ends one request early
        ),
    )  # fmt: skip


class Group:
    """The runners of one instance, connected, loaded and warmed up."""

    def __init__(self, instance: Instance, tmp_path: Path, max_batch: int | None = None) -> None:
        send, receive = channel[Event]()
        self.instance = instance
        self.events = RunnerEvents(receive)
        self.supervisors: list[RunnerSupervisor] = make_supervisors(
            instance, send, tmp_path, max_batch
        )

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        iid, sups, ev = self.instance.instance_id, self.supervisors, self.events
        for s in sups:
            tg.start_soon(s.run)
        if self.instance.world_size > 1:
            for s in sups:
                tg.start_soon(s.start_task, ConnectToGroup(instance_id=iid))
            await ev.until(lambda: len(ev.status) == len(sups) and all(
                type(st).__name__ == "RunnerConnected" for st in ev.status.values()), 120)
        for s in sups:
            tg.start_soon(s.start_task, LoadModel(instance_id=iid))
        await ev.until(lambda: all(
            type(ev.status.get(s.runner_id)).__name__ == "RunnerLoaded" for s in sups), 180)
        for s in sups:
            tg.start_soon(s.start_task, StartWarmup(instance_id=iid))
        await ev.until(lambda: all(
            isinstance(ev.status.get(s.runner_id), RunnerReady) for s in sups), 180)

    async def submit(self, task: TextGeneration) -> None:
        await self.supervisors[0].start_task(task)

    async def stop(self, trace_dir: Path | None = None) -> list[StageTrace]:
        """Stop rank 0 first (it releases the others, which then write their traces)."""
        await self.supervisors[0].stop()
        traces: list[StageTrace] = []
        if trace_dir is not None:
            with anyio.fail_after(60):
                while len(traces := load_traces(trace_dir)) < len(self.supervisors):
                    await anyio.sleep(0.05)  # polling for files, bounded by the deadline
        for s in self.supervisors[1:]:
            await s.stop()
        return traces


async def _texts(world: int, tmp_path: Path, concurrent: bool) -> tuple[dict[int, str],
                                                                        list[StageTrace]]:
    instance = make_instance("pipeline", world)
    group = Group(instance, tmp_path)
    texts: dict[int, str] = {}
    traces: list[StageTrace] = []
    async with anyio.create_task_group() as tg:
        await group.start(tg)
        tasks = [_task(instance, i, 12) for i in range(len(PROMPTS))]
        for batch in [tasks] if concurrent else [[t] for t in tasks]:
            for t in batch:
                await group.submit(t)
            await group.events.until(
                lambda b=batch: all(t.command_id in group.events.finished for t in b), 180)
        texts = {i: group.events.text[t.command_id] for i, t in enumerate(tasks)}
        traces = await group.stop(tmp_path / "trace" if world > 1 else None)
    return texts, traces


async def test_two_and_three_stages_give_each_request_its_tokens_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone, _ = await _texts(1, tmp_path, concurrent=False)
    assert all(alone.values()) and "e" not in alone[2]
    for world in (2, 3):
        trace_dir = tmp_path / "trace"
        monkeypatch.setenv(TRACE_DIR_ENV, str(trace_dir))
        together, traces = await _texts(world, tmp_path, concurrent=True)
        assert together == alone, world
        assert [t.stage for t in traces] == list(range(world))
        for t in traces:  # every stage worked on more than one micro-batch, and let go
            assert len({b.lane for b in t.intervals}) >= 2, (world, t.stage)
            assert t.held_slots == 0
        for f in trace_dir.iterdir():
            f.unlink()


async def test_a_cancel_mid_pipeline_frees_its_slot_on_every_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace_dir = tmp_path / "trace"
    monkeypatch.setenv(TRACE_DIR_ENV, str(trace_dir))
    instance = make_instance("pipeline", 3)
    group = Group(instance, tmp_path)
    ev = group.events
    traces: list[StageTrace] = []
    async with anyio.create_task_group() as tg:
        await group.start(tg)
        tasks = [_task(instance, i, 400 if i == 0 else 24) for i in range(len(PROMPTS))]
        for t in tasks:
            await group.submit(t)
        victim = tasks[0]
        await ev.until(lambda: len(ev.arrivals.get(victim.command_id, [])) >= 3, 120)
        await group.supervisors[0].cancel_task(victim.task_id)
        await ev.until(lambda: all(t.command_id in ev.finished for t in tasks), 180)
        cut = len(ev.arrivals[victim.command_id])
        assert cut < 100  # it ended long before its 400 tokens
        traces = await group.stop(trace_dir)
    assert [t.held_slots for t in traces] == [0, 0, 0]


async def test_a_pipeline_decodes_a_micro_batch_of_max_batch_per_stage(tmp_path: Path) -> None:
    # 2 stages of max_batch 2: all 4 requests decode at once (with 2 slots, the last two
    # would get their first token only after one of the first two ended its 120 tokens)
    instance = make_instance("pipeline", 2)
    group = Group(instance, tmp_path, max_batch=2)
    ev = group.events
    async with anyio.create_task_group() as tg:
        await group.start(tg)
        tasks = [_task(instance, i, 120) for i in range(len(PROMPTS))]
        tasks = [t.model_copy(update={"task_params": t.task_params.model_copy(
            update={"stop": []})}) for t in tasks]  # fmt: skip
        for t in tasks:
            await group.submit(t)
        await ev.until(lambda: all(ev.arrivals.get(t.command_id) for t in tasks), 120)
        assert not any(t.command_id in ev.finished for t in tasks)
        for t in tasks:
            await group.supervisors[0].cancel_task(t.task_id)
        await ev.until(lambda: all(t.command_id in ev.finished for t in tasks), 120)
        await group.stop()
