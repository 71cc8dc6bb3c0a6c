"""Real runner processes of one instance joined over torch.distributed (gloo on
127.0.0.1): a 2-rank pipeline and 3-way tensor parallel answer exactly as one runner."""

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from exo.shared.models.embedded import EMBEDDED_MODEL_ID, embedded_model_card
from exo.shared.models.model_cards import ModelId
from exo.shared.types.chunks import ErrorChunk, TokenChunk
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import ChunkGenerated, Event, RunnerStatusUpdated
from exo.shared.types.tasks import (
    ConnectToGroup,
    LoadModel,
    StartWarmup,
    TaskId,
    TextGeneration,
)
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.instances import (
    BoundInstance,
    Instance,
    InstanceId,
    ShardAssignments,
    Sharding,
)
from exo.shared.types.worker.runners import RunnerId, RunnerReady, RunnerStatus
from exo.shared.types.worker.shards import (
    PipelineShardMetadata,
    ShardMetadata,
    TensorShardMetadata,
)
from exo.tests.node_process import free_port
from exo.utils.channels import Receiver, Sender, channel
from exo.worker.runner.runner_supervisor import RunnerSupervisor
from exo.worker.runner.settings import RunnerSettings

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PROMPT = "What is the capital of France? Answer in one word."


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_instance(sharding: Sharding, world: int) -> Instance:
    """An instance of the embedded model over ``world`` ranks (fake node ids, one host);
    runner ids are unique per configuration, so several can be loaded at once."""
    card = embedded_model_card()
    cuts = [round(i * card.n_layers / world) for i in range(world + 1)]
    shards: dict[RunnerId, ShardMetadata] = {}
    nodes: dict[NodeId, RunnerId] = {}
    for rank in range(world):
        rid = RunnerId(f"{sharding}-{world}-{rank}")
        nodes[NodeId(f"node-{rank}")] = rid
        if sharding == "pipeline":
            shards[rid] = PipelineShardMetadata(
                model_card=card, device_rank=rank, world_size=world,
                start_layer=cuts[rank], end_layer=cuts[rank + 1], n_layers=card.n_layers,
            )
        else:
            shards[rid] = TensorShardMetadata(model_card=card, device_rank=rank, world_size=world)
    return Instance(
        instance_id=InstanceId(f"{sharding}-{world}"),
        sharding=sharding,
        shard_assignments=ShardAssignments(
            model_id=EMBEDDED_MODEL_ID, runner_to_shard=shards, node_to_runner=nodes
        ),
        group_port=free_port(),
    )


class RunnerEvents:
    """What a group of runners reports, as it comes: each runner's status, each command's
    text and when each of its tokens arrived, and the commands that finished. An error
    chunk raises (a failed generation fails at once, not at the deadline)."""

    def __init__(self, events: Receiver[Event]) -> None:
        self.events = events
        self.status: dict[RunnerId, RunnerStatus] = {}
        self.text: dict[CommandId, str] = {}
        self.arrivals: dict[CommandId, list[float]] = {}
        self.finished: set[CommandId] = set()

    async def until(self, done: Callable[[], bool], timeout: float) -> None:
        with anyio.fail_after(timeout):
            while not done():
                event = await self.events.receive()
                match event:
                    case RunnerStatusUpdated():
                        self.status[event.runner_id] = event.runner_status
                    case ChunkGenerated(chunk=TokenChunk() as chunk):
                        command = event.command_id
                        self.text[command] = self.text.get(command, "") + chunk.text
                        self.arrivals.setdefault(command, []).append(time.perf_counter())
                        if chunk.finish_reason is not None:
                            self.finished.add(command)
                    case ChunkGenerated(chunk=ErrorChunk() as chunk):
                        raise RuntimeError(f"{event.command_id}: {chunk.error_message}")
                    case _:
                        pass


def make_supervisors(
    instance: Instance, send: Sender[Event], tmp_path: Path, max_batch: int | None = None
) -> list[RunnerSupervisor]:
    """One runner supervisor per rank of ``instance``, all reporting to ``send``."""
    settings = RunnerSettings(cache_dir=tmp_path / "cache", models_dir=tmp_path / "models")
    if max_batch is not None:
        settings = replace(settings, max_batch=max_batch)
    return [
        RunnerSupervisor.create(
            BoundInstance(instance=instance, bound_runner_id=rid, bound_node_id=nid),
            send.clone(), settings,
        )
        for nid, rid in instance.shard_assignments.node_to_runner.items()
    ]


async def _answer(instance: Instance, tmp_path: Path) -> str:
    return await answer_of(instance, tmp_path, EMBEDDED_MODEL_ID)


async def answer_of(instance: Instance, tmp_path: Path, model_id: ModelId,
                    messages: list[InputMessage] | None = None) -> str:
    """The greedy answer (16 tokens) of `instance`'s runners to PROMPT (or `messages`)."""
    send, receive = channel[Event]()
    group = RunnerEvents(receive)
    supervisors = make_supervisors(instance, send, tmp_path)
    iid = instance.instance_id
    async with anyio.create_task_group() as tg:
        for s in supervisors:
            tg.start_soon(s.run)
        if instance.world_size > 1:
            for s in supervisors:
                tg.start_soon(s.start_task, ConnectToGroup(instance_id=iid))
            await group.until(lambda: len(group.status) == len(supervisors) and all(
                type(st).__name__ == "RunnerConnected" for st in group.status.values()), 120)
        for s in supervisors:
            tg.start_soon(s.start_task, LoadModel(instance_id=iid))
        await group.until(lambda: all(
            type(group.status.get(s.runner_id)).__name__ == "RunnerLoaded" for s in supervisors), 180)
        for s in supervisors:
            tg.start_soon(s.start_task, StartWarmup(instance_id=iid))
        await group.until(lambda: all(
            isinstance(group.status.get(s.runner_id), RunnerReady) for s in supervisors), 180)
        command = CommandId("cmd")
        leader = supervisors[0]
        assert leader.bound_instance.bound_shard.device_rank == 0
        await leader.start_task(TextGeneration(
            task_id=TaskId("task"), instance_id=iid, command_id=command,
            task_params=TextGenerationTaskParams(
                model=model_id, input=messages or [InputMessage(role="user", content=PROMPT)],
                temperature=0.0, max_tokens=16,
            ),
        ))
        await group.until(lambda: command in group.finished, 120)
        for s in supervisors:
            tg.start_soon(s.stop)
    return group.text[CommandId("cmd")]


async def test_pipeline_and_tensor_parallel_match_one_runner(tmp_path: Path) -> None:
    alone = await _answer(make_instance("pipeline", 1), tmp_path)
    assert "paris" in alone.lower()
    assert await _answer(make_instance("pipeline", 2), tmp_path) == alone
    assert await _answer(make_instance("tensor", 3), tmp_path) == alone
