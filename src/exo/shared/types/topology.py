"""Which nodes can reach which."""

from exo.shared.types.common import FrozenModel, NodeId


class Connection(FrozenModel):
    source: NodeId
    sink: NodeId


class Topology(FrozenModel):
    connections: list[Connection] = []

    def with_connection(self, connection: Connection) -> "Topology":
        if self.connected(connection.source, connection.sink):
            return self
        return Topology(connections=[*self.connections, connection])

    def without_connection(self, connection: Connection) -> "Topology":
        return Topology(connections=[c for c in self.connections if c != connection])

    def without_node(self, node_id: NodeId) -> "Topology":
        return Topology(
            connections=[c for c in self.connections if node_id not in (c.source, c.sink)]
        )

    def neighbours(self, node_id: NodeId) -> set[NodeId]:
        return {c.sink for c in self.connections if c.source == node_id}

    def connected(self, a: NodeId, b: NodeId) -> bool:
        # Plain string comparisons: a model comparison per link is slow in large clusters.
        return any(c.source == a and c.sink == b for c in self.connections)
