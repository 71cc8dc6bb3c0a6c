import gc
import weakref

from exo.utils.heap import freeze_long_lived


class _Node:
    def __init__(self) -> None:
        self.other: object = self  # a cycle: only the collector frees it


def test_freezing_collects_the_garbage_then_leaves_the_rest_out_of_collections() -> None:
    kept = {"a long-lived object": [1, 2, 3]}
    cycle = _Node()
    gone = weakref.ref(cycle)
    del cycle
    try:
        frozen = freeze_long_lived()
        assert gone() is None  # collected before the freeze, not kept for ever
        assert frozen == gc.get_freeze_count() > 0
        # the permanent generation: no generation the collector walks holds it any more
        assert not any(o is kept for o in gc.get_objects())
        later = {"made after": []}
        assert any(o is later for o in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(o is kept for o in gc.get_objects())
