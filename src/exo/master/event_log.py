"""Where the master keeps the indexed events it has published.

The SQLite log keeps a snapshot of the state every ``snapshot_every`` events and drops
the events before it (keeping a short tail for peers that lag a little), so the log
stays bounded and a new node catches up from a snapshot plus the tail."""

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from pydantic import TypeAdapter

from exo.shared.apply import apply
from exo.shared.types.common import CommandId
from exo.shared.types.events import Event, IndexedEvent
from exo.shared.types.state import State

_EVENT = TypeAdapter[Event](Event)

REMEMBERED_COMMANDS = 10_000
"""Commands a log remembers having applied, compaction or not (a master that takes over
from it must not apply a retry of one again, however many events came since)."""


class EventLog(Protocol):
    def append(self, event: IndexedEvent, state_after: State) -> None: ...
    def read_from(self, idx: int, limit: int) -> list[IndexedEvent]: ...
    def snapshot(self) -> State | None: ...
    def restore(self) -> State: ...
    def command_ids(self, limit: int) -> list[CommandId]: ...


class MemoryEventLog:
    """A log that keeps nothing across restarts (tests, throwaway nodes)."""

    def __init__(self, snapshot_every: int = 1000, keep_tail: int = 1000) -> None:
        self._events: list[IndexedEvent] = []
        self._commands: list[CommandId] = []
        self._snapshot: State | None = None
        self._snapshot_every = snapshot_every
        self._keep_tail = keep_tail

    def append(self, event: IndexedEvent, state_after: State) -> None:
        self._events.append(event)
        if event.command_id is not None:
            self._commands.append(event.command_id)
            if len(self._commands) > 2 * REMEMBERED_COMMANDS:
                self._commands = self._commands[-REMEMBERED_COMMANDS:]
        if (event.idx + 1) % self._snapshot_every == 0:
            self._snapshot = state_after
            if len(self._events) > self._keep_tail:
                self._events = self._events[-self._keep_tail :]

    def read_from(self, idx: int, limit: int) -> list[IndexedEvent]:
        if not self._events or idx < self._events[0].idx:
            return []
        start = idx - self._events[0].idx
        return self._events[start : start + limit]

    def snapshot(self) -> State | None:
        return self._snapshot

    def command_ids(self, limit: int) -> list[CommandId]:
        """The commands behind the last events (compacted or not), oldest first (at
        most ``limit``)."""
        return list(dict.fromkeys(self._commands))[-limit:]

    def restore(self) -> State:
        state = self._snapshot or State()
        for event in self._events:
            if event.idx > state.last_event_applied_idx:
                state = apply(state, event)
        return state


class SqliteEventLog:
    def __init__(self, path: Path, snapshot_every: int = 1000, keep_tail: int = 1000) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS events (idx INTEGER PRIMARY KEY, body TEXT NOT NULL)"
        )
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS snapshots (idx INTEGER PRIMARY KEY, state TEXT NOT NULL)"
        )
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(events)")}
        if "command_id" not in columns:  # a log written before command ids were kept
            self._db.execute("ALTER TABLE events ADD COLUMN command_id TEXT")
        tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master")}
        if "commands" not in tables:  # (a log from before: its events say what they can)
            self._db.execute(
                "CREATE TABLE commands (idx INTEGER PRIMARY KEY, command_id TEXT NOT NULL)"
            )
            self._db.execute(
                "INSERT INTO commands SELECT idx, command_id FROM events "
                "WHERE command_id IS NOT NULL"
            )
        self._snapshot_every = snapshot_every
        self._keep_tail = keep_tail

    def append(self, event: IndexedEvent, state_after: State) -> None:
        self.append_many([(event, state_after)])

    def append_many(self, items: Iterable[tuple[IndexedEvent, State]]) -> None:
        """Append events (each with the state after it) in one transaction."""
        with self._transaction():
            for event, state_after in items:
                body = _EVENT.dump_json(event.event).decode()
                self._db.execute(
                    "INSERT OR REPLACE INTO events (idx, body, command_id) VALUES (?, ?, ?)",
                    (event.idx, body, event.command_id),
                )
                if event.command_id is not None:
                    self._db.execute(
                        "INSERT OR REPLACE INTO commands (idx, command_id) VALUES (?, ?)",
                        (event.idx, event.command_id),
                    )
                if (event.idx + 1) % self._snapshot_every == 0:
                    self._write_snapshot(state_after)

    def reset(self, base: State, commands: Sequence[CommandId] = ()) -> None:
        """Forget every event and snapshot and start again from ``base`` (a state received
        from another node's log: its snapshot, or the empty state), whose log applied
        ``commands`` last (oldest first): they are remembered in place of this log's."""
        with self._transaction():
            self._db.execute("DELETE FROM events")
            self._db.execute("DELETE FROM snapshots")
            self._db.execute("DELETE FROM commands")
            # Their events are not here: numbered just below the base, in their order.
            first = base.last_event_applied_idx - len(commands) + 1
            self._db.executemany(
                "INSERT INTO commands (idx, command_id) VALUES (?, ?)",
                [(first + i, command_id) for i, command_id in enumerate(commands)],
            )
            if base.last_event_applied_idx >= 0:
                self._db.execute(
                    "INSERT INTO snapshots (idx, state) VALUES (?, ?)",
                    (base.last_event_applied_idx, base.model_dump_json()),
                )

    def _transaction(self) -> "_Transaction":
        return _Transaction(self._db)

    def _write_snapshot(self, state: State) -> None:
        idx = state.last_event_applied_idx
        self._db.execute(
            "INSERT OR REPLACE INTO snapshots (idx, state) VALUES (?, ?)",
            (idx, state.model_dump_json()),
        )
        self._db.execute("DELETE FROM snapshots WHERE idx < ?", (idx,))
        self._db.execute("DELETE FROM events WHERE idx <= ?", (idx - self._keep_tail,))
        self._db.execute(
            "DELETE FROM commands WHERE idx <= "
            "(SELECT idx FROM commands ORDER BY idx DESC LIMIT 1 OFFSET ?)",
            (REMEMBERED_COMMANDS,),
        )

    def first_kept(self) -> int | None:
        """The index of the oldest event still kept (None: none is)."""
        return self._db.execute("SELECT MIN(idx) FROM events").fetchone()[0]

    def read_from(self, idx: int, limit: int) -> list[IndexedEvent]:
        first = self._db.execute("SELECT MIN(idx) FROM events").fetchone()[0]
        if first is None or idx < first:
            return []
        rows = self._db.execute(
            "SELECT idx, body, command_id FROM events WHERE idx >= ? ORDER BY idx LIMIT ?",
            (idx, limit),
        ).fetchall()
        return [
            IndexedEvent(idx=i, event=_EVENT.validate_json(body), command_id=command)
            for i, body, command in rows
        ]

    def command_ids(self, limit: int) -> list[CommandId]:
        """The commands behind the last events, compacted or not (the last
        ``REMEMBERED_COMMANDS``), oldest first (at most ``limit``)."""
        rows = self._db.execute(
            "SELECT command_id FROM commands ORDER BY idx DESC LIMIT ?", (limit,)
        ).fetchall()
        return list(dict.fromkeys(CommandId(row[0]) for row in reversed(rows)))

    def command_indices(self, limit: int) -> list[int]:
        """The indices of the last ``limit`` events that came from commands, oldest first
        (the cluster's election ranks claimers by them)."""
        rows = self._db.execute(
            "SELECT idx FROM commands ORDER BY idx DESC LIMIT ?", (limit,)
        ).fetchall()
        return [int(row[0]) for row in reversed(rows)]

    def snapshot(self) -> State | None:
        row = self._db.execute("SELECT state FROM snapshots ORDER BY idx DESC LIMIT 1").fetchone()
        return State.model_validate_json(row[0]) if row else None

    def restore(self) -> State:
        """The latest state: the snapshot plus every event after it."""
        state = self.snapshot() or State()
        rows = self._db.execute(
            "SELECT idx, body FROM events WHERE idx > ? ORDER BY idx",
            (state.last_event_applied_idx,),
        ).fetchall()
        for i, body in rows:
            state = apply(state, IndexedEvent(idx=i, event=_EVENT.validate_json(body)))
        return state

    def close(self) -> None:
        self._db.close()


class _Transaction:
    """BEGIN ... COMMIT, or ROLLBACK when the block raises."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN")

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
