"""Placement previews: every option, valid or why not, with each node's memory."""

from exo.master.placement import PlacementError, PlacementPreview, placement_previews
from exo.master.placement_memory import pipeline_memory
from exo.master.tests.test_placement import (
    MB,
    OVERHEAD_MB,
    card,
    cluster,
    edges,
    mesh,
    node_info,
    place,
)
from exo.shared.models.embedded import embedded_model_card
from exo.shared.types.common import NodeId
from exo.shared.types.topology import Topology
from exo.shared.types.worker.instances import Instance
from exo.shared.types.worker.shards import ShardMetadata


def test_previews_list_valid_and_invalid_options_with_reasons() -> None:
    model = embedded_model_card()
    nodes = {**cluster(a=1000, b=1000), NodeId("c"): node_info(OVERHEAD_MB - 10)}
    previews = placement_previews(model, nodes, mesh(nodes), {})

    assert [(p.sharding, p.node_count) for p in previews] == [
        ("pipeline", 1),
        ("pipeline", 2),
        ("pipeline", 3),
        ("tensor", 1),
        ("tensor", 2),
        ("tensor", 3),
    ]
    by_option = {(p.sharding, p.node_count): p for p in previews}

    one = by_option["pipeline", 1]
    assert one.valid and one.reason is None and one.instance is not None
    # Its weights (Q4_1), its float16 KV cache for 8 requests of 2048 tokens (377 MB), a
    # runner's runtime.
    assert one.memory_per_node == {NodeId("a"): pipeline_memory(model, 0, 30)}
    assert 700 * MB < pipeline_memory(model, 0, 30) < 800 * MB

    two = by_option["pipeline", 2]
    assert two.valid and two.instance is not None
    assert two.memory_per_node == {
        NodeId("a"): pipeline_memory(model, 0, 15),
        NodeId("b"): pipeline_memory(model, 15, 30),
    }

    three = by_option["pipeline", 3]
    assert not three.valid and three.instance is None and three.memory_per_node == {}
    assert three.reason is not None and "cannot hold one: c" in three.reason

    tensor_two = by_option["tensor", 2]
    assert not tensor_two.valid
    assert tensor_two.reason is not None
    assert "9 heads are not divisible by 2 nodes" in tensor_two.reason

    tensor_three = by_option["tensor", 3]
    assert not tensor_three.valid
    assert tensor_three.reason is not None and "not enough memory" in tensor_three.reason

    assert by_option["tensor", 1].valid


def test_previews_are_json() -> None:
    nodes = cluster(a=1000, b=1000)
    previews = placement_previews(card(), nodes, mesh(nodes), {})
    for preview in previews:
        assert PlacementPreview.model_validate_json(preview.model_dump_json()) == preview


def test_previews_of_an_empty_cluster_are_empty() -> None:
    assert placement_previews(card(), {}, Topology(), {}) == []


def test_previews_agree_with_place_instance() -> None:
    nodes = cluster(a=300, b=250, c=400)
    topology = edges(("a", "b"), ("b", "c"))
    previews = placement_previews(card(storage_mb=500), nodes, topology, {})
    for preview in previews:
        result = place(
            card(storage_mb=500),
            nodes,
            topology=topology,
            sharding=preview.sharding,
            min_nodes=preview.node_count,
        )
        if preview.valid:
            assert isinstance(result, Instance)
            assert preview.instance is not None
            assert _shards_by_node(result) == _shards_by_node(preview.instance)
        else:
            # min_nodes is a floor: placement may go on to more nodes.
            assert isinstance(result, PlacementError) or result.world_size > preview.node_count


def _shards_by_node(instance: Instance) -> dict[NodeId, ShardMetadata]:
    assignments = instance.shard_assignments
    return {
        node_id: assignments.runner_to_shard[runner_id]
        for node_id, runner_id in assignments.node_to_runner.items()
    }


