"""Placement: which nodes run an instance of a model, and which part of it each holds.

Pure: values in, values out; no I/O, no clock, no randomness. The same input always
gives the same output, whatever the insertion order of the mappings passed in.

Rules
-----
* A node's free memory is ``NodeInfo.available_for_models`` minus what the shards of
  the current instances placed on it need: a placed instance reserves its memory
  before it loads.
* A shard needs what ``placement_memory.shard_memory`` estimates: its weights in their
  running format, its KV cache at the runner's maximum, and a runner's runtime overhead.
* The fewest nodes that fit win (from ``max(min_nodes, 1)`` up). Among groups of one
  size the most total free memory wins; equal totals go to the group that comes first
  when nodes are ordered by free memory (most first), then node id. Several nodes must
  be pairwise connected in the topology (an edge in either direction).
* Ranks follow node ids. Pipeline layer ranges are contiguous, proportional to free
  memory beyond a runner's runtime overhead (largest-remainder rounding), at least one
  layer each. A node's capacity assumes its layers carry the larger of the embedding and
  the head; when the split would overfill a node, the layers it cannot hold go to the
  nodes with the most room left below their proportional share, so a split is found
  whenever one fits.
* Finding the best group of linked nodes is a clique search: branch and bound, cheap
  for fully linked clusters, and bounded by ``node_groups.SEARCH_STEPS`` per call for large,
  partly linked ones (then the best group found so far, or a refusal that says so).
* An instance that lost a node is placed again (``place_again``) with the same model and
  sharding on as many of its former node count as still fit, down to one.
* The runners of an instance meet at rank 0's node (``group_host``): on loopback when
  every node of the instance is on one host, else at the first address of rank 0's that
  shares a network with every other node of the instance.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, assert_never

from exo.master.group_host import group_host
from exo.master.layer_split import split_by_bytes, split_layers
from exo.master.node_groups import Cluster, best_group, no_group_text
from exo.master.placement_memory import (
    RUNNER_OVERHEAD_BYTES,
    card_estimate,
    layer_capacity,
    layers_memory,
    node_free_memory,
    pipeline_memory,
    shard_file_bytes,
    shard_memory,
    tensor_memory,
)
from exo.master.placement_text import fmt, largest, plural
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.common import FrozenModel, NodeId
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.state import State
from exo.shared.types.topology import Topology
from exo.shared.types.worker.downloads import DownloadCompleted
from exo.shared.types.worker.instances import Instance, InstanceId, ShardAssignments, Sharding
from exo.shared.types.worker.runners import RunnerId
from exo.shared.types.worker.shards import (
    PipelineShardMetadata,
    ShardMetadata,
    TensorShardMetadata,
    layer_range,
)

SHARDINGS: tuple[Sharding, ...] = ("pipeline", "tensor")


class PlacementError(FrozenModel):
    """Why a model cannot be placed, in words for the user."""

    reason: str


class PlacementPreview(FrozenModel):
    """One placement option: valid with its instance and memory use, or why not."""

    sharding: Sharding
    node_count: int
    valid: bool
    instance: Instance | None = None
    # Bytes each chosen node would use for its shard (KV cache and runtime included).
    memory_per_node: dict[NodeId, int] = {}
    # Bytes of weights each chosen node lacks and would download first (about).
    download_bytes: dict[NodeId, int] = {}
    reason: str | None = None


# ---------------------------------------------------------------- public functions


def place_instance(
    model_card: ModelCard,
    sharding: Sharding,
    min_nodes: int,
    nodes: Mapping[NodeId, NodeInfo],
    topology: Topology,
    instances: Mapping[InstanceId, Instance],
    instance_id: InstanceId,
    holders: frozenset[NodeId] = frozenset(),
) -> Instance | PlacementError:
    """Place one instance on the fewest nodes that can hold it; among those, on nodes
    that already hold the model's files (``holders``) when enough of them fit."""
    first = max(min_nodes, 1)
    refusal = _refuse_shape(model_card, sharding, first, len(nodes))
    if refusal is not None:
        return PlacementError(reason=refusal)
    last = len(nodes) if sharding == "tensor" else min(len(nodes), model_card.n_layers)
    cluster = Cluster.of(nodes, topology, instances)
    refusals: list[_Refusal] = []
    for k in range(first, last + 1):
        layout = _holders_layout(model_card, sharding, k, cluster, holders)
        if isinstance(layout, _Refusal):
            refusals.append(layout)
            continue
        return _instance(model_card, sharding, layout, instance_id)
    return PlacementError(reason=_summarise(sharding, first, last, refusals))


class Holders(frozenset[NodeId]):
    """Nodes that hold some of a model's files, with the layers each holds (``ranges``:
    ``(start, end)``, or None for the whole model)."""

    ranges: dict[NodeId, tuple[int, int] | None]

    def __new__(cls, ranges: Mapping[NodeId, tuple[int, int] | None]) -> "Holders":
        made = super().__new__(cls, ranges.keys())
        made.ranges = dict(ranges)
        return made

    def holds(self, node_id: NodeId, start: int, end: int) -> bool:
        if node_id not in self.ranges:
            return False
        held = self.ranges[node_id]
        return held is None or (held[0] <= start and end <= held[1])


def model_holders(state: State, model_id: ModelId) -> Holders:
    """Nodes that already hold a model's files, whole or some layers (placement prefers
    them; a node counts as holding a shard when its layers cover the shard's)."""
    ranges: dict[NodeId, tuple[int, int] | None] = {}
    for n, models in state.downloads.items():
        done = models.get(model_id)
        if isinstance(done, DownloadCompleted):
            whole = done.start_layer is None or done.end_layer is None
            ranges[n] = None if whole else (done.start_layer or 0, done.end_layer or 0)
    return Holders(ranges)


def _holds_shard(holders: frozenset[NodeId], node_id: NodeId, shard: ShardMetadata) -> bool:
    if isinstance(holders, Holders):
        return holders.holds(node_id, *layer_range(shard))
    return node_id in holders


def place_again(
    lost: Instance,
    nodes: Mapping[NodeId, NodeInfo],
    topology: Topology,
    instances: Mapping[InstanceId, Instance],
    instance_id: InstanceId,
) -> Instance | PlacementError:
    """Place the model of an instance that lost a node again, with its sharding: on at
    least as many nodes as it had when they fit, else on fewer, down to one."""
    card = lost.model_card
    reasons: list[str] = []
    for min_nodes in range(min(lost.world_size, len(nodes)), 0, -1):
        placed = place_instance(
            card, lost.sharding, min_nodes, nodes, topology, instances, instance_id
        )
        if isinstance(placed, Instance):
            return placed
        reasons.append(placed.reason)
    return PlacementError(reason=reasons[-1] if reasons else "no nodes are available")


def placement_previews(
    model_card: ModelCard,
    nodes: Mapping[NodeId, NodeInfo],
    topology: Topology,
    instances: Mapping[InstanceId, Instance],
    holders: frozenset[NodeId] = frozenset(),
) -> list[PlacementPreview]:
    """Every sharding on every node count from 1 to the cluster size: valid or why not,
    and which nodes would download how much."""
    cluster = Cluster.of(nodes, topology, instances)
    previews: list[PlacementPreview] = []
    for sharding in SHARDINGS:
        for k in range(1, len(nodes) + 1):
            previews.append(_preview(model_card, sharding, k, cluster, holders))
    return previews


def _holders_layout(
    card: ModelCard, sharding: Sharding, k: int, cluster: "Cluster", holders: frozenset[NodeId]
) -> "_Layout | _Refusal":
    if len(holders & set(cluster.free)) >= k:
        layout = _layout(card, sharding, k, cluster.only(holders))
        if not isinstance(layout, _Refusal):
            return layout
    return _layout(card, sharding, k, cluster)


def _preview(
    card: ModelCard, sharding: Sharding, k: int, cluster: "Cluster", holders: frozenset[NodeId]
) -> PlacementPreview:
    refusal = _refuse_shape(card, sharding, k, len(cluster.free))
    if refusal is not None:
        return PlacementPreview(sharding=sharding, node_count=k, valid=False, reason=refusal)
    layout = _holders_layout(card, sharding, k, cluster, holders)
    if isinstance(layout, _Refusal):
        return PlacementPreview(sharding=sharding, node_count=k, valid=False, reason=layout.text)
    instance = _instance(card, sharding, layout, InstanceId(f"preview-{sharding}-{k}"))
    return PlacementPreview(
        sharding=sharding,
        node_count=k,
        valid=True,
        instance=instance,
        memory_per_node={node_id: shard_memory(shard) for node_id, shard in layout},
        download_bytes={
            node_id: shard_file_bytes(shard)
            for node_id, shard in layout
            if not _holds_shard(holders, node_id, shard)
        },
    )


# A successful layout: (node, shard) in rank order.
_Layout = list[tuple[NodeId, ShardMetadata]]


@dataclass(frozen=True)
class _Refusal:
    """Why one node count does not work; ``kind`` picks what a summary mentions."""

    kind: Literal["memory", "topology", "shape"]
    node_count: int
    text: str


def _layout(card: ModelCard, sharding: Sharding, k: int, cluster: Cluster) -> _Layout | _Refusal:
    match sharding:
        case "pipeline":
            return _pipeline_layout(card, k, cluster)
        case "tensor":
            return _tensor_layout(card, k, cluster)
        case _:  # pyright: ignore[reportUnnecessaryComparison]
            assert_never(sharding)


def _refuse_shape(card: ModelCard, sharding: Sharding, k: int, node_count: int) -> str | None:
    """Refusals that depend only on the model and the number of nodes."""
    if node_count == 0:
        return "no nodes are available"
    if k > node_count:
        return f"{k} nodes are needed but the cluster has {plural(node_count, 'node')}"
    if card.n_layers < 1:
        return f"{card.model_id} has no layers"
    if sharding == "pipeline" and k > card.n_layers:
        return (
            f"{card.model_id} has only {plural(card.n_layers, 'layer')}: "
            f"cannot give each of {k} nodes a layer"
        )
    return None


def _summarise(sharding: Sharding, first: int, last: int, refusals: list[_Refusal]) -> str:
    """One reason for several node counts: the largest count tried (the most memory,
    the widest net), and the largest count that lacked memory if that is another."""
    if len(refusals) == 1:
        return refusals[0].text
    parts = [refusals[-1]]
    memory = [r for r in refusals if r.kind == "memory"]
    if memory and memory[-1] is not refusals[-1]:
        parts.append(memory[-1])
    said = "; ".join(f"on {plural(r.node_count, 'node')}: {r.text}" for r in parts)
    return f"no {sharding} placement on {first} to {last} nodes; {said}"


# ---------------------------------------------------------------- pipeline


def _pipeline_layout(card: ModelCard, k: int, cluster: Cluster) -> _Layout | _Refusal:
    n = card.n_layers
    caps = {node: layer_capacity(card, free) for node, free in cluster.free.items()}
    pool = [node for node in cluster.free if caps[node] >= 1]
    group = best_group(pool, k, cluster, score=caps, target=n)
    if group is None:
        return _pipeline_shortfall(card, k, cluster, caps)
    ranked = sorted(group)
    room = [max(cluster.free[x] - RUNNER_OVERHEAD_BYTES, 0) for x in ranked]  # for layers
    layers = _split(card, [cluster.free[x] for x in ranked], room, [caps[x] for x in ranked])
    layout: _Layout = []
    start = 0
    for rank, (node_id, count) in enumerate(zip(ranked, layers, strict=True)):
        shard = PipelineShardMetadata(
            model_card=card,
            device_rank=rank,
            world_size=k,
            start_layer=start,
            end_layer=start + count,
            n_layers=n,
        )
        layout.append((node_id, shard))
        start += count
    return layout


def _split(card: ModelCard, free: list[int], room: list[int], caps: list[int]) -> list[int]:
    """Layer counts of the ranked nodes: by the bytes of each layer when the card has them and
    every shard of that split fits its node, else by count (each within its node's cap)."""
    if len(card.layer_bytes) == card.n_layers:
        counts = split_by_bytes(card.layer_bytes, room)
        starts = [sum(counts[:i]) for i in range(len(counts))]
        if all(
            pipeline_memory(card, a, a + c) <= f
            for a, c, f in zip(starts, counts, free, strict=True)
        ):
            return counts
    return split_layers(card.n_layers, room, caps)


def _pipeline_shortfall(
    card: ModelCard, k: int, cluster: Cluster, caps: Mapping[NodeId, int]
) -> _Refusal:
    group = best_group(list(cluster.free), k, cluster)
    if group is None:
        return _Refusal("topology", k, no_group_text(k, cluster))
    whole = card_estimate(card, 0, card.n_layers)
    need = whole.weights + whole.kv_cache + k * whole.overhead
    have = sum(cluster.free[x] for x in group)
    where = f"{largest(k)} ({cluster.describe(group)})"
    if have < need:
        return _Refusal(
            "memory",
            k,
            f"not enough memory: {card.model_id} needs {fmt(need)} on "
            f"{plural(k, 'node')} ({fmt(whole.weights)} of weights + {fmt(whole.kv_cache)} "
            f"of KV cache + {fmt(whole.overhead)} runtime per node), {largest(k)} has "
            f"{fmt(have)} free ({cluster.describe(group)})",
        )
    small = [x for x in sorted(group) if caps[x] < 1]
    if small:
        return _Refusal(
            "memory",
            k,
            f"not enough memory: one layer of {card.model_id} needs "
            f"{fmt(layers_memory(card, 1))} (KV cache and runtime included), and in {where} "
            f"{plural(len(small), 'node')} cannot hold one: {', '.join(small)}",
        )
    return _Refusal(
        "memory",
        k,
        f"not enough memory: the {card.n_layers} layers of {card.model_id} cannot be split "
        f"to fit {where}",
    )


# ---------------------------------------------------------------- tensor


def _tensor_layout(card: ModelCard, k: int, cluster: Cluster) -> _Layout | _Refusal:
    indivisible = [
        f"{plural(count, noun)} {'is' if count == 1 else 'are'} not divisible by "
        f"{plural(k, 'node')}"
        for count, noun in ((card.num_heads, "head"), (card.num_kv_heads, "kv head"))
        if count % k
    ]
    if indivisible:
        return _Refusal("shape", k, "; ".join(indivisible))
    need = tensor_memory(card, k)
    pool = [node for node, free in cluster.free.items() if free >= need]
    group = best_group(pool, k, cluster)
    if group is None:
        return _tensor_shortfall(card, k, cluster, need)
    return [
        (node_id, TensorShardMetadata(model_card=card, device_rank=rank, world_size=k))
        for rank, node_id in enumerate(sorted(group))
    ]


def _tensor_shortfall(card: ModelCard, k: int, cluster: Cluster, need: int) -> _Refusal:
    group = best_group(list(cluster.free), k, cluster)
    if group is None:
        return _Refusal("topology", k, no_group_text(k, cluster))
    short = [x for x in sorted(group) if cluster.free[x] < need]
    part = card_estimate(card, 0, card.n_layers, k)
    return _Refusal(
        "memory",
        k,
        f"not enough memory: {card.model_id} needs {fmt(need)} on each of "
        f"{plural(k, 'node')} ({fmt(part.weights)} of weights + {fmt(part.kv_cache)} of KV "
        f"cache + {fmt(part.overhead)} runtime), and in {largest(k)} "
        f"({cluster.describe(group)}) {plural(len(short), 'node')} "
        f"{'has' if len(short) == 1 else 'have'} less: {', '.join(short)}",
    )


# ---------------------------------------------------------------- building the result


def _instance(
    card: ModelCard, sharding: Sharding, layout: _Layout, instance_id: InstanceId
) -> Instance:
    runner_to_shard: dict[RunnerId, ShardMetadata] = {}
    node_to_runner: dict[NodeId, RunnerId] = {}
    for node_id, shard in layout:
        runner_id = RunnerId(f"{instance_id}-{shard.device_rank}")
        runner_to_shard[runner_id] = shard
        node_to_runner[node_id] = runner_id
    return Instance(
        instance_id=instance_id,
        sharding=sharding,
        shard_assignments=ShardAssignments(
            model_id=card.model_id,
            runner_to_shard=runner_to_shard,
            node_to_runner=node_to_runner,
        ),
    )


__all__ = [
    "Holders",
    "PlacementError",
    "PlacementPreview",
    "group_host",
    "model_holders",
    "node_free_memory",
    "place_again",
    "place_instance",
    "placement_previews",
    "shard_memory",
]
