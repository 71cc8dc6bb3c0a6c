"""Placement: which nodes run an instance of a model, and which part of it each holds.

Pure: values in, values out; no I/O, no clock, no randomness. The same input always
gives the same output, whatever the insertion order of the mappings passed in.

Rules
-----
* A node's free memory is ``NodeInfo.available_for_models`` minus what the shards of
  the current instances placed on it need: a placed instance reserves its memory
  before it loads.
* A shard needs its share of ``ModelCard.storage_size`` (pipeline: in proportion to its
  layers; tensor: ``1 / world_size``) plus ``SHARD_OVERHEAD_BYTES``.
* The fewest nodes that fit win (from ``max(min_nodes, 1)`` up). Among groups of one
  size the most total free memory wins; equal totals go to the group that comes first
  when nodes are ordered by free memory (most first), then node id. Several nodes must
  be pairwise connected in the topology (an edge in either direction).
* Ranks follow node ids. Pipeline layer ranges are contiguous, proportional to free
  memory (largest-remainder rounding), at least one layer each; when that split would
  overfill a node, the layers it cannot hold go to the nodes with the most room left
  below their proportional share, so a split is found whenever one fits.
* Finding the best group of linked nodes is a clique search: branch and bound, cheap
  for fully linked clusters, and bounded by ``_SEARCH_STEPS`` per call for large,
  partly linked ones (then the best group found so far, or a refusal that says so).
* An instance that lost a node is placed again (``place_again``) with the same model and
  sharding on as many of its former node count as still fit, down to one.
* The runners of an instance meet at rank 0's node (``group_host``): on loopback when
  every node of the instance is on one host, else at the first address of rank 0's that
  shares a network with every other node of the instance.
"""

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, assert_never

from exo.shared.models.model_cards import ModelCard
from exo.shared.types.common import FrozenModel, NodeId
from exo.shared.types.memory import Memory
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.topology import Topology
from exo.shared.types.worker.instances import Instance, InstanceId, ShardAssignments, Sharding
from exo.shared.types.worker.runners import RunnerId
from exo.shared.types.worker.shards import (
    PipelineShardMetadata,
    ShardMetadata,
    TensorShardMetadata,
)

# What a runner needs besides its weights: activations, KV cache, runtime.
SHARD_OVERHEAD_BYTES = 64 * 1024 * 1024

SHARDINGS: tuple[Sharding, ...] = ("pipeline", "tensor")

# Steps (groups extended) one placement call may spend searching for groups of nodes.
_SEARCH_STEPS = 50_000


class PlacementError(FrozenModel):
    """Why a model cannot be placed, in words for the user."""

    reason: str


class PlacementPreview(FrozenModel):
    """One placement option: valid with its instance and memory use, or why not."""

    sharding: Sharding
    node_count: int
    valid: bool
    instance: Instance | None = None
    # Bytes each chosen node would use for its shard (overhead included).
    memory_per_node: dict[NodeId, int] = {}
    reason: str | None = None


# ---------------------------------------------------------------- public functions


def shard_memory(shard: ShardMetadata) -> int:
    """Bytes a runner holding this shard needs, overhead included."""
    storage = shard.model_card.storage_size.in_bytes
    match shard:
        case PipelineShardMetadata():
            layers = shard.end_layer - shard.start_layer
            return _ceil_div(storage * layers, max(shard.n_layers, 1)) + SHARD_OVERHEAD_BYTES
        case TensorShardMetadata():
            return _ceil_div(storage, max(shard.world_size, 1)) + SHARD_OVERHEAD_BYTES
        case _:  # pyright: ignore[reportUnnecessaryComparison]
            assert_never(shard)


def node_free_memory(
    nodes: Mapping[NodeId, NodeInfo], instances: Mapping[InstanceId, Instance]
) -> dict[NodeId, int]:
    """Bytes free for a new shard on each node (never below zero)."""
    reserved = dict.fromkeys(nodes, 0)
    for instance in instances.values():
        assignments = instance.shard_assignments
        for node_id, runner_id in assignments.node_to_runner.items():
            shard = assignments.runner_to_shard.get(runner_id)
            if node_id in reserved and shard is not None:
                reserved[node_id] += shard_memory(shard)
    return {
        node_id: max(info.available_for_models.in_bytes - reserved[node_id], 0)
        for node_id, info in nodes.items()
    }


def place_instance(
    model_card: ModelCard,
    sharding: Sharding,
    min_nodes: int,
    nodes: Mapping[NodeId, NodeInfo],
    topology: Topology,
    instances: Mapping[InstanceId, Instance],
    instance_id: InstanceId,
) -> Instance | PlacementError:
    """Place one instance on the fewest nodes that can hold it."""
    first = max(min_nodes, 1)
    refusal = _refuse_shape(model_card, sharding, first, len(nodes))
    if refusal is not None:
        return PlacementError(reason=refusal)
    last = len(nodes) if sharding == "tensor" else min(len(nodes), model_card.n_layers)
    cluster = _Cluster.of(nodes, topology, instances)
    refusals: list[_Refusal] = []
    for k in range(first, last + 1):
        layout = _layout(model_card, sharding, k, cluster)
        if isinstance(layout, _Refusal):
            refusals.append(layout)
            continue
        return _instance(model_card, sharding, layout, instance_id)
    return PlacementError(reason=_summarise(sharding, first, last, refusals))


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


def group_host(instance: Instance, nodes: Mapping[NodeId, NodeInfo]) -> str:
    """Where the runners of ``instance`` meet: rank 0's node, at an address every other
    node of the instance can be expected to reach."""
    assignments = instance.shard_assignments
    ranks = {
        node_id: shard.device_rank
        for node_id, runner_id in assignments.node_to_runner.items()
        if (shard := assignments.runner_to_shard.get(runner_id)) is not None
    }
    if len(ranks) < 2:
        return _LOOPBACK
    leader = min(ranks, key=lambda node_id: (ranks[node_id], node_id))
    infos = [nodes.get(node_id) for node_id in sorted(ranks)]
    known = [info for info in infos if info is not None]
    if len(known) == len(infos) and len({info.hostname for info in known}) == 1:
        return _LOOPBACK
    leader_info = nodes.get(leader)
    if leader_info is None:
        return _LOOPBACK
    own = [a for a in _interfaces(leader_info.addresses) if not a.ip.is_loopback]
    others = [
        _interfaces(info.addresses)
        for node_id, info in nodes.items()
        if node_id in ranks and node_id != leader
    ]
    for candidate in own:
        if all(any(a.ip in candidate.network for a in theirs) for theirs in others):
            return str(candidate.ip)
    return str(own[0].ip) if own else _LOOPBACK


def placement_previews(
    model_card: ModelCard,
    nodes: Mapping[NodeId, NodeInfo],
    topology: Topology,
    instances: Mapping[InstanceId, Instance],
) -> list[PlacementPreview]:
    """Every sharding on every node count from 1 to the cluster size: valid or why not."""
    cluster = _Cluster.of(nodes, topology, instances)
    previews: list[PlacementPreview] = []
    for sharding in SHARDINGS:
        for k in range(1, len(nodes) + 1):
            previews.append(_preview(model_card, sharding, k, cluster))
    return previews


def _preview(card: ModelCard, sharding: Sharding, k: int, cluster: "_Cluster") -> PlacementPreview:
    refusal = _refuse_shape(card, sharding, k, len(cluster.free))
    if refusal is not None:
        return PlacementPreview(sharding=sharding, node_count=k, valid=False, reason=refusal)
    layout = _layout(card, sharding, k, cluster)
    if isinstance(layout, _Refusal):
        return PlacementPreview(sharding=sharding, node_count=k, valid=False, reason=layout.text)
    instance = _instance(card, sharding, layout, InstanceId(f"preview-{sharding}-{k}"))
    return PlacementPreview(
        sharding=sharding,
        node_count=k,
        valid=True,
        instance=instance,
        memory_per_node={node_id: shard_memory(shard) for node_id, shard in layout},
    )


_LOOPBACK = "127.0.0.1"


def _interfaces(
    addresses: Sequence[str],
) -> list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]:
    found: list[ipaddress.IPv4Interface | ipaddress.IPv6Interface] = []
    for text in addresses:
        try:
            found.append(ipaddress.ip_interface(text))
        except ValueError:
            continue
    return found


# ---------------------------------------------------------------- the cluster as seen here


@dataclass
class _Cluster:
    """The nodes as one placement call sees them. ``steps_left`` bounds the work of
    the group searches of the call: finding the best group of linked nodes is a clique
    problem, cheap for the usual fully linked clusters but not for large, partly
    linked ones. A search that runs out keeps the best group it has found (valid,
    deterministic, maybe not the best); with none, the refusal says so."""

    free: Mapping[NodeId, int]
    neighbours: Mapping[NodeId, frozenset[NodeId]]
    steps_left: int = _SEARCH_STEPS

    @classmethod
    def of(
        cls,
        nodes: Mapping[NodeId, NodeInfo],
        topology: Topology,
        instances: Mapping[InstanceId, Instance],
    ) -> "_Cluster":
        neighbours: dict[NodeId, set[NodeId]] = {node_id: set() for node_id in nodes}
        for c in topology.connections:
            if c.source != c.sink and c.source in nodes and c.sink in nodes:
                neighbours[c.source].add(c.sink)
                neighbours[c.sink].add(c.source)
        return cls(
            free=node_free_memory(nodes, instances),
            neighbours={node_id: frozenset(linked) for node_id, linked in neighbours.items()},
        )

    @property
    def exhausted(self) -> bool:
        return self.steps_left <= 0

    def describe(self, group: Sequence[NodeId]) -> str:
        return ", ".join(f"node {n}: {_fmt(self.free[n])}" for n in sorted(group))


# A successful layout: (node, shard) in rank order.
_Layout = list[tuple[NodeId, ShardMetadata]]


@dataclass(frozen=True)
class _Refusal:
    """Why one node count does not work; ``kind`` picks what a summary mentions."""

    kind: Literal["memory", "topology", "shape"]
    node_count: int
    text: str


def _layout(card: ModelCard, sharding: Sharding, k: int, cluster: _Cluster) -> _Layout | _Refusal:
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
        return f"{k} nodes are needed but the cluster has {_count(node_count, 'node')}"
    if card.n_layers < 1:
        return f"{card.model_id} has no layers"
    if sharding == "pipeline" and k > card.n_layers:
        return (
            f"{card.model_id} has only {_count(card.n_layers, 'layer')}: "
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
    said = "; ".join(f"on {_count(r.node_count, 'node')}: {r.text}" for r in parts)
    return f"no {sharding} placement on {first} to {last} nodes; {said}"


# ---------------------------------------------------------------- pipeline


def _pipeline_layout(card: ModelCard, k: int, cluster: _Cluster) -> _Layout | _Refusal:
    n = card.n_layers
    caps = {node: _layer_capacity(card, free) for node, free in cluster.free.items()}
    pool = [node for node in cluster.free if caps[node] >= 1]
    group = _best_group(pool, k, cluster, score=caps, target=n)
    if group is None:
        return _pipeline_shortfall(card, k, cluster, caps)
    ranked = sorted(group)
    layers = _split_layers(n, [cluster.free[x] for x in ranked], [caps[x] for x in ranked])
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


def _layer_capacity(card: ModelCard, free: int) -> int:
    """The most layers a node with ``free`` bytes can hold (0: not even one)."""
    room = free - SHARD_OVERHEAD_BYTES
    if room < 0:
        return 0
    storage = card.storage_size.in_bytes
    if storage <= 0:
        return card.n_layers
    # ceil(storage * L / n) <= room  <=>  storage * L <= room * n
    return min(room * card.n_layers // storage, card.n_layers)


def _split_layers(n: int, weights: Sequence[int], caps: Sequence[int]) -> list[int]:
    """``n`` layers in proportion to ``weights`` (largest remainder), each in 1..cap.

    Requires ``len(weights) <= n <= sum(caps)`` and every cap >= 1."""
    total = sum(weights)
    if total <= 0:
        weights, total = [1] * len(weights), len(weights)
    layers = [min(max(n * w // total, 1), c) for w, c in zip(weights, caps, strict=True)]
    ids = range(len(layers))

    def above_quota(i: int) -> int:
        # layers[i] - n * w / total, scaled by total to stay in integers.
        return layers[i] * total - n * weights[i]

    while sum(layers) > n:
        i = max((i for i in ids if layers[i] > 1), key=lambda i: (above_quota(i), -i))
        layers[i] -= 1
    while sum(layers) < n:
        i = max((i for i in ids if layers[i] < caps[i]), key=lambda i: (-above_quota(i), -i))
        layers[i] += 1
    return layers


def _pipeline_shortfall(
    card: ModelCard, k: int, cluster: _Cluster, caps: Mapping[NodeId, int]
) -> _Refusal:
    group = _best_group(list(cluster.free), k, cluster)
    if group is None:
        return _Refusal("topology", k, _no_group_text(k, cluster))
    storage = card.storage_size.in_bytes
    need = storage + k * SHARD_OVERHEAD_BYTES
    have = sum(cluster.free[x] for x in group)
    where = f"{_largest(k)} ({cluster.describe(group)})"
    if have < need:
        return _Refusal(
            "memory",
            k,
            f"not enough memory: {card.model_id} needs {_fmt(need)} on "
            f"{_count(k, 'node')} ({_fmt(storage)} of weights + {_fmt(SHARD_OVERHEAD_BYTES)} "
            f"per node), {_largest(k)} has {_fmt(have)} free ({cluster.describe(group)})",
        )
    small = [x for x in sorted(group) if caps[x] < 1]
    if small:
        one_layer = _ceil_div(storage, card.n_layers) + SHARD_OVERHEAD_BYTES
        return _Refusal(
            "memory",
            k,
            f"not enough memory: one layer of {card.model_id} needs {_fmt(one_layer)} "
            f"(overhead included), and in {where} "
            f"{_count(len(small), 'node')} cannot hold one: {', '.join(small)}",
        )
    return _Refusal(
        "memory",
        k,
        f"not enough memory: the {card.n_layers} layers of {card.model_id} cannot be split "
        f"to fit {where}",
    )


# ---------------------------------------------------------------- tensor


def _tensor_layout(card: ModelCard, k: int, cluster: _Cluster) -> _Layout | _Refusal:
    indivisible = [
        f"{_count(count, noun)} {'is' if count == 1 else 'are'} not divisible by "
        f"{_count(k, 'node')}"
        for count, noun in ((card.num_heads, "head"), (card.num_kv_heads, "kv head"))
        if count % k
    ]
    if indivisible:
        return _Refusal("shape", k, "; ".join(indivisible))
    storage = card.storage_size.in_bytes
    need = _ceil_div(storage, k) + SHARD_OVERHEAD_BYTES
    pool = [node for node, free in cluster.free.items() if free >= need]
    group = _best_group(pool, k, cluster)
    if group is None:
        return _tensor_shortfall(card, k, cluster, need)
    return [
        (node_id, TensorShardMetadata(model_card=card, device_rank=rank, world_size=k))
        for rank, node_id in enumerate(sorted(group))
    ]


def _tensor_shortfall(card: ModelCard, k: int, cluster: _Cluster, need: int) -> _Refusal:
    group = _best_group(list(cluster.free), k, cluster)
    if group is None:
        return _Refusal("topology", k, _no_group_text(k, cluster))
    short = [x for x in sorted(group) if cluster.free[x] < need]
    return _Refusal(
        "memory",
        k,
        f"not enough memory: {card.model_id} needs {_fmt(need)} on each of "
        f"{_count(k, 'node')} (1/{k} of {_fmt(card.storage_size.in_bytes)} + "
        f"{_fmt(SHARD_OVERHEAD_BYTES)} overhead), and in {_largest(k)} "
        f"({cluster.describe(group)}) {_count(len(short), 'node')} "
        f"{'has' if len(short) == 1 else 'have'} less: {', '.join(short)}",
    )


# ---------------------------------------------------------------- choosing a group


def _best_group(
    pool: Sequence[NodeId],
    k: int,
    cluster: _Cluster,
    score: Mapping[NodeId, int] | None = None,
    target: int = 0,
) -> tuple[NodeId, ...] | None:
    """The pairwise connected group of ``k`` nodes from ``pool`` with the most free
    memory whose ``score`` adds up to at least ``target``; equal totals go to the group
    found first in the order (free memory descending, node id).

    Branch and bound. ``score`` must not fall as free memory grows (a layer capacity
    does not), so along the order both bounds only fall and a branch that cannot reach
    the target, or beat the best group so far, ends the loop it is in. Usual clusters
    cost about ``k * len(pool)`` steps, and a model too big for them about nothing."""
    free = cluster.free
    scores = score if score is not None else dict.fromkeys(pool, 0)
    order = sorted(pool, key=lambda node: (-free[node], node))
    best: tuple[NodeId, ...] | None = None
    best_total = -1

    def extend(chosen: tuple[NodeId, ...], total: int, got: int, candidates: list[NodeId]) -> None:
        nonlocal best, best_total
        if len(chosen) == k:
            best, best_total = chosen, total
            return
        need = k - len(chosen)
        for i, node in enumerate(candidates):
            if cluster.steps_left <= 0:
                return
            cluster.steps_left -= 1
            window = candidates[i : i + need]
            if len(window) < need:
                return
            if total + sum(free[c] for c in window) <= best_total:
                return
            if got + sum(scores[c] for c in window) < target:
                return
            linked = cluster.neighbours[node]
            rest = [c for c in candidates[i + 1 :] if c in linked]
            extend((*chosen, node), total + free[node], got + scores[node], rest)

    if k >= 1:
        extend((), 0, 0, order)
    return best


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


def _no_group_text(k: int, cluster: _Cluster) -> str:
    if cluster.exhausted:
        return (
            f"gave up searching {_count(len(cluster.free), 'node')} for {k} that are all "
            "connected to each other and fit: too many partly linked nodes"
        )
    return f"no {k} nodes are all connected to each other"


def _largest(k: int) -> str:
    return (
        "the node with the most free memory" if k == 1 else f"the largest connected {k}-node group"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _fmt(n_bytes: int) -> str:
    mb = Memory.from_bytes(n_bytes).in_mb
    if mb >= 10 * 1024:
        return f"{mb / 1024:.1f} GB"
    if mb >= 10 or mb == int(mb):
        return f"{mb:.0f} MB"
    return f"{mb:.1f} MB"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
