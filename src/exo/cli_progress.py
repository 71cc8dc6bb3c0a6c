"""The CLI's model progress: downloading, loading, ready or failed, as one line.

On a terminal the line is redrawn in place; otherwise (a log file, a pipe) a line is
written only when the stage changes, the percentage passes another 10%, or 30 s passed.
"""

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from exo.shared.models.model_cards import ModelId
from exo.shared.types.state import State
from exo.shared.types.state_queries import instances_of
from exo.shared.types.worker.downloads import DownloadFailed, DownloadOngoing
from exo.shared.types.worker.runners import (
    RunnerFailed,
    RunnerLoaded,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerWarmingUp,
)

_BAR = 30


def _bar(done: int, total: int) -> str:
    filled = _BAR * done // max(total, 1)
    return f"[{'#' * filled}{'.' * (_BAR - filled)}]"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def progress_line(model_id: ModelId, state: State) -> str:
    """One line saying where the model stands on this cluster."""
    instances = instances_of(state, model_id)
    nodes = {n for i in instances for n in i.shard_assignments.node_to_runner}
    downloads = [state.downloads.get(n, {}).get(model_id) for n in sorted(nodes)]
    for d in downloads:
        if isinstance(d, DownloadFailed) and d.terminal:
            return f"failed: {model_id}: {d.error_message}"
    statuses = [state.runners.get(rid) for i in instances
                for rid in i.shard_assignments.runner_to_shard]
    return _runner_line(model_id, statuses) or _download_line(model_id, downloads) or (
        f"starting {model_id} ...")


def _runner_line(model_id: ModelId, statuses: Sequence[object]) -> str | None:
    if statuses and all(isinstance(s, (RunnerReady, RunnerRunning)) for s in statuses):
        return f"ready: {model_id}"
    for s in statuses:
        if isinstance(s, RunnerFailed):
            return f"failed: {model_id}: {s.error_message} (retrying)"
    loading = [s for s in statuses if isinstance(s, RunnerLoading)]
    if loading:
        done = sum(s.layers_loaded for s in loading)
        total = sum(s.total_layers for s in loading) or 1
        return f"loading {model_id} {_bar(done, total)} {done}/{total} layers"
    if statuses and all(isinstance(s, (RunnerLoaded, RunnerWarmingUp, RunnerReady)) for s in statuses):
        return f"warming up {model_id} ..."
    return None


def _download_line(model_id: ModelId, downloads: Sequence[object]) -> str | None:
    started = [d for d in downloads if isinstance(d, DownloadOngoing)]
    ongoing = [d for d in started if d.total_bytes > 0]
    if not ongoing:
        for d in downloads:
            if isinstance(d, DownloadFailed):
                return f"downloading {model_id}: {d.error_message}"
        return f"downloading {model_id} ..." if started else None
    done = sum(d.downloaded_bytes for d in ongoing)
    total = sum(d.total_bytes for d in ongoing)
    speed = sum(d.bytes_per_s for d in ongoing)
    etas = [d.eta_s for d in ongoing if d.eta_s is not None]
    eta = f", {max(etas):.0f} s left" if etas else ""
    return (f"downloading {model_id} {_bar(done, total)} {100 * done // max(total, 1)}% "
            f"{_bytes(done)}/{_bytes(total)} at {_bytes(speed)}/s{eta}")


@dataclass
class ProgressPrinter:
    stream: TextIO
    tty: bool
    interval_s: float = 30.0
    _shown: str = ""
    _key: tuple[str, int] = ("", -1)
    _at: float = 0.0

    def show(self, line: str) -> None:
        final = line.startswith(("ready", "failed"))
        if line == self._shown:
            return
        if self.tty:
            self.stream.write(f"\r\x1b[2K{line}" + ("\n" if final else ""))
            self.stream.flush()
            self._shown = line
            return
        key = _stage(line)
        now = time.monotonic()
        if key != self._key or final or now - self._at >= self.interval_s:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._key, self._at = key, now
        self._shown = line


def _stage(line: str) -> tuple[str, int]:
    """The stage of a line and its progress in tenths (the sparse lines' change key)."""
    stage = line.split(" ", 1)[0]
    if m := re.search(r"(\d+)%", line):
        return stage, int(m.group(1)) // 10
    if m := re.search(r"(\d+)/(\d+) layers", line):
        return stage, 10 * int(m.group(1)) // max(int(m.group(2)), 1)
    return stage, -1
