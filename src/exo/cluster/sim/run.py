"""One simulated run: N nodes, a seeded schedule of faults and commands, then a quiet
phase in which the cluster must converge; invariants checked as it runs and at the end.

    result = simulate(Scenario(seed=7, nodes=5), tmp_dir)
    assert not result.violations, result.report()

The same seed gives the same run: the network's delays and losses, the faults, the
commands and every id the code draws come from one ``random.Random(seed)``, and the
clock is virtual (``loop``), so ``result.trace`` is equal for two runs of one seed.
"""

import itertools
import random
import uuid
from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from loguru import logger

import exo.shared.types.common as common_ids
from exo.cluster.config import ClusterConfig
from exo.cluster.sim.loop import VirtualTimeLoop
from exo.cluster.sim.net import Faults, SimNetwork
from exo.cluster.sim.node import SIM_MODEL, SimHost, SimNode
from exo.shared.tests.builders import pipeline_instance
from exo.shared.types.commands import Command, CreateInstance, DeleteInstance, PlaceInstance
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import IndexedEvent
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import RunnerId


@dataclass(frozen=True)
class Scenario:
    seed: int
    nodes: int = 3
    fault_s: float = 20.0
    """How long faults and commands go on."""
    converge_s: float = 30.0
    """Bound on convergence after the last fault (simulated seconds)."""
    node_timeout_s: float = 2.0
    mean_fault_gap_s: float = 2.0
    mean_command_gap_s: float = 0.4
    loss: float = 0.02
    duplication: float = 0.02
    latency_s: float = 0.002
    jitter_s: float = 0.01
    snapshot_every: int = 16
    """Events between snapshots (the log keeps as many after its snapshot): small, so
    that nodes coming back catch up from a snapshot."""
    leave_one_out: bool | None = None
    """One node stays down at the end (None: the seed decides)."""


@dataclass
class Result:
    scenario: Scenario
    trace: list[str] = field(default_factory=list[str])
    violations: list[str] = field(default_factory=list[str])
    converged_after_s: float | None = None
    acked: int = 0
    dropped: int = 0
    """Commands whose events merges dropped from some node's log."""
    resubmitted: int = 0
    """Commands nodes re-submitted after such merges."""
    failed: int = 0
    refused: dict[NodeId, set[CommandId]] = field(default_factory=dict[NodeId, set[CommandId]])
    """Per node up at the end whose record is whole (``clean``): the commands its log
    records as refused (``CommandRefused``)."""
    lost_with_gone: int = 0
    """Acknowledged commands that only nodes gone for good ever held."""

    def report(self) -> str:
        s = self.scenario
        head = (f"seed {s.seed} (N={s.nodes}): replay with simulate(Scenario(seed={s.seed}, "
                f"nodes={s.nodes}, fault_s={s.fault_s}), some_dir) (exo.cluster.sim.run)")
        return "\n".join([head, *self.violations, "last of the trace:", *self.trace[-40:]])


@contextmanager
def seeded_ids(rng: random.Random) -> Generator[None]:
    """Every id the code draws (``uuid4``) comes from ``rng`` while inside."""
    real = common_ids.uuid4
    common_ids.uuid4 = lambda: uuid.UUID(int=rng.getrandbits(128), version=4)  # pyright: ignore[reportAttributeAccessIssue]
    try:
        yield
    finally:
        common_ids.uuid4 = real


def simulate(scenario: Scenario, data_dir: Path) -> Result:
    result = Result(scenario)
    rng = random.Random(scenario.seed)
    logger.disable("exo")
    try:
        with seeded_ids(random.Random(rng.getrandbits(64))):
            anyio.run(_run, scenario, data_dir, rng, result, backend="asyncio",
                      backend_options={"loop_factory": VirtualTimeLoop})
    finally:
        logger.enable("exo")
    return result


class _World:
    def __init__(self, scenario: Scenario, data_dir: Path, rng: random.Random,
                 result: Result) -> None:
        self.s = scenario
        self.rng = rng
        self.result = result
        self.net = SimNetwork(random.Random(rng.getrandbits(64)), Faults(
            latency_s=scenario.latency_s, jitter_s=scenario.jitter_s, loss=scenario.loss,
            duplication=scenario.duplication, lease_s=min(scenario.node_timeout_s, 1.0),
        ))
        config = ClusterConfig(secret="sim", listen=(), node_timeout_s=scenario.node_timeout_s)
        self.clock: Callable[[], float] = anyio.current_time
        self.nodes = [
            SimNode(self.net, NodeId(f"n{i:02d}"), data_dir / f"n{i:02d}", config, self.clock,
                    snapshot_every=scenario.snapshot_every)
            for i in range(scenario.nodes)
        ]
        self.claims: dict[int, set[NodeId]] = {}
        self.claimed: dict[NodeId, list[int]] = {}
        self.meeting: dict[tuple[NodeId, NodeId], float] = {}
        self.counter = 0

    def log(self, line: str) -> None:
        self.result.trace.append(f"{self.clock():.6f} {line}")

    def on_apply(self, node_id: NodeId, indexed: IndexedEvent) -> None:
        kind = type(indexed.event).__name__
        self.log(f"{node_id} applied {indexed.idx} {kind} {indexed.command_id or ''}")

    def violation(self, text: str) -> None:
        self.result.violations.append(f"{self.clock():.3f}: {text}")
        self.log(f"VIOLATION {text}")

    # -- invariants while it runs ------------------------------------------------------

    def check_step(self) -> None:
        """Masters: at most one master per term, ever (not even on two sides of a
        partition); a node never claims a term twice (or a lower one after a higher); two
        masters that reach each other resolve within the node timeout."""
        now = self.clock()
        masters: list[tuple[NodeId, int]] = []
        for node in self.nodes:
            link = node.link
            if link is None or not link.is_master:
                continue
            term = link.election.claim_term
            masters.append((node.node_id, term))
            claimed = self.claimed.setdefault(node.node_id, [])
            if not claimed or claimed[-1] != term:
                if claimed and term <= claimed[-1]:
                    self.violation(f"{node.node_id} claimed term {term} after {claimed[-1]}")
                claimed.append(term)
                holders = self.claims.setdefault(term, set())
                holders.add(node.node_id)
                if len(holders) > 1:
                    self.violation(f"term {term} has more than one master: {sorted(holders)}")
        live_pairs: set[tuple[NodeId, NodeId]] = set()
        for a, term_a in masters:
            for b, term_b in masters:
                if a < b and self.net.linked(a, b):
                    live_pairs.add((a, b))
                    since = self.meeting.setdefault((a, b), now)
                    if now - since > 2 * self.s.node_timeout_s + 1.0:
                        self.violation(
                            f"masters {a} (term {term_a}) and {b} (term {term_b}) reach "
                            f"each other since {since:.3f} and neither steps down"
                        )
                        self.meeting[(a, b)] = now
        for pair in set(self.meeting) - live_pairs:
            del self.meeting[pair]

    # -- faults and commands -----------------------------------------------------------

    def up(self) -> list[SimNode]:
        return [n for n in self.nodes if n.up]

    def fault(self, tg: anyio.abc.TaskGroup) -> None:
        up, down = self.up(), [n for n in self.nodes if not n.up]
        ids = [n.node_id for n in self.nodes]
        choice = self.rng.random()
        if choice < 0.25 and len(up) > 1:
            victim = self.rng.choice(up)
            self.log(f"fault: crash {victim.node_id}")
            victim.crash()
        elif choice < 0.45 and down:
            back = self.rng.choice(down)
            self.log(f"fault: restart {back.node_id}")
            back.start(tg, self.on_apply)
        elif choice < 0.65 and len(ids) > 1:
            side = set(self.rng.sample(ids, self.rng.randint(1, len(ids) - 1)))
            cut = {(a, b) for a in ids for b in ids if (a in side) != (b in side)}
            self.log(f"fault: partition {sorted(side)} | rest")
            self.net.set_cut(cut)
        elif choice < 0.8 and len(ids) > 1:
            side = set(self.rng.sample(ids, self.rng.randint(1, len(ids) - 1)))
            cut = {(a, b) for a in side for b in ids if b not in side}
            self.log(f"fault: one-way cut from {sorted(side)}")
            self.net.set_cut(cut)
        else:
            self.log("fault: heal")
            self.net.set_cut(set())

    def command(self) -> None:
        up = [n for n in self.up() if n.host is not None]
        if not up:
            return
        node = self.rng.choice(up)
        assert node.host is not None
        state = node.host.state()
        self.counter += 1
        command_id = CommandId(f"c{self.s.seed}-{self.counter}")
        command: Command
        roll = self.rng.random()
        if state.instances and roll < 0.35:
            victim = self.rng.choice(sorted(state.instances))
            command = DeleteInstance(instance_id=victim, command_id=command_id)
        elif roll < 0.5 and state.nodes:
            command = PlaceInstance(model_id=SIM_MODEL, command_id=command_id)
        else:
            where = self.rng.choice(sorted(state.nodes) or [node.node_id])
            iid = InstanceId(f"i{self.s.seed}-{self.counter}")
            instance = pipeline_instance(iid, [(where, RunnerId(f"r{self.s.seed}-{self.counter}"))])
            command = CreateInstance(instance=instance, command_id=command_id)
        self.log(f"command {command_id} {type(command).__name__} at {node.node_id}")
        node.submit(command)

    # -- the end -----------------------------------------------------------------------

    def converged(self, gone: set[NodeId]) -> bool:
        up = self.up()
        masters = {n.link.master_id for n in up if n.link is not None}
        if len(masters) != 1 or None in masters:
            return False
        hosts = [n.host for n in up if n.host is not None]
        if not all(h.in_sync for h in hosts):
            return False
        if any(n.link is not None and n.link.delivery.resubmitting for n in up):
            return False  # commands a merge dropped are on their way back
        first = hosts[0].state()
        if set(first.nodes) != {n.node_id for n in up}:
            return False
        if any(set(i.shard_assignments.node_to_runner) & gone for i in first.instances.values()):
            return False
        last = first.last_event_applied_idx
        if any(h.state().last_event_applied_idx != last for h in hosts[1:]):
            return False
        return all(h.state() == first for h in hosts[1:])

    def clean(self, host: SimHost) -> bool:
        """Whether ``host`` applied every event of its log itself, from event 0 (none came
        in a snapshot), and its node never reported dropping a stretch of it in this run:
        then its record says which commands its log holds, in which order."""
        node = next(n for n in self.nodes if n.node_id == host.node_id)
        link = node.links[node.hosts.index(host)]
        last = host.state().last_event_applied_idx
        return not link.replica.dropped and set(host.applied) == set(range(last + 1))

    def final_checks(self, gone: set[NodeId]) -> None:
        final = [n.host for n in self.up() if n.host is not None]
        state = final[0].state() if final else None
        if state is not None:
            for instance in state.instances.values():
                on = set(instance.shard_assignments.node_to_runner) & gone
                if on:
                    self.violation(f"instance {instance.instance_id} left on gone {sorted(on)}")
        every_host = [h for n in self.nodes for h in n.hosts]
        acked: dict[CommandId, NodeId] = {c: h.node_id for h in every_host for c in h.acked}
        # A command only nodes that are gone for good ever held went with them (no quorum:
        # a master that is cut off acknowledges alone); every other must survive.
        survivors = {n.node_id for n in self.up()}
        held = {c for h in every_host if h.node_id in survivors for c in h.ever_applied}
        lost = {c for c in acked if c not in held}
        self.result.lost_with_gone = len(lost)
        acked = {c: origin for c, origin in acked.items() if c not in lost}
        # Never dropped: a merge that drops a stretch of a node's log re-submits the
        # commands behind it, to be applied again or recorded as refused (a deletion of
        # an instance the winner had deleted already). Excused: commands only in the
        # compacted part of a dropped stretch on every node that dropped them (reported
        # by index; a stretch longer than the log's tail).
        known: set[CommandId] = set()
        compacted: set[CommandId] = set()
        for n in self.nodes:
            held = [entry for host in n.hosts for entry in host.history]  # across its runs
            for link in n.links:
                for dropped in link.replica.dropped:
                    known |= set(dropped.commands)
                    compacted |= {c for i, c in held if dropped.first <= i < dropped.kept}
        excused = compacted - known
        self.result.acked = len(acked)
        self.result.dropped = sum(
            len(d.commands) for n in self.nodes for link in n.links for d in link.replica.dropped
        )
        self.result.resubmitted = sum(
            len(link.delivery.resubmitted) for n in self.nodes for link in n.links
        )
        self.result.failed = sum(len(h.failed) for h in every_host)
        self.result.refused = {h.node_id: set(h.refused) for h in final if self.clean(h)}
        for host in final:
            counts: dict[CommandId, int] = {}
            for command_id in host.applied.values():
                if command_id is not None:
                    counts[command_id] = counts.get(command_id, 0) + 1
            for command_id, count in counts.items():
                if count > 1:
                    self.violation(f"{host.node_id} applied {command_id} {count} times")
            if not self.clean(host):
                continue
            for command_id, origin in acked.items():
                if command_id not in counts and command_id not in excused:
                    self.violation(
                        f"{host.node_id} lacks {command_id} (acknowledged at {origin}): "
                        "dropped, not re-submitted"
                    )
        clean_hosts = [h for h in final if self.clean(h)]
        for a, b in itertools.pairwise(clean_hosts):
            for idx in sorted(set(a.applied) & set(b.applied)):
                if a.applied[idx] != b.applied[idx]:
                    self.violation(
                        f"{a.node_id} and {b.node_id} differ at event {idx}: "
                        f"{a.applied[idx]} vs {b.applied[idx]}"
                    )
                    break


async def _run(scenario: Scenario, data_dir: Path, rng: random.Random, result: Result) -> None:
    world = _World(scenario, data_dir, rng, result)
    async with anyio.create_task_group() as tg:
        for node in world.nodes:
            node.start(tg, world.on_apply)
            await anyio.sleep(rng.random() * 0.2)

        async def checker() -> None:
            while True:
                world.check_step()
                await anyio.sleep(0.01)

        tg.start_soon(checker)
        end = world.clock() + scenario.fault_s
        next_fault = world.clock() + rng.expovariate(1 / scenario.mean_fault_gap_s)
        next_command = world.clock() + rng.expovariate(1 / scenario.mean_command_gap_s)
        while (now := world.clock()) < end:
            if now >= next_fault:
                world.fault(tg)
                next_fault = now + rng.expovariate(1 / scenario.mean_fault_gap_s)
            if now >= next_command:
                world.command()
                next_command = now + rng.expovariate(1 / scenario.mean_command_gap_s)
            await anyio.sleep(max(min(next_fault, next_command, end) - world.clock(), 0.0))

        # The last fault: everything heals, every node comes back but (maybe) one.
        leave_one = scenario.leave_one_out
        if leave_one is None:
            leave_one = rng.random() < 0.5
        gone: set[NodeId] = set()
        world.net.set_cut(set())
        for node in world.nodes:
            if not node.up:
                node.start(tg, world.on_apply)
        if leave_one and len(world.nodes) >= 3:
            victim = rng.choice(world.nodes)
            victim.crash()
            gone.add(victim.node_id)
        world.log(f"faults over; gone for good: {sorted(gone)}")
        last_fault = world.clock()
        with anyio.move_on_after(scenario.converge_s):
            while not world.converged(gone):
                await anyio.sleep(0.05)
        if world.converged(gone):
            result.converged_after_s = world.clock() - last_fault
            world.log(f"converged after {result.converged_after_s:.3f} s")
        else:
            world.violation(f"no convergence within {scenario.converge_s} s after the last fault")
        world.final_checks(gone)
        for node in world.nodes:
            node.crash()
        tg.cancel_scope.cancel()
