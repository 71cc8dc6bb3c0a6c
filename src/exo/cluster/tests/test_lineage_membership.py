"""Lineage comparison and membership events, with plain values."""

from exo.cluster.lineage import MAX_EPOCHS, Epoch, agreed_prefix, epoch_at, extended, truncated
from exo.cluster.membership import membership_events
from exo.shared.tests.builders import (
    INSTANCE_1,
    NODE_A,
    NODE_B,
    NODE_C,
    RUNNER_A1,
    RUNNER_B1,
    fold,
    node_info,
    pipeline_instance,
)
from exo.shared.types.common import NodeId
from exo.shared.types.events import (
    Event,
    InstanceCreated,
    NodeGatheredInfo,
    NodeTimedOut,
    TopologyEdgeCreated,
)
from exo.shared.types.state import State
from exo.shared.types.topology import Connection

M1, M2, M3 = NodeId("m1"), NodeId("m2"), NodeId("m3")


def state_from(*events: Event) -> State:
    return fold(State(), events)


def epoch(term: int, master: NodeId, start: int) -> Epoch:
    return Epoch(term=term, master=master, start_idx=start)


def test_a_follower_behind_on_the_same_lineage_agrees_up_to_its_end() -> None:
    master = (epoch(1, M1, 0), epoch(2, M2, 101))
    assert agreed_prefix((epoch(1, M1, 0),), 100, master, 150) == 100
    assert agreed_prefix((epoch(1, M1, 0),), 40, master, 150) == 40
    assert agreed_prefix((), -1, master, 150) == -1


def test_a_follower_ahead_of_the_new_master_disagrees_where_the_master_changed() -> None:
    # The old master m1 wrote 101..105 but died before m2 (at 100) received them.
    follower = (epoch(1, M1, 0),)
    master = (epoch(1, M1, 0), epoch(2, M2, 101))
    assert agreed_prefix(follower, 105, master, 120) == 100
    # Ahead on the very same lineage (the master has not got there yet): agree to its end.
    assert agreed_prefix(follower, 105, (epoch(1, M1, 0),), 103) == 103


def test_a_merged_minority_disagrees_from_its_own_epoch() -> None:
    minority = (epoch(1, M1, 0), epoch(2, M3, 50))
    majority = (epoch(1, M1, 0), epoch(2, M2, 60))
    assert agreed_prefix(minority, 70, majority, 200) == 49
    # Same term, other master: a different epoch.
    assert agreed_prefix((epoch(2, M3, 0),), 5, (epoch(2, M2, 0),), 5) == -1


def test_events_before_any_epoch_compare_equal() -> None:
    assert agreed_prefix((), 99, (epoch(1, M1, 100),), 150) == 99
    assert agreed_prefix((), 120, (epoch(1, M1, 100),), 150) == 99


def test_truncating_and_extending() -> None:
    lineage = (epoch(1, M1, 0), epoch(2, M2, 10), epoch(3, M1, 20))
    assert truncated(lineage, 15) == lineage[:2]
    assert truncated(lineage, 9) == lineage[:1]
    assert extended(lineage, epoch(4, M3, 10)) == (epoch(1, M1, 0), epoch(4, M3, 10))
    assert epoch_at(lineage, 19) == epoch(2, M2, 10)
    assert epoch_at((), 3) is None
    long = tuple(epoch(t, M1, t) for t in range(MAX_EPOCHS + 5))
    assert len(extended(long, epoch(999, M2, 10_000))) == MAX_EPOCHS


def test_nodes_that_are_not_live_time_out_and_live_ones_are_linked() -> None:
    state = state_from(
        NodeGatheredInfo(node_id=NODE_A, info=node_info()),
        NodeGatheredInfo(node_id=NODE_B, info=node_info()),
        NodeGatheredInfo(node_id=NODE_C, info=node_info()),
        InstanceCreated(
            instance=pipeline_instance(INSTANCE_1, [(NODE_A, RUNNER_A1), (NODE_B, RUNNER_B1)])
        ),
    )
    events = membership_events(state, {NODE_A, NODE_C})
    assert events == [
        NodeTimedOut(node_id=NODE_B),
        TopologyEdgeCreated(connection=Connection(source=NODE_A, sink=NODE_C)),
        TopologyEdgeCreated(connection=Connection(source=NODE_C, sink=NODE_A)),
    ]


def test_membership_is_quiet_when_the_state_matches() -> None:
    state = state_from(
        NodeGatheredInfo(node_id=NODE_A, info=node_info()),
        NodeGatheredInfo(node_id=NODE_B, info=node_info()),
        TopologyEdgeCreated(connection=Connection(source=NODE_A, sink=NODE_B)),
        TopologyEdgeCreated(connection=Connection(source=NODE_B, sink=NODE_A)),
    )
    assert membership_events(state, {NODE_A, NODE_B}) == []
    # A live node that has not reported its info yet is not linked yet.
    assert membership_events(state, {NODE_A, NODE_B, NODE_C}) == []
    # A node only known from an instance is gone too.
    lone = state_from(
        InstanceCreated(instance=pipeline_instance(INSTANCE_1, [(NODE_C, RUNNER_A1)]))
    )
    assert membership_events(lone, {NODE_A}) == [NodeTimedOut(node_id=NODE_C)]
