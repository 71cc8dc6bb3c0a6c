"""Models whose layers differ in size (DeepSeek / GLM: light dense first layers, heavy MoE
layers) and whose cache is a latent (MLA): placement splits by the bytes of each layer and
reserves the latent cache. Pure tables."""

import pytest

from exo.master.layer_split import split_by_bytes
from exo.master.placement import _split  # pyright: ignore[reportPrivateUsage]
from exo.master.placement_memory import (
    RUNNER_OVERHEAD_BYTES,
    card_estimate,
    pipeline_memory,
    tensor_memory,
)
from exo.shared.models.memory import KV_PAGE, runner_max_seq
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.memory import Memory

from .test_placement import MB, cluster, layer_ranges, place, placed


@pytest.mark.parametrize(
    ("layer_bytes", "room", "expected"),
    [
        # equal layers, equal room: halves
        ([10] * 8, [1, 1], [4, 4]),
        # one light dense layer then heavy ones: the first node takes the light one extra
        ([1, 10, 10, 10, 10, 10, 10], [1, 1], [4, 3]),
        # room 2:1 over equal layers
        ([5] * 9, [2, 1], [6, 3]),
        # three dense layers (DeepSeek V3) among MoE layers, three equal nodes
        ([1, 1, 1, 20, 20, 20, 20, 20, 20], [1, 1, 1], [5, 2, 2]),
        # every node keeps at least one layer, however little room it has
        ([10, 10, 10], [100, 1, 1], [1, 1, 1]),
        ([10, 10, 10, 10], [100, 0, 0], [2, 1, 1]),
        # no room at all anywhere: in proportion to nothing is equal shares
        ([10] * 4, [0, 0], [2, 2]),
        # a tie between two boundaries goes to the earlier one
        ([10, 10], [1, 1], [1, 1]),
        ([10, 10, 10], [1, 1], [1, 2]),
        # one node: every layer
        ([3, 4, 5], [7], [3]),
    ],
)
def test_split_by_bytes(layer_bytes: list[int], room: list[int], expected: list[int]) -> None:
    got = split_by_bytes(layer_bytes, room)
    assert got == expected
    assert sum(got) == len(layer_bytes) and min(got) >= 1


def test_split_by_bytes_refuses_more_nodes_than_layers() -> None:
    with pytest.raises(ValueError, match="cannot split 2 layers over 3 nodes"):
        split_by_bytes([1, 1], [1, 1, 1])


def moe_card(layer_mb: list[int], kv_bytes_per_token: int = 0) -> ModelCard:
    """A model of light dense layers and heavy MoE layers (`layer_mb` each)."""
    return ModelCard(
        model_id=ModelId("test/moe"),
        n_layers=len(layer_mb),
        hidden_size=576,
        num_heads=8,
        num_kv_heads=8,
        storage_size=Memory.from_mb(sum(layer_mb)),
        context_length=64,
        architecture="deepseek2",
        head_dim=2,
        weight_format="Q4_K",
        layer_bytes=[mb * MB for mb in layer_mb],
        kv_bytes_per_token=kv_bytes_per_token,
    )


def test_a_shards_weights_are_the_bytes_of_its_own_layers() -> None:
    model = moe_card([10, 10, 300, 300])
    assert card_estimate(model, 0, 2).weights == 20 * MB
    assert card_estimate(model, 2, 4).weights == 600 * MB
    assert card_estimate(model, 1, 3).weights == 310 * MB
    assert card_estimate(model, 0, 4, world_size=2).weights == 310 * MB  # a tensor rank: half


def test_pipeline_splits_by_layer_bytes_not_by_layer_count() -> None:
    """Two equal nodes, two light dense layers then six heavy ones: by count each node would
    take four layers (20 + 600 MB against 1200 MB); by bytes the first takes the dense layers
    and three heavy ones (920 MB against 900 MB)."""
    model = moe_card([10, 10, 300, 300, 300, 300, 300, 300])
    instance = placed(place(model, cluster(a=1400, b=1400)))
    assert layer_ranges(instance) == {"a": (0, 5), "b": (5, 8)}


def test_the_split_falls_back_to_counts_when_a_byte_share_does_not_fit() -> None:
    """Equal room, a heavy middle layer: the byte split's cut ties and goes early, leaving the
    second node 700 MB it has no room for; by count (within the caps) each node fits."""
    model = moe_card([100, 600, 100])
    free = [2000 * MB, 500 * MB + RUNNER_OVERHEAD_BYTES]
    assert split_by_bytes(model.layer_bytes, [1, 1]) == [1, 2]
    assert pipeline_memory(model, 1, 3) > free[1]
    assert _split(model, free, [1, 1], [2, 1]) == [2, 1]
    assert pipeline_memory(model, 2, 3) <= free[1]


def test_the_latent_cache_is_reserved_per_layer_and_whole_on_every_tensor_rank() -> None:
    """MLA caches kv_bytes_per_token a position (all layers), not 2 x kv heads x head_dim."""
    per_token = 4 * 576 * 4  # 4 layers of a 576-value latent in float32
    model = moe_card([10, 10, 10, 10], kv_bytes_per_token=per_token)
    positions = -(-runner_max_seq(model.context_length) // KV_PAGE) * KV_PAGE
    whole = card_estimate(model, 0, 4, max_batch=1)
    assert whole.kv_cache == per_token * positions
    assert card_estimate(model, 0, 2, max_batch=1).kv_cache == per_token // 2 * positions
    rank = card_estimate(model, 0, 4, world_size=2, max_batch=1)
    assert rank.kv_cache == whole.kv_cache  # the latent is not split by heads
    assert tensor_memory(model, 2) > card_estimate(model, 0, 4, 2).weights
