"""The SQLite log checks what it reads and says when it cannot write.

* One changed byte in a snapshot row or an event row is ``LogCorrupt`` naming the file
  (it was served silently: a different instance id, no warning).
* A log written before checksums gets them when it is opened, and is checked from then.
* A write the disk cannot take (SQLite's own "database or disk is full", from a page
  limit) is ``LogUnavailable`` and leaves the log as it was; writes work again once
  there is room.
"""

import sqlite3
from pathlib import Path

import pytest

from exo.master.event_log import LogCorrupt, LogUnavailable, SqliteEventLog
from exo.shared.apply import apply
from exo.shared.tests.builders import NODE_A, node_info, single_instance
from exo.shared.types.common import NodeId
from exo.shared.types.events import IndexedEvent, InstanceCreated, NodeGatheredInfo
from exo.shared.types.state import State


def _fill(log: SqliteEventLog, events: int, start: State | None = None) -> State:
    state = start or State()
    for _ in range(events):
        idx = state.last_event_applied_idx + 1
        event = NodeGatheredInfo(node_id=NodeId(f"n{idx}"), info=node_info())
        indexed = IndexedEvent(idx=idx, event=event)
        state = apply(state, indexed)
        log.append(indexed, state)
    return state


def _with_instance(path: Path) -> State:
    """A log whose snapshot (at event 4) holds INSTANCE_1, and two events after it."""
    log = SqliteEventLog(path, snapshot_every=5, keep_tail=5)
    created = IndexedEvent(idx=0, event=InstanceCreated(instance=single_instance()))
    state = apply(State(), created)
    log.append(created, state)
    state = _fill(log, 6, state)
    log.close()
    return state


def _flip(path: Path, sql: str, column: str, old: str, new: str) -> None:
    db = sqlite3.connect(path)
    (idx, text) = db.execute(sql).fetchone()
    assert old in text
    db.execute(f"UPDATE {column} WHERE idx = ?", (text.replace(old, new, 1), idx))
    db.commit()
    db.close()


def test_one_changed_byte_in_the_snapshot_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    _with_instance(path)
    _flip(path, "SELECT idx, state FROM snapshots", "snapshots SET state = ?",
          "instance-1", "instance-7")
    log = SqliteEventLog(path, snapshot_every=5, keep_tail=5)
    with pytest.raises(LogCorrupt) as caught:
        log.restore()
    assert caught.value.path == path
    assert "snapshot row 4" in caught.value.detail


def test_one_changed_byte_in_an_event_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    _with_instance(path)
    _flip(path, "SELECT idx, body FROM events WHERE idx = 6", "events SET body = ?",
          "n6", "n9")
    log = SqliteEventLog(path, snapshot_every=5, keep_tail=5)
    with pytest.raises(LogCorrupt, match="event row 6"):
        log.restore()
    with pytest.raises(LogCorrupt, match="event row 6"):
        log.read_from(5, 10)


def test_a_log_from_before_checksums_gets_them_and_is_checked_from_then(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    want = _with_instance(path)
    db = sqlite3.connect(path)  # the log as the last release wrote it
    for table in ("events", "snapshots"):
        db.execute(f"ALTER TABLE {table} DROP COLUMN checksum")
    db.commit()
    db.close()
    log = SqliteEventLog(path, snapshot_every=5, keep_tail=5)
    assert log.restore() == want
    log.close()
    _flip(path, "SELECT idx, body FROM events WHERE idx = 5", "events SET body = ?",
          "n5", "n8")
    with pytest.raises(LogCorrupt, match="event row 5"):
        SqliteEventLog(path, snapshot_every=5, keep_tail=5).restore()


def test_a_file_that_is_not_a_log_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    path.write_bytes(b"this is not a database, not even a little" * 100)
    with pytest.raises(LogCorrupt, match="cannot be read as an event log"):
        SqliteEventLog(path)


def test_a_full_disk_is_log_unavailable_and_the_log_recovers(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "events.db", snapshot_every=5, keep_tail=5)
    state = _fill(log, 3)
    db = log._db  # pyright: ignore[reportPrivateUsage]
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # the disk holds no more pages
    big = NodeGatheredInfo(node_id=NODE_A, info=node_info("x" * 200_000))
    indexed = IndexedEvent(idx=3, event=big)
    with pytest.raises(LogUnavailable, match="full"):
        log.append(indexed, apply(state, indexed))
    assert log.last_idx() == 2
    assert log.restore() == state
    db.execute("PRAGMA max_page_count = 1000000")  # space came back
    log.append(indexed, apply(state, indexed))
    assert log.last_idx() == 3
    assert log.restore() == apply(state, indexed)
