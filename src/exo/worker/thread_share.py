"""How a node's CPU threads are shared among its runners (one process per model instance).

Each runner sizes its torch pool and its kernel pool once, at spawn; two runners that both took
every core would fight over them (oversubscription: every step slower than with half the
threads each). So the node's budget (`--threads`, default every core) is split: a new runner
gets an even share among the runners this node hosts (live and about to start), and never more
than the live runners leave free, so the sum stays within the budget. Only when the budget is
already all taken (more runners than threads) does a runner still get one thread; the log says
so.
"""

from collections.abc import Collection

from exo.shared.types.common import NodeId
from exo.shared.types.state import State


def local_runner_count(state: State, node_id: NodeId) -> int:
    """Runners this node hosts: one per instance with a shard here."""
    return sum(1 for i in state.instances.values() if node_id in i.shard_assignments.node_to_runner)


def threads_for_new_runner(budget: int, live: Collection[int], hosted: int) -> int:
    """Threads for a runner about to start. `live`: the threads of each runner already running;
    `hosted`: runners this node hosts, the new one included."""
    share = max(1, budget // max(1, hosted, len(live) + 1))
    free = budget - sum(live)
    return max(1, min(share, free))
