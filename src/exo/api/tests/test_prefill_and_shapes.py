"""A final assistant message is continued (Claude, Ollama) and not in OpenAI chat; a model
without a chat template says so in /api/show; Ollama refuses thinking of a model that
cannot think; lone surrogates and the bare API roots answer in each API's error shape."""

from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from exo.api.tests.scripted_node import ScriptedNode, ServedApp
from exo.api.unicode_guard import body_error

COUNT: list[Any] = [
    {"role": "user", "content": "Count from 1 to 10."},
    {"role": "assistant", "content": "1, 2, 3, 4,"},
]


def _continued(node: ScriptedNode) -> bool:
    return node.generations[-1].task_params.continue_final_message


def test_claude_and_ollama_continue_a_prefill_openai_does_not(
    server: ServedApp, node: ScriptedNode
) -> None:
    claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    claude.messages.create(model="m1", max_tokens=8, messages=COUNT)
    assert _continued(node)
    claude.messages.create(model="m1", max_tokens=8, messages=COUNT[:1])
    assert not _continued(node)
    ollama.Client(host=server.url).chat(model="m1", messages=COUNT, stream=False)
    assert _continued(node)
    oa = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    oa.chat.completions.create(model="m1", messages=COUNT)
    assert not _continued(node)


def test_a_final_tool_call_is_not_a_prefill(server: ServedApp, node: ScriptedNode) -> None:
    call = {"function": {"name": "f", "arguments": {}}}
    messages = [COUNT[0], {"role": "assistant", "content": "", "tool_calls": [call]}]
    ollama.Client(host=server.url).chat(model="m1", messages=messages, stream=False)
    assert not _continued(node)


def test_show_states_the_plain_rendering_of_a_model_without_template(server: ServedApp) -> None:
    ol = ollama.Client(host=server.url)
    plain = ol.show("m1")
    assert plain.modelfile is not None and "no chat template" in plain.modelfile
    assert plain.template is not None and "Assistant:" in plain.template
    assert plain.capabilities is not None and "thinking" not in plain.capabilities
    embedded = ol.show("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert embedded.template is not None and "<|im_start|>" in embedded.template
    assert embedded.modelfile is not None and "no chat template" not in embedded.modelfile


def test_ollama_refuses_thinking_of_a_model_that_cannot_think(server: ServedApp) -> None:
    ol = ollama.Client(host=server.url)
    for call in (
        lambda: ol.chat(model="m1", messages=COUNT[:1], think=True, stream=False),
        lambda: ol.generate(model="m1", prompt="hi", think=True, stream=False),
    ):
        with pytest.raises(ollama.ResponseError) as info:
            call()
        assert info.value.status_code == 400
        assert info.value.error == '"m1" does not support thinking'
    # Not asking for it is fine.
    assert ol.chat(model="m1", messages=COUNT[:1], think=False, stream=False).message.content


LONE = b"\\ud800"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", b'{"model": "m1", "messages": [{"role": "user", "content": "a%s"}]}'),
        ("/v1/responses", b'{"model": "m1", "input": "%s"}'),
        ("/v1/completions", b'{"model": "m1", "prompt": "%s"}'),
        ("/v1/embeddings", b'{"model": "m1", "input": "%s"}'),
        ("/v1/messages", b'{"model": "m1", "max_tokens": 5, "messages": [{"role": "user", "content": "%s"}]}'),
        ("/api/chat", b'{"model": "m1", "stream": false, "messages": [{"role": "user", "content": "%s"}]}'),
        ("/api/generate", b'{"model": "m1", "stream": false, "prompt": "%s"}'),
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_a_400_in_the_apis_shape(
    shared_server: ServedApp, path: str, body: bytes
) -> None:
    r = httpx.post(
        shared_server.url + path,
        content=body % LONE,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400, r.text
    payload = r.json()
    if path.startswith("/api/"):
        message = payload["error"]
    elif path == "/v1/messages":
        assert payload["type"] == "error"
        message = payload["error"]["message"]
    else:
        message = payload["error"]["message"]
        assert payload["error"]["code"] == "invalid_unicode"
    assert "surrogate" in message


def test_paired_surrogates_and_raw_surrogate_bytes() -> None:
    # An emoji written as a pair of escapes (as json.dumps writes it) is text.
    assert body_error(b'{"content": "\\ud83d\\ude00"}') is None
    # A surrogate in raw (CESU-like) bytes is as invalid as its escape.
    error = body_error(b'{"messages": [{"content": "a\xed\xa0\x80"}]}')
    assert error is not None and error.param == "messages.0.content"
    assert body_error(b"not json \\ud800") is None  # the route reports bad JSON


def test_a_surrogate_pair_goes_through(shared_server: ServedApp) -> None:
    body = b'{"model": "m1", "stream": false, "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    r = httpx.post(shared_server.url + "/api/chat", content=body)
    assert r.status_code == 200, r.text


def test_the_api_roots_answer_in_their_own_shape(shared_server: ServedApp) -> None:
    openai_root = httpx.get(shared_server.url + "/v1").json()
    assert openai_root["error"]["type"] == "not_found_error"
    assert isinstance(httpx.get(shared_server.url + "/api").json()["error"], str)


def test_deeply_nested_bodies_with_a_surrogate_are_400(shared_server: ServedApp) -> None:
    head = b'{"model": "m1", "messages": [{"role": "user", "content": "hi"}], "x": '
    for depth in (900, 5000):  # one json decodes, one too deep for it
        body = head + b"[" * depth + b'"\\ud800"' + b"]" * depth + b"}"
        r = httpx.post(shared_server.url + "/v1/chat/completions", content=body)
        assert r.status_code == 400, r.text[:300]
        assert r.json()["error"]["message"]
