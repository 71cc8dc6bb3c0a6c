"""Small helpers for the API tests: waiting on conditions, reading Prometheus text."""

import re
import time
from collections.abc import Callable

Sample = tuple[str, frozenset[tuple[str, str]]]

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r'(?:\{(?P<labels>(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\})?'
    r" (?P<value>[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|Inf|NaN))$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def wait_until(condition: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.01)


def parse_prometheus(text: str) -> dict[Sample, float]:
    """Every sample of a Prometheus text exposition; AssertionError on a malformed line."""
    samples: dict[Sample, float] = {}
    typed: dict[str, str] = {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert kind in {"counter", "gauge", "histogram", "summary", "untyped"}, line
            typed[name] = kind
            continue
        match = _SAMPLE.match(line)
        assert match is not None, f"malformed sample line: {line!r}"
        labels_text = match.group("labels") or ""
        labels = frozenset(_LABEL.findall(labels_text))
        rebuilt = ",".join(f'{k}="{v}"' for k, v in _LABEL.findall(labels_text))
        assert rebuilt == labels_text, f"malformed labels: {line!r}"
        name = match.group("name")
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or base in typed, f"sample without TYPE: {line!r}"
        samples[(name, labels)] = float(match.group("value").replace("Inf", "inf"))
    return samples


def sample(samples: dict[Sample, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)
