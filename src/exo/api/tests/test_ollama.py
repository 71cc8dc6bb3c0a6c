"""The Ollama endpoints through the official ``ollama`` client, against a real server."""

import json
from typing import Any

import httpx
import ollama
import openai
import pytest

from exo.api.tests.scripted_node import TEXT, Script, ScriptedNode, ServedApp

USER: list[Any] = [{"role": "user", "content": "hi"}]


def client(server: ServedApp) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=10.0)


def test_chat(server: ServedApp, node: ScriptedNode) -> None:
    reply = client(server).chat(
        model="m1",
        messages=USER,
        stream=False,
        options={"temperature": 0.1, "num_predict": 50, "repeat_penalty": 1.3, "top_k": 9},
    )
    assert reply.message.content == TEXT
    assert reply.done and reply.done_reason == "stop"
    assert (reply.prompt_eval_count, reply.eval_count) == (11, 8)
    assert reply.total_duration is not None and reply.total_duration > 0
    params = node.generations[-1].task_params
    assert (params.temperature, params.max_tokens, params.repetition_penalty, params.top_k) == (
        0.1,
        50,
        1.3,
        9,
    )


def test_chat_streaming(server: ServedApp) -> None:
    parts = list(client(server).chat(model="m1", messages=USER, stream=True))
    assert "".join(p.message.content or "" for p in parts) == TEXT
    assert [p.done for p in parts].count(True) == 1
    final = parts[-1]
    assert final.done and final.eval_count == 8 and final.eval_duration is not None


def test_generate(server: ServedApp, node: ScriptedNode) -> None:
    ol = client(server)
    whole = ol.generate(model="m1", prompt="hi", system="sys", stream=False)
    assert whole.response == TEXT
    roles = [m.role for m in node.generations[-1].task_params.input]
    assert roles == ["system", "user"]
    parts = list(ol.generate(model="m1", prompt="hi", stream=True, options={"stop": ["world"]}))
    assert "".join(p.response or "" for p in parts) == "Hello, "
    limited = ol.generate(model="m1", prompt="hi", stream=False, options={"num_predict": 2})
    assert limited.done_reason == "length"


def test_streaming_is_the_default(server: ServedApp) -> None:
    r = httpx.post(f"{server.url}/api/generate", json={"model": "m1", "prompt": "hi"})
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert len(lines) == 9 and lines[-1]["done"] is True


def test_tagged_names_and_empty_prompt_load(server: ServedApp) -> None:
    ol = client(server)
    assert ol.generate(model="m1:latest", prompt="hi", stream=False).response == TEXT
    loaded = ol.generate(model="test-org/model-1")
    assert loaded.done and loaded.done_reason == "load"


def test_list_show_ps_version(server: ServedApp) -> None:
    ol = client(server)
    names = [m.model for m in ol.list().models]
    assert "test-org/model-1" in names
    shown = ol.show("m1")
    assert shown.details is not None and shown.details.family == "llama"
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 512
    assert ol.ps().models == []
    ol.generate(model="m1", prompt="hi", stream=False)
    assert [m.model for m in ol.ps().models] == ["test-org/model-1"]
    assert httpx.get(f"{server.url}/api/version").json()["version"]


def test_errors(server: ServedApp, node: ScriptedNode) -> None:
    ol = client(server)
    with pytest.raises(ollama.ResponseError) as info:
        ol.chat(model="nope", messages=USER, stream=False)
    assert info.value.status_code == 404 and "nope" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        ol.show("nope")
    assert info.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as info:
        ol.generate(model="m1", prompt="hi", stream=False, options={"temperature": 7})
    assert info.value.status_code == 400 and "options.temperature" in info.value.error
    r = httpx.post(f"{server.url}/api/chat", content=b"{")
    assert r.status_code == 400 and isinstance(r.json()["error"], str)


def test_runner_failure_mid_stream_raises(server: ServedApp, node: ScriptedNode) -> None:
    node.script = Script(fail_after=2)
    ol = client(server)
    with pytest.raises(ollama.ResponseError, match="runner died"):
        for _ in ol.chat(model="m1", messages=USER, stream=True):
            pass
    with pytest.raises(ollama.ResponseError) as info:
        ol.generate(model="m1", prompt="hi", stream=False)
    assert info.value.status_code == 502


def test_generate_context_reaches_the_task(server: ServedApp, node: ScriptedNode) -> None:
    ol = client(server)
    reply = ol.generate(model="m1", prompt="and then?", context=[1, 2, 3], stream=False)
    assert reply.response == TEXT
    params = node.generations[-1].task_params
    assert params.context_tokens == [1, 2, 3] and params.return_context
    assert params.input[-1].content == "and then?"
    ol.generate(model="m1", prompt="hi", stream=False)
    assert node.generations[-1].task_params.context_tokens == []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"context": [1, -1]}, "context.1"),
        ({"context": [1, 2.5]}, "context.1"),
        ({"context": [True]}, "context.0"),
        ({"context": ["7"]}, "context.0"),
        ({"context": 7}, "context"),
        ({"context": [1, 2], "raw": True}, "context: raw mode"),
        # The scripted model's context is 512 tokens.
        ({"context": list(range(512))}, "context: 512 tokens"),
        ({"context": list(range(8)), "options": {"num_ctx": 8}}, "context of 8 tokens"),
    ],
)
def test_bad_generate_context_is_a_400_naming_it(
    server: ServedApp, node: ScriptedNode, body: dict[str, Any], expected: str
) -> None:
    before = len(node.generations)
    r = httpx.post(
        f"{server.url}/api/generate", json={"model": "m1", "prompt": "hi", "stream": False, **body}
    )
    assert r.status_code == 400, r.text
    assert expected in r.json()["error"]
    assert len(node.generations) == before


def test_a_format_schema_is_closed_at_every_level(server: ServedApp, node: ScriptedNode) -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "string"}}},
            "c": {"type": "array", "items": {"type": "object", "properties": {"d": {}}}},
            "e": {"type": "object", "properties": {}, "additionalProperties": True},
            "f": {"type": "object"},
        },
        "$defs": {"g": {"type": "object", "properties": {"h": {"const": {"properties": 1}}}}},
    }
    client(server).generate(model="m1", prompt="hi", format=schema, stream=False)
    sent = json.loads(node.generations[-1].task_params.json_schema or "")
    assert sent["additionalProperties"] is False
    props = sent["properties"]
    assert props["a"]["additionalProperties"] is False
    assert props["c"]["items"]["additionalProperties"] is False
    assert props["e"]["additionalProperties"] is True  # the schema's own word stands
    assert "additionalProperties" not in props["f"]  # no properties: any object
    g = sent["$defs"]["g"]
    assert g["additionalProperties"] is False and g["properties"]["h"] == {"const": {"properties": 1}}
    # OpenAI's response_format keeps the schema as it is.
    oa = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    oa.chat.completions.create(
        model="m1",
        messages=[{"role": "user", "content": "hi"}],
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    assert json.loads(node.generations[-1].task_params.json_schema or "") == schema
