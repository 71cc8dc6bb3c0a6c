"""Placement prefers nodes that already hold a model's files; previews say who downloads."""

from exo.master.placement import (
    model_holders,
    place_instance,
    placement_previews,
)
from exo.master.tests.test_placement import INSTANCE_ID, MB, card, node_info
from exo.shared.tests.builders import make_state
from exo.shared.types.common import NodeId
from exo.shared.types.topology import Connection, Topology
from exo.shared.types.worker.downloads import DownloadCompleted, DownloadOngoing
from exo.shared.types.worker.instances import Instance
from exo.shared.types.worker.shards import PipelineShardMetadata

A, B, C = NodeId("a"), NodeId("b"), NodeId("c")
NODES = {A: node_info(8000), B: node_info(2000), C: node_info(2000)}
LINKED = Topology(connections=[Connection(source=x, sink=y) for x in NODES for y in NODES if x != y])


def _nodes(instance: Instance) -> set[NodeId]:
    return set(instance.shard_assignments.node_to_runner)


def test_a_node_holding_the_model_wins_over_one_with_more_memory() -> None:
    model = card(storage_mb=500)
    alone = place_instance(model, "pipeline", 1, NODES, LINKED, {}, INSTANCE_ID)
    assert isinstance(alone, Instance) and _nodes(alone) == {A}
    placed = place_instance(model, "pipeline", 1, NODES, LINKED, {}, INSTANCE_ID,
                            holders=frozenset({C}))
    assert isinstance(placed, Instance) and _nodes(placed) == {C}


def test_fewest_nodes_still_come_first_and_a_holder_too_small_is_passed_over() -> None:
    big = card(storage_mb=3000)  # fits on A alone, on B + C together
    placed = place_instance(big, "pipeline", 1, NODES, LINKED, {}, INSTANCE_ID,
                            holders=frozenset({B, C}))
    assert isinstance(placed, Instance) and _nodes(placed) == {A}
    two = place_instance(big, "pipeline", 2, NODES, LINKED, {}, INSTANCE_ID,
                         holders=frozenset({B, C}))
    assert isinstance(two, Instance) and _nodes(two) == {B, C}


def test_previews_say_which_nodes_download_and_how_much() -> None:
    model = card(storage_mb=500)
    previews = placement_previews(model, NODES, LINKED, {}, frozenset({B}))
    [one] = [p for p in previews if p.valid and p.sharding == "pipeline" and p.node_count == 1]
    assert one.instance is not None and _nodes(one.instance) == {B}
    assert one.download_bytes == {}
    [two] = [p for p in previews if p.valid and p.sharding == "tensor" and p.node_count == 3]
    assert set(two.download_bytes) == {A, C}
    # Their third of the file's weights (the KV cache and the runtime are not downloaded).
    assert two.download_bytes == {A: -(-500 * MB // 3), C: -(-500 * MB // 3)}


def test_holders_are_the_nodes_with_a_completed_download() -> None:
    model = card()
    state = make_state(downloads={
        A: {model.model_id: DownloadCompleted(path="/m")},
        B: {model.model_id: DownloadOngoing(downloaded_bytes=1, total_bytes=2)},
    })
    assert model_holders(state, model.model_id) == {A}


def test_a_node_holding_some_layers_holds_the_shards_its_range_covers() -> None:
    model = card(n_layers=30, storage_mb=3000)
    state = make_state(downloads={
        B: {model.model_id: DownloadCompleted(path="/s", start_layer=0, end_layer=15)},
        C: {model.model_id: DownloadCompleted(path="/s", start_layer=0, end_layer=10)},
    })
    holders = model_holders(state, model.model_id)
    assert holders == {B, C} and holders.ranges == {B: (0, 15), C: (0, 10)}
    assert holders.holds(B, 3, 15) and not holders.holds(C, 0, 15) and not holders.holds(A, 0, 1)
    previews = placement_previews(model, NODES, LINKED, {}, holders)
    [two] = [p for p in previews if p.valid and p.sharding == "pipeline" and p.node_count == 2]
    assert two.instance is not None and _nodes(two.instance) == {B, C}
    sa = two.instance.shard_assignments
    shards = {n: sa.runner_to_shard[r] for n, r in sa.node_to_runner.items()}
    ranges = {n: (s.start_layer, s.end_layer) for n, s in shards.items()
              if isinstance(s, PipelineShardMetadata)}
    # B's layers [0, 15) cover its shard: only C downloads.
    assert ranges == {B: (0, 15), C: (15, 30)}
    assert set(two.download_bytes) == {C}
