"""Groups of nodes for placement: the cluster as one placement call sees it (free
memory, links) and the search for the best group of pairwise linked nodes (a clique
search, branch and bound, bounded by ``SEARCH_STEPS`` per call). Pure."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exo.master.placement_memory import node_free_memory
from exo.master.placement_text import fmt, plural
from exo.shared.types.common import NodeId
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.topology import Topology
from exo.shared.types.worker.instances import Instance, InstanceId

SEARCH_STEPS = 50_000
"""Steps (groups extended) one placement call may spend searching for groups of nodes."""


@dataclass
class Cluster:
    """The nodes as one placement call sees them. ``steps_left`` bounds the work of
    the group searches of the call: finding the best group of linked nodes is a clique
    problem, cheap for the usual fully linked clusters but not for large, partly
    linked ones. A search that runs out keeps the best group it has found (valid,
    deterministic, maybe not the best); with none, the refusal says so."""

    free: Mapping[NodeId, int]
    neighbours: Mapping[NodeId, frozenset[NodeId]]
    steps_left: int = SEARCH_STEPS

    @classmethod
    def of(
        cls,
        nodes: Mapping[NodeId, NodeInfo],
        topology: Topology,
        instances: Mapping[InstanceId, Instance],
    ) -> "Cluster":
        neighbours: dict[NodeId, set[NodeId]] = {node_id: set() for node_id in nodes}
        for c in topology.connections:
            if c.source != c.sink and c.source in nodes and c.sink in nodes:
                neighbours[c.source].add(c.sink)
                neighbours[c.sink].add(c.source)
        return cls(
            free=node_free_memory(nodes, instances),
            neighbours={node_id: frozenset(linked) for node_id, linked in neighbours.items()},
        )

    def only(self, keep: frozenset[NodeId]) -> "Cluster":
        """The same cluster seen through a subset of its nodes."""
        return Cluster(
            free={n: f for n, f in self.free.items() if n in keep},
            neighbours={n: linked & keep for n, linked in self.neighbours.items() if n in keep},
        )

    @property
    def exhausted(self) -> bool:
        return self.steps_left <= 0

    def describe(self, group: Sequence[NodeId]) -> str:
        return ", ".join(f"node {n}: {fmt(self.free[n])}" for n in sorted(group))


def best_group(
    pool: Sequence[NodeId],
    k: int,
    cluster: Cluster,
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


def no_group_text(k: int, cluster: Cluster) -> str:
    if cluster.exhausted:
        return (
            f"gave up searching {plural(len(cluster.free), 'node')} for {k} that are all "
            "connected to each other and fit: too many partly linked nodes"
        )
    return f"no {k} nodes are all connected to each other"
