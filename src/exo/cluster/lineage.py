"""Lineage: which master produced which stretch of the log.

Every time a node becomes master it opens an *epoch* ``(term, master, start_idx)``: the
events from ``start_idx`` on (until the next epoch) are that master's. A term is claimed
by one node at most once (the term is persisted, see ``store``), so ``(term, master)``
names one unbroken sequence of events. Two logs hold the same events up to an index when
the same epochs cover it; that is how a master tells a follower that is merely behind
(catch up from its next index) from one that diverged or is ahead (reset to a snapshot).

Pure: values in, values out.
"""

from collections.abc import Sequence

from pydantic import Field

from exo.shared.types.common import FrozenModel, NodeId

# Epochs kept per lineage. A log whose first epochs were dropped compares as unknown for
# those indices, which only ever costs a resync, never a wrong "same".
MAX_EPOCHS = 64


class Epoch(FrozenModel):
    term: int = Field(ge=0)
    master: NodeId
    start_idx: int = Field(ge=0)

    def same_epoch(self, other: "Epoch") -> bool:
        return (self.term, self.master) == (other.term, other.master)


Lineage = tuple[Epoch, ...]


def epoch_at(lineage: Sequence[Epoch], idx: int) -> Epoch | None:
    """The epoch that produced event ``idx`` (None: unknown, before any recorded epoch)."""
    found: Epoch | None = None
    for epoch in lineage:
        if epoch.start_idx > idx:
            break
        found = epoch
    return found


def _key(epoch: Epoch | None) -> tuple[int, str] | None:
    return None if epoch is None else (epoch.term, epoch.master)


def agreed_prefix(
    mine: Sequence[Epoch], my_last: int, theirs: Sequence[Epoch], their_last: int
) -> int:
    """The last index up to which both logs hold the same events (-1: none).

    Events before any recorded epoch (logs written before lineages existed, or events
    injected directly) compare as equal to each other."""
    upto = min(my_last, their_last)
    if upto < 0:
        return -1
    bounds = sorted({0} | {e.start_idx for e in (*mine, *theirs) if e.start_idx <= upto})
    for bound in bounds:
        if _key(epoch_at(mine, bound)) != _key(epoch_at(theirs, bound)):
            return bound - 1
    return upto


def truncated(lineage: Sequence[Epoch], last_idx: int) -> Lineage:
    """The lineage of a log that ends at ``last_idx``: epochs that start after it go."""
    return tuple(e for e in lineage if e.start_idx <= last_idx)[-MAX_EPOCHS:]


def extended(lineage: Sequence[Epoch], epoch: Epoch) -> Lineage:
    """The lineage once ``epoch`` starts (replacing whatever started at or after it)."""
    kept = tuple(e for e in lineage if e.start_idx < epoch.start_idx)
    return (*kept, epoch)[-MAX_EPOCHS:]
