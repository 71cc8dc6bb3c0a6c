import subprocess
import sys
import textwrap

# In a fresh interpreter: the collector's state is process-wide, and threads other tests leave
# behind (a node started in process freezes its own objects) would move objects under the checks.
_SCRIPT = textwrap.dedent(
    """
    import gc
    import weakref

    from exo.utils.heap import freeze_long_lived


    class Node:
        def __init__(self) -> None:
            self.other: object = self  # a cycle: only the collector frees it


    kept = {"a long-lived object": [1, 2, 3]}
    cycle = Node()
    gone = weakref.ref(cycle)
    del cycle
    frozen = freeze_long_lived()
    assert gone() is None, "the garbage was kept for ever, not collected before the freeze"
    assert frozen == gc.get_freeze_count() > 0, (frozen, gc.get_freeze_count())
    # the permanent generation: no generation the collector walks holds it any more
    assert not any(o is kept for o in gc.get_objects()), "a long-lived object is still walked"
    later = {"made after": []}
    assert any(o is later for o in gc.get_objects()), "a new object is not walked"
    gc.unfreeze()
    assert any(o is kept for o in gc.get_objects()), "unfreezing did not give it back"
    print("ok")
    """
)


def test_freezing_collects_the_garbage_then_leaves_the_rest_out_of_collections() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
