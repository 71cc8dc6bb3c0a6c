"""What the election must remember across restarts, in the data directory: the highest
term this node has seen (so that it never claims a term twice, whatever its clock does),
the lineage of its log (which master produced which stretch of it), and a mark its log
has reached (a log found shorter than the mark was truncated or replaced: the node must
not start from it as if it were whole)."""

import os
from pathlib import Path

from loguru import logger
from pydantic import Field, ValidationError

from exo.cluster.lineage import Epoch, Lineage
from exo.shared.types.common import FrozenModel

MARK_STEP = 100
"""The log mark moves in steps of this many events (a write of this file each time)."""


class Persisted(FrozenModel):
    term: int = Field(default=0, ge=0)
    lineage: Lineage = ()
    log_at_least: int = Field(default=-1, ge=-1)
    """The log holds at least the events up to this index (a step or two behind its end,
    so that the last commits a power cut may take do not count)."""


def log_mark(last_idx: int) -> int:
    """The mark for a log that ends at ``last_idx``: one step or more behind it."""
    return max(-1, (last_idx // MARK_STEP - 1) * MARK_STEP)


class ElectionStore:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._saved: Persisted | None = None

    def load(self) -> Persisted:
        try:
            self._saved = Persisted.model_validate_json(self._path.read_bytes())
        except FileNotFoundError:
            self._saved = Persisted()
        except (OSError, ValidationError) as e:
            raise SystemExit(f"exo: cannot read {self._path}: {e}") from e
        return self._saved

    def save(self, term: int, lineage: tuple[Epoch, ...]) -> None:
        """Write atomically (and durably), unless nothing changed."""
        mark = -1 if self._saved is None else self._saved.log_at_least
        self._write(Persisted(term=term, lineage=lineage, log_at_least=mark))

    def mark_log(self, last_idx: int) -> None:
        """The log now ends at ``last_idx`` (written after each append or reset)."""
        saved = self._saved or self.load()
        mark = log_mark(last_idx)
        if mark == saved.log_at_least:
            return
        try:
            self._write(saved.model_copy(update={"log_at_least": mark}))
        except OSError as e:  # a mark that lags only weakens the check at the next start
            logger.debug(f"cannot write {self._path}: {e}")

    def forget_log(self) -> None:
        """The log is gone (moved aside): the node starts again from an empty one."""
        saved = self._saved or self.load()
        if saved.log_at_least != -1:
            self._write(saved.model_copy(update={"log_at_least": -1}))

    def _write(self, wanted: Persisted) -> None:
        if wanted == self._saved:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.write(wanted.model_dump_json().encode())
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self._path)
        self._saved = wanted
