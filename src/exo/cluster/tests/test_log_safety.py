"""A node's log that cannot be trusted, or cannot be written.

* Damaged (a changed byte) or truncated (a 0-byte ``events.db`` beside an
  ``election.json`` that saw it hold hundreds of events): the node refuses to start with
  one line naming the file and how to recover (it started empty, or served a changed
  state, silently). Moved aside as told, it starts from an empty log.
* Full (a follower whose disk takes no more): the follower exited with code 1 on the
  first event. It stays up at the event it had, and catches up once there is room.
"""

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import cast

import anyio
import pytest
from loguru import logger

from exo.cluster.catch_up import LogFollower
from exo.cluster.config import ClusterConfig
from exo.cluster.lineage import Epoch
from exo.cluster.log_open import open_log
from exo.cluster.messages import CatchUpReply, EventMsg
from exo.cluster.network import ClusterNetwork
from exo.cluster.presence import Peers
from exo.cluster.replica import Replica
from exo.cluster.sequencer import Sequencer
from exo.cluster.sim.node import SimHost
from exo.cluster.store import MARK_STEP, ElectionStore
from exo.master.event_log import LogUnavailable, SqliteEventLog
from exo.shared.apply import apply
from exo.shared.tests.builders import model_card, node_info
from exo.shared.types.commands import PlaceInstance
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import IndexedEvent, MergeReported, NodeGatheredInfo
from exo.shared.types.state import State
from exo.tests.node_process import free_port

MASTER, ME = NodeId("master"), NodeId("me")
EPOCH = Epoch(term=1, master=MASTER, start_idx=0)


def _event(idx: int, hostname: str = "host") -> IndexedEvent:
    return IndexedEvent(idx=idx, event=NodeGatheredInfo(
        node_id=NodeId(f"n{idx}"), info=node_info(hostname)))


def _write_log(cluster_dir: Path, events: int) -> State:
    """A log of ``events`` events, opened as a node opens it (the mark follows)."""
    log, _store, state = open_log(cluster_dir)
    for idx in range(events):
        indexed = _event(idx)
        state = apply(state, indexed)
        log.append(indexed, state)
    log.close()
    return state


def test_a_truncated_log_is_refused_with_one_line(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "cluster"
    _write_log(cluster_dir, 3 * MARK_STEP + 7)
    (cluster_dir / "events.db").write_bytes(b"")  # 0 bytes, election.json intact
    for name in ("events.db-wal", "events.db-shm"):
        (cluster_dir / name).unlink(missing_ok=True)
    with pytest.raises(SystemExit) as caught:
        open_log(cluster_dir)
    message = str(caught.value.code)
    assert "\n" not in message
    assert str(cluster_dir / "events.db") in message
    assert "truncated" in message and "move it aside" in message
    assert "catches up from the cluster" in message


def test_a_log_moved_aside_starts_empty(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "cluster"
    _write_log(cluster_dir, 2 * MARK_STEP + 1)
    (cluster_dir / "events.db").rename(cluster_dir / "events.db.bad")
    log, store, state = open_log(cluster_dir)
    assert state == State()
    assert store.load().log_at_least == -1
    log.close()
    _log, _store, again = open_log(cluster_dir)  # and again: no refusal
    assert again == State()


def test_a_damaged_log_is_refused_with_one_line(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "cluster"
    _write_log(cluster_dir, 5)
    db = sqlite3.connect(cluster_dir / "events.db")
    db.execute("UPDATE events SET body = replace(body, 'n3', 'n4') WHERE idx = 3")
    db.commit()
    db.close()
    with pytest.raises(SystemExit) as caught:
        open_log(cluster_dir)
    message = str(caught.value.code)
    assert "\n" not in message
    assert f"the event log {cluster_dir / 'events.db'} is damaged" in message
    assert "event row 3" in message and "move it aside" in message


@pytest.mark.slow
def test_exo_refuses_to_start_on_a_truncated_log(tmp_path: Path) -> None:
    """Through a real ``exo`` process: exit code != 0, one line, no traceback."""
    data = tmp_path / "data"
    _write_log(data / "cluster", 15 * MARK_STEP)
    (data / "cluster" / "events.db").write_bytes(b"")
    cmd = [sys.executable, "-m", "exo.cli", "--api-port", str(free_port()), "--threads", "1",
           "--discovery-interface", "none", "--listen", f"tcp/127.0.0.1:{free_port()}",
           "--model", "none", "--data-dir", str(data)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if "events.db" in line]
    assert len(lines) == 1, result.stderr
    assert "truncated" in lines[0] and "move it aside" in lines[0]


# ------------------------------------------------------------------ a full disk, follower


def _follower(tmp_path: Path) -> tuple[LogFollower, Replica, SqliteEventLog]:
    host = SimHost(ME, State(), lambda: 0.0, node_info())
    log = SqliteEventLog(tmp_path / "events.db")
    replica = Replica(host, log, ElectionStore(tmp_path / "election.json"))

    def network() -> ClusterNetwork:
        raise AssertionError("no network here")

    async def wait(_timeout: float) -> None:
        await anyio.sleep(0)

    def report(_report: MergeReported) -> None:
        raise AssertionError("nothing is dropped here")

    follower = LogFollower(
        ClusterConfig(secret="s", listen=()), host, replica, lambda: 0.0, network,
        master=lambda: MASTER, is_master=lambda: False, wait_master_change=wait,
        report=report, resubmit=lambda _: None, on_synced=lambda: None,
    )
    follower.synced = True
    return follower, replica, log


def _disk_full(log: SqliteEventLog, full: bool) -> None:
    db = log._db  # pyright: ignore[reportPrivateUsage]
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages if full else 1_000_000}")


@pytest.mark.anyio
async def test_a_follower_whose_disk_is_full_stays_up_and_catches_up_later(
    tmp_path: Path,
) -> None:
    follower, replica, log = _follower(tmp_path)
    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(str(m)), level="ERROR")
    await replica.apply(EventMsg(epoch=EPOCH, event=_event(0)))
    assert replica.last_idx == 0
    _disk_full(log, True)
    big = [_event(i, "x" * 100_000) for i in (1, 2)]
    for _ in range(3):  # used to raise sqlite3.OperationalError: the node exited
        await replica.apply(EventMsg(epoch=EPOCH, event=big[0]))
    assert replica.last_idx == 0
    assert replica.host.state().nodes.keys() == {NodeId("n0")}
    assert replica.log_failure is not None
    page = CatchUpReply(base=None, events=big, last_idx=2, lineage=(EPOCH,))
    with pytest.raises(LogUnavailable):
        await replica.apply_reply(page)
    assert replica.last_idx == 0
    assert not await follower._apply(MASTER, page)  # pyright: ignore[reportPrivateUsage]
    _disk_full(log, False)  # space came back: the next page goes in
    assert await follower._apply(MASTER, page)  # pyright: ignore[reportPrivateUsage]
    assert replica.last_idx == 2
    assert replica.log_failure is None
    assert log.restore() == replica.host.state()
    logger.remove(sink)
    assert len(errors) == 1, errors  # logged once, however many writes failed
    assert "cannot be written" in errors[0]


# ------------------------------------------------------------------ a full disk, master


class _FullDisk:
    """A log behind a switch that fails writes as a full disk does."""

    def __init__(self, inner: SqliteEventLog) -> None:
        self.inner = inner
        self.full = False

    def append(self, event: IndexedEvent, state_after: State) -> None:
        if self.full:
            raise LogUnavailable("database or disk is full")
        self.inner.append(event, state_after)

    def read_from(self, idx: int, limit: int) -> list[IndexedEvent]:
        return self.inner.read_from(idx, limit)

    def snapshot(self) -> State | None:
        return self.inner.snapshot()

    def restore(self) -> State:
        return self.inner.restore()

    def command_ids(self, limit: int) -> list[CommandId]:
        return self.inner.command_ids(limit)


class _Published:
    def __init__(self) -> None:
        self.messages: list[object] = []

    async def publish(self, _topic: object, message: object) -> None:
        self.messages.append(message)


@pytest.mark.anyio
async def test_a_command_refused_for_a_full_disk_is_applied_when_retried(
    tmp_path: Path,
) -> None:
    """The sequencer remembered a command as handled before the master refused it (the
    log could not take it): the client's retry, once there was room, was acknowledged as
    "applied already" and never applied. Local events the log cannot take are not
    accepted, so their sender sends them again."""
    host = SimHost(ME, State(), lambda: 0.0, node_info())
    replica = Replica(host, SqliteEventLog(tmp_path / "events.db"),
                      ElectionStore(tmp_path / "election.json"))
    published = _Published()
    sequencer = Sequencer(host, replica, Peers(ME, lambda: 0.0, 5.0),
                          lambda: cast(ClusterNetwork, published))
    await sequencer.take_over(1, lambda: None)
    master = sequencer.master
    assert master is not None
    disk = _FullDisk(replica.log)
    master.log = disk
    info = NodeGatheredInfo(node_id=ME, info=node_info("me", memory_mb=8192))
    disk.full = True
    assert not await sequencer.emit_all([info])  # not accepted: sent again later
    disk.full = False
    assert await sequencer.emit_all([info])
    command = PlaceInstance(model_id=model_card().model_id, model_card=model_card())
    disk.full = True
    assert await sequencer.submit(command, ME)
    assert host.state().instances == {}
    disk.full = False
    assert await sequencer.submit(command, ME)  # the client's retry
    assert len(host.state().instances) == 1
    assert await sequencer.submit(command, ME)  # a retry of an applied one: once
    assert len(host.state().instances) == 1
