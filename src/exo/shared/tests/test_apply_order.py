"""apply takes the log strictly in index order: no gaps, no duplicates."""

import pytest

from exo.shared.apply import EventOrderError, apply
from exo.shared.tests.builders import NODE_A, NODE_B, fold, node_info
from exo.shared.types.events import IndexedEvent, NodeGatheredInfo, NodeTimedOut
from exo.shared.types.state import State


def _info_event(idx: int) -> IndexedEvent:
    return IndexedEvent(idx=idx, event=NodeGatheredInfo(node_id=NODE_A, info=node_info()))


def test_fresh_state_has_applied_nothing() -> None:
    assert State().last_event_applied_idx == -1


def test_index_advances_with_each_event() -> None:
    state = State()
    for idx in range(3):
        state = apply(state, _info_event(idx))
        assert state.last_event_applied_idx == idx


def test_first_event_must_be_index_zero() -> None:
    with pytest.raises(EventOrderError, match=r"gap.*expected index 0, got 1"):
        apply(State(), _info_event(1))


def test_gap_is_refused_and_state_unchanged() -> None:
    state = fold(State(), [NodeGatheredInfo(node_id=NODE_A, info=node_info())])
    before = state.model_dump()
    gap = IndexedEvent(idx=2, event=NodeGatheredInfo(node_id=NODE_B, info=node_info()))
    with pytest.raises(EventOrderError, match=r"gap.*expected index 1, got 2"):
        apply(state, gap)
    assert state.model_dump() == before
    assert NODE_B not in state.nodes


def test_duplicate_is_refused_and_state_unchanged() -> None:
    state = fold(
        State(),
        [NodeGatheredInfo(node_id=NODE_A, info=node_info()), NodeTimedOut(node_id=NODE_B)],
    )
    before = state.model_dump()
    again = IndexedEvent(idx=1, event=NodeTimedOut(node_id=NODE_A))
    with pytest.raises(EventOrderError, match=r"duplicate.*expected index 2, got 1"):
        apply(state, again)
    assert state.model_dump() == before
    assert NODE_A in state.nodes


def test_event_order_error_is_a_value_error() -> None:
    # Callers that only know ValueError still see the refusal.
    assert issubclass(EventOrderError, ValueError)


def test_negative_index_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        IndexedEvent(idx=-1, event=NodeTimedOut(node_id=NODE_A))
