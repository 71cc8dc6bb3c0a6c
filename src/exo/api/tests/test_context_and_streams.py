"""Context limits, prompt counts, keep-alive, stop sequences and n choices, through the
official clients against a real server over a scripted node."""

import json
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from exo.api.generation_events import ChunkTranslator, Finished, TextDelta
from exo.api.tests.conftest import ServeFn
from exo.api.tests.scripted_node import PROMPT_TOKENS, TEXT, Script, ScriptedNode, ServedApp
from exo.shared.models.model_cards import ModelId
from exo.shared.types.chunks import TokenChunk, Usage

DEADLINE_S = 10.0
USER: list[Any] = [{"role": "user", "content": "hi"}]


def oa(server: ServedApp) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=DEADLINE_S
    )


def claude(server: ServedApp) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url, api_key="unused", max_retries=0, timeout=DEADLINE_S
    )


@pytest.fixture
def too_long(server: ServedApp, node: ScriptedNode) -> ServedApp:
    node.script = Script(prompt_tokens=600, context_length=512)
    return server


def test_context_length_exceeded_is_an_openai_400(too_long: ServedApp) -> None:
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            reply = oa(too_long).chat.completions.create(model="m1", messages=USER, stream=stream)
            list(reply) if stream else None  # type: ignore[call-overload]
        body: Any = info.value.body
        assert body["code"] == "context_length_exceeded"
        assert body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as info:
        oa(too_long).responses.create(model="m1", input="hi", stream=True)
    body = info.value.body
    assert body["code"] == "context_length_exceeded"


def test_context_length_exceeded_is_a_claude_and_ollama_400(too_long: ServedApp) -> None:
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as info:
            claude(too_long).messages.create(model="m1", max_tokens=5, messages=USER, stream=stream)
        body: Any = info.value.body
        assert body["error"]["type"] == "invalid_request_error"
    for stream in (False, True):
        with pytest.raises(ollama.ResponseError) as ol_info:
            reply = ollama.Client(host=too_long.url).chat(model="m1", messages=USER, stream=stream)
            if stream:
                list(reply)  # type: ignore[arg-type]
        assert ol_info.value.status_code == 400
        assert "600" in ol_info.value.error


def test_num_ctx_reaches_the_runner(server: ServedApp, node: ScriptedNode) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=server.url).generate(
            model="m1", prompt="hi", stream=False, options={"num_ctx": 8}
        )
    assert info.value.status_code == 400
    assert node.generations[-1].task_params.num_ctx == 8


def test_claude_stream_starts_with_the_real_input_tokens(server: ServedApp) -> None:
    with claude(server).messages.stream(model="m1", max_tokens=50, messages=USER) as stream:
        events = list(stream)
        final = stream.get_final_message()
    start = next(e for e in events if e.type == "message_start")
    assert start.message.usage.input_tokens == PROMPT_TOKENS
    assert final.usage.input_tokens == PROMPT_TOKENS


def test_count_tokens(server: ServedApp, node: ScriptedNode) -> None:
    counted = claude(server).messages.count_tokens(model="m1", messages=USER, system="be brief")
    assert counted.input_tokens == PROMPT_TOKENS
    params = node.generations[-1].task_params
    assert params.count_only and params.input[0].content == "be brief"


def test_served_card_tells_the_runners_context(shared_server: ServedApp) -> None:
    # The embedded model's file says 8192; a runner holds 2048 positions.
    info = ollama.Client(host=shared_server.url).show("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert info.modelinfo is not None
    assert info.modelinfo["llama.context_length"] == 2048


def test_keep_alive_while_waiting_for_the_model(serve: ServeFn) -> None:
    node = ScriptedNode(serve_after_s=0.6)
    server = serve(node, placement_timeout_s=5.0, keep_alive_interval_s=0.1)
    body = {"model": "m1", "messages": USER, "stream": True}
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, timeout=DEADLINE_S
    ) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert first_data >= 2 and all(line == ": keep-alive" for line in lines[:first_data])
    # The SDK ignores the comments.
    node2 = ScriptedNode(serve_after_s=0.4)
    server2 = serve(node2, placement_timeout_s=5.0, keep_alive_interval_s=0.1)
    chunks = list(oa(server2).chat.completions.create(model="m1", messages=USER, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT


def test_context_error_after_keep_alive_is_an_event(serve: ServeFn) -> None:
    node = ScriptedNode(serve_after_s=0.4, script=Script(prompt_tokens=600, context_length=512))
    server = serve(node, placement_timeout_s=5.0, keep_alive_interval_s=0.1)
    body = {"model": "m1", "max_tokens": 5, "messages": USER, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/messages", json=body, timeout=DEADLINE_S) as r:
        text = r.read().decode()
    assert r.status_code == 200
    assert "event: error" in text and "invalid_request_error" in text


def test_n_choices(server: ServedApp, node: ScriptedNode) -> None:
    reply = oa(server).chat.completions.create(model="m1", messages=USER, n=3, seed=5)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content == TEXT for c in reply.choices)
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (PROMPT_TOKENS, 24)
    assert [g.task_params.seed for g in node.generations[-3:]] == [5, 6, 7]
    stream = oa(server).chat.completions.create(
        model="m1", messages=USER, n=2, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    texts = ["", ""]
    finishes: list[int] = []
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                finishes.append(choice.index)
    assert texts == [TEXT, TEXT] and finishes == [0, 1]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16


def test_too_many_choices_is_400(shared_server: ServedApp) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oa(shared_server).chat.completions.create(model="m1", messages=USER, n=1000)
    body: Any = info.value.body
    assert body["param"] == "n"


def test_runner_reported_stop_sequence_ends_with_it() -> None:
    translator = ChunkTranslator(["END"], 0, 0)
    model = ModelId("m")
    first = TokenChunk(model=model, text="ab", token_id=1, idx=0, prompt_tokens=7)
    assert translator.feed(first, 1) == [TextDelta("ab")]
    last = TokenChunk(
        model=model,
        text="c",
        token_id=2,
        idx=1,
        finish_reason="stop",
        usage=Usage(prompt_tokens=7, completion_tokens=3),
        stop_sequence="END",
    )
    events = translator.feed(last, 2)
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert (finished.reason, finished.stop_sequence) == ("stop_sequence", "END")
    assert translator.prompt_tokens == 7


def test_claude_stop_sequence_from_the_api_side(server: ServedApp) -> None:
    message = claude(server).messages.create(
        model="m1", max_tokens=50, messages=USER, stop_sequences=["world"]
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "world"
    assert message.content[0].type == "text" and message.content[0].text == "Hello, "
    # The prompt count is known though the runner never sent its last chunk.
    assert message.usage.input_tokens == PROMPT_TOKENS


def test_ollama_stream_objects_carry_their_own_time(server: ServedApp, node: ScriptedNode) -> None:
    node.script = Script(token_delay_s=0.01)
    body = {"model": "m1", "prompt": "hi"}
    r = httpx.post(f"{server.url}/api/generate", json=body, timeout=DEADLINE_S)
    stamps = [json.loads(line)["created_at"] for line in r.text.splitlines()]
    assert len(set(stamps)) > 1
