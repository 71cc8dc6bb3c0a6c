"""Election: which live node is the master. Pure: heartbeats, times and this node's
election state in, the next election state out. Times are this node's monotonic clock;
nothing here compares clocks of different nodes, so a restart (a clock that starts from
zero again) cannot confuse it.

Rules, in order:

1. **Acknowledged writes win.** Two live claimers only meet when partitions merge (or
   when a node could reach nobody for its whole join grace, or when a stalled master
   resumes). Then the claimer holding more events of client commands since the two logs
   forked wins; then the one whose state serves more instances (the side that kept
   serving); then the newer log; then a forced node (the smallest id among several);
   then more live followers, the older claim (lower claim term), the smaller node id.
   Terms alone never decide: a node isolated on its own claims a higher term but holds
   nothing a client asked for. Claimers' heartbeats carry what this needs (``Held``).
   The loser steps down; what its log held that the winner's lacks is re-submitted by
   the nodes that drop it (``resubmit``), so no acknowledged command is lost.
2. **force_master.** A node started with ``force_master`` claims mastership once it has
   caught up with the current master (or, with no master around, after the join grace,
   unless a live node holds a newer log: that one claims first and the forced node
   catches up with it). A stale forced node never wins over a newer log (rule 1).
3. **Stickiness.** While a live node claims mastership, nobody else claims: a node that
   starts or restarts follows the live master, whatever its own log or term.
4. **Failover.** With no live master (at start, after the join grace; after a loss, once
   the views settled), the live node with the newest log claims, ties to a forced node,
   then the smaller node id. It takes a term above every term it has seen and its own
   persisted term, and a term only it can take (``claim_term_for``): a term is never
   claimed by two nodes, not even by the two sides of a partition that each elect a
   master (there is no quorum: each side stays available, and the merge on healing
   keeps every acknowledged command).

A log is newer than another when the term of the master that wrote its last event is
higher, or, for the same term, when it is longer: ``(log_term, last_idx)``.

A node is live while its last heartbeat is younger than the node timeout and it has not
left (liveliness). While a live peer still follows a master this node does not see, this
node waits instead of electing: that peer may still see the master (a partial partition,
or a connection still being made), and electing would split the cluster.
"""

import zlib
from collections.abc import Mapping, Set
from dataclasses import dataclass, replace
from itertools import combinations

from pydantic import Field

from exo.cluster.lineage import Epoch, agreed_prefix
from exo.shared.types.common import FrozenModel, NodeId

HELD_EPOCHS = 8
"""Epochs of its lineage a claimer's heartbeat carries (to find where two logs forked)."""
HELD_MARKS = 64
"""Indices of its last client-command events a claimer's heartbeat carries."""


class Held(FrozenModel):
    """What a claimer's log holds, for ranking claimers that meet on a merge."""

    lineage: tuple[Epoch, ...] = ()
    """The last ``HELD_EPOCHS`` epochs of its log."""
    command_marks: tuple[int, ...] = ()
    """The indices of its last ``HELD_MARKS`` events that came from client commands."""
    serving: int = Field(default=0, ge=0)
    """The instances its state holds."""

    def commands_after(self, idx: int) -> int:
        return sum(1 for mark in self.command_marks if mark > idx)


class Heartbeat(FrozenModel):
    """What every node announces, every heartbeat interval and at once on a change."""

    node_id: NodeId
    term: int = Field(ge=0)
    """The highest term this node knows (terms spread with heartbeats)."""
    master: NodeId | None
    """The master it follows; itself when it is the master; None while electing."""
    last_idx: int = Field(ge=-1)
    """The index of the last event it applied."""
    force_master: bool = False
    claim_term: int = Field(default=0, ge=0)
    """The term of this node's own claim while it is the master (0 otherwise)."""
    log_term: int = Field(default=0, ge=0)
    """The term of the master that wrote its last event (0: none known)."""
    held: Held | None = None
    """While this node is the master: what its log holds (see ``Held``)."""

    @property
    def log_position(self) -> tuple[int, int]:
        return (self.log_term, self.last_idx)


@dataclass(frozen=True)
class Heard:
    """A heartbeat and when it arrived (the receiver's monotonic clock)."""

    beat: Heartbeat
    at: float


@dataclass(frozen=True)
class Timing:
    node_timeout_s: float
    """A node whose last heartbeat is older than this is gone."""
    settle_s: float
    """After losing the master, how long to wait for fresh heartbeats before electing."""
    join_grace_s: float
    """After starting, how long to listen for a live master before electing."""


@dataclass(frozen=True)
class Election:
    node_id: NodeId
    force_master: bool
    term: int
    started_at: float
    master: NodeId | None = None
    since: float = 0.0
    """When the master became None (start or loss); meaningless while there is one."""
    joined: bool = False
    """Whether this node has had a master (or been one) since it started."""
    claim_term: int = 0
    """The term this node claimed when it last became master."""

    @classmethod
    def start(cls, node_id: NodeId, force_master: bool, term: int, now: float) -> "Election":
        """A node starting with the term it persisted: no master yet."""
        return cls(node_id=node_id, force_master=force_master, term=term, started_at=now,
                   since=now)

    @property
    def is_master(self) -> bool:
        return self.master == self.node_id

    def heartbeat(self, last_idx: int, log_term: int = 0, held: Held | None = None) -> Heartbeat:
        """This node's heartbeat; ``held`` goes only with a claim."""
        return Heartbeat(node_id=self.node_id, term=self.term, master=self.master,
                         last_idx=last_idx, force_master=self.force_master,
                         claim_term=self.claim_term if self.is_master else 0,
                         log_term=log_term, held=held if self.is_master else None)


def live_beats(
    me: NodeId, heard: Mapping[NodeId, Heard], gone: Set[NodeId], now: float, timeout_s: float
) -> dict[NodeId, Heartbeat]:
    """The other nodes alive now, with their last heartbeats."""
    return {
        node_id: h.beat
        for node_id, h in heard.items()
        if node_id != me and node_id not in gone and now - h.at <= timeout_s
    }


def step(
    election: Election,
    last_idx: int,
    heard: Mapping[NodeId, Heard],
    gone: Set[NodeId],
    now: float,
    timing: Timing,
    log_term: int = 0,
    held: Held | None = None,
) -> Election:
    """The election state after what this node has heard by ``now``; its log ends at
    ``last_idx``, written by the master of term ``log_term``; ``held``: what it holds
    (needed while it is the master)."""
    me = election.node_id
    live = live_beats(me, heard, gone, now, timing.node_timeout_s)
    term = max([election.term, *(b.term for b in live.values())])
    own = election.heartbeat(last_idx, log_term, held)
    claimers = [b for b in live.values() if b.master == b.node_id]
    if election.is_master:
        claimers.append(own)

    if election.force_master and not election.is_master and _may_force(election, own, live, now, timing):
        return _claim(election, term, now)
    if claimers:
        winner = merge_winner(claimers, _followers(election, live))
        return replace(election, term=term, master=winner.node_id, joined=True)

    # No live master: wait until the views settled, then the best candidate claims.
    since = election.since if election.master is None else now
    waiting = replace(election, term=term, master=None, since=since)
    wait_s = timing.settle_s if election.joined else timing.join_grace_s
    if now - since < wait_s:
        return waiting
    if _someone_follows_another(me, live, heard, since):
        return waiting
    best = min([*live.values(), own], key=_candidate_rank)
    if best.node_id == me:
        return _claim(election, term, now)
    return waiting


NODE_BITS = 32
"""A term is ``round << NODE_BITS | node hash``: the round orders claims, the low bits say
whose claim it is (terms stay below 2**53 for two million rounds: exact in JSON readers)."""


def claim_term_for(term: int, node_id: NodeId) -> int:
    """The term ``node_id`` claims when the highest term it knows is ``term``: the next
    round, with the node id's 32-bit CRC in the low bits. Two nodes that claim in the same
    round (the two sides of a partition) get different terms unless their ids share a
    CRC (odds about N^2 / 2^33: 5e-7 for 64 nodes), so an epoch's term names its master."""
    return ((term >> NODE_BITS) + 1) << NODE_BITS | zlib.crc32(node_id.encode())


def _claim(election: Election, term: int, now: float) -> Election:
    claimed = claim_term_for(term, election.node_id)
    return replace(election, term=claimed, master=election.node_id, since=now, joined=True,
                   claim_term=claimed)


def _may_force(
    election: Election, own: Heartbeat, live: Mapping[NodeId, Heartbeat], now: float,
    timing: Timing,
) -> bool:
    if any(b.force_master and b.node_id < election.node_id for b in live.values()):
        return False  # a forced node with a smaller id outranks this one
    master = live.get(election.master) if election.master is not None else None
    if master is not None:
        return own.log_position >= master.log_position  # take over only once caught up
    if any(b.log_position > own.log_position for b in live.values()):
        return False  # a newer log claims first; this node catches up with it, then forces
    return now - election.started_at >= timing.join_grace_s


def _someone_follows_another(
    me: NodeId, live: Mapping[NodeId, Heartbeat], heard: Mapping[NodeId, Heard], since: float
) -> bool:
    """A peer that told us after we lost the master that it follows a master we do not
    see: it may still see that master (a partial partition), so electing would split."""
    return any(
        heard[n].at >= since and b.master is not None and b.master not in (n, me)
        for n, b in live.items()
    )


def _followers(election: Election, live: Mapping[NodeId, Heartbeat]) -> dict[NodeId, int]:
    """How many live nodes (claimers and this node included) follow each master."""
    counts: dict[NodeId, int] = {}
    masters = [b.master for b in live.values()] + [election.master]
    for master in masters:
        if master is not None:
            counts[master] = counts.get(master, 0) + 1
    return counts


def merge_winner(claimers: list[Heartbeat], followers: Mapping[NodeId, int]) -> Heartbeat:
    """Which of several live claimers stays the master (see rule 1)."""
    return min(claimers, key=lambda b: _claim_rank(b, _fork(claimers), followers.get(b.node_id, 0)))


def _fork(claimers: list[Heartbeat]) -> int:
    """The last index up to which every claimer's log holds the same events."""
    forks = [
        agreed_prefix(_lineage(a), a.last_idx, _lineage(b), b.last_idx)
        for a, b in combinations(claimers, 2)
    ]
    return min(forks, default=min(b.last_idx for b in claimers))


def _lineage(beat: Heartbeat) -> tuple[Epoch, ...]:
    return () if beat.held is None else beat.held.lineage


def _claim_rank(
    beat: Heartbeat, fork: int, followers: int
) -> tuple[int, int, int, int, bool, str, int, int, str]:
    """Smaller wins: more client commands since the fork, more instances served, the
    newer log, forced (by id), more followers, the older claim, the smaller id."""
    held = beat.held or Held()
    forced = beat.node_id if beat.force_master else ""
    return (-held.commands_after(fork), -held.serving, -beat.log_term, -beat.last_idx,
            not beat.force_master, forced, -followers, beat.claim_term, beat.node_id)


def _candidate_rank(beat: Heartbeat) -> tuple[int, int, bool, str]:
    """Smaller wins: the newest log, then forced, then the smaller id."""
    return (-beat.log_term, -beat.last_idx, not beat.force_master, beat.node_id)
