"""Scale faults found with bench/sim.py, each pinned on a small simulated cluster."""

import random
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

import exo.cluster.catch_up as catch_up_module
from exo.cluster.config import ClusterConfig
from exo.cluster.messages import HEARTBEATS, CatchUpReply, CatchUpRequest
from exo.cluster.sim.loop import VirtualTimeLoop
from exo.cluster.sim.net import Faults, SimNetwork
from exo.cluster.sim.node import SimNode
from exo.shared.types.common import NodeId

pytestmark = [pytest.mark.slow]


def _meshed(nodes: list[SimNode]) -> bool:
    hosts = [n.host for n in nodes if n.host is not None]
    if len(hosts) != len(nodes) or not all(h.in_sync for h in hosts):
        return False
    states = [h.state() for h in hosts]
    n = len(nodes)
    return (
        len({s.last_event_applied_idx for s in states}) == 1
        and len(states[0].nodes) == n
        and len(states[0].topology.connections) == n * (n - 1)
    )


def _catch_ups_while_joining(tmp: Path, n: int) -> int:
    """Catch-up requests sent while ``n`` nodes start, elect and link up (a burst of
    n(n-1) events, reordered by the network's jitter)."""
    asked: list[int] = []

    async def main() -> None:
        net = SimNetwork(random.Random(3), Faults(latency_s=0.001, jitter_s=0.01))
        config = ClusterConfig(secret="s", listen=(), node_timeout_s=1.0)
        clock: Callable[[], float] = anyio.current_time
        nodes = [SimNode(net, NodeId(f"n{i}"), tmp / f"n{i}", config, clock) for i in range(n)]
        async with anyio.create_task_group() as tg:
            for node in nodes:
                node.start(tg, lambda _node, _event: None)
            with anyio.fail_after(60):
                while not _meshed(nodes):
                    await anyio.sleep(0.01)
            asked.append(sum(
                t.by_kind.get("cluster/catch_up", [0, 0])[0] for t in net.traffic.values()
            ))
            for node in nodes:
                node.crash()
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio", backend_options={"loop_factory": VirtualTimeLoop})
    return asked[0]


def test_reordered_events_do_not_make_a_catch_up_storm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower that sees a gap waits briefly for the overtaken event instead of asking
    the master at once: joining costs each follower about one catch-up, not one per gap."""
    n = 10
    calm = _catch_ups_while_joining(tmp_path / "calm", n)
    assert calm <= 2 * (n - 1), calm
    monkeypatch.setattr(catch_up_module, "GAP_WAIT_S", 0.0)  # ask at once, as before
    storm = _catch_ups_while_joining(tmp_path / "storm", n)
    assert storm >= 1.5 * calm, (storm, calm)


def test_a_node_far_behind_catches_up_from_the_masters_current_state(tmp_path: Path) -> None:
    """A new node gets the master's state as it is now, not its last snapshot plus a tail
    of events to apply one by one (at 64 nodes, a tail of ~1000 link events, each applied
    in O(links), made catch-up slow)."""
    replies: list[CatchUpReply] = []

    async def main() -> None:
        net = SimNetwork(random.Random(5), Faults(latency_s=0.001, jitter_s=0.002))
        config = ClusterConfig(secret="s", listen=(), node_timeout_s=1.0)
        clock: Callable[[], float] = anyio.current_time
        nodes = [SimNode(net, NodeId(f"n{i}"), tmp_path / f"n{i}", config, clock,
                         snapshot_every=5) for i in range(4)]
        async with anyio.create_task_group() as tg:
            for node in nodes:
                node.start(tg, lambda _node, _event: None)
            with anyio.fail_after(60):
                while not _meshed(nodes):
                    await anyio.sleep(0.01)
            master = next(n.link for n in nodes if n.link is not None and n.link.is_master)
            assert master is not None
            request = CatchUpRequest(last_idx=-1, lineage=())
            replies.append(await master.sequencer.serve_catch_up(request))
            for node in nodes:
                node.crash()
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio", backend_options={"loop_factory": VirtualTimeLoop})
    (reply,) = replies
    assert reply.last_idx > 5 and (reply.last_idx + 1) % 5 != 0  # a tail after a snapshot
    assert reply.base is not None and reply.events == []
    assert reply.base.last_event_applied_idx == reply.last_idx


def test_nodes_that_start_together_do_not_flood_each_other_with_heartbeats(
    tmp_path: Path,
) -> None:
    """Each node answers the others' joining with one heartbeat, not one per join (with
    N nodes joining at once that was N^3 messages: 250,000 at 64 nodes)."""
    n = 16
    sent: list[int] = []

    async def main() -> None:
        net = SimNetwork(random.Random(7), Faults(latency_s=0.001, jitter_s=0.002))
        config = ClusterConfig(secret="s", listen=(), node_timeout_s=5.0)  # beats every 1 s
        clock: Callable[[], float] = anyio.current_time
        nodes = [SimNode(net, NodeId(f"n{i}"), tmp_path / f"n{i}", config, clock)
                 for i in range(n)]
        async with anyio.create_task_group() as tg:
            for node in nodes:
                node.start(tg, lambda _node, _event: None)
            await anyio.sleep(0.5)  # before the first regular heartbeat
            sent.append(sum(
                t.by_kind.get(HEARTBEATS.name, [0, 0])[0] for t in net.traffic.values()
            ))
            for node in nodes:
                node.crash()
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio", backend_options={"loop_factory": VirtualTimeLoop})
    # Each node's first heartbeat, one at the first join and one for the joins that
    # followed, each to n - 1 others (one per join: 16 * 15 * 15 more).
    assert sent[0] <= 4 * n * (n - 1), sent
