"""A small Prometheus registry: counters, gauges and histograms with labels.

Thread-safe: any thread of the node (the API's event loop, the worker, a supervisor
thread) may update a metric while another renders them. ``REGISTRY.render()`` returns
the Prometheus text exposition format (version 0.0.4).

    REQUESTS = REGISTRY.counter("exo_x_total", "What it counts", ("endpoint",))
    REQUESTS.labels(endpoint="/v1/models").inc()
    RESTARTS.inc()  # a metric without labels
"""

import math
import re
import threading
from bisect import bisect_left
from collections.abc import Sequence
from typing import Literal, TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

MetricType = Literal["counter", "gauge", "histogram"]

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# Latency buckets in seconds: from a fast token (ms) to a slow first token (minutes).
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip

LabelKey = tuple[str, ...]


class _Metric:
    """What every metric shares: a name, a help text, label names and a lock."""

    type_name: MetricType

    def __init__(self, name: str, help_text: str, label_names: Sequence[str]) -> None:
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in label_names:
            if not _LABEL.match(label) or label.startswith("__") or label == "le":
                raise ValueError(f"invalid label name {label!r} for {name}")
        self.name = name
        self.help_text = help_text
        self.label_names: tuple[str, ...] = tuple(label_names)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> LabelKey:
        if set(labels) != set(self.label_names):
            raise ValueError(
                f"{self.name} takes labels {list(self.label_names)}, got {sorted(labels)}"
            )
        return tuple(str(labels[name]) for name in self.label_names)

    def _no_labels(self) -> LabelKey:
        if self.label_names:
            raise ValueError(f"{self.name} needs labels {list(self.label_names)}")
        return ()

    def header(self) -> list[str]:
        return [
            f"# HELP {self.name} {_escape_help(self.help_text)}",
            f"# TYPE {self.name} {self.type_name}",
        ]

    def samples(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    type_name: MetricType = "counter"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, label_names)
        self._values: dict[LabelKey, float] = {}
        if not self.label_names:
            self._values[()] = 0.0

    def labels(self, **labels: str) -> "CounterChild":
        return CounterChild(self, self._key(labels))

    def inc(self, amount: float = 1.0) -> None:
        self._inc(self._no_labels(), amount)

    def value(self, **labels: str) -> float:
        key = self._key(labels) if labels else self._no_labels()
        with self._lock:
            return self._values.get(key, 0.0)

    def _inc(self, key: LabelKey, amount: float) -> None:
        if amount < 0 or math.isnan(amount):
            raise ValueError(f"{self.name}: a counter only goes up (got {amount})")
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [_sample(self.name, self.label_names, key, value) for key, value in items]


class CounterChild:
    def __init__(self, parent: Counter, key: LabelKey) -> None:
        self._parent = parent
        self._key = key

    def inc(self, amount: float = 1.0) -> None:
        self._parent._inc(self._key, amount)


class Gauge(_Metric):
    type_name: MetricType = "gauge"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, label_names)
        self._values: dict[LabelKey, float] = {}
        if not self.label_names:
            self._values[()] = 0.0

    def labels(self, **labels: str) -> "GaugeChild":
        return GaugeChild(self, self._key(labels))

    def set(self, value: float) -> None:
        self._set(self._no_labels(), value)

    def inc(self, amount: float = 1.0) -> None:
        self._add(self._no_labels(), amount)

    def dec(self, amount: float = 1.0) -> None:
        self._add(self._no_labels(), -amount)

    def value(self, **labels: str) -> float:
        key = self._key(labels) if labels else self._no_labels()
        with self._lock:
            return self._values.get(key, 0.0)

    def _set(self, key: LabelKey, value: float) -> None:
        with self._lock:
            self._values[key] = value

    def _add(self, key: LabelKey, amount: float) -> None:
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [_sample(self.name, self.label_names, key, value) for key, value in items]


class GaugeChild:
    def __init__(self, parent: Gauge, key: LabelKey) -> None:
        self._parent = parent
        self._key = key

    def set(self, value: float) -> None:
        self._parent._set(self._key, value)

    def inc(self, amount: float = 1.0) -> None:
        self._parent._add(self._key, amount)

    def dec(self, amount: float = 1.0) -> None:
        self._parent._add(self._key, -amount)


class _HistogramValues:
    def __init__(self, n_buckets: int) -> None:
        self.counts = [0] * n_buckets  # per bucket, not cumulative
        self.total = 0
        self.sum = 0.0


class Histogram(_Metric):
    type_name: MetricType = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        super().__init__(name, help_text, label_names)
        bounds = sorted(float(b) for b in buckets if not math.isinf(b))
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets must be distinct and not empty")
        self.bounds: tuple[float, ...] = tuple(bounds)
        self._values: dict[LabelKey, _HistogramValues] = {}
        if not self.label_names:
            self._values[()] = _HistogramValues(len(self.bounds) + 1)

    def labels(self, **labels: str) -> "HistogramChild":
        return HistogramChild(self, self._key(labels))

    def observe(self, value: float) -> None:
        self._observe(self._no_labels(), value)

    def count(self, **labels: str) -> int:
        key = self._key(labels) if labels else self._no_labels()
        with self._lock:
            values = self._values.get(key)
            return 0 if values is None else values.total

    def _observe(self, key: LabelKey, value: float) -> None:
        if math.isnan(value):
            raise ValueError(f"{self.name}: cannot observe NaN")
        # The first bound >= value; values above every bound land in +Inf.
        index = bisect_left(self.bounds, value)
        with self._lock:
            values = self._values.get(key)
            if values is None:
                values = self._values[key] = _HistogramValues(len(self.bounds) + 1)
            values.counts[index] += 1
            values.total += 1
            values.sum += value

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted((key, list(v.counts), v.total, v.sum) for key, v in self._values.items())
        lines: list[str] = []
        names = (*self.label_names, "le")
        for key, counts, total, total_sum in items:
            cumulative = 0
            for bound, count in zip((*self.bounds, math.inf), counts, strict=True):
                cumulative += count
                lines.append(
                    _sample(f"{self.name}_bucket", names, (*key, _number(bound)), cumulative)
                )
            lines.append(_sample(f"{self.name}_sum", self.label_names, key, total_sum))
            lines.append(_sample(f"{self.name}_count", self.label_names, key, total))
        return lines


class HistogramChild:
    def __init__(self, parent: Histogram, key: LabelKey) -> None:
        self._parent = parent
        self._key = key

    def observe(self, value: float) -> None:
        self._parent._observe(self._key, value)


_M = TypeVar("_M", bound=_Metric)


class Registry:
    """Metrics by name. Asking twice for the same name returns the same metric."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, _Metric] = {}

    def counter(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> Counter:
        with self._lock:
            existing = self._metrics.get(name)
            if existing is None:
                metric = self._metrics[name] = Counter(name, help_text, label_names)
                return metric
        return _same(existing, Counter, label_names)

    def gauge(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> Gauge:
        with self._lock:
            existing = self._metrics.get(name)
            if existing is None:
                metric = self._metrics[name] = Gauge(name, help_text, label_names)
                return metric
        return _same(existing, Gauge, label_names)

    def histogram(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> Histogram:
        with self._lock:
            existing = self._metrics.get(name)
            if existing is None:
                metric = self._metrics[name] = Histogram(name, help_text, label_names, buckets)
                return metric
        return _same(existing, Histogram, label_names)

    def render(self) -> str:
        with self._lock:
            metrics = sorted(self._metrics.values(), key=lambda m: m.name)
        lines: list[str] = []
        for metric in metrics:
            lines.extend(metric.header())
            lines.extend(metric.samples())
        return "\n".join(lines) + "\n"


def _same(existing: _Metric, kind: type[_M], label_names: Sequence[str]) -> _M:
    if not isinstance(existing, kind) or existing.label_names != tuple(label_names):
        raise ValueError(
            f"metric {existing.name} already exists as a {existing.type_name} "
            f"with labels {list(existing.label_names)}"
        )
    return existing


def _sample(name: str, label_names: Sequence[str], key: Sequence[str], value: float) -> str:
    if not label_names:
        return f"{name} {_number(value)}"
    labels = ",".join(
        f'{label}="{_escape_label(v)}"' for label, v in zip(label_names, key, strict=True)
    )
    return f"{name}{{{labels}}} {_number(value)}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


# ---------------------------------------------------------------- the node's metrics

REGISTRY = Registry()

API_REQUESTS = REGISTRY.counter(
    "exo_api_requests_total",
    "HTTP requests answered, by endpoint and status",
    ("endpoint", "status"),
)
API_REQUEST_DURATION = REGISTRY.histogram(
    "exo_api_request_duration_seconds",
    "Time from a request's arrival to the end of its response",
    ("endpoint",),
)
TOKENS_GENERATED = REGISTRY.counter(
    "exo_tokens_generated_total", "Tokens generated for API clients", ("model",)
)
TIME_TO_FIRST_TOKEN = REGISTRY.histogram(
    "exo_time_to_first_token_seconds",
    "Time from sending a generation to its first token",
    ("model",),
)
INTER_TOKEN_LATENCY = REGISTRY.histogram(
    "exo_inter_token_latency_seconds",
    "Time between consecutive tokens of one generation",
    ("model",),
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5),
)
QUEUE_DEPTH = REGISTRY.gauge("exo_api_queue_depth", "Generation requests waiting for a free slot")
ACTIVE_GENERATIONS = REGISTRY.gauge(
    "exo_api_active_generations", "Generation requests being served"
)
RUNNER_RESTARTS = REGISTRY.counter(
    "exo_runner_restarts_total", "Runners re-created after a failure"
)
CLUSTER_MESSAGES_REJECTED = REGISTRY.counter(
    "exo_cluster_messages_rejected_total",
    "Cluster messages refused: malformed, bad MAC, replayed, undecodable, other protocol version",
    ("reason",),
)
RUNNER_FAILURES = REGISTRY.counter("exo_runner_failures_total", "Runners that failed")
