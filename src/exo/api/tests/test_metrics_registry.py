"""The Prometheus registry: text format, labels, histograms, thread safety."""

import threading

import pytest

from exo.api.tests.helpers import parse_prometheus, sample
from exo.utils.metrics import Registry


def test_counter_with_labels_renders_and_parses() -> None:
    registry = Registry()
    requests = registry.counter("x_requests_total", "Requests", ("endpoint", "status"))
    requests.labels(endpoint="/a", status="200").inc()
    requests.labels(endpoint="/a", status="200").inc(2)
    requests.labels(endpoint="/b", status="404").inc()
    text = registry.render()
    assert "# TYPE x_requests_total counter" in text
    samples = parse_prometheus(text)
    assert sample(samples, "x_requests_total", endpoint="/a", status="200") == 3
    assert sample(samples, "x_requests_total", endpoint="/b", status="404") == 1
    assert requests.value(endpoint="/a", status="200") == 3


def test_metric_without_labels_starts_at_zero() -> None:
    registry = Registry()
    restarts = registry.counter("x_restarts_total", "Restarts")
    samples = parse_prometheus(registry.render())
    assert sample(samples, "x_restarts_total") == 0
    restarts.inc()
    assert sample(parse_prometheus(registry.render()), "x_restarts_total") == 1


def test_gauge_goes_both_ways() -> None:
    registry = Registry()
    depth = registry.gauge("x_depth", "Depth")
    depth.inc()
    depth.inc()
    depth.dec()
    assert depth.value() == 1
    depth.set(7.5)
    assert sample(parse_prometheus(registry.render()), "x_depth") == 7.5


def test_histogram_buckets_are_cumulative() -> None:
    registry = Registry()
    latency = registry.histogram("x_seconds", "Latency", ("model",), buckets=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        latency.labels(model="m").observe(value)
    samples = parse_prometheus(registry.render())
    assert sample(samples, "x_seconds_bucket", model="m", le="0.1") == 2
    assert sample(samples, "x_seconds_bucket", model="m", le="1") == 3
    assert sample(samples, "x_seconds_bucket", model="m", le="+Inf") == 4
    assert sample(samples, "x_seconds_count", model="m") == 4
    assert sample(samples, "x_seconds_sum", model="m") == pytest.approx(3.65)
    assert latency.count(model="m") == 4


def test_label_values_are_escaped() -> None:
    registry = Registry()
    counter = registry.counter("x_total", "Help with \\ and\nnewline", ("path",))
    counter.labels(path='a"b\\c\nd').inc()
    text = registry.render()
    assert 'path="a\\"b\\\\c\\nd"' in text
    assert "# HELP x_total Help with \\\\ and\\nnewline" in text
    parse_prometheus(text)


def test_registering_twice_gives_the_same_metric_or_refuses_a_conflict() -> None:
    registry = Registry()
    first = registry.counter("x_total", "X", ("a",))
    assert registry.counter("x_total", "X", ("a",)) is first
    with pytest.raises(ValueError):
        registry.gauge("x_total", "X", ("a",))
    with pytest.raises(ValueError):
        registry.counter("x_total", "X", ("b",))


def test_misuse_is_refused() -> None:
    registry = Registry()
    counter = registry.counter("x_total", "X", ("a",))
    with pytest.raises(ValueError):
        counter.labels(a="1").inc(-1)
    with pytest.raises(ValueError):
        counter.labels(b="1")
    with pytest.raises(ValueError):
        counter.inc()  # labels required
    with pytest.raises(ValueError):
        registry.counter("bad name", "X")
    with pytest.raises(ValueError):
        registry.histogram("x_h", "X", ("le",))


def test_updates_from_many_threads_are_not_lost() -> None:
    registry = Registry()
    counter = registry.counter("x_total", "X", ("t",))
    histogram = registry.histogram("x_h", "X")
    per_thread = 2000

    def work(i: int) -> None:
        child = counter.labels(t=str(i % 2))
        for _ in range(per_thread):
            child.inc()
            histogram.observe(0.01)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.value(t="0") + counter.value(t="1") == 8 * per_thread
    assert histogram.count() == 8 * per_thread
