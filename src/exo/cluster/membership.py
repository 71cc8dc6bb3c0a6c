"""Membership: the events a master emits so that the state matches the live nodes.
Pure: the state and the set of live nodes in, events out.

* A node the state knows of (its info, links, downloads, or a shard of an instance) that
  is not live is gone: ``NodeTimedOut`` (apply removes its runners and the instances
  with a shard on it).
* Two live nodes that both reported their info are linked both ways:
  ``TopologyEdgeCreated`` for each direction the topology lacks. (Every node of a zenoh
  cluster reaches every other: the mesh routes for them.)
"""

from collections.abc import Set

from exo.shared.types.common import NodeId
from exo.shared.types.events import Event, NodeTimedOut, TopologyEdgeCreated
from exo.shared.types.state import State
from exo.shared.types.topology import Connection


def known_nodes(state: State) -> set[NodeId]:
    known = set(state.nodes) | set(state.downloads)
    for connection in state.topology.connections:
        known |= {connection.source, connection.sink}
    for instance in state.instances.values():
        known |= set(instance.shard_assignments.node_to_runner)
    return known


def membership_events(state: State, live: Set[NodeId]) -> list[Event]:
    events: list[Event] = [
        NodeTimedOut(node_id=node_id) for node_id in sorted(known_nodes(state) - live)
    ]
    present = sorted(set(state.nodes) & live)
    linked = state.topology.links()
    for source in present:
        for sink in present:
            if source != sink and (source, sink) not in linked:
                events.append(TopologyEdgeCreated(connection=Connection(source=source, sink=sink)))
    return events
