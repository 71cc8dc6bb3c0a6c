"""Placement scenarios with plain values: fixed ids, sizes in MB, small builders."""

from collections.abc import Iterable, Mapping

import pytest

from exo.master.placement import (
    PlacementError,
    node_free_memory,
    place_instance,
)
from exo.master.placement_memory import RUNNER_OVERHEAD_BYTES, card_estimate, pipeline_memory
from exo.master.placement_text import fmt
from exo.shared.models.embedded import embedded_model_card
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.common import NodeId
from exo.shared.types.memory import Memory
from exo.shared.types.profiling import GpuInfo, NodeInfo
from exo.shared.types.topology import Connection, Topology
from exo.shared.types.worker.instances import Instance, InstanceId, Sharding
from exo.shared.types.worker.runners import RunnerId
from exo.shared.types.worker.shards import (
    PipelineShardMetadata,
    TensorShardMetadata,
)

MB = 1024 * 1024
OVERHEAD_MB = RUNNER_OVERHEAD_BYTES // MB
INSTANCE_ID = InstanceId("inst")

# ---------------------------------------------------------------- builders


def card(n_layers: int = 30, storage_mb: int = 270, heads: int = 9, kv_heads: int = 3) -> ModelCard:
    """A model whose KV cache is negligible (under 1 MB): the scenarios below are about
    weights; the KV cache has tests of its own."""
    return ModelCard(
        model_id=ModelId("test/model"),
        n_layers=n_layers,
        hidden_size=576,
        num_heads=heads,
        num_kv_heads=kv_heads,
        storage_size=Memory.from_mb(storage_mb),
        context_length=64,
        architecture="llama",
        head_dim=2,
    )


def node_info(mb: int, gpu_mb: int | None = None) -> NodeInfo:
    gpus = (
        []
        if gpu_mb is None
        else [
            GpuInfo(
                name="gpu",
                memory_total=Memory.from_mb(gpu_mb),
                memory_available=Memory.from_mb(gpu_mb),
            )
        ]
    )
    return NodeInfo(
        hostname="host",
        cpu_count=4,
        memory_total=Memory.from_mb(mb),
        memory_available=Memory.from_mb(mb),
        gpus=gpus,
    )


def cluster(**free_mb: int) -> dict[NodeId, NodeInfo]:
    """``cluster(a=1000, b=500)``: nodes ``a`` and ``b`` with that much memory free for a
    shard beyond a runner's runtime overhead."""
    return {NodeId(name): node_info(mb + OVERHEAD_MB) for name, mb in free_mb.items()}


def mesh(ids: Iterable[str]) -> Topology:
    """Every node linked to every other, one direction per pair."""
    names = sorted(ids)
    return Topology(
        connections=[
            Connection(source=NodeId(a), sink=NodeId(b))
            for i, a in enumerate(names)
            for b in names[i + 1 :]
        ]
    )


def edges(*pairs: tuple[str, str]) -> Topology:
    return Topology(connections=[Connection(source=NodeId(a), sink=NodeId(b)) for a, b in pairs])


def place(
    model: ModelCard,
    nodes: Mapping[NodeId, NodeInfo],
    *,
    topology: Topology | None = None,
    instances: Mapping[InstanceId, Instance] | None = None,
    sharding: Sharding = "pipeline",
    min_nodes: int = 1,
    instance_id: InstanceId = INSTANCE_ID,
) -> Instance | PlacementError:
    return place_instance(
        model,
        sharding,
        min_nodes,
        nodes,
        topology if topology is not None else mesh(nodes),
        instances or {},
        instance_id,
    )


def placed(result: Instance | PlacementError) -> Instance:
    assert isinstance(result, Instance), result
    return result


def refused(result: Instance | PlacementError) -> str:
    assert isinstance(result, PlacementError), result
    return result.reason


def layer_ranges(instance: Instance) -> dict[str, tuple[int, int]]:
    """Node id -> [start, end) of its pipeline shard."""
    ranges: dict[str, tuple[int, int]] = {}
    assignments = instance.shard_assignments
    for node_id, runner_id in assignments.node_to_runner.items():
        shard = assignments.runner_to_shard[runner_id]
        assert isinstance(shard, PipelineShardMetadata)
        ranges[str(node_id)] = (shard.start_layer, shard.end_layer)
    return ranges


# ---------------------------------------------------------------- pipeline


def test_single_node_fits() -> None:
    instance = placed(place(card(), cluster(a=1000)))

    assert instance.instance_id == INSTANCE_ID
    assert instance.sharding == "pipeline"
    assert instance.world_size == 1
    assert dict(instance.shard_assignments.node_to_runner) == {NodeId("a"): RunnerId("inst-0")}
    shard = instance.shard(RunnerId("inst-0"))
    assert isinstance(shard, PipelineShardMetadata)
    assert (shard.device_rank, shard.world_size) == (0, 1)
    assert (shard.start_layer, shard.end_layer, shard.n_layers) == (0, 30, 30)
    assert instance.shard_assignments.model_id == ModelId("test/model")
    # The caller fills the rendezvous in.
    assert (instance.group_host, instance.group_port) == ("127.0.0.1", 0)


def test_embedded_model_fits_one_ordinary_node() -> None:
    instance = placed(place(embedded_model_card(), cluster(a=8000)))
    assert layer_ranges(instance) == {"a": (0, 30)}


def test_two_nodes_split_layers_in_proportion_to_free_memory() -> None:
    # 2400 MB does not fit on either node alone; 2:1 memory gives 2:1 layers.
    instance = placed(place(card(storage_mb=2400), cluster(a=2000, b=1000)))

    assert layer_ranges(instance) == {"a": (0, 20), "b": (20, 30)}
    ranks = {
        str(instance.node_of(rid)): shard.device_rank
        for rid, shard in instance.shard_assignments.runner_to_shard.items()
    }
    assert ranks == {"a": 0, "b": 1}
    assert set(instance.shard_assignments.runner_to_shard) == {
        RunnerId("inst-0"),
        RunnerId("inst-1"),
    }


def test_three_nodes_split_layers_in_proportion_to_free_memory() -> None:
    instance = placed(place(card(storage_mb=5000), cluster(c=1000, a=3000, b=2000)))
    assert layer_ranges(instance) == {"a": (0, 15), "b": (15, 25), "c": (25, 30)}


def test_ranks_follow_node_ids_not_memory() -> None:
    instance = placed(place(card(storage_mb=2400), cluster(a=1000, b=2000)))
    assert layer_ranges(instance) == {"a": (0, 10), "b": (10, 30)}


def test_largest_remainder_rounding_gives_each_node_at_least_one_layer() -> None:
    ranges = layer_ranges(
        placed(place(card(n_layers=10, storage_mb=2000), cluster(a=1000, b=1000, c=1000)))
    )
    # 10 / 3 = 3.33 each: the first rank gets the remaining layer.
    assert ranges == {"a": (0, 4), "b": (4, 7), "c": (7, 10)}

    ranges = layer_ranges(
        placed(place(card(n_layers=4, storage_mb=400), cluster(a=5000, b=200), min_nodes=2))
    )
    # b's proportional share (0.15 layers) rounds up to the minimum of one layer.
    assert ranges == {"a": (0, 3), "b": (3, 4)}


def test_a_share_a_node_cannot_hold_goes_to_a_node_with_room() -> None:
    # Proportionally b (200 MB) would get 2 of 10 layers (1.67 rounded up), but with the
    # overhead it holds only one: the layer goes to a instead.
    instance = placed(place(card(n_layers=10, storage_mb=1000), cluster(a=1000, b=200)))
    assert layer_ranges(instance) == {"a": (0, 9), "b": (9, 10)}


def test_not_enough_memory_names_the_shortfall() -> None:
    model = card(storage_mb=270)
    reason = refused(place(model, cluster(a=120, b=80)))

    whole = card_estimate(model, 0, 30)
    need = whole.weights + whole.kv_cache + 2 * RUNNER_OVERHEAD_BYTES
    assert "not enough memory" in reason
    assert f"test/model needs {fmt(need)} on 2 nodes" in reason
    assert f"the largest connected 2-node group has {200 + 2 * OVERHEAD_MB} MB free" in reason
    assert f"node a: {120 + OVERHEAD_MB} MB, node b: {80 + OVERHEAD_MB} MB" in reason


def test_not_enough_memory_on_one_node() -> None:
    reason = refused(place(card(storage_mb=270), cluster(a=120)))
    free = 120 + OVERHEAD_MB
    assert reason == (
        f"not enough memory: test/model needs {270 + OVERHEAD_MB} MB on 1 node "
        f"(270 MB of weights + 0.4 MB of KV cache + {OVERHEAD_MB} MB runtime per node), "
        f"the node with the most free memory has {free} MB free (node a: {free} MB)"
    )


def test_a_node_that_cannot_hold_one_layer_is_named() -> None:
    # Together they have enough, but b cannot hold even one layer and its overhead.
    nodes = {**cluster(a=1000), NodeId("b"): node_info(OVERHEAD_MB - 10)}
    reason = refused(place(card(storage_mb=270), nodes, min_nodes=2))
    assert "not enough memory" in reason
    assert "cannot hold one: b" in reason


def test_existing_instances_reserve_their_memory() -> None:
    nodes = cluster(a=1000, b=1000)
    model = card(storage_mb=800)
    big = placed(place(model, nodes, instance_id=InstanceId("big")))
    assert layer_ranges(big) == {"a": (0, 30)}
    instances = {big.instance_id: big}

    free = node_free_memory(nodes, instances)
    assert free == {
        NodeId("a"): (1000 + OVERHEAD_MB) * MB - pipeline_memory(model, 0, 30),
        NodeId("b"): (1000 + OVERHEAD_MB) * MB,
    }
    # a has ~200 MB left, too little for 270 MB + overhead: the new instance goes to b.
    second = placed(place(card(storage_mb=270), nodes, instances=instances))
    assert layer_ranges(second) == {"b": (0, 30)}


def test_a_full_cluster_refuses_with_the_memory_left() -> None:
    nodes = cluster(a=1000)
    first = placed(place(card(storage_mb=800), nodes, instance_id=InstanceId("first")))
    reason = refused(place(card(storage_mb=800), nodes, instances={first.instance_id: first}))
    assert "node a: 200 MB" in reason  # 1000 MB less the first's 0.4 MB of KV cache


def test_min_nodes_forces_a_spread() -> None:
    instance = placed(place(card(), cluster(a=1000, b=1000), min_nodes=2))
    assert layer_ranges(instance) == {"a": (0, 15), "b": (15, 30)}


def test_min_nodes_above_the_cluster_size_is_refused() -> None:
    reason = refused(place(card(), cluster(a=1000, b=1000), min_nodes=3))
    assert reason == "3 nodes are needed but the cluster has 2 nodes"


def test_more_nodes_than_layers_is_refused() -> None:
    reason = refused(place(card(n_layers=2), cluster(a=1000, b=1000, c=1000), min_nodes=3))
    assert "only 2 layers" in reason


def test_an_empty_cluster_is_refused() -> None:
    assert refused(place(card(), {})) == "no nodes are available"


def test_fewest_nodes_preferred() -> None:
    instance = placed(place(card(), cluster(a=1000, b=1000, c=1000)))
    # All three could share it, but one is enough; equal memory: the lowest id.
    assert layer_ranges(instance) == {"a": (0, 30)}


def test_the_node_with_most_free_memory_is_preferred() -> None:
    instance = placed(place(card(), cluster(a=500, b=1000, c=700)))
    assert layer_ranges(instance) == {"b": (0, 30)}


def test_the_pair_with_most_free_memory_is_preferred() -> None:
    instance = placed(place(card(storage_mb=1500), cluster(a=900, b=700, c=800, d=600)))
    assert set(layer_ranges(instance)) == {"a", "c"}


def test_disconnected_nodes_are_not_grouped() -> None:
    nodes = cluster(a=200, b=200)
    # 270 MB + overhead fits on neither alone, only on both together.
    reason = refused(place(card(), nodes, topology=Topology()))
    assert "no 2 nodes are all connected to each other" in reason

    # One edge, in either direction, connects a pair.
    for topology in (edges(("a", "b")), edges(("b", "a"))):
        instance = placed(place(card(), nodes, topology=topology))
        assert set(layer_ranges(instance)) == {"a", "b"}


def test_the_best_connected_group_wins_over_more_memory_elsewhere() -> None:
    # c has the most memory but no links; a and b are linked.
    nodes = cluster(a=200, b=200, c=250)
    instance = placed(place(card(), nodes, topology=edges(("a", "b"))))
    assert set(layer_ranges(instance)) == {"a", "b"}


def test_a_group_must_be_pairwise_connected() -> None:
    # a-b and b-c are linked, a-c is not: no group of three.
    nodes = cluster(a=100, b=100, c=100)
    reason = refused(place(card(), nodes, topology=edges(("a", "b"), ("b", "c"))))
    assert "no 3 nodes are all connected to each other" in reason

    instance = placed(place(card(), nodes, topology=edges(("a", "b"), ("b", "c"), ("c", "a"))))
    assert set(layer_ranges(instance)) == {"a", "b", "c"}


def test_gpu_memory_counts_when_a_node_has_gpus() -> None:
    nodes = {NodeId("a"): node_info(100, gpu_mb=2000), NodeId("b"): node_info(1000)}
    instance = placed(place(card(storage_mb=1500), nodes))
    assert layer_ranges(instance) == {"a": (0, 30)}


# ---------------------------------------------------------------- tensor


def test_tensor_world_size_must_divide_the_heads() -> None:
    model = embedded_model_card()  # 9 heads, 3 kv heads
    reason = refused(place(model, cluster(a=1000, b=1000), sharding="tensor", min_nodes=2))
    assert reason == "9 heads are not divisible by 2 nodes; 3 kv heads are not divisible by 2 nodes"

    instance = placed(place(model, cluster(a=1000, b=1000, c=1000), sharding="tensor", min_nodes=2))
    assert instance.sharding == "tensor"
    assert instance.world_size == 3
    shards = instance.shard_assignments.runner_to_shard
    assert [(str(instance.node_of(rid)), s.device_rank) for rid, s in shards.items()] == [
        ("a", 0),
        ("b", 1),
        ("c", 2),
    ]
    assert all(isinstance(s, TensorShardMetadata) and s.world_size == 3 for s in shards.values())


def test_tensor_on_one_node() -> None:
    instance = placed(place(card(), cluster(a=1000), sharding="tensor"))
    shard = instance.shard(RunnerId("inst-0"))
    assert isinstance(shard, TensorShardMetadata)
    assert shard.world_size == 1


def test_tensor_each_node_needs_its_slice() -> None:
    # 900 MB over 3 nodes: 300 MB + overhead each; c has too little.
    reason = refused(
        place(card(storage_mb=900), cluster(a=1000, b=1000, c=300), sharding="tensor", min_nodes=3)
    )
    assert f"needs {300 + OVERHEAD_MB} MB on each of 3 nodes" in reason
    assert "1 node has less: c" in reason


def test_tensor_picks_the_group_with_most_memory() -> None:
    nodes = cluster(a=400, b=900, c=800, d=700)
    instance = placed(place(card(storage_mb=900), nodes, sharding="tensor", min_nodes=3))
    assert set(map(str, instance.shard_assignments.node_to_runner)) == {"b", "c", "d"}


# ---------------------------------------------------------------- determinism


def test_same_input_gives_same_output() -> None:
    nodes = cluster(a=2000, b=1000, c=1500)
    first = place(card(storage_mb=3000), nodes)
    second = place(card(storage_mb=3000), nodes)
    assert first == second
    assert placed(first).model_dump_json() == placed(second).model_dump_json()


@pytest.mark.parametrize("sharding", ["pipeline", "tensor"])
def test_insertion_order_does_not_matter(sharding: Sharding) -> None:
    nodes = cluster(a=900, b=700, c=900, d=800)
    topology = mesh(nodes)
    existing = placed(place(card(storage_mb=100), nodes, instance_id=InstanceId("x")))
    other = placed(place(card(storage_mb=100), nodes, instance_id=InstanceId("y"), min_nodes=2))
    instances = {existing.instance_id: existing, other.instance_id: other}

    forward = place(
        card(storage_mb=1500), nodes, topology=topology, instances=instances, sharding=sharding
    )
    backward = place(
        card(storage_mb=1500),
        dict(reversed(nodes.items())),
        topology=Topology(connections=list(reversed(topology.connections))),
        instances=dict(reversed(instances.items())),
        sharding=sharding,
    )
    assert forward == backward
    assert placed(forward).model_dump_json() == placed(backward).model_dump_json()


def test_the_group_search_gives_up_on_huge_partly_linked_clusters() -> None:
    # 20 pairs of nodes, every node linked to every node but its twin: groups of up to
    # 20 are linked, and there are 2**20 of them. The model needs 21 nodes.
    names = [f"n{i:02d}{twin}" for i in range(20) for twin in "ab"]
    nodes = {NodeId(name): node_info(1000) for name in names}
    topology = Topology(
        connections=[
            Connection(source=NodeId(a), sink=NodeId(b))
            for i, a in enumerate(names)
            for b in names[i + 1 :]
            if a[:3] != b[:3]
        ]
    )
    model = card(n_layers=42, storage_mb=15000)

    reason = refused(place(model, nodes, topology=topology))
    assert "gave up searching 40 nodes for" in reason
    assert refused(place(model, nodes, topology=topology)) == reason
