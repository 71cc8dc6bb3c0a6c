"""The cluster protocol at scale, in the simulator (``exo.cluster.sim``): N nodes' real
cluster code in one process on a virtual clock, with the CPU time the code really spends
charged to that clock. Prints, for each N:

* election: simulated seconds from the master's crash until every other node follows
  one new master;
* catch-up: seconds for a new node to catch up with a log of ``--events`` events;
* traffic: messages and bytes each node sends per second at steady state (then the
  fit of traffic per node against its N-1 peers: the exponent k of traffic ~ (N-1)^k;
  k <= 1 is linear or better);
* heal: seconds until every node agrees again after a partition into halves heals.

    python bench/sim.py [--nodes 3 8 16 32 64] [--events 100000] [--seed 1]

Each node runs on its own simulated machine: the CPU time its code spends (applying,
snapshotting, serialising, handling each message) delays that node's next steps, as on
a real machine, while other nodes go on. (Earlier, all nodes' CPU time went to one clock,
as if N nodes shared one core: the simulated cluster then slowed down as N^2 and fell
apart at N=64.) Not charged: the simulator's own work of delivering a message to each
of N nodes (a real node hands one message to the network), and garbage collection (one
process holds all N nodes' objects, so a collection walks N heaps where a real node walks
one; charged, it stalled a random node for seconds at N=64). The message and byte counts
are exact. Each phase starts from a cluster
whose mesh is complete (every node linked to every other), so that a burst of N(N-1)
link events does not run into the measurement.
"""

import argparse
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio
from anyio.abc import TaskGroup
from loguru import logger

from exo.cluster.config import ClusterConfig
from exo.cluster.sim.loop import VirtualTimeLoop
from exo.cluster.sim.net import Faults, SimNetwork, Traffic
from exo.cluster.sim.node import SimNode
from exo.master.event_log import SqliteEventLog
from exo.shared.apply import apply
from exo.shared.tests.builders import pipeline_instance
from exo.shared.types.common import NodeId
from exo.shared.types.events import IndexedEvent, InstanceCreated, InstanceDeleted
from exo.shared.types.state import State
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import RunnerId

TIMEOUT_S = 60.0
"""Give up on any one phase after this many simulated seconds."""


def fill_log(path: Path, events: int) -> None:
    """A log of ``events`` events (instances created and deleted) on ``path``."""
    log = SqliteEventLog(path)
    state = State()
    batch: list[tuple[IndexedEvent, State]] = []
    for idx in range(events):
        iid = InstanceId(f"filler-{idx // 2}")
        if idx % 2 == 0:
            instance = pipeline_instance(iid, [(NodeId("filler"), RunnerId(f"r-{idx}"))])
            event: InstanceCreated | InstanceDeleted = InstanceCreated(instance=instance)
        else:
            event = InstanceDeleted(instance_id=iid)
        indexed = IndexedEvent(idx=idx, event=event)
        state = apply(state, indexed)
        batch.append((indexed, state))
        if len(batch) == 5000:
            log.append_many(batch)
            batch = []
    log.append_many(batch)
    log.close()


class Bench:
    def __init__(self, n: int, root: Path, seed: int, tg: TaskGroup) -> None:
        self.tg = tg
        self.net = SimNetwork(random.Random(seed), Faults(latency_s=0.001, jitter_s=0.002))
        self.config = ClusterConfig(secret="bench", listen=())
        self.clock: Callable[[], float] = anyio.current_time
        self.root = root
        self.nodes = [self.node(i) for i in range(n)]

    def node(self, i: int) -> SimNode:
        return SimNode(self.net, NodeId(f"n{i:02d}"), self.root / f"n{i:02d}", self.config,
                       self.clock)

    def start(self, node: SimNode) -> None:
        node.start(self.tg, lambda _node, _event: None)

    def up(self) -> list[SimNode]:
        return [n for n in self.nodes if n.up]

    def agreed(self, meshed: bool = False) -> SimNode | None:
        """The master every up node follows, once all are in sync at one index with every
        up node in the state (and, with ``meshed``, every one linked to every other)."""
        up = self.up()
        masters = {n.link.master_id for n in up if n.link is not None}
        if len(masters) != 1:
            return None
        (master_id,) = masters
        master = next((n for n in up if n.node_id == master_id), None)
        if master is None or master.link is None or not master.link.is_master:
            return None
        hosts = [n.host for n in up if n.host is not None]
        last = {h.state().last_event_applied_idx for h in hosts}
        if len(last) != 1 or not all(h.in_sync for h in hosts):
            return None
        state = hosts[0].state()
        if len(state.nodes) != len(up):
            return None
        if not meshed:
            return master
        # The mesh is complete (every node linked to every other: N(N-1) links are
        # N(N-1) events after the nodes join), so that a steady state is steady.
        linked = {(c.source, c.sink) for c in state.topology.connections}
        if len(linked) != len(up) * (len(up) - 1):
            return None
        return master

    async def until(self, what: str, check: Callable[[], bool]) -> float:
        started = self.clock()
        with anyio.fail_after(TIMEOUT_S):
            while not check():
                await anyio.sleep(0.005)
        del what
        return self.clock() - started


async def measure(n: int, events: int, seed: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        async with anyio.create_task_group() as tg:
            bench = Bench(n, root, seed, tg)
            for node in bench.nodes:
                bench.start(node)
            await bench.until("a complete mesh", lambda: bench.agreed(meshed=True) is not None)
            # Steady state: what each node sends per second.
            await anyio.sleep(2 * bench.config.heartbeat_interval_s)
            bench.net.traffic = {}
            started = bench.clock()
            await anyio.sleep(10.0)
            span = bench.clock() - started
            sent = list(bench.net.traffic.values()) or [Traffic()]
            figures["msgs_per_node_s"] = sum(t.messages for t in sent) / n / span
            figures["bytes_per_node_s"] = sum(t.bytes for t in sent) / n / span

            # Election after the master crashes.
            master = bench.agreed()
            assert master is not None
            master.crash()
            figures["election_s"] = await bench.until(
                "a new master", lambda: bench.agreed() not in (None, master)
            )
            bench.start(master)  # it comes back (and follows)
            await bench.until("a complete mesh", lambda: bench.agreed(meshed=True) is not None)

            # Convergence after a partition into halves heals.
            ids = [node.node_id for node in bench.nodes]
            half = set(ids[: n // 2])
            bench.net.set_cut({(a, b) for a in ids for b in ids if (a in half) != (b in half)})
            await anyio.sleep(3 * bench.config.node_timeout_s)
            split = {n.link.master_id for n in bench.up() if n.link is not None}
            assert len(split) == 2, f"a partition into halves should give two masters: {split}"
            bench.net.set_cut(set())
            figures["heal_s"] = await bench.until(
                "agreement after the heal", lambda: bench.agreed() is not None
            )
            for node in bench.nodes:
                node.crash()
            tg.cancel_scope.cancel()

        # Catch-up: a new node joins a cluster whose master's log holds `events` events.
        fill_log(root / "big" / "n00" / "cluster" / "events.db", events)
        async with anyio.create_task_group() as tg:
            bench = Bench(n - 1, root / "big", seed, tg)
            for node in bench.nodes:
                bench.start(node)
            await bench.until("a complete mesh", lambda: bench.agreed(meshed=True) is not None)
            newcomer = bench.node(n - 1)
            bench.nodes.append(newcomer)
            started = bench.clock()
            bench.start(newcomer)
            await bench.until("the new node in sync", lambda: bench.agreed() is not None)
            figures["catch_up_s"] = bench.clock() - started
            for node in bench.nodes:
                node.crash()
            tg.cancel_scope.cancel()
    return figures


def fit_exponent(ns: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(N)."""
    xs = [math.log(n) for n in ns]
    ys = [math.log(max(v, 1e-12)) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[3, 8, 16, 32, 64])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if min(args.nodes) < 2:
        raise SystemExit("sim.py: --nodes must be at least 2")
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    rows: list[tuple[int, dict[str, float]]] = []
    print(f"{'N':>4} {'election s':>11} {'catch-up s':>11} {'msgs/node/s':>12} "
          f"{'bytes/node/s':>13} {'heal s':>8} {'wall s':>7}")
    for n in args.nodes:
        wall = time.monotonic()
        figures = anyio.run(
            measure, n, args.events, args.seed, backend="asyncio",
            backend_options={"loop_factory": lambda: VirtualTimeLoop(charge_cpu=True)},
        )
        rows.append((n, figures))
        print(f"{n:>4} {figures['election_s']:>11.3f} {figures['catch_up_s']:>11.3f} "
              f"{figures['msgs_per_node_s']:>12.1f} {figures['bytes_per_node_s']:>13.0f} "
              f"{figures['heal_s']:>8.3f} {time.monotonic() - wall:>7.1f}", flush=True)
    if len(rows) >= 2:
        # Each node sends to each of its N-1 peers: fit against the peer count.
        peers = [n - 1 for n, _ in rows]
        k_msgs = fit_exponent(peers, [f["msgs_per_node_s"] for _, f in rows])
        k_bytes = fit_exponent(peers, [f["bytes_per_node_s"] for _, f in rows])
        print(f"traffic per node ~ (N-1)^{k_msgs:.2f} (messages), (N-1)^{k_bytes:.2f} "
              f"(bytes); linear or better: {'yes' if max(k_msgs, k_bytes) <= 1.05 else 'NO'}")


if __name__ == "__main__":
    main()
