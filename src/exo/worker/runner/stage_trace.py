"""What each stage of a pipeline did and when: its busy intervals, each labelled with the
micro-batch (lane) it worked on, and the slots its cache still held when it stopped.

Every rank records its own trace; with ``EXO_PIPELINE_TRACE`` set to a folder, each rank
writes ``stage<rank>.json`` there when the pipeline stops, and ``format_traces`` prints them
together: busy and idle time per stage over the common window, and the schedule (which
micro-batch each stage ran, in order). Times are wall-clock seconds (``time.time``), so the
traces of ranks on one machine line up; across machines only each stage's own figures mean
anything."""

import json
import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

TRACE_DIR_ENV = "EXO_PIPELINE_TRACE"
_KEEP = 200_000  # intervals kept per stage (the oldest go first)


@dataclass(frozen=True)
class Busy:
    lane: int
    start: float
    end: float


@dataclass
class StageTrace:
    stage: int
    intervals: deque[Busy] = field(default_factory=lambda: deque[Busy](maxlen=_KEEP))
    held_slots: int = 0

    def record(self, lane: int, start: float, end: float) -> None:
        self.intervals.append(Busy(lane, start, end))

    def timed(self, lane: int) -> "_Timer":
        return _Timer(self, lane)

    def to_json(self) -> dict[str, object]:
        return {
            "stage": self.stage,
            "held_slots": self.held_slots,
            "intervals": [[b.lane, b.start, b.end] for b in self.intervals],
        }

    @staticmethod
    def from_json(raw: dict[str, object]) -> "StageTrace":
        stage, held, rows = raw["stage"], raw["held_slots"], raw["intervals"]
        if not isinstance(stage, int) or not isinstance(held, int) or not isinstance(rows, list):
            raise ValueError("not a stage trace")
        trace = StageTrace(stage, held_slots=held)
        for row in rows:  # pyright: ignore[reportUnknownVariableType]
            lane, start, end = row  # pyright: ignore[reportUnknownVariableType]
            trace.record(int(lane), float(start), float(end))  # pyright: ignore[reportUnknownArgumentType]
        return trace

    def summary(self) -> str:
        """One line: steps, busy seconds and share of this stage's own window."""
        rows = list(self.intervals)
        busy = sum(b.end - b.start for b in rows)
        window = rows[-1].end - rows[0].start if rows else 0.0
        share = busy / window if window > 0 else 0.0
        return (f"stage {self.stage}: {len(rows)} steps, busy {busy:.2f} s of {window:.2f} s "
                f"({share:.0%}), slots held at stop {self.held_slots}")

    def save_if_asked(self) -> Path | None:
        """Write this trace where ``EXO_PIPELINE_TRACE`` says, if it says."""
        folder = os.environ.get(TRACE_DIR_ENV)
        if not folder:
            return None
        path = Path(folder) / f"stage{self.stage}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json()))
        return path


class _Timer:
    def __init__(self, trace: StageTrace, lane: int) -> None:
        self.trace, self.lane, self.start = trace, lane, 0.0

    def __enter__(self) -> None:
        self.start = time.time()

    def __exit__(self, *_: object) -> None:
        self.trace.record(self.lane, self.start, time.time())


def load_traces(folder: Path) -> list[StageTrace]:
    traces = [StageTrace.from_json(json.loads(p.read_text())) for p in folder.glob("stage*.json")]
    return sorted(traces, key=lambda t: t.stage)


def busy_fractions(traces: Sequence[StageTrace], since: float = 0.0) -> dict[int, float]:
    """Each stage's busy share of the common window (first start to last end of any stage,
    counting intervals that start at or after ``since``)."""
    kept = {t.stage: [b for b in t.intervals if b.start >= since] for t in traces}
    every = [b for rows in kept.values() for b in rows]
    if not every:
        return {t.stage: 0.0 for t in traces}
    window = max(b.end for b in every) - min(b.start for b in every)
    return {s: sum(b.end - b.start for b in rows) / window if window > 0 else 0.0
            for s, rows in kept.items()}


def overlap(a: StageTrace, b: StageTrace) -> float:
    """Seconds during which both stages were busy at once."""
    total = 0.0
    for x in a.intervals:
        for y in b.intervals:
            total += max(0.0, min(x.end, y.end) - max(x.start, y.start))
    return total


def format_traces(traces: Sequence[StageTrace], since: float = 0.0, schedule: int = 24) -> str:
    """Busy/idle per stage over the common window, then the first ``schedule`` entries of
    each stage's schedule (micro-batch, start offset ms, duration ms)."""
    fractions = busy_fractions(traces, since)
    every = [b for t in traces for b in t.intervals if b.start >= since]
    origin = min((b.start for b in every), default=0.0)
    lines: list[str] = []
    for t in traces:
        rows = [b for b in t.intervals if b.start >= since]
        busy = sum(b.end - b.start for b in rows)
        share = fractions.get(t.stage, 0.0)
        lines.append(
            f"stage {t.stage}: busy {busy:.3f} s ({share:.0%}), idle {1 - share:.0%}, "
            f"{len(rows)} steps, slots held at stop {t.held_slots}"
        )
        shown = " ".join(
            f"mb{b.lane}@{(b.start - origin) * 1e3:.0f}+{(b.end - b.start) * 1e3:.0f}"
            for b in rows[:schedule]
        )
        lines.append(f"  schedule (ms): {shown}")
    return "\n".join(lines)
