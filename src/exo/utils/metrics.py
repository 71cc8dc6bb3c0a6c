"""The node's Prometheus metrics, kept by ``prometheus_client`` in a registry of their own.

Thread-safe: any thread of the node (the API's event loop, the worker, a supervisor
thread) may update a metric while another renders them. ``render()`` returns the
Prometheus text exposition format (version 0.0.4) that ``/metrics`` serves.

    API_REQUESTS.labels(endpoint="/v1/models", status="200").inc()
    RUNNER_RESTARTS.inc()  # a metric without labels
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import disable_created_metrics as _disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# No `*_created` timestamp series: each metric is exposed as its name, buckets, sum and count.
_disable_created_metrics()

# Latency buckets in seconds: from a fast token (ms) to a slow first token (minutes).
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip

REGISTRY = CollectorRegistry()


def render() -> str:
    """Every metric of the node, in the Prometheus text format."""
    return generate_latest(REGISTRY).decode()


API_REQUESTS = Counter(
    "exo_api_requests_total",
    "HTTP requests answered, by endpoint and status",
    ("endpoint", "status"),
    registry=REGISTRY,
)
API_REQUEST_DURATION = Histogram(
    "exo_api_request_duration_seconds",
    "Time from a request's arrival to the end of its response",
    ("endpoint",),
    buckets=DEFAULT_BUCKETS,
    registry=REGISTRY,
)
TOKENS_GENERATED = Counter(
    "exo_tokens_generated_total", "Tokens generated for API clients", ("model",),
    registry=REGISTRY,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "exo_time_to_first_token_seconds",
    "Time from sending a generation to its first token",
    ("model",),
    buckets=DEFAULT_BUCKETS,
    registry=REGISTRY,
)
INTER_TOKEN_LATENCY = Histogram(
    "exo_inter_token_latency_seconds",
    "Time between consecutive tokens of one generation",
    ("model",),
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5),
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "exo_api_queue_depth", "Generation requests waiting for a free slot", registry=REGISTRY
)
ACTIVE_GENERATIONS = Gauge(
    "exo_api_active_generations", "Generation requests being served", registry=REGISTRY
)
RUNNER_RESTARTS = Counter(
    "exo_runner_restarts_total", "Runners re-created after a failure", registry=REGISTRY
)
CLUSTER_MESSAGES_REJECTED = Counter(
    "exo_cluster_messages_rejected_total",
    "Cluster messages refused: malformed, bad MAC, replayed, undecodable, other protocol version",
    ("reason",),
    registry=REGISTRY,
)
RUNNER_FAILURES = Counter("exo_runner_failures_total", "Runners that failed", registry=REGISTRY)
