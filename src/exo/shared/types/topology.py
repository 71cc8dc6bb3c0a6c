"""Which nodes can reach which."""

from exo.shared.types.common import FrozenModel, NodeId

_LINKS = "_link_index"
"""Where a topology keeps its (source, sink) pairs once built (in ``__dict__``: not a
field, so neither dumped nor compared): ``_Links``, with the list it was built from."""

_Pairs = frozenset[tuple[NodeId, NodeId]]


class _Links:
    """A set of pairs in two parts: most in ``base``, the latest few in ``recent``. Adding
    one copies only ``recent`` (until it holds about sqrt(n), when the two merge), so
    each addition costs O(sqrt(n)), not a copy of all n."""

    def __init__(self, connections: "list[Connection]", base: _Pairs, recent: _Pairs) -> None:
        self.connections = connections
        self.base = base
        self.recent = recent

    def __contains__(self, pair: tuple[NodeId, NodeId]) -> bool:
        return pair in self.recent or pair in self.base

    def plus(self, connections: "list[Connection]", pair: tuple[NodeId, NodeId]) -> "_Links":
        recent = self.recent | {pair}
        if len(recent) ** 2 > len(self.base):
            return _Links(connections, self.base | recent, frozenset())
        return _Links(connections, self.base, recent)


class Connection(FrozenModel):
    source: NodeId
    sink: NodeId


class Topology(FrozenModel):
    connections: list[Connection] = []

    def with_connection(self, connection: Connection) -> "Topology":
        """This topology with ``connection`` (itself, if it has it already), in O(sqrt
        of the links): a cluster of N nodes applies N(N-1) of these to link up, and a
        scan of the links in each made that N^4 (at 64 nodes, seconds per node)."""
        links = self._links()
        pair = (connection.source, connection.sink)
        if pair in links:
            return self
        # Built from valid parts: no need to validate the whole list again.
        grown = Topology.model_construct(connections=[*self.connections, connection])
        vars(grown)[_LINKS] = links.plus(grown.connections, pair)
        return grown

    def without_connection(self, connection: Connection) -> "Topology":
        return Topology(connections=[c for c in self.connections if c != connection])

    def without_node(self, node_id: NodeId) -> "Topology":
        return Topology(
            connections=[c for c in self.connections if node_id not in (c.source, c.sink)]
        )

    def neighbours(self, node_id: NodeId) -> set[NodeId]:
        return {c.sink for c in self.connections if c.source == node_id}

    def links(self) -> _Pairs:
        """Every (source, sink) pair."""
        links = self._links()
        if links.recent:
            links = _Links(self.connections, links.base | links.recent, frozenset())
            vars(self)[_LINKS] = links
        return links.base

    def connected(self, a: NodeId, b: NodeId) -> bool:
        return (a, b) in self._links()

    def _links(self) -> _Links:
        links: _Links | None = vars(self).get(_LINKS)
        if links is None or links.connections is not self.connections:  # (or a copy's)
            pairs = frozenset((c.source, c.sink) for c in self.connections)
            links = _Links(self.connections, pairs, frozenset())
            vars(self)[_LINKS] = links
        return links
