"""The replay guard's memory across restarts of the receiver (``ReplayBook``)."""

from pathlib import Path

import pytest
from loguru import logger

import exo.routing.replay_book as replay_book
from exo.routing.envelope import ReplayGuard
from exo.routing.replay_book import ReplayBook

SECOND = 10**9


def restarted(path: Path, *old: ReplayBook) -> ReplayGuard:
    """The receiver restarts: a new guard over the same data directory."""
    for book in old:
        book.close()
    return ReplayGuard(ReplayBook(path))


def test_a_recorded_envelope_is_refused_after_the_receiver_restarts(tmp_path: Path) -> None:
    path = tmp_path / "replay.log"
    guard = ReplayGuard(ReplayBook(path))
    assert guard.admit("b", "t1", 100, session=7)
    assert guard.admit("b", "t2", 101, session=7)
    guard = restarted(path, guard.book)
    assert not guard.admit("b", "t1", 100, session=7)  # recorded before the restart
    assert not guard.admit("b", "t2", 101, session=7)
    assert not guard.admit("b", "t3", 99, session=7)  # older than what was admitted
    assert guard.admit("b", "t1", 102, session=7)  # the same sender goes on
    assert not guard.admit("b", "t1", 102, session=7)


def test_without_a_file_nothing_is_remembered() -> None:
    guard = ReplayGuard(ReplayBook())
    assert guard.admit("b", "t1", 100, session=7)
    assert ReplayGuard(ReplayBook()).admit("b", "t1", 100, session=7)


def test_a_restarted_sender_whose_clock_stepped_back_is_admitted_and_logged(
    tmp_path: Path,
) -> None:
    path = tmp_path / "replay.log"
    lines: list[str] = []
    sink = logger.add(lines.append, level="WARNING", format="{message}")
    try:
        guard = ReplayGuard(ReplayBook(path))
        assert guard.admit("b", "t1", 500 * SECOND, session=1)
        # b restarts (a new session) with its clock 200 s behind: admitted, and said.
        assert guard.admit("b", "t1", 300 * SECOND, session=2)
        assert any("node b restarted with its clock 200.000 s behind" in line for line in lines)
        guard = restarted(path, guard.book)
        assert not guard.admit("b", "t1", 500 * SECOND, session=1)  # the old run's recording
        assert not guard.admit("b", "t1", 300 * SECOND, session=2)
        assert guard.admit("b", "t1", 300 * SECOND + 1, session=2)
    finally:
        logger.remove(sink)


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "replay.log"
    guard = ReplayGuard(ReplayBook(path))
    assert guard.admit("b", "t1", 100, session=7)
    guard.book.close()
    with path.open("a") as f:
        f.write('["b", 7, 10')  # the machine went down mid-write
    guard = restarted(path)
    assert not guard.admit("b", "t1", 100, session=7)
    assert guard.admit("b", "t1", 101, session=7)


def test_the_file_is_compacted_and_keeps_what_it_must(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_book, "COMPACT_BYTES", 2000)
    path = tmp_path / "replay.log"
    guard = ReplayGuard(ReplayBook(path))
    for counter in range(1, 500):
        assert guard.admit("b", "t1", counter, session=7)
        assert guard.admit("c", "t1", counter, session=8)
    assert path.stat().st_size <= 2000 + 100
    guard = restarted(path, guard.book)
    assert not guard.admit("b", "t1", 499, session=7)
    assert not guard.admit("c", "t1", 499, session=8)
    assert guard.admit("c", "t1", 500, session=8)
