"""What a node remembers of the envelopes it admitted, across its own restarts: for each
sender's session (one per process start of that sender), the highest counter admitted.

A replay guard's memory of counters per context is lost when the node restarts; without
this book a message recorded before the restart would be admitted again after it. With
it, a counter at or below the highest one recorded for its session is refused. A sender
that restarts draws a new session, so it is admitted whatever its clock says; when its
counters run behind those of its earlier sessions (its clock stepped back), that is
logged, never silently muted.

Kept in one append-only file of JSON lines ``[sender, session, counter]``, written as
each counter is admitted (no fsync: a crash of the process loses nothing, a crash of the
machine at most the last lines), compacted into one line per session when it grows.
"""

import json
import os
from pathlib import Path

from loguru import logger

COMPACT_BYTES = 1 << 20
"""Compact the file once it grows past this."""
SESSIONS_KEPT = 1000
"""Sessions remembered per sender (oldest forgotten first): a sender restarted this
many times since a recording was made gets it admitted again."""


class ReplayBook:
    def __init__(self, path: Path | None = None) -> None:
        """``path``: the file (None: remember nothing across restarts)."""
        self._path = path
        self._floor: dict[tuple[str, int], int] = {}
        """Per (sender, session): the highest counter admitted before this node started."""
        self._high: dict[str, dict[int, int]] = {}
        """Per sender, per session (oldest first): the highest counter admitted."""
        self._fd: int | None = None
        self._size = 0
        if path is not None:
            self._load(path)
            self._floor = {(s, n): c for s, ns in self._high.items() for n, c in ns.items()}
            self._compact()

    def admit(self, sender: str, session: int, counter: int) -> bool:
        """False: this node admitted the counter (or a later one) of that session before
        it last started."""
        return counter > self._floor.get((sender, session), -1)

    def record(self, sender: str, session: int, counter: int) -> None:
        """The counter was admitted."""
        if self._path is None:
            return
        sessions = self._high.setdefault(sender, {})
        high = sessions.get(session)
        if high is not None and counter <= high:
            return  # overtaken by a later counter on another context
        if high is None:
            self._new_session(sender, sessions, counter)
        sessions[session] = counter
        self._write(json.dumps([sender, session, counter]) + "\n")
        if self._size > COMPACT_BYTES:
            self._compact()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _new_session(self, sender: str, sessions: dict[int, int], counter: int) -> None:
        before = max(sessions.values(), default=None)
        if before is not None and counter <= before:
            logger.warning(
                f"cluster: node {sender} restarted with its clock {(before - counter) / 1e9:.3f} "
                "s behind its last run; its messages are admitted as a new session"
            )
        while len(sessions) >= SESSIONS_KEPT:
            del sessions[next(iter(sessions))]

    def _load(self, path: Path) -> None:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                sender, session, counter = json.loads(line)
            except (ValueError, TypeError):
                continue  # a torn last line
            if not (isinstance(sender, str) and isinstance(session, int)
                    and isinstance(counter, int)):
                continue
            sessions = self._high.setdefault(sender, {})
            sessions[session] = max(counter, sessions.get(session, counter))

    def _compact(self) -> None:
        """Rewrite the file with one line per session, durably, and append from there."""
        assert self._path is not None
        self.close()
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        lines = [
            json.dumps([sender, session, counter]) + "\n"
            for sender, sessions in self._high.items()
            for session, counter in sessions.items()
        ]
        self._size = sum(len(line) for line in lines)
        with tmp.open("w") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self._path)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)

    def _write(self, line: str) -> None:
        if self._fd is not None:
            self._size += os.write(self._fd, line.encode())
