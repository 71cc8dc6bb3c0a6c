"""Election: which live node is the master. Pure: heartbeats, times and this node's
election state in, the next election state out. Times are this node's monotonic clock;
nothing here compares clocks of different nodes, so a restart (a clock that starts from
zero again) cannot confuse it.

Rules, in order:

1. **force_master wins.** A node started with ``force_master`` claims mastership once it
   has caught up with the current master (or, with no master around, after the join
   grace). Among several forced nodes the smallest node id wins.
2. **Stickiness.** While a live node claims mastership, nobody else claims: a node that
   starts or restarts follows the live master, whatever its own log or term. Two live
   claimers only meet when partitions merge (or when a node could reach nobody for its
   whole join grace, or when a stalled master resumes); then the claimer with the newer
   log wins (see below): a node with an older log never wins over one with a newer log,
   so writes a newer master acknowledged survive. Equal logs: more live followers, then
   the older claim (lower claim term), then the smaller node id; the other steps down.
3. **Failover.** With no live master (at start, after the join grace; after a loss, once
   the views settled), the live node with the newest log claims, ties to the smaller
   node id. It takes a term above every term it has seen and its own persisted term,
   and a term only it can take (``claim_term_for``): a term is never claimed by two nodes,
   not even by the two sides of a partition that each elect a master (there is no quorum:
   each side stays available and the merge on healing reports what it drops).

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

from pydantic import Field

from exo.shared.types.common import FrozenModel, NodeId


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

    def heartbeat(self, last_idx: int, log_term: int = 0) -> Heartbeat:
        return Heartbeat(node_id=self.node_id, term=self.term, master=self.master,
                         last_idx=last_idx, force_master=self.force_master,
                         claim_term=self.claim_term if self.is_master else 0,
                         log_term=log_term)


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
) -> Election:
    """The election state after what this node has heard by ``now``; its log ends at
    ``last_idx``, written by the master of term ``log_term``."""
    me = election.node_id
    live = live_beats(me, heard, gone, now, timing.node_timeout_s)
    term = max([election.term, *(b.term for b in live.values())])
    own = election.heartbeat(last_idx, log_term)
    claimers = [b for b in live.values() if b.master == b.node_id]
    if election.is_master:
        claimers.append(own)

    if election.force_master and not election.is_master and _may_force(election, own, live, now, timing):
        return _claim(election, term, now)
    if claimers:
        followers = _followers(election, live)
        winner = min(claimers, key=lambda b: _claim_rank(b, followers.get(b.node_id, 0)))
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


def _claim_rank(beat: Heartbeat, followers: int) -> tuple[int, int, int, int, int, str]:
    """Smaller wins: forced nodes by id; then the newer log, more followers, the older
    claim (lower claim term), the smaller id."""
    if beat.force_master:
        return (0, 0, 0, 0, 0, beat.node_id)
    return (1, -beat.log_term, -beat.last_idx, -followers, beat.claim_term, beat.node_id)


def _candidate_rank(beat: Heartbeat) -> tuple[bool, int, int, str]:
    """Smaller wins: forced first, then the newest log, then the smaller id."""
    return (not beat.force_master, -beat.log_term, -beat.last_idx, beat.node_id)
