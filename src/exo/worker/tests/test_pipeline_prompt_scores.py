"""A prompt's log-probabilities (completions' echo with logprobs) across a real 2-rank
pipeline over gloo on 127.0.0.1: the last stage computes every position's logits and sends
them to rank 0; they match one runner's, and the tokens after them do too."""

from pathlib import Path
from typing import Any

import anyio
import pytest

from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.types.chunks import EchoedPrompt, ErrorChunk, TokenChunk
from exo.shared.types.common import CommandId
from exo.shared.types.events import ChunkGenerated, Event, RunnerStatusUpdated
from exo.shared.types.tasks import ConnectToGroup, LoadModel, StartWarmup, TaskId, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.instances import Instance
from exo.shared.types.worker.runners import RunnerConnected, RunnerLoaded, RunnerReady
from exo.utils.channels import channel
from exo.worker.tests.test_distributed_runners import make_instance, make_supervisors

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PROMPT = "The capital of France is Paris, and the capital of Italy is Rome. " * 40


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _params(max_tokens: int) -> TextGenerationTaskParams:
    return TextGenerationTaskParams(
        model=EMBEDDED_MODEL_ID,
        input=[InputMessage(role="user", content="")],
        raw_prompt=PROMPT,
        max_tokens=max_tokens,
        temperature=0.0,
        echo=True,
        logprobs=True,
        top_logprobs=2,
    )


async def _scores(instance: Instance, tmp_path: Path) -> tuple[EchoedPrompt, list[int]]:
    """The prompt as scored with max_tokens 0, and the greedy tokens after it."""
    send, receive = channel[Event]()
    supervisors = make_supervisors(instance, send, tmp_path)
    status: dict[str, object] = {}
    finals: dict[CommandId, TokenChunk] = {}
    tokens: list[int] = []

    async def until(kind: type, timeout: float) -> None:
        with anyio.fail_after(timeout):
            while not all(isinstance(status.get(s.runner_id), kind) for s in supervisors):
                await pump()

    async def pump() -> None:
        match await receive.receive():
            case RunnerStatusUpdated() as e:
                status[e.runner_id] = e.runner_status
            case ChunkGenerated(chunk=ErrorChunk() as chunk):
                raise RuntimeError(chunk.error_message)
            case ChunkGenerated(chunk=TokenChunk() as chunk) as e:
                if chunk.token_id >= 0 and e.command_id == CommandId("gen"):
                    tokens.append(chunk.token_id)
                if chunk.finish_reason is not None:
                    finals[e.command_id] = chunk
            case _:
                pass

    iid = instance.instance_id
    async with anyio.create_task_group() as tg:
        for s in supervisors:
            tg.start_soon(s.run)
        steps: list[tuple[Any, type, float]] = [
            (LoadModel, RunnerLoaded, 180.0),
            (StartWarmup, RunnerReady, 180.0),
        ]
        if instance.world_size > 1:
            steps.insert(0, (ConnectToGroup, RunnerConnected, 120.0))
        for task, reached, timeout in steps:
            for s in supervisors:
                tg.start_soon(s.start_task, task(instance_id=iid))
            await until(reached, timeout)
        leader = supervisors[0]
        for name, max_tokens in (("score", 0), ("gen", 4)):
            await leader.start_task(
                TextGeneration(
                    task_id=TaskId(name),
                    instance_id=iid,
                    command_id=CommandId(name),
                    task_params=_params(max_tokens),
                )
            )
        with anyio.fail_after(180):
            while len(finals) < 2:
                await pump()
        for s in supervisors:
            tg.start_soon(s.stop)
    echo = finals[CommandId("score")].echo
    assert echo is not None and echo.logprobs is not None
    return echo, tokens


async def test_prompt_scores_across_a_pipeline_match_one_runner(tmp_path: Path) -> None:
    alone, alone_tokens = await _scores(make_instance("pipeline", 1), tmp_path)
    split, split_tokens = await _scores(make_instance("pipeline", 2), tmp_path)
    assert alone.logprobs is not None and split.logprobs is not None
    # a prompt longer than one prefill chunk (512 tokens): chunked prefill is scored too
    assert len(alone.tokens) > 512 and len(alone.logprobs) == len(alone.tokens) - 1
    assert split.tokens == alone.tokens and split.text == alone.text
    for a, b in zip(alone.logprobs, split.logprobs, strict=True):
        assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-3
        assert [t.token for t in a.top] == [t.token for t in b.top]
    assert split_tokens == alone_tokens and len(alone_tokens) == 4
