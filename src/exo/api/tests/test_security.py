"""API key and CORS."""

from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from exo.api.settings import ApiSettings
from exo.api.tests.conftest import ServeFn
from exo.api.tests.scripted_node import TEXT, ScriptedNode, ServedApp

KEY = "s3cret-key"
USER: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.fixture
def locked(serve: ServeFn, node: ScriptedNode) -> ServedApp:
    return serve(node, api_key=KEY)


def test_defaults_are_local_and_open() -> None:
    settings = ApiSettings()
    assert settings.host == "127.0.0.1"
    assert settings.port == 52415
    assert settings.api_key is None and settings.cors_origins == []
    assert ApiSettings(api_key="").api_key is None


def test_missing_or_wrong_key_is_401_in_each_format(locked: ServedApp) -> None:
    for key in ("wrong", None):
        headers = {} if key is None else {"authorization": f"Bearer {key}"}
        r = httpx.get(f"{locked.url}/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = httpx.post(f"{locked.url}/v1/messages", json={}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = httpx.get(f"{locked.url}/api/tags", headers=headers)
        assert r.status_code == 401 and isinstance(r.json()["error"], str)
        r = httpx.get(f"{locked.url}/state", headers=headers)
        assert r.status_code == 401 and "API key" in r.json()["detail"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{locked.url}/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=locked.url, api_key="wrong", max_retries=0).messages.create(
            model="m1", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=locked.url).list()
    assert info.value.status_code == 401


def test_right_key_works_either_way_and_health_is_open(locked: ServedApp) -> None:
    oa = openai.OpenAI(base_url=f"{locked.url}/v1", api_key=KEY, max_retries=0)
    reply = oa.chat.completions.create(model="m1", messages=USER)
    assert reply.choices[0].message.content == TEXT
    claude = anthropic.Anthropic(base_url=locked.url, api_key=KEY, max_retries=0)
    message = claude.messages.create(
        model="m1", max_tokens=50, messages=[{"role": "user", "content": "x"}]
    )
    assert message.content[0].type == "text" and message.content[0].text == TEXT
    ol = ollama.Client(host=locked.url, headers={"Authorization": f"Bearer {KEY}"})
    assert ol.list().models
    assert httpx.get(f"{locked.url}/metrics", headers={"x-api-key": KEY}).status_code == 200
    assert httpx.get(f"{locked.url}/metrics").status_code == 401
    assert httpx.get(f"{locked.url}/health").status_code == 200


def test_cors_is_off_by_default(server: ServedApp) -> None:
    origin = {"origin": "http://example.test"}
    r = httpx.get(f"{server.url}/v1/models", headers=origin)
    # A cross-site request to a node that allows no origin is refused.
    assert r.status_code == 403
    assert "access-control-allow-origin" not in r.headers
    assert httpx.get(f"{server.url}/v1/models").status_code == 200
    preflight = httpx.options(
        f"{server.url}/v1/chat/completions",
        headers={**origin, "access-control-request-method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers


def test_cors_allows_configured_origins_only(serve: ServeFn, node: ScriptedNode) -> None:
    server = serve(node, cors_origins=["http://example.test"], api_key=KEY)
    preflight = httpx.options(
        f"{server.url}/v1/chat/completions",
        headers={
            "origin": "http://example.test",
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://example.test"
    r = httpx.get(
        f"{server.url}/v1/models",
        headers={"origin": "http://example.test", "authorization": f"Bearer {KEY}"},
    )
    assert r.headers["access-control-allow-origin"] == "http://example.test"
    other = httpx.get(
        f"{server.url}/v1/models",
        headers={"origin": "http://evil.test", "authorization": f"Bearer {KEY}"},
    )
    assert "access-control-allow-origin" not in other.headers
    assert other.status_code == 403
