"""Placement's memory estimate is the engine's (`exo.shared.models.memory`) fed from the card:
weights in their running format, the KV cache at the runner's maximum, a runner's runtime."""

from exo.master.placement import PlacementError, place_instance, placement_previews
from exo.master.placement_memory import (
    RUNNER_OVERHEAD_BYTES,
    card_estimate,
    layer_capacity,
    pipeline_memory,
    shard_memory,
    tensor_memory,
)
from exo.shared.constants import EXO_MAX_CONTEXT_TOKENS, EXO_RUNNER_MAX_BATCH
from exo.shared.models.memory import estimate_runner_memory
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.common import NodeId
from exo.shared.types.memory import Memory
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.topology import Topology
from exo.shared.types.worker.instances import Instance, InstanceId
from exo.shared.types.worker.shards import PipelineShardMetadata, TensorShardMetadata

MB = 1024 * 1024


def card(storage_mb: int, fmt: str = "Q4_K", context: int = 2048, kv_heads: int = 4) -> ModelCard:
    return ModelCard(
        model_id=ModelId("test/model"), n_layers=24, hidden_size=1024, num_heads=16,
        num_kv_heads=kv_heads, storage_size=Memory.from_mb(storage_mb), context_length=context,
        architecture="llama", head_dim=64, weight_format=fmt,
    )  # fmt: skip


def one_node(mb: float) -> dict[NodeId, NodeInfo]:
    m = Memory.from_mb(mb)
    return {NodeId("a"): NodeInfo(hostname="h", cpu_count=4, memory_total=m, memory_available=m)}


def place(model: ModelCard, nodes: dict[NodeId, NodeInfo]) -> Instance | PlacementError:
    return place_instance(model, "pipeline", 1, nodes, Topology(), {}, InstanceId("i"))


def test_a_whole_shard_needs_exactly_the_engines_estimate() -> None:
    model = card(500, "Q4_0", context=32768)
    whole = PipelineShardMetadata(model_card=model, device_rank=0, world_size=1,
                                  start_layer=0, end_layer=24, n_layers=24)  # fmt: skip
    expected = estimate_runner_memory(
        weight_file_bytes=500 * MB, file_format="Q4_0", n_layers=24, kv_heads=4, head_dim=64,
        max_seq=EXO_MAX_CONTEXT_TOKENS, max_batch=EXO_RUNNER_MAX_BATCH,
    )  # fmt: skip
    assert shard_memory(whole) == expected.total
    assert expected.overhead == RUNNER_OVERHEAD_BYTES


def test_the_kv_cache_at_its_maximum_is_reserved() -> None:
    # 2 * 24 layers * 4 kv heads * 64 * 2 bytes (float16) = 24 KiB per position; 8 x 2048 positions.
    kv = 2 * 24 * 4 * 64 * 2 * EXO_RUNNER_MAX_BATCH * min(2048, EXO_MAX_CONTEXT_TOKENS)
    model = card(100)
    assert card_estimate(model, 0, 24).kv_cache == kv
    assert pipeline_memory(model, 0, 24) == 100 * MB + kv + RUNNER_OVERHEAD_BYTES
    # Room for the weights and the runtime but not the cache: refused, the cache named.
    tight = (100 * MB + RUNNER_OVERHEAD_BYTES + kv // 2) / MB
    refusal = place(model, one_node(tight))
    assert isinstance(refusal, PlacementError) and "of KV cache" in refusal.reason
    assert isinstance(place(model, one_node(tight + kv / MB)), Instance)
    # A short context needs a smaller cache; a long one is served (and cached) up to the cap.
    assert card_estimate(card(100, context=128), 0, 24).kv_cache == kv * 128 // 2048
    assert card_estimate(card(100, context=10**6), 0, 24).kv_cache == kv


def test_the_running_format_decides_the_weights_size() -> None:
    # Room for 1000 MB of weights besides the KV cache and the runtime.
    room = (1000 * MB + card_estimate(card(1), 0, 24).kv_cache + RUNNER_OVERHEAD_BYTES) / MB
    # F16 matrices run as q8 blocks: 1800 MB in the file take 956 MB, and fit.
    assert card_estimate(card(1800, "F16"), 0, 24).weights == round(1800 * MB * 34 / 64)
    assert isinstance(place(card(1800, "F16"), one_node(room)), Instance)
    # Block types run as the file holds them (Q4_0 too): 1050 MB do not fit, 950 MB do.
    assert isinstance(place(card(1050, "Q4_0"), one_node(room)), PlacementError)
    assert isinstance(place(card(950, "Q4_0"), one_node(room)), Instance)
    assert isinstance(place(card(950, "Q4_K_M"), one_node(room)), Instance)


def test_pipeline_capacity_and_previews_count_each_shards_cache() -> None:
    model = card(240)
    per_layer = pipeline_memory(model, 0, 2) - pipeline_memory(model, 0, 1)
    assert per_layer == 10 * MB + card_estimate(model, 0, 1).kv_cache
    free = pipeline_memory(model, 0, 5) + per_layer - 1
    assert layer_capacity(model, free) == 5
    assert layer_capacity(model, RUNNER_OVERHEAD_BYTES) == 0
    nodes = {**one_node(2000), NodeId("b"): one_node(2000)[NodeId("a")]}
    links = Topology.model_validate({"connections": [{"source": "a", "sink": "b"}]})
    previews = placement_previews(model, nodes, links, {})
    two = next(p for p in previews if p.valid and (p.sharding, p.node_count) == ("pipeline", 2))
    assert two.memory_per_node == {NodeId("a"): pipeline_memory(model, 0, 12),
                                   NodeId("b"): pipeline_memory(model, 12, 24)}  # fmt: skip
    assert two.download_bytes == {NodeId("a"): 120 * MB, NodeId("b"): 120 * MB}


def test_a_tensor_rank_holds_its_share_of_the_weights_and_of_the_kv_heads() -> None:
    model = card(800)
    whole, half = card_estimate(model, 0, 24), card_estimate(model, 0, 24, 2)
    assert half.weights == whole.weights // 2 and half.kv_cache == whole.kv_cache // 2
    rank = TensorShardMetadata(model_card=model, device_rank=1, world_size=2)
    assert shard_memory(rank) == tensor_memory(model, 2) == half.total


def with_ends(model: ModelCard, embedding_mb: int, head_mb: int) -> ModelCard:
    return model.model_copy(
        update={"embedding_bytes": embedding_mb * MB, "head_bytes": head_mb * MB}
    )


def test_the_embedding_and_the_head_go_to_the_first_and_last_runners() -> None:
    # 240 MB of layers (10 MB each), a 40 MB embedding and a 60 MB head.
    model = with_ends(card(340), 40, 60)
    weights = {
        (s, e): card_estimate(model, s, e).weights for s, e in [(0, 24), (0, 12), (12, 24), (6, 18)]
    }
    assert weights == {(0, 24): 340 * MB, (0, 12): 160 * MB, (12, 24): 180 * MB,
                       (6, 18): 120 * MB}  # fmt: skip
    # Tied (no head in the file): the last runner holds the embedding again, one runner once.
    tied = with_ends(card(280), 40, 0)
    assert card_estimate(tied, 0, 24).weights == 280 * MB
    assert card_estimate(tied, 12, 24).weights == 160 * MB
    # A tensor rank holds its half of the layers and both ends whole.
    assert card_estimate(model, 0, 24, 2).weights == 220 * MB


def test_capacity_assumes_the_larger_end_and_placement_splits_within_it() -> None:
    model = with_ends(card(340), 40, 60)
    # Room for 12 layers with the head, not with 13: 12, wherever they fall.
    free = pipeline_memory(model, 12, 24)
    assert layer_capacity(model, free) == 12
    nodes = {NodeId(n): one_node(free / MB)[NodeId("a")] for n in ("a", "b")}
    links = Topology.model_validate({"connections": [{"source": "a", "sink": "b"}]})
    placed = place_instance(model, "pipeline", 1, nodes, links, {}, InstanceId("i"))
    assert isinstance(placed, Instance)
    previews = placement_previews(model, nodes, links, {})
    [two] = [p for p in previews if p.valid and p.sharding == "pipeline"]
    assert two.memory_per_node == {NodeId("a"): pipeline_memory(model, 0, 12),
                                   NodeId("b"): pipeline_memory(model, 12, 24)}  # fmt: skip
    assert two.download_bytes == {NodeId("a"): 160 * MB, NodeId("b"): 180 * MB}
