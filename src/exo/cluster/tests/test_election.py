"""Scenario tests of the election with plain values: a small simulated cluster whose
nodes exchange heartbeats every tick. Each node has its own clock, which starts at zero
when the node (re)starts, as a monotonic clock does."""

from dataclasses import dataclass, field
from itertools import pairwise

from exo.cluster.election import (
    NODE_BITS,
    Election,
    Heard,
    Held,
    Timing,
    claim_term_for,
    step,
)
from exo.cluster.lineage import Epoch, extended
from exo.shared.types.common import NodeId

A, B, C, D = NodeId("a"), NodeId("b"), NodeId("c"), NodeId("d")


def round_of(term: int) -> int:
    """Which election round a term was claimed in (its low bits name the claimer)."""
    return term >> NODE_BITS


TIMING = Timing(node_timeout_s=1.0, settle_s=0.2, join_grace_s=0.5)
TICK = 0.05


@dataclass
class SimNode:
    election: Election
    last_idx: int
    booted_at: float
    heard: dict[NodeId, Heard] = field(default_factory=dict[NodeId, Heard])
    gone: set[NodeId] = field(default_factory=set[NodeId])
    running: bool = True
    """False: killed or hung (sends nothing, decides nothing)."""
    log_term: int = 0
    """The term of the master that wrote its last event."""
    lineage: tuple[Epoch, ...] = ()
    marks: list[int] = field(default_factory=list[int])
    """Indices of the events that came from client commands."""
    serving: int = 0
    """Instances its state holds."""

    def held(self) -> Held:
        return Held(lineage=self.lineage, command_marks=tuple(self.marks), serving=self.serving)


@dataclass
class Sim:
    now: float = 100.0
    nodes: dict[NodeId, SimNode] = field(default_factory=dict[NodeId, SimNode])
    cut: set[frozenset[NodeId]] = field(default_factory=set[frozenset[NodeId]])

    def clock(self, node: SimNode) -> float:
        return self.now - node.booted_at

    def start(self, node_id: NodeId, *, last_idx: int = -1, term: int = 0,
              force: bool = False) -> None:
        """Start (or restart) a node: its clock starts at zero, its term is what it persisted."""
        self.nodes[node_id] = SimNode(
            election=Election.start(node_id, force, term, 0.0),
            last_idx=last_idx,
            booted_at=self.now,
        )

    def kill(self, node_id: NodeId) -> None:
        """The process dies: the others see its liveliness token go at once."""
        self.nodes[node_id].running = False
        for other_id, other in self.nodes.items():
            if other_id != node_id and self.linked(node_id, other_id):
                other.gone.add(node_id)

    def hang(self, node_id: NodeId) -> None:
        """The process stops answering: only the heartbeat timeout notices."""
        self.nodes[node_id].running = False

    def resume(self, node_id: NodeId) -> None:
        """A hung process runs again (SIGCONT), with the election state it had."""
        self.nodes[node_id].running = True

    def write(self, node_id: NodeId, events: int, commands: int = 0) -> None:
        """The node (a master) appends events to its log, in its own claim's term; the
        last ``commands`` of them come from client commands."""
        node = self.nodes[node_id]
        assert node.election.is_master
        epoch = Epoch(term=node.election.claim_term, master=node_id, start_idx=node.last_idx + 1)
        if not node.lineage or not node.lineage[-1].same_epoch(epoch):
            node.lineage = extended(node.lineage, epoch)
        node.last_idx += events
        node.marks += range(node.last_idx - commands + 1, node.last_idx + 1)
        node.log_term = node.election.claim_term

    def copy_log(self, to: NodeId, source: NodeId) -> None:
        """``to`` catches up with ``source`` (replacing whatever its log held)."""
        src, dst = self.nodes[source], self.nodes[to]
        dst.last_idx, dst.log_term, dst.lineage = src.last_idx, src.log_term, src.lineage
        dst.marks, dst.serving = list(src.marks), src.serving

    def linked(self, a: NodeId, b: NodeId) -> bool:
        return frozenset((a, b)) not in self.cut

    def partition(self, *groups: set[NodeId]) -> None:
        for i, group in enumerate(groups):
            for other in groups[i + 1 :]:
                self.cut |= {frozenset((a, b)) for a in group for b in other}

    def heal(self) -> None:
        self.cut.clear()

    def run(self, seconds: float) -> None:
        for _ in range(round(seconds / TICK)):
            self.now += TICK
            self._exchange()
            for node in self.nodes.values():
                if node.running:
                    node.election = step(node.election, node.last_idx, node.heard, node.gone,
                                         self.clock(node), TIMING, log_term=node.log_term,
                                         held=node.held())

    def _exchange(self) -> None:
        for sender_id, sender in self.nodes.items():
            if not sender.running:
                continue
            beat = sender.election.heartbeat(sender.last_idx, sender.log_term, sender.held())
            for receiver_id, receiver in self.nodes.items():
                if receiver_id != sender_id and receiver.running and self.linked(sender_id, receiver_id):
                    receiver.heard[sender_id] = Heard(beat, self.clock(receiver))
                    receiver.gone.discard(sender_id)

    def masters(self) -> dict[NodeId, NodeId | None]:
        return {n: node.election.master for n, node in self.nodes.items() if node.running}

    def term(self, node_id: NodeId) -> int:
        return self.nodes[node_id].election.term


def agreed(sim: Sim, master: NodeId | None) -> bool:
    return all(m == master for m in sim.masters().values())


def test_a_node_alone_waits_for_the_join_grace_then_is_its_own_master() -> None:
    sim = Sim()
    sim.start(A, term=4)
    sim.run(TIMING.join_grace_s - 2 * TICK)
    assert sim.masters() == {A: None}
    sim.run(4 * TICK)
    assert sim.masters() == {A: A}
    assert sim.term(A) == claim_term_for(4, A) > 4  # above the term it persisted: never claimed twice


def test_nodes_starting_together_elect_the_most_up_to_date_then_the_smallest_id() -> None:
    sim = Sim()
    sim.start(A, last_idx=10)
    sim.start(B, last_idx=12)
    sim.start(C, last_idx=12)
    sim.run(1.0)
    assert agreed(sim, B)
    assert sim.term(A) == sim.term(B) == sim.term(C) == claim_term_for(0, B)


def test_a_joining_or_restarting_node_never_flips_a_live_master() -> None:
    sim = Sim()
    sim.start(A, last_idx=5)
    sim.start(B, last_idx=3)
    sim.run(1.0)
    assert agreed(sim, A)
    # D joins with a longer log and a higher persisted term: it follows A.
    sim.start(D, last_idx=500, term=9)
    sim.run(2.0)
    assert agreed(sim, A)
    # B restarts (its clock starts from zero again): it follows A.
    sim.kill(B)
    sim.run(0.2)
    sim.start(B, last_idx=3, term=1)
    sim.run(2.0)
    assert agreed(sim, A)


def test_when_the_master_dies_the_most_up_to_date_live_node_takes_over_after_settling() -> None:
    sim = Sim()
    sim.start(A, last_idx=20)
    sim.start(B, last_idx=18)
    sim.start(C, last_idx=19)
    sim.run(1.0)
    assert agreed(sim, A)
    sim.kill(A)
    sim.run(TICK)
    assert sim.masters() == {B: None, C: None}  # noticed at once, settling
    sim.run(TIMING.settle_s + 2 * TICK)
    assert agreed(sim, C)
    assert round_of(sim.term(C)) == 2


def test_a_hung_master_is_replaced_after_the_node_timeout() -> None:
    sim = Sim()
    sim.start(A, last_idx=20)
    sim.start(B, last_idx=20)
    sim.run(1.0)
    assert agreed(sim, A)
    sim.hang(A)
    sim.run(TIMING.node_timeout_s - TICK)
    assert sim.masters() == {B: A}
    sim.run(TIMING.settle_s + 3 * TICK)
    assert sim.masters() == {B: B}


def test_a_restarted_former_master_follows_the_new_one_and_cannot_wedge() -> None:
    sim = Sim()
    sim.start(A, last_idx=20)
    sim.start(B, last_idx=20)
    sim.start(C, last_idx=15)
    sim.run(1.0)
    sim.kill(A)
    sim.run(1.0)
    assert agreed(sim, B)
    # A comes back with a longer log than anyone (events it never published), its old
    # persisted term and a clock that starts at zero: it follows B.
    sim.start(A, last_idx=25, term=claim_term_for(0, A))
    sim.run(2.0)
    assert agreed(sim, B)
    # When B dies, A (most up-to-date) takes over with a fresh term.
    sim.kill(B)
    sim.run(1.0)
    assert agreed(sim, A)
    assert round_of(sim.term(A)) == 3


def test_the_whole_cluster_restarting_elects_again() -> None:
    sim = Sim()
    for node_id in (A, B, C):
        sim.start(node_id, last_idx=7)
    sim.run(1.0)
    assert agreed(sim, A)
    for node_id in (A, B, C):
        sim.kill(node_id)
    sim.run(0.5)
    for node_id, idx in ((A, 7), (B, 9), (C, 7)):
        sim.start(node_id, last_idx=idx, term=claim_term_for(0, A))
    sim.run(1.0)
    assert agreed(sim, B)
    assert sim.term(B) == claim_term_for(claim_term_for(0, A), B)


def test_force_master_takes_over_once_caught_up() -> None:
    sim = Sim()
    sim.start(A, last_idx=50)
    sim.start(B, last_idx=50)
    sim.run(1.0)
    assert agreed(sim, A)
    sim.start(C, last_idx=10, force=True)
    sim.run(1.0)
    assert agreed(sim, A)  # C is behind: it catches up first
    sim.nodes[C].last_idx = 50
    sim.run(0.2)
    assert agreed(sim, C)
    sim.run(2.0)
    assert agreed(sim, C)  # and stays master


def test_two_forced_nodes_settle_on_the_smaller_id_without_flapping() -> None:
    sim = Sim()
    sim.start(B, force=True)
    sim.start(C, force=True)
    sim.start(A)
    history: list[dict[NodeId, NodeId | None]] = []
    for _ in range(40):
        sim.run(TICK)
        history.append(sim.masters())
    assert agreed(sim, B)
    changes = sum(1 for before, after in pairwise(history) if before != after)
    assert changes <= 3


def test_split_and_merge_the_side_with_more_followers_wins() -> None:
    sim = Sim()
    for node_id in (A, B, C):
        sim.start(node_id, last_idx=30)
    sim.run(1.0)
    assert agreed(sim, A)
    sim.partition({A, B}, {C})
    sim.run(2.0)
    assert sim.masters() == {A: A, B: A, C: C}  # C alone elects itself
    assert round_of(sim.term(C)) == 2
    sim.heal()
    sim.run(0.5)
    assert agreed(sim, A)  # two followers beat one; C steps down


def test_merge_of_two_equal_halves_keeps_the_older_master() -> None:
    sim = Sim()
    sim.start(A, last_idx=3)
    sim.start(B, last_idx=3)
    sim.run(1.0)
    assert agreed(sim, A)
    sim.partition({A}, {B})
    sim.run(2.0)
    assert sim.masters() == {A: A, B: B}
    sim.heal()
    sim.run(0.5)
    assert agreed(sim, A)  # one follower each: the lower term (the older claim) wins


def test_no_election_while_a_peer_still_follows_a_master_this_node_cannot_see() -> None:
    sim = Sim()
    for node_id in (A, B, C):
        sim.start(node_id, last_idx=30)
    sim.run(1.0)
    assert agreed(sim, A)
    sim.partition({A}, {B})  # B loses A; C still sees both
    sim.run(3.0)
    assert sim.masters() == {A: A, B: None, C: A}  # B waits instead of splitting
    sim.heal()
    sim.run(0.5)
    assert agreed(sim, A)


def test_a_node_that_starts_while_a_master_exists_waits_for_its_heartbeat() -> None:
    sim = Sim()
    sim.start(A, last_idx=3)
    sim.start(B, last_idx=3)
    sim.run(1.0)
    sim.partition({A}, {C})  # C reaches B at once, A only later
    sim.start(C, last_idx=90, term=7)
    sim.run(3.0)
    assert sim.masters() == {A: A, B: A, C: None}  # B follows A, so C does not elect
    sim.heal()
    sim.run(0.3)
    assert agreed(sim, A)


def test_terms_only_grow_and_are_shared() -> None:
    sim = Sim()
    sim.start(A, term=3)
    sim.start(B, term=8)
    sim.run(1.0)
    assert agreed(sim, A)  # terms do not decide a failover: logs and ids do
    assert sim.term(A) == sim.term(B) == claim_term_for(8, A) > 8


def test_a_stalled_master_that_resumes_never_wins_over_the_newer_log() -> None:
    sim = Sim()
    sim.start(A, last_idx=3)
    sim.start(B, last_idx=3)
    sim.run(1.0)
    assert agreed(sim, A)
    first = sim.nodes[A].election.claim_term
    sim.hang(A)  # SIGSTOP: A still believes it is the master
    sim.run(2.0)
    assert sim.masters() == {B: B}
    sim.write(B, 2)  # B acknowledged a write while A was stalled
    sim.resume(A)
    sim.run(0.5)
    assert agreed(sim, B)  # the newer log wins: B's write is kept
    assert sim.nodes[B].election.claim_term == claim_term_for(first, B)  # the next round


def test_two_nodes_claiming_in_the_same_round_claim_different_terms() -> None:
    """Two sides of a partition each elect from the same known term: their masters'
    terms differ, so a term names one master; rounds still order claims."""
    assert claim_term_for(7, A) != claim_term_for(7, B)
    assert min(claim_term_for(7, A), claim_term_for(7, B)) > 7
    later = claim_term_for(max(claim_term_for(7, A), claim_term_for(7, B)), A)
    assert later > max(claim_term_for(7, A), claim_term_for(7, B))
    sim = Sim()
    for node_id in (A, B, C):
        sim.start(node_id, last_idx=3)
    sim.run(1.0)
    assert agreed(sim, A)
    sim.partition({A}, {B}, {C})  # B and C each lose A and elect, from the same term
    sim.run(3.0)
    assert sim.masters() == {A: A, B: B, C: C}
    claims = {n: sim.nodes[n].election.claim_term for n in (A, B, C)}
    assert len(set(claims.values())) == 3, claims
    assert claims[B] > claims[A] and claims[C] > claims[A]


def test_claims_carry_their_own_term_not_the_highest_known() -> None:
    sim = Sim()
    sim.start(A, last_idx=3)
    sim.start(B, last_idx=3, term=5)
    sim.run(1.0)
    assert agreed(sim, A)
    beat_a = sim.nodes[A].election.heartbeat(3)
    beat_b = sim.nodes[B].election.heartbeat(3)
    assert beat_a.claim_term == claim_term_for(5, A) == beat_a.term
    assert beat_b.claim_term == 0  # a follower claims nothing


def test_between_two_claimers_the_newer_log_wins_over_more_followers() -> None:
    sim = Sim()
    for node_id in (A, B, C):
        sim.start(node_id, last_idx=30)
    sim.run(1.0)
    assert agreed(sim, A)
    sim.partition({A, B}, {C})
    sim.run(2.0)
    sim.write(C, 1)  # only C's side wrote after the split
    sim.heal()
    sim.run(0.5)
    assert agreed(sim, C)


def test_a_stale_forced_master_that_resumes_loses_to_the_newer_log_then_takes_over() -> None:
    """#20.2: A (--force-master) is stopped, B takes over and applies a client's command;
    A resumes believing it is the master: B keeps the write, A follows until it caught
    up, then takes over from B's log (dropping nothing)."""
    sim = Sim()
    sim.start(A, force=True)
    sim.start(B)
    sim.run(1.0)
    assert agreed(sim, A)
    sim.write(A, 3, commands=1)
    sim.copy_log(B, A)
    sim.hang(A)
    sim.run(2.0)
    assert sim.masters() == {B: B}
    sim.write(B, 3, commands=1)  # POST /place_instance on B: 200, applied
    sim.resume(A)
    sim.run(TICK)
    assert agreed(sim, B)  # the stale forced master steps down at once
    sim.run(1.0)
    assert agreed(sim, B)  # and waits while it is behind
    sim.copy_log(A, B)
    sim.run(0.3)
    assert agreed(sim, A)  # caught up: forced takes over, from B's log
    sim.run(2.0)
    assert agreed(sim, A)


def test_a_forced_node_with_no_master_lets_a_newer_log_claim_first() -> None:
    sim = Sim()
    sim.start(A, last_idx=2, force=True)
    sim.start(B, last_idx=9)
    sim.run(1.0)
    assert agreed(sim, B)  # the newer log claims; A catches up before it forces
    sim.copy_log(A, B)
    sim.run(0.3)
    assert agreed(sim, A)


def test_on_a_merge_the_side_that_kept_serving_wins_over_a_higher_term() -> None:
    """#20.3: B is the master and serves; A is cut off, elects itself with a higher term
    and writes (B timed out, B's instance gone from its state); B keeps serving a
    client's commands. On healing B stays the master: the higher term does not win."""
    sim = Sim()
    sim.start(B)
    sim.run(1.0)
    sim.start(A)
    sim.run(1.0)
    assert agreed(sim, B)
    sim.nodes[B].serving = 1
    sim.write(B, 4, commands=1)
    sim.copy_log(A, B)
    sim.partition({A}, {B})
    sim.run(2.0)
    assert sim.masters() == {A: A, B: B}
    assert sim.nodes[A].election.claim_term > sim.nodes[B].election.claim_term
    sim.write(A, 2)  # NodeTimedOut(B), and B's instance went with it
    sim.nodes[A].serving = 0
    sim.write(B, 20, commands=5)  # the stream's tasks, the client's commands
    sim.heal()
    sim.run(0.5)
    assert agreed(sim, B)


def test_claimers_rank_by_commands_since_the_fork_before_instances_served() -> None:
    sim = Sim()
    sim.start(B)
    sim.run(1.0)
    sim.start(A)
    sim.run(1.0)
    assert agreed(sim, B)
    sim.write(B, 2, commands=2)
    sim.copy_log(A, B)
    sim.partition({A}, {B})
    sim.run(2.0)
    assert sim.masters() == {A: A, B: B}
    sim.nodes[A].serving = 3  # more instances and a higher term, but no client command
    sim.write(A, 5)
    sim.write(B, 1, commands=1)
    sim.heal()
    sim.run(0.5)
    assert agreed(sim, B)
