"""The OpenAI endpoints through the official ``openai`` client, against a real server."""

import threading
from typing import Any

import httpx
import openai
import pytest

from exo.api.tests.conftest import ServeFn
from exo.api.tests.scripted_node import TEXT, Script, ScriptedNode, ServedApp
from exo.shared.types.commands import CancelCommand, GenerateText, PlaceInstance

# Every blocking call in these tests ends within this many seconds, or fails.
DEADLINE_S = 10.0


def client(server: ServedApp) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=DEADLINE_S
    )


USER: list[Any] = [{"role": "user", "content": "hi"}]


def test_chat_completion(server: ServedApp, node: ScriptedNode) -> None:
    reply = client(server).chat.completions.create(
        model="m1", messages=USER, temperature=0.2, top_p=0.8, seed=7, max_tokens=100
    )
    choice = reply.choices[0]
    assert choice.message.content == TEXT
    assert choice.finish_reason == "stop"
    assert reply.model == "test-org/model-1"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (11, 8)
    params = node.generations[-1].task_params
    assert (params.temperature, params.top_p, params.seed, params.max_tokens) == (0.2, 0.8, 7, 100)
    # The first request placed an instance: exactly one PlaceInstance.
    assert sum(isinstance(c, PlaceInstance) for c in node.commands()) == 1


def test_chat_completion_streaming_with_usage(server: ServedApp) -> None:
    stream = client(server).chat.completions.create(
        model="m1", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == TEXT
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    usage = chunks[-1].usage
    assert usage is not None and usage.total_tokens == 19


def test_chat_max_tokens_and_stop(server: ServedApp) -> None:
    oa = client(server)
    short = oa.chat.completions.create(model="m1", messages=USER, max_tokens=3)
    assert short.choices[0].message.content == "Hello, world"
    assert short.choices[0].finish_reason == "length"
    stopped = oa.chat.completions.create(model="m1", messages=USER, stop=["world"])
    assert stopped.choices[0].message.content == "Hello, "
    assert stopped.choices[0].finish_reason == "stop"


def test_responses_api(server: ServedApp) -> None:
    oa = client(server)
    whole = oa.responses.create(model="m1", input="hi", instructions="be nice")
    assert whole.output_text == TEXT
    assert whole.status == "completed"
    assert whole.usage is not None and whole.usage.output_tokens == 8
    with oa.responses.stream(model="m1", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == TEXT
    assert final.output_text == TEXT
    limited = oa.responses.create(model="m1", input="hi", max_output_tokens=2)
    assert limited.status == "incomplete"
    assert limited.output_text == "Hello,"


def test_models_list(shared_server: ServedApp) -> None:
    ids = [m.id for m in client(shared_server).models.list()]
    assert "test-org/model-1" in ids and "HuggingFaceTB/SmolLM2-135M-Instruct" in ids
    assert client(shared_server).models.retrieve("test-org/model-1").id == "test-org/model-1"
    with pytest.raises(openai.NotFoundError):
        client(shared_server).models.retrieve("nope")


def test_unknown_model_is_404_naming_it(shared_server: ServedApp) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client(shared_server).chat.completions.create(model="no-such-model", messages=USER)
    message = str(info.value)
    assert "no-such-model" in message and "test-org/model-1" in message
    with pytest.raises(openai.NotFoundError):
        client(shared_server).responses.create(model="no-such-model", input="x")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 9}, "temperature"),
        ({"top_p": -1}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"frequency_penalty": 5}, "frequency_penalty"),
        ({"seed": "x"}, "seed"),
    ],
)
def test_bad_params_are_400_naming_the_param(
    shared_server: ServedApp, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(shared_server).chat.completions.create(model="m1", messages=USER, **extra)
    body: Any = info.value.body
    assert body["param"] == param
    assert body["type"] == "invalid_request_error"


def test_malformed_bodies_are_openai_errors(shared_server: ServedApp) -> None:
    url = f"{shared_server.url}/v1/chat/completions"
    for content in (b"{not json", b"[1, 2]", b""):
        r = httpx.post(url, content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400, content
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_runner_failure_mid_stream_raises(server: ServedApp, node: ScriptedNode) -> None:
    node.script = Script(fail_after=3)
    oa = client(server)
    received: list[str] = []
    with pytest.raises(openai.APIError, match="runner died"):
        for chunk in oa.chat.completions.create(model="m1", messages=USER, stream=True):
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "Hello, world"
    with pytest.raises(openai.APIStatusError) as info:
        oa.chat.completions.create(model="m1", messages=USER)
    assert info.value.status_code == 502
    events = list(oa.responses.create(model="m1", input="x", stream=True))
    assert events[-1].type == "response.failed"


def test_cancel_endpoint_stops_a_stream(server: ServedApp, node: ScriptedNode) -> None:
    node.script = Script(endless=True, token_delay_s=0.02)
    body = {"model": "m1", "messages": USER, "stream": True}
    with httpx.Client(base_url=server.url, timeout=DEADLINE_S) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            command_id = response.headers["x-exo-command-id"]
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            cancel = http.post(f"/v1/cancel/chatcmpl-{command_id}")
            assert cancel.status_code == 200, cancel.text
            rest = list(lines)
        assert rest[-2:] == ["data: [DONE]", ""] or rest[-1] == "data: [DONE]"
        assert any('"finish_reason":"stop"' in line for line in rest)
        node.wait_for_command(
            lambda c: isinstance(c, CancelCommand) and c.cancelled_command_id == command_id
        )
        missing = http.post("/v1/cancel/not-a-command")
        assert missing.status_code == 404
        assert "error" in missing.json()


def test_concurrent_first_requests_place_one_instance(serve: ServeFn) -> None:
    node = ScriptedNode(serve_after_s=0.3)
    server = serve(node, placement_timeout_s=5.0)
    oa = client(server)
    results: list[str | None] = []

    def ask() -> None:
        reply = oa.chat.completions.create(model="m1", messages=USER)
        results.append(reply.choices[0].message.content)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    assert results == [TEXT] * 4
    assert sum(isinstance(c, PlaceInstance) for c in node.commands()) == 1
    assert sum(isinstance(c, GenerateText) for c in node.commands()) == 4


def test_placement_failure_is_503_with_the_reason(server: ServedApp) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client(server).chat.completions.create(model="test-org/huge-model", messages=USER)
    assert info.value.status_code == 503
    assert "not enough memory" in str(info.value)


def test_placement_timeout_is_503(serve: ServeFn) -> None:
    node = ScriptedNode()
    node.never_serve = True
    server = serve(node, placement_timeout_s=0.3)
    with pytest.raises(openai.APIStatusError) as info:
        client(server).chat.completions.create(model="m1", messages=USER, stream=True)
    assert info.value.status_code == 503
    assert "became ready" in str(info.value)
