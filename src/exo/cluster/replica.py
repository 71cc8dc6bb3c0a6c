"""This node's copy of the replicated log: events applied to the node's state in index
order and kept in the node's own SQLite log, so that whichever node becomes master
continues from its own log. Whoever writes (follower path or master) holds ``lock``."""

from collections.abc import Callable
from dataclasses import dataclass

import anyio
from loguru import logger

from exo.cluster.host import ClusterHost
from exo.cluster.lineage import Lineage, agreed_prefix, epoch_at, extended, truncated
from exo.cluster.messages import CatchUpReply, EventMsg
from exo.cluster.resubmit import Resubmission, resubmissions
from exo.cluster.store import ElectionStore
from exo.master.event_log import LogUnavailable, SqliteEventLog
from exo.shared.types.commands import RecordRefusal
from exo.shared.types.common import CommandId
from exo.shared.types.events import IndexedEvent
from exo.shared.types.state import MergeReport, State


@dataclass(frozen=True)
class Dropped:
    """A stretch of this log that a reset dropped, as reported."""

    first: int
    kept: int
    """The first of its events the log still held (those before were compacted: their
    commands are not known here)."""
    last: int
    commands: list[CommandId]
    """The commands behind its events (from ``kept`` on), in log order."""
    resubmission: Resubmission


class Replica:
    def __init__(self, host: ClusterHost, log: SqliteEventLog, store: ElectionStore) -> None:
        self.host = host
        self.log = log
        self.lock = anyio.Lock()
        self._store = store
        persisted = store.load()
        self.term = persisted.term
        self.lineage: Lineage = persisted.lineage
        self.log_failure: str | None = None
        """Why the last write to this node's log failed (None: it takes writes)."""
        self.dropped: list[Dropped] = []
        """Every stretch of this log a reset dropped, as reported."""

    @property
    def last_idx(self) -> int:
        return self.host.state().last_event_applied_idx

    @property
    def log_term(self) -> int:
        """The term of the master that wrote the last event (0: none known)."""
        epoch = epoch_at(self.lineage, self.last_idx)
        return 0 if epoch is None else epoch.term

    def save(self, term: int, lineage: Lineage | None = None) -> None:
        """Persist the term (and lineage) before anyone hears of them."""
        if term == self.term and (lineage is None or lineage == self.lineage):
            return  # unchanged (the election calls this on every step, per heartbeat)
        self.term = term
        if lineage is not None:
            self.lineage = lineage
        self._store.save(self.term, self.lineage)

    async def apply(self, msg: EventMsg) -> None:
        """Apply the next event from the master (the caller checked its index). When the
        disk cannot take it, the node's state stays as it was (the log says so) and the
        follower catches the event up later: logged once, until a write works again."""
        before = self.host.state()
        try:
            last = self.lineage[-1] if self.lineage else None
            if last is None or not last.same_epoch(msg.epoch):
                self.save(self.term, extended(self.lineage, msg.epoch))
            await self.host.apply_event(msg.event)
            self.log.append(msg.event, self.host.state())
        except OSError as e:  # LogUnavailable, or the election store's own write
            self._unwritten(before, e)
            return
        self._written()

    def _unwritten(self, before: State, error: OSError) -> None:
        if self.host.state() is not before:
            self.host.replace_state(before)
        if self.log_failure is None:
            logger.error(
                f"cluster: this node's log cannot be written ({error}): it stays at event "
                f"{before.last_event_applied_idx} and catches up once the disk takes writes"
            )
        self.log_failure = str(error)

    def _written(self) -> None:
        if self.log_failure is not None:
            logger.info(f"cluster: this node's log takes writes again (it failed: "
                        f"{self.log_failure})")
            self.log_failure = None

    async def apply_reply(
        self, reply: CatchUpReply, resubmit: Callable[[Resubmission], None] = lambda _: None
    ) -> MergeReport | None:
        """Apply a page of the master's log: from its base when it sends one, then the
        events that follow this node's log. Returns what this node's log lost to the
        master's, if anything (for the master to record as an event); ``resubmit`` gets
        the commands behind what it lost, before they go from the log."""
        report: MergeReport | None = None
        if reply.base is not None:
            report = self._report_dropped(reply, reply.base)
            if report is not None:
                resubmit(self.dropped[-1].resubmission)
            logger.info(
                f"cluster: starting again from the master's state at event "
                f"{reply.base.last_event_applied_idx} (was at {self.last_idx})"
            )
            self._write(lambda: self.log.reset(reply.base or State(), reply.commands), settles=True)
            self.host.replace_state(reply.base)
        events = [e for e in reply.events if e.idx > self.last_idx]
        end = self.last_idx + len(events)
        if events and [e.idx for e in events] != list(range(self.last_idx + 1, end + 1)):
            raise ValueError("a catch-up page with a gap")
        before = self.host.state()
        self._write(lambda: self.save(self.term, truncated(reply.lineage, end)), settles=False)
        written: list[tuple[IndexedEvent, State]] = []
        for event in events:
            await self.host.apply_event(event)
            written.append((event, self.host.state()))
        self._write(lambda: self.log.append_many(written), before, settles=bool(written))
        return report

    def _write(
        self, write: Callable[[], None], before: State | None = None, *, settles: bool
    ) -> None:
        """Run a write of the log or the store; when the disk cannot take it, the state
        goes back to ``before`` and ``LogUnavailable`` says so (logged once). ``settles``:
        a success shows the log takes writes again."""
        try:
            write()
        except OSError as e:
            self._unwritten(before or self.host.state(), e)
            raise LogUnavailable(str(e)) from e
        if settles:
            self._written()


    def _report_dropped(self, reply: CatchUpReply, base: State) -> MergeReport | None:
        """Before a reset: the events of this log that the master's log does not share
        are dropped (a merge after a partition where both sides wrote): say which, and
        which commands were behind them, so that nothing goes silently."""
        first = agreed_prefix(self.lineage, self.last_idx, reply.lineage, reply.last_idx) + 1
        if first > self.last_idx:
            return None
        kept = max(first, self.log.first_kept() or 0)
        events = self.log.read_from(kept, self.last_idx - kept + 1)
        commands = [e.command_id for e in events if e.command_id is not None]
        again = resubmissions(events, base)
        self.dropped.append(Dropped(first, kept, self.last_idx, commands, again))
        report = MergeReport(
            node_id=self.host.node_id,
            first_idx=first,
            last_idx=self.last_idx,
            dropped_events=self.last_idx - first + 1,
            event_kinds=tuple(sorted({type(e.event).__name__ for e in events})),
            command_ids=tuple(sorted(set(commands))),
        )
        compacted = (f" (events before {kept} were compacted: their commands are not known, "
                     "nor re-submitted)")
        logger.warning(
            f"cluster: dropping {report.dropped_events} events {first}..{self.last_idx} "
            f"that the master's log does not hold ({', '.join(report.event_kinds) or 'not kept'});"
            f" commands re-submitted: {_listed(_applied_again(again))}; recorded as refused: "
            f"already deleted: {_listed(again.settled)}; not run again (generations, "
            f"cancellations): {_listed(again.answered)}; refused already: "
            f"{_listed(again.refused)}"
            + (compacted if kept > first else "")
        )
        return report


def _applied_again(again: Resubmission) -> list[CommandId]:
    return [c.command_id for c in again.commands if not isinstance(c, RecordRefusal)]


def _listed(ids: list[CommandId]) -> str:
    return (", ".join(ids[:20]) + (" ..." if len(ids) > 20 else "")) or "none"
