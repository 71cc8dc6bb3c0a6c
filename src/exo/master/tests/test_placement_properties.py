"""Property tests for placement, checked against a brute-force oracle.

The oracle is written from the rules, not from the implementation: a node can hold
``L`` layers when ``ceil(storage * L / n_layers) + L * kv_per_layer + overhead`` fits its
free memory (the KV cache of a layer: keys and values of every kv head at every position of
the runner's maximum batch, in float32; a runner's runtime overhead); a
group of ``k`` pairwise linked nodes can take the model when each holds at least one
layer and together they hold all of them.
"""

from dataclasses import dataclass
from itertools import combinations, pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from exo.master.placement import place_instance
from exo.shared.constants import EXO_RUNNER_MAX_BATCH
from exo.shared.models.memory import RUNNER_OVERHEAD_BYTES
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.common import NodeId
from exo.shared.types.memory import Memory
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.topology import Connection, Topology
from exo.shared.types.worker.instances import Instance, InstanceId, Sharding
from exo.shared.types.worker.shards import PipelineShardMetadata, TensorShardMetadata

MB = 1024 * 1024
NAMES = ["n0", "n1", "n2", "n3", "n4", "n5"]
INSTANCE_ID = InstanceId("prop")
OVERHEAD_MB = RUNNER_OVERHEAD_BYTES // MB


@dataclass(frozen=True)
class Scenario:
    free_mb: dict[str, int]
    links: frozenset[frozenset[str]]
    n_layers: int
    storage_mb: int
    heads: int
    kv_heads: int
    min_nodes: int

    def card(self) -> ModelCard:
        return ModelCard(
            model_id=ModelId("prop/model"),
            n_layers=self.n_layers,
            hidden_size=64,
            num_heads=self.heads,
            num_kv_heads=self.kv_heads,
            storage_size=Memory.from_mb(self.storage_mb),
            context_length=512,
            architecture="llama",
        )

    def nodes(self, reverse: bool = False) -> dict[NodeId, NodeInfo]:
        items = sorted(self.free_mb.items(), reverse=reverse)
        return {NodeId(name): _info(mb) for name, mb in items}

    def topology(self, reverse: bool = False) -> Topology:
        pairs = sorted(tuple(sorted(link)) for link in self.links)
        connections = [Connection(source=NodeId(a), sink=NodeId(b)) for a, b in pairs]
        return Topology(connections=connections[::-1] if reverse else connections)

    def place(self, sharding: Sharding, reverse: bool = False) -> Instance | str:
        result = place_instance(
            self.card(),
            sharding,
            self.min_nodes,
            self.nodes(reverse),
            self.topology(reverse),
            {},
            INSTANCE_ID,
        )
        return result if isinstance(result, Instance) else result.reason

    def linked(self, group: tuple[str, ...]) -> bool:
        return all(frozenset(pair) in self.links for pair in combinations(group, 2))


def _info(mb: int) -> NodeInfo:
    return NodeInfo(
        hostname="h",
        cpu_count=1,
        memory_total=Memory.from_mb(mb),
        memory_available=Memory.from_mb(mb),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    count = draw(st.integers(1, len(NAMES)))
    names = NAMES[:count]
    # A runner's runtime overhead on each node, plus 0 to 4000 MB for a shard.
    free_mb = {name: OVERHEAD_MB + draw(st.integers(0, 4000)) for name in names}
    all_pairs = [frozenset(p) for p in combinations(names, 2)]
    links: frozenset[frozenset[str]] = frozenset(all_pairs)
    if all_pairs and not draw(st.booleans()):  # half the time, a partial mesh
        links = frozenset(draw(st.sets(st.sampled_from(all_pairs))))
    return Scenario(
        free_mb=free_mb,
        links=links,
        n_layers=draw(st.integers(1, 80)),
        # The model takes 2% to 110% of the cluster's memory: every node count gets its turn.
        storage_mb=max(1, sum(free_mb.values()) * draw(st.integers(2, 110)) // 100),
        heads=draw(st.sampled_from([1, 2, 4, 6, 9, 12])),
        kv_heads=draw(st.sampled_from([1, 2, 3, 6])),
        min_nodes=draw(st.one_of(st.just(1), st.integers(1, count))),
    )


@st.composite
def spread_scenarios(draw: st.DrawFn) -> Scenario:
    """Fully linked clusters of 2 to 6 nodes that must all take part: the split itself."""
    count = draw(st.integers(2, len(NAMES)))
    names = NAMES[:count]
    free_mb = {name: OVERHEAD_MB + draw(st.integers(70, 4000)) for name in names}
    return Scenario(
        free_mb=free_mb,
        links=frozenset(frozenset(p) for p in combinations(names, 2)),
        n_layers=draw(st.integers(count, 120)),
        storage_mb=max(1, sum(free_mb.values()) * draw(st.integers(1, 100)) // 100),
        heads=1,
        kv_heads=1,
        min_nodes=count,
    )


def _kv_per_layer(s: Scenario) -> int:
    # k and v, kv heads of 64 // heads values, 512 positions (the card's context), float16.
    return 2 * s.kv_heads * (64 // s.heads) * 512 * EXO_RUNNER_MAX_BATCH * 2


def _shard_bytes(s: Scenario, layers: int) -> int:
    weights = -(-s.storage_mb * MB * layers // s.n_layers)
    return weights + layers * _kv_per_layer(s) + RUNNER_OVERHEAD_BYTES


def _capacity(s: Scenario, name: str) -> int:
    free = s.free_mb[name] * MB
    return sum(1 for layers in range(1, s.n_layers + 1) if _shard_bytes(s, layers) <= free)


def _pipeline_groups(s: Scenario, k: int) -> list[tuple[str, ...]]:
    """Every group of k nodes that could hold the model, by brute force."""
    return [
        group
        for group in combinations(sorted(s.free_mb), k)
        if (k == 1 or s.linked(group))
        and k <= s.n_layers
        and all(_capacity(s, x) >= 1 for x in group)
        and sum(_capacity(s, x) for x in group) >= s.n_layers
    ]


def _tensor_groups(s: Scenario, k: int) -> list[tuple[str, ...]]:
    if s.heads % k or s.kv_heads % k:
        return []
    kv = s.n_layers * _kv_per_layer(s) // k
    need = -(-s.storage_mb * MB // k) + kv + RUNNER_OVERHEAD_BYTES
    return [
        group
        for group in combinations(sorted(s.free_mb), k)
        if (k == 1 or s.linked(group)) and all(s.free_mb[x] * MB >= need for x in group)
    ]


def _nodes_of(instance: Instance) -> tuple[str, ...]:
    return tuple(sorted(str(n) for n in instance.shard_assignments.node_to_runner))


def _check_best(
    s: Scenario, instance: Instance, groups_of_size: list[list[tuple[str, ...]]]
) -> None:
    """The instance uses the fewest nodes possible and, among those, the most memory."""
    first = max(s.min_nodes, 1)
    possible = [k for k in range(first, len(s.free_mb) + 1) if groups_of_size[k]]
    assert possible, "placed although the oracle finds no group"
    k = instance.world_size
    assert k == possible[0]
    best = max(sum(s.free_mb[x] for x in g) for g in groups_of_size[k])
    assert sum(s.free_mb[x] for x in _nodes_of(instance)) == best


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_pipeline_placement_properties(s: Scenario) -> None:
    _check_pipeline(s)


@settings(max_examples=100, deadline=None)
@given(spread_scenarios())
def test_pipeline_spread_over_every_node(s: Scenario) -> None:
    _check_pipeline(s)


def _check_pipeline(s: Scenario) -> None:
    result = s.place("pipeline")
    groups = [[], *(_pipeline_groups(s, k) for k in range(1, len(s.free_mb) + 1))]
    first = max(s.min_nodes, 1)
    if isinstance(result, str):
        assert result
        assert not any(groups[k] for k in range(first, len(s.free_mb) + 1)), result
        assert s.place("pipeline", reverse=True) == result
        return

    _check_best(s, result, groups)
    assignments = result.shard_assignments
    shards: list[tuple[str, PipelineShardMetadata]] = []
    for node_id, runner_id in assignments.node_to_runner.items():
        shard = assignments.runner_to_shard[runner_id]
        assert isinstance(shard, PipelineShardMetadata)
        assert runner_id == f"{INSTANCE_ID}-{shard.device_rank}"
        shards.append((str(node_id), shard))
    shards.sort(key=lambda pair: pair[1].device_rank)

    # Ranks 0..k-1 in node id order, contiguous layers covering 0..n exactly.
    assert [shard.device_rank for _, shard in shards] == list(range(len(shards)))
    assert [name for name, _ in shards] == sorted(name for name, _ in shards)
    assert shards[0][1].start_layer == 0
    assert shards[-1][1].end_layer == s.n_layers
    for (_, before), (_, after) in pairwise(shards):
        assert before.end_layer == after.start_layer
    for name, shard in shards:
        layers = shard.end_layer - shard.start_layer
        assert layers >= 1
        assert shard.world_size == len(shards)
        assert shard.n_layers == s.n_layers
        assert _shard_bytes(s, layers) <= s.free_mb[name] * MB

    # Deterministic, whatever the insertion order.
    assert s.place("pipeline") == result
    assert s.place("pipeline", reverse=True) == result


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_tensor_placement_properties(s: Scenario) -> None:
    result = s.place("tensor")
    groups = [[], *(_tensor_groups(s, k) for k in range(1, len(s.free_mb) + 1))]
    first = max(s.min_nodes, 1)
    if isinstance(result, str):
        assert result
        assert not any(groups[k] for k in range(first, len(s.free_mb) + 1)), result
        return

    _check_best(s, result, groups)
    k = result.world_size
    assert s.heads % k == 0 and s.kv_heads % k == 0
    shards = result.shard_assignments.runner_to_shard.values()
    assert sorted(shard.device_rank for shard in shards) == list(range(k))
    assert all(isinstance(sh, TensorShardMetadata) and sh.world_size == k for sh in shards)
    assert s.place("tensor", reverse=True) == result
