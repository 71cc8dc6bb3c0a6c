"""Where the master keeps the indexed events it has published.

The SQLite log keeps a snapshot of the state every ``snapshot_every`` events and drops
the events before it (keeping a short tail for peers that lag a little), so the log
stays bounded and a new node catches up from a snapshot plus the tail.

Every event and snapshot row carries a checksum of its content, verified whenever it is
read: a changed byte is ``LogCorrupt`` (naming the file), never a different state served
silently. A log written before checksums existed gets them when it is opened. A write
the disk cannot take is ``LogUnavailable`` and leaves the log as it was."""

import hashlib
import sqlite3
from collections.abc import Callable, Iterable, Sequence
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


class LogUnavailable(OSError):
    """The log cannot take a write now (a full disk, an I/O error); nothing was written."""


class LogCorrupt(Exception):
    """A row of the log is not what was written (a checksum differs, or it cannot be
    read): the log cannot be trusted."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


def _checksum(idx: int, body: str) -> str:
    return hashlib.blake2b(f"{idx}:{body}".encode(), digest_size=16).hexdigest()


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
        self.path = path
        self.on_written: Callable[[int], None] | None = None
        """Told the log's last index after each write (the election store keeps a mark)."""
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._open()
        except sqlite3.OperationalError as e:  # locked, read-only, or no room to migrate
            raise LogUnavailable(f"cannot open the event log {path}: {e}") from e
        except sqlite3.DatabaseError as e:  # not a database at all, or a damaged one
            raise LogCorrupt(path, f"cannot be read as an event log ({e})") from e
        self._snapshot_every = snapshot_every
        self._keep_tail = keep_tail

    def _open(self) -> None:
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
        self._add_checksums()

    def _add_checksums(self) -> None:
        """A log from before checksums: its rows are taken as they are, and summed."""
        for table, body in (("events", "body"), ("snapshots", "state")):
            columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if "checksum" in columns:
                continue
            with self._transaction():
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN checksum TEXT")
                rows = self._db.execute(f"SELECT idx, {body} FROM {table}").fetchall()
                self._db.executemany(
                    f"UPDATE {table} SET checksum = ? WHERE idx = ?",
                    [(_checksum(i, text), i) for i, text in rows],
                )

    def last_idx(self) -> int:
        """The index of the last event the log holds, in a row or a snapshot (-1: none)."""
        event = self._db.execute("SELECT MAX(idx) FROM events").fetchone()[0]
        snap = self._db.execute("SELECT MAX(idx) FROM snapshots").fetchone()[0]
        return max(-1 if event is None else event, -1 if snap is None else snap)

    def append(self, event: IndexedEvent, state_after: State) -> None:
        self.append_many([(event, state_after)])

    def append_many(self, items: Iterable[tuple[IndexedEvent, State]]) -> None:
        """Append events (each with the state after it) in one transaction;
        ``LogUnavailable`` (nothing written) when the disk cannot take it."""
        last: int | None = None
        with self._writing():
            for event, state_after in items:
                body = _EVENT.dump_json(event.event).decode()
                self._db.execute(
                    "INSERT OR REPLACE INTO events (idx, body, command_id, checksum) "
                    "VALUES (?, ?, ?, ?)",
                    (event.idx, body, event.command_id, _checksum(event.idx, body)),
                )
                last = event.idx
                if event.command_id is not None:
                    self._db.execute(
                        "INSERT OR REPLACE INTO commands (idx, command_id) VALUES (?, ?)",
                        (event.idx, event.command_id),
                    )
                if (event.idx + 1) % self._snapshot_every == 0:
                    self._write_snapshot(state_after)
        if last is not None and self.on_written is not None:
            self.on_written(last)

    def _writing(self) -> "_Writing":
        return _Writing(self._db)

    def reset(self, base: State, commands: Sequence[CommandId] = ()) -> None:
        """Forget every event and snapshot and start again from ``base`` (a state received
        from another node's log: its snapshot, or the empty state), whose log applied
        ``commands`` last (oldest first): they are remembered in place of this log's."""
        with self._writing():
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
                self._write_snapshot(base)
        if self.on_written is not None:
            self.on_written(base.last_event_applied_idx)

    def _transaction(self) -> "_Transaction":
        return _Transaction(self._db)

    def _write_snapshot(self, state: State) -> None:
        idx = state.last_event_applied_idx
        body = state.model_dump_json()
        self._db.execute(
            "INSERT OR REPLACE INTO snapshots (idx, state, checksum) VALUES (?, ?, ?)",
            (idx, body, _checksum(idx, body)),
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
            "SELECT idx, body, command_id, checksum FROM events WHERE idx >= ? "
            "ORDER BY idx LIMIT ?",
            (idx, limit),
        ).fetchall()
        return [
            IndexedEvent(idx=i, event=self._event(i, body, checksum), command_id=command)
            for i, body, command, checksum in rows
        ]

    def _event(self, idx: int, body: str, checksum: str | None) -> Event:
        self._verify("event", idx, body, checksum)
        try:
            return _EVENT.validate_json(body)
        except ValueError as e:
            raise LogCorrupt(self.path, f"event {idx} cannot be read ({e})") from e

    def _verify(self, what: str, idx: int, body: str, checksum: str | None) -> None:
        if checksum != _checksum(idx, body):
            raise LogCorrupt(self.path, f"the {what} row {idx} does not match its checksum")

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
        row = self._db.execute(
            "SELECT idx, state, checksum FROM snapshots ORDER BY idx DESC LIMIT 1"
        ).fetchone()
        if row is None:
            return None
        idx, body, checksum = row
        self._verify("snapshot", idx, body, checksum)
        try:
            state = State.model_validate_json(body)
        except ValueError as e:
            raise LogCorrupt(self.path, f"the snapshot at {idx} cannot be read ({e})") from e
        if state.last_event_applied_idx != idx:
            raise LogCorrupt(self.path, f"the snapshot row {idx} holds the state at "
                             f"{state.last_event_applied_idx}")
        return state

    def restore(self) -> State:
        """The latest state: the snapshot plus every event after it."""
        state = self.snapshot() or State()
        rows = self._db.execute(
            "SELECT idx, body, checksum FROM events WHERE idx > ? ORDER BY idx",
            (state.last_event_applied_idx,),
        ).fetchall()
        for i, body, checksum in rows:
            if i != state.last_event_applied_idx + 1:
                raise LogCorrupt(self.path, f"event {state.last_event_applied_idx + 1} is "
                                 f"missing (the next row is {i})")
            state = apply(state, IndexedEvent(idx=i, event=self._event(i, body, checksum)))
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


class _Writing:
    """A transaction whose failure to write (a full disk, an I/O error) is rolled back
    and raised as ``LogUnavailable``."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        try:
            self._db.execute("BEGIN")
        except (sqlite3.OperationalError, OSError) as e:
            raise LogUnavailable(f"cannot write the event log: {e}") from e

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, _tb: object
    ) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
                return
            except (sqlite3.OperationalError, OSError) as e:
                self._rollback()
                raise LogUnavailable(f"cannot write the event log: {e}") from e
        self._rollback()
        if isinstance(exc, (sqlite3.OperationalError, OSError)) and not isinstance(
            exc, LogUnavailable
        ):
            raise LogUnavailable(f"cannot write the event log: {exc}") from exc

    def _rollback(self) -> None:
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
