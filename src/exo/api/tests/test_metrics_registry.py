"""The node's metrics as /metrics exposes them: names, types, labels, and a text that
Prometheus (and our parser) reads. The registry itself is prometheus_client's."""

import threading

import pytest

from exo.api.tests.helpers import parse_prometheus, sample
from exo.utils import metrics

# Every metric the node exposes: what dashboards and alerts are written against.
EXPECTED = {
    "exo_api_requests_total": ("counter", ("endpoint", "status")),
    "exo_api_request_duration_seconds": ("histogram", ("endpoint",)),
    "exo_tokens_generated_total": ("counter", ("model",)),
    "exo_time_to_first_token_seconds": ("histogram", ("model",)),
    "exo_inter_token_latency_seconds": ("histogram", ("model",)),
    "exo_api_queue_depth": ("gauge", ()),
    "exo_api_active_generations": ("gauge", ()),
    "exo_runner_restarts_total": ("counter", ()),
    "exo_runner_failures_total": ("counter", ()),
    "exo_cluster_messages_rejected_total": ("counter", ("reason",)),
}


def _types(text: str) -> dict[str, str]:
    return {
        line.split(" ")[2]: line.split(" ")[3]
        for line in text.splitlines()
        if line.startswith("# TYPE ")
    }


def test_the_node_exposes_exactly_its_metrics_with_their_types() -> None:
    assert _types(metrics.render()) == {name: kind for name, (kind, _) in EXPECTED.items()}


def test_metrics_take_exactly_their_labels() -> None:
    metrics.API_REQUESTS.labels(endpoint="/labels-check", status="200").inc()
    metrics.CLUSTER_MESSAGES_REJECTED.labels(reason="labels-check").inc()
    for name, labels in (
        ("exo_api_requests_total", {"endpoint": "/labels-check", "status": "200"}),
        ("exo_cluster_messages_rejected_total", {"reason": "labels-check"}),
    ):
        assert sample(parse_prometheus(metrics.render()), name, **labels) == 1
        assert tuple(sorted(labels)) == tuple(sorted(EXPECTED[name][1]))
    # Wrong or missing labels are refused, not exposed as a new series.
    with pytest.raises(ValueError):
        metrics.API_REQUESTS.labels(endpoint="/x")
    with pytest.raises(ValueError):
        metrics.TOKENS_GENERATED.inc()
    with pytest.raises(ValueError):
        metrics.TOKENS_GENERATED.labels(model="m").inc(-1)


def test_unlabelled_metrics_start_at_zero_and_counters_only_go_up() -> None:
    samples = parse_prometheus(metrics.render())
    for name, (kind, labels) in EXPECTED.items():
        if not labels and kind != "histogram":
            assert (name, frozenset()) in samples, name
    before = sample(samples, "exo_runner_restarts_total")
    metrics.RUNNER_RESTARTS.inc()
    assert sample(parse_prometheus(metrics.render()), "exo_runner_restarts_total") == before + 1


def test_histogram_buckets_are_cumulative_and_parse() -> None:
    model = {"model": "test-org/histogram-check"}
    for value in (0.004, 0.005, 0.5, 500.0):
        metrics.TIME_TO_FIRST_TOKEN.labels(**model).observe(value)
    samples = parse_prometheus(metrics.render())
    bucket = "exo_time_to_first_token_seconds_bucket"
    assert sample(samples, bucket, **model, le="0.005") == 2
    assert sample(samples, bucket, **model, le="0.5") == 3
    assert sample(samples, bucket, **model, le="120.0") == 3
    assert sample(samples, bucket, **model, le="+Inf") == 4
    assert sample(samples, "exo_time_to_first_token_seconds_count", **model) == 4
    assert sample(samples, "exo_time_to_first_token_seconds_sum", **model) == pytest.approx(500.509)


def test_label_values_are_escaped() -> None:
    metrics.TOKENS_GENERATED.labels(model='a"b\\c\nd').inc(3)
    text = metrics.render()
    assert 'model="a\\"b\\\\c\\nd"' in text
    assert sample(parse_prometheus(text), "exo_tokens_generated_total", model='a\\"b\\\\c\\nd') == 3


def test_updates_from_many_threads_are_not_lost() -> None:
    per_thread = 2000
    endpoint = "/threads-check"

    def work(i: int) -> None:
        child = metrics.API_REQUESTS.labels(endpoint=endpoint, status=str(200 + i % 2))
        for _ in range(per_thread):
            child.inc()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    samples = parse_prometheus(metrics.render())
    total = sum(
        sample(samples, "exo_api_requests_total", endpoint=endpoint, status=status)
        for status in ("200", "201")
    )
    assert total == 8 * per_thread
