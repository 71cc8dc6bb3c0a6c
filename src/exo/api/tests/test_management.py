"""exo's own endpoints, unknown routes, and the metrics they expose."""

from typing import Any

import httpx
import openai
import pytest

from exo.api.tests.helpers import parse_prometheus, sample
from exo.api.tests.scripted_node import NODE_ID, ScriptedNode, ServedApp
from exo.shared.types.commands import DeleteInstance, PlaceInstance


def http(server: ServedApp) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=10.0)


def test_health_node_id_models(server: ServedApp) -> None:
    with http(server) as c:
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/node_id").json() == NODE_ID
        models = c.get("/models").json()
        assert {m["model_id"] for m in models} >= {"test-org/model-1"}
        assert all("n_layers" in m and "storage_size" in m for m in models)


def test_state_shows_a_placed_instance(server: ServedApp) -> None:
    with http(server) as c:
        assert c.get("/state").json()["instances"] == {}
        r = c.post("/place_instance", json={"model": "m1"})
        assert r.status_code == 200, r.text
        assert r.json()["node_count"] == 1
        state = c.get("/state").json()
        [(instance_id, instance)] = state["instances"].items()
        assert instance["shard_assignments"]["model_id"] == "test-org/model-1"
        assert NODE_ID in state["nodes"]
        view = c.get(f"/instance/{instance_id}").json()
        assert view["instance"]["instance_id"] == instance_id
        assert set(view) == {"instance", "runners", "serving"}


def test_previews_say_where_a_model_fits_and_why_not(server: ServedApp) -> None:
    with http(server) as c:
        previews = c.get("/instance/previews", params={"model": "m1"}).json()["previews"]
        valid = [p for p in previews if p["valid"]]
        assert valid and all(p["memory_per_node"][NODE_ID] > 0 for p in valid)
        huge = c.get("/instance/previews", params={"model": "test-org/huge-model"}).json()
        assert huge["previews"] and not any(p["valid"] for p in huge["previews"])
        assert all("not enough memory" in p["reason"] for p in huge["previews"])
        assert c.get("/instance/previews", params={"model": "nope"}).status_code == 404
        missing = c.get("/instance/previews")
        assert missing.status_code == 400 and "model" in missing.json()["detail"]


def test_place_instance_validates_first(server: ServedApp, node: ScriptedNode) -> None:
    with http(server) as c:
        huge = c.post("/place_instance", json={"model": "test-org/huge-model"})
        assert huge.status_code == 409 and "not enough memory" in huge.json()["detail"]
        wide = c.post("/place_instance", json={"model": "m1", "min_nodes": 2})
        assert wide.status_code == 409 and "min_nodes" in wide.json()["detail"]
        bad = c.post("/place_instance", json={"model": "m1", "sharding": "diagonal"})
        assert bad.status_code == 400 and "sharding" in bad.json()["detail"]
        ok = c.post("/place_instance", json={"model": "m1", "sharding": "tensor"})
        assert ok.status_code == 200
    placed = [c for c in node.commands() if isinstance(c, PlaceInstance)]
    assert len(placed) == 1 and placed[0].sharding == "tensor"


def test_instance_get_and_delete(server: ServedApp, node: ScriptedNode) -> None:
    with http(server) as c:
        assert c.get("/instance/unknown").status_code == 404
        assert c.delete("/instance/unknown").status_code == 404
        c.post("/place_instance", json={"model": "m1"})
        [instance_id] = c.get("/state").json()["instances"]
        r = c.delete(f"/instance/{instance_id}")
        assert r.status_code == 200 and r.json()["instance_id"] == instance_id
        assert c.get(f"/instance/{instance_id}").status_code == 404
    assert any(isinstance(cmd, DeleteInstance) for cmd in node.commands())


def error_format(body: Any) -> str:
    """Which API family an error body is in."""
    if isinstance(body.get("error"), str):
        return "ollama"
    if body.get("type") == "error":
        return "claude"
    if isinstance(body.get("error"), dict):
        return "openai"
    return "exo" if "detail" in body else "unknown"


@pytest.mark.parametrize(
    ("path", "family"),
    [
        ("/v1/nothing", "openai"),
        ("/v1/messages/nothing", "claude"),
        ("/api/nothing", "ollama"),
        ("/nothing", "exo"),
    ],
)
def test_unknown_routes_are_json_404(shared_server: ServedApp, path: str, family: str) -> None:
    r = httpx.get(f"{shared_server.url}{path}")
    assert r.status_code == 404
    assert error_format(r.json()) == family


def test_wrong_method_is_json_405(shared_server: ServedApp) -> None:
    r = httpx.get(f"{shared_server.url}/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_metrics_count_requests_and_tokens(server: ServedApp) -> None:
    with http(server) as c:
        before = parse_prometheus(c.get("/metrics").text)
        oa = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        oa.chat.completions.create(model="m1", messages=[{"role": "user", "content": "x"}])
        c.get("/v1/nothing")
        r = c.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain")
        after = parse_prometheus(r.text)
    chat = {"endpoint": "/v1/chat/completions", "status": "200"}
    assert sample(after, "exo_api_requests_total", **chat) == (
        sample(before, "exo_api_requests_total", **chat) + 1
    )
    missing = {"endpoint": "unmatched", "status": "404"}
    assert sample(after, "exo_api_requests_total", **missing) >= 1
    model = {"model": "test-org/model-1"}
    assert sample(after, "exo_tokens_generated_total", **model) == (
        sample(before, "exo_tokens_generated_total", **model) + 8
    )
    assert sample(after, "exo_time_to_first_token_seconds_count", **model) > sample(
        before, "exo_time_to_first_token_seconds_count", **model
    )
    assert sample(after, "exo_inter_token_latency_seconds_count", **model) >= 7
    for name in ("exo_runner_restarts_total", "exo_runner_failures_total", "exo_api_queue_depth"):
        assert (name, frozenset()) in after
