"""Re-submitted commands not yet taken by a master, kept in the node's data directory.

A merge that drops a stretch of this node's log removes the events the re-submitted
commands are rebuilt from (``resubmit``): they are written here before the reset, and
forgotten once a master has taken them, so a node that stops in between re-submits them
when it starts again."""

import os
from collections.abc import Sequence
from pathlib import Path

from loguru import logger
from pydantic import TypeAdapter, ValidationError

from exo.shared.types.commands import Command
from exo.shared.types.common import CommandId

_COMMANDS = TypeAdapter(list[Command])


class PendingResubmissions:
    def __init__(self, path: Path | None) -> None:
        """``path``: the file (None: kept in memory only)."""
        self._path = path
        self.commands: list[Command] = self._load()

    def add(self, commands: Sequence[Command]) -> None:
        self.commands.extend(commands)
        self._save()

    def taken(self, command_id: CommandId) -> None:
        """A master took ``command_id``."""
        self.commands = [c for c in self.commands if c.command_id != command_id]
        self._save()

    def _load(self) -> list[Command]:
        if self._path is None:
            return []
        try:
            return _COMMANDS.validate_json(self._path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, ValidationError) as e:
            logger.error(f"cluster: cannot read {self._path} ({e}); its re-submissions are lost")
            return []

    def _save(self) -> None:
        if self._path is None:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.write(_COMMANDS.dump_json(self.commands))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self._path)
