"""A log remembers which commands it applied after compacting their events, and across
a restart, so that a master taking over from it acknowledges a retry instead of
applying it again (the at-most-once guarantee)."""

import sqlite3
from pathlib import Path

from pydantic import TypeAdapter

from exo.master.event_log import MemoryEventLog, SqliteEventLog
from exo.shared.apply import apply
from exo.shared.tests.builders import node_info
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import Event, IndexedEvent, NodeGatheredInfo
from exo.shared.types.state import State


def _fill(log: SqliteEventLog | MemoryEventLog, events: int) -> State:
    state = State()
    for idx in range(events):
        event = NodeGatheredInfo(node_id=NodeId(f"n{idx}"), info=node_info())
        indexed = IndexedEvent(idx=idx, event=event, command_id=CommandId(f"c{idx}"))
        state = apply(state, indexed)
        log.append(indexed, state)
    return state


def test_commands_outlive_the_compaction_of_their_events(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    log = SqliteEventLog(path, snapshot_every=5, keep_tail=5)
    _fill(log, 50)
    assert log.read_from(0, 100) == []  # event 0 was compacted away
    everything = [CommandId(f"c{i}") for i in range(50)]
    assert log.command_ids(100) == everything
    assert log.command_ids(3) == everything[-3:]
    log.close()
    reopened = SqliteEventLog(path, snapshot_every=5, keep_tail=5)
    assert reopened.command_ids(100) == everything
    memory = MemoryEventLog(snapshot_every=5, keep_tail=5)
    _fill(memory, 50)
    assert memory.command_ids(100) == everything


def test_a_reset_forgets_the_commands_of_the_log_it_replaces(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "events.db", snapshot_every=5, keep_tail=5)
    state = _fill(log, 12)
    log.reset(state)
    assert log.command_ids(100) == []


def test_a_log_from_before_remembers_what_its_events_say(tmp_path: Path) -> None:
    """A log written before the commands were kept apart: its kept events' commands."""
    path = tmp_path / "events.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE events (idx INTEGER PRIMARY KEY, body TEXT NOT NULL, "
               "command_id TEXT)")
    db.execute("CREATE TABLE snapshots (idx INTEGER PRIMARY KEY, state TEXT NOT NULL)")
    event = NodeGatheredInfo(node_id=NodeId("n0"), info=node_info())
    body = TypeAdapter[Event](Event).dump_json(event).decode()
    db.executemany("INSERT INTO events VALUES (?, ?, ?)",
                   [(0, body, "c0"), (1, body, None), (2, body, "c2")])
    db.commit()
    db.close()
    log = SqliteEventLog(path)
    assert log.command_ids(10) == [CommandId("c0"), CommandId("c2")]
    assert log.restore().last_event_applied_idx == 2
