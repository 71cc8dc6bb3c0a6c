"""What clients send that is not quite the spec, and what must still be refused:
explicit nulls, Ollama bodies without a JSON content type, foreign Host and Origin."""

import json
from typing import Any

import httpx
import pytest

from exo.api.request_guard import RequestGuard, is_json, split_host
from exo.api.tests.conftest import ServeFn
from exo.api.tests.scripted_node import TEXT, ScriptedNode, ServedApp

USER: list[Any] = [{"role": "user", "content": "hi"}]


def test_explicit_null_means_the_default(server: ServedApp, node: ScriptedNode) -> None:
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={
            "model": "m1",
            "messages": USER,
            "n": None,
            "stream": None,
            "stream_options": {"include_usage": None},
            "temperature": None,
            "stop": None,
            "tools": None,
        },
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == TEXT
    r = httpx.post(
        f"{server.url}/v1/messages",
        json={
            "model": "m1",
            "max_tokens": 20,
            "messages": USER,
            "stop_sequences": None,
            "stream": None,
            "system": None,
        },
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == TEXT
    r = httpx.post(
        f"{server.url}/api/chat",
        json={"model": "m1", "messages": USER, "stream": None, "options": None},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    # stream null is the default: a stream for Ollama.
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert lines[-1]["done"] is True


def test_null_for_a_required_field_names_it(shared_server: ServedApp) -> None:
    r = httpx.post(
        f"{shared_server.url}/v1/chat/completions", json={"model": None, "messages": USER}
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "model"


def test_ollama_body_without_json_content_type(server: ServedApp) -> None:
    body = json.dumps({"model": "m1", "prompt": "hi", "stream": False})
    # What `curl -d` sends.
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = httpx.post(f"{server.url}/api/generate", content=body, headers=form, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["response"] == TEXT
    r = httpx.post(f"{server.url}/api/generate", content=body, timeout=10)
    assert r.status_code == 200, r.text
    # A browser page's "simple" cross-site POST is refused, even from an allowed origin.
    page = {**form, "origin": f"{server.url}"}
    r = httpx.post(f"{server.url}/api/generate", content=body, headers=page, timeout=10)
    assert r.status_code == 415
    assert "application/json" in r.json()["error"]


def test_foreign_host_is_refused(shared_server: ServedApp) -> None:
    port = shared_server.port
    for host in ("evil.example", f"evil.example:{port}", "192.0.2.1"):
        r = httpx.get(f"{shared_server.url}/v1/models", headers={"host": host})
        assert r.status_code == 403, host
        assert "not this node" in r.json()["error"]["message"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "app.localhost", "[::1]:1"):
        r = httpx.get(f"{shared_server.url}/v1/models", headers={"host": host})
        assert r.status_code == 200, host


def test_foreign_origin_is_refused(shared_server: ServedApp) -> None:
    r = httpx.post(
        f"{shared_server.url}/v1/chat/completions",
        json={"model": "m1", "messages": USER},
        headers={"origin": "http://evil.example"},
    )
    assert r.status_code == 403
    assert "--cors-origin" in r.json()["error"]["message"]
    r = httpx.get(f"{shared_server.url}/api/tags", headers={"origin": "null"})
    assert r.status_code == 403 and "error" in r.json()
    # The node's own pages (same origin) may call it.
    r = httpx.get(f"{shared_server.url}/v1/models", headers={"origin": shared_server.url})
    assert r.status_code == 200


def test_allowed_origin_passes(serve: ServeFn, node: ScriptedNode) -> None:
    server = serve(node, cors_origins=["http://app.example"])
    r = httpx.get(f"{server.url}/v1/models", headers={"origin": "http://app.example"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://app.example"


@pytest.mark.parametrize(
    ("value", "host"),
    [("a.b:80", "a.b"), ("[::1]:5", "::1"), ("::1", "::1"), ("LOCALHOST", "localhost")],
)
def test_split_host(value: str, host: str) -> None:
    assert split_host(value) == host


def test_wildcard_bind_accepts_own_addresses_only() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:  # never called
        raise AssertionError

    guard = RequestGuard(app, "0.0.0.0", [])
    assert guard.host_allowed("127.0.0.1:1")
    assert not guard.host_allowed("attacker.example")
    bound = RequestGuard(app, "192.0.2.7", [])
    assert bound.host_allowed("192.0.2.7:52415")
    assert not bound.host_allowed("192.0.2.8:52415")


def test_is_json() -> None:
    assert is_json("application/json; charset=utf-8")
    assert is_json("application/vnd.api+json")
    assert not is_json("text/plain")
    assert not is_json(None)
