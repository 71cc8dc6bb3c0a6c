"""What the election must remember across restarts, in the data directory: the highest
term this node has seen (so that it never claims a term twice, whatever its clock does)
and the lineage of its log (which master produced which stretch of it)."""

import os
from pathlib import Path

from pydantic import Field, ValidationError

from exo.cluster.lineage import Epoch, Lineage
from exo.shared.types.common import FrozenModel


class Persisted(FrozenModel):
    term: int = Field(default=0, ge=0)
    lineage: Lineage = ()


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
        wanted = Persisted(term=term, lineage=lineage)
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
