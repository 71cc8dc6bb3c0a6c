"""``/v1/messages`` through the official ``anthropic`` client, against a real server."""

from typing import Any

import anthropic
import httpx
import pytest

from exo.api.tests.scripted_node import TEXT, Script, ScriptedNode, ServedApp

DEADLINE_S = 10.0
USER: list[Any] = [{"role": "user", "content": "hi"}]


def client(server: ServedApp) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url, api_key="unused", max_retries=0, timeout=DEADLINE_S
    )


def test_message(server: ServedApp, node: ScriptedNode) -> None:
    message = client(server).messages.create(
        model="m1",
        max_tokens=100,
        system=[{"type": "text", "text": "be brief"}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        # This SDK version no longer has sampling arguments; the API still takes them.
        extra_body={"temperature": 0.4, "top_p": 0.9, "top_k": 20},
    )
    assert message.content[0].type == "text" and message.content[0].text == TEXT
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (11, 8)
    params = node.generations[-1].task_params
    assert params.input[0].role == "system" and params.input[0].content == "be brief"
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (
        0.4,
        0.9,
        20,
        100,
    )


def test_stop_reasons(server: ServedApp) -> None:
    claude = client(server)
    limited = claude.messages.create(model="m1", max_tokens=2, messages=USER)
    assert limited.stop_reason == "max_tokens"
    stopped = claude.messages.create(
        model="m1", max_tokens=100, messages=USER, stop_sequences=["world"]
    )
    assert stopped.stop_reason == "stop_sequence"
    assert stopped.stop_sequence == "world"
    assert stopped.content[0].type == "text" and stopped.content[0].text == "Hello, "


def test_streaming(server: ServedApp) -> None:
    claude = client(server)
    with claude.messages.stream(model="m1", max_tokens=100, system="s", messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == TEXT
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 8 and final.usage.input_tokens == 11
    events = [
        e.type for e in claude.messages.create(model="m1", max_tokens=3, messages=USER, stream=True)
    ]
    assert events[:2] == ["message_start", "content_block_start"]
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events.count("content_block_delta") == 3


def test_unknown_model_is_404(shared_server: ServedApp) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        client(shared_server).messages.create(model="nope", max_tokens=5, messages=USER)
    body: Any = info.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert "nope" in body["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m1", "messages": USER}, "max_tokens"),
        ({"model": "m1", "max_tokens": 5, "messages": USER, "temperature": 1.5}, "temperature"),
        ({"model": "m1", "max_tokens": -1, "messages": USER}, "max_tokens"),
        ({"model": "m1", "max_tokens": 5, "messages": "hi"}, "messages"),
    ],
)
def test_bad_requests_are_claude_errors(
    shared_server: ServedApp, body: dict[str, Any], param: str
) -> None:
    r = httpx.post(f"{shared_server.url}/v1/messages", json=body)
    assert r.status_code == 400
    error = r.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert param in error["error"]["message"]


def test_runner_failure_mid_stream_raises(server: ServedApp, node: ScriptedNode) -> None:
    node.script = Script(fail_after=2)
    claude = client(server)
    with (
        pytest.raises(anthropic.APIStatusError, match="runner died"),
        claude.messages.stream(model="m1", max_tokens=100, messages=USER) as stream,
    ):
        for _ in stream.text_stream:
            pass
    with pytest.raises(anthropic.APIStatusError) as info:
        claude.messages.create(model="m1", max_tokens=100, messages=USER)
    assert info.value.status_code == 502
